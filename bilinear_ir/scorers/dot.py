"""Dot product and weighted dot product (WDP): `s(q, d) = q^T diag(v) d`."""
from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from bilinear_ir.scorers.base import TableScorer


class Dot(TableScorer):
  """Plain dot product `q^T d`; no parameters. Tables: q [B, n] and docs [N, n] unchanged."""
  registry_name = "dot"

  def query_table(self, q: jnp.ndarray) -> jnp.ndarray:
    """q [B, n] -> [B, n]."""
    return q

  def doc_table(self, docs: jnp.ndarray) -> jnp.ndarray:
    """docs [N, n] -> [N, n]."""
    return docs


class WeightedDot(TableScorer):
  """Weighted dot product `q^T diag(v) d`, `v` [n] initialised to 1 (exactly the dot product).

  Tables: q [B, n] unchanged; docs [N, n] -> `docs * v` [N, n].
  """
  registry_name = "wdp"

  def setup(self):
    self.v = self.param("v", nn.initializers.ones, (self.dim,), jnp.float32)

  def query_table(self, q: jnp.ndarray) -> jnp.ndarray:
    """q [B, n] -> [B, n]."""
    return q

  def doc_table(self, docs: jnp.ndarray) -> jnp.ndarray:
    """docs [N, n] -> docs * v [N, n]."""
    return docs * self.v
