r"""study: does a learned similarity beat the dot product, and where? Paired statistics over
queries on several collections and embeddings, every choice made on dev.

  python -m bilinear_ir.main --config=configs/study.py --workdir=runs/study
  python -m bilinear_ir.main --config=configs/study.py:collections=scifact+DIR+FILE.zip,\
embeddings=mean+cls,seeds=0+1+2 --workdir=runs/study

Args (after `:`, comma separated; lists joined by `+`): collections (scifact, cacm, med, lisa:
shipped with the package; insuranceqa: read from the package insuranceqa-data 1.2, the `iqa`
extra; or a BEIR folder or zip), embeddings (names of embedding_specs.EMBEDDINGS:
mean, cls, mpnet-mean, mpnet-cls; or precomputed:DIR), seeds, folds (K of the cross-validation
of test-only collections), ranks (of the residual low-rank rows), models (wdp, bilinear,
lowrank, adapter), ict_rows (e.g. bilinear+lowrank_r32: also trained on ICT pairs), grid (bool:
each trained row selected on dev over `train_grid`), quick (bool: one seed, 3 folds, scifact +
med, mean only: a smoke run).
"""
from ml_collections import ConfigDict

from bilinear_ir.config import arguments
from bilinear_ir.config import blocks
from bilinear_ir.config import tables


def get_config(arg=None):
  a = arguments.parse_args(arg, {"collections": ("scifact", "cacm", "med", "lisa"),
                                 "embeddings": ("mean", "cls"), "seeds": (0, 1, 2), "folds": 5,
                                 "ranks": (8, 32, 128),
                                 "models": ("wdp", "bilinear", "lowrank"),
                                 "ict_rows": ("bilinear", "lowrank_r32"), "grid": False,
                                 "quick": False})
  c = ConfigDict()
  c.job = "study"
  c.seed = 0                        # splits and folds (dev carve-outs), statistics' resampling
  c.collections = a["collections"] if not a["quick"] else ("scifact", "med")
  c.embeddings = a["embeddings"] if not a["quick"] else ("mean",)
  c.seeds = a["seeds"] if not a["quick"] else (0,)
  c.folds = a["folds"] if not a["quick"] else 3  # K-fold CV of collections with no train split
  # The rows (config.tables.study_table): dot, BM25, the trained `models` (lowrank: residual
  # I + P Q^T at every rank of `ranks`), "learned" (per seed and fold, the one of them best on
  # dev), its hybrid with BM25, and the rows of `ict_rows` also trained on pairs the corpus makes
  # itself (inverse cloze): rows "<name>_ict", evaluated on every query, no folds (no query is
  # trained on); blended with dot by the label-free guard train.ict.guard ("bm25"; "none" turns
  # it off). A new row is one more entry of `c.rows`.
  # Each trained row takes its model's entry of `row_train` (the lr chosen on dev,
  # blocks.row_train); with `grid`, it is trained at every point of `train_grid` and the point
  # best on dev kept, per run and fold (rows record "grid_points", "grid_dev").
  c.rows = tables.study_table(a["models"], a["ranks"], a["ict_rows"] if not a["quick"] else (),
                              "train_grid" if a["grid"] else None, "row_train")
  c.row_train = blocks.row_train()
  c.train_grid = blocks.train_grid()
  c.runner = ConfigDict({"summary": "queries", "fields": ("n_queries",), "paired": True,
                         "cell": ("collection", "embedding"), "name": "model"})
  # data, encoder, bm25, model, train (+ per-embedding train_overrides), hybrid, eval: the
  # bilinear table's recipe (blocks.table_recipe). With only ~30-50 judged queries, a fifth of
  # each training fold is held out as dev (0.1 would leave 3-4 queries to select on).
  blocks.table_recipe(c)
  c.data.dev_fraction = 0.2
  c.distributed = False
  return c
