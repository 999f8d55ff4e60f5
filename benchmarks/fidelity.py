"""Projected pairwise-accuracy evaluations per second: JAX (this project) vs numpy, one run.

    python benchmarks/fidelity.py                  # the Fig. 2 job's per-trial workload
    python benchmarks/fidelity.py --rows 300 --vocab 4000 --k 1024 --triples 200 --trials 2 \
        --json runs/fidelity.json                  # smoke run

One trial: draw a Rademacher A [K, V] (vocabulary blocks of `--block` rows of A^T), project R
sparse rows (BM25-like: Zipf-distributed columns, about `--nnz` nonzeros per row), and for T
triples (q, d1, d2) decide at each of the G dimensions k of the paper's grid (those <= K) whether
the k-dimensional projection ranks d2 at or above d1 (prefix sums over the first k coordinates,
as the fidelity job does). One evaluation is one (triple, k, trial) decision:
evals/s = T * G * trials / (total seconds of `--trials` trials, after one warm-up trial).

  JAX    `fidelity.projections.project` (packed random bits per block; the head columns, those
         with >= R / 64 nonzeros, as one dense matmul, the other nonzeros scattered in pieces) and
         `studies.fidelity_experiments.pairwise_errors` (a loop over triples + chunk sums + cumsum),
         jitted, after a warm-up trial.
  numpy  the same algorithm and the same work: per vocabulary block holding nonzeros, the block's
         packed random bits (block x ceil(K / 32) uint32 words from numpy's PCG64,
         `random_raw`, as many bits as the JAX side draws), the packed head rows copied out, and
         only the rows of A~ that tail nonzeros need unpacked (one table lookup per byte) and
         applied as scipy CSR @ dense; after the blocks, the head rows unpacked and applied as
         one dense matmul (numpy's BLAS); then the same chunk sums (step = gcd of the grid) and
         cumsum for the triples, 256 triples at a time. The head/tail split (the same head
         columns as `projections.prepare`) and the per-block CSR pieces are prepared once,
         before timing, as JAX's `blocked` is.

Trials alternate between the two sides (JAX first in even trials, numpy first in odd ones), so a
machine whose speed drifts favours neither; each side's time is the sum of its trials. Both
print their mean error rate (the two draw different matrices, so they agree only
statistically). Ratio = JAX evals/s / numpy evals/s. `--profile` also prints where the numpy
trial's time goes (bits, unpacking, tail products, head matmul, triples).
"""
from __future__ import annotations

import argparse
import functools
import math
import time

import blas_setup  # benchmarks/blas_setup.py: numpy's BLAS kernel, chosen before numpy loads

if __name__ == "__main__":
  blas_setup.choose_numpy_coretype()

# numpy (and jax, which imports it) after its BLAS kernel is chosen.
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402

from bilinear_ir import allocator, files  # noqa: E402
from bilinear_ir.studies import fidelity_experiments as experiments  # noqa: E402
from bilinear_ir.fidelity import projections  # noqa: E402
from bilinear_ir import timing  # noqa: E402

PAPER_K_GRID = (32, 64, 128) + tuple(256 * j for j in range(1, 38))


def make_data(rows: int, vocab: int, nnz: int, triples: int, seed: int):
  """Sparse rows [R, V] float32 and triples (q, d1, d2) of row indices [T] each."""
  rng = np.random.default_rng(seed)
  cols = np.minimum((rng.pareto(1.0, rows * nnz) * 20).astype(np.int64), vocab - 1)
  x = sp.csr_matrix((rng.random(rows * nnz).astype(np.float32),
                     (np.repeat(np.arange(rows), nnz), cols)), shape=(rows, vocab))
  x.sum_duplicates()
  queries = max(1, rows // 10)
  q = rng.integers(0, queries, triples)
  d1 = rng.integers(queries, rows, triples)
  d2 = rng.integers(queries, rows, triples)
  return x, (q, d1, d2)


# byte -> its 8 bits as +-1 (bit b of byte j of word w is entry 32 w + 8 j + b, as JAX unpacks)
SIGNS = (((np.arange(256)[:, None] >> np.arange(8)) & 1) * 2 - 1).astype(np.float32)


def numpy_blocks(x: sp.csr_matrix, head: np.ndarray, block: int) -> tuple[np.ndarray, list]:
  """The numpy side's preprocessing (untimed, like `projections.blocked`).

  Returns:
    (head_x [R, H] float32 dense head columns, [(block start, head rows inside the block [h],
    their positions in head_x [h], tail rows of A~ used inside the block [U], the tail nonzeros
    as CSR [R, U])] per vocabulary block holding nonzeros).
  """
  vocab = x.shape[1]
  head = np.asarray(head, np.int64)
  is_head = np.zeros(vocab, bool)
  is_head[head] = True
  head_x = np.asarray(sp.csc_matrix(x)[:, head].todense(), np.float32)
  parts = []
  for start in range(0, vocab, block):
    stop = min(start + block, vocab)
    part = x[:, start:stop].tocsr()
    if part.nnz == 0:
      continue
    mine = np.flatnonzero(is_head[start:stop])
    pos = np.searchsorted(head, start + mine)
    tail = sp.csr_matrix(part.multiply(~is_head[None, start:stop]))  # head columns zeroed
    tail.eliminate_zeros()
    used = np.unique(tail.indices)
    parts.append((start, mine, pos, used, sp.csr_matrix(tail[:, used], dtype=np.float32)))
  return head_x, parts


def unpack(bits: np.ndarray, k: int) -> np.ndarray:
  """Packed sign bits [S, words] uint32 -> [S, k] float32 +-1 (the layout of JAX's unpacking)."""
  return SIGNS[bits.view(np.uint8)].reshape(bits.shape[0], -1)[:, :k]


def numpy_errors(y: np.ndarray, triples, grid: tuple[int, ...], tile: int = 256) -> np.ndarray:
  """[T, G] errors from an unscaled projection y [R, K]: chunk sums of q * (d1 - d2) over steps
  of gcd(grid), then cumsum (what `experiments.pairwise_errors` computes), `tile` triples at a
  time."""
  step = functools.reduce(math.gcd, grid)
  steps = grid[-1] // step
  cols = np.asarray(grid) // step - 1
  q, d1, d2 = triples
  out = []
  for i in range(0, len(q), tile):
    sl = slice(i, i + tile)
    prod = y[q[sl], :steps * step] * (y[d1[sl], :steps * step] - y[d2[sl], :steps * step])
    margin = np.cumsum(prod.reshape(prod.shape[0], steps, step).sum(axis=2), axis=1)
    out.append(margin[:, cols] <= 0)
  return np.concatenate(out)


def numpy_trial(prepared, rows: int, triples, k: int, grid: tuple[int, ...], block: int,
                rng: np.random.Generator, clock: dict | None = None) -> np.ndarray:
  """[T, G] errors for one fresh Rademacher projection, in numpy/scipy, the JAX side's algorithm
  (module docstring). `clock`: if a dict, seconds per stage are added to it."""
  head_x, parts = prepared
  words = -(-k // 32)
  y = np.zeros((rows, k), np.float32)
  head_bits = np.empty((head_x.shape[1], words), np.uint32)
  tick = time.perf_counter
  t = {"bits": 0.0, "unpack": 0.0, "tail": 0.0, "head": 0.0, "triples": 0.0}
  for _, mine, pos, used, tail in parts:
    t0 = tick()
    raw = rng.bit_generator.random_raw(-(-block * words // 2)).view(np.uint32)
    bits = raw[:block * words].reshape(block, words)
    head_bits[pos] = bits[mine]
    t1 = tick()
    if used.size:
      signs = unpack(bits[used], k)
      t2 = tick()
      y += tail @ signs
      t3 = tick()
      t["unpack"] += t2 - t1
      t["tail"] += t3 - t2
    t["bits"] += t1 - t0
  t0 = tick()
  if head_x.shape[1]:
    signs = unpack(head_bits, k)
    t1 = tick()
    y += head_x @ signs
    t["unpack"] += t1 - t0
    t0 = tick()
    t["head"] += t0 - t1
  errors = numpy_errors(y, triples, grid)
  t["triples"] += tick() - t0
  if clock is not None:
    for key, v in t.items():
      clock[key] = clock.get(key, 0.0) + v
  return errors


def jax_profile(xb, jt, grid, args, repeats: int = 3) -> dict[str, float]:
  """Seconds per trial of the JAX side's stages, each timed alone (best of `repeats`): the
  projection, its head matmul alone (the same [R, H] x [H, K] float32 product), the triples."""
  best = lambda fn: timing.best_s(fn, repeats)

  project = lambda: projections.project(jax.random.key(7), xb, args.k, "rademacher", args.block,
                                        scale=False)
  y = project()
  head_x = jnp.asarray(xb.head_x)
  signs = jnp.ones((head_x.shape[1], args.k), jnp.float32)
  mm = jax.jit(lambda a, b: jnp.dot(a, b, precision=jax.lax.Precision.HIGHEST))
  return {"project": best(project), "of_which_head_matmul": best(lambda: mm(head_x, signs)),
          "triples": best(lambda: experiments.pairwise_errors(y, *jt, grid))}


def main():
  allocator.keep_freed_memory()  # as the project's binary does (bilinear_ir.allocator)
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--rows", type=int, default=1135, help="projected rows (queries + docs)")
  p.add_argument("--vocab", type=int, default=15000, help="vocabulary size V")
  p.add_argument("--nnz", type=int, default=150, help="nonzeros drawn per row (before merging)")
  p.add_argument("--k", type=int, default=9472, help="largest projection dimension K")
  p.add_argument("--triples", type=int, default=1000, help="(q, d1, d2) triples T")
  p.add_argument("--trials", type=int, default=3, help="timed trials per implementation")
  p.add_argument("--block", type=int, default=projections.DEFAULT_BLOCK_SIZE)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--profile", action="store_true",
                 help="print where the numpy trial's time goes (stages)")
  p.add_argument("--json", default="", help="write the numbers to this JSON file")
  args = p.parse_args()

  grid = tuple(g for g in PAPER_K_GRID if g <= args.k) or (args.k,)
  if grid[-1] != args.k:
    grid = grid + (args.k,)
  x, triples = make_data(args.rows, args.vocab, args.nnz, args.triples, args.seed)
  evals_per_trial = args.triples * len(grid)
  hw = f"{timing.hardware()}; {blas_setup.describe()}"
  print(hw)
  print(f"rows {args.rows}, vocab {args.vocab}, nnz {x.nnz}, K {args.k}, grid {len(grid)} values, "
        f"triples {args.triples}, trials {args.trials}")

  xb = projections.prepare(x, args.k, args.block)
  jt = tuple(jnp.asarray(t) for t in triples)

  def jax_trial(t):
    y = projections.project(jax.random.key(t), xb, args.k, "rademacher", args.block, scale=False)
    return experiments.pairwise_errors(y, *jt, grid)

  rng = np.random.default_rng(args.seed)
  head = projections.head_columns(x)  # prepare's head
  prepared = numpy_blocks(x, head, args.block)
  print(f"head columns {head.size} ({np.asarray(xb.head_x).shape}), tail nonzeros "
        f"{sum(p[4].nnz for p in prepared[1])}, tail rows of A~ unpacked per trial "
        f"{sum(p[3].size for p in prepared[1])}, blocks {len(prepared[1])}")

  def np_trial(clock=None):
    return numpy_trial(prepared, args.rows, triples, args.k, grid, args.block, rng, clock)

  jax.block_until_ready(jax_trial(10**6))  # compile + warm
  np_trial()  # warm (allocations, caches)
  jax_s = np_s = 0.0
  jax_err, np_err = [], []
  clock = {}
  for t in range(args.trials):  # alternating order: a drifting machine favours neither
    for side in (("jax", "numpy") if t % 2 == 0 else ("numpy", "jax")):
      t0 = time.perf_counter()
      if side == "jax":
        jax_err.append(np.asarray(jax_trial(t)))
        jax_s += time.perf_counter() - t0
      else:
        np_err.append(np_trial(clock if args.profile else None))
        np_s += time.perf_counter() - t0

  jax_rate = evals_per_trial * args.trials / jax_s
  np_rate = evals_per_trial * args.trials / np_s
  print(f"jax:   {jax_rate:,.0f} evals/s ({jax_s / args.trials:.3f} s/trial), "
        f"mean error rate {np.mean(jax_err):.4f}")
  print(f"numpy: {np_rate:,.0f} evals/s ({np_s / args.trials:.3f} s/trial), "
        f"mean error rate {np.mean(np_err):.4f}")
  jax_stages = None
  if args.profile:
    print("numpy s/trial by stage: " + ", ".join(f"{k} {v / args.trials:.3f}"
                                                  for k, v in clock.items()))
    jax_stages = jax_profile(xb, jt, grid, args)
    print("jax s/trial by stage: " + ", ".join(f"{k} {v:.3f}" for k, v in jax_stages.items()))
  print(f"ratio jax / numpy: {jax_rate / np_rate:.2f}x")
  if args.json:
    files.atomic_write_json(args.json, {
        "hardware": hw, "evals_per_s": jax_rate, "numpy_evals_per_s": np_rate,
        "ratio_vs_numpy": jax_rate / np_rate, "jax_s_per_trial": jax_s / args.trials,
        "numpy_s_per_trial": np_s / args.trials,
        "numpy_stage_s_per_trial": ({k: v / args.trials for k, v in clock.items()}
                                    if args.profile else None),
        "jax_stage_s_per_trial": jax_stages,
        "numpy_peer": "same algorithm: packed PCG64 bits per block, only needed rows unpacked, "
                      "head as one BLAS matmul, tail as scipy CSR @ dense, chunk sums + cumsum",
        "sizes": {"rows": args.rows, "vocab": args.vocab, "nnz": int(x.nnz), "k": args.k,
                  "triples": args.triples, "trials": args.trials, "grid": len(grid)}})

if __name__ == "__main__":
  main()
