"""A doc-table index on disk: `.npy` shards (memory-mapped when read) + a manifest.

`DocIndex.build` runs a scorer's `doc_table` over the docs shard by shard (the docs may be a
memory-mapped array larger than RAM) and writes one `.npy` per shard, then `manifest.json`:

    {"format": 1, "scorer": "bilinear", "scorer_config": {"dim": 384},
     "params_sha256": "...", "dtype": "float32", "width": 384, "num_docs": N, "num_rows": R,
     "multi_vector": false,
     "shards": [{"rows": "rows-00000.npy", "doc_ids": null, "num_docs": 65536, "num_rows": 65536},
                ...]}

Rows are stored as float32 or bfloat16 (half the bytes; stored as the uint16 bit pattern since
`.npy` has no bfloat16). Multi-vector scorers (whose `doc_table` returns `(rows, row_doc_ids,
row_valid)`) store their valid rows and a `doc_ids-*.npy` per shard; their doc score is the max
over the doc's rows. `DocIndex.open` checks the manifest against every shard (shape, dtype) and
reads shards with `allow_pickle=False`, memory-mapped, so `search` streams a table of any size
through `exact.topk_stream` (one shard in memory at a time).

    index = DocIndex.build(path, module, params, doc_embeddings, shard_docs=65536)
    index = DocIndex.open(path); index.check_scorer(module, params)
    res = index.search(module.apply({"params": params}, q, method=module.query_table), k=10)
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from bilinear_ir import files
from bilinear_ir.errors import input_error
from bilinear_ir.retrieval import exact

MANIFEST = "manifest.json"
FORMAT = 1
DTYPES = ("float32", "bfloat16")
DEFAULT_SHARD_DOCS = 65536


def scorer_description(module) -> tuple[str, dict[str, Any]]:
  """(registry name, {field: value}) of a scorer module, as stored in the manifest."""
  name = getattr(module, "registry_name", type(module).__name__)
  config = {f.name: getattr(module, f.name) for f in dataclasses.fields(module)
            if f.name not in ("parent", "name")}
  return name, files.to_jsonable(config)


def _rows_of(doc_table_output, first_doc: int, file: str):
  """Splits a doc_table output into (rows [R, w], doc ids [R] or None)."""
  if isinstance(doc_table_output, (tuple, list)):
    if len(doc_table_output) != 3:
      raise input_error("doc_table must return [N, w] or (rows, row_doc_ids, row_valid)",
                        file=file)
    rows, row_doc, valid = (np.asarray(x) for x in doc_table_output)
    valid = valid.astype(bool)
    return rows[valid], (row_doc[valid].astype(np.int64) + first_doc)
  return np.asarray(doc_table_output), None


def _slice(docs, lo: int, hi: int):
  if isinstance(docs, (tuple, list)):
    return tuple(np.asarray(x[lo:hi]) for x in docs)
  return (np.asarray(docs[lo:hi]),)


@dataclasses.dataclass(frozen=True)
class DocIndex:
  """An opened index: its folder and validated manifest (shards are read lazily)."""
  directory: str
  manifest: dict[str, Any]

  @property
  def num_docs(self) -> int:
    """N, docs in the index."""
    return int(self.manifest["num_docs"])

  @property
  def width(self) -> int:
    """w, the table width."""
    return int(self.manifest["width"])

  @property
  def dtype(self) -> str:
    """"float32" or "bfloat16"."""
    return self.manifest["dtype"]

  @classmethod
  def build(cls, directory: str, module, params, docs, *, shard_docs: int = DEFAULT_SHARD_DOCS,
            dtype: str = "float32", overwrite: bool = False) -> DocIndex:
    """Writes the doc table of `docs` as shards + manifest and returns the opened index.

    Args:
      directory: output folder (created).
      module: a table scorer (its `doc_table` is applied), or None when `docs` already are
        doc-table rows [N, w] (recorded as scorer "table").
      params: the module's params (`{}` for parameter-free scorers; ignored if module is None).
      docs: what `doc_table` takes, sliced along axis 0 per shard: an array-like [N, ...] (numpy,
        np.memmap for docs larger than RAM) or a tuple of them (e.g. `(tokens, mask)`).
      shard_docs: docs per shard (one shard is in memory at a time when building and searching).
      dtype: "float32" or "bfloat16" rows.
      overwrite: replace an existing index in `directory` (its listed shards are removed).

    Returns:
      The DocIndex (as `DocIndex.open(directory)`).
    """
    if dtype not in DTYPES:
      raise input_error(f"must be one of {DTYPES}, got {dtype!r}", file="config",
                        field="retrieval.dtype")
    if shard_docs < 1:
      raise input_error(f"must be >= 1, got {shard_docs}", file="config",
                        field="retrieval.shard_docs")
    manifest_path = os.path.join(directory, MANIFEST)
    old = None
    if os.path.exists(manifest_path):
      if not overwrite:
        raise input_error("an index already exists here (pass overwrite=True)",
                          file=manifest_path)
      old = cls.open(directory)
    os.makedirs(directory, exist_ok=True)
    first = docs[0] if isinstance(docs, (tuple, list)) else docs
    n = int(np.shape(first)[0])
    if module is None:
      name, config, digest, apply = "table", {}, files.tree_sha256({}), None
    else:
      name, config = scorer_description(module)
      digest = files.tree_sha256(params)
      apply = jax.jit(lambda p, *x: module.apply({"params": p}, *x, method=module.doc_table))
    shards, width, total_rows, multi = [], None, 0, None
    for i, lo in enumerate(range(0, n, shard_docs)):
      hi = min(n, lo + shard_docs)
      part = _slice(docs, lo, hi)
      out = part[0] if apply is None else apply(params, *part)
      rows, doc_ids = _rows_of(out, lo, file=f"shard {i}")
      if rows.ndim != 2:
        raise input_error(f"doc table rows must be 2-D [N, w], got shape {rows.shape}",
                          file=f"shard {i}")
      multi = doc_ids is not None if multi is None else multi
      width = rows.shape[1] if width is None else width
      entry = {"rows": f"rows-{i:05d}.npy", "doc_ids": None, "num_docs": hi - lo,
               "num_rows": int(rows.shape[0])}
      stored = (np.asarray(jnp.asarray(rows, jnp.bfloat16)).view(np.uint16)
                if dtype == "bfloat16" else rows.astype(np.float32))
      files.atomic_save_npy(os.path.join(directory, entry["rows"]), stored)
      if multi:
        entry["doc_ids"] = f"doc_ids-{i:05d}.npy"
        files.atomic_save_npy(os.path.join(directory, entry["doc_ids"]), doc_ids.astype(np.int32))
      shards.append(entry)
      total_rows += entry["num_rows"]
    manifest = {"format": FORMAT, "scorer": name, "scorer_config": config,
                "params_sha256": digest, "dtype": dtype, "width": int(width or 0),
                "num_docs": n, "num_rows": total_rows, "multi_vector": bool(multi),
                "shards": shards}
    files.atomic_write_json(manifest_path, manifest)
    if old is not None:
      keep = {e[f] for e in shards for f in ("rows", "doc_ids") if e[f]}
      for e in old.manifest["shards"]:
        for f in ("rows", "doc_ids"):
          if e[f] and e[f] not in keep:
            os.remove(os.path.join(directory, e[f]))
    return cls.open(directory)

  @classmethod
  def open(cls, directory: str) -> DocIndex:
    """Reads and checks the manifest and every shard's header (no data is loaded)."""
    path = os.path.join(directory, MANIFEST)
    try:
      with open(path, "rb") as f:
        raw = f.read()
    except FileNotFoundError as e:
      raise input_error("no index manifest here (build one with DocIndex.build)", file=path) from e
    try:
      manifest = json.loads(files.decode_utf8(raw, path))
    except json.JSONDecodeError as e:
      raise input_error(f"not valid JSON ({e})", file=path) from e
    need = {"format": int, "scorer": str, "params_sha256": str, "dtype": str, "width": int,
            "num_docs": int, "num_rows": int, "multi_vector": bool, "shards": list}
    for field, kind in need.items():
      if not isinstance(manifest, dict) or not isinstance(manifest.get(field), kind):
        raise input_error(f"missing or not a {kind.__name__}", file=path, field=field)
    if manifest["format"] != FORMAT:
      raise input_error(f"unknown format {manifest['format']} (this code reads {FORMAT})",
                        file=path, field="format")
    if manifest["dtype"] not in DTYPES:
      raise input_error(f"must be one of {DTYPES}", file=path, field="dtype")
    index = cls(directory, manifest)
    docs = rows = 0
    for i, entry in enumerate(manifest["shards"]):
      for field in ("rows", "num_docs", "num_rows"):
        if field not in entry:
          raise input_error("missing", file=path, record=f"shard {i}", field=field)
      shard = index._load(entry["rows"])
      want = (entry["num_rows"], manifest["width"])
      if shard.shape != want or shard.dtype != index._stored_dtype():
        raise input_error(f"expected {index._stored_dtype()} {want} as the manifest says, got "
                          f"{shard.dtype} {shard.shape}",
                          file=os.path.join(directory, entry["rows"]), field="shape")
      if manifest["multi_vector"]:
        ids = index._load(entry.get("doc_ids") or "")
        if ids.shape != (entry["num_rows"],) or ids.dtype != np.int32:
          raise input_error(f"expected int32 ({entry['num_rows']},), got {ids.dtype} {ids.shape}",
                            file=os.path.join(directory, entry["doc_ids"]), field="shape")
      docs += entry["num_docs"]
      rows += entry["num_rows"]
    if docs != manifest["num_docs"] or rows != manifest["num_rows"]:
      raise input_error(f"shards hold {docs} docs / {rows} rows, the manifest says "
                        f"{manifest['num_docs']} / {manifest['num_rows']}", file=path,
                        field="num_docs")
    return index

  def _stored_dtype(self) -> np.dtype:
    return np.dtype(np.uint16) if self.dtype == "bfloat16" else np.dtype(np.float32)

  def _load(self, name: str) -> np.ndarray:
    path = os.path.join(self.directory, name)
    if not name or os.path.basename(name) != name:
      raise input_error("shard file name must be a plain file name", file=path)
    return files.load_npy(path, mmap=True)

  def shards(self) -> Iterator[np.ndarray]:
    """Yields each shard's rows [R_i, w], memory-mapped (bfloat16 shards as a bfloat16 view)."""
    for entry in self.manifest["shards"]:
      rows = self._load(entry["rows"])
      yield rows.view(jnp.bfloat16) if self.dtype == "bfloat16" else rows

  def table(self) -> np.ndarray:
    """The whole doc table [R, w] in memory (for small indexes, tests and FAISS export)."""
    parts = list(self.shards())
    return np.concatenate(parts) if parts else np.zeros((0, self.width), np.float32)

  def doc_ids_of_rows(self) -> np.ndarray | None:
    """[R] int32 doc id of every row (multi-vector indexes), else None."""
    if not self.manifest["multi_vector"]:
      return None
    return np.concatenate([self._load(e["doc_ids"]) for e in self.manifest["shards"]])

  def check_scorer(self, module, params) -> None:
    """Raises `InputError` unless the index was built by this scorer with these params."""
    name, config = scorer_description(module)
    path = os.path.join(self.directory, MANIFEST)
    if name != self.manifest["scorer"] or config != self.manifest.get("scorer_config"):
      raise input_error(f"index built for scorer {self.manifest['scorer']!r} "
                        f"{self.manifest.get('scorer_config')}, not {name!r} {config}",
                        file=path, field="scorer")
    if files.tree_sha256(params) != self.manifest["params_sha256"]:
      raise input_error("index built with other params (hash differs); rebuild it", file=path,
                        field="params_sha256")

  def search(self, query_table, k: int, **kwargs) -> exact.TopK:
    """Exact top-k over the index, streamed shard by shard: qt [B, w] -> TopK [B, k].

    Args:
      query_table: [B, w] from the same scorer's `query_table` (bf16 indexes: the query table is
        rounded to bf16, scores accumulate in float32).
      k: results per query, 1 <= k <= num_docs.
      **kwargs: `chunk`, `block`, `query_chunk` for `exact.topk`.
    """
    exact.check_tables(query_table, np.zeros((0, self.width)), k, num_docs=self.num_docs,
                       where=os.path.join(self.directory, MANIFEST))
    if not self.manifest["multi_vector"]:
      return exact.topk_stream(query_table, self.shards(), k, num_docs=self.num_docs, **kwargs)
    found = []
    for entry, rows in zip(self.manifest["shards"], self.shards()):
      if entry["num_rows"] == 0:
        continue
      doc_ids = self._load(entry["doc_ids"])
      kk = min(k, int(np.unique(doc_ids).size))
      found.append(exact.multi_vector_topk(query_table, jnp.asarray(rows), doc_ids, kk, **kwargs))
    scores = jnp.concatenate([f.scores for f in found], axis=1)
    ids = jnp.concatenate([f.ids for f in found], axis=1)
    if scores.shape[1] < k:
      raise input_error(f"only {scores.shape[1]} docs have a valid row, k is {k}",
                        file="retrieval", field="k")
    return exact.merge(scores, ids, k)
