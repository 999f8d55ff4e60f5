"""Random projections A [k, V] of sparse bag-of-words vectors, never materialised for large V.

The encoder of paper 002 section 2.1 is f(x) = A x with A [k, V] random: Rademacher entries
+-1/sqrt(k) or Gaussian entries N(0, 1/k), so that E <Ax, Ay> = <x, y>. Here A^T is cut into
vocabulary blocks of `block_size` rows: block b is regenerated from `fold_in(key, b)` whenever it
is needed, so memory is O(block_size * k), whatever V is, and the same key gives the same A on
every device and in every call. A sparse [n, V] matrix is applied in two parts (`BlockedSparse`):
  * head: the columns holding at least n / 64 nonzeros (bag-of-words columns are Zipf-distributed:
    a few hundred frequent terms hold most nonzeros) as a dense [n, H] matrix times their H rows of
    A^T, one matmul. An outer loop over the blocks that hold nonzeros generates each block once and
    copies out its head rows.
  * tail: the other nonzeros as a sum `y[r] += x[r, c] * A^T[c]`, in fixed-size pieces that each
    lie inside one block; an inner loop scatters the current block's pieces.
  Why n / 64: on a 2-core CPU the matmul does ~150 G multiply-adds/s and the scatter ~2.4 G/s, so
  a column is cheaper dense once it holds more than n * 2.4 / 150 nonzeros (on SciFact's 1,135
  rows x 15,000 terms, 426 head columns hold 92% of the 87,342 nonzeros). Memory: each head
  column holds
  >= n / 64 nonzeros, so the dense head has n * H <= 64 * nnz entries.

Rademacher signs come from packed random bits (32 signs per uint32), an order of magnitude faster
than `jax.random.rademacher` on CPU, with the same distribution (each bit an independent fair
coin); a block stays packed and only the rows a piece of nonzeros needs are unpacked. With a
Threefry key (the default) the bits are counter-mode Threefry over a flat counter.

Nested dimensions: the columns of the unscaled projection `x A~` (A~ = sqrt(k) A^T, unit-variance
entries) are i.i.d., so its first k' columns divided by sqrt(k') are a k'-dimensional projection
of the same kind. The fidelity experiments project once at the largest k of their grid
(`scale=False`) and read every smaller k off prefix sums.

Functions: `block_matrix` (one block), `matrix` (the explicit A, small V only), `head_columns`,
`blocked` (CSR -> head + pieces), `piece_size_for`, `prepare` (blocked with the defaults),
`project` (one key), `project_batch` (a batch of keys, vmapped), `project_sharded` (rows split
over a mesh axis with `jax.shard_map`).
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.extend.random as jax_random_ext
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp

from bilinear_ir.errors import require

KINDS = ("rademacher", "gaussian")
DEFAULT_BLOCK_SIZE = 4096
PIECE_FLOATS = 1 << 22  # nonzeros per piece * k: bounds the [piece, k] scatter operand (16 MB)
HEAD_DENSITY = 1 / 64   # a column with >= this share of rows nonzero is projected densely


def _block_source(key: jax.Array, block: jax.Array | int, block_size: int, k: int,
                  kind: str) -> jax.Array:
  """What a block is drawn from: packed sign bits [block_size, ceil(k/32)] uint32 (Rademacher)
  or the N(0, 1) entries [block_size, k] float32 (Gaussian), from `fold_in(key, block)`."""
  bkey = jax.random.fold_in(key, block)
  if kind == "gaussian":
    return jax.random.normal(bkey, (block_size, k), jnp.float32)
  words = block_size * -(-k // 32)
  if str(jax.random.key_impl(bkey)) == "threefry2x32":
    # Counter-mode Threefry over a flat counter (what jax.random.bits does without
    # jax_threefry_partitionable), cheaper on CPU than jax.random.bits' split keys.
    bits = jax_random_ext.threefry_2x32(jax.random.key_data(bkey),
                                        jnp.arange(words, dtype=jnp.uint32))
  else:
    bits = jax.random.bits(bkey, (words,), jnp.uint32)
  return bits.reshape(block_size, -1)


def _source_rows(source: jax.Array, idx: jax.Array, k: int, kind: str) -> jax.Array:
  """Rows `idx` [S] of a block of A~: [S, k] float32 (+-1 unpacked from bits, bit j of word w
  being entry 32 w + j)."""
  rows = source[idx]
  if kind == "gaussian":
    return rows
  bits = (rows[:, :, None] >> jnp.arange(32, dtype=jnp.uint32)) & 1  # [S, words, 32]
  return bits.reshape(idx.shape[0], -1)[:, :k].astype(jnp.float32) * 2.0 - 1.0


def block_matrix(key: jax.Array, block: jax.Array | int, block_size: int, k: int,
                 kind: str) -> jax.Array:
  """Rows `block * block_size ...` of the unscaled A~ = sqrt(k) A^T: [block_size, k] float32.

  Entries are i.i.d. +-1 (Rademacher) or N(0, 1) (Gaussian), drawn from `fold_in(key, block)`.
  """
  source = _block_source(key, block, block_size, k, kind)
  return _source_rows(source, jnp.arange(block_size), k, kind)


def matrix(key: jax.Array, vocab_size: int, k: int, kind: str = "rademacher",
           block_size: int = DEFAULT_BLOCK_SIZE) -> np.ndarray:
  """The explicit A [k, V] (scaled by 1/sqrt(k)) that `project` applies; for small V only."""
  _check(k, kind, block_size)
  blocks = [np.asarray(block_matrix(key, b, block_size, k, kind))
            for b in range(-(-vocab_size // block_size))]
  return np.concatenate(blocks, axis=0)[:vocab_size].T / math.sqrt(k)


@dataclasses.dataclass(frozen=True)
class BlockedSparse:
  """A sparse [n, V] matrix as H dense head columns plus P pieces of S tail nonzeros, each piece
  inside one vocabulary block.

  Attributes:
    blocks: [NB] int32 vocabulary blocks holding nonzeros, increasing (padding repeats the last).
    starts: [NB + 1] int32: the pieces of `blocks[i]` are `starts[i] .. starts[i + 1] - 1`.
    num_blocks: how many entries of `blocks` are real (the rest is padding).
    rows: [P, S] int32 row of each tail nonzero.
    cols: [P, S] int32 column inside the block (column = block * block_size + cols).
    vals: [P, S] float32 values; padding entries are 0 (row 0, column 0).
    head_x: [n, H] float32: the head columns, dense (H may be 0).
    head_rows: [NB, HB] int32: row inside `blocks[i]` of each of its head columns (padding 0).
    head_pos: [NB, HB] int32: that column's position in `head_x` (padding H: dropped).
    shape: (n, V).
    block_size: rows of A^T per block.
  """
  blocks: np.ndarray
  starts: np.ndarray
  num_blocks: int
  rows: np.ndarray
  cols: np.ndarray
  vals: np.ndarray
  head_x: np.ndarray
  head_rows: np.ndarray
  head_pos: np.ndarray
  shape: tuple[int, int]
  block_size: int

  def arrays(self) -> tuple[np.ndarray, ...]:
    """(num_blocks, blocks, starts, rows, cols, vals, head_x, head_rows, head_pos): what the
    jitted projection takes."""
    return (np.int32(self.num_blocks), self.blocks, self.starts, self.rows, self.cols, self.vals,
            self.head_x, self.head_rows, self.head_pos)


def head_columns(x: sp.spmatrix, density: float = HEAD_DENSITY) -> np.ndarray:
  """Columns of a sparse [n, V] matrix with at least max(1, ceil(density * n)) nonzeros, [H]
  int64 increasing (density > 1: none)."""
  x = sp.csc_matrix(x)
  counts = np.diff(x.indptr)
  return np.flatnonzero(counts >= max(1, math.ceil(density * x.shape[0]))).astype(np.int64)


def piece_size_for(k: int, x: sp.spmatrix, block_size: int,
                   head: np.ndarray | None = None) -> int:
  """Nonzeros per piece: the largest block's tail nonzeros (outside the `head` columns, default
  `head_columns(x)`) rounded up to a power of two, capped at `PIECE_FLOATS // k` (so a piece's
  [S, k] operand stays small), at least 8."""
  cols = sp.csr_matrix(x).indices
  head = head_columns(x) if head is None else head
  cols = cols[~np.isin(cols, head)]
  most = int(np.bincount(cols // block_size).max()) if cols.size else 1
  return max(8, min(1 << (most - 1).bit_length(), max(8, PIECE_FLOATS // k)))


def blocked(x: sp.spmatrix, block_size: int, piece_size: int, num_blocks: int | None = None,
            num_pieces: int | None = None, head: np.ndarray | None = None,
            head_per_block: int | None = None) -> BlockedSparse:
  """Cuts a sparse [n, V] matrix into dense head columns and block-aligned pieces of
  `piece_size` tail nonzeros.

  Args:
    x: [n, V] any scipy sparse matrix.
    block_size: vocabulary rows per block of A^T.
    piece_size: S, nonzeros per piece.
    num_blocks, num_pieces: pad `blocks` / the pieces to these lengths (None: no padding), so
      that several matrices share shapes (one compilation; stacking for `shard_map`).
    head: [H] increasing columns projected densely (None: `head_columns(x)`; empty: none).
    head_per_block: pad the head columns per block to this many (None: the most in one block).

  Returns:
    The `BlockedSparse` (host numpy arrays).
  """
  n, vocab = int(x.shape[0]), int(x.shape[1])
  head = head_columns(x) if head is None else np.asarray(head, np.int64)
  require(head.size == 0 or (head.min() >= 0 and head.max() < vocab
                             and np.all(np.diff(head) > 0)),
          "head columns must be increasing and inside the vocabulary", field="head")
  csc = sp.csc_matrix(x)
  head_x = np.asarray(csc[:, head].todense(), np.float32).reshape(n, head.size)
  coo = sp.coo_matrix(x)
  tail = ~np.isin(coo.col, head)
  col = coo.col[tail].astype(np.int64)
  order = np.lexsort((coo.row[tail], col))
  row, col, val = coo.row[tail][order], col[order], coo.data[tail][order]
  blk = col // block_size
  head_blk = head // block_size
  blocks, starts, rows, cols, vals = [], [0], [], [], []
  for b in np.unique(np.concatenate([blk, head_blk])):
    lo, hi = np.searchsorted(blk, [b, b + 1])
    for s in range(lo, hi, piece_size):
      e = min(s + piece_size, hi)
      pad = piece_size - (e - s)
      rows.append(np.pad(row[s:e], (0, pad)))
      cols.append(np.pad(col[s:e] - b * block_size, (0, pad)))
      vals.append(np.pad(val[s:e], (0, pad)))
    blocks.append(b)
    starts.append(len(rows))
  real_blocks, real_pieces = len(blocks), len(rows)
  most = max([int(np.sum(head_blk == b)) for b in blocks] + [0])
  require(head_per_block is None or head_per_block >= most,
          f"{most} head columns in one block do not fit head_per_block={head_per_block}",
          field="head_per_block")
  hb = most if head_per_block is None else head_per_block
  for name, want, have in (("num_blocks", num_blocks, real_blocks),
                           ("num_pieces", num_pieces, real_pieces)):
    require(want is None or want >= have, f"{have} do not fit in {name}={want}", field=name)
  for _ in range(max(num_pieces or 0, real_pieces, 1) - real_pieces):
    rows.append(np.zeros(piece_size, np.int64))
    cols.append(np.zeros(piece_size, np.int64))
    vals.append(np.zeros(piece_size))
  last = blocks[-1] if blocks else 0
  for _ in range(max(num_blocks or 0, real_blocks, 1) - real_blocks):
    blocks.append(last)
    starts.append(starts[-1])
  head_rows = np.zeros((len(blocks), hb), np.int32)
  head_pos = np.full((len(blocks), hb), head.size, np.int32)  # H: out of range, dropped
  for i, b in enumerate(blocks[:real_blocks]):
    mine = np.flatnonzero(head_blk == b)
    head_rows[i, :mine.size] = head[mine] - b * block_size
    head_pos[i, :mine.size] = mine
  return BlockedSparse(blocks=np.asarray(blocks, np.int32), starts=np.asarray(starts, np.int32),
                       num_blocks=real_blocks, rows=np.stack(rows).astype(np.int32),
                       cols=np.stack(cols).astype(np.int32),
                       vals=np.stack(vals).astype(np.float32), head_x=head_x,
                       head_rows=head_rows, head_pos=head_pos, shape=(n, vocab),
                       block_size=block_size)


def _check(k: int, kind: str, block_size: int) -> None:
  require(k >= 1, f"must be >= 1, got {k}", field="projection.k")
  require(kind in KINDS, f"unknown projection {kind!r}; known: {', '.join(KINDS)}",
          field="projection.kind")
  require(block_size >= 1, f"must be >= 1, got {block_size}", field="projection.block_size")


def _apply(key, num_blocks, blocks, starts, rows, cols, vals, head_x, head_rows, head_pos, *,
           n: int, k: int, kind: str, block_size: int, scale: bool):
  """The loops over blocks and their pieces, then the head matmul -> [n, k] (traced; see
  `project`).

  Each block of A~ is drawn once and stays fixed while the inner loop scatters its tail pieces
  into y (a loop carry updated in place) and its head rows are copied out (still packed) into the
  [H, ...] head source. Rademacher blocks stay packed (32 signs per uint32, block_size * k / 8
  bytes, cache-sized) and only the gathered rows of a piece are unpacked: about twice as fast on
  CPU as unpacking the whole block first.
  """
  num_head = head_x.shape[1]
  width = k if kind == "gaussian" else -(-k // 32)
  dtype = jnp.float32 if kind == "gaussian" else jnp.uint32

  def over_blocks(i, carry):
    y, head = carry
    source = _block_source(key, blocks[i], block_size, k, kind)
    if num_head:
      head = head.at[head_pos[i]].set(source[head_rows[i]], mode="drop")

    def over_pieces(p, y):
      return y.at[rows[p]].add(vals[p][:, None] * _source_rows(source, cols[p], k, kind))

    return jax.lax.fori_loop(starts[i], starts[i + 1], over_pieces, y), head

  y, head = jax.lax.fori_loop(0, num_blocks, over_blocks,
                              (jnp.zeros((n, k), jnp.float32), jnp.zeros((num_head, width), dtype)))
  if num_head:
    # HIGHEST: float32 products on accelerators too (no TF32), as the scattered tail gets.
    y = y + jnp.dot(head_x, _source_rows(head, jnp.arange(num_head), k, kind),
                    precision=jax.lax.Precision.HIGHEST)
  return y / jnp.sqrt(jnp.float32(k)) if scale else y


_apply_jit = jax.jit(_apply, static_argnames=("n", "k", "kind", "block_size", "scale"))


def prepare(x: sp.spmatrix, k: int, block_size: int = DEFAULT_BLOCK_SIZE) -> BlockedSparse:
  """`blocked(x, ...)` with the default head (`head_columns`) and piece size (`piece_size_for`),
  for projections up to dimension k: build it once and pass it to every `project` call."""
  head = head_columns(x)
  return blocked(x, block_size, piece_size_for(k, x, block_size, head), head=head)


def _as_blocked(x, k: int, block_size: int) -> BlockedSparse:
  if isinstance(x, BlockedSparse):
    require(x.block_size == block_size, "BlockedSparse built with another block_size",
            field="projection.block_size")
    return x
  return prepare(x, k, block_size)


def project(key: jax.Array, x: sp.spmatrix | BlockedSparse, k: int, kind: str = "rademacher",
            block_size: int = DEFAULT_BLOCK_SIZE, scale: bool = True) -> jax.Array:
  """x A^T for a random A [k, V] drawn from `key`: [n, V] -> [n, k] float32.

  Args:
    key: a `jax.random` key; equal keys give equal A.
    x: [n, V] scipy sparse matrix, or its `blocked(...)` form (reused across keys).
    k: the projection dimension.
    kind: "rademacher" (+-1/sqrt(k)) or "gaussian" (N(0, 1/k)).
    block_size: vocabulary rows of A^T generated at a time (must match a given `BlockedSparse`).
    scale: False leaves out the 1/sqrt(k) (unit-variance entries; for prefix sums over k).

  Returns:
    [n, k] float32.
  """
  _check(k, kind, block_size)
  xb = _as_blocked(x, k, block_size)
  return _apply_jit(key, *xb.arrays(), n=xb.shape[0], k=k, kind=kind, block_size=block_size,
                    scale=scale)


@functools.partial(jax.jit, static_argnames=("n", "k", "kind", "block_size", "scale"))
def _apply_batch(keys, *arrays, n, k, kind, block_size, scale):
  return jax.vmap(lambda key: _apply(key, *arrays, n=n, k=k, kind=kind, block_size=block_size,
                                     scale=scale))(keys)


def project_batch(keys: jax.Array, x: sp.spmatrix | BlockedSparse, k: int,
                  kind: str = "rademacher", block_size: int = DEFAULT_BLOCK_SIZE,
                  scale: bool = True) -> jax.Array:
  """Independent projections, one per key: keys [T] -> [T, n, k] (vmapped `project`)."""
  _check(k, kind, block_size)
  xb = _as_blocked(x, k, block_size)
  return _apply_batch(keys, *xb.arrays(), n=xb.shape[0], k=k, kind=kind,
                      block_size=block_size, scale=scale)


def project_sharded(key: jax.Array, x: sp.spmatrix, k: int, mesh: jax.sharding.Mesh,
                    axis: str = "data", kind: str = "rademacher",
                    block_size: int = DEFAULT_BLOCK_SIZE, scale: bool = True) -> jax.Array:
  """`project` with the rows of x split over the mesh axis `axis` (`jax.shard_map`).

  Each device applies the same A (regenerated from the same key) to its contiguous share of
  rows; the result equals `project(key, x, k, ...)`.

  Args:
    key, k, kind, block_size, scale: as `project`.
    x: [n, V] scipy sparse matrix.
    mesh: a mesh whose `axis` splits the rows (build it with `AxisType.Auto` axes).
    axis: the mesh axis name.

  Returns:
    [n, k] float32, rows sharded over `axis`.
  """
  _check(k, kind, block_size)
  shards = mesh.shape[axis]
  x = sp.csr_matrix(x)
  n = x.shape[0]
  per = max(1, -(-n // shards))
  # Every share has `per` rows (the last padded with empty rows) and the same head columns.
  parts = [sp.vstack([x[min(i * per, n):min((i + 1) * per, n)],
                      sp.csr_matrix((per - (min((i + 1) * per, n) - min(i * per, n)), x.shape[1]),
                                    dtype=x.dtype)]).tocsr() for i in range(shards)]
  head = head_columns(x)
  piece = piece_size_for(k, x, block_size, head)
  bs = [blocked(p, block_size, piece, head=head) for p in parts]
  most_blocks = max(len(b.blocks) for b in bs)
  most_pieces = max(len(b.vals) for b in bs)
  most_head = max(b.head_rows.shape[1] for b in bs)
  bs = [blocked(p, block_size, piece, most_blocks, most_pieces, head, most_head) for p in parts]
  stacked = [np.stack(a) for a in zip(*(b.arrays() for b in bs))]  # each [D, ...]
  spec = jax.sharding.PartitionSpec(axis)

  def local(key, *arrays):
    return _apply(key, *(a[0] for a in arrays), n=per, k=k, kind=kind, block_size=block_size,
                  scale=scale)

  fn = jax.jit(jax.shard_map(local, mesh=mesh,
                             in_specs=(jax.sharding.PartitionSpec(),) + (spec,) * len(stacked),
                             out_specs=spec, check_vma=False))
  return fn(key, *stacked)[:n]
