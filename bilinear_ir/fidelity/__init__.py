"""Fidelity of random projections to sparse inner-product rankers (paper 002, sections 2 and 5).

sparse.py: tokenizers and bag-of-words vectors (boolean, TF-IDF, BM25) with score = <q~, d~>;
this BM25 is the project's BM25 (baseline rows, hard negatives, re-ranking candidates).
projections.py: Rademacher / Gaussian random projections applied blockwise through sparse rows.
theory.py: normalized margin, Lemma 1 / 2 bounds and the sufficient k of eqs. (2), (3),
Corollaries 1 and 2. experiments.py: the `fidelity_bm25` job (Fig. 2, Fig. 3a/3b, margins).
"""
