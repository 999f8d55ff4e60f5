r"""export: a trained table similarity (dot, wdp, bilinear, lowrank, adapter) in another
tool's format.

  python -m bilinear_ir.main \
      --config=configs/export.py:model_dir=runs/w/model,format=sentence-transformers \
      --workdir=runs/export_st
  # then, in any Python with sentence-transformers:
  #   model = SentenceTransformer("runs/export_st/export")
  #   scores = model.encode_query(queries) @ model.encode_document(docs).T

Args (after `:`): model_dir (a train_eval WORKDIR/model, or one of reproduce_table's
WORKDIR/models/...), format: sentence-transformers (needs the `st` extra), head (the two
matrices alone: models over precomputed embeddings), faiss (an IndexFlatIP over the doc table
of `data`'s collection; needs the `faiss` extra; `--config.data.format=beir
--config.data.path=DIR` for another collection) or query_side (sentence-transformers, the whole
similarity on the query side: `encode_document` gives the raw embeddings an existing index holds;
the only format for the adapter, whose query side q + f(q) is not a matrix), check (query_side:
indexes of the raw doc embeddings to serve the export from, joined by `+`: faiss, lancedb;
results.json's `serving_check` says how many of `data`'s test queries each returns the
project's exact top-10 for, ties aside), check_queries (a sample of that many test queries,
drawn by `seed`; 0: all). E.g. on InsuranceQA's 2,000 test questions:

  python -m bilinear_ir.main --config=configs/export.py:model_dir=runs/w/model,\
format=query_side,check=faiss+lancedb --config.data.format=insuranceqa --workdir=runs/w_qs
"""
from ml_collections import ConfigDict

from bilinear_ir.config import arguments
from bilinear_ir.config import blocks


def get_config(arg=None):
  a = arguments.parse_args(arg, {"model_dir": "", "format": "sentence-transformers",
                                "check": "", "check_queries": 0})
  c = ConfigDict()
  c.job = "export"
  c.seed = 0                       # the sample of `check_queries` (the export is deterministic)
  c.model_dir = a["model_dir"]     # the saved model (config.json + model.safetensors)
  c.format = a["format"]           # sentence-transformers | head | faiss | query_side
  c.data = blocks.data_config()    # format faiss, check: the collection whose docs are indexed
  c.check = a["check"]             # "" | faiss | lancedb | faiss+lancedb (format query_side)
  c.check_queries = a["check_queries"]  # test queries served by the check (0: all)
  c.encoder = ConfigDict()         # where the encoder's cache (and all-mpnet-base-v2) live
  c.encoder.cache_dir = ""         # "" = $BILINEAR_IR_CACHE or ~/.cache/bilinear_ir
  c.distributed = False
  return c
