"""Fitting a scorer on the agreement task with the margin ranking loss (AdamW, jit'd scan).

Two protocols:

* "all_pairs": every (agreeing, disagreeing) pair of an instance, (d1, d3), (d1, d4), (d2, d3),
  (d2, d4), each with `max(0, margin - (s_pos - s_neg))`.
* "public": the protocol of a public implementation of the paper: the model only ever sees the
  triple (q, pos = q, neg = -q). I0 never enters the loss, so nothing can be learned about it.

One epoch = a fresh permutation of the N training instances cut into `N // batch_size` full
batches (the remainder of an epoch is dropped; the next permutation differs), run as one
`lax.scan`. Several models with the same data shape (e.g. one per fixed I0) train together under
`jax.vmap`.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from bilinear_ir.synthetic import task
from bilinear_ir.train.losses import margin_ranking_loss

@dataclasses.dataclass(frozen=True)
class TrainSpec:
  """Optimisation settings (hashable: one compiled epoch per distinct spec and data shape).

  Attributes:
    batch_size: instances per step (each contributes 4 pairs under "all_pairs", 1 under "public").
    learning_rate: AdamW step size.
    weight_decay: AdamW decoupled weight decay.
    margin: the hinge margin of the ranking loss.
    protocol: "all_pairs" or "public" (see the module docstring).
  """
  batch_size: int = 128
  learning_rate: float = 1e-3
  weight_decay: float = 1e-2
  margin: float = 1.0
  protocol: str = "all_pairs"

  def optimizer(self) -> optax.GradientTransformation:
    """AdamW with this spec's step size and weight decay."""
    return optax.adamw(self.learning_rate, weight_decay=self.weight_decay)


def loss(module: nn.Module, params: Any, q: jnp.ndarray, e: jnp.ndarray, spec: TrainSpec
         ) -> jnp.ndarray:
  """Mean margin ranking loss of a batch: q [B, n], e [B, n] -> scalar."""
  if spec.protocol == "public":
    pos = module.apply({"params": params}, q, q, method=module.score_pairs)
    neg = module.apply({"params": params}, q, -q, method=module.score_pairs)
    return margin_ranking_loss(pos, neg, spec.margin)
  s = task.instance_scores(module, params, q, e)  # [B, 4]
  neg = jnp.broadcast_to(s[:, None, 2:], (s.shape[0], 2, 2))  # each of d1, d2 vs d3 and d4
  return margin_ranking_loss(s[:, :2], neg, spec.margin)


@functools.partial(jax.jit, static_argnums=(1, 2))
def epoch_order(key: jax.Array, num: int, batch_size: int) -> jnp.ndarray:
  """One epoch's batches: [num // batch_size, batch_size] int32 from a permutation of range(num).

  The remainder of the permutation is dropped. Kept out of the epoch step so that its compilation
  is shared by every model trained on `num` instances.
  """
  steps = num // batch_size
  return jax.random.permutation(key, num)[:steps * batch_size].reshape(steps, batch_size)


@functools.lru_cache(maxsize=None)
def _epoch_fn(module: nn.Module, spec: TrainSpec, stacked: bool) -> Callable[..., Any]:
  """The jit'd epoch of `module` under `spec`, one `lax.scan` over the batches of `order`.

  `(params, opt_state, q [N, n], e [N, n], order [S, batch]) -> (params, opt_state, mean loss)`;
  with `stacked`, every argument has a leading model axis K.
  """
  tx = spec.optimizer()
  grad_fn = jax.value_and_grad(lambda p, qb, eb: loss(module, p, qb, eb, spec))

  def epoch(params, opt_state, q, e, order):
    def step(carry, idx):
      p, s = carry
      value, grads = grad_fn(p, q[idx], e[idx])
      updates, s = tx.update(grads, s, p)
      return (optax.apply_updates(p, updates), s), value

    (params, opt_state), values = jax.lax.scan(step, (params, opt_state), order)
    return params, opt_state, jnp.mean(values)

  return jax.jit(jax.vmap(epoch) if stacked else epoch)


def fit(module: nn.Module, params: Any, q: jnp.ndarray, e: jnp.ndarray, key: jax.Array,
        epochs: int, spec: TrainSpec, stacked: bool = False) -> tuple[Any, list[Any]]:
  """Trains `params` for `epochs` passes over the instances.

  Args:
    module: a single-vector scorer from `bilinear_ir.scorers`.
    params: its initial parameters ([K, ...] leaves when `stacked`).
    q: [N, n] training queries ([K, N, n] when stacked).
    e: [N, n] their I0 indicators (`task.indicator`); unused by the "public" protocol.
    key: a jax.random key (a [K] array of keys when stacked) for the epoch permutations.
    epochs: passes over the data.
    spec: optimisation settings; requires N >= spec.batch_size.
    stacked: train K models at once (vmapped), e.g. one per fixed I0.

  Returns:
    (trained params, mean training loss per epoch: a list of floats, or of K-lists).
  """
  tx = spec.optimizer()
  opt_state = jax.vmap(tx.init)(params) if stacked else tx.init(params)
  epoch = _epoch_fn(module, spec, stacked)
  num = q.shape[-2]
  history = []
  for k in range(epochs):
    if stacked:
      order = jnp.stack([epoch_order(jax.random.fold_in(kk, k), num, spec.batch_size)
                         for kk in key])
    else:
      order = epoch_order(jax.random.fold_in(key, k), num, spec.batch_size)
    params, opt_state, value = epoch(params, opt_state, q, e, order)
    history.append(jax.device_get(value))
  return params, [v.tolist() if stacked else float(v) for v in history]
