"""Serving a table scorer from an on-disk `DocIndex`: reuse or (re)build the index, then search.

`open_or_build` reuses the index in a folder only if it was built by the same scorer, params and
row dtype (`DocIndex.check_scorer`) from the same doc embeddings and doc ids (`source.json`, the
`source` dict the caller computes), and otherwise rebuilds it on process 0. `search` streams the
index from its memory-mapped shards on one device, or (sharded / multi-host) loads each process's
rows, splits them over its local devices and merges every process's top-k.
"""
from __future__ import annotations

import json
import os
from typing import Any

import jax
from jax.experimental import multihost_utils
import numpy as np

from bilinear_ir import files
from bilinear_ir import progress as progress_lib
from bilinear_ir.errors import InputError, input_error
from bilinear_ir.retrieval import index as index_lib
from bilinear_ir.retrieval import sharded as sharded_lib

SOURCE = "source.json"  # the doc embeddings an index was built from (next to its manifest)


def _read_json(path: str) -> Any:
  try:
    with open(path, "rb") as f:
      return json.loads(files.decode_utf8(f.read(), path))
  except (OSError, ValueError):
    return None


def source_of(doc_ids: list[str], docs: np.ndarray) -> dict[str, Any]:
  """What an index's rows are computed from (its `source.json`): {"num_docs",
  "doc_ids_sha256", "docs_sha256"} of doc ids [N] and doc embeddings [N, n]."""
  return {"num_docs": len(doc_ids), "doc_ids_sha256": files.sha256_texts(list(doc_ids)),
          "docs_sha256": files.tree_sha256({"docs": docs})}


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
    source: `source_of(doc_ids, docs)`, stored as `source.json`.
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
      scans `sharded_lib.process_rows(N)` and the lists are merged (`multihost_topk`).
    progress: report progress (`bilinear_ir.progress.bar`, process 0).

  Returns:
    (ids [Q, k] int doc rows, scores [Q, k] float32), ties by lower doc row.
  """
  distributed = sharded or jax.process_count() > 1
  if distributed:
    lo, hi = sharded_lib.process_rows(index.num_docs)
    table = local_rows(index, lo, hi)
    mesh = sharded_lib.doc_mesh(None if sharded else 1)
    if hi > lo:  # padded and placed on the mesh once, not once per query batch
      table = sharded_lib.shard_rows(table, mesh)
  ids, scores = [], []
  starts = range(0, queries.shape[0], batch)
  bar = progress_lib.bar(len(starts), "retrieve", unit="batch", leave=False) if progress else None
  for start in starts:
    qt = np.asarray(query_table_fn(queries[start:start + batch]), np.float32)
    if distributed:
      res = sharded_lib.multihost_topk(qt, table, k, id_offset=lo, num_docs=index.num_docs,
                                       mesh=mesh, local_docs=hi - lo)
    else:
      res = index.search(qt, k)
    ids.append(np.asarray(res.ids))
    scores.append(np.asarray(res.scores))
    if bar is not None:
      bar.update(1)
  if bar is not None:
    bar.close()
  if not ids:
    return np.zeros((0, k), np.int64), np.zeros((0, k), np.float32)
  return np.concatenate(ids).astype(np.int64), np.concatenate(scores)
