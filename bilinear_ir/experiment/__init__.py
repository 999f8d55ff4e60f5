"""The experiment protocol, written once, between the jobs and the libraries below them.

`spec` narrows a job's config into one typed row (`Row`) per table row and a `Recipe` per
embedding; `training` trains and selects on dev (table scorers and token models alike);
`evaluate` holds the evaluators of one interface (full-corpus ranking, re-ranking, own-pool P@1,
the dev-tuned hybrid); `rows` builds baseline rows, rows over seeds and the dev-selected learned
row; `compare` adds paired comparisons
against the baselines, Holm-adjusted per family; `validation` checks the config blocks before
any work. What belongs to one study only is `bilinear_ir.studies`.

Jobs say *what* runs (collections x embeddings x models x seeds); this package says *how*.
"""
