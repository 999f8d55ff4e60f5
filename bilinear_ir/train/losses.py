"""Ranking losses. Each takes scores already computed by a scorer and returns a scalar mean.

Shapes: `B` queries in a batch, `C` candidate docs per query (1 positive + negatives).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
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
  # A one-hot select rather than a gather: the same value, and its gradient is elementwise
  # (a gather's is a scatter into a zero [B, C] buffer, ~6% of a CPU train step).
  hit = jnp.arange(logp.shape[-1])[None, :] == positive[:, None]
  return -jnp.mean(jnp.sum(jnp.where(hit, logp, 0.0), axis=-1))


def corpus_softmax_cross_entropy(positive: jnp.ndarray, chunk_scores, docs: jnp.ndarray,
                                 excluded: jnp.ndarray, temperature: float, chunk: int
                                 ) -> jnp.ndarray:
  """Softmax cross entropy of each query's positive against every doc of the corpus, exact.

  Query b's loss is `log(exp(p_b / t) + sum_j exp(s_bj / t)) - p_b / t` over the corpus docs j
  not in `excluded[b]` (its judged-relevant docs, the positive included, which enters once as
  `positive`): `softmax_cross_entropy` over the whole corpus with the same mask. The log-sum-exp
  runs over doc chunks (a scan with a running max; each chunk's scores are recomputed in the
  backward pass, `jax.checkpoint`), so memory holds one [B, chunk] block of scores (and its
  [B, chunk, R] comparisons with `excluded`), never [B, N], and the gradient is exact.

  Args:
    positive: [B] score of each query's positive (it may lie outside `docs`).
    chunk_scores: docs chunk [c, ...] -> [B, c] scores of the batch's queries against it
      (e.g. `query_table(q) @ doc_table(chunk).T`).
    docs: [N, ...] the corpus.
    excluded: [B, R] int doc rows left out of query b's negatives (-1: none).
    temperature: scores are divided by it.
    chunk: docs per chunk (>= 1; N if larger).

  Returns:
    scalar mean over the batch.
  """
  n = docs.shape[0]
  chunk = min(chunk, n)
  pos = positive / temperature

  @jax.checkpoint
  def body(carry, first):
    m, s = carry  # [B] running max (held constant in the gradient) and sum of exp(x - m)
    # The last chunk is slid back to end at row n (no padded copy of the docs); its rows before
    # `first`, counted by the chunk before, are left out.
    start = jnp.minimum(first, n - chunk)
    cols = start + jnp.arange(chunk)  # [c] doc rows of the chunk
    valid = (cols >= first)[None, :] & ~jnp.any(cols[None, :, None] == excluded[:, None, :],
                                                axis=-1)
    block = jax.lax.dynamic_slice_in_dim(docs, start, chunk)
    x = jnp.where(valid, chunk_scores(block) / temperature, -jnp.inf)  # [B, c]
    m_new = jax.lax.stop_gradient(jnp.maximum(m, jnp.max(x, axis=-1)))
    s = s * jnp.exp(m - m_new) + jnp.sum(jnp.exp(x - m_new[:, None]), axis=-1)
    return (m_new, s), None

  # The positive starts the sum: the max is finite from the start and the sum >= 1.
  m0 = jax.lax.stop_gradient(pos)
  (m, s), _ = jax.lax.scan(body, (m0, jnp.exp(pos - m0)), jnp.arange(0, n, chunk))
  return jnp.mean(m + jnp.log(s) - pos)


# Distillation losses of the LITE paper (appendix A.2). Candidates follow softmax_cross_entropy's
# layout: [B, C] scores, `positive` [B] the positive's column, optional [B, C] bool mask. The
# one-hot cross entropy over 1 positive + negatives of its Table 5 is softmax_cross_entropy itself.


def kl_distillation_loss(student: jnp.ndarray, teacher: jnp.ndarray,
                         mask: jnp.ndarray | None = None, temperature: float = 1.0
                         ) -> jnp.ndarray:
  """KL(p_teacher || p_student) between softmaxes over each query's candidates (A.2 "KL loss").

  Args:
    student: [B, C] student scores.
    teacher: [B, C] teacher scores (e.g. a cross-encoder's), treated as constants.
    mask: optional [B, C] bool, False for candidates left out of both distributions.
    temperature: both score sets are divided by it before the softmax (no T^2 factor).

  Returns:
    scalar mean over queries of `sum_c p_t[c] (log p_t[c] - log p_s[c])`.
  """
  s = student / temperature
  t = jax.lax.stop_gradient(teacher) / temperature
  if mask is not None:
    s = jnp.where(mask, s, -jnp.inf)
    t = jnp.where(mask, t, -jnp.inf)
  log_ps = jax.nn.log_softmax(s, axis=-1)
  log_pt = jax.nn.log_softmax(t, axis=-1)
  terms = jnp.exp(log_pt) * (log_pt - log_ps)
  if mask is not None:
    terms = jnp.where(mask, terms, 0.0)
  return jnp.mean(jnp.sum(terms, axis=-1))


def margin_mse_loss(student: jnp.ndarray, teacher: jnp.ndarray, positive: jnp.ndarray,
                    mask: jnp.ndarray | None = None) -> jnp.ndarray:
  """Margin MSE (A.2): sum over negatives i of ((t_pos - t_i) - (s_pos - s_i))^2.

  With C = 2 (positive, one negative) this is the triplet form ((t+ - t-) - (s+ - s-))^2; with
  more columns it is the multi-negative form (a sum, not a mean, over the negatives).

  Args:
    student: [B, C] student scores.
    teacher: [B, C] teacher scores, treated as constants.
    positive: [B] int, the column of each query's positive.
    mask: optional [B, C] bool, False for candidates that are not negatives of that query.

  Returns:
    scalar mean over queries.
  """
  teacher = jax.lax.stop_gradient(teacher)
  s_pos = jnp.take_along_axis(student, positive[:, None], axis=-1)
  t_pos = jnp.take_along_axis(teacher, positive[:, None], axis=-1)
  sq = jnp.square((t_pos - teacher) - (s_pos - student))
  negative = jnp.arange(student.shape[-1])[None, :] != positive[:, None]
  if mask is not None:
    negative = negative & mask
  return jnp.mean(jnp.sum(jnp.where(negative, sq, 0.0), axis=-1))


def mol_load_balancing_loss(gates: jnp.ndarray, mask: jnp.ndarray | None = None) -> jnp.ndarray:
  """MoL's mutual-information load-balancing loss L_MI = -H(p) + H(p | (q, x)) (paper 003, eq. 3).

  `p` is the gate distribution averaged over the (query, item) pairs of the batch (its entropy
  high = the P logits share the load) and `H(p | (q, x))` the mean per-pair entropy (low = each
  pair uses few logits). The training loss (eq. 4) is
  `softmax_cross_entropy(scores, ...) + alpha * mol_load_balancing_loss(gates)`, alpha = 0.001 in
  the paper (`Mol.mi_weight`), with `scores, gates = Mol.score_all_with_gates(q, docs)` (or
  `Mol.gates` in the trainer's `aux_loss` hook). Natural log; 0 * log 0 = 0.

  Args:
    gates: [B, N, P] or [M, P] gating distributions (rows sum to 1).
    mask: optional [B, N] or [M] bool, False for pairs to leave out (padding).

  Returns:
    scalar in [-log P, log P].
  """
  num_p = gates.shape[-1]
  g = gates.reshape(-1, num_p)
  w = jnp.ones(g.shape[:1], g.dtype) if mask is None else mask.reshape(-1).astype(g.dtype)
  w = w / jnp.maximum(jnp.sum(w), 1.0)
  tiny = jnp.finfo(g.dtype).tiny
  neg_entropy = lambda x: jnp.sum(x * jnp.log(jnp.maximum(x, tiny)), axis=-1)  # -H, finite grads
  p = jnp.sum(w[:, None] * g, axis=0)
  return neg_entropy(p) - jnp.sum(w * neg_entropy(g))


@dataclasses.dataclass(frozen=True)
class MiLoss:
  """The trainer's `aux_loss` for MoL: `mi_weight * L_MI` of the batch's gates.

  A frozen dataclass compares and hashes by its module, so runs of the same MoL configuration
  (other seeds) reuse the compiled train step.

  Attributes:
    module: the `Mol` scorer being trained (its `mi_weight` is alpha).
  """
  module: nn.Module

  def __call__(self, params: Any, q: tuple, docs: tuple) -> jnp.ndarray:
    """q ([B, n],), docs ([C, n],) -> alpha * L_MI over the B x C gates (B, C, P)."""
    gates = self.module.apply({"params": params}, *q, *docs, method=self.module.gates)
    return self.module.mi_weight * mol_load_balancing_loss(gates)


def mi_loss(module: nn.Module) -> MiLoss | None:
  """The `aux_loss` of a MoL scorer, None when its `mi_weight` is 0 (no extra forward pass)."""
  return MiLoss(module) if module.mi_weight > 0 else None
