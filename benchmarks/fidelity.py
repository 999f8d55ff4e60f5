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
         `fidelity.experiments.pairwise_errors` (a loop over triples + cumsum), jitted, after a
         warm-up trial.
  numpy  the same algorithm: per vocabulary block, int8 signs from `np.random.default_rng` made
         float32, the same head columns as a dense matmul (BLAS) and the rest as scipy CSR @
         dense, accumulated into Y [R, K], then np.cumsum over k. The split into head and tail,
         like JAX's `blocked`, is prepared once before timing.

Both print their mean error rate (the two draw different matrices, so they agree only
statistically). Ratio = JAX evals/s / numpy evals/s.
"""
from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp

from bilinear_ir import allocator, files
from bilinear_ir.fidelity import experiments
from bilinear_ir.fidelity import projections
from bilinear_ir.retrieval import latency

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


def numpy_blocks(x: sp.csr_matrix, head: np.ndarray, block: int) -> list[tuple]:
  """The numpy side's preprocessing (untimed, like `projections.blocked`): per vocabulary block
  holding nonzeros, (start, stop, its head rows, their dense columns [R, h], the tail as CSR)."""
  vocab = x.shape[1]
  is_head = np.zeros(vocab, bool)
  is_head[head] = True
  parts = []
  for start in range(0, vocab, block):
    stop = min(start + block, vocab)
    part = x[:, start:stop].tocsr()
    if part.nnz == 0:
      continue
    mine = np.flatnonzero(is_head[start:stop])
    tail = sp.csr_matrix(part.multiply(~is_head[None, start:stop]))  # head columns zeroed
    tail.eliminate_zeros()
    parts.append((start, stop, mine, np.asarray(part[:, mine].todense(), np.float32), tail))
  return parts


def numpy_trial(parts: list[tuple], rows: int, triples, k: int, grid: tuple[int, ...],
                rng: np.random.Generator) -> np.ndarray:
  """[T, G] errors for one fresh Rademacher projection, in numpy/scipy: per block, int8 signs made
  float32, the head columns as a dense matmul (BLAS) and the tail as scipy CSR x dense, as the
  JAX side splits them."""
  y = np.zeros((rows, k), np.float32)
  for start, stop, mine, head_x, tail in parts:
    a = rng.integers(0, 2, (stop - start, k), dtype=np.int8).astype(np.float32)
    a *= 2
    a -= 1
    if mine.size:
      y += head_x @ a[mine]
    y += tail @ a
  q, d1, d2 = triples
  margin = np.cumsum(y[q] * (y[d1] - y[d2]), axis=1)
  return margin[:, np.asarray(grid) - 1] <= 0


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
  p.add_argument("--json", default="", help="write the numbers to this JSON file")
  args = p.parse_args()

  grid = tuple(g for g in PAPER_K_GRID if g <= args.k) or (args.k,)
  if grid[-1] != args.k:
    grid = grid + (args.k,)
  x, triples = make_data(args.rows, args.vocab, args.nnz, args.triples, args.seed)
  evals_per_trial = args.triples * len(grid)
  print(latency.hardware())
  print(f"rows {args.rows}, vocab {args.vocab}, nnz {x.nnz}, K {args.k}, grid {len(grid)} values, "
        f"triples {args.triples}, trials {args.trials}")

  xb = projections.prepare(x, args.k, args.block)
  jt = tuple(jnp.asarray(t) for t in triples)

  def jax_trial(t):
    y = projections.project(jax.random.key(t), xb, args.k, "rademacher", args.block, scale=False)
    return experiments.pairwise_errors(y, *jt, grid)

  jax.block_until_ready(jax_trial(10**6))  # compile + warm
  t0 = time.perf_counter()
  jax_err = [np.asarray(jax_trial(t)) for t in range(args.trials)]
  jax_s = time.perf_counter() - t0

  rng = np.random.default_rng(args.seed)
  parts = numpy_blocks(x, projections.head_columns(x), args.block)  # prepare's head
  numpy_trial(parts, args.rows, triples, args.k, grid, rng)  # warm (allocations, caches)
  t0 = time.perf_counter()
  np_err = [numpy_trial(parts, args.rows, triples, args.k, grid, rng) for _ in range(args.trials)]
  np_s = time.perf_counter() - t0

  jax_rate = evals_per_trial * args.trials / jax_s
  np_rate = evals_per_trial * args.trials / np_s
  print(f"jax:   {jax_rate:,.0f} evals/s ({jax_s / args.trials:.3f} s/trial), "
        f"mean error rate {np.mean(jax_err):.4f}")
  print(f"numpy: {np_rate:,.0f} evals/s ({np_s / args.trials:.3f} s/trial), "
        f"mean error rate {np.mean(np_err):.4f}")
  print(f"ratio jax / numpy: {jax_rate / np_rate:.2f}x")
  if args.json:
    files.atomic_write_json(args.json, {"hardware": latency.hardware(), "evals_per_s": jax_rate,
                                        "numpy_evals_per_s": np_rate,
                                        "ratio_vs_numpy": jax_rate / np_rate})


if __name__ == "__main__":
  main()
