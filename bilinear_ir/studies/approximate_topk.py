"""Approximate retrieval with a learned similarity against brute force (MoL top-k, paper 003).

`mol_costs` runs each MoL top-k algorithm of `retrieval.mol_topk` (exact two-pass,
TopKPerEmbd, TopKAvg, CombTopK) and brute force on the same queries, and reports what the
paper's Table 5 does: the hit rate relative to brute force, the true gap and the Theorem 2 / 3
bounds, how much each re-scores, and its time relative to brute force in the same run.
`gate_entropies` / `gate_sample` read how a MoL spreads its mass over its P logits.
"""
from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np

from bilinear_ir.errors import require
from bilinear_ir.retrieval import mol_topk

ALGORITHMS = ("brute_force", "exact_two_pass", "topk_per_embedding", "topk_avg", "comb_topk")


def _algorithms(rcfg, p: int) -> list[tuple[str, str, Any, int]]:
  """[(name, algorithm, fn(src) -> MolTopK, most items re-scored per query)] for P logits."""
  k, chunk = int(rcfg.k), int(rcfg.chunk)
  out = [("exact (two-pass)", "exact_two_pass",
          lambda s: mol_topk.exact_two_pass(s, k, int(rcfg.max_range), chunk),
          p * k + int(rcfg.max_range))]
  for n in rcfg.per_embedding:
    out.append((f"TopKPerEmbd({n})", "topk_per_embedding",
                lambda s, n=int(n): mol_topk.topk_per_embedding(s, k, n, chunk), p * int(n)))
  for n in rcfg.avg:
    out.append((f"TopKAvg({n})", "topk_avg",
                lambda s, n=int(n): mol_topk.topk_avg(s, k, n, True, chunk), int(n)))
  for n1, n2 in zip(rcfg.comb_n1, rcfg.comb_n2):
    out.append((f"CombTopK({n1}, {n2})", "comb_topk",
                lambda s, a=int(n1), b=int(n2): mol_topk.comb_topk(s, k, a, b, True, chunk),
                p * int(n1) + int(n2)))
  return out


def _run_batches(fn, srcs: list[mol_topk.MolSource]):
  """fn over the query batches' sources: (MolTopK fields concatenated as numpy, seconds of the
  timed pass).

  The first pass compiles; the second, timed one runs the compiled algorithm.
  """
  jax.block_until_ready([fn(s) for s in srcs])
  start = time.perf_counter()
  outs = jax.block_until_ready([fn(s) for s in srcs])
  seconds = time.perf_counter() - start
  return mol_topk.MolTopK(*(np.concatenate([np.asarray(getattr(o, f)) for o in outs])
                            for f in mol_topk.MolTopK._fields)), seconds


def _finite_mean(x: np.ndarray) -> float | None:
  """Mean of [Q] per-query values; None if any is infinite (fewer than K candidates)."""
  return float(np.mean(x)) if np.all(np.isfinite(x)) else None


def mol_costs(module, params, queries: np.ndarray, docs: np.ndarray, rcfg
                    ) -> list[dict[str, Any]]:
  """Each MoL top-k algorithm against brute force on `queries` [Q, n] x `docs` [N, n].

  Returns:
    [{"algorithm", "name", "rescored", "hit_rate", "true_gap", "gap_bound",
      "gap_bound_retrieved", "bound_holds", "fallback", "seconds", "time_vs_brute_force"}]
    with per-query means (None where some query got fewer than K candidates); brute force
    first.
  """
  k = int(rcfg.k)
  require(k <= docs.shape[0], f"must be <= the {docs.shape[0]} docs, got {k}", field="retrieval.k")
  index = mol_topk.build_index(module, params, docs, chunk=int(rcfg.chunk))
  batch = int(rcfg.query_batch)
  # The query components of every batch, computed once and shared by all algorithms (untimed).
  qc_fn = jax.jit(lambda p, q: module.apply({"params": p}, q, method=module.query_components))
  srcs = [mol_topk.MolSource(qc_fn(params, queries[s:s + batch]), index, params, module)
          for s in range(0, len(queries), batch)]
  bf, bf_seconds = _run_batches(lambda s: mol_topk.brute_force(s, k, int(rcfg.chunk)), srcs)
  rows = [{"algorithm": "brute_force", "name": "brute force", "rescored": int(docs.shape[0]),
           "hit_rate": 1.0, "true_gap": 0.0, "gap_bound": 0.0, "gap_bound_retrieved": 0.0,
           "bound_holds": 1.0, "fallback": 0.0, "seconds": bf_seconds,
           "time_vs_brute_force": 1.0}]
  for name, algorithm, fn, rescored in _algorithms(rcfg, module.num_logits):
    res, seconds = _run_batches(fn, srcs)
    hits = [len(set(a[a >= 0].tolist()) & set(b.tolist())) / k for a, b in zip(res.ids, bf.ids)]
    true_gap = np.maximum(bf.scores[:, k - 1] - res.scores[:, k - 1], 0.0)
    rows.append({"algorithm": algorithm, "name": name,
                 "rescored": int(min(rescored, docs.shape[0])),
                 "hit_rate": float(np.mean(hits)), "true_gap": _finite_mean(true_gap),
                 "gap_bound": _finite_mean(res.gap_bound),
                 "gap_bound_retrieved": _finite_mean(res.gap_bound_retrieved),
                 "bound_holds": float(np.mean(res.gap_bound >= true_gap - 1e-5)),
                 "fallback": float(np.mean(res.fallback)), "seconds": seconds,
                 "time_vs_brute_force": seconds / max(bf_seconds, 1e-9)})
  return rows


def gate_entropies(gates: np.ndarray) -> tuple[float, float]:
  """(H(p), H(p | (q, x))) in nats of gates (..., P): the entropy of the mean gate and the mean
  entropy of each pair's gate; L_MI = -H(p) + H(p | (q, x))."""
  g = np.asarray(gates, np.float64).reshape(-1, np.shape(gates)[-1])
  ent = lambda x: -np.sum(np.where(x > 0, x * np.log(np.where(x > 0, x, 1.0)), 0.0), axis=-1)
  return float(ent(g.mean(axis=0))), float(np.mean(ent(g)))


def gate_sample(module, params, queries: np.ndarray, docs: np.ndarray, num_docs: int,
                seed: int) -> tuple[float, float]:
  """Gate entropies (`gate_entropies`) of a MoL `module`'s gates for every query [Q, n] against
  `num_docs` of `docs` [N, n] drawn by `seed`: (H(p), H(p|q,x))."""
  rows = np.random.default_rng([seed, 3]).choice(len(docs), min(num_docs, len(docs)),
                                                 replace=False)
  gates = module.apply({"params": params}, queries, docs[np.sort(rows)], method=module.gates)
  return gate_entropies(np.asarray(gates))
