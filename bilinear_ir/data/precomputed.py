"""Embeddings computed elsewhere, in and out: four files in one folder.

    corpus.npy        [N, n] float32 or float16, one row per doc
    corpus_ids.txt    N lines, the doc id of each row
    queries.npy       [Q, n] float32 or float16, one row per query
    queries_ids.txt   Q lines, the query id of each row
    manifest.json     (written by the `embed` job; optional on input) what made them

`load(folder, collection, normalize)` reads them for a collection (`encoder.kind =
"precomputed"`, `encoder.path = folder`): rows may come in any order, but every doc and query of
the collection must be there exactly once, both arrays must be finite floats of one width, and
nothing is unpickled. Any problem is an `InputError` naming the file (and the row and id).
`write(folder, embeddings, manifest)` writes the same layout atomically (the `embed` job).
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from bilinear_ir import files
from bilinear_ir.data import readers
from bilinear_ir.data.collection import Collection
from bilinear_ir.data.embeddings import Embeddings
from bilinear_ir.errors import input_error

PARTS = {"corpus": ("corpus.npy", "corpus_ids.txt"), "queries": ("queries.npy", "queries_ids.txt")}
MANIFEST = "manifest.json"
DTYPES = (np.float32, np.float16)


def _read_ids(path: str) -> list[str]:
  """One id per line (UTF-8; a trailing newline is fine, blank lines are not), streamed line by
  line (`readers.lines`: a line over the record limit is refused)."""
  ids = []
  for i, line in readers.lines(path, lambda data, offset: "id"):
    if not line.strip():
      raise input_error("empty id", file=path, record=f"line {i}")
    ids.append(line)
  return ids


def _read_array(path: str) -> np.ndarray:
  """A float32/float16 2-D array from a plain `.npy` (no pickle, object and int arrays refused)."""
  if not os.path.isfile(path):
    raise input_error("required file not found", file=path)
  array = files.load_npy(path, mmap=True)
  if array.dtype.type not in DTYPES:
    raise input_error(f"expected float32 or float16 rows, got dtype {array.dtype}", file=path)
  if array.ndim != 2 or array.shape[1] < 1:
    raise input_error(f"expected a [rows, width] array, got shape {array.shape}", file=path)
  return array


def _rows(folder: str, part: str, wanted: list[str], what: str
          ) -> tuple[np.ndarray, int]:
  """[len(wanted), n] float32 rows of `part` in the order of `wanted`, and the width n."""
  npy, txt = (os.path.join(folder, name) for name in PARTS[part])
  array, ids = _read_array(npy), _read_ids(txt)
  if len(ids) != array.shape[0]:
    raise input_error(f"{len(ids)} ids for {array.shape[0]} rows of {PARTS[part][0]}", file=txt)
  index: dict[str, int] = {}
  for row, doc_id in enumerate(ids):
    if doc_id in index:
      raise input_error(f"duplicate {what} id {doc_id!r} (rows {index[doc_id]} and {row})",
                        file=txt, record=f"line {row + 1}")
    index[doc_id] = row
  wanted_set = set(wanted)
  for row, doc_id in enumerate(ids):
    if doc_id not in wanted_set:
      raise input_error(f"unknown {what} id {doc_id!r}: not in the collection", file=txt,
                        record=f"line {row + 1}")
  missing = [w for w in wanted if w not in index]
  if missing:
    shown = ", ".join(repr(m) for m in missing[:5]) + (", ..." if len(missing) > 5 else "")
    raise input_error(f"{len(missing)} {what} id(s) of the collection have no row: {shown}",
                      file=txt)
  out = np.asarray(array[np.asarray([index[w] for w in wanted], np.int64)], np.float32)
  bad = np.flatnonzero(~np.isfinite(out).all(axis=1))
  if bad.size:
    row = index[wanted[int(bad[0])]]
    raise input_error(f"NaN or Inf in the row of {what} id {ids[row]!r}", file=npy,
                      record=f"row {row}")
  return out, array.shape[1]


def _unit_rows(x: np.ndarray) -> np.ndarray:
  """[M, n] rows divided by their L2 norm (clamped at 1e-12), unless all are unit already."""
  norms = np.linalg.norm(x.astype(np.float64), axis=-1, keepdims=True)
  if np.all(np.abs(norms - 1.0) <= 1e-6):
    return x
  return (x / np.maximum(norms, 1e-12)).astype(np.float32)


def load(folder: str, collection: Collection, normalize: bool) -> Embeddings:
  """The embeddings in `folder` for every doc and query of `collection`.

  Args:
    folder: holds corpus.npy, corpus_ids.txt, queries.npy, queries_ids.txt.
    collection: the collection (its doc ids and query ids must all have a row).
    normalize: L2-normalise every row (clamped at 1e-12) after reading; rows that are all unit
      vectors already (|norm - 1| <= 1e-6, e.g. written normalised by the `embed` job) are left
      exactly as read.

  Returns:
    `Embeddings` with docs [N, n] in collection order and queries [Q, n] in sorted id order,
    float32; its manifest records the folder, the files' SHA-256 and `manifest.json` if present.
  """
  if not os.path.isdir(folder):
    raise input_error("no such folder of precomputed embeddings", file=folder,
                      field="encoder.path")
  query_ids = sorted(collection.queries)
  docs, n_docs = _rows(folder, "corpus", list(collection.doc_ids), "doc")
  queries, n_queries = _rows(folder, "queries", query_ids, "query")
  if n_docs != n_queries:
    raise input_error(f"width {n_queries} differs from corpus.npy's {n_docs}",
                      file=os.path.join(folder, PARTS["queries"][0]))
  if normalize:  # rows that are unit vectors already are kept as they are (no new rounding)
    docs, queries = _unit_rows(docs), _unit_rows(queries)
  manifest: dict[str, Any] = {"kind": "precomputed", "path": os.path.abspath(folder),
                              "normalize": bool(normalize),
                              "settings": {"kind": "precomputed", "path": os.path.abspath(folder),
                                           "normalize": bool(normalize)}}
  for part, names in PARTS.items():
    manifest[part] = {name: files.file_sha256(os.path.join(folder, name)) for name in names}
  extra = os.path.join(folder, MANIFEST)
  if os.path.isfile(extra):
    manifest["source_manifest"] = files.read_json(extra)
  return Embeddings(doc_ids=list(collection.doc_ids), docs=docs, query_ids=query_ids,
                    queries=queries, manifest=manifest)


def write(folder: str, embeddings: Embeddings, manifest: dict[str, Any]) -> None:
  """Writes `embeddings` (docs and queries, float32) in the layout above, plus `manifest.json`.

  The files are written into a temporary folder next to `folder`, which then replaces it, so a
  reader never sees a half-written set.
  """
  with files.atomic_dir(folder) as tmp:
    for part, ids, rows in (("corpus", embeddings.doc_ids, embeddings.docs),
                            ("queries", embeddings.query_ids, embeddings.queries)):
      npy, txt = PARTS[part]
      files.atomic_save_npy(os.path.join(tmp, npy), np.asarray(rows, np.float32))
      files.atomic_write_text(os.path.join(tmp, txt), "".join(f"{i}\n" for i in ids))
    files.atomic_write_json(os.path.join(tmp, MANIFEST), manifest)
