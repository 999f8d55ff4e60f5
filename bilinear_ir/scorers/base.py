"""The scorer contract shared by the single-vector families.

Every scorer is a Flax Linen module with params held outside it:

  score_pairs(q: [B, n], d: [B, n]) -> [B]        paired scores
  score_all(q: [B, n], docs: [N, n]) -> [B, N]    every query against every doc
  query_table(q: [B, n]) -> [B, w]                 tables with
  doc_table(docs: [N, n]) -> [N, w]                score_all == query_table(q) @ doc_table(docs).T

so retrieval is maximum inner product search over `doc_table` (any MIPS index can serve it).
"""
from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
from jax import lax


class TableScorer(nn.Module):
  """Base for scorers that factor as an inner product of a query table and a doc table.

  Subclasses define `query_table(q [B, n]) -> [B, w]` and `doc_table(docs [N, n]) -> [N, w]`;
  scoring follows from them.

  Attributes:
    dim: embedding width n.
  """
  dim: int

  def example_inputs(self) -> tuple[jnp.ndarray, jnp.ndarray]:
    """A `(q [1, n], d [1, n])` pair of zeros used to initialise params."""
    return jnp.zeros((1, self.dim), jnp.float32), jnp.zeros((1, self.dim), jnp.float32)

  def __call__(self, q: jnp.ndarray, d: jnp.ndarray) -> jnp.ndarray:
    """Same as `score_pairs`: q [B, n], d [B, n] -> [B]."""
    return self.score_pairs(q, d)

  def score_pairs(self, q: jnp.ndarray, d: jnp.ndarray) -> jnp.ndarray:
    """Paired scores: q [B, n], d [B, n] -> [B]."""
    return jnp.sum(self.query_table(q) * self.doc_table(d), axis=-1)

  def score_all(self, q: jnp.ndarray, docs: jnp.ndarray) -> jnp.ndarray:
    """All pairs: q [B, n], docs [N, n] -> [B, N].

    One dot_general contracting the tables' last axes (not `qt @ dt.T`, which XLA:CPU turns into
    a slower transposed product when differentiated).
    """
    return lax.dot_general(self.query_table(q), self.doc_table(docs), (((1,), (1,)), ((), ())))
