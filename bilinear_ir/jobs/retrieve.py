"""The `retrieve` job: a saved model ranks a collection's queries through a doc-table index.

    python -m bilinear_ir.main --config=configs/retrieve.py:model_dir=W/model --workdir=OUT

Steps: load the model written by `train_eval` (`export.saved_model.load_model`; `model_dir=""` is
the parameter-free dot product), the collection of `config.data` and its embeddings by the
encoder the model was trained with; open the `DocIndex` under `config.index_dir` if it was built
by this scorer, params, dtype and doc embeddings (else rebuild it); run the queries of
`data.split` through `query_table` and exact top-k; return `run.trec` and, for a judged split,
the metrics.

Index reuse (`retrieval.serving.open_or_build`): `DocIndex` checks scorer, params hash and dtype,
and `source.json` next to the manifest holds the SHA-256 of the doc embeddings and doc ids, so an
index of another collection (or encoder) is never reused. A reused index is only read.

Search (`retrieval.serving.search`): by default the index is streamed from its memory-mapped
shards on one device. With `config.sharded` or `config.distributed`, each process loads its rows
of the table, splits them over its local devices and every process's top-k is merged; one process
is the same call on a laptop. Process 0 builds the index (every process must see `index_dir`);
main writes the outputs on process 0 only.
"""
from __future__ import annotations

import os
from typing import Any

import jax
import ml_collections

from bilinear_ir import scorers
from bilinear_ir.data import pipeline
from bilinear_ir.data import loaders
from bilinear_ir.errors import input_error, require
from bilinear_ir.eval import metrics as metrics_lib
from bilinear_ir.eval import trec
from bilinear_ir.export import saved_model
from bilinear_ir.report import outputs
from bilinear_ir.report import retrieve as report
from bilinear_ir.experiment import validation
from bilinear_ir.retrieval import index as index_lib
from bilinear_ir.retrieval import serving


def validate(config: ml_collections.ConfigDict) -> None:
  """Refuses a bad config before any work (`experiment.validation`)."""
  validation.integer(config.k, "k", 1)
  validation.integer(config.query_batch, "query_batch", 1)
  validation.one_of(config.dtype, index_lib.DTYPES, "dtype")
  validation.integer(config.shard_docs, "shard_docs", 1)
  validation.check_data(config.data)
  require(isinstance(config.model_dir, str), "must be a string", field="model_dir")
  if config.model_dir and not os.path.isdir(config.model_dir):
    raise input_error("no such model folder (a train_eval WORKDIR/model)",
                      file=config.model_dir, field="model_dir")
  for key in ("batch_size", "query_max_length", "doc_max_length"):
    validation.integer(config.encoder[key], f"encoder.{key}", 0 if key == "doc_max_length" else 1)
  for m in config.measures:
    validation.measure(m, "measures")


def run(config: ml_collections.ConfigDict, workdir: str):
  """The `retrieve` job (see configs/retrieve.py and the module docstring)."""
  k_asked = config.k
  model_dir = os.path.abspath(config.model_dir) if config.model_dir else ""
  # The model first: a bad model_dir fails before any data is read or embedded.
  module, params, meta = (saved_model.load_table_scorer(model_dir) if model_dir
                          else (None, {}, None))
  encoder_cfg = saved_model.resolve_encoder(config.encoder, meta,
                                            os.path.join(model_dir, saved_model.CONFIG))
  coll = loaders.load(config.data)
  emb = pipeline.embed(coll, encoder_cfg)
  dim = int(emb.docs.shape[1])
  if meta is None:  # the parameter-free dot product
    module, params = scorers.build("dot", dim=dim), {}
  else:
    require(meta["dim"] == dim, f"the model was trained on {meta['dim']}-d embeddings, the "
            f"encoder gives {dim}-d", file=os.path.join(model_dir, saved_model.CONFIG), field="dim")
  split = config.data.split
  if split:
    query_ids = coll.split_query_ids(split)
    qrels = coll.qrels[split]
  else:
    query_ids, qrels = sorted(coll.queries), None
  k = min(k_asked, coll.num_docs)

  index_dir = os.path.abspath(config.index_dir or os.path.join(workdir, "index"))
  index, reused = serving.open_or_build(
      index_dir, module, params, emb.docs, serving.source_of(emb.doc_ids, emb.docs),
      dtype=config.dtype, shard_docs=config.shard_docs, rebuild=config.rebuild)
  qt_fn = jax.jit(lambda q: module.apply({"params": params}, q, method=module.query_table))
  ids, scores = serving.search(index, qt_fn, emb.query_rows(query_ids), k, batch=config.query_batch,
                       sharded=config.sharded)
  run_dict = trec.rank_arrays_to_run(query_ids, emb.doc_ids, ids, scores)
  scorer = index.manifest["scorer"]
  results: dict[str, Any] = {}
  measures = list(config.measures)
  if qrels is not None:
    metrics = metrics_lib.evaluate(qrels, run_dict, measures)
    results["metrics"] = metrics["mean"]
  m = index.manifest
  results.update({
      "mode": "full", "queries": len(query_ids), "k": k, "scorer": scorer,
      "model_dir": model_dir, "collection": coll.name, "split": split,
      "index": {"path": index_dir, "reused": reused, "scorer": m["scorer"],
                "scorer_config": m.get("scorer_config"), "params_sha256": m["params_sha256"],
                "dtype": m["dtype"], "width": m["width"], "num_docs": m["num_docs"],
                "shards": len(m["shards"])},
      "search": {"sharded": bool(config.sharded), "processes": jax.process_count(),
                 "local_devices": jax.local_device_count() if config.sharded else 1},
  })
  return outputs.Report(results=results, markdown=report.markdown(results, measures),
                        extra_files={"run.trec": trec.run_to_text(run_dict, scorer)})
