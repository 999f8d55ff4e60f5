r"""retrieve: a saved model (or the untrained dot product) ranks a collection's queries.

Builds (or reuses) a doc-table index on disk, runs exact top-k for every query of `data.split`,
writes `run.trec` and, when the split has qrels, the metrics.

  python -m bilinear_ir.main --config=configs/retrieve.py:model_dir=runs/bilinear/model \
      --workdir=runs/bilinear_retrieve
  python -m bilinear_ir.main --config=configs/retrieve.py:model_dir= --workdir=runs/dot

Args (after `:`, comma separated): model_dir ("" = the dot product over the configured encoder),
k, dtype (float32 | bfloat16), sharded (true | false). Every field below can also be set with
`--config.FIELD=VALUE`, e.g. `--config.data.format=beir --config.data.path=DIR`.
Multi-host (a TPU pod, a SLURM job): the same command on every host with
`--config.distributed=True`; `index_dir` must then be on storage every host sees.
"""
from __future__ import annotations

import ml_collections
from ml_collections import config_dict

from bilinear_ir.config import arguments
from bilinear_ir.config import blocks


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """`arg`: `model_dir=DIR,k=K,dtype=DTYPE,sharded=BOOL`."""
  a = arguments.parse_args(arg, {"model_dir": "", "k": 1000, "dtype": "float32",
                               "sharded": False})
  c = ml_collections.ConfigDict()
  c.job = "retrieve"             # bilinear_ir/jobs/retrieve.py
  c.seed = 0                     # unused (retrieval is deterministic); every config carries one
  # A model folder written by train_eval (WORKDIR/model); "" = the parameter-free dot product.
  c.model_dir = a["model_dir"]
  # Which collection, and `split`: whose queries are ranked (and evaluated, when it has qrels);
  # "" = every query of the collection (run only, no metrics).
  c.data = blocks.data_config()
  # The frozen encoder. kind, path, model, pooling, normalize, max_length
  # (blocks.ENCODER_FIELDS) default to None = the saved model's values (the embeddings it was
  # trained on; without a model, the encoder_config() defaults); a value set here that differs
  # from the model's is an error.
  # batch_size and cache_dir do not change the numbers and are taken from here.
  c.encoder = blocks.encoder_config()
  for field in blocks.ENCODER_FIELDS:
    if c.encoder[field] is not None:  # pooling, normalize, max_length are None already
      c.encoder[field] = config_dict.placeholder(type(c.encoder[field]))
  c.index_dir = ""               # the doc-table index; "" = WORKDIR/index
  c.rebuild = True               # an index built otherwise: True rebuilds it, False is an error
  c.shard_docs = 65536           # docs per index shard (one shard in memory when streaming)
  c.dtype = a["dtype"]           # index rows: "float32" or "bfloat16" (half the bytes)
  c.k = a["k"]                   # docs retrieved per query (clipped to the corpus size)
  c.query_batch = 1024           # queries per search call (one progress-bar step)
  # True: the doc table is held in memory and split over the local devices (shard_map);
  # False: it is streamed from disk shard by shard on one device.
  c.sharded = a["sharded"]
  c.measures = ("ndcg@10", "mrr@10", "map", "recall@100")  # reported when the split has qrels
  c.distributed = False          # True: jax.distributed.initialize(); each process scans its part
  return c
