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
each group of G docs, then the block logic above in XLA (the k best groups, their docs rescored);
"tf32x3" / "tf32x3_pallas", `tf32x3_topk`: the group maxima from 3xTF32 tensor-core arithmetic
(XLA's `DotAlgorithmPreset.TF32_TF32_F32_X3`, or the Pallas kernel's own split), the m best
groups rescored in float32 and a certificate per query (`tf32x3_relative_bound`); the queries it
does not certify are redone by the "xla" scan, so the result is the same exact float32 top-k;
"tf32", `tf32x3_topk(passes=1)`: the same with the group maxima from ONE TF32 pass (XLA's
`DotAlgorithmPreset.TF32_TF32_F32`, a third of the tensor-core work) and its looser bound
(`tf32x3_relative_bound(w, passes=1)`, 3.7 times the three passes' at w = 384). `TF32_PASSES`
maps each TF32 strategy to its passes.
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
# `tf32x3_topk`'s strategies and their TF32 passes: one (XLA), three (3xTF32: XLA / Pallas)
TF32_PASSES = {"tf32": 1, "tf32x3": 3, "tf32x3_pallas": 3}
# the XLA scan, a Pallas kernel, or TF32 group maxima + a certificate (`strategy`)
STRATEGIES = ("xla", "pallas", "pallas_blockmax") + tuple(TF32_PASSES)
UNIT_ROUNDOFF = 2.0 ** -24  # float32, round to nearest
# per product, relative, by TF32 passes (`tf32x3_relative_bound`)
TF32_SPLIT_ERROR = {1: 2 * 2.0 ** -10 + 2.0 ** -20, 3: 3 * 2.0 ** -20 + 2.0 ** -40}
TF32X3_SAFETY = 8.0         # on the tensor cores' accumulation error (`tf32x3_relative_bound`)
TF32X3_GROUPS_PER_K = 2     # `tf32x3_topk` rescores the 2k best groups by default
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
  """Which scan `topk` runs, per device: one of STRATEGIES, each the same exact float32 result.

  "xla" on every device until another is measured faster on one: the Pallas kernels are
  compiled only for GPUs (interpret mode elsewhere, for tests only) and the TF32 strategies
  ("tf32", "tf32x3", "tf32x3_pallas") pay only on tensor cores (elsewhere their TF32 arithmetic
  is emulated in float32). Once `benchmarks/topk.py --strategies xla,tf32,tf32x3,tf32x3_pallas`
  shows one faster on a GPU at both issue-42 cases with `same_ids_as_fp32`, the change is one
  line here: `return "tf32x3" if (platform or jax.default_backend()) == "gpu" else "xla"`.

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
  _, blocks = _select(maxima, k, selection)  # ties: the lower group id
  return rescore_groups(qt, dt, blocks, g, k, id_offset, selection)


def rescore_groups(qt, dt, blocks, g: int, k: int, id_offset, selection: str) -> TopK:
  """The k best docs of the chosen groups, rescored exactly: qt [B, w], dt [N, w], blocks
  [B, m] group ids of G = g docs (m >= k; ids past N's groups score -inf) ->
  TopK [B, k] by (score desc, id asc), slots past N -inf / NO_DOC.

  Float32 products and sums (elementwise, not a dot: no backend runs them at TF32 or bf16),
  the gather fused into the reduction: m G w reads per query, no [B, m G, w] copy.
  """
  n = dt.shape[0]
  rows = blocks[:, :, None] * g + jnp.arange(g, dtype=jnp.int32)  # [B, m, G]
  docs = dt[jnp.minimum(rows, n - 1)].astype(jnp.float32)  # [B, m, G, w], fused below
  scores = jnp.sum(docs * qt.astype(dt.dtype).astype(jnp.float32)[:, None, None, :], axis=-1)
  scores = jnp.where(rows < n, scores, -jnp.inf)
  blocks = blocks.astype(jnp.int32)
  return _finish(_State(jnp.zeros(blocks.shape, jnp.float32), scores, blocks), k, n, id_offset,
                 selection)


def gamma(m: int) -> float:
  """gamma_m = m u / (1 - m u), u = 2^-24: a float32 sum of m terms in any order, rounded to
  nearest, errs by at most gamma_m times the sum of their absolute values (Higham, Accuracy and
  Stability of Numerical Algorithms, section 3.1)."""
  return m * UNIT_ROUNDOFF / (1.0 - m * UNIT_ROUNDOFF)


def check_passes(passes, pallas: bool = False) -> None:
  """Raises `InputError` unless `passes` is a number of TF32 passes with a bound
  (`TF32_SPLIT_ERROR`: 1 or 3), and 3 where `pallas` (the kernel's split is 3xTF32 only)."""
  if isinstance(passes, bool) or passes not in TF32_SPLIT_ERROR or (pallas and passes != 3):
    raise input_error(f"must be one of {tuple(TF32_SPLIT_ERROR)} (the Pallas kernel: 3), got "
                      f"{passes!r}", file="retrieval", field="passes")


def tf32x3_relative_bound(width: int, safety: float = TF32X3_SAFETY, passes: int = 3) -> float:
  """c with |s_TF32 - s_f32| <= c |q| |d| for tables of width w: the score of `passes` TF32
  passes (3: 3xTF32, either implementation of `tf32x3_topk`; 1: one TF32 pass, strategy
  "tf32") against the float32 score in any summation order. Other passes: `InputError`.

  What is computed, three passes: each q_i = qh + ql + rq with qh, ql TF32
  (`pallas_topk.split_tf32` truncates: |q_i - qh| < 2^-10 |q_i|, |rq| < 2^-10 |q_i - qh| <
  2^-20 |q_i|; XLA's split rounds, within the same bounds), the same for d_i, and the score sums
  qh dh + qh dl + ql dh, dropping ql dl. Per product the error is ql dl + (qh + ql) rd + rq (dh
  + dl) + rq rd, so below e_3 = (3 2^-20 + 2^-40) |q_i d_i| (`TF32_SPLIT_ERROR[3]`).
  One pass: each q_i = qh + rq with qh its TF32 part (`split_tf32`'s hi: truncation, |rq| <
  2^-10 |q_i|, |qh| <= |q_i|; a rounding conversion, XLA's or the tensor cores', has |rq| <=
  2^-11 |q_i| and |qh| <= (1 + 2^-11) |q_i|, within the same bound), the same for d_i, and the
  score sums qh dh. Per product the error is qh rd + rq dh + rq rd, so below e_1 = (2 2^-10 +
  2^-20) |q_i d_i| (`TF32_SPLIT_ERROR[1]`).
  The P = `passes` products of TF32 values (11 significant bits each) are exact in float32, so
  the score is a sum of P w exact terms with sum |terms| <= (1 + 2^-9) sum |q_i d_i|.
  Accumulation: IEEE float32, rounded to nearest, in any order, errs by gamma_Pw times that.
  Hopper's tensor cores do not round to nearest, and NVIDIA does not document their adder:
  measurements of earlier ones (Fasi, Higham, Mikaitis, Pranesh, "Numerical behavior of NVIDIA
  tensor cores", PeerJ Computer Science 2021) find a block of p = 4 to 8 products and the
  accumulator aligned to the largest exponent and truncated, no normalisation between them:
  per block up to (p + 2) units of 2^-23 times the largest addend, i.e. at most
  2 (1 + 2 / p) <= 3 times gamma_Pw over the whole sum. `safety` (8) multiplies gamma_Pw: the
  model's 3 and a margin of 2.6 for what is undocumented (fewer guard bits, another block size).
  The float32 reference (the rescoring, the "xla" scan, the brute force: any order) errs by at
  most gamma_w sum |q_i d_i|. With sum |q_i d_i| <= |q| |d| (Cauchy-Schwarz):

    c = 1.1 (e_P + safety (1 + 2^-9) gamma_Pw + gamma_w),

  the 1.1 covering the float32 rounding of the bound itself (|q|, max|d| and the certificate's
  sum, each within a few units of 2^-24 of c, which is > 2^-18) and flushed subnormals
  (absolute errors below 2^-126 a product). w = 384: three passes c = 6.3e-4 (the accumulation
  term 8 gamma_1152 = 5.5e-4 dominates), about 0.24 for two standard normal vectors (|q| |d| ~
  384); one pass c = 2.4e-3 (e_1 = 2.0e-3 dominates, 8 gamma_384 = 1.8e-4), 3.7 times that,
  about 0.91 for two standard normal vectors. The float64 twin in the tests checks both on
  inputs of a wide dynamic range, on the tensor cores where a GPU is lent.
  """
  check_passes(passes)
  return 1.1 * (TF32_SPLIT_ERROR[passes] + safety * (1 + 2.0 ** -9) * gamma(passes * width)
                + gamma(width))


def tf32x3_group_maxima(qt: jax.Array, dt: jax.Array, group: int, emulate: bool,
                        passes: int = 3) -> jax.Array:
  """Each query's maximum TF32 score (`passes` 3: 3xTF32; 1: one TF32 pass) over each group of
  `group` docs, in XLA (traceable): qt [B, w], dt [N, w] float32 -> [B, ceil(N / G)] float32
  (the last group's missing docs -inf).

  On a GPU (`emulate` False) one `lax.dot_general` at `DotAlgorithmPreset.TF32_TF32_F32_X3`
  (XLA splits both operands and runs three TF32 passes on tensor cores) or, one pass,
  `TF32_TF32_F32` (XLA:CPU rejects both presets); with `emulate` the same arithmetic at float32
  precision: `pallas_topk.tf32x3_dot` (the same split and products, exact in float32, float32
  sums), or one pass the dot of both operands' TF32 parts (`pallas_topk.split_tf32`'s hi,
  truncated). The scores are taken in doc chunks whose [B, chunk] block stays within
  ACCEL_SCORE_BYTES, each reduced to its groups' maxima.
  """
  check_passes(passes)
  b, n = qt.shape[0], dt.shape[0]
  rows = max(group, ACCEL_SCORE_BYTES // (4 * max(1, b)) // group * group)
  parts = []
  for start in range(0, n, rows):
    part = dt[start:start + rows]
    if emulate and passes == 3:
      s = pallas_topk.tf32x3_dot(qt, part, precision=PRECISION)
    elif emulate:
      s = _dot(pallas_topk.split_tf32(qt)[0], pallas_topk.split_tf32(part)[0])
    else:
      preset = (lax.DotAlgorithmPreset.TF32_TF32_F32_X3 if passes == 3
                else lax.DotAlgorithmPreset.TF32_TF32_F32)
      s = lax.dot_general(qt, part, (((1,), (1,)), ((), ())), precision=preset,
                          preferred_element_type=jnp.float32)
    pad = -part.shape[0] % group
    if pad:
      s = jnp.pad(s, ((0, 0), (0, pad)), constant_values=-jnp.inf)
    parts.append(jnp.max(s.reshape(b, -1, group), axis=2))
  return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=1)


def tf32x3_select(maxima: jax.Array, groups: int, coarse: int = 1, selection: str = "top_k"
                  ) -> tuple[jax.Array, jax.Array]:
  """The `groups` best groups by approximate maximum and the best maximum of the rest (traceable):
  maxima [B, NG] (-inf: no docs) -> (group ids [B, m] int32, next [B] float32), m = `groups`.

  `coarse` 1: one selection of the m + 1 best of NG (ties: the lower group id), `next` the
  (m + 1)-th. `coarse` c > 1: two smaller ones. The maxima of c consecutive groups (a coarse
  group) are reduced to [B, NG / c]; its m + 1 best are picked; then the m + 1 best of the m
  kept coarse groups' m c group maxima; `next` is the larger of the (m + 1)-th coarse and the
  (m + 1)-th group maximum among the kept. Every group left out has a maximum <= `next`: it lies
  in a coarse group left out (its maximum <= the (m + 1)-th coarse) or in a kept one and not
  picked (<= the (m + 1)-th of those). The m groups are the m best of all NG but for ties (the
  m best groups lie in at most m coarse groups, each of which has at most m - 1 coarse groups
  above it), so the certificate of `tf32x3_topk` is the one-stage one, from selections over
  NG / c + m c values instead of NG.

  Args:
    maxima: [B, NG] float32 group maxima, no NaN.
    groups: m >= 1 groups kept.
    coarse: c >= 1 groups per coarse group of the first selection.
    selection: "top_k" or "argmax" (`_select`).
  """
  b = maxima.shape[0]
  if coarse > 1:  # at least m + 1 coarse groups, the padding's maxima -inf
    pad = max(-(-maxima.shape[1] // coarse), groups + 1) * coarse - maxima.shape[1]
    fine = jnp.pad(maxima, ((0, 0), (0, pad)), constant_values=-jnp.inf)
    fine = fine.reshape(b, -1, coarse)  # [B, NC, c]
    cids, cnext = tf32x3_select(fine.max(axis=2), groups, 1, selection)
    kept = jnp.take_along_axis(fine, cids[:, :, None], axis=1).reshape(b, -1)  # [B, m c]
    ids = (cids[:, :, None] * coarse + jnp.arange(coarse, dtype=jnp.int32)).reshape(b, -1)
    sub, nxt = tf32x3_select(kept, groups, 1, selection)  # positions in `kept`
    return jnp.take_along_axis(ids, sub, axis=1), jnp.maximum(cnext, nxt)
  if maxima.shape[1] < groups + 1:  # fewer groups than needed: empty groups past N
    maxima = jnp.pad(maxima, ((0, 0), (0, groups + 1 - maxima.shape[1])),
                     constant_values=-jnp.inf)
  top, ids = _select(maxima, groups + 1, selection)  # ties: the lower group id
  return ids[:, :groups].astype(jnp.int32), top[:, groups]


@functools.partial(jax.jit, static_argnames=("k", "tiles", "groups", "pallas", "interpret",
                                             "selection", "doc_selection", "coarse", "passes"))
def _tf32x3_certified(qt, dt, k, tiles, scale, groups, pallas, interpret, selection, id_offset,
                      slack=None, perturb=None, doc_selection=None, coarse=1, passes=3
                      ) -> tuple[TopK, jax.Array]:
  """The traceable core of `tf32x3_topk`: (TopK [B, k], certified [B] bool).

  Approximate group maxima (`passes` TF32 passes, 3 or 1; `perturb` [B, ceil(N / G)] is added
  to them: the tests' hook for an error beyond the bound), the `groups` best by (max desc,
  group id asc) and the best maximum of the rest (`tf32x3_select`, by `selection` through
  coarse groups of `coarse`), the groups rescored (`rescore_groups`, the docs picked by
  `doc_selection`, None: `selection`); a query is certified when the rest's approximate
  maximum plus its slack [B] is strictly below its k-th exact score, or when no group is left.
  Strict: an equal sum could hide a doc of that group tying the k-th score with a lower id. The
  slack is `slack` [B], or None: `scale` (c max|d|) times each query's norm.
  """
  g = tiles.group
  if slack is None:
    slack = scale * jnp.linalg.norm(qt, axis=1)
  if pallas:
    maxima = pallas_topk.group_maxima(qt, dt, tiles._replace(tf32x3=True), interpret)
  else:
    maxima = tf32x3_group_maxima(qt, dt, g, interpret, passes)
  if perturb is not None:
    maxima = maxima.at[:, :perturb.shape[1]].add(perturb)
  blocks, nxt = tf32x3_select(maxima, groups, coarse, selection)
  res = rescore_groups(qt, dt, blocks, g, k, id_offset,
                        selection if doc_selection is None else doc_selection)
  certified = (nxt == -jnp.inf) | (nxt + slack < res.scores[:, k - 1])
  return res, certified


def pad_rows(rows: np.ndarray, limit: int) -> np.ndarray:
  """rows [n] (n >= 1) padded by repeating rows[0] to a power of two >= 8, at most `limit`: a
  computation over a subset of queries compiles once per size class, not once per count."""
  size = min(limit, max(8, 1 << (rows.size - 1).bit_length()))
  return np.concatenate([rows, np.full(size - rows.size, rows[0], rows.dtype)])


def max_doc_norm(doc_table) -> float:
  """The largest row norm of a doc table, dt [N, w] -> float (one read of the table: compute it
  once per table, as an index, and pass it to `tf32x3_topk`)."""
  return float(jnp.max(jnp.linalg.norm(jnp.asarray(doc_table, jnp.float32), axis=1)))


def tf32x3_topk(qt, dt, k: int, tiles: pallas_topk.Tiles | None = None, *, pallas: bool = False,
                groups: int | None = None, doc_norm: float | None = None, id_offset: int = 0,
                selection: str | None = None, coarse: int = 1, slack=None, perturb=None,
                passes: int = 3) -> tuple[TopK, int]:
  """Exact float32 top-k from TF32 group maxima and a certificate: qt [B, w], dt [N, w]
  float32 -> (TopK [B, k], the number of queries that fell back to the float32 scan).

  1. Each query's maximum over each group of G = `tiles.group` docs, approximated on tensor
     cores by `passes` TF32 passes, 3 (3xTF32; `pallas`: the Pallas kernel,
     `pallas_topk.group_maxima` with `tf32x3`; else XLA, `tf32x3_group_maxima`) or 1 (one
     TF32 pass, XLA only): |approx - float32| <= e = c |q| max|d| for every doc, c =
     `tf32x3_relative_bound(w, passes=passes)`.
  2. The m = `groups` best groups by approximate maximum (ties: the lower group id), picked
     directly or through coarse groups of `coarse` groups (`tf32x3_select`: two small
     selections instead of one over every group), are rescored in float32
     (`rescore_groups`): their k best docs by (score desc, id asc).
  3. Certificate: every doc outside them has a float32 score <= its group's approximate max + e
     <= M, the (m + 1)-th approximate group maximum, + e. When M + e < the k-th rescored score
     (strictly), no outside doc can enter the top-k or tie its k-th score with a lower id: the
     result is the float32 brute force's. The other queries are redone by the "xla" scan
     (`scan_topk`, in size classes of `pad_rows`).
  m defaults to 2k: the gap between the k-th and the 2k+1-th group maxima is much wider than
  e, where the gap after the k-th alone often is not. Measured (the CPU emulation, 64 standard
  normal queries x 200k docs x 384, k = 10, e about 0.29, G = 16, 64 or 128): m = 10 sent 23
  of the 64 queries to the scan, m = 15 and m = 20 none.

  Args:
    qt: [B, w]; dt: [N, w] (float32); k: results per query (k > N: -inf / NO_DOC slots).
    tiles: `pallas_topk.Tiles` (None: `pallas_topk.default_tiles(B, w)`; XLA uses its group).
    pallas: the Pallas kernel ("tf32x3_pallas") rather than XLA ("tf32x3", "tf32").
    groups: m >= k groups rescored (None: TF32X3_GROUPS_PER_K k).
    doc_norm: max|d| of the table (`max_doc_norm`; None: computed here, one more table read).
    id_offset: added to every real id.
    selection: how the best groups and docs are picked (None: `default_selection(k)` for both:
      argmax passes on a GPU with k = 10, also for the m + 1 = 21 groups, which measured
      faster than `lax.top_k` there: on one H200, 0.37 against 0.82 ms at 1,000 x 200k, G = 32;
      at 32 x 1M the fastest whole call, 1.44 ms, was G = 128 with argmax; run 9,
      docs/benchmarks/nvidia-h200.md).
    coarse: groups per coarse group of the groups' selection (1: one selection over all).
    slack: [B] or scalar e per query instead of c |q| max|d| (tests), perturb: [B, ceil(N / G)]
      added to the approximate maxima (tests: an error beyond the bound).
    passes: TF32 passes, 3 ("tf32x3", "tf32x3_pallas") or 1 ("tf32"; not with `pallas`);
      `TF32_PASSES` maps each strategy to its passes.
  """
  qt, dt = jnp.asarray(qt, jnp.float32), jnp.asarray(dt, jnp.float32)
  b = qt.shape[0]
  tiles = pallas_topk.default_tiles(*qt.shape) if tiles is None else tiles
  groups = TF32X3_GROUPS_PER_K * k if groups is None else groups
  if groups < k:
    raise input_error(f"must be >= k = {k}, got {groups}", file="retrieval", field="groups")
  check_passes(passes, pallas)
  if not isinstance(coarse, (int, np.integer)) or coarse < 1:
    raise input_error(f"must be an integer >= 1, got {coarse!r}", file="retrieval",
                      field="coarse")
  doc_selection = default_selection(k) if selection is None else selection
  selection = default_selection(k) if selection is None else selection
  scale = 0.0
  if slack is None:
    doc_norm = max_doc_norm(dt) if doc_norm is None else doc_norm
    scale = tf32x3_relative_bound(qt.shape[1], passes=passes) * doc_norm
  else:
    slack = jnp.broadcast_to(jnp.asarray(slack, jnp.float32), (b,))
  # scale and id_offset go in as Python numbers: no device op of their own per call
  res, ok = _tf32x3_certified(qt, dt, k, tiles, float(scale), groups, pallas,
                              pallas_topk.interpret_default(), selection, int(id_offset),
                              slack, None if perturb is None else jnp.asarray(perturb,
                                                                              jnp.float32),
                              doc_selection, int(coarse), int(passes))
  failed = np.flatnonzero(~np.asarray(ok))
  if failed.size:
    p = pad_rows(failed, b)
    redo = _topk_jit(qt[p], dt, None, k, None, None, jnp.int32(id_offset))
    res = TopK(res.scores.at[failed].set(redo.scores[:failed.size]),
               res.ids.at[failed].set(redo.ids[:failed.size]))
  return res, int(failed.size)


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
  """The k best docs of the m >= k kept blocks: sorts blocks by id, then one top-k of m * g."""
  b, _, g = state.scores.shape
  order = jnp.argsort(state.blocks, axis=1)
  blocks = jnp.take_along_axis(state.blocks, order, axis=1)
  scores = jnp.take_along_axis(state.scores, order[:, :, None], axis=1).reshape(b, -1)
  rows = (blocks[:, :, None] * g + jnp.arange(g, dtype=jnp.int32)).reshape(b, -1)
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
    strategy: "xla" (the chunked scan), "pallas" (the fused kernel, `fused_topk`),
      "pallas_blockmax" (group maxima by a kernel, `blockmax_topk`), "tf32x3" /
      "tf32x3_pallas" (3xTF32 group maxima + a certificate, `tf32x3_topk`) or "tf32" (one
      TF32 pass, the same way), each TF32 strategy computing the table's max|d| once per
      call; chunk, block, unroll and row_valid apply to "xla" only (None: `default_strategy`).
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
  norm = max_doc_norm(dt) if strategy in TF32_PASSES else None
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
    elif strategy in TF32_PASSES:
      res, _ = tf32x3_topk(tile, dt, k, tiles, pallas=strategy == "tf32x3_pallas",
                           doc_norm=norm, id_offset=id_offset, selection=selection,
                           passes=TF32_PASSES[strategy])
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
