"""Normalized margins and the random-projection fidelity bounds of paper 002, section 2.1.

  Def. 2.1   mu(q, d1, d2) = <q, d1 - d2> / (|q| |d1 - d2|)   (for <q, d1> >= <q, d2>)
  Lemma 1    Pr(<Aq, Ad2> >= <Aq, Ad1>) <= 4 exp(-k/2 (eps^2/2 - eps^3/3)),  eps = mu     (1)
  eq. (2)    k >= 2 (eps^2/2 - eps^3/3)^-1 ln(4/beta) makes that probability <= beta
             (at beta = .05: k* <= 8.76 (eps^2/2 - eps^3/3)^-1)
  Cor. 1     k > 12 eps^-2 ln(4/beta) suffices (looser, since eps^2/6 <= eps^2/2 - eps^3/3)
  Lemma 2    Pr(R >= r0) <= 4 (|D| - r0 + 1) exp(-k/2 (eps^2/2 - eps^3/3)), eps the r0-th
             smallest margin of d1 over the collection D (d1 excluded)
  eq. (3)    k >= 2 (eps^2/2 - eps^3/3)^-1 ln(4 (|D| - r0 + 1) / beta): d1 in the top r0
             (recall@r0) with probability >= 1 - beta
  Cor. 2     boolean q, d: every pair with <q, d1> > <q, d2> has margin >= (2 L_Q L_D)^-1/2, so
             k >= 24 L_Q L_D ln(4/beta) bounds each pairwise error by beta
             (L_Q = |q|^2 query terms, L_D = max |d|^2 terms of a document)

Functions taking eps accept floats or numpy arrays (elementwise). The `*_k` functions return the
real-valued threshold; `sufficient_k` rounds it to the smallest integer dimension that satisfies it.
"""
from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp

from bilinear_ir.errors import require


def margin_term(eps):
  """eps^2/2 - eps^3/3, the exponent rate of Lemma 1 (positive for 0 < eps <= 1)."""
  eps = np.asarray(eps, np.float64)
  return eps**2 / 2 - eps**3 / 3


def inverse_margin_term(eps):
  """(eps^2/2 - eps^3/3)^-1, the x-axis of Fig. 2."""
  return 1.0 / margin_term(eps)


def normalized_margin(q, d1, d2):
  """Def. 2.1 for dense vectors: q, d1, d2 [..., V] -> [...]; NaN where d1 == d2."""
  q, d1, d2 = (np.asarray(a, np.float64) for a in (q, d1, d2))
  diff = d1 - d2
  den = np.linalg.norm(q, axis=-1) * np.linalg.norm(diff, axis=-1)
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.where(den > 0, np.sum(q * diff, axis=-1) / np.where(den > 0, den, 1.0), np.nan)


def normalized_margins(queries, docs, targets, scores=None) -> np.ndarray:
  """mu(q_i, d_{t_i}, d) for every query i and every doc d of a collection.

  Args:
    queries: [m, V] q~ (scipy sparse or dense).
    docs: [N, V] d~ (scipy sparse or dense).
    targets: [m] the row of d1 for each query.
    scores: None, or the [m, N] float64 matrix `queries @ docs.T` if the caller has it.

  Returns:
    [m, N] float64; NaN where d equals d_{t_i} (the target itself, and exact duplicates:
    |d1 - d|^2 <= 1e-12 (|d1|^2 + |d|^2), below the rounding of the expansion used).
    Negative where d scores above the target.
  """
  qs, ds = sp.csr_matrix(queries, dtype=np.float64), sp.csr_matrix(docs, dtype=np.float64)
  targets = np.asarray(targets, np.int64)
  if scores is None:
    scores = np.asarray((qs @ ds.T).todense())  # [m, N]
  gram = np.asarray((ds[targets] @ ds.T).todense())  # [m, N] <d1, d>
  sq = np.asarray(ds.multiply(ds).sum(axis=1)).ravel()  # [N] |d|^2
  qn = np.sqrt(np.asarray(qs.multiply(qs).sum(axis=1)).ravel())  # [m]
  total = sq[targets][:, None] + sq[None, :]
  diff2 = total - 2 * gram  # |d1 - d|^2; rounding leaves ~1e-16 * total for equal vectors
  diff2 = np.where(diff2 > 1e-12 * total, diff2, 0.0)
  num = scores[np.arange(len(targets)), targets][:, None] - scores
  den = qn[:, None] * np.sqrt(diff2)
  with np.errstate(invalid="ignore", divide="ignore"):
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def lemma1_error_bound(eps, k):
  """Eq. (1): the bound 4 exp(-k/2 (eps^2/2 - eps^3/3)) on the pairwise error probability."""
  return 4.0 * np.exp(-np.asarray(k, np.float64) / 2 * margin_term(eps))


def eq2_slope(beta: float) -> float:
  """2 ln(4/beta): eq. (2)'s k per unit of (eps^2/2 - eps^3/3)^-1 (8.76 at beta = .05)."""
  _check_beta(beta)
  return 2.0 * math.log(4.0 / beta)


def lemma1_k(eps, beta: float):
  """Eq. (2): 2 (eps^2/2 - eps^3/3)^-1 ln(4/beta); any k >= it has error probability <= beta."""
  return eq2_slope(beta) * inverse_margin_term(eps)


def corollary1_k(eps, beta: float):
  """Corollary 1: 12 eps^-2 ln(4/beta); any k strictly above it has error probability <= beta."""
  _check_beta(beta)
  return 12.0 / np.asarray(eps, np.float64) ** 2 * math.log(4.0 / beta)


def lemma2_failure_bound(eps, k, num_docs: int, r0: int):
  """Lemma 2: 4 (|D| - r0 + 1) exp(-k/2 (eps^2/2 - eps^3/3)) bounds Pr(R >= r0).

  `num_docs` = |D|, the collection without d1; eps the r0-th smallest margin.
  """
  require(1 <= r0 <= num_docs, f"need 1 <= r0 <= |D|, got r0={r0}, |D|={num_docs}", field="r0")
  return 4.0 * (num_docs - r0 + 1) * np.exp(-np.asarray(k, np.float64) / 2 * margin_term(eps))


def lemma2_k(eps, beta: float, num_docs: int, r0: int):
  """Eq. (3): 2 (eps^2/2 - eps^3/3)^-1 ln(4 (|D| - r0 + 1) / beta)."""
  _check_beta(beta)
  require(1 <= r0 <= num_docs, f"need 1 <= r0 <= |D|, got r0={r0}, |D|={num_docs}", field="r0")
  return 2.0 * inverse_margin_term(eps) * math.log(4.0 * (num_docs - r0 + 1) / beta)


def corollary2_k(l_q: float, l_d: float, beta: float) -> float:
  """Corollary 2: 24 L_Q L_D ln(4/beta) for boolean inner products."""
  _check_beta(beta)
  return 24.0 * l_q * l_d * math.log(4.0 / beta)


def boolean_min_margin(l_q: float, l_d: float) -> float:
  """(2 L_Q L_D)^-1/2: the smallest positive boolean margin allowed (proof of Corollary 2)."""
  return 1.0 / math.sqrt(2.0 * l_q * l_d)


def sufficient_k(threshold, strict: bool = False):
  """The smallest integer k with k >= threshold (k > threshold if `strict`), elementwise."""
  t = np.asarray(threshold, np.float64)
  k = np.floor(t) + 1 if strict else np.ceil(t)
  return k.astype(np.int64)


def _check_beta(beta: float) -> None:
  require(0.0 < beta < 1.0, f"beta must be in (0, 1), got {beta}", field="beta")
