"""Exact feasibility of a UNIVERSAL solution with a linear program (scipy's HiGHS).

Question for dimension n: is there one parameter vector theta that solves the task for every
critical pair I0 and every query q at once? Both families are linear in their parameters,
`s(q, d) = <theta, phi(q, d)>` with

  "wdp":       theta = v [n],        phi(q, d) = q * d
  "bilinear":  theta = vec(W) [n^2], phi(q, d) = vec(q d^T)

so the task is the system `<theta, phi(q, pos) - phi(q, neg)> > 0` over all q in {-1, +1}^n, all
I0 and the four (agreeing, disagreeing) pairs. It is homogeneous in theta, so strict inequalities
are equivalent to `>= 1` (scale any strict solution up): an LP feasibility problem, answered
exactly by HiGHS. A feasible answer comes with its witness, re-checked here against every
constraint.
"""
from __future__ import annotations

import numpy as np
from scipy import optimize

from bilinear_ir.synthetic import task

FAMILIES = ("wdp", "bilinear")
# (agreeing, disagreeing) document pairs, as indices into task.documents' order (d1, d2, d3, d4).
PAIRS_OF_DOCS = ((0, 2), (0, 3), (1, 2), (1, 3))


def features(family: str, q: np.ndarray, d: np.ndarray) -> np.ndarray:
  """phi(q, d) of `family`: q [..., n], d [..., n] -> [..., n] ("wdp") or [..., n*n]."""
  if family == "wdp":
    return q * d
  if family == "bilinear":
    outer = q[..., :, None] * d[..., None, :]
    return outer.reshape(*outer.shape[:-2], -1)
  raise ValueError(f"unknown family {family!r}; known: {FAMILIES}")


def constraint_rows(n: int, family: str) -> np.ndarray:
  """Distinct rows `phi(q, pos) - phi(q, neg)` over all q, I0 and doc pairs: [R, p] float64."""
  q = task.all_queries(n).astype(np.float64)  # [Q, n]
  e = np.asarray(task.indicator(task.pairs(n), n), np.float64)  # [P, n]
  qq = np.broadcast_to(q[:, None, :], (q.shape[0], e.shape[0], n))
  qe = qq * e[None, :, :]
  docs = (qq, qe, -qq, -qe)
  rows = [features(family, qq, docs[a]) - features(family, qq, docs[b]) for a, b in PAIRS_OF_DOCS]
  rows = np.concatenate([r.reshape(-1, r.shape[-1]) for r in rows], axis=0)
  return np.unique(rows, axis=0)


def universal_solution(n: int, family: str) -> np.ndarray | None:
  """A theta with every constraint `>= 1` (so every instance solved strictly), or None.

  Args:
    n: dimension (2^n * n(n-1)/2 * 4 constraints before de-duplication; keep n <= 10).
    family: "wdp" or "bilinear".

  Returns:
    theta [n] (v) or [n, n] (W) when the LP is feasible; None when HiGHS proves it infeasible.
  """
  rows = constraint_rows(n, family)
  result = optimize.linprog(c=np.zeros(rows.shape[1]), A_ub=-rows, b_ub=-np.ones(rows.shape[0]),
                            bounds=(None, None), method="highs")
  if result.status == 2:
    return None
  if result.status != 0:
    raise RuntimeError(f"linprog failed for n={n}, {family}: {result.message}")
  theta = result.x
  slack = rows @ theta
  if not np.all(slack > 0):  # the witness must solve every instance strictly
    raise RuntimeError(f"LP witness for n={n}, {family} violates a constraint: min {slack.min()}")
  return theta.reshape(n, n) if family == "bilinear" else theta
