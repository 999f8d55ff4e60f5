"""Bilinear similarities `s(q, d) = q^T W d`: full `W` and low-rank `W = P Q^T` (+ residual).

Full `W` starts at the identity, so step 0 is exactly the dot product (Theorem 1, inclusion).
Low-rank `W = P Q^T` may add a residual: `W = I + P Q^T` or `W = diag(v) + P Q^T`; with `Q = 0` at
init (P random, as LoRA does) those also start exactly at the dot product.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bilinear_ir.errors import require
from bilinear_ir.scorers.base import TableScorer

RESIDUALS = ("none", "identity", "diag")
LOWRANK_INITS = ("random", "orthogonal", "pca")


class Bilinear(TableScorer):
  """Full bilinear `q^T W d`, `W` [n, n] initialised to the identity.

  Tables: q [B, n] unchanged; docs [N, n] -> `docs @ W.T` [N, n].
  """
  registry_name = "bilinear"

  def setup(self):
    self.W = self.param("W", lambda key, shape: jnp.eye(shape[0], dtype=jnp.float32),
                        (self.dim, self.dim))

  def query_table(self, q: jnp.ndarray) -> jnp.ndarray:
    """q [B, n] -> [B, n]."""
    return q

  def doc_table(self, docs: jnp.ndarray) -> jnp.ndarray:
    """docs [N, n] -> W d for each doc, [N, n]."""
    return docs @ self.W.T

  def score_all(self, q: jnp.ndarray, docs: jnp.ndarray) -> jnp.ndarray:
    """q [B, n], docs [N, n] -> [B, N] as `(q W) docs^T`: n^2 B flops instead of n^2 N, the
    cheaper order whenever there are more candidates than queries (training batches)."""
    return (q @ self.W) @ docs.T


def _orthonormal(key: jax.Array, shape: tuple[int, int]) -> jnp.ndarray:
  """[n, r] with orthonormal columns (QR of a Gaussian)."""
  q, r = jnp.linalg.qr(jax.random.normal(key, shape, jnp.float32))
  return q * jnp.sign(jnp.diagonal(r))[None, :]


class LowRank(TableScorer):
  """Low-rank bilinear `q^T (R + P Q^T) d` with P, Q [n, r] and residual R in {0, I, diag(v)}.

  Attributes:
    rank: r, the width of P and Q.
    residual: "none" (W = P Q^T, the paper's form), "identity" (W = I + P Q^T) or
      "diag" (W = diag(v) + P Q^T, v [n] initialised to 1).
    factor_init: for residual "none": "orthogonal" (P = Q with orthonormal columns, so W starts as
      the projection onto a random r-dim subspace), "random" (P, Q ~ N(0, 1/n)) or "pca" (the
      trainer sets P = Q = the top-r principal directions of the training docs, see
      `lowrank.pca_factors`; as a bare module it starts like "orthogonal"). With a
      residual, P ~ N(0, 1/n) and Q = 0 so that W starts at the residual (the dot product).
      To start from the SVD of a trained W use `bilinear_ir.lowrank.lowrank_params`.

  Tables: width r for "none" (`q P`, `d Q`); width n + r otherwise (`[q, q P]`, `[R d, d Q]`).
  """
  registry_name = "lowrank"

  rank: int = 32
  residual: str = "none"
  factor_init: str = "orthogonal"

  def setup(self):
    require(self.rank >= 1, f"must be >= 1, got {self.rank}", field="model.rank")
    require(self.residual in RESIDUALS, f"must be one of {RESIDUALS}, got {self.residual!r}",
            field="model.residual")
    require(self.factor_init in LOWRANK_INITS,
            f"must be one of {LOWRANK_INITS}, got {self.factor_init!r}", field="model.factor_init")
    n, r = self.dim, self.rank
    normal = nn.initializers.normal(stddev=n ** -0.5)
    if self.residual != "none":
      self.P = self.param("P", normal, (n, r), jnp.float32)
      self.Q = self.param("Q", nn.initializers.zeros, (n, r), jnp.float32)
    elif self.factor_init in ("orthogonal", "pca"):
      self.P = self.param("P", _orthonormal, (n, r))
      p0 = self.P
      self.Q = self.param("Q", lambda key, shape: jnp.array(p0), (n, r))  # Q = P at init.
    else:
      self.P = self.param("P", normal, (n, r), jnp.float32)
      self.Q = self.param("Q", normal, (n, r), jnp.float32)
    if self.residual == "diag":
      self.v = self.param("v", nn.initializers.ones, (n,), jnp.float32)

  def query_table(self, q: jnp.ndarray) -> jnp.ndarray:
    """q [B, n] -> [B, r] (`q P`) or [B, n + r] (`[q, q P]`)."""
    qp = q @ self.P
    return qp if self.residual == "none" else jnp.concatenate([q, qp], axis=-1)

  def doc_table(self, docs: jnp.ndarray) -> jnp.ndarray:
    """docs [N, n] -> [N, r] (`d Q`) or [N, n + r] (`[R d, d Q]`)."""
    dq = docs @ self.Q
    if self.residual == "none":
      return dq
    rd = docs * self.v if self.residual == "diag" else docs
    return jnp.concatenate([rd, dq], axis=-1)
