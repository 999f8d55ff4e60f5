r"""train_eval: train one scorer on one collection and evaluate it on the test split.

  python -m bilinear_ir.main --config=configs/train_eval.py:scorer=bilinear,pooling=mean \
      --workdir=runs/bilinear_mean

Args (after `:`, comma separated): scorer (dot | wdp | bilinear | lowrank | ...), rank, residual
(none | identity | diag), pooling (mean | cls; cls is left unnormalised, mean is L2-normalised),
seed. Every field below can also be set with `--config.FIELD=VALUE`, e.g.
`--config.data.format=beir --config.data.path=DIR --config.data.folds=5`.
"""
from ml_collections import ConfigDict

from bilinear_ir.config import arguments
from bilinear_ir.config import blocks


def get_config(arg=None):
  a = arguments.parse_args(arg, {"scorer": "bilinear", "rank": 32, "residual": "none",
                               "pooling": "mean", "seed": 0})
  c = ConfigDict()
  c.job = "train_eval"
  c.seed = a["seed"]              # every random choice (init, splits, batches) flows from it
  c.data = blocks.data_config()          # which collection, splits, folds
  c.encoder = blocks.encoder_config()    # the frozen encoder and its cache
  c.encoder.pooling = a["pooling"]
  c.encoder.normalize = a["pooling"] == "mean"
  c.bm25 = blocks.bm25_config()             # BM25 negatives and re-ranking candidates
  c.model = blocks.model_config()            # the scorer
  c.model.scorer = a["scorer"]
  c.model.rank = a["rank"]
  c.model.residual = a["residual"]
  c.train = blocks.train_config()            # loss, negatives, optimiser, selection, checkpoints
  c.eval = blocks.eval_config()              # full or re-rank, depth, measures
  c.distributed = False                     # True: jax.distributed.initialize() (multi-host)
  return c
