r"""lowrank_analysis: SVD truncation of a trained full bilinear W (paper 000, section 5, Fig. 1).

  python -m bilinear_ir.main --config=configs/lowrank_analysis.py --workdir=runs/lowrank

For each frozen embedding of the bilinear table ("mean" normalised, "cls" unnormalised; see
bilinear_ir.eval.table) the full bilinear W is trained with configs/reproduce_table.py's recipe
(same data, split, encoder, BM25 negatives, loss, epochs, dev selection) and then analysed without
further training: its spectrum (Fig. 1c), the full-corpus metrics on dev and test of the SVD
truncation W_r through the `lowrank` scorer at every rank (Fig. 1a) and against sigma_{r+1}
(Fig. 1b), >= 60,000 pointwise checks of Theorem 3 on real (test query, doc) pairs, parameter
counts, and the ranks the spectrum suggests against the ranks best on dev and on test. One
training seed by default (`seeds=0+1+2` averages the curves over three trained Ws).

Args (after `:`, comma separated): seeds (`seeds=0+1`), ranks (`ranks=8+32+96`), embeddings
(`mean+cls`). Every field can also be set with `--config.FIELD=VALUE`.
"""
from ml_collections import ConfigDict

from bilinear_ir.config import arguments
from bilinear_ir.config import blocks


def get_config(arg=None):
  a = arguments.parse_args(arg, {"seeds": (0,), "embeddings": ("mean", "cls"),
                               "ranks": (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384)})
  t = blocks.table_recipe(ConfigDict())    # the bilinear table's recipe
  c = ConfigDict()
  c.job = "lowrank_analysis"
  c.seed = 0                      # splits (dev carve-out), as the table
  c.seeds = a["seeds"]            # training seeds of the full W; curves are averaged over them
  c.embeddings = a["embeddings"]  # names of config.embedding_specs.EMBEDDINGS ("mean", "cls", ...)
  # Ranks r of the truncation W_r evaluated; ranks > n are dropped and r = n (W_r = W, the
  # sanity row) and the spectrum-selected ranks are always added.
  c.ranks = a["ranks"]
  # Theorem 3 is checked on the pairs (test query, doc) of each test query's `top_docs` best docs
  # under the full W plus `random_docs` other docs drawn uniformly (by the training seed), at
  # every evaluated rank: checks = test queries x (top_docs + random_docs) x ranks (SciFact
  # defaults: 300 x 20 x 13 = 78,000). A check passes when
  # |s_W - s_Wr| <= sigma_{r+1} |q| |d| + tolerance * sigma_1 |q| |d| (float32 SVD factors).
  c.pointwise = ConfigDict()
  c.pointwise.top_docs = 10
  c.pointwise.random_docs = 10
  c.pointwise.tolerance = 1e-5
  # Rank selection from the spectrum (bilinear_ir.lowrank.select_rank): the smallest r keeping
  # each `energy` share of sum sigma_i^2, and the smallest r with sigma_{r+1} / sigma_1 <= each
  # `bound` value; compared with the ranks best on dev and on test, and with the smallest rank
  # whose dev metric reaches `share` of the full W's.
  c.rank_selection = ConfigDict()
  c.rank_selection.energy = (0.9, 0.99)
  c.rank_selection.bound = (0.1, 0.01)
  c.rank_selection.share = 0.95
  c.data = t.data                 # the shipped SciFact: train (dev carved out), test
  c.encoder = t.encoder           # all-MiniLM-L6-v2, max_length 256, cached on disk
  c.bm25 = t.bm25                 # hard negatives of the training recipe
  c.model = t.model               # scorer set to "bilinear" for the trained W
  c.train = t.train               # the table's recipe (loss, negatives, epochs, lr, selection)
  c.train_overrides = t.train_overrides  # the table's per-embedding changes to `train`
  c.eval = t.eval                 # full-corpus exact ranking (mode must stay "full"), measures
  c.distributed = False
  return c
