"""Residual query adapter: `s(q, d) = <q + f(q), d>`, a nonlinear similarity that never touches
the index.

`f` is a two-layer MLP n -> hidden -> n with SiLU between; its last layer (kernel and bias) starts
at zero, so `f(q) = 0` and step 0 is exactly the dot product (the upgrade path of the table
scorers), while the first layer's random features give that last layer a non-zero gradient (as
LoRA's zero factor does). Documents are scored by their unchanged embeddings, so the doc table is
the raw embedding table: an existing index of the docs serves the adapter as it is, with the whole
change on the query side. Unlike the bilinear family, `f` is not a linear map, so the adapter has
no matrix form (`base.table_matrices` refuses it once `f` is no longer zero).

Tables: `query_table(q [B, n]) = q + f(q)` [B, n], `doc_table(docs [N, n]) = docs` [N, n]; exact
top-k and the doc indexes work on them unchanged.
"""
from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from bilinear_ir.errors import require
from bilinear_ir.scorers.base import TableScorer


class QueryAdapter(TableScorer):
  """`<q + f(q), d>` with `f` = Dense(n, zero init)(silu(Dense(hidden)(q))).

  Attributes:
    hidden: hidden width of `f`.
  """
  registry_name = "adapter"

  hidden: int = 256

  def setup(self):
    require(int(self.hidden) == self.hidden and self.hidden >= 1,
            f"must be an integer >= 1, got {self.hidden!r}", field="model.hidden")
    self.hidden_layer = nn.Dense(self.hidden, name="hidden")
    self.out = nn.Dense(self.dim, kernel_init=nn.initializers.zeros, name="out")

  def query_table(self, q: jnp.ndarray) -> jnp.ndarray:
    """q [B, n] -> q + f(q) [B, n]."""
    return q + self.out(nn.silu(self.hidden_layer(q)))

  def doc_table(self, docs: jnp.ndarray) -> jnp.ndarray:
    """docs [N, n] -> docs [N, n] (unchanged)."""
    return docs
