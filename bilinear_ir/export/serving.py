"""Serving a query-side export from an index of raw doc embeddings, and checking what it returns.

A `query_side` export (`export.sentence_transformers.query_side_layers`) puts the whole learned
similarity on the query side, so the index a user already holds (the encoder's raw doc
embeddings, searched by inner product) serves it unchanged. This module searches two such
indexes the way a user would, and compares their top-k with the project's exact search:

    ids = search("faiss", docs, queries, k=10)                       # [B, 10] doc rows
    report = compare_topk(ids, scores, top_scores, top_ids, tol)   # ranking.score_topk

Backends (each an optional package, imported when used):
  "faiss":   `faiss.IndexFlatIP` (exact inner product; the `faiss` extra).
  "lancedb": an embedded LanceDB table in a local folder, searched exactly (`bypass_vector_index`)
             with the "dot" distance (1 - q.d), as a deployed LanceDB would be without an ANN
             index (the `lancedb` extra).
"""
from __future__ import annotations

import importlib.util
import os

import numpy as np

from bilinear_ir.errors import missing_extra
from bilinear_ir.errors import require

BACKENDS = ("faiss", "lancedb")
_PACKAGES = {"faiss": ("faiss", "faiss-cpu", "faiss"), "lancedb": ("lancedb", "lancedb", "lancedb")}


def require_backend(backend: str) -> None:
  """Refuses, before any work, a backend that is not one of BACKENDS or not installed (the
  one-line error names its extra)."""
  require(backend in BACKENDS, f"must be one of {BACKENDS}, got {backend!r}", field="check")
  module, package, extra = _PACKAGES[backend]
  if importlib.util.find_spec(module) is None:
    raise missing_extra(package, extra, f"check={backend}")


def search(backend: str, docs: np.ndarray, queries: np.ndarray, k: int,
           folder: str = "") -> np.ndarray:
  """The top-k doc rows of each query by inner product in `backend`'s exact index.

  Args:
    backend: one of BACKENDS.
    docs: [N, n] float32 raw doc embeddings (what the index holds).
    queries: [B, n] float32 query embeddings (the export's `encode_query`).
    k: results per query, 1 <= k <= N.
    folder: lancedb only: an empty folder for its table.

  Returns:
    [B, k] int64 doc rows, best first.
  """
  require_backend(backend)
  require(1 <= k <= docs.shape[0], f"k must be in [1, {docs.shape[0]}], got {k}", field="k")
  docs = np.ascontiguousarray(docs, np.float32)
  queries = np.ascontiguousarray(queries, np.float32)
  if backend == "faiss":  # installed: require_backend checked
    import faiss  # pylint: disable=g-import-not-at-top
    index = faiss.IndexFlatIP(docs.shape[1])
    index.add(docs)
    return index.search(queries, k)[1].astype(np.int64)
  import lancedb  # pylint: disable=g-import-not-at-top
  import pyarrow as pa  # pylint: disable=g-import-not-at-top  (a dependency of lancedb)
  require(bool(folder), "lancedb needs a folder for its table", field="folder")
  table = lancedb.connect(os.fspath(folder)).create_table("docs", data=pa.table({
      "row": pa.array(np.arange(len(docs), dtype=np.int64)),
      "vector": pa.FixedSizeListArray.from_arrays(pa.array(docs.ravel()), docs.shape[1])}))
  return np.stack([table.search(x).distance_type("dot").bypass_vector_index().limit(k)
                   .to_arrow()["row"].to_numpy() for x in queries]).astype(np.int64)


def compare_topk(ids: np.ndarray, scores: np.ndarray, want_scores: np.ndarray,
                 want_ids: np.ndarray, tol: float) -> dict:
  """How an index's top-k compares with the project's exact top-k, ties aside.

  Args:
    ids: [B, k] doc rows an index returned.
    scores: [B, N] the project's scores of every doc (`score_all`).
    want_scores, want_ids: [B, k] the project's exact top-k (`ranking.score_topk`).
    tol: scores closer than this count as tied.

  Returns:
    {"queries": B, "clear": queries whose top k + 1 scores are all more than `tol` apart,
     "same_ids": of those, queries whose ids equal the project's in order,
     "max_score_diff": the largest |project's score of a returned id - the exact score at that
     rank| over all queries (within `tol` when the index returns the exact top-k up to ties)}.
  """
  require(ids.shape == want_ids.shape == want_scores.shape and scores.shape[0] == ids.shape[0],
          f"shapes differ: ids {ids.shape}, want {want_ids.shape}, scores {scores.shape}",
          field="ids")
  got = np.take_along_axis(scores, ids.astype(np.int64), axis=1)
  top = -np.sort(-scores, axis=1)[:, :ids.shape[1] + 1]
  clear = np.all(-np.diff(top, axis=1) > tol, axis=1)
  same = np.all(ids == want_ids, axis=1)
  return {"queries": int(len(ids)), "clear": int(clear.sum()),
          "same_ids": int((same & clear).sum()),
          "max_score_diff": float(np.abs(got - want_scores).max()) if ids.size else 0.0}
