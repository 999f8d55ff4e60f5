"""Frozen-encoder embeddings (pooled and per-token) with an on-disk cache.

The project's own Flax encoders (`bilinear_ir.encoders`: BERT, MPNet, read from a
HuggingFace-layout folder through `safetensors` and `tokenizers`, never with remote code) turn
texts into vectors once; the vectors are cached as `.npy` files plus a JSON manifest and reused
while the manifest matches.

Which vectors: `encoder.model` names the model ("" = all-MiniLM-L6-v2, "all-mpnet-base-v2", a
folder, a hub name); `encoder.pooling`, `normalize` and `max_length` default (None) to the
model's sentence-transformers settings (`modules.json`, `1_Pooling/config.json`,
`sentence_bert_config.json`) and override them when set; `encoder.query_prompt` and `doc_prompt`
are put before every query / doc (e5- and bge-style models).

How texts are run through the model:
  * Tokenize everything once (the model's `tokenizer.json`, truncation at `max_length`).
  * Sort texts by token length (longest first) and cut the sorted list into batches of
    `batch_size` texts (rounded up to a multiple of the device count). Each batch is padded to the
    smallest *bucket* length that holds its longest text; buckets are the multiples of 32 below
    `max_length`, plus `max_length` (256 -> 32, 64, ..., 256), so the model compiles at most once
    per bucket, never once per batch (short texts such as queries then cost a fraction of a
    full-length pass). Only the last batch is padded with empty rows. Results are put back in the
    original text order.
  * Each batch is sharded over a 1-D mesh of all local devices (`NamedSharding`, axis "data") and
    run by one `jax.jit` function; params are replicated. The result does not depend on the
    number of devices.

Outputs:
  * `encode`: pooled vectors `[N, n]` float32. Pooling "mean" is the masked mean over the tokens
    (the sentence-transformers pooling of all-MiniLM-L6-v2), "cls" the first token's state;
    `normalize` divides by the L2 norm (clamped at 1e-12, as `torch.nn.functional.normalize`).
  * `encode_tokens`: per-token states `[N, T, n]` stored as float16 (half the memory of float32;
    on unit token vectors of all-MiniLM-L6-v2 the largest rounding error measured is 2.4e-4) and
    a mask `[N, T]` bool, `T` = the token max length (fixed, whatever the texts' lengths). [CLS]
    and [SEP] are kept (as ColBERT does); padding positions are zero. With `normalize`, each
    token vector is L2-normalised.

Against PyTorch transformers on the same folders (`benchmarks/encoder_parity.py`), pooled vectors
agree to ~2e-7 and token states to ~7e-6. On GPU/TPU, XLA's default float32 matmul precision may
use TF32/bfloat16 passes, so vectors differ from CPU ones in about the third decimal; the manifest
records the devices used.

Cache: `encoder.cache_dir` ("" = `$BILINEAR_IR_CACHE` or `~/.cache/bilinear_ir`) holds
`<kind>-<key>.json` (manifest) and `<kind>-<key>.<array>.npy`. The key hashes everything that
changes the numbers: the weights, model config and tokenizer (content hashes), pooling, normalize,
max_length, dtype, the texts (`files.sha256_texts`) and the library versions. A cache file is
trusted only if its manifest equals the expected one and each array loads without pickle with the
recorded shape, dtype and SHA-256; otherwise it is recomputed and overwritten (atomically).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import numbers
import os
import time
from typing import Any, Sequence

from absl import logging
import flax
import jax
import jax.numpy as jnp
import jaxlib
import ml_collections
import numpy as np
import tokenizers

from bilinear_ir import files
from bilinear_ir import progress
from bilinear_ir.data.collection import Collection
from bilinear_ir.encoders.base import POOLINGS
from bilinear_ir.encoders.base import Encoder
from bilinear_ir.encoders.base import pool
from bilinear_ir.encoders.names import load_encoder
from bilinear_ir.errors import InputError
from bilinear_ir.errors import input_error
from bilinear_ir.errors import require

CACHE_ENV = "BILINEAR_IR_CACHE"
BUCKET_STEP = 32
TOKEN_DTYPE = np.float16
CACHE_FORMAT = 2
DATA_AXIS = "data"


def resolved(encoder_cfg: ml_collections.ConfigDict, encoder: Encoder) -> dict[str, Any]:
  """{"pooling", "normalize", "max_length"}: the block's values, or the model's
  sentence-transformers settings (`encoder.defaults`) where the block leaves them None."""
  out = {}
  for key in ("pooling", "normalize", "max_length"):
    value = encoder_cfg.get(key)
    out[key] = encoder.defaults[key] if value is None else value
  return out


def bucket_lengths(max_length: int) -> list[int]:
  """The padded lengths batches may take: multiples of `BUCKET_STEP` below `max_length`, then
  `max_length` (e.g. 256 -> [32, 64, ..., 224, 256]; 40 -> [32, 40]; 20 -> [20])."""
  return list(range(BUCKET_STEP, max_length, BUCKET_STEP)) + [max_length]


# ----------------------------------------------------------------------------------------------
# The model run (no cache).


@functools.lru_cache(maxsize=16)
def _forward(module: flax.linen.Module, normalize: bool, tokens: bool):
  """The jitted `(params, ids [B, L] int32, mask [B, L] int32) -> out` of an encoder's module
  (keyed by the module, not the `Encoder`: encoders that differ only in params, such as
  fine-tuned ones, share it and no params are kept alive here).

  `out` is [B, L, n] float16 token states (zero at padding, optionally L2-normalised) when
  `tokens`, else [B, 2, n] float32: the raw masked-mean and CLS poolings, both from one pass
  (`encode` picks one and normalises it).
  """

  def forward(params, ids, mask):
    hidden = module.apply({"params": params}, ids, mask)  # [B, L, n], as `Encoder.hidden`
    if tokens:
      out = hidden * mask.astype(hidden.dtype)[..., None]
      if normalize:
        out = out / jnp.maximum(jnp.linalg.norm(out, axis=-1, keepdims=True), 1e-12)
      return out.astype(TOKEN_DTYPE)
    pooled = [pool(hidden, mask, p, normalize=False) for p in ("mean", "cls")]
    return jnp.stack(pooled, axis=1).astype(jnp.float32)

  return jax.jit(forward)


def pad_tokens(token_ids: Sequence[Sequence[int]], length: int, pad_id: int,
               rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """Token id lists as one padded block.

  Args:
    token_ids: [N] token id lists (`Encoder.tokenize`), each of length <= `length`.
    length: L, the padded length.
    pad_id: the id padding takes (`Encoder.pad_id`; any id works, padding is masked).
    rows: the rows of the block (>= N; the rows after N are empty: all padding); default N.

  Returns:
    (ids [rows, L] int32, mask [rows, L] int32: 1 on real tokens, a prefix of each row).
  """
  rows = len(token_ids) if rows is None else rows
  ids = np.full((rows, length), pad_id, np.int32)
  mask = np.zeros((rows, length), np.int32)
  for r, t in enumerate(token_ids):
    ids[r, :len(t)], mask[r, :len(t)] = t, 1
  return ids, mask


def run_model(encoder: Encoder, token_ids: list[list[int]], *, normalize: bool,
               tokens: bool, max_length: int, batch_size: int,
               devices: Sequence[jax.Device], desc: str) -> np.ndarray:
  """Runs the encoder over tokenized texts in length-sorted, bucketed, sharded batches.

  Args:
    encoder: the loaded encoder.
    token_ids: [N] token id lists (`Encoder.tokenize`), each of length <= max_length.
    normalize: L2-normalise token states (pooled outputs are returned raw).
    tokens: return per-token states instead of pooled vectors.
    max_length: the output token axis T (tokens) and the largest bucket.
    batch_size: texts per step (rounded up to a multiple of len(devices)).
    devices: the devices of the 1-D data mesh.
    desc: progress bar label (None: no progress report).

  Returns:
    [N, 2, n] float32 (raw mean and CLS poolings) or [N, T, n] float16 (tokens), in the order
    of `token_ids`.
  """
  n_texts = len(token_ids)
  n_dev = len(devices)
  batch = max(1, math.ceil(batch_size / n_dev)) * n_dev
  mesh = jax.sharding.Mesh(np.asarray(devices), (DATA_AXIS,),
                           axis_types=(jax.sharding.AxisType.Auto,))
  data = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(DATA_AXIS))
  params = jax.device_put(encoder.params,
                          jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
  forward = _forward(encoder.module, normalize, tokens)
  lengths = np.array([len(t) for t in token_ids], np.int64)
  order = np.argsort(-lengths, kind="stable")
  buckets = np.array(bucket_lengths(max_length))
  shape = ((n_texts, max_length, encoder.hidden_size) if tokens
           else (n_texts, 2, encoder.hidden_size))
  out = np.zeros(shape, TOKEN_DTYPE if tokens else np.float32)

  def collect(rows: np.ndarray, length: int, result: jax.Array) -> None:
    values = np.asarray(result)[:len(rows)]
    if tokens:
      out[rows, :length] = values
    else:
      out[rows] = values
    bar.update(len(rows))

  pending = []  # dispatched batches not yet copied back (async dispatch overlaps host work)
  with progress.bar(n_texts, desc or "", unit="text", enabled=desc is not None) as bar:
    for start in range(0, n_texts, batch):
      rows = order[start:start + batch]
      length = int(buckets[np.searchsorted(buckets, lengths[rows[0]])])
      ids, mask = pad_tokens([token_ids[i] for i in rows], length, encoder.pad_id, batch)
      result = forward(params, jax.device_put(ids, data), jax.device_put(mask, data))
      pending.append((rows, length, result))
      if len(pending) > 1:
        collect(*pending.pop(0))
    for p in pending:
      collect(*p)
  return out


# ----------------------------------------------------------------------------------------------
# The cache.


def resolve_cache_dir(cache_dir: str) -> str:
  """`cache_dir`, or `$BILINEAR_IR_CACHE`, or `~/.cache/bilinear_ir` when it is ""."""
  if cache_dir:
    return cache_dir
  return os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache",
                                                   "bilinear_ir")


def _versions() -> dict[str, str]:
  """Versions of the libraries whose numerics the cached arrays depend on."""
  return {"jax": jax.__version__, "jaxlib": jaxlib.__version__, "flax": flax.__version__,
          "tokenizers": tokenizers.__version__, "numpy": np.__version__}


def _raw_bytes(a: np.ndarray) -> np.ndarray:
  """The bytes of `a` in C order as a 1-D uint8 view (no copy when already contiguous)."""
  return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def _array_sha256(a: np.ndarray) -> str:
  """SHA-256 of an array's bytes (C order)."""
  return hashlib.sha256(_raw_bytes(a)).hexdigest()


def _array_info(a: np.ndarray) -> dict[str, Any]:
  return {"shape": list(a.shape), "dtype": a.dtype.str, "sha256": _array_sha256(a)}


def _cache_paths(cache_dir: str, key: dict[str, Any], names: Sequence[str]):
  """(manifest path, {array name: .npy path}) for a cache key."""
  digest = files.sha256_bytes(json.dumps(key, sort_keys=True).encode())[:20]
  stem = os.path.join(cache_dir, f"{key['kind']}-{digest}")
  return f"{stem}.json", {n: f"{stem}.{n}.npy" for n in names}


def _cache_load(cache_dir: str, key: dict[str, Any],
                expected: dict[str, tuple[tuple[int, ...], np.dtype]]
                ) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
  """The cached arrays and manifest for `key`, or None if absent, mismatched or corrupt.

  Args:
    cache_dir: the cache folder.
    key: the fields that must match the manifest exactly.
    expected: {array name: (shape, dtype)} the arrays must have.
  """
  manifest_path, npy_paths = _cache_paths(cache_dir, key, list(expected))
  if not os.path.exists(manifest_path):
    return None
  try:
    with open(manifest_path, encoding="utf-8") as f:
      manifest = json.load(f)
    if not isinstance(manifest, dict) or manifest.get("key") != key:
      raise ValueError("manifest does not match the requested encoding")
    arrays = {}
    for name, (shape, dtype) in expected.items():
      info = manifest["arrays"][name]
      a = files.load_npy(npy_paths[name])
      if (a.shape != tuple(shape) or a.dtype != np.dtype(dtype) or list(a.shape) != info["shape"]
          or a.dtype.str != info["dtype"] or _array_sha256(a) != info["sha256"]):
        raise ValueError(f"array {name!r} differs from its manifest")
      arrays[name] = a
  except (OSError, ValueError, KeyError, TypeError, InputError) as e:
    logging.warning("embedding cache %s is stale or corrupt (%s); recomputing", manifest_path, e)
    return None
  return arrays, manifest


def _cache_save(cache_dir: str, key: dict[str, Any], arrays: dict[str, np.ndarray],
                info: dict[str, Any]) -> dict[str, Any]:
  """Writes the arrays, then the manifest (both atomically); returns the manifest."""
  manifest_path, npy_paths = _cache_paths(cache_dir, key, list(arrays))
  manifest = {"key": key, "arrays": {n: _array_info(a) for n, a in arrays.items()}, **info}
  if jax.process_index() == 0:
    for name, a in arrays.items():
      files.atomic_save_npy(npy_paths[name], a)
    files.atomic_write_json(manifest_path, manifest)
  return manifest


# ----------------------------------------------------------------------------------------------
# Public encoding API.


def check_encoder(c: ml_collections.ConfigDict, prefix: str = "encoder") -> None:
  """The `encoder` block (`config.blocks.encoder_config`), checked here once: by the jobs'
  validation (`experiment.validation`) before any work and by every encode call. kind (and the
  folder of precomputed embeddings), model, pooling, normalize, lengths, prompts, batch size;
  pooling, normalize and max_length may be None (the model's own). Raises `InputError` naming
  `<prefix>.<field>`."""
  def integer(value: Any, field: str, low: int) -> None:
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= low
    require(ok, f"must be an integer >= {low}, got {value!r}", field=f"{prefix}.{field}")
  require(c.kind in ("flax", "precomputed"), f"must be one of flax, precomputed; got {c.kind!r}",
          field=f"{prefix}.kind")
  if c.kind == "precomputed":
    require(isinstance(c.path, str) and os.path.isdir(c.path),
            f"must be the folder of precomputed embeddings, got {c.path!r}", field=f"{prefix}.path")
  require(isinstance(c.model, str), "must be a string", field=f"{prefix}.model")
  require(c.pooling is None or c.pooling in POOLINGS,
          f"must be one of {', '.join(POOLINGS)} (or None: the model's); got {c.pooling!r}",
          field=f"{prefix}.pooling")
  require(c.normalize is None or isinstance(c.normalize, bool), "must be true or false",
          field=f"{prefix}.normalize")
  if c.max_length is not None:
    integer(c.max_length, "max_length", 2)
  integer(c.query_max_length, "query_max_length", 2)
  integer(c.doc_max_length, "doc_max_length", 0)
  require(c.doc_max_length != 1, "must be 0 (= max_length) or >= 2",
          field=f"{prefix}.doc_max_length")
  for key in ("query_prompt", "doc_prompt"):
    require(isinstance(c[key], str), "must be a string", field=f"{prefix}.{key}")
  integer(c.batch_size, "batch_size", 1)


def _encode(texts: Sequence[str], encoder_cfg: ml_collections.ConfigDict, *, tokens: bool,
            max_length: int | None, prefix: str, devices: Sequence[jax.Device] | None,
            desc: str, encoder: Encoder | None = None
            ) -> tuple[dict[str, np.ndarray], dict[str, Any], dict[str, Any]]:
  """Encodes `texts` (each after `prefix`) through the cache, with `encoder` (default: the
  block's model, `load_encoder(encoder_cfg.model)`; its `hashes` key the cache).

  Returns:
    ({array name: array}, cache manifest, the settings used: `resolved(encoder_cfg)` with
    `max_length` replaced by the one given, when given).
  """
  check_encoder(encoder_cfg)
  cache_dir = resolve_cache_dir(str(encoder_cfg.cache_dir))
  if encoder is None:
    encoder = load_encoder(str(encoder_cfg.model), cache_dir)
  settings = resolved(encoder_cfg, encoder)
  if max_length is not None:
    settings["max_length"] = int(max_length)
  max_length = int(settings["max_length"])
  require(2 <= max_length <= encoder.max_positions,
          f"must be in [2, {encoder.max_positions}] for {encoder.name}, got {max_length}",
          field="encoder.max_length")
  texts = list(texts)
  for i, t in enumerate(texts):
    if not isinstance(t, str):
      raise input_error(f"expected a string, got {type(t).__name__}", file="texts", record=i)
  n, dim = len(texts), encoder.hidden_size
  key = {
      "format": CACHE_FORMAT,
      "kind": "tokens" if tokens else "pooled",
      **encoder.hashes,
      # Pooled entries hold both raw poolings, so pooling and normalize are not part of the key.
      "normalize": bool(settings["normalize"]) if tokens else None,
      "max_length": max_length,
      "prefix": prefix,
      "dtype": np.dtype(TOKEN_DTYPE if tokens else np.float32).name,
      "num_texts": n,
      "texts_sha256": files.sha256_texts(texts),
      "versions": _versions(),
  }
  if tokens:
    expected = {"vectors": ((n, max_length, dim), TOKEN_DTYPE), "mask": ((n, max_length), bool)}
  else:
    expected = {"mean": ((n, dim), np.float32), "cls": ((n, dim), np.float32)}
  hit = _cache_load(cache_dir, key, expected)
  if hit is not None:
    logging.info("embedding cache hit: %s (%d texts)", key["kind"], n)
    return (*hit, settings)
  started = time.time()
  token_ids = encoder.tokenize(texts, max_length, prefix)
  devices = list(jax.local_devices() if devices is None else devices)
  vectors = run_model(encoder, token_ids, normalize=bool(settings["normalize"]), tokens=tokens,
                       max_length=max_length, batch_size=int(encoder_cfg.batch_size),
                       devices=devices, desc=desc)
  arrays = {"vectors": vectors} if tokens else {"mean": vectors[:, 0], "cls": vectors[:, 1]}
  if tokens:
    lengths = np.array([len(t) for t in token_ids], np.int64)
    arrays["mask"] = np.arange(max_length)[None, :] < lengths[:, None]
  info = {"model": encoder.name, "devices": f"{len(devices)} x {devices[0].platform}",
          "batch_size": int(encoder_cfg.batch_size), "seconds": round(time.time() - started, 3)}
  return arrays, _cache_save(cache_dir, key, arrays, info), settings


def encode(texts: Sequence[str], encoder_cfg: ml_collections.ConfigDict, *, prefix: str = "",
           devices: Sequence[jax.Device] | None = None, desc: str = "encode",
           encoder: Encoder | None = None) -> np.ndarray:
  """Pooled embeddings of `texts` (cached on disk).

  Args:
    texts: [N] strings.
    encoder_cfg: the `encoder` config block (`config.blocks.encoder_config()`).
    prefix: a prompt put before every text (e.g. `encoder_cfg.query_prompt`).
    devices: the devices to shard batches over (default: all local devices).
    desc: progress bar label.
    encoder: the encoder to run instead of the block's model (e.g. fine-tuned weights,
      `train.finetune.tuned_encoder`: its weights hash keys the cache entry).

  Returns:
    [N, n] float32, row i for texts[i].
  """
  arrays, _, settings = _encode(texts, encoder_cfg, tokens=False, max_length=None,
                                prefix=prefix, devices=devices, desc=desc, encoder=encoder)
  return pooled(arrays, settings)


def pooled(arrays: dict[str, np.ndarray], settings: dict[str, Any]) -> np.ndarray:
  """The pooling `settings["pooling"]` of a pooled cache entry, L2-normalised if asked: [N, n]."""
  out = np.array(arrays[str(settings["pooling"])], np.float32)
  if settings["normalize"]:
    out /= np.maximum(np.linalg.norm(out, axis=-1, keepdims=True), 1e-12)
  return out


def encode_tokens(texts: Sequence[str], encoder_cfg: ml_collections.ConfigDict, *,
                  max_length: int | None = None, prefix: str = "",
                  devices: Sequence[jax.Device] | None = None,
                  desc: str = "encode tokens") -> tuple[np.ndarray, np.ndarray]:
  """Per-token embeddings of `texts` (cached on disk); `encoder_cfg.pooling` is not used.

  Args:
    texts: [N] strings.
    encoder_cfg: the `encoder` config block.
    max_length: T, tokens kept per text (default: the block's or the model's max_length).
    prefix: a prompt put before every text.
    devices: the devices to shard batches over (default: all local devices).
    desc: progress bar label.

  Returns:
    (vectors [N, T, n] float16, zero at padding; mask [N, T] bool, True on real tokens incl.
    [CLS] and [SEP]).
  """
  arrays, _, _ = _encode(texts, encoder_cfg, tokens=True, max_length=max_length, prefix=prefix,
                         devices=devices, desc=desc)
  return arrays["vectors"], arrays["mask"]


# ----------------------------------------------------------------------------------------------
# Collections.


def row_index(ids: list[str], wanted: Sequence[str], what: str) -> np.ndarray:
  """Rows of `wanted` ids in `ids`; an unknown id raises `InputError`."""
  index = {q: i for i, q in enumerate(ids)}
  rows = []
  for q in wanted:
    if q not in index:
      raise input_error(f"unknown {what} id {q!r}", file="embeddings", record=f"{what} {q!r}")
    rows.append(index[q])
  return np.asarray(rows, np.int64)


@dataclasses.dataclass
class Embeddings:
  """Pooled embeddings of a collection.

  Attributes:
    doc_ids: [N] doc ids, in collection order.
    docs: [N, n] float32.
    query_ids: [Q] all query ids of the collection, sorted.
    queries: [Q, n] float32.
    manifest: {"docs": cache manifest, "queries": cache manifest}.
  """
  doc_ids: list[str]
  docs: np.ndarray
  query_ids: list[str]
  queries: np.ndarray
  manifest: dict[str, Any]

  def query_rows(self, qids: Sequence[str]) -> np.ndarray:
    """[len(qids), n] the query vectors of `qids`, in that order."""
    return self.queries[row_index(self.query_ids, qids, "query")]


@dataclasses.dataclass
class TokenEmbeddings:
  """Per-token embeddings of a collection (for multi-vector / late-interaction scorers).

  Attributes:
    doc_ids: [N] doc ids, in collection order.
    docs: [N, Td, n] float16, zero at padding.
    doc_mask: [N, Td] bool.
    query_ids: [Q] all query ids of the collection, sorted.
    queries: [Q, Tq, n] float16, zero at padding.
    query_mask: [Q, Tq] bool.
    manifest: {"docs": cache manifest, "queries": cache manifest}.
  """
  doc_ids: list[str]
  docs: np.ndarray
  doc_mask: np.ndarray
  query_ids: list[str]
  queries: np.ndarray
  query_mask: np.ndarray
  manifest: dict[str, Any]

  def query_rows(self, qids: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """([len(qids), Tq, n], [len(qids), Tq]) the query tokens and masks of `qids`."""
    rows = row_index(self.query_ids, qids, "query")
    return self.queries[rows], self.query_mask[rows]


def _settings_manifest(encoder_cfg, settings: dict[str, Any], manifests: dict) -> dict:
  """What the embeddings of a collection were made with: model, pooling, normalisation,
  max_length, prompts, and the cache manifests of each part."""
  return {"settings": {"kind": "flax", "model": str(encoder_cfg.model), **settings,
                       "query_prompt": str(encoder_cfg.query_prompt),
                       "doc_prompt": str(encoder_cfg.doc_prompt)}, **manifests}


def embed_collection(collection: Collection, encoder_cfg: ml_collections.ConfigDict, *,
                     devices: Sequence[jax.Device] | None = None) -> Embeddings:
  """Pooled embeddings of every doc (`collection.doc_strings()`, after `encoder.doc_prompt`) and
  every query (sorted ids, after `encoder.query_prompt`)."""
  query_ids = sorted(collection.queries)
  docs, doc_manifest, settings = _encode(
      collection.doc_strings(), encoder_cfg, tokens=False, max_length=None,
      prefix=str(encoder_cfg.doc_prompt), devices=devices, desc=f"{collection.name} docs")
  queries, query_manifest, _ = _encode(
      [collection.queries[q] for q in query_ids], encoder_cfg, tokens=False, max_length=None,
      prefix=str(encoder_cfg.query_prompt), devices=devices, desc=f"{collection.name} queries")
  return Embeddings(doc_ids=list(collection.doc_ids), docs=pooled(docs, settings),
                    query_ids=query_ids, queries=pooled(queries, settings),
                    manifest=_settings_manifest(encoder_cfg, settings,
                                                {"docs": doc_manifest, "queries": query_manifest}))


def embed_collection_tokens(collection: Collection, encoder_cfg: ml_collections.ConfigDict, *,
                            query_max_length: int = 32, doc_max_length: int | None = None,
                            devices: Sequence[jax.Device] | None = None) -> TokenEmbeddings:
  """Per-token embeddings of every doc and query (after their prompts).

  Args:
    collection: the collection.
    encoder_cfg: the `encoder` config block.
    query_max_length: Tq (queries are short; 32 as in ColBERT).
    doc_max_length: Td (default: the block's or the model's max_length).
    devices: the devices to shard batches over (default: all local devices).

  Returns:
    The `TokenEmbeddings`.
  """
  query_ids = sorted(collection.queries)
  docs, doc_manifest, settings = _encode(
      collection.doc_strings(), encoder_cfg, tokens=True, max_length=doc_max_length,
      prefix=str(encoder_cfg.doc_prompt), devices=devices,
      desc=f"{collection.name} doc tokens")
  queries, query_manifest, _ = _encode(
      [collection.queries[q] for q in query_ids], encoder_cfg, tokens=True,
      max_length=int(query_max_length), prefix=str(encoder_cfg.query_prompt), devices=devices,
      desc=f"{collection.name} query tokens")
  return TokenEmbeddings(doc_ids=list(collection.doc_ids), docs=docs["vectors"],
                         doc_mask=docs["mask"], query_ids=query_ids, queries=queries["vectors"],
                         query_mask=queries["mask"],
                         manifest=_settings_manifest(encoder_cfg, settings,
                                                     {"docs": doc_manifest,
                                                      "queries": query_manifest}))
