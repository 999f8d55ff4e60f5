"""Multi-vector documents: ME-BERT (Luan et al., TACL 2021, section 3) and doc-token reduction.

ME-BERT represents a query by one vector and a document by its first m token vectors; the score
is the largest inner product between the query vector and the m document vectors,

    s(q, d) = max_{j <= m} <f(q), h_j(d)>.

Retrieval stays maximum inner product search: the doc table holds m rows per document (`doc_table`),
a MIPS engine returns the best rows, and a max over rows with the same doc id gives the document
scores (the best row of the best document is the best row overall).

`TokenReduction` shrinks what a late-interaction scorer stores per document (LITE paper, 4.4):
L2 doc tokens of width P become L2' tokens (keep the first, average-pool adjacent tokens, or a
learned linear map over token positions) of width P' (a learned linear map shared by query and doc
tokens). `bytes_per_doc` / `storage_table` report what a setting costs per stored document.

Inputs are token-level encoder outputs: vectors [B, T, n] with a bool mask [B, T] (True = a real
token). Masked tokens never reach arithmetic (they are zeroed first), never win a max (-inf before
the max) and never enter a sum or an average.
"""
from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from bilinear_ir.errors import require

QUERY_POOLS = ("cls", "mean")
DOC_REDUCTIONS = ("first", "avgpool", "linear")


def l2_normalize(x: jnp.ndarray, eps: float = 1e-12) -> jnp.ndarray:
  """x [..., d] / max(|x|, eps) along the last axis (zero vectors, e.g. padding, stay zero).

  The norm is sqrt(max(|x|^2, eps^2)), never sqrt(0): `jnp.linalg.norm` of a zero vector has a
  NaN gradient, which made every training step over padded tokens non-finite (the optimiser then
  skips it, so a normalised projection never trained).
  """
  return x / jnp.sqrt(jnp.maximum(jnp.sum(jnp.square(x), axis=-1, keepdims=True), eps * eps))


def zero_padding(x: jnp.ndarray, mask: jnp.ndarray) -> jnp.ndarray:
  """Sets masked token vectors to 0 so padding values (even inf/nan) never reach arithmetic.

  Args:
    x: [..., T, n] token vectors.
    mask: [..., T] bool, True for real tokens.

  Returns:
    [..., T, n], equal to `x` on real tokens and 0 on padding.
  """
  return jnp.where(mask[..., None], x, jnp.zeros((), x.dtype))


class MEBERT(nn.Module):
  """ME-BERT: query vector vs. the first m doc token vectors, score = max of the m dot products.

  The paper's query vector is the first ([CLS]) token, f(q) = h_1(q) (`query_pool="cls"`);
  `query_pool="mean"` uses the masked mean of the query tokens instead (for encoders trained with
  mean pooling, such as all-MiniLM-L6-v2). The doc vectors are the first m token vectors
  h_1(d)..h_m(d) ([CLS] first); for a doc with fewer than m real tokens the missing rows are
  invalid and never win the max. The paper uses m = 8 (its sections 5, 6) and m = 3 / 4 for MS
  MARCO passages / documents. With `proj_dim = k > 0` both sides go through one shared
  feed-forward layer n -> k followed by LayerNorm (ME-BERT-k; the DE-BERT-k down-projection).

  Attributes:
    dim: token width n.
    num_vectors: m, doc vectors per document.
    proj_dim: k, width after the shared down-projection + LayerNorm; 0 keeps the raw n-dim vectors.
    query_pool: "cls" (paper) or "mean".
    query_len: Tq of `example_inputs` (any length is accepted when scoring).
    doc_len: Td of `example_inputs` (any length >= 1 is accepted when scoring).

  Memory: `score_all` builds [B, N, m] scores (no [B, N, T] intermediate).
  """
  registry_name = "mebert"

  dim: int
  num_vectors: int = 8
  proj_dim: int = 0
  query_pool: str = "cls"
  query_len: int = 32
  doc_len: int = 180

  def setup(self):
    require(self.num_vectors >= 1, f"must be >= 1, got {self.num_vectors}",
            field="model.num_vectors")
    require(self.proj_dim >= 0, f"must be >= 0, got {self.proj_dim}", field="model.proj_dim")
    require(self.query_pool in QUERY_POOLS,
            f"must be one of {QUERY_POOLS}, got {self.query_pool!r}", field="model.query_pool")
    if self.proj_dim:
      self.proj = nn.Dense(self.proj_dim, name="proj")
      self.norm = nn.LayerNorm(name="norm")

  def example_inputs(self) -> tuple[jnp.ndarray, ...]:
    """`(q [1, Tq, n], q_mask [1, Tq], d [1, Td, n], d_mask [1, Td])` used to initialise params."""
    return example_token_inputs(self.dim, self.query_len, self.doc_len)

  def _project(self, x: jnp.ndarray) -> jnp.ndarray:
    """[..., n] -> [..., w]: the shared projection + LayerNorm, or the identity."""
    return self.norm(self.proj(x)) if self.proj_dim else x

  def query_table(self, q: jnp.ndarray, q_mask: jnp.ndarray) -> jnp.ndarray:
    """Query vectors: q [B, Tq, n], q_mask [B, Tq] -> [B, w] ([CLS] or masked mean, projected).

    Computed in float32 whatever the input float dtype.
    """
    q = zero_padding(q.astype(jnp.float32), q_mask)
    if self.query_pool == "cls":
      v = q[:, 0]
    else:
      count = jnp.maximum(jnp.sum(q_mask, axis=1, keepdims=True), 1).astype(q.dtype)
      v = jnp.sum(q, axis=1) / count
    return self._project(v)

  def doc_vectors(self, docs: jnp.ndarray, docs_mask: jnp.ndarray
                  ) -> tuple[jnp.ndarray, jnp.ndarray]:
    """The m vectors kept per doc: docs [N, Td, n], docs_mask [N, Td] -> ([N, m, w], [N, m] bool).

    Float32 whatever the input float dtype. If Td < m, the missing rows are invalid (False).
    """
    m = self.num_vectors
    docs, docs_mask = docs[:, :m], docs_mask[:, :m]
    if docs.shape[1] < m:
      pad = m - docs.shape[1]
      docs = jnp.pad(docs, ((0, 0), (0, pad), (0, 0)))
      docs_mask = jnp.pad(docs_mask, ((0, 0), (0, pad)))
    vecs = self._project(zero_padding(docs.astype(jnp.float32), docs_mask))
    return zero_padding(vecs, docs_mask), docs_mask

  def doc_table(self, docs: jnp.ndarray, docs_mask: jnp.ndarray
                ) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """Rows for a MIPS index: m per doc.

    Args:
      docs: [N, Td, n] doc token vectors.
      docs_mask: [N, Td] bool.

    Returns:
      rows [N*m, w] (doc i's rows at i*m ... i*m + m - 1), row_doc_ids [N*m] int32 (the doc of
      each row) and row_valid [N*m] bool (False for rows past a doc's last real token: drop them
      from the index, or give them -inf). A doc's score is the max over its valid rows of
      `query_table(q) @ row`.
    """
    vecs, valid = self.doc_vectors(docs, docs_mask)
    n_docs, m = valid.shape
    rows = vecs.reshape(n_docs * m, vecs.shape[-1])
    row_doc_ids = jnp.repeat(jnp.arange(n_docs, dtype=jnp.int32), m)
    return rows, row_doc_ids, valid.reshape(-1)

  def __call__(self, q, q_mask, d, d_mask):
    """Same as `score_pairs`: q [B, Tq, n], q_mask [B, Tq], d [B, Td, n], d_mask [B, Td] -> [B]."""
    return self.score_pairs(q, q_mask, d, d_mask)

  def score_pairs(self, q: jnp.ndarray, q_mask: jnp.ndarray, d: jnp.ndarray,
                  d_mask: jnp.ndarray) -> jnp.ndarray:
    """Paired scores: q [B, Tq, n], q_mask [B, Tq], d [B, Td, n], d_mask [B, Td] -> [B]."""
    qv = self.query_table(q, q_mask)
    dv, valid = self.doc_vectors(d, d_mask)
    s = jnp.einsum("bw,bmw->bm", qv, dv)
    return jnp.max(jnp.where(valid, s, -jnp.inf), axis=-1)

  def score_all(self, q: jnp.ndarray, q_mask: jnp.ndarray, docs: jnp.ndarray,
                docs_mask: jnp.ndarray) -> jnp.ndarray:
    """All pairs: q [B, Tq, n], q_mask [B, Tq], docs [N, Td, n], docs_mask [N, Td] -> [B, N]."""
    dv, valid = self.doc_vectors(docs, docs_mask)
    return self.score_all_encoded(self.query_table(q, q_mask), dv, valid)

  def score_all_encoded(self, qv: jnp.ndarray, dv: jnp.ndarray, valid: jnp.ndarray
                        ) -> jnp.ndarray:
    """All pairs from stored vectors: the max over each doc's valid rows.

    Args:
      qv: [B, w] from `query_table`.
      dv: [N, m, w] from `doc_vectors` (precomputed; any float dtype, scored in float32).
      valid: [N, m] bool from `doc_vectors`.

    Returns:
      [B, N] scores.
    """
    s = jnp.einsum("bw,nmw->bnm", qv.astype(jnp.float32), dv.astype(jnp.float32))
    return jnp.max(jnp.where(valid[None], s, -jnp.inf), axis=-1)


def example_token_inputs(dim: int, query_len: int, doc_len: int) -> tuple[jnp.ndarray, ...]:
  """`(q [1, Tq, n], q_mask [1, Tq], d [1, Td, n], d_mask [1, Td])`: zeros, all tokens real."""
  return (jnp.zeros((1, query_len, dim), jnp.float32), jnp.ones((1, query_len), bool),
          jnp.zeros((1, doc_len, dim), jnp.float32), jnp.ones((1, doc_len), bool))


def pooling_matrix(in_tokens: int, out_tokens: int) -> np.ndarray:
  """0/1 matrix [L2, L2'] assigning each of L2 positions to one of L2' windows of adjacent tokens.

  Window k holds positions floor(k L2 / L2') ... floor((k + 1) L2 / L2') - 1 (adaptive average
  pooling; all windows have L2 // L2' or L2 // L2' + 1 positions when L2' <= L2).
  """
  require(1 <= out_tokens <= in_tokens,
          f"must be in [1, {in_tokens}] (the doc tokens it pools), got {out_tokens}",
          field="model.doc_tokens")
  edges = (np.arange(out_tokens + 1) * in_tokens) // out_tokens
  window = np.searchsorted(edges, np.arange(in_tokens), side="right") - 1
  out = np.zeros((in_tokens, out_tokens), np.float32)
  out[np.arange(in_tokens), window] = 1.0
  return out


class TokenReduction(nn.Module):
  """Storage reduction of late-interaction doc tokens: L2 x P -> L2' x P' (LITE paper, 4.4).

  Token count (`doc_tokens = L2'`, 0 keeps all L2):
    "first": keep the first L2' tokens (and their mask).
    "avgpool": average of adjacent tokens, windows as `pooling_matrix`; the average runs over the
      real tokens of a window only, and a window without real tokens is masked out.
    "linear": a learned linear map over token positions, D' = D A with A [L2, L2'] (the paper's
      "trainable linear projection to every row of D"); padding is zeroed before it, all L2'
      outputs are real tokens. A starts at the uniform average over each window (so it starts
      equal to "avgpool" for documents without padding).
  Token width (`token_dim = P'`, 0 keeps P): a learned linear map P -> P' without bias, shared by
  query and doc tokens (ColBERT's projection), initialised N(0, 1/P') (then E[<Gq, Gd>] = <q, d>).

  Attributes:
    dim: P, input token width.
    doc_len: L2, input doc tokens (sets A's shape for "linear"; other methods take any length).
    doc_tokens: L2', 0 = keep all.
    method: one of DOC_REDUCTIONS.
    token_dim: P', 0 = keep P.
  """
  dim: int
  doc_len: int
  doc_tokens: int = 0
  method: str = "first"
  token_dim: int = 0

  def setup(self):
    require(self.method in DOC_REDUCTIONS,
            f"must be one of {DOC_REDUCTIONS}, got {self.method!r}", field="model.doc_reduction")
    require(self.doc_tokens >= 0, f"must be >= 0, got {self.doc_tokens}", field="model.doc_tokens")
    require(self.token_dim >= 0, f"must be >= 0, got {self.token_dim}", field="model.token_dim")
    if self.doc_tokens and self.method == "linear":
      pool = pooling_matrix(self.doc_len, self.doc_tokens)
      init = pool / pool.sum(axis=0, keepdims=True)
      self.token_map = self.param("token_map", lambda key, shape: jnp.asarray(init), init.shape)
    if self.token_dim:
      self.dim_map = self.param("dim_map", nn.initializers.normal(self.token_dim ** -0.5),
                                (self.dim, self.token_dim), jnp.float32)

  def queries(self, q: jnp.ndarray, q_mask: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """q [B, Tq, P], q_mask [B, Tq] -> ([B, Tq, P'] float32 with padding zeroed, q_mask)."""
    q = zero_padding(q.astype(jnp.float32), q_mask)
    if self.token_dim:
      q = q @ self.dim_map
    return q, q_mask

  def docs(self, d: jnp.ndarray, d_mask: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """The stored form: d [N, L2, P], d_mask [N, L2] -> ([N, L2', P'] float32, [N, L2']).

    Padding is zeroed; inputs of any float dtype (the token cache stores float16) become float32.
    """
    d = zero_padding(d.astype(jnp.float32), d_mask)
    if self.doc_tokens:
      if self.method == "first":
        d, d_mask = d[:, :self.doc_tokens], d_mask[:, :self.doc_tokens]
      elif self.method == "avgpool":
        pool = jnp.asarray(pooling_matrix(d.shape[1], self.doc_tokens))
        counts = d_mask.astype(jnp.float32) @ pool
        sums = jnp.einsum("ntp,tk->nkp", d, pool)
        d = sums / jnp.maximum(counts, 1.0)[..., None]
        d_mask = counts > 0
      else:
        require(d.shape[1] == self.doc_len,
                f"the learned token map expects {self.doc_len} doc tokens, got {d.shape[1]}",
                field="model.doc_len")
        d = jnp.einsum("ntp,tk->nkp", d, self.token_map)
        d_mask = jnp.broadcast_to(jnp.any(d_mask, axis=1, keepdims=True), d.shape[:2])
    if self.token_dim:
      d = d @ self.dim_map
    return zero_padding(d, d_mask), d_mask


def bytes_per_doc(num_vectors: int, dim: int, dtype: str | np.dtype = "float32") -> int:
  """Bytes to store one document as `num_vectors` vectors of width `dim` in `dtype`.

  DE: (1, n); ME-BERT: (m, k or n); late interaction: (L2', P'). Padding rows of a fixed-size
  table are counted (a ragged store would also need a per-doc length).

  Args:
    num_vectors: vectors per doc.
    dim: width of each vector.
    dtype: storage dtype, e.g. "float32", "bfloat16", "float16", "int8".
  """
  itemsize = jnp.dtype(dtype).itemsize
  return int(num_vectors) * int(dim) * int(itemsize)


def storage_table(dim: int, doc_len: int, doc_tokens: Sequence[int] = (),
                  token_dims: Sequence[int] = (),
                  dtypes: Sequence[str] = ("float32", "bfloat16")) -> list[dict]:
  """Bytes per doc for every reduction setting (L2', P', dtype), against DE (one n-vector).

  Args:
    dim: P, encoder token width.
    doc_len: L2, doc tokens before reduction.
    doc_tokens: L2' values to list (L2 itself is always listed).
    token_dims: P' values to list (P itself is always listed).
    dtypes: storage dtypes.

  Returns:
    rows `{"doc_tokens", "token_dim", "dtype", "bytes_per_doc", "x_de"}`, where x_de is the ratio
    to a DE doc (one P-vector) in the same dtype (the LITE paper's "storage" column).
  """
  rows = []
  for dtype in dtypes:
    de = bytes_per_doc(1, dim, dtype)
    for tokens in sorted({doc_len, *doc_tokens}, reverse=True):
      for width in sorted({dim, *token_dims}, reverse=True):
        b = bytes_per_doc(tokens, width, dtype)
        rows.append({"doc_tokens": tokens, "token_dim": width, "dtype": str(dtype),
                     "bytes_per_doc": b, "x_de": b / de})
  return rows
