"""The scorer contract shared by the single-vector families.

Every scorer is a Flax Linen module with params held outside it:

  score_pairs(q: [B, n], d: [B, n]) -> [B]        paired scores
  score_all(q: [B, n], docs: [N, n]) -> [B, N]    every query against every doc
  query_table(q: [B, n]) -> [B, w]                 tables with
  doc_table(docs: [N, n]) -> [N, w]                score_all == query_table(q) @ doc_table(docs).T

so retrieval is maximum inner product search over `doc_table` (any MIPS index can serve it).
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from bilinear_ir.errors import input_error


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


# `jax.default_matmul_precision` of every table read behind an export: float32 products and sums
# on every backend (the default is TF32 on recent NVIDIA GPUs and one bf16 pass on TPUs, which
# would ship rounded matrices or fail the linearity check below).
EXPORT_PRECISION = "float32"


def table_fn(module: TableScorer, method: str):
  """`module.<method>` ("query_table" / "doc_table") jitted with every matmul at float32 on every
  backend: (params, x [N, n]) -> [N, w]. Used for every table read behind an export."""
  def _table_read(params, x):
    with jax.default_matmul_precision(EXPORT_PRECISION):
      return module.apply({"params": params}, x, method=getattr(module, method))
  return jax.jit(_table_read)


def table_matrices(module: TableScorer, params: Any) -> tuple[np.ndarray, np.ndarray]:
  """The matrices of a linear table scorer: (A [n, w], B [n, w]) with
  `query_table(q) = q A` and `doc_table(d) = d B` (dot: I, I; WDP: I, diag(v); bilinear: I, W^T;
  low-rank: P, Q, or [I P], [I Q] for the residual form), so `score = q A B^T d^T`.

  Read off the tables of the identity rows, then checked on random rows (a scorer whose tables
  are not linear maps, e.g. a future one with a bias or a nonlinearity, is refused). Both the
  read and the check run at float32 on every backend (`table_fn`).
  """
  query, doc = table_fn(module, "query_table"), table_fn(module, "doc_table")
  eye = np.eye(module.dim, dtype=np.float32)
  a = np.asarray(query(params, eye), np.float64)
  b = np.asarray(doc(params, eye), np.float64)
  x = np.random.default_rng(0).normal(size=(8, module.dim)).astype(np.float32)
  for got, want, side in ((query(params, x), x @ a, "query_table"),
                          (doc(params, x), x @ b, "doc_table")):
    got = np.asarray(got, np.float64)
    if not np.allclose(got, want, rtol=1e-4, atol=1e-5 * (1.0 + np.abs(want).max())):
      raise input_error(f"{type(module).__name__}.{side} is not a linear map; it cannot be "
                        "exported as a matrix", file="model", field="scorer")
  return a.astype(np.float32), b.astype(np.float32)
