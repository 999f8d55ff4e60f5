"""Scoring latency of 1 query x K stored docs (the LITE paper's Table 3 protocol).

Doc-side work is precomputed, as in the paper: each doc is first put in its scorer's stored form
(`encode_docs` for late interaction, `doc_vectors` for ME-BERT, one pooled vector for DE) in the
storage dtype. A timed call is one jitted function of the raw query input that computes the query
side and scores the K stored docs; query encoder (transformer) time is not included (it is the
same for every scorer). Used by `benchmarks/late_interaction_latency.py` (random inputs) and the
`late_interaction` job (real SciFact tokens and trained params).
"""
from __future__ import annotations

import os
import platform
import statistics
import time
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from bilinear_ir import allocator
from bilinear_ir import scorers


def hardware() -> str:
  """One line: CPU model, core count, jax backend and devices, allocator setting."""
  cpu = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
  except (OSError, StopIteration):
    pass
  dev = jax.devices()[0]
  return (f"{cpu}; {os.cpu_count()} cores; jax {jax.__version__} {dev.platform} "
          f"({jax.device_count()} x {dev.device_kind}); {allocator.describe()}")


def timed(fn: Callable[[], Any], repeats: int, warmup: int = 3) -> float:
  """Median latency in ms of `repeats` calls of `fn` (each blocked on) after `warmup` calls."""
  return timed_interleaved({"fn": fn}, repeats, warmup)["fn"]


def timed_interleaved(fns: dict[str, Callable[[], Any]], repeats: int, warmup: int = 3,
                      rewarm: int = 0) -> dict[str, float]:
  """Median latency in ms of each of `fns`, timed in `repeats` rounds of one timed call each.

  Each function is warmed up `warmup` times first. The order within a round rotates, so a
  machine whose speed drifts during the measurement (shared hosts, thermal limits) favours none
  of the functions compared. `rewarm` untimed calls precede each timed call, so the timed one
  finds its own data in the caches as in back-to-back calls, not evicted by the previous
  function's. Every call is blocked on.
  """
  names = list(fns)
  for name in names:
    for _ in range(warmup):
      jax.block_until_ready(fns[name]())
  times = {name: [] for name in names}
  for r in range(repeats):
    for name in names[r % len(names):] + names[:r % len(names)]:
      for _ in range(rewarm):
        jax.block_until_ready(fns[name]())
      t0 = time.perf_counter()
      jax.block_until_ready(fns[name]())
      times[name].append((time.perf_counter() - t0) * 1e3)
  return {name: statistics.median(v) for name, v in times.items()}


def late_case(module: nn.Module, params: Any, q, qm, d, dm, dtype
              ) -> tuple[Callable[[], jnp.ndarray], int, int]:
  """A late-interaction scorer's timed call on stored docs.

  Args:
    module, params: a `scorers.token_interaction.LateInteraction` scorer and its params.
    q: [1, Tq, n] query tokens; qm: [1, Tq] mask.
    d: [K, Td, n] doc tokens; dm: [K, Td] mask.
    dtype: storage dtype of the stored docs.

  Returns:
    (call -> [1, K] scores, stored tokens per doc L2', stored width P').
  """
  stored, stored_mask = jax.jit(lambda d, dm: module.apply(
      {"params": params}, d, dm, method=module.encode_docs))(d, dm)
  stored = jax.block_until_ready(stored.astype(dtype))

  @jax.jit
  def score(q, qm, stored, stored_mask):
    eq, eqm = module.apply({"params": params}, q, qm, method=module.encode_queries)
    return module.apply({"params": params}, eq, eqm, stored, stored_mask,
                        method=module.score_all_encoded)

  return (lambda: score(q, qm, stored, stored_mask)), stored.shape[1], stored.shape[2]


def mebert_case(module: nn.Module, params: Any, q, qm, d, dm, dtype
                ) -> tuple[Callable[[], jnp.ndarray], int, int]:
  """ME-BERT's timed call on stored doc vectors (shapes as `late_case`).

  Returns:
    (call -> [1, K] scores, m vectors per doc, their width).
  """
  vecs, valid = jax.jit(lambda d, dm: module.apply({"params": params}, d, dm,
                                                   method=module.doc_vectors))(d, dm)
  vecs = jax.block_until_ready(vecs.astype(dtype))

  @jax.jit
  def score(q, qm, vecs, valid):
    qv = module.apply({"params": params}, q, qm, method=module.query_table)
    return module.apply({"params": params}, qv, vecs, valid, method=module.score_all_encoded)

  return (lambda: score(q, qm, vecs, valid)), vecs.shape[1], vecs.shape[2]


def de_case(q, qm, docs, dtype) -> tuple[Callable[[], jnp.ndarray], int, int]:
  """The dot-product DE's timed call: masked mean of the query tokens, dot with stored vectors.

  Args:
    q: [1, Tq, n] query tokens; qm: [1, Tq] mask.
    docs: [K, n] pooled doc vectors (stored in `dtype`).
    dtype: storage dtype.

  Returns:
    (call -> [1, K] scores, 1, n).
  """
  de = scorers.build("dot", dim=docs.shape[-1])
  stored = jax.block_until_ready(jnp.asarray(docs).astype(dtype))
  score = jax.jit(lambda q, qm, docs: de.apply(
      {}, jnp.sum(jnp.where(qm[..., None], q, 0), 1) / jnp.sum(qm, 1, keepdims=True),
      docs.astype(jnp.float32), method=de.score_all))
  return (lambda: score(q, qm, stored)), 1, stored.shape[-1]
