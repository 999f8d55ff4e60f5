"""Pallas kernels for exact top-k: a fused scan-and-select over a doc table, and a top-N selection.

`block_candidates` (the fused scan-and-select, `exact.topk(strategy="pallas")`): a grid over
(query tiles, doc blocks); program (i, j) streams its doc block of td * steps rows once, `td`
rows at a time, against its query tile [tq, w] (reloaded per step from the caches, so it holds
no registers): the [tq, td] float32 scores of a step (float32 products and float32
accumulation: `lax.Precision.HIGHEST`, which the Triton lowering runs as
`input_precision="ieee"`, not TF32) are merged into a running top-k per query
held in registers ([tq, kp] values and ids, kp the power of two >= k): by default
(`insert=False`, `_merge_step`) by k passes of (max, lowest id among the entries equal to it,
mask that id out), a step whose every score is below each query's k-th best skipped (`skip`);
with `insert=True` (`_insert_step`) each step entry that beats its query's worst kept entry
replaces it, taken by (score desc, id asc), as long as one of the tile's queries has such an
entry (unordered; a step that changes nothing costs one test). On one H200 (32 x 1M x 384,
k = 10) the k passes ran in 10.3 ms and the insert loop in 26.4 ms, hence the default. Ties go to the lower doc id, as
everywhere in `retrieval.exact`. Only the [B, blocks, k] candidates reach memory; the caller
merges them (`exact.merge`, by (score desc, id asc)), so the result is the exact float32 top-k.

`group_maxima` (the `blockmax` kernel, `exact.topk(strategy="pallas_blockmax")`): the same grid
and scores, but no running top-k: per step it writes each query's maximum over each group of G
docs ([B, N / G] float32 reach memory); `exact.blockmax_topk` selects and rescores in XLA. With
`Tiles.tf32x3` its scores are the 3xTF32 approximation on tensor cores (`split_tf32`: each
operand split into two TF32 parts, three TF32 dots with float32 accumulation, the lo.lo product
dropped), whose error `exact.tf32x3_relative_bound` bounds; `exact.tf32x3_topk` certifies the
result with it (strategy "tf32x3_pallas"). A group of a whole step (G = td) is a plain row
maximum, without the [tq, td / G, G] reshape (whose layout change asks Triton for about 3x the
shared memory).

`select_top_n` (the MoL top-N selection, `mol_topk.avg_top_n(strategy="pallas")`): per row of
a [B, M] score matrix, the exact key of the n-th largest entry (`top_n_threshold`: a radix search
over the int32 ordering key of the floats, XLA's total order as `lax.top_k`'s, 4 bits per pass:
8 passes of a Pallas kernel that counts, over a grid of (row tiles, column spans), the entries at
or above 16 candidate keys) and the number of entries strictly above it; then the entries above
the key plus the lowest-index ones equal to it are kept and ordered by (value desc, index asc):
the same values and ids as `lax.top_k`.

Padding: the doc table and the query table are read with masked loads (rows past N or B, columns
past w read as 0); padded docs score -inf with id `no_doc` and are never returned before a real
doc. Block shapes of the Triton lowering are powers of two, so the width is read in chunks of
`wk` columns (any w). Offsets are int32: N w < 2^31 (a larger table is sharded). On a CPU the
kernels run in Pallas interpret mode (`interpret_default`), for tests only.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

PRECISION = lax.Precision.HIGHEST  # float32 products and sums ("ieee" in Triton), never TF32
TF32_PRECISION = lax.Precision.DEFAULT  # the 3xTF32 dots: TF32 inputs ("tf32" in Triton)
TF32_MASK = np.int32(-(1 << 13))  # 0xFFFFE000: keeps the sign, exponent, 10 mantissa bits


class Tiles(NamedTuple):
  """Tile sizes of `block_candidates` (powers of two except `steps`).

  Attributes:
    tq: queries per program (>= 16: the Triton dot's smallest M).
    td: doc rows per step (>= 16).
    steps: steps per program: a program's doc block is td * steps rows.
    wk: columns per width chunk.
    num_warps: Triton warps per program (None: Triton's default).
    num_stages: Triton pipelining stages (None: Triton's default).
    insert: merge a step by `_insert_step` (each entering entry replaces the worst kept one,
      as many times as entries enter) rather than by k passes (`_merge_step`).
    skip: with k passes, skip a step whose scores are all below each query's k-th best.
    group: docs per group of `group_maxima` (a power of two dividing td; unused by
      `block_candidates`).
    tf32x3: `group_maxima` scores by three TF32 dots of the split operands (`split_tf32`) on
      tensor cores instead of one IEEE float32 dot (unused by `block_candidates`).
  """
  tq: int = 32
  td: int = 64
  steps: int = 32
  wk: int = 128
  num_warps: int | None = 4
  num_stages: int | None = 2
  skip: bool = True
  group: int = 16
  insert: bool = False
  tf32x3: bool = False


def next_pow2(x: int) -> int:
  """The smallest power of two >= x (x >= 1)."""
  return 1 << max(0, int(x) - 1).bit_length()


def default_tiles(batch: int, width: int) -> Tiles:
  """Tiles for B queries of width w: tq the power of two >= B in [16, 64], wk <= 128."""
  return Tiles(tq=int(min(64, max(16, next_pow2(batch)))), wk=int(min(128, next_pow2(width))))


def interpret_default() -> bool:
  """Interpret mode (no GPU compiler) unless jax's default backend is a GPU."""
  return jax.default_backend() != "gpu"


def split_tf32(x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The 3xTF32 split of float32 x: (hi, lo), both exact TF32 values (11 significant bits).

  hi is x with its low 13 mantissa bits cleared (truncation toward zero: |x - hi| < 2^-10 |x|);
  x - hi is exact in float32 and lo is it truncated the same way (|x - hi - lo| < 2^-10
  |x - hi| < 2^-20 |x|). Products of two TF32 values (22 bits) are exact in float32, so a
  tensor core multiplies hi and lo without error whether it rounds or truncates its inputs.
  Works inside a Pallas kernel and in XLA. x [...] -> ([...], [...]) float32.
  """
  mask = lambda v: lax.bitcast_convert_type(
      lax.bitcast_convert_type(v, jnp.int32) & TF32_MASK, jnp.float32)
  hi = mask(x)
  return hi, mask(x - hi)


def tf32x3_dot(a: jax.Array, b: jax.Array, acc: jax.Array | None = None,
               precision=TF32_PRECISION) -> jax.Array:
  """acc + a [M, w] . b [N, w]^T -> [M, N] float32 by 3xTF32: hi.lo, lo.hi, then hi.hi of
  `split_tf32` (the small terms first), each a dot at `precision` (TF32 on a GPU; exact
  float32 products of the TF32 parts anywhere) added to the running float32 sum (in a kernel,
  Triton may fold each add into its dot's accumulator: the bound allows either). acc: [M, N]
  float32 or None (zeros)."""
  (ah, al), (bh, bl) = split_tf32(a), split_tf32(b)
  for x, y in ((ah, bl), (al, bh), (ah, bh)):
    part = lax.dot_general(x, y, (((1,), (1,)), ((), ())), precision=precision,
                           preferred_element_type=jnp.float32)
    acc = part if acc is None else acc + part
  return acc


def _merge_step(vals, ids, s, sid, k: int, no_doc: int):
  """k passes merging step scores s, ids sid [tq, td] into the running vals, ids [tq, kp].

  Each pass takes the largest remaining score and, among the entries equal to it, the lowest
  id; that entry then leaves both lists (score -inf, id no_doc), so once the real entries run
  out the passes fill -inf / no_doc. Slots >= k stay -inf / no_doc.
  """
  kp = vals.shape[1]
  kcol = jnp.arange(kp, dtype=jnp.int32)[None, :]
  new_v = jnp.full(vals.shape, -jnp.inf, jnp.float32)
  new_i = jnp.full(ids.shape, no_doc, jnp.int32)
  for p in range(k):
    m = jnp.maximum(jnp.max(vals, axis=1), jnp.max(s, axis=1))
    sel = jnp.minimum(jnp.min(jnp.where(vals == m[:, None], ids, no_doc), axis=1),
                      jnp.min(jnp.where(s == m[:, None], sid, no_doc), axis=1))
    new_v = jnp.where(kcol == p, m[:, None], new_v)
    new_i = jnp.where(kcol == p, sel[:, None], new_i)
    taken, taken_s = ids == sel[:, None], sid == sel[:, None]
    vals, ids = jnp.where(taken, -jnp.inf, vals), jnp.where(taken, no_doc, ids)
    s, sid = jnp.where(taken_s, -jnp.inf, s), jnp.where(taken_s, no_doc, sid)
  return new_v, new_i


def _insert_step(vals, ids, s, sid, k: int):
  """Inserts step scores s, ids sid [tq, td] into the running k best vals, ids [tq, kp]
  (unordered; slots >= k hold +inf, never replaced): while some query's best remaining step
  entry beats its worst kept entry, that entry replaces the worst one. Step ids exceed every
  kept id, so an entry beats the worst only with a larger score (ties keep the lower id); the
  step's entries are taken by (score desc, id asc) and the worst kept is (score asc, id desc).
  The loop runs max over the tile's queries of the entries that enter (0 when none does, at
  most td), two reductions over [tq, td] per entry, instead of k passes over everything."""
  kcol = jnp.arange(vals.shape[1], dtype=jnp.int32)[None, :]

  def worst(vals, ids):
    w = jnp.min(vals, axis=1)  # [tq]
    wid = jnp.max(jnp.where(vals == w[:, None], ids, -1), axis=1)
    slot = jnp.max(jnp.where((vals == w[:, None]) & (ids == wid[:, None]), kcol, -1), axis=1)
    return w, slot

  def best(s):
    m = jnp.max(s, axis=1)  # [tq]
    return m, jnp.min(jnp.where(s == m[:, None], sid, jnp.iinfo(jnp.int32).max), axis=1)

  def cond(state):
    _, _, _, w, _, m, _ = state
    return jnp.max(jnp.where(m > w, 1, 0)) > 0

  def body(state):
    vals, ids, s, w, slot, m, sel = state
    put = (m > w)[:, None] & (kcol == slot[:, None])
    vals, ids = jnp.where(put, m[:, None], vals), jnp.where(put, sel[:, None], ids)
    s = jnp.where(sid == sel[:, None], -jnp.inf, s)
    return (vals, ids, s, *worst(vals, ids), *best(s))

  state = lax.while_loop(cond, body, (vals, ids, s, *worst(vals, ids), *best(s)))
  return state[0], state[1]


def _step_scores(q_ref, d_ref, qi, start, *, b: int, n: int, w: int, tiles: Tiles):
  """The [tq, td] float32 scores of query tile qi against doc rows [start, start + td) (rows
  past N score -inf), and the rows' validity [td] bool and ids [td] int32. The query tile is
  reloaded per width chunk (cache hits), not held in registers."""
  tq, td, wk = tiles.tq, tiles.td, tiles.wk
  zero = qi * 0  # traced: a chunk past w is a masked load, not a static out-of-bound slice
  q_rows = qi * tq + jnp.arange(tq, dtype=jnp.int32)
  rows = start + jnp.arange(td, dtype=jnp.int32)
  ok = rows < n
  s = jnp.zeros((tq, td), jnp.float32)
  for c in range(-(-w // wk)):
    cols = c * wk + jnp.arange(wk, dtype=jnp.int32)
    qc = plgpu.load(q_ref.at[pl.ds(qi * tq, tq), pl.ds(zero + c * wk, wk)],
                    mask=(q_rows < b)[:, None] & (cols < w)[None, :], other=0.0)
    dc = plgpu.load(d_ref.at[pl.ds(start, td), pl.ds(zero + c * wk, wk)],
                    mask=ok[:, None] & (cols < w)[None, :], other=0.0)
    if tiles.tf32x3:  # three TF32 dots on tensor cores (float32 tables only)
      s = tf32x3_dot(qc, dc, s)
    else:
      s = s + lax.dot_general(qc.astype(dc.dtype), dc, (((1,), (1,)), ((), ())),
                              precision=PRECISION, preferred_element_type=jnp.float32)
  return jnp.where(ok[None, :], s, -jnp.inf), ok, rows


def _scan_select_kernel(q_ref, d_ref, v_ref, i_ref, *, b: int, n: int, w: int, k: int,
                        tiles: Tiles, no_doc: int):
  """Program (i, j): queries [i tq, (i + 1) tq) x docs [j td steps, (j + 1) td steps)."""
  tq, td = tiles.tq, tiles.td
  kp = v_ref.shape[-1]
  qi, bj = pl.program_id(0), pl.program_id(1)
  first = bj * (td * tiles.steps)

  def step(t, state):
    vals, ids = state
    s, ok, rows = _step_scores(q_ref, d_ref, qi, first + t * td, b=b, n=n, w=w, tiles=tiles)
    sid = jnp.broadcast_to(jnp.where(ok, rows, no_doc)[None, :], (tq, td))
    if tiles.insert:
      return _insert_step(vals, ids, s, sid, k)
    if not tiles.skip:
      return _merge_step(vals, ids, s, sid, k, no_doc)
    kcol = jnp.arange(kp, dtype=jnp.int32)[None, :]
    kth = jnp.max(jnp.where(kcol == k - 1, vals, -jnp.inf), axis=1)  # [tq]
    hit = jnp.max(jnp.max(jnp.where(s >= kth[:, None], 1, 0), axis=1), axis=0)
    return lax.cond(hit > 0, lambda: _merge_step(vals, ids, s, sid, k, no_doc),
                    lambda: (vals, ids))

  kcol = jnp.arange(kp, dtype=jnp.int32)[None, :]
  # empty slots: -inf / no_doc; with `insert`, the slots >= k +inf (never the worst)
  empty = jnp.where(kcol < k, -jnp.inf, jnp.inf if tiles.insert else -jnp.inf)
  init = (jnp.broadcast_to(empty, (tq, kp)).astype(jnp.float32),
          jnp.full((tq, kp), no_doc, jnp.int32))
  vals, ids = lax.fori_loop(0, tiles.steps, step, init)
  v_ref[...] = vals
  i_ref[...] = ids


def _group_max_kernel(q_ref, d_ref, o_ref, *, b: int, n: int, w: int, tiles: Tiles):
  """Program (i, j): queries [i tq, (i + 1) tq) x docs [j td steps, (j + 1) td steps); per
  step, each query's maximum over each group of `tiles.group` docs, stored at the groups'
  columns (group c holds docs [c G, (c + 1) G)). No running state: one dot (three with
  `tf32x3`) and one max per step; G = td is a row maximum (no reshape)."""
  tq, td, g = tiles.tq, tiles.td, tiles.group
  per = td // g
  qi, bj = pl.program_id(0), pl.program_id(1)

  def step(t, carry):
    s, _, _ = _step_scores(q_ref, d_ref, qi, (bj * tiles.steps + t) * td, b=b, n=n, w=w,
                           tiles=tiles)
    if per == 1:  # one group per step: a row maximum, no layout change
      gmax = jnp.max(s, axis=1, keepdims=True)  # [tq, 1]
    else:
      gmax = jnp.max(s.reshape(tq, per, g), axis=2)  # [tq, per]
    o_ref[pl.ds(qi * tq, tq), pl.ds((bj * tiles.steps + t) * per, per)] = gmax
    return carry

  lax.fori_loop(0, tiles.steps, step, 0)


def _check_offsets(b: int, n: int, w: int, tiles: Tiles) -> None:
  """ValueError unless the kernels' int32 offsets cannot overflow."""
  if (n + tiles.td * tiles.steps) * w >= 1 << 31 or b * w >= 1 << 31:
    raise ValueError(f"the Pallas scan indexes with int32 offsets: N w = {n} x {w} is too large "
                     "(shard the table, `sharded`, or use strategy 'xla')")


def _params(tiles: Tiles, interpret: bool):
  # Triton's parameters also pick the Triton backend (without them a GPU pallas_call lowers
  # through Mosaic GPU)
  return None if interpret else plgpu.CompilerParams(num_warps=tiles.num_warps,
                                                     num_stages=tiles.num_stages)


@functools.partial(jax.jit, static_argnames=("tiles", "interpret"))
def group_maxima(qt: jax.Array, dt: jax.Array, tiles: Tiles, interpret: bool = False
                 ) -> jax.Array:
  """Each query's maximum score over each group of G = `tiles.group` consecutive docs (the
  `blockmax` kernel: one pass over the table, float32 scores as `block_candidates`, or with
  `tiles.tf32x3` the 3xTF32 scores of `tf32x3_dot`).

  Args:
    qt: [B, w] float32; dt: [N, w] float32 or bfloat16 (float32 with tf32x3); tiles: `Tiles`
      (group divides td).
    interpret: Pallas interpret mode (CPU).

  Returns:
    [B, NG] float32, NG = blocks * td * steps / G >= ceil(N / G): column c is the maximum over
    docs [c G, (c + 1) G) (-inf where all of them are past N).
  """
  b, w = qt.shape
  n = dt.shape[0]
  if tiles.td % tiles.group:
    raise ValueError(f"the group ({tiles.group}) must divide td ({tiles.td})")
  if tiles.tf32x3 and (qt.dtype != jnp.float32 or dt.dtype != jnp.float32):
    raise ValueError(f"the 3xTF32 split needs float32 tables, got {qt.dtype}, {dt.dtype}")
  _check_offsets(b, n, w, tiles)
  nq = -(-b // tiles.tq)
  nb = -(-n // (tiles.td * tiles.steps))
  kernel = functools.partial(_group_max_kernel, b=b, n=n, w=w, tiles=tiles)
  out = pl.pallas_call(
      kernel, grid=(nq, nb), in_specs=[pl.no_block_spec, pl.no_block_spec],
      out_specs=pl.no_block_spec,
      out_shape=jax.ShapeDtypeStruct((nq * tiles.tq, nb * tiles.steps * tiles.td // tiles.group),
                                     jnp.float32),
      compiler_params=_params(tiles, interpret), interpret=interpret, name="group_max")(qt, dt)
  return out[:b]


@functools.partial(jax.jit, static_argnames=("k", "tiles", "no_doc", "interpret"))
def block_candidates(qt: jax.Array, dt: jax.Array, k: int, tiles: Tiles, no_doc: int,
                     interpret: bool = False) -> tuple[jax.Array, jax.Array]:
  """Each doc block's exact top-k per query (the fused scan-and-select kernel).

  Args:
    qt: [B, w] float32 query table.
    dt: [N, w] float32 (or bfloat16: products exact in float32, float32 sums) doc table.
    k: results per query and block (k may exceed a block's rows: -inf / no_doc fill).
    tiles: `Tiles` (static).
    no_doc: the id of an empty slot.
    interpret: run in Pallas interpret mode (CPU).

  Returns:
    (scores [B, blocks * k] float32, ids [B, blocks * k] int32), blocks = ceil(N / (td steps));
    each block's k best by (score desc, id asc) (in no order within the block with `insert`),
    for `exact.merge`.
  """
  b, w = qt.shape
  n = dt.shape[0]
  _check_offsets(b, n, w, tiles)
  kp = next_pow2(k)
  nq = -(-b // tiles.tq)
  nb = -(-n // (tiles.td * tiles.steps))
  kernel = functools.partial(_scan_select_kernel, b=b, n=n, w=w, k=k, tiles=tiles,
                             no_doc=no_doc)
  out_spec = pl.BlockSpec((tiles.tq, None, kp), lambda i, j: (i, j, 0))
  vals, ids = pl.pallas_call(
      kernel, grid=(nq, nb), in_specs=[pl.no_block_spec, pl.no_block_spec],
      out_specs=[out_spec, out_spec],
      out_shape=[jax.ShapeDtypeStruct((nq * tiles.tq, nb, kp), jnp.float32),
                 jax.ShapeDtypeStruct((nq * tiles.tq, nb, kp), jnp.int32)],
      compiler_params=_params(tiles, interpret), interpret=interpret,
      name="scan_select")(qt, dt)
  return (vals[:b, :, :k].reshape(b, nb * k), ids[:b, :, :k].reshape(b, nb * k))


# ---- the MoL top-N selection ------------------------------------------------------------------

RADIX = 16  # candidates per counting pass of the top-N selection: 4 bits of the key per pass


def order_keys(x: jax.Array) -> jax.Array:
  """int32 keys ordered as XLA orders floats (negatives flipped; 0.0 above -0.0): [...] -> [...]."""
  bits = lax.bitcast_convert_type(x, jnp.int32)
  return jnp.where(bits < 0, bits ^ jnp.int32(0x7FFFFFFF), bits)


def _count_kernel(x_ref, c_ref, o_ref, *, b: int, m: int, tr: int, tm: int, chunks: int):
  """Program (i, j): rows [i tr, (i + 1) tr) x columns [j tm chunks, (j + 1) tm chunks): how
  many entries have a key >= each of the row's RADIX candidates ([tr, RADIX] partial counts)."""
  i, j = pl.program_id(0), pl.program_id(1)
  rows = i * tr + jnp.arange(tr, dtype=jnp.int32)
  cands = c_ref[...]  # [tr, RADIX]
  col = jnp.arange(RADIX, dtype=jnp.int32)[None, :]

  def body(c, acc):
    cols = (j * chunks + c) * tm + jnp.arange(tm, dtype=jnp.int32)
    ok = (rows < b)[:, None] & (cols < m)[None, :]
    keys = order_keys(plgpu.load(x_ref.at[pl.ds(i * tr, tr), pl.ds((j * chunks + c) * tm, tm)],
                                 mask=ok, other=0.0))
    for r in range(RADIX):  # candidate r of each row: [tr] counts, into column r
      cand = jnp.max(jnp.where(col == r, cands, jnp.iinfo(jnp.int32).min), axis=1)
      n_ge = jnp.sum(jnp.where(ok & (keys >= cand[:, None]), 1, 0), axis=1)
      acc = acc + jnp.where(col == r, n_ge[:, None], 0)
    return acc

  o_ref[...] = lax.fori_loop(0, chunks, body, jnp.zeros((tr, RADIX), jnp.int32))


@functools.partial(jax.jit, static_argnames=("tr", "tm", "chunks", "interpret"))
def count_keys_at_least(x: jax.Array, cands: jax.Array, tr: int = 8, tm: int = 1024,
                        chunks: int = 16, interpret: bool = False) -> jax.Array:
  """Per row of x [B, M] float32, the number of entries whose order key (`order_keys`) is >=
  each candidate key: cands [B, RADIX] int32 -> [B, RADIX] int32. A grid over (row tiles of `tr`,
  column spans of tm * chunks): one read of x, every span at once."""
  b, m = x.shape
  nr, ns = -(-b // tr), -(-m // (tm * chunks))
  kernel = functools.partial(_count_kernel, b=b, m=m, tr=tr, tm=tm, chunks=chunks)
  cands = jnp.pad(cands, ((0, nr * tr - b), (0, 0)))
  part = pl.pallas_call(
      kernel, grid=(nr, ns),
      in_specs=[pl.no_block_spec, pl.BlockSpec((tr, RADIX), lambda i, j: (i, 0))],
      out_specs=pl.BlockSpec((tr, None, RADIX), lambda i, j: (i, j, 0)),
      out_shape=jax.ShapeDtypeStruct((nr * tr, ns, RADIX), jnp.int32), interpret=interpret,
      compiler_params=None if interpret else plgpu.CompilerParams(num_warps=4, num_stages=2),
      name="count_keys_at_least")(x, cands)
  return jnp.sum(part[:b], axis=1)


def top_n_threshold(x: jax.Array, n: int, interpret: bool = False, **kw
                    ) -> tuple[jax.Array, jax.Array]:
  """Per row of x [B, M] float32 (no NaN), the order key (`order_keys`) t of its n-th largest
  entry and the number of entries strictly above it: (t [B] int32, above [B] int32). Traceable.

  A radix search over the 32 key bits, 4 per pass (8 passes of `count_keys_at_least`, each one
  read of x): the interval [lo, lo + 2^bits) holds t, with count(key >= lo) >= n and
  count(key >= lo + 2^bits) = hi < n; each pass counts at lo + r 2^(bits - 4), r = 0 .. 15, and
  keeps the last sub-interval whose start still has n entries at or above it. Offsets are uint32
  (the key biased by 2^31), so no int32 overflows.

  Args:
    x: [B, M]; n: 1 <= n <= M; interpret: Pallas interpret mode; **kw: `count_keys_at_least`
      tiles (tr, tm, chunks).
  """
  b = x.shape[0]
  bias = jnp.uint32(1 << 31)
  lo = jnp.zeros((b,), jnp.uint32)  # biased key of the interval's start (int32 min)
  hi = jnp.zeros((b,), jnp.int32)   # entries at or above the interval's end (none above max)
  r = jnp.arange(RADIX, dtype=jnp.uint32)
  for bits in range(32, 0, -4):
    step = jnp.uint32(1 << (bits - 4))
    cand_u = lo[:, None] + r[None, :] * step  # [B, RADIX], < 2^32
    counts = count_keys_at_least(x, lax.bitcast_convert_type(cand_u ^ bias, jnp.int32),
                                 interpret=interpret, **kw)
    # the last r with count >= n (r = 0 always qualifies: count(key >= lo) >= n)
    last = jnp.sum((counts >= n).astype(jnp.int32), axis=1) - 1  # [B]
    nxt = jnp.where(last + 1 < RADIX,
                    jnp.take_along_axis(counts, jnp.minimum(last + 1, RADIX - 1)[:, None],
                                        axis=1)[:, 0], hi)
    lo, hi = lo + last.astype(jnp.uint32) * step, nxt
  return lax.bitcast_convert_type(lo ^ bias, jnp.int32), hi


def select_top_n(x: jax.Array, n: int, interpret: bool | None = None, **kw
                 ) -> tuple[jax.Array, jax.Array]:
  """`lax.top_k(x, n)` through `top_n_threshold`: x [B, M] float32 (no NaN) -> (values [B, n],
  positions [B, n] int32), the same values and positions (ties: lower position first).

  The kernel (`top_n_threshold`, 8 counting passes) finds each row's n-th key t; the kept
  entries are those above t and the (n - above) lowest positions equal to t; they are
  compacted in position order and sorted by (value desc, position asc). Traceable.
  """
  interpret = interpret_default() if interpret is None else interpret
  b, m = x.shape
  t, above = top_n_threshold(x, n, interpret=interpret, **kw)
  keys = order_keys(x)
  eq = keys == t[:, None]
  keep = (keys > t[:, None]) | (eq & (jnp.cumsum(eq, axis=1, dtype=jnp.int32)
                                      <= (n - above)[:, None]))
  slot = jnp.cumsum(keep, axis=1, dtype=jnp.int32) - 1  # [B, M], slot of each kept entry
  rows = jnp.broadcast_to(jnp.arange(b)[:, None], (b, m))
  pos = jnp.zeros((b, n), jnp.int32).at[rows, jnp.where(keep, slot, n)].set(
      jnp.broadcast_to(jnp.arange(m, dtype=jnp.int32)[None], (b, m)), mode="drop")
  _, pos = lax.sort((~order_keys(jnp.take_along_axis(x, pos, axis=1)), pos), dimension=1,
                    num_keys=2)  # ~key: descending key order, no overflow
  return jnp.take_along_axis(x, pos, axis=1), pos
