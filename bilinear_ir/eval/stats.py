"""Paired significance over queries: is model A better than baseline B on a per-query metric?

Each comparison takes one metric value per query for A and for B (e.g. nDCG@10), paired by query,
and works on the differences `d = a - b` (shape `[n]`, one per query):

  diff         mean(d)
  ci95         percentile bootstrap CI of mean(d), resampling queries (level 1 - alpha)
  p_perm       two-sided paired randomization test (sign flips of d): exact over all 2^n sign
               vectors for n <= `EXACT_MAX_N`, else Monte Carlo with the (count + 1) / (R + 1)
               correction
  p_t          two-sided paired t-test (= `scipy.stats.ttest_rel(a, b)`)
  effect_size  Cohen's d_z = mean(d) / sd(d) (ddof=1)
  n            number of queries

A study runs many comparisons; `apply_holm` adjusts their `p_perm` values together
(Holm–Bonferroni, `p_holm`), and `mark` turns one comparison into "+", "−" or "" for a table.

Everything random flows from one integer seed: `paired` splits it (`np.random.SeedSequence`)
into one stream for the sign flips and one for the bootstrap, so changing `resamples` leaves the
CI unchanged and vice versa. Work is vectorised in chunks of about `_CHUNK_ELEMENTS` matrix
entries: a 0/1 flip matrix times `d` (one matrix-vector product per chunk) for the randomization
test, and a gather of resampled indices for the bootstrap.

Degenerate cases: all differences 0 gives p_perm = p_t = 1, ci95 = [0, 0], effect_size = 0;
all differences equal and nonzero gives p_t = 0 and effect_size = ±inf (sd is 0; `paired`
reports None), while p_perm stays the (exact or Monte Carlo) randomization p-value, 2 / 2^n when
exact.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np
from scipy import stats as scipy_stats

from bilinear_ir.errors import input_error

EXACT_MAX_N = 16  # randomization test enumerates all 2^n sign vectors up to this many queries
GAIN, LOSS, TIE = "+", "\u2212", ""  # `mark` symbols; LOSS is the minus sign U+2212
_CHUNK_ELEMENTS = 1 << 21  # about 16 MiB of float64 per chunk
_REL_TOL = 1e-9  # |S| >= |S_obs| - _REL_TOL * sum|d| counts as "at least as extreme"
_MAX_IDS_SHOWN = 20
# A per-query difference smaller than this is a tie: float noise of averaging equal values (the
# seed mean of three identical runs differs from the single run's value in the last bit, and
# the same sign on every query made such a row "significantly" above dot).
TIE_TOL = 1e-12


def _ids_text(ids: Sequence[Any]) -> str:
  """Up to `_MAX_IDS_SHOWN` ids and the total, e.g. `['q1', 'q7'] (2)`."""
  shown = list(ids[:_MAX_IDS_SHOWN])
  more = ", ..." if len(ids) > _MAX_IDS_SHOWN else ""
  return f"{shown!r}"[:-1] + f"{more}] ({len(ids)})"


def paired_differences(a: Mapping[Any, float] | Sequence[float] | np.ndarray,
                       b: Mapping[Any, float] | Sequence[float] | np.ndarray) -> np.ndarray:
  """Per-query differences `a - b`, paired by query id (dicts) or by position (arrays).

  Args:
    a: metric value per query of model A: a dict `{query_id: value}` or a 1-D array `[n]`.
    b: the same for baseline B; a dict when `a` is one, with exactly the same query ids.

  Returns:
    `d: [n]` float64, `a[q] - b[q]` over the query ids in sorted order (dicts) or `a - b` (arrays),
    0 where its magnitude is below `TIE_TOL`.

  Raises:
    InputError: dict key sets differ (the message names the ids missing from each side), one
      side is a dict and the other not, arrays are not 1-D of equal length, fewer than 2
      queries, or a value is not finite (named by query id or position).
  """
  a_dict, b_dict = isinstance(a, Mapping), isinstance(b, Mapping)
  if a_dict != b_dict:
    raise input_error("a and b must both be dicts {query_id: value} or both arrays")
  if a_dict:
    only_a = sorted(set(a) - set(b))
    only_b = sorted(set(b) - set(a))
    if only_a or only_b:
      parts = []
      if only_a:
        parts.append(f"query ids missing from b: {_ids_text(only_a)}")
      if only_b:
        parts.append(f"query ids missing from a: {_ids_text(only_b)}")
      raise input_error("paired comparison needs the same queries on both sides; "
                        + "; ".join(parts))
    ids = sorted(a)
    try:
      av = np.array([a[q] for q in ids], np.float64)
      bv = np.array([b[q] for q in ids], np.float64)
    except (TypeError, ValueError) as e:
      raise input_error(f"metric values must be numbers ({e})") from e
  else:
    try:
      av, bv = np.asarray(a, np.float64), np.asarray(b, np.float64)
    except (TypeError, ValueError) as e:
      raise input_error(f"metric values must be numbers ({e})") from e
    if av.ndim != 1 or av.shape != bv.shape:
      raise input_error(f"a and b must be 1-D of equal length, got shapes {av.shape} and "
                        f"{bv.shape}")
    ids = list(range(len(av)))
  for name, v in (("a", av), ("b", bv)):
    bad = np.flatnonzero(~np.isfinite(v))
    if bad.size:
      raise input_error(f"non-finite value {v[bad[0]]!r} in {name} for query "
                        f"{ids[bad[0]]!r}")
  if av.shape[0] < 2:
    raise input_error(f"paired statistics need at least 2 queries, got {av.shape[0]}")
  d = av - bv
  return np.where(np.abs(d) < TIE_TOL, 0.0, d)


def permutation_p(d: np.ndarray, *, rng: np.random.Generator, resamples: int = 10_000,
                  exact_max_n: int = EXACT_MAX_N) -> float:
  """Two-sided paired randomization (sign-flip) test of mean(d) = 0.

  Under H0 each query's difference is symmetric about 0, so flipping its sign is as likely as
  not. The statistic is |sum(s * d)| over sign vectors s in {-1, +1}^n; a sign vector counts when
  `|sum(s * d)| >= |sum(d)| - 1e-9 * sum|d|` (the tolerance makes float-rounded ties count).
  Zero differences are kept; they change no sum.

  Args:
    d: `[n]` per-query differences.
    rng: the generator for Monte Carlo sign vectors (unused when exact).
    resamples: Monte Carlo sign vectors R (when n > exact_max_n).
    exact_max_n: enumerate all 2^n sign vectors when n <= this (p = count / 2^n, the observed
      vector included).

  Returns:
    The p-value: exact `count / 2^n`, or Monte Carlo `(count + 1) / (R + 1)` where count is
    over R random sign vectors (so p >= 1 / (R + 1)).
  """
  d = np.asarray(d, np.float64)
  n = d.shape[0]
  total = float(d.sum())
  threshold = abs(total) - _REL_TOL * float(np.abs(d).sum())
  rows = max(1, _CHUNK_ELEMENTS // max(n, 1))
  # With flips F (0/1 per query): sum(s * d) = total - 2 * (F @ d).
  if n <= exact_max_n:
    count, num = 0, 1 << n
    shifts = np.arange(n, dtype=np.int64)
    for lo in range(0, num, rows):
      codes = np.arange(lo, min(lo + rows, num), dtype=np.int64)
      flips = ((codes[:, None] >> shifts) & 1).astype(np.float64)
      count += int(np.count_nonzero(np.abs(total - 2.0 * (flips @ d)) >= threshold))
    return count / num
  if resamples < 1:
    raise input_error(f"resamples must be >= 1, got {resamples}")
  count, nbytes = 0, (n + 7) // 8
  for lo in range(0, resamples, rows):
    m = min(rows, resamples - lo)
    packed = rng.integers(0, 256, size=(m, nbytes), dtype=np.uint8)
    flips = np.unpackbits(packed, axis=1, count=n).astype(np.float64)
    count += int(np.count_nonzero(np.abs(total - 2.0 * (flips @ d)) >= threshold))
  return (count + 1) / (resamples + 1)


def _constant(d: np.ndarray) -> bool:
  """Whether every difference equals the first (sd is then 0 exactly, not a rounding residue)."""
  return bool(np.all(d == d[0]))


def t_test_p(d: np.ndarray) -> float:
  """Two-sided paired t-test p-value of mean(d) = 0, with n - 1 degrees of freedom.

  Equals `scipy.stats.ttest_rel(a, b).pvalue` for `d = a - b`, except where that is undefined:
  all differences 0 gives 1, all differences equal and nonzero gives 0.

  Args:
    d: `[n]` per-query differences, n >= 2.

  Returns:
    The p-value in [0, 1].
  """
  d = np.asarray(d, np.float64)
  if _constant(d):
    return 1.0 if d[0] == 0 else 0.0
  n = d.shape[0]
  t = float(d.mean()) / (float(d.std(ddof=1)) / math.sqrt(n))
  return float(min(1.0, 2.0 * scipy_stats.t.sf(abs(t), n - 1)))


def effect_size(d: np.ndarray) -> float:
  """Cohen's d_z = mean(d) / sd(d) (ddof=1); 0 when all d are 0, ±inf when all equal nonzero."""
  d = np.asarray(d, np.float64)
  if _constant(d):
    return 0.0 if d[0] == 0 else math.copysign(math.inf, float(d[0]))
  return float(d.mean()) / float(d.std(ddof=1))


def bootstrap_ci(d: np.ndarray, *, rng: np.random.Generator, resamples: int = 10_000,
                 alpha: float = 0.05) -> list[float]:
  """Percentile bootstrap CI of mean(d), resampling queries with replacement.

  Args:
    d: `[n]` per-query differences.
    rng: the generator for the resampled query indices.
    resamples: bootstrap replicates B; index matrices of `[rows, n]` are drawn in chunks.
    alpha: the CI has level 1 - alpha (quantiles alpha/2 and 1 - alpha/2, linear interpolation).

  Returns:
    `[lo, hi]` as Python floats.
  """
  if resamples < 1:
    raise input_error(f"bootstrap must be >= 1, got {resamples}")
  if not 0.0 < alpha < 1.0:
    raise input_error(f"alpha must be in (0, 1), got {alpha}")
  d = np.asarray(d, np.float64)
  n = d.shape[0]
  rows = max(1, _CHUNK_ELEMENTS // max(n, 1))
  means = np.empty(resamples, np.float64)
  for lo in range(0, resamples, rows):
    m = min(rows, resamples - lo)
    idx = rng.integers(0, n, size=(m, n))
    means[lo:lo + m] = d[idx].mean(axis=1)
  lo_q, hi_q = np.quantile(means, [alpha / 2.0, 1.0 - alpha / 2.0])
  return [float(lo_q), float(hi_q)]


def _finite_or_none(x: float) -> float | None:
  """JSON has no infinity: an effect size of ±inf (all differences equal) is reported as None."""
  return x if math.isfinite(x) else None


def paired(a: Mapping[Any, float] | Sequence[float] | np.ndarray,
           b: Mapping[Any, float] | Sequence[float] | np.ndarray, *, seed: int,
           resamples: int = 10_000, bootstrap: int = 10_000, alpha: float = 0.05,
           exact_max_n: int = EXACT_MAX_N) -> dict[str, Any]:
  """Paired comparison of model A against baseline B over the same queries.

  Args:
    a: metric value per query of A: `{query_id: value}` or `[n]` (paired by position).
    b: the same for B; dicts must have exactly the same query ids (paired in sorted id order).
    seed: non-negative int; the sign flips and the bootstrap draw from two streams spawned from it.
    resamples: Monte Carlo sign vectors of the randomization test (n > exact_max_n).
    bootstrap: bootstrap replicates of the CI.
    alpha: 1 - the CI level (the `ci95` key holds the 95% CI at the default 0.05).
    exact_max_n: the randomization test is exact (all 2^n sign vectors) up to this n.

  Returns:
    JSON-able `{"diff": mean(a - b), "ci95": [lo, hi], "p_perm": float, "p_t": float,
    "effect_size": float or None (None when all differences are equal and nonzero, where d_z is
    infinite), "n": int}` (plain Python numbers; `apply_holm` adds "p_holm").

  Raises:
    InputError: see `paired_differences`; also a negative or non-int seed, resamples or
      bootstrap < 1, alpha outside (0, 1).
  """
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
    raise input_error(f"seed must be a non-negative int, got {seed!r}")
  if resamples < 1:
    raise input_error(f"resamples must be >= 1, got {resamples}")
  d = paired_differences(a, b)
  perm_seq, boot_seq = np.random.SeedSequence(int(seed)).spawn(2)
  return {
      "diff": float(d.mean()),
      "ci95": bootstrap_ci(d, rng=np.random.default_rng(boot_seq), resamples=bootstrap,
                           alpha=alpha),
      "p_perm": permutation_p(d, rng=np.random.default_rng(perm_seq), resamples=resamples,
                              exact_max_n=exact_max_n),
      "p_t": t_test_p(d),
      "effect_size": _finite_or_none(effect_size(d)),
      "n": int(d.shape[0]),
  }


def holm(p_values: Sequence[float]) -> list[float]:
  """Holm–Bonferroni step-down adjusted p-values, in the input order.

  With the m p-values sorted ascending, p_(1) <= ... <= p_(m), the adjusted value of p_(i) is
  `min(1, max_{j <= i} (m - j + 1) * p_(j))`; reject where adjusted < alpha controls the
  family-wise error rate at alpha.

  Args:
    p_values: m p-values in [0, 1].

  Returns:
    m adjusted p-values (Python floats) in the order given: each >= its raw p, <= 1, and ordered
    as the raw p-values are.

  Raises:
    InputError: a value is not a number in [0, 1].
  """
  p = np.asarray(list(p_values), np.float64)
  if p.ndim != 1:
    raise input_error(f"p-values must be a flat list, got shape {p.shape}")
  bad = np.flatnonzero(~((p >= 0.0) & (p <= 1.0)))
  if bad.size:
    raise input_error(f"p-value {p[bad[0]]!r} at position {int(bad[0])} is not in [0, 1]")
  m = p.shape[0]
  if m == 0:
    return []
  order = np.argsort(p, kind="stable")
  scaled = np.minimum(1.0, (m - np.arange(m)) * p[order])
  adjusted = np.empty(m, np.float64)
  adjusted[order] = np.maximum.accumulate(scaled)
  return [float(x) for x in adjusted]


def apply_holm(comparisons: Sequence[dict[str, Any]], key: str = "p_perm") -> None:
  """Sets `"p_holm"` in each comparison dict (in place): Holm over their `key` p-values.

  Args:
    comparisons: the family of comparisons (dicts from `paired`) corrected together.
    key: which p-value to adjust ("p_perm" or "p_t").
  """
  for comparison, adjusted in zip(comparisons, holm([c[key] for c in comparisons])):
    comparison["p_holm"] = adjusted


def mark(comparison: Mapping[str, Any], alpha: float = 0.05) -> str:
  """Table mark of one comparison: `GAIN` "+", `LOSS` "−" (U+2212) or `TIE` "".

  Significant means p < alpha with p = comparison["p_holm"] if present, else "p_perm"; the
  direction is the sign of comparison["diff"] (a significant diff of 0 is a tie).
  """
  p = comparison["p_holm"] if "p_holm" in comparison else comparison["p_perm"]
  if not p < alpha:
    return TIE
  diff = comparison["diff"]
  return GAIN if diff > 0 else LOSS if diff < 0 else TIE
