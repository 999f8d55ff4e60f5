"""Fidelity of random projections to sparse inner-product rankers (paper 002, sections 2 and 5).

The sparse vectors themselves (boolean, TF-IDF, BM25 with score = <q~, d~>) are
`bilinear_ir.data.bm25`. projections.py: Rademacher / Gaussian random projections applied
blockwise through sparse rows. theory.py: normalized margin, Lemma 1 / 2 bounds and the
sufficient k of eqs. (2), (3), Corollaries 1 and 2. `studies/fidelity_experiments.py`: what the
`fidelity_bm25` job reports (Fig. 2, Fig. 3a/3b, margins, the Lemma 1 check).
"""
