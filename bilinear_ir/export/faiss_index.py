"""Export a scorer's doc table to FAISS (the one module that imports faiss, a dev/extra dep).

Any table scorer retrieves by maximum inner product over its doc table
(`score_all == query_table(q) @ doc_table(docs).T`), so a FAISS inner-product index over
`doc_table(docs)` searched with `query_table(q)` returns the scorer's top-k:

    index = export_faiss(module, params, docs)          # faiss.IndexFlatIP, exact
    res = search(index, module, params, queries, k=10)  # TopK, numpy arrays

The flat index is exact (equal to `exact.topk`, up to the order of exactly tied scores, which
FAISS does not define). Approximate indexes over the same table, with the same `search`:

  IVF (inverted lists; train on the table, then probe `nprobe` of `nlist` lists):
      table = doc_table_array(module, params, docs)
      quantizer = faiss.IndexFlatIP(w)
      index = faiss.IndexIVFFlat(quantizer, w, nlist, faiss.METRIC_INNER_PRODUCT)
      index.train(table); index.add(table); index.nprobe = 16
    (`faiss.IndexIVFPQ(quantizer, w, nlist, m, 8, faiss.METRIC_INNER_PRODUCT)` compresses rows.)
  HNSW (graph; no training; recall set by efSearch):
      index = faiss.IndexHNSWFlat(w, 32, faiss.METRIC_INNER_PRODUCT)
      index.hnsw.efConstruction = 200; index.add(table); index.hnsw.efSearch = 128
Both are approximate MIPS: measure their recall@k against the flat index (or `exact.topk`).
Multi-vector tables (m rows per doc) need the row -> doc max afterwards, as
`exact.multi_vector_topk` does; this module handles single-vector tables.
"""
from __future__ import annotations

import numpy as np

from bilinear_ir.errors import input_error
from bilinear_ir.errors import missing_extra
from bilinear_ir.retrieval import exact
from bilinear_ir.scorers.base import table_fn

DEFAULT_BATCH = 65536  # docs per doc_table call while exporting


def _table(module, params, x, method: str, batch: int) -> np.ndarray:
  """Applies `module.<method>` in batches, at float32 on every backend (`table_fn`):
  x [N, n] -> float32 [N, w] (C-contiguous)."""
  fn = table_fn(module, method)
  parts = []
  for lo in range(0, np.shape(x)[0], batch):
    out = fn(params, np.asarray(x[lo:lo + batch], np.float32))
    if isinstance(out, (tuple, list)):
      raise input_error(f"{method} returns several arrays (a multi-vector scorer); export "
                        "single-vector tables only", file="faiss_index")
    parts.append(np.asarray(out, np.float32))
  return np.ascontiguousarray(np.concatenate(parts) if parts else np.zeros((0, 0), np.float32))


def doc_table_array(module, params, docs, batch: int = DEFAULT_BATCH) -> np.ndarray:
  """`module.doc_table(docs)` as a float32 numpy array: docs [N, n] -> [N, w]."""
  return _table(module, params, docs, "doc_table", batch)


def export_faiss(module, params, docs, batch: int = DEFAULT_BATCH):
  """A `faiss.IndexFlatIP` over `doc_table(docs)`: docs [N, n] -> index of N rows of width w.

  Args:
    module: a table scorer (dot, wdp, bilinear, lowrank, ...).
    params: its params (`{}` for dot).
    docs: [N, n] doc embeddings (array-like; converted in batches of `batch`).
    batch: docs per doc_table call.
  """
  try:
    import faiss  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise missing_extra("faiss-cpu", "faiss", "the FAISS export") from None

  table = doc_table_array(module, params, docs, batch)
  if table.shape[0] == 0:
    raise input_error("no docs to index", file="docs")
  index = faiss.IndexFlatIP(table.shape[1])
  index.add(table)
  return index


def search(index, module, params, queries, k: int, batch: int = DEFAULT_BATCH) -> exact.TopK:
  """Searches a FAISS index with `query_table(queries)`: queries [B, n] -> TopK [B, k] (numpy).

  Args:
    index: from `export_faiss` (or an IVF / HNSW index over the same table).
    module, params: the scorer the index was built for.
    queries: [B, n] query embeddings.
    k: results per query, 1 <= k <= index.ntotal.
    batch: queries per query_table call.
  """
  table = _table(module, params, queries, "query_table", batch)
  if table.shape[1] != index.d:
    raise input_error(f"query table width {table.shape[1]} != index width {index.d}",
                      file="faiss index", field="width")
  exact.check_tables(table, np.zeros((0, index.d)), k, num_docs=index.ntotal)
  scores, ids = index.search(table, k)
  return exact.TopK(scores.astype(np.float32), ids.astype(np.int32))
