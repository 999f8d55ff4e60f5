"""Exact top-k maximum inner product search over a doc table of any size.

Retrieval with any table scorer (dot, wdp, bilinear, low-rank, ...) is MIPS of a query table
`qt [B, w]` against a doc table `dt [N, w]` (`score_all == qt @ dt.T`). `topk` never builds the
`[B, N]` score matrix: it scans the doc table in chunks of `chunk` rows and keeps a running top-k,
so memory is bounded by one `[B, chunk]` score block (queries are also tiled by `query_chunk`).

The exact selection avoids a full `lax.top_k` over every score (slow on CPU). Each chunk's scores
are cut into blocks of `block` consecutive docs and only the block maxima `[B, chunk / block]`
enter `lax.top_k`: the running state is the k best BLOCKS so far (their maxima and all their
scores). This is exact because the k best docs always lie in the k best blocks ranked by
(block max desc, block id asc): a doc in a block outside them is beaten by the best doc of each of
those k blocks. At the end one `lax.top_k` over the k * block kept scores gives the answer.

Ties are deterministic: equal scores rank the lower doc id first, across blocks, chunks, shards,
processes and streamed shards (`lax.top_k` puts the lower position first, every candidate list
here is kept in doc-id order, and `merge` sorts by (score desc, id asc)).

Scores must be finite (NaN or -inf scores give unspecified ranks); they are float32 (bf16 tables
are multiplied with float32 accumulation).

Precision on every backend: every score matmul here runs at `PRECISION` (`lax.Precision.HIGHEST`,
float32 products and sums), passed explicitly. JAX's default is float32 on CPU but TF32 on recent
NVIDIA GPUs and one bf16 pass on TPU, whose scores can differ from float32 in the 3rd decimal: the
exactness claims (this scan equals the float32 brute force) and every bound built on float32
rounding (`certified`, `mol_topk.exact_two_pass`) assume float32 arithmetic. bf16 tables are
unaffected (bf16 products are exact in float32 and accumulate in float32).

    res = topk(qt, dt, k=10)                   # TopK(scores [B, 10], ids [B, 10])
    res = topk_stream(qt, shards, k=10)        # shards: iterable of [N_i, w] (e.g. memmaps)
    res = multi_vector_topk(qt, rows, doc_ids_of_rows, k=10)   # max over each doc's rows
    n = count_at_least(qt, dt, cutoff)         # [B] docs scoring >= each query's cutoff

Speed (CPU): XLA's float32 matmul runs near the core's peak, so the scan costs the matmul plus
the selection (block maxima, one small `lax.top_k` per chunk, gathers); `lax.top_k` runs on one
thread. On GPUs the selection of small k is k fused argmax passes instead (`default_selection`). `certified.bf16_topk` gives the same exact float32 result from a bf16 scan (2-3x faster
matmuls on CPUs with AVX512-BF16) plus a float32 rescoring of a few candidates per query.

Strategies (`topk(strategy=...)`, `default_strategy`): "xla", the chunked scan above; "pallas",
`fused_topk`, a fused scan-and-select kernel (`pallas_topk`) that streams the doc table once and
writes only each doc block's k best per query, merged here: the same exact float32 result;
"pallas_blockmax", `blockmax_topk`: a Pallas kernel that writes only each query's maximum over
each group of G docs, then the block logic above in XLA (the k best groups, their docs rescored).
"""
from __future__ import annotations

import functools
import mmap
from typing import Iterable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from bilinear_ir.errors import input_error
from bilinear_ir.retrieval import pallas_topk

DEFAULT_CHUNK = 8192        # doc rows per scan step for k <= 64: [B, chunk] scores live at once
MAX_CHUNK = 32768           # largest default chunk on CPU (k > 256 then prunes with smaller blocks)
ACCEL_SCORE_BYTES = 1 << 30   # accelerators: a [B, chunk] float32 score block of about this
MAX_ACCEL_CHUNK = 1 << 20   # largest default chunk on accelerators
MAX_UNROLL = 16             # accelerators: scan loops of at most this many steps are unrolled
DEFAULT_QUERY_CHUNK = 1024  # queries per scan
MAX_BLOCK = 32              # largest block of docs summarised by its maximum
ARGMAX_MAX_K = 16           # GPUs: k up to this selects by k argmax passes (`selection`)
SELECTIONS = ("top_k", "argmax")  # how the scan picks its k best blocks and docs (`selection`)
STRATEGIES = ("xla", "pallas", "pallas_blockmax")  # the XLA scan or a Pallas kernel (`strategy`)
PRECISION = lax.Precision.HIGHEST  # float32 score matmuls on every backend (module docstring)
NO_DOC = np.iinfo(np.int32).max  # id of a padding slot (only returned when fewer than k docs)


class TopK(NamedTuple):
  """Top-k result: `scores` [B, k] float32 descending; `ids` [B, k] int32 doc ids (row numbers).

  Equal scores are ordered by lower doc id first.
  """
  scores: jax.Array
  ids: jax.Array


def check_tables(query_table, doc_table, k: int, num_docs: int | None = None,
                 where: str = "doc_table") -> None:
  """Raises `InputError` unless qt [B, w] and dt [N, w] are 2-D with equal w and 1 <= k <= N.

  Args:
    query_table: [B, w].
    doc_table: [N, w] (rows).
    k: results per query.
    num_docs: the number of retrievable docs if not N (multi-vector rows, sharded tables).
    where: name of the doc table in messages.
  """
  if len(np.shape(query_table)) != 2:
    raise input_error(f"must be 2-D [B, w], got shape {tuple(np.shape(query_table))}",
                      file="query_table")
  if len(np.shape(doc_table)) != 2:
    raise input_error(f"must be 2-D [N, w], got shape {tuple(np.shape(doc_table))}", file=where)
  w_q, w_d = np.shape(query_table)[1], np.shape(doc_table)[1]
  if w_q != w_d:
    raise input_error(f"width {w_d} does not match the query table's width {w_q} "
                      "(build both with the same scorer and params)", file=where, field="width")
  n = np.shape(doc_table)[0] if num_docs is None else num_docs
  if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or not 1 <= k <= n:
    raise input_error(f"k must be an integer in [1, {n}] (the number of docs), got {k!r}",
                      file="retrieval", field="k")
  if n >= NO_DOC:
    raise input_error(f"at most {NO_DOC - 1} docs fit int32 ids, got {n}", file=where)


def default_chunk(k: int, batch: int | None = None, platform: str | None = None) -> int:
  """Doc rows per scan step, per device.

  CPU: max(DEFAULT_CHUNK, 128 k) up to MAX_CHUNK (measured below). Accelerators (GPU, TPU):
  the largest power of two whose [batch, chunk] float32 score block fits ACCEL_SCORE_BYTES
  (1 GiB), at least the CPU chunk and at most MAX_ACCEL_CHUNK, so a scan has few steps. Measured
  on one H200 (`benchmarks/gpu_sweep.py`, 1,000 queries x 200k docs x 384, k = 10, median of 5):
  chunks 8,192 / 32,768 / 131,072 / 200,000 (one step) took 5.72 / 5.90 / 5.47 / 5.09 ms at
  block 32, against a 3.73 ms bare float32 matmul of the whole table and a 3.07 ms roofline
  bound; the selection alone is 0.86 ms at one step. With 1 GiB blocks 1,000 queries scan
  262,144 rows per step (200k docs in one) and 32 queries 1M rows.

  Args:
    k: results per query.
    batch: queries per scan B (accelerators; None: DEFAULT_QUERY_CHUNK).
    platform: "cpu", "gpu", "tpu" (None: jax's default backend).

  Each step costs a `lax.top_k` over k + chunk / block values and gathers k * block scores, so
  the chunk grows with k to keep both small per doc. DEFAULT_CHUNK was measured on a 2-core CPU
  with `allocator.keep_freed_memory`, 1,000 queries x 200,000 docs at width 384, k = 10 (median
  ms of 4 interleaved calls): chunks 1,024 / 2,048 / 4,096 / 8,192 took 655 / 634 / 612 / 603
  (FAISS flat 603); chunks 4,096 / 8,192 / 12,288 / 16,384 took 553 / 547 / 569 / 587 (FAISS
  555). Width 32 (low-rank tables) is also fastest at 8,192.
  """
  base = int(min(MAX_CHUNK, max(DEFAULT_CHUNK, 128 * k)))
  if (platform or jax.default_backend()) == "cpu":
    return base
  rows = ACCEL_SCORE_BYTES // (4 * max(1, batch or DEFAULT_QUERY_CHUNK))
  return int(min(MAX_ACCEL_CHUNK, max(base, 1 << max(0, int(rows).bit_length() - 1))))


def default_block(k: int, chunk: int) -> int:
  """Docs per block: the largest power of two <= MAX_BLOCK with k * block <= chunk / 4.

  Small k (the usual 10 .. 100) prunes with blocks of 32; a k near the chunk size falls back to
  block 1, a plain running `lax.top_k` over k + chunk scores.
  """
  block = MAX_BLOCK
  while block > 1 and k * block * 4 > chunk:
    block //= 2
  return block


def default_selection(k: int, platform: str | None = None) -> str:
  """How the scan picks its k best blocks and docs, per device: "top_k" or "argmax".

  "top_k" is `lax.top_k`; "argmax" is `argmax_top_k` (k fused argmax passes), the same result.
  "argmax" on GPUs for k <= ARGMAX_MAX_K, "top_k" elsewhere (CPU; TPU, not measured): XLA's GPU
  `lax.top_k` sorts the whole row, which was 15% of the 1,000 x 200k scan's device time on one
  H200 (the `benchmarks/gpu_sweep.py` profile); `benchmarks/topk.py --selections top_k,argmax`
  times both.
  Measured on one H200 (k = 10, width 384, one step, median of 5): 1,000 x 200k, 5.07 ms with
  `lax.top_k` and 4.63 ms with argmax passes; 32 x 1M, 1.94 and 1.83 ms.

  Args:
    k: results per query.
    platform: "cpu", "gpu", "tpu" (None: jax's default backend).
  """
  if (platform or jax.default_backend()) == "gpu" and k <= ARGMAX_MAX_K:
    return "argmax"
  return "top_k"


def default_strategy(k: int, platform: str | None = None) -> str:
  """Which scan `topk` runs, per device: "xla" (`scan_topk`) or "pallas" (`fused_topk`: the
  fused scan-and-select kernel, `pallas_topk.block_candidates`, + `merge`; the same result).

  "xla" on every device until the Pallas kernel is measured faster on one (it is compiled only
  for GPUs; on a CPU it runs in Pallas interpret mode, for tests only).

  Args:
    k: results per query.
    platform: "cpu", "gpu", "tpu" (None: jax's default backend).
  """
  del k, platform
  return "xla"


def fused_topk(qt: jax.Array, dt: jax.Array, k: int, tiles: pallas_topk.Tiles | None = None,
                id_offset=0, interpret: bool | None = None) -> TopK:
  """Exact top-k by the fused Pallas scan-and-select kernel: qt [B, w], dt [N, w] -> TopK [B, k].

  Each doc block's k best per query come from the kernel (`pallas_topk.block_candidates`), then
  `merge` orders all [B, blocks k] candidates by (score desc, id asc). Ties by lower id; slots
  past N (k > N) get -inf and NO_DOC. Traceable.

  Args:
    qt: [B, w]; dt: [N, w] float32 or bfloat16; k: results per query.
    tiles: `pallas_topk.Tiles` (None: `pallas_topk.default_tiles(B, w)`).
    id_offset: added to every real id.
    interpret: Pallas interpret mode (None: unless the default backend is a GPU).
  """
  tiles = pallas_topk.default_tiles(*qt.shape) if tiles is None else tiles
  interpret = pallas_topk.interpret_default() if interpret is None else interpret
  scores, ids = pallas_topk.block_candidates(qt, dt, k, tiles, NO_DOC, interpret)
  if scores.shape[1] < k:  # fewer candidates than k (k > N): pad
    pad = k - scores.shape[1]
    scores = jnp.pad(scores, ((0, 0), (0, pad)), constant_values=-jnp.inf)
    ids = jnp.pad(ids, ((0, 0), (0, pad)), constant_values=NO_DOC)
  res = merge(scores, ids, k)
  return TopK(res.scores, jnp.where(res.ids == NO_DOC, NO_DOC, res.ids + id_offset))


def blockmax_topk(qt: jax.Array, dt: jax.Array, k: int, tiles: pallas_topk.Tiles | None = None,
                  id_offset=0, interpret: bool | None = None, selection: str | None = None
                  ) -> TopK:
  """Exact top-k by group maxima from a Pallas kernel: qt [B, w], dt [N, w] -> TopK [B, k].

  The kernel (`pallas_topk.group_maxima`) streams the table once and writes each query's
  maximum over each group of G = `tiles.group` docs ([B, N / G] float32, no running top-k).
  Then the module's block logic in XLA: the k best groups by (max desc, group id asc) hold the
  k best docs (module docstring); their k G docs are rescored (float32 products and sums, the
  gather fused into the reduction: k G w reads per query, no [B, k G, w] copy) and `_finish`
  picks the k best by (score desc, id asc). Ties by lower id; slots past N get -inf / NO_DOC.
  The kernel's and the rescoring's float32 sums run in different orders: a group whose maximum
  ties another's to within float32 rounding may be ranked either way (as the XLA scan against
  `fused_topk`). Traceable.

  Args:
    qt: [B, w]; dt: [N, w] float32 or bfloat16; k: results per query.
    tiles: `pallas_topk.Tiles` (None: `pallas_topk.default_tiles(B, w)`), G = tiles.group.
    id_offset: added to every real id.
    interpret: Pallas interpret mode (None: unless the default backend is a GPU).
    selection: how the k best groups and docs are picked (None: `default_selection`).
  """
  tiles = pallas_topk.default_tiles(*qt.shape) if tiles is None else tiles
  interpret = pallas_topk.interpret_default() if interpret is None else interpret
  selection = default_selection(k) if selection is None else selection
  n, g = dt.shape[0], tiles.group
  maxima = pallas_topk.group_maxima(qt, dt, tiles, interpret)  # [B, NG]
  if maxima.shape[1] < k:  # fewer groups than k: empty groups past N
    maxima = jnp.pad(maxima, ((0, 0), (0, k - maxima.shape[1])), constant_values=-jnp.inf)
  top, blocks = _select(maxima, k, selection)  # ties: the lower group id
  rows = blocks[:, :, None] * g + jnp.arange(g, dtype=jnp.int32)  # [B, k, G]
  docs = dt[jnp.minimum(rows, n - 1)].astype(jnp.float32)  # [B, k, G, w], fused below
  scores = jnp.sum(docs * qt.astype(dt.dtype).astype(jnp.float32)[:, None, None, :], axis=-1)
  scores = jnp.where(rows < n, scores, -jnp.inf)
  return _finish(_State(top, scores, blocks.astype(jnp.int32)), k, n, id_offset, selection)


def argmax_top_k(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
  """`lax.top_k(x, k)` by k argmax passes: the same values and positions (ties: lower first).

  Each pass is one argmax over x with the positions already taken masked out, which XLA fuses
  into one reduction reading x; no sort. Values are ordered through an int32 key (the float's
  bits, negatives flipped: XLA's total order, as `lax.top_k`, so 0.0 ranks above -0.0), so -inf
  entries are taken in position order like `lax.top_k`'s and a taken entry (key int32 min) is
  never taken again.

  Args:
    x: [B, M] float32, no NaN; M >= k.
    k: entries per row.

  Returns:
    (values [B, k] float32, positions [B, k] int32).
  """
  bits = lax.bitcast_convert_type(x, jnp.int32)
  keys = jnp.where(bits < 0, bits ^ jnp.int32(0x7FFFFFFF), bits)
  cols = lax.broadcasted_iota(jnp.int32, keys.shape, 1)
  taken = jnp.zeros(keys.shape, bool)
  pos = []
  for _ in range(k):
    p = jnp.argmax(jnp.where(taken, jnp.iinfo(jnp.int32).min, keys), axis=1).astype(jnp.int32)
    taken = taken | (cols == p[:, None])
    pos.append(p)
  pos = jnp.stack(pos, axis=1)
  return jnp.take_along_axis(x, pos, axis=1), pos


def _select(x: jax.Array, k: int, selection: str) -> tuple[jax.Array, jax.Array]:
  """(values [B, k], positions [B, k]) of x [B, M] by `selection` ("top_k" / "argmax")."""
  return argmax_top_k(x, k) if selection == "argmax" else lax.top_k(x, k)


def brute_force(query_table, doc_table, k: int) -> TopK:
  """Reference top-k from the full score matrix: qt [B, w], dt [N, w] -> TopK [B, k].

  Builds [B, N] scores; use for small N and as the test twin of `topk`.
  """
  check_tables(query_table, doc_table, k)
  return _brute_force(jnp.asarray(query_table), jnp.asarray(doc_table), k)


@functools.partial(jax.jit, static_argnames=("k",))
def _brute_force(qt, dt, k):
  scores, ids = lax.top_k(_dot(qt, dt), k)
  return TopK(scores, ids)


def _dot(qt: jax.Array, dt: jax.Array) -> jax.Array:
  """qt [B, w] x dt [C, w] -> [B, C] float32 (bf16 tables: bf16 inputs, f32 accumulation).

  At `PRECISION` (float32, not the backend's default TF32 / bf16 passes).
  """
  return lax.dot_general(qt.astype(dt.dtype), dt, (((1,), (1,)), ((), ())),
                         precision=PRECISION, preferred_element_type=jnp.float32)


def merge(scores, ids, k: int) -> TopK:
  """Exact top-k of candidate lists with global ids: scores, ids [B, M] -> TopK [B, k].

  Orders by (score desc, id asc), so ties are deterministic whatever the candidates' order (per
  shard, per process or per streamed shard lists concatenated along axis 1).
  """
  neg, ids = lax.sort((0.0 - jnp.asarray(scores, jnp.float32), jnp.asarray(ids, jnp.int32)),
                      dimension=1, num_keys=2)
  return TopK(-neg[:, :k], ids[:, :k])


class _State(NamedTuple):
  """Running k best blocks: maxima [B, k], all their scores [B, k, g], block ids [B, k]."""
  maxima: jax.Array
  scores: jax.Array
  blocks: jax.Array


def _init_state(b: int, k: int, g: int) -> _State:
  return _State(jnp.full((b, k), -jnp.inf, jnp.float32),
                jnp.full((b, k, g), -jnp.inf, jnp.float32),
                jnp.full((b, k), NO_DOC, jnp.int32))


def _step(state: _State, s: jax.Array, first_block, valid, selection: str = "top_k"
          ) -> _State:
  """Merges one chunk's scores into the running k best blocks.

  Args:
    state: running blocks (all with lower block ids than this chunk's).
    s: [B, C] float32 scores of the chunk's C rows, C a multiple of the block size g.
    first_block: block id of this chunk's first block (int, may be traced).
    valid: None (all rows real) or [C] bool (False rows are padding or masked; score -inf).
    selection: "top_k" or "argmax" (`default_selection`; the same result).
  """
  k, g = state.scores.shape[1:]
  b, c = s.shape
  s = s.reshape(b, c // g, g)
  masked = s if valid is None else jnp.where(valid.reshape(c // g, g)[None], s, -jnp.inf)
  # Running blocks come first: on equal maxima lax.top_k keeps the lower position, which is the
  # lower block id (the running blocks are kept in (max desc, id asc) order, induction).
  maxima, pos = _select(jnp.concatenate([state.maxima, masked.max(axis=2)], axis=1), k,
                        selection)
  from_state = pos < k
  p_state = jnp.where(from_state, pos, 0)
  p_chunk = jnp.where(from_state, 0, pos - k)
  new = jnp.take_along_axis(s, p_chunk[:, :, None], axis=1)
  if valid is not None:
    new = jnp.where(valid.reshape(c // g, g)[p_chunk], new, -jnp.inf)
  scores = jnp.where(from_state[:, :, None],
                     jnp.take_along_axis(state.scores, p_state[:, :, None], axis=1), new)
  blocks = jnp.where(from_state, jnp.take_along_axis(state.blocks, p_state, axis=1),
                     first_block + p_chunk)
  return _State(maxima, scores, blocks.astype(jnp.int32))


def scan_topk(qt: jax.Array, dt: jax.Array, k: int, chunk: int | None = None,
              block: int | None = None, id_offset=0, num_valid=None,
              row_valid: jax.Array | None = None, unroll: bool | None = None,
              selection: str | None = None) -> TopK:
  """Traceable core of `topk` (no input checks; use inside jit / shard_map).

  Args:
    qt: [B, w] query table.
    dt: [N, w] doc table (k may exceed N: missing slots get score -inf and id NO_DOC).
    k: results per query.
    chunk: doc rows per step (None: `default_chunk(k, B)`, per device; rounded up to a multiple
      of the block).
    block: docs per block (None: `default_block(k, chunk)`).
    id_offset: added to every returned id (int or traced int32), e.g. a shard's first row.
    num_valid: None, or an int / traced int32: rows >= num_valid are ignored (padding).
    row_valid: None, or [N] bool: False rows are ignored (e.g. multi-vector padding rows).
    unroll: unroll the loop over chunks (None: on accelerators when it has at most MAX_UNROLL
      steps, which removes the loop's per-step overhead; never on CPU).
    selection: "top_k" or "argmax" (None: `default_selection(k)`, per device; the same result).

  Returns:
    TopK [B, k] with ids `id_offset + row`.
  """
  def scores(start, size, pad):
    rows = dt[start:start + size] if pad else lax.dynamic_slice_in_dim(dt, start, size)
    return _dot(qt, jnp.pad(rows, ((0, pad), (0, 0))) if pad else rows)

  return select_topk(scores, qt.shape[0], dt.shape[0], k, chunk, block, id_offset, num_valid,
                     row_valid, unroll, selection)


def select_topk(scores, b: int, n: int, k: int, chunk: int | None = None,
                block: int | None = None, id_offset=0, num_valid=None,
                row_valid: jax.Array | None = None, unroll: bool | None = None,
                selection: str | None = None) -> TopK:
  """The scan's selection over any source of scores (traceable; `scan_topk` is its matmul form).

  Args:
    scores: (start, size, pad) -> [B, size + pad] float32 scores of rows [start, start + size)
      followed by `pad` padding columns (masked here). `start` is traced when pad is 0 inside the
      chunk loop, a Python int otherwise.
    b: B queries; n: N rows.
    k, chunk, block, id_offset, num_valid, row_valid, unroll, selection: as `scan_topk`.

  Returns:
    TopK [B, k] with ids `id_offset + row`.
  """
  chunk = default_chunk(k, b) if chunk is None else chunk
  g = default_block(k, chunk) if block is None else block
  selection = default_selection(k) if selection is None else selection
  c = -(-chunk // g) * g
  nb = c // g
  nfull = n // c

  def valid_of(start, size):
    if num_valid is None and row_valid is None:
      return None
    ok = jnp.ones((size,), bool)
    if num_valid is not None:
      ok = ok & (start + jnp.arange(size) < num_valid)
    if row_valid is not None:
      ok = ok & lax.dynamic_slice_in_dim(row_valid, start, size)
    return ok

  state = _init_state(b, k, g)
  if nfull:
    def body(i, st):
      start = i * c
      return _step(st, scores(start, c, 0), i * nb, valid_of(start, c), selection)
    if unroll is None:
      unroll = jax.default_backend() != "cpu" and nfull <= MAX_UNROLL
    state = lax.fori_loop(0, nfull, body, state, unroll=bool(unroll))
  # The tail: its whole blocks unmasked (masking all its scores would cost more than their
  # matmul at small widths), then one block padded and masked.
  start = nfull * c
  whole = (n - start) // g * g
  if whole:
    state = _step(state, scores(start, whole, 0), start // g, valid_of(start, whole),
                  selection)
  rest = n - start - whole
  if rest:
    start += whole
    ok = jnp.arange(g) < rest
    extra = valid_of(start, rest)
    if extra is not None:
      ok = ok & jnp.pad(extra, (0, g - rest))
    state = _step(state, scores(start, rest, g - rest), start // g, ok, selection)
  return _finish(state, k, n, id_offset, selection)


def block_top_k(scores: jax.Array, k: int, block: int) -> TopK:
  """`lax.top_k(scores, k)` through the scan's block selection, in one step (traceable).

  Two smaller top-k's, over the N / block block maxima and then over the k * block scores of the
  k best blocks, replace one over all N scores. That pays where a large-k `lax.top_k` sorts the
  whole row (XLA on GPUs), not on XLA:CPU (`mol_topk.avg_method`).

  Args:
    scores: [B, N] float32, finite.
    k: results per row (k <= N).
    block: scores per block (1: a plain running `lax.top_k`).

  Returns:
    TopK [B, k]: the same scores and ids as `lax.top_k` (ties to the lower id).
  """
  b, n = scores.shape

  def rows(start, size, pad):
    s = lax.dynamic_slice_in_dim(scores, start, size, axis=1)
    return jnp.pad(s, ((0, 0), (0, pad))) if pad else s

  return select_topk(rows, b, n, k, chunk=n, block=block)


def _finish(state: _State, k: int, n: int, id_offset, selection: str = "top_k") -> TopK:
  """The k best docs of the k best blocks: sorts blocks by id, then one top-k of k * g."""
  b, _, g = state.scores.shape
  order = jnp.argsort(state.blocks, axis=1)
  blocks = jnp.take_along_axis(state.blocks, order, axis=1)
  scores = jnp.take_along_axis(state.scores, order[:, :, None], axis=1).reshape(b, k * g)
  rows = (blocks[:, :, None] * g + jnp.arange(g, dtype=jnp.int32)).reshape(b, k * g)
  top, pos = _select(scores, k, selection)
  rows = jnp.take_along_axis(rows, pos, axis=1)
  real = (jnp.take_along_axis(jnp.repeat(blocks, g, axis=1), pos, axis=1) != NO_DOC) & (rows < n)
  real = real & (top > -jnp.inf)
  return TopK(top, jnp.where(real, rows + id_offset, NO_DOC).astype(jnp.int32))


@functools.partial(jax.jit, static_argnames=("k", "chunk", "block", "unroll", "selection"))
def _topk_jit(qt, dt, row_valid, k, chunk, block, id_offset, unroll=None, selection=None):
  """`scan_topk` under jit; `row_valid` None (an empty pytree) compiles the unmasked scan."""
  return scan_topk(qt, dt, k, chunk, block, id_offset, row_valid=row_valid, unroll=unroll,
                   selection=selection)


_pallas_jit = jax.jit(fused_topk, static_argnames=("k", "tiles", "interpret"))
_blockmax_jit = jax.jit(blockmax_topk, static_argnames=("k", "tiles", "interpret", "selection"))


def topk(query_table, doc_table, k: int, *, chunk: int | None = None, block: int | None = None,
         query_chunk: int = DEFAULT_QUERY_CHUNK, id_offset: int = 0,
         row_valid=None, unroll: bool | None = None, selection: str | None = None,
         strategy: str | None = None, tiles: pallas_topk.Tiles | None = None) -> TopK:
  """Exact top-k by a chunked scan: qt [B, w], dt [N, w] -> TopK [B, k].

  Memory: one [min(B, query_chunk), chunk] score block at a time (plus the tables).

  Args:
    query_table: [B, w] (`module.apply(..., method=module.query_table)`).
    doc_table: [N, w], float32 or bfloat16 (a numpy array is copied to the device once).
    k: results per query, 1 <= k <= N.
    chunk: doc rows per scan step (None: `default_chunk(k, B)`, per device).
    block: docs per pruning block (None: `default_block`).
    unroll: unroll the chunk loop (None: per device, `scan_topk`).
    selection: "top_k" or "argmax" (None: `default_selection`, per device; the same result).
    query_chunk: queries per scan (queries are tiled; the last tile is padded, not recompiled).
    id_offset: added to every returned id.
    row_valid: None or [N] bool; False rows are never returned (they must leave >= k rows).
    strategy: "xla" (the chunked scan), "pallas" (the fused kernel, `fused_topk`) or
      "pallas_blockmax" (group maxima by a kernel, `blockmax_topk`); chunk, block, unroll and
      row_valid apply to "xla" only (None: `default_strategy`).
    tiles: the Pallas kernel's `pallas_topk.Tiles` (None: `pallas_topk.default_tiles`).

  Returns:
    TopK(scores [B, k] float32 descending, ids [B, k] int32), ties by lower id first.
  """
  check_tables(query_table, doc_table, k)
  if row_valid is not None:
    row_valid = jnp.asarray(row_valid, bool)
    if row_valid.shape != (np.shape(doc_table)[0],):
      raise input_error(f"must have shape ({np.shape(doc_table)[0]},), got {row_valid.shape}",
                        file="row_valid")
  if selection is not None and selection not in SELECTIONS:
    raise input_error(f"must be one of {SELECTIONS}, got {selection!r}", file="retrieval",
                      field="selection")
  if (chunk is not None and chunk < 1) or query_chunk < 1 or (block is not None and block < 1):
    raise input_error("chunk, query_chunk and block must be >= 1", file="retrieval",
                      field="chunk")
  strategy = default_strategy(k) if strategy is None else strategy
  if strategy not in STRATEGIES or (strategy != "xla" and row_valid is not None):
    raise input_error(f"must be one of {STRATEGIES} (pallas*: without row_valid), got "
                      f"{strategy!r}", file="retrieval", field="strategy")
  qt = jnp.asarray(query_table)
  dt = jnp.asarray(doc_table)
  parts = []
  for start in range(0, qt.shape[0], query_chunk):
    tile = qt[start:start + query_chunk]
    size = tile.shape[0]
    if qt.shape[0] > query_chunk and size < query_chunk:
      tile = jnp.pad(tile, ((0, query_chunk - size), (0, 0)))
    if strategy == "pallas":
      res = _pallas_jit(tile, dt, k, tiles, jnp.int32(id_offset),
                        pallas_topk.interpret_default())
    elif strategy == "pallas_blockmax":
      res = _blockmax_jit(tile, dt, k, tiles, jnp.int32(id_offset),
                          pallas_topk.interpret_default(), selection)
    else:
      res = _topk_jit(tile, dt, row_valid, k, chunk, block, jnp.int32(id_offset), unroll,
                      selection)
    parts.append(TopK(res.scores[:size], res.ids[:size]))
  if len(parts) == 1:
    return parts[0]
  return TopK(jnp.concatenate([p.scores for p in parts]), jnp.concatenate([p.ids for p in parts]))


def count_at_least(query_table, doc_table, cutoff, *, chunk: int = DEFAULT_CHUNK,
                   query_chunk: int = DEFAULT_QUERY_CHUNK) -> jax.Array:
  """Docs scoring at least each query's cutoff: qt [B, w], dt [N, w], cutoff [B] -> [B] int32.

  A chunked scan like `topk` (no [B, N] matrix), with the same score arithmetic.
  """
  check_tables(query_table, doc_table, 1)
  qt = jnp.asarray(query_table)
  dt = jnp.asarray(doc_table)
  cutoff = jnp.asarray(cutoff, jnp.float32)
  parts = [_count_jit(qt[i:i + query_chunk], dt, cutoff[i:i + query_chunk], chunk)
           for i in range(0, qt.shape[0], query_chunk)]
  return parts[0] if len(parts) == 1 else jnp.concatenate(parts)


@functools.partial(jax.jit, static_argnames=("chunk",))
def _count_jit(qt, dt, cutoff, chunk):
  n = dt.shape[0]
  nfull = n // chunk
  count = lambda rows: jnp.sum(_dot(qt, rows) >= cutoff[:, None], axis=1, dtype=jnp.int32)
  total = jnp.zeros((qt.shape[0],), jnp.int32)
  if nfull:
    total = lax.fori_loop(
        0, nfull, lambda i, t: t + count(lax.dynamic_slice_in_dim(dt, i * chunk, chunk)), total)
  if n > nfull * chunk:
    total = total + count(dt[nfull * chunk:])
  return total


def _file_mapping(shard) -> tuple[str, int] | None:
  """(file, byte offset of the first element) of a C-contiguous `np.memmap`, else None."""
  if not (isinstance(shard, np.memmap) and shard.filename and shard.flags.c_contiguous
          and isinstance(getattr(shard, "_mmap", None), mmap.mmap)):
    return None
  try:
    base = np.frombuffer(shard._mmap, np.uint8).ctypes.data  # pylint: disable=protected-access
  except (TypeError, ValueError):
    return None
  start = shard.offset - shard.offset % mmap.ALLOCATIONGRANULARITY  # where np.memmap mapped
  return shard.filename, start + shard.ctypes.data - base


def _device_rows(shard) -> tuple[jax.Array, np.memmap | None]:
  """One shard as a jax array: [R, w] -> ([R, w], its CPU mapping or None).

  On CPU, a memory-mapped shard is mapped again copy-on-write (never written) and handed to XLA
  without a copy (`jax.device_put` aliases a writeable host buffer on CPU; a read-only one is
  copied first, which costs a second pass over the bytes): the scan reads the pages in place.
  Elsewhere (or for other arrays) it is `jnp.asarray`.
  """
  where = (_file_mapping(shard) if jax.default_backend() == "cpu" and np.size(shard)
           else None)
  if where is None:
    return jnp.asarray(shard), None
  rows = np.memmap(where[0], dtype=shard.dtype, mode="c", offset=where[1], shape=shard.shape)
  return jax.device_put(rows), rows


def _read_ahead(rows: np.memmap | None) -> None:
  """Asks the kernel to start reading a mapped shard (MADV_WILLNEED), where supported."""
  if rows is not None and hasattr(mmap, "MADV_WILLNEED"):
    try:
      rows._mmap.madvise(mmap.MADV_WILLNEED)  # pylint: disable=protected-access
    except (AttributeError, OSError, ValueError):
      pass


def topk_stream(query_table, shards: Iterable, k: int, *, num_docs: int | None = None,
                **kwargs) -> TopK:
  """Exact top-k over a doc table given as consecutive row shards (e.g. memory-mapped `.npy`).

  At most two shards are on the device at a time (the next one is placed while the device works
  on the current one); ids are global row numbers (shard i starts after the rows of shards
  0..i-1).
  On CPU, memory-mapped shards are scanned in place, without a copy (`_device_rows`), and the
  kernel is asked to read the next shard ahead while the current one is scanned: the bytes are
  read once, overlapped with the scan.

  Args:
    query_table: [B, w].
    shards: iterable of [N_i, w] arrays (numpy, memmap or jax).
    k: results per query; must be <= the total number of rows.
    num_docs: total rows, if known, to check k before reading anything.
    **kwargs: `chunk`, `block`, `query_chunk` for `topk`.

  Returns:
    TopK [B, k], the same as `topk` on the concatenated shards.
  """
  if num_docs is not None:
    check_tables(query_table, np.zeros((0, np.shape(query_table)[-1])), k, num_docs=num_docs)
  offset, found = 0, []
  shards = iter(shards)
  nxt = next(shards, None)
  placed = None if nxt is None else _device_rows(nxt)
  if placed is not None:
    _read_ahead(placed[1])
  i = 0
  while nxt is not None:
    shard, (table, _) = nxt, placed
    nxt = next(shards, None)
    if nxt is not None:  # map the next shard and start its read before this one's scan
      placed = _device_rows(nxt)
      _read_ahead(placed[1])
    rows = np.shape(shard)[0]
    if rows:
      check_tables(query_table, shard, min(k, rows), where=f"shard {i}")
      found.append(topk(query_table, table, min(k, rows), id_offset=offset, **kwargs))
      offset += rows
    i += 1
  if offset < k:
    raise input_error(f"k must be an integer in [1, {offset}] (the number of docs), got {k!r}",
                      file="retrieval", field="k")
  if len(found) == 1:
    return found[0]
  return _merge_jit(jnp.concatenate([f.scores for f in found], axis=1),
                    jnp.concatenate([f.ids for f in found], axis=1), k)


_merge_jit = jax.jit(merge, static_argnames=("k",))


def max_rows_per_doc(doc_ids_of_rows) -> int:
  """Largest number of rows sharing a doc id: doc_ids_of_rows [R] (nondecreasing) -> int."""
  ids = np.asarray(doc_ids_of_rows)
  if ids.size == 0:
    return 0
  _, counts = np.unique(ids, return_counts=True)
  return int(counts.max())


def multi_vector_topk(query_table, row_table, doc_ids_of_rows, k: int, *, row_valid=None,
                      **kwargs) -> TopK:
  """Exact top-k docs when a doc has several rows and its score is the max over them.

  The ME-BERT form: `s(q, doc) = max_{rows r of doc} qt . row_r`. Rows are grouped by doc:
  `doc_ids_of_rows` is nondecreasing (doc i's rows contiguous, docs in id order), so the row
  ranking (score desc, row asc) lists each doc's best row before any other row of lower rank.
  With at most m rows per doc, the k best docs' best rows are among the (k - 1) * m + 1 best rows;
  the first k distinct doc ids in the exact row top-((k - 1) m + 1) are the answer, ties by lower
  doc id first.

  Args:
    query_table: [B, w].
    row_table: [R, w] doc rows (e.g. m per doc from a multi-vector scorer's doc_table).
    doc_ids_of_rows: [R] int, nondecreasing, the doc id of each row.
    k: docs per query; <= the number of distinct doc ids (with a valid row).
    row_valid: None or [R] bool; False rows never count (padding tokens).
    **kwargs: `chunk`, `block`, `query_chunk` for `topk`.

  Returns:
    TopK [B, k] with doc ids (values of doc_ids_of_rows) and their max-row scores.
  """
  doc_ids = np.asarray(doc_ids_of_rows)
  if doc_ids.ndim != 1 or doc_ids.shape[0] != np.shape(row_table)[0]:
    raise input_error(f"must be [R] = [{np.shape(row_table)[0]}] ints, got shape {doc_ids.shape}",
                      file="doc_ids_of_rows")
  if not np.issubdtype(doc_ids.dtype, np.integer):
    raise input_error(f"must be integers, got {doc_ids.dtype}", file="doc_ids_of_rows")
  if doc_ids.size and (np.any(np.diff(doc_ids) < 0) or doc_ids[0] < 0
                       or doc_ids[-1] >= NO_DOC):
    bad = int(np.argmax(np.diff(doc_ids) < 0)) + 1 if np.any(np.diff(doc_ids) < 0) else 0
    raise input_error("must be nondecreasing ids in [0, 2^31 - 1) (rows grouped by doc)",
                      file="doc_ids_of_rows", record=f"row {bad}")
  kept = doc_ids if row_valid is None else doc_ids[np.asarray(row_valid, bool)]
  num_docs = int(np.unique(kept).size)
  check_tables(query_table, row_table, k, num_docs=num_docs, where="row_table")
  m = max_rows_per_doc(kept)
  rows = topk(query_table, row_table, min((k - 1) * m + 1, kept.size), row_valid=row_valid,
              **kwargs)
  return _first_distinct(rows.scores, jnp.asarray(doc_ids, jnp.int32)[rows.ids], k)


@functools.partial(jax.jit, static_argnames=("k",))
def _first_distinct(scores, docs, k):
  """The first k distinct docs of ranked row lists: scores, docs [B, K] -> TopK [B, k]."""
  kk = docs.shape[1]
  earlier = jnp.tril(jnp.ones((kk, kk), bool), -1)  # earlier[j, i]: i < j
  seen = jnp.any((docs[:, :, None] == docs[:, None, :]) & earlier[None], axis=2)
  key = jnp.where(seen, -jnp.inf, -jnp.arange(kk, dtype=jnp.float32)[None])
  _, pos = lax.top_k(key, k)  # the k lowest positions that are a doc's first row
  return TopK(jnp.take_along_axis(scores, pos, axis=1), jnp.take_along_axis(docs, pos, axis=1))
