"""Ranking losses. Each takes scores already computed by a scorer and returns a scalar mean.

Shapes: `B` queries in a batch, `C` candidate docs per query (1 positive + negatives).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def margin_ranking_loss(pos: jnp.ndarray, neg: jnp.ndarray, margin: float = 1.0) -> jnp.ndarray:
  """Hinge loss `mean(max(0, margin - (pos - neg)))`, as torch's MarginRankingLoss with y = 1.

  Args:
    pos: [B] scores of the positive docs.
    neg: [B] or [B, M] scores of negatives (each negative compared with its row's positive).
    margin: the required gap; note it is in the units of the scores (embedding-scale dependent).

  Returns:
    scalar.
  """
  if neg.ndim == pos.ndim + 1:
    pos = pos[..., None]
  return jnp.mean(jax.nn.relu(margin - (pos - neg)))


def softmax_cross_entropy(scores: jnp.ndarray, positive: jnp.ndarray,
                          mask: jnp.ndarray | None = None, temperature: float = 1.0
                          ) -> jnp.ndarray:
  """Softmax cross entropy of the positive among candidates (in-batch and sampled negatives).

  Args:
    scores: [B, C] scores of each query against C candidates.
    positive: [B] int, the column of each query's positive.
    mask: optional [B, C] bool, False for candidates to leave out (e.g. another query's
      positive that is also relevant to this query, or padding). The positive must be True.
    temperature: scores are divided by it (scale-free margins for unnormalised embeddings).

  Returns:
    scalar mean of `-log softmax(scores / temperature)[positive]`.
  """
  logits = scores / temperature
  if mask is not None:
    logits = jnp.where(mask, logits, -jnp.inf)
  logp = jax.nn.log_softmax(logits, axis=-1)
  return -jnp.mean(jnp.take_along_axis(logp, positive[:, None], axis=-1)[:, 0])
