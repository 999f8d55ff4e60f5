"""The task itself: queries on the hypercube, critical pairs, the four documents, success.

An instance is a query `q` in {-1, +1}^n and a critical pair `I0 = {i1, i2}` (an index into
`pairs(n)`). Its indicator `e` in {-1, +1}^n is +1 on I0 and -1 elsewhere, and its documents are

  d1 = q,  d2 = q * e   (agree with q on I0)      d3 = -q,  d4 = -(q * e)   (disagree on I0).

A scorer solves the instance when both agreeing documents score strictly above both disagreeing
ones: `min(s1, s2) > max(s3, s4)`.
"""
from __future__ import annotations

import functools
import itertools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

def pairs(n: int) -> np.ndarray:
  """All critical pairs `(i1, i2)`, i1 < i2, in lexicographic order: [n (n - 1) / 2, 2] int32."""
  return np.array(list(itertools.combinations(range(n), 2)), np.int32).reshape(-1, 2)


def all_queries(n: int) -> np.ndarray:
  """Every query of the hypercube: [2^n, n] float32 in {-1, +1}, row k = bits of k (MSB first)."""
  bits = (np.arange(2 ** n)[:, None] >> np.arange(n - 1, -1, -1)[None, :]) & 1
  return (2.0 * bits - 1.0).astype(np.float32)


def indicator(pair: np.ndarray, n: int) -> np.ndarray:
  """`e_I0`: pair [..., 2] int -> [..., n] float32, +1 on the pair and -1 elsewhere."""
  pair = np.asarray(pair)
  e = -np.ones(pair.shape[:-1] + (n,), np.float32)
  np.put_along_axis(e, pair.astype(np.int64), 1.0, axis=-1)
  return e


def documents(q: jnp.ndarray, e: jnp.ndarray) -> jnp.ndarray:
  """The four documents: q [B, n], e [B, n] -> [B, 4, n] as (q, q*e, -q, -(q*e))."""
  qe = q * e
  return jnp.stack([q, qe, -q, -qe], axis=1)


def sample_instances(key: jax.Array, num: int, n: int, pair_choices: np.ndarray | None = None
                     ) -> tuple[jnp.ndarray, jnp.ndarray]:
  """Random instances: q uniform on {-1, +1}^n, I0 uniform over `pair_choices`.

  Args:
    key: a jax.random key.
    num: number of instances B.
    n: dimension.
    pair_choices: [C] indices into `pairs(n)` to draw I0 from; None means all pairs.

  Returns:
    q [B, n] float32 and pair index [B] int32 (into `pairs(n)`).
  """
  choices = np.arange(n * (n - 1) // 2) if pair_choices is None else np.asarray(pair_choices)
  q, draw = _sample(key, jnp.int32(choices.shape[0]), num, n)
  return q, jnp.asarray(choices.astype(np.int32))[draw]


@functools.partial(jax.jit, static_argnums=(2, 3))
def _sample(key: jax.Array, num_choices: jnp.ndarray, num: int, n: int
            ) -> tuple[jnp.ndarray, jnp.ndarray]:
  """q [num, n] uniform on {-1, +1}^n and [num] ints uniform in [0, num_choices).

  Two random 32-bit words per instance: q_k = bit k of the first (n <= 32); the second modulo
  num_choices (bias below num_choices / 2^32). `random.bits` compiles far faster on CPU than
  `bernoulli` / `randint`.
  """
  words = jax.random.bits(key, (num, 2), jnp.uint32)
  bit = (words[:, :1] >> jnp.arange(n, dtype=jnp.uint32)[None, :]) & 1
  q = 2.0 * bit.astype(jnp.float32) - 1.0
  return q, (words[:, 1] % num_choices.astype(jnp.uint32)).astype(jnp.int32)


def instance_scores(module: nn.Module, params: Any, q: jnp.ndarray, e: jnp.ndarray
                    ) -> jnp.ndarray:
  """Scores of the four documents under one scorer: q [B, n], e [B, n] -> [B, 4].

  `module` is a single-vector scorer from `bilinear_ir.scorers` (its `score_pairs`).
  """
  docs = documents(q, e)
  b, k, n = docs.shape
  queries = jnp.broadcast_to(q[:, None, :], docs.shape).reshape(b * k, n)
  s = module.apply({"params": params}, queries, docs.reshape(b * k, n), method=module.score_pairs)
  return s.reshape(b, k)


def per_instance_scores(module: nn.Module, params: Any, q: jnp.ndarray, e: jnp.ndarray
                        ) -> jnp.ndarray:
  """Like `instance_scores` with one parameter set per instance (leading axis B): -> [B, 4].

  Used for the constructed models `W_I0` / `v = 1 on I0`, which depend on the instance's I0.
  """
  one = lambda p, qi, ei: instance_scores(module, p, qi[None], ei[None])[0]
  return jax.vmap(one)(params, q, e)


def solved(scores: jnp.ndarray) -> jnp.ndarray:
  """Success per instance: scores [B, 4] -> [B] bool, `min(s1, s2) > max(s3, s4)` (strict).

  Works on numpy and jax arrays alike.
  """
  return scores[:, :2].min(axis=1) > scores[:, 2:].max(axis=1)


def wilson_interval(successes: int, total: int, level: float = 0.95) -> tuple[float, float]:
  """Wilson score interval for a binomial proportion.

  `(p + z^2/2m -+ z sqrt(p (1 - p)/m + z^2/4m^2)) / (1 + z^2/m)` with p = successes/m, m = total,
  z the two-sided normal quantile of `level` (1.95996... for 0.95).

  Returns:
    (lower, upper) in [0, 1]; exactly 0 / 1 at 0 / all successes (where the formula gives them
    up to rounding).
  """
  if total <= 0:
    raise ValueError(f"wilson_interval needs total >= 1, got {total}")
  z = float(stats.norm.ppf(0.5 + level / 2.0))
  p = successes / total
  denom = 1.0 + z * z / total
  center = p + z * z / (2.0 * total)
  half = z * math.sqrt(p * (1.0 - p) / total + z * z / (4.0 * total * total))
  lo = 0.0 if successes == 0 else max(0.0, (center - half) / denom)  # exact at the ends
  hi = 1.0 if successes == total else min(1.0, (center + half) / denom)
  return lo, hi


def summarize(scores: np.ndarray | jnp.ndarray) -> dict[str, Any]:
  """A results row from scores [B, 4]: success rate, Wilson 95% interval, n, score statistics.

  Returns:
    `{"success", "ci95": [lo, hi], "n", "successes", "mean_agreeing", "mean_disagreeing",
    "min_gap"}`, where `min_gap` = min over instances of `min(s1, s2) - max(s3, s4)`
    (> 0 iff every instance is solved).
  """
  scores = np.asarray(scores, np.float64)
  ok = solved(scores)
  wins, total = int(ok.sum()), int(ok.shape[0])
  lo, hi = wilson_interval(wins, total)
  gap = np.min(scores[:, :2], axis=1) - np.max(scores[:, 2:], axis=1)
  return {
      "success": wins / total,
      "ci95": [lo, hi],
      "n": total,
      "successes": wins,
      "mean_agreeing": float(scores[:, :2].mean()),
      "mean_disagreeing": float(scores[:, 2:].mean()),
      "min_gap": float(gap.min()),
  }


def instance_codes(q: np.ndarray | jnp.ndarray, pair_index: np.ndarray | jnp.ndarray,
                   num_pairs: int) -> np.ndarray:
  """A unique integer per (q, I0) instance: q [B, n] in {-1, +1}, pair_index [B] -> [B] int64."""
  q = np.asarray(q)
  bits = (q > 0).astype(np.int64)
  weights = 2 ** np.arange(q.shape[1] - 1, -1, -1, dtype=np.int64)
  return (bits @ weights) * num_pairs + np.asarray(pair_index, np.int64)
