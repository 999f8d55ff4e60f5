"""The `retrieve` job: a saved model ranks a collection's queries through a doc-table index.

    python -m bilinear_ir.main --config=configs/retrieve.py:model_dir=W/model --workdir=OUT

Steps: load the model written by `train_eval` (`train.trainer.load_model`; `model_dir=""` is the
parameter-free dot product), the collection of `config.data` and its embeddings by the encoder the
model was trained with; open the `DocIndex` under `config.index_dir` if it was built by this
scorer, params, dtype and doc embeddings (else rebuild it); run the queries of `data.split`
through `query_table` and exact top-k; return `run.trec` and, for a judged split, the metrics.

Index reuse: `DocIndex` checks scorer, params hash and dtype; this job adds `source.json` next to
the manifest with the SHA-256 of the doc embeddings and doc ids, so an index of another
collection (or encoder) is never reused. A reused index is only read.

Search: by default the index is streamed from its memory-mapped shards on one device
(`DocIndex.search`). With `config.sharded` or `config.distributed`, each process loads its rows
`sharded.process_rows(N)` of the table, splits them over its local devices (one device unless
`sharded`) and `sharded.multihost_topk` merges every process's top-k; one process is the same
call on a laptop. Process 0 builds the index (every process must see `index_dir`); main writes
the outputs on process 0 only.
"""
from __future__ import annotations

import os
from typing import Any

import jax
import ml_collections
import numpy as np

from bilinear_ir import files
from bilinear_ir.errors import InputError, input_error, require
from bilinear_ir.retrieval import index as index_lib
from bilinear_ir.retrieval import sharded as sharded_lib

SOURCE = "source.json"  # the doc embeddings an index was built from (next to its manifest)
# Encoder fields that change the embeddings (configs/retrieve.py leaves them None by default).
ENCODER_FIELDS = ("model", "pooling", "normalize", "max_length")


def resolve_encoder(encoder_cfg: ml_collections.ConfigDict, meta: dict[str, Any] | None,
                    where: str = "model.json") -> ml_collections.ConfigDict:
  """The encoder block to embed with: the model's encoder, checked against the config.

  Args:
    encoder_cfg: `config.encoder`; a field of ENCODER_FIELDS that is None takes the model's
      value (the `encoder_config()` default without a model); a set value must equal it.
    meta: the saved model's meta (`load_model`), or None for the untrained dot product.
    where: the meta file, for messages.

  Returns:
    A complete encoder block (its other fields, e.g. batch_size and cache_dir, from
    `encoder_cfg`).
  """
  from bilinear_ir.data import config as data_config  # pylint: disable=g-import-not-at-top
  out = data_config.encoder_config()
  trained = None
  if meta is not None:
    trained = meta.get("encoder")
    if not isinstance(trained, dict) or any(f not in trained for f in ENCODER_FIELDS):
      raise input_error(f"missing or incomplete (needs {list(ENCODER_FIELDS)})", file=where,
                        field="encoder")
  for field in ENCODER_FIELDS:
    value = encoder_cfg.get(field)
    if trained is not None:
      if value is not None and value != trained[field]:
        raise input_error(f"{value!r} differs from {trained[field]!r}, the encoder the model "
                          f"was trained with ({where}); leave it unset", file="config",
                          field=f"encoder.{field}")
      value = trained[field]
    if value is not None:
      out[field] = value
  out.update({f: v for f, v in encoder_cfg.items() if f not in ENCODER_FIELDS})
  return out


def _read_json(path: str) -> Any:
  import json  # pylint: disable=g-import-not-at-top
  try:
    with open(path, "rb") as f:
      return json.loads(files.decode_utf8(f.read(), path))
  except (OSError, ValueError):
    return None


def dot_scorer(dim: int):
  """(module, params) of the parameter-free dot product for width `dim` (`model_dir=""`)."""
  from bilinear_ir.train import trainer  # pylint: disable=g-import-not-at-top
  model_cfg = trainer.model_config()
  model_cfg.scorer = "dot"
  return trainer.build_model(model_cfg, dim), {}


def load_scorer(model_dir: str):
  """(module, params, meta) of a table scorer saved by `train.trainer.save_model`."""
  from bilinear_ir.scorers.base import TableScorer  # pylint: disable=g-import-not-at-top
  from bilinear_ir.train import trainer  # pylint: disable=g-import-not-at-top
  module, params, meta = trainer.load_model(model_dir)
  if not isinstance(module, TableScorer):
    raise input_error(f"scorer {meta['model'].get('scorer')!r} has no query/doc tables; the "
                      "retrieve job serves table scorers (dot, wdp, bilinear, lowrank)",
                      file=os.path.join(model_dir, "model.json"), field="model.scorer")
  return module, params, meta


def _source(doc_ids: list[str], docs: np.ndarray) -> dict[str, Any]:
  """What an index's rows were computed from: {"num_docs", "doc_ids_sha256", "docs_sha256"}."""
  return {"num_docs": len(doc_ids), "doc_ids_sha256": files.sha256_texts(list(doc_ids)),
          "docs_sha256": index_lib.params_sha256({"docs": docs})}


def index_mismatch(directory: str, module, params, dtype: str,
                   source: dict[str, Any]) -> str | None:
  """Why the index in `directory` cannot serve this search, or None if it can.

  It must open (manifest and shard headers valid) and match the scorer and its params
  (`DocIndex.check_scorer`), the row dtype and the doc embeddings (`source.json`).
  """
  try:
    index = index_lib.DocIndex.open(directory)
    index.check_scorer(module, params)
  except InputError as e:
    return str(e)
  manifest = os.path.join(directory, index_lib.MANIFEST)
  if index.dtype != dtype:
    return f"{manifest}: field 'dtype': index rows are {index.dtype}, the config asks {dtype}"
  if _read_json(os.path.join(directory, SOURCE)) != source:
    return (f"{os.path.join(directory, SOURCE)}: built from other doc embeddings or doc ids "
            "(another collection or encoder), or missing")
  return None


def open_or_build(directory: str, module, params, docs: np.ndarray, source: dict[str, Any], *,
                  dtype: str, shard_docs: int, rebuild: bool) -> tuple[index_lib.DocIndex, bool]:
  """Opens the index in `directory` if it matches, else (re)builds it on process 0.

  Args:
    directory: the index folder.
    module, params: the table scorer.
    docs: [N, n] doc embeddings.
    source: `_source(doc_ids, docs)`, stored as `source.json`.
    dtype: "float32" or "bfloat16".
    shard_docs: docs per shard when building.
    rebuild: False makes an existing, mismatched index an `InputError`.

  Returns:
    (the opened index, True if it was reused as found).
  """
  manifest = os.path.join(directory, index_lib.MANIFEST)
  exists = os.path.exists(manifest)
  problem = index_mismatch(directory, module, params, dtype, source) if exists else "missing"
  if exists and problem and not rebuild:
    raise input_error(f"the index cannot be reused ({problem}); set rebuild=True to replace it",
                      file="config", field="rebuild")
  if problem and jax.process_index() == 0:
    src = os.path.join(directory, SOURCE)
    if os.path.exists(src):
      os.remove(src)  # first: an interrupted rebuild never looks like a match
    if exists:
      try:
        index_lib.DocIndex.open(directory)
      except InputError:
        os.remove(manifest)  # unreadable: build over it (DocIndex.build opens an old one)
    index_lib.DocIndex.build(directory, module, params, docs, shard_docs=shard_docs,
                             dtype=dtype, overwrite=os.path.exists(manifest))
    files.atomic_write_json(src, source)
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    multihost_utils.sync_global_devices("bilinear_ir.retrieve.index")
  if problem:
    after = index_mismatch(directory, module, params, dtype, source)
    if after is not None:
      raise input_error(f"the index process 0 built is not readable here ({after}); index_dir "
                        "must be on storage every process sees", file="config",
                        field="index_dir")
  return index_lib.DocIndex.open(directory), not problem


def local_rows(index: index_lib.DocIndex, lo: int, hi: int) -> np.ndarray:
  """Rows [lo, hi) of a single-vector index's table, read from its shards: [hi - lo, w]."""
  parts, start = [], 0
  for rows in index.shards():
    stop = start + rows.shape[0]
    if stop > lo and start < hi:
      parts.append(np.asarray(rows[max(lo, start) - start:min(hi, stop) - start]))
    start = stop
  return np.concatenate(parts) if parts else np.zeros((0, index.width), np.float32)


def search(index: index_lib.DocIndex, query_table_fn, queries: np.ndarray, k: int, *,
           batch: int, sharded: bool, progress: bool = True) -> tuple[np.ndarray, np.ndarray]:
  """Exact top-k of every query over the index: queries [Q, n] -> (ids [Q, k], scores [Q, k]).

  Args:
    index: a single-vector `DocIndex`.
    query_table_fn: q [B, n] -> query table [B, w].
    queries: [Q, n] query embeddings.
    k: docs per query, 1 <= k <= N.
    batch: queries per search call (one progress-bar step).
    sharded: split this process's rows over its local devices; with several processes, each
      scans `sharded.process_rows(N)` and the lists are merged (`multihost_topk`).
    progress: show a tqdm bar (process 0).

  Returns:
    (ids [Q, k] int doc rows, scores [Q, k] float32), ties by lower doc row.
  """
  from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top
  distributed = sharded or jax.process_count() > 1
  if distributed:
    lo, hi = sharded_lib.process_rows(index.num_docs)
    table = local_rows(index, lo, hi)
    mesh = sharded_lib.doc_mesh(None if sharded else 1)
    if hi > lo:  # padded and placed on the mesh once, not once per query batch
      table = sharded_lib.shard_rows(table, mesh)
  ids, scores = [], []
  starts = range(0, queries.shape[0], batch)
  for start in tqdm(starts, desc="retrieve", unit="batch",
                    disable=not progress or jax.process_index() != 0, leave=False):
    qt = np.asarray(query_table_fn(queries[start:start + batch]), np.float32)
    if distributed:
      res = sharded_lib.multihost_topk(qt, table, k, id_offset=lo, num_docs=index.num_docs,
                                       mesh=mesh, local_docs=hi - lo)
    else:
      res = index.search(qt, k)
    ids.append(np.asarray(res.ids))
    scores.append(np.asarray(res.scores))
  if not ids:
    return np.zeros((0, k), np.int64), np.zeros((0, k), np.float32)
  return np.concatenate(ids).astype(np.int64), np.concatenate(scores)


def run(config: ml_collections.ConfigDict, workdir: str):
  """The `retrieve` job (see configs/retrieve.py and the module docstring)."""
  from bilinear_ir.data import embeddings as embeddings_lib  # pylint: disable=g-import-not-at-top
  from bilinear_ir.data import loaders  # pylint: disable=g-import-not-at-top
  from bilinear_ir.eval import metrics as metrics_lib  # pylint: disable=g-import-not-at-top
  from bilinear_ir.eval import report  # pylint: disable=g-import-not-at-top
  from bilinear_ir.eval import trec  # pylint: disable=g-import-not-at-top
  k_asked = config.k
  require(isinstance(k_asked, int) and not isinstance(k_asked, bool) and k_asked >= 1,
          f"must be an integer >= 1, got {k_asked!r}", field="k")
  require(config.query_batch >= 1, f"must be >= 1, got {config.query_batch}",
          field="query_batch")
  require(config.dtype in index_lib.DTYPES, f"must be one of {index_lib.DTYPES}, got "
          f"{config.dtype!r}", field="dtype")
  require(config.shard_docs >= 1, f"must be >= 1, got {config.shard_docs}", field="shard_docs")
  model_dir = os.path.abspath(config.model_dir) if config.model_dir else ""
  # The model first: a bad model_dir fails before any data is read or embedded.
  module, params, meta = load_scorer(model_dir) if model_dir else (None, {}, None)
  encoder_cfg = resolve_encoder(config.encoder, meta, os.path.join(model_dir, "model.json"))
  coll = loaders.load(config.data)
  emb = embeddings_lib.embed_collection(coll, encoder_cfg)
  dim = int(emb.docs.shape[1])
  if meta is None:
    module, params = dot_scorer(dim)
  else:
    require(meta["dim"] == dim, f"the model was trained on {meta['dim']}-d embeddings, the "
            f"encoder gives {dim}-d", file=os.path.join(model_dir, "model.json"), field="dim")
  split = config.data.split
  if split:
    query_ids = coll.split_query_ids(split)
    qrels = coll.qrels[split]
  else:
    query_ids, qrels = sorted(coll.queries), None
  k = min(k_asked, coll.num_docs)

  index_dir = os.path.abspath(config.index_dir or os.path.join(workdir, "index"))
  index, reused = open_or_build(index_dir, module, params, emb.docs, _source(emb.doc_ids,
                                                                             emb.docs),
                                dtype=config.dtype, shard_docs=config.shard_docs,
                                rebuild=config.rebuild)
  qt_fn = jax.jit(lambda q: module.apply({"params": params}, q, method=module.query_table))
  ids, scores = search(index, qt_fn, emb.query_rows(query_ids), k, batch=config.query_batch,
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
  md = (f"# retrieve: {scorer} on {coll.name} ({split or 'all queries'}, exact top-{k})\n\n"
        f"Index `{index_dir}` ({m['dtype']}, {m['num_docs']} docs x {m['width']}, "
        f"{'reused' if reused else 'built'}).\n\n")
  if qrels is not None:
    md += report.markdown_table([[split, len(query_ids)] + [results["metrics"][x]
                                                            for x in measures]],
                                ["split", "queries"] + measures, digits=4)
  else:
    md += f"{len(query_ids)} queries ranked; no qrels, so no metrics.\n"
  return report.Report(results=results, markdown=md,
                       extra_files={"run.trec": trec.run_to_text(run_dict, scorer)})
