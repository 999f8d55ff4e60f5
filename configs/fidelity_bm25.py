r"""Random-projection fidelity to BM25 (paper 002, section 2: Fig. 2, Fig. 3a/3b, min margins).

Run:
  python -m bilinear_ir.main --config=configs/fidelity_bm25.py --workdir=runs/fidelity
  python -m bilinear_ir.main --config=configs/fidelity_bm25.py:tiny=true --workdir=runs/f

Config arguments (after `:`): `tiny` (seconds-long smoke run: small grid, few trials and
triples), `seed`, `trials`, `kind` (rademacher | gaussian). Any field can also be set with
`--config.FIELD=VALUE`, e.g. `--config.data.format=beir --config.data.path=DIR`.

What each number means: see `bilinear_ir/studies/fidelity_experiments.py`.
"""
from __future__ import annotations

import ml_collections

from bilinear_ir.config import arguments
from bilinear_ir.config import blocks

# The paper's grid: 40 values from 32 to 9472 (32, 64, 128, then multiples of 256).
PAPER_K_GRID = (32, 64, 128) + tuple(256 * j for j in range(1, 38))


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The fidelity job's config (see the module docstring for arguments)."""
  args = arguments.parse_args(arg, {"tiny": False, "seed": 0, "trials": 20, "kind": "rademacher"})
  c = ml_collections.ConfigDict()
  c.job = "fidelity_bm25"
  c.seed = args["seed"]  # triple/query sampling (numpy) and projections (jax.random) derive from it
  c.distributed = False  # True: main calls jax.distributed.initialize() (multi-host launch)
  c.data = blocks.data_config()    # the collection; the claims of data.split are the queries

  c.tokenizer = ml_collections.ConfigDict()
  c.tokenizer.kind = "wordpiece"  # paper: case-insensitive wordpieces; or "bm25s", "regex"
  c.tokenizer.stemmer = ""  # Snowball language for bm25s/regex tokens ("english"), "" none
  c.tokenizer.model_dir = ""  # wordpiece vocabulary folder; "" = all-MiniLM-L6-v2's

  c.bm25 = ml_collections.ConfigDict()
  c.bm25.variant = "gensim"  # paper: gensim defaults; or "lucene" (bm25s), "robertson", "atire"
  c.bm25.k1 = 1.5  # term-frequency saturation
  c.bm25.b = 0.75  # length normalization
  c.bm25.epsilon = 0.25  # gensim's IDF floor: negative IDFs become epsilon * mean IDF

  c.projection = ml_collections.ConfigDict()
  c.projection.kind = args["kind"]  # paper Fig. 2: rademacher (+-1/sqrt(k)); or gaussian N(0, 1/k)
  c.projection.block_size = 4096  # vocabulary rows of A^T generated at a time (memory bound)

  c.k_grid = PAPER_K_GRID  # projection dimensions tried (increasing); one projection per trial
  c.beta = 0.05  # pairwise error rate of Fig. 2 (95% accuracy) and of the Lemma 1 check
  c.trials = args["trials"]  # Fig. 2 / Lemma 1: independent projections of the triples' rows

  c.fig2 = ml_collections.ConfigDict()
  c.fig2.x_max = 4000.0  # largest (eps^2/2 - eps^3/3)^-1 binned (k_grid[-1] / x_max ~ 2.4)
  c.fig2.num_bins = 20  # equal-width bins on (0, x_max]
  c.fig2.triples_per_bin = 50  # (q, d1, d2) sampled per bin

  c.fig3 = ml_collections.ConfigDict()
  c.fig3.doc_bins = 4  # claims docs cut into this many equal-count length bins
  c.fig3.ranks = (10, 100, 1000)  # Fig. 3a: r-th smallest margins (a bin needs > r docs)
  c.fig3.recall_at = 10  # Fig. 3b: recall depth r0
  c.fig3.recall_target = 0.95  # Fig. 3b: share of (query, trial) with d1 in the top r0
  c.fig3.queries = 100  # claims queries used for Fig. 3b (a seeded sample)
  c.fig3.trials = 5  # Fig. 3b: independent projections of every doc (the expensive part)

  c.passages = ml_collections.ConfigDict()
  c.passages.lengths = (50, 100, 200, 400)  # max passage length l in words (paper section 5)
  c.passages.docs = 400  # collection docs cut into passages (a seeded sample)
  c.passages.queries = 100  # sub-sequence queries per l
  c.passages.min_words = 5  # query length range (paper: 5..25)
  c.passages.max_words = 25

  if args["tiny"]:
    c.k_grid = (4, 8, 16, 32, 64)
    c.trials = 3
    c.fig2.x_max = 400.0
    c.fig2.num_bins = 4
    c.fig2.triples_per_bin = 5
    c.fig3.doc_bins = 2
    c.fig3.ranks = (2, 5)
    c.fig3.recall_at = 3
    c.fig3.queries = 8
    c.fig3.trials = 2
    c.passages.lengths = (8, 16)
    c.passages.docs = 10
    c.passages.queries = 6
    c.passages.min_words = 3
    c.passages.max_words = 6
  return c
