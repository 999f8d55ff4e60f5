"""Late-interaction scorers over token similarities: ColBERT, separable / flattened LITE, KNRM.

All of them compare L1 = Tq query tokens with L2 = Td doc tokens through the similarity matrix
S = Q D^T [Tq, Td] (LITE paper, 2.2) and reduce S to a scalar:

  colbert    sum_i max_j S_ij (optionally mean of the top-k j per i: the top-k-aligned variant)
  lite       separable LITE, eq. (3)-(4): row MLP over the doc axis, column MLP over the query
             axis, then w^T vec(S'')
  lite_flat  flattened LITE: a two-layer ReLU network on vec(S) (the class F_f of section 3.1)
  knrm       11 RBF kernels on cosine similarities, log-sum pooled over query tokens, linear

Contract (inputs are token-level encoder outputs, True in a mask = a real token):

  score_pairs(q [B, Tq, n], q_mask [B, Tq], d [B, Td, n], d_mask [B, Td]) -> [B]
  score_all(q [B, Tq, n], q_mask [B, Tq], docs [N, Td, n], docs_mask [N, Td]) -> [B, N]
  encode_docs(docs, docs_mask) -> ([N, L2', P'], [N, L2'])   what is stored per doc
  score_all_encoded(encoded queries, encoded docs) -> [B, N]  scoring from the stored form

Every scorer first applies the shared doc-token storage reduction (`TokenReduction`: L2 -> L2'
tokens, P -> P' width; none by default). Padding: masked token vectors are zeroed before anything
else, masked doc tokens get -inf before a max and 0 in a sum, masked query tokens are left out of
the sum over query tokens; how LITE treats masked entries is in its docstring.

Token vectors of any float dtype (the token cache stores float16) are scored in float32.

Memory: `score_all` holds the encoded docs [N, L2', P'] in float32 (for a whole corpus, call it
over slices of the docs) and maps over them in chunks of `doc_chunk` (`jax.lax.map`), so the
largest intermediate is [B, doc_chunk, Tq, L2'] floats (x 11 for KNRM's kernels;
[B, doc_chunk, Tq, m2] and [B, doc_chunk, L2', m1] for separable LITE, [B, doc_chunk, width] for
flattened LITE).
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from bilinear_ir.errors import require
from bilinear_ir.scorers.multivector import TokenReduction, example_token_inputs, l2_normalize

# KNRM kernels (Xiong et al., 2017; LITE paper A.5): mu = 0.9, 0.7, ..., -0.9 with sigma = 0.1,
# and the exact-match kernel mu = 1.0 with sigma = 1e-3.
KNRM_MUS = (0.9, 0.7, 0.5, 0.3, 0.1, -0.1, -0.3, -0.5, -0.7, -0.9, 1.0)
KNRM_SIGMAS = (0.1,) * 10 + (1e-3,)
KNRM_CLAMP = 1e-10  # log(max(K, 1e-10)), as the original KNRM code.
LN_EPS = 1e-6  # flax.linen.LayerNorm's default epsilon.


def _fit_length(x: jnp.ndarray, mask: jnp.ndarray, length: int, field: str
                ) -> tuple[jnp.ndarray, jnp.ndarray]:
  """Pads x [B, T, n], mask [B, T] with masked tokens up to `length`; T > length is an error."""
  t = x.shape[1]
  require(t <= length, f"inputs have {t} tokens, more than the scorer's fixed {length}",
          field=field)
  if t < length:
    x = jnp.pad(x, ((0, 0), (0, length - t), (0, 0)))
    mask = jnp.pad(mask, ((0, 0), (0, length - t)))
  return x, mask


def layer_norm(x: jnp.ndarray, scale: jnp.ndarray, bias: jnp.ndarray) -> jnp.ndarray:
  """LayerNorm over the last axis (as flax.linen.LayerNorm): x [..., F], scale/bias [F]."""
  mean = jnp.mean(x, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
  return (x - mean) * jax.lax.rsqrt(var + LN_EPS) * scale + bias


class LateInteraction(nn.Module):
  """Shared plumbing: token reduction, masking, paired and chunked all-pairs scoring.

  Subclasses define `_scorer_params()` (a dict of their parameter arrays) and
  `_reduce(p, s, q_mask, d_mask)`: s [..., Tq, L2'] similarities -> [...] scores.

  Attributes:
    dim: n, encoder token width.
    query_len: Tq: fixed query length for LITE (shorter inputs are padded), else the length of
      `example_inputs` only.
    doc_len: Td: fixed input doc length for LITE and for the "linear" token map (shorter inputs are
      padded), else the length of `example_inputs` only.
    doc_tokens: L2', doc tokens kept after reduction (0 = all).
    doc_reduction: "first", "avgpool" or "linear" (see `TokenReduction`).
    token_dim: P', width of the shared learned token projection (0 = none).
    doc_chunk: docs scored per step in `score_all` (memory, see the module docstring).
  """
  dim: int
  query_len: int = 32
  doc_len: int = 180
  doc_tokens: int = 0
  doc_reduction: str = "first"
  token_dim: int = 0
  doc_chunk: int = 64

  fixed_length = False  # LITE: S must have exactly Tq x L2' entries.
  unit_tokens = False  # cosine similarities (tokens L2-normalised after the reduction).

  def setup(self):
    require(self.doc_chunk >= 1, f"must be >= 1, got {self.doc_chunk}", field="model.doc_chunk")
    self.reduction = TokenReduction(self.dim, self.doc_len, self.doc_tokens, self.doc_reduction,
                                    self.token_dim, name="reduction")
    self._setup_scorer()

  def _setup_scorer(self) -> None:
    """Creates the subclass's parameters (none by default)."""

  def _scorer_params(self) -> dict[str, Any]:
    """The scorer's own parameter arrays (the chunked map captures them as plain arrays)."""
    return {}

  def _reduce(self, p: dict[str, Any], s: jnp.ndarray, q_mask: jnp.ndarray,
              d_mask: jnp.ndarray) -> jnp.ndarray:
    """s [..., Tq, L2'], q_mask [..., Tq], d_mask [..., L2'] -> scores [...]."""
    raise NotImplementedError

  @property
  def l2(self) -> int:
    """L2', doc tokens per stored document (Td when there is no reduction)."""
    return self.doc_tokens or self.doc_len

  def example_inputs(self) -> tuple[jnp.ndarray, ...]:
    """`(q [1, Tq, n], q_mask [1, Tq], d [1, Td, n], d_mask [1, Td])` used to initialise params."""
    return example_token_inputs(self.dim, self.query_len, self.doc_len)

  def encode_queries(self, q: jnp.ndarray, q_mask: jnp.ndarray
                     ) -> tuple[jnp.ndarray, jnp.ndarray]:
    """q [B, Tq, n], q_mask [B, Tq] -> ([B, Tq, P'] padding zeroed, [B, Tq])."""
    if self.fixed_length:
      q, q_mask = _fit_length(q, q_mask, self.query_len, "model.query_len")
    q, q_mask = self.reduction.queries(q, q_mask)
    return (l2_normalize(q) if self.unit_tokens else q), q_mask

  def encode_docs(self, docs: jnp.ndarray, docs_mask: jnp.ndarray
                  ) -> tuple[jnp.ndarray, jnp.ndarray]:
    """The stored form: docs [N, Td, n], docs_mask [N, Td] -> ([N, L2', P'], [N, L2'])."""
    if self.fixed_length or (self.doc_tokens and self.doc_reduction == "linear"):
      docs, docs_mask = _fit_length(docs, docs_mask, self.doc_len, "model.doc_len")
    d, d_mask = self.reduction.docs(docs, docs_mask)
    return (l2_normalize(d) if self.unit_tokens else d), d_mask

  def __call__(self, q, q_mask, d, d_mask):
    """Same as `score_pairs`: q [B, Tq, n], q_mask [B, Tq], d [B, Td, n], d_mask [B, Td] -> [B]."""
    return self.score_pairs(q, q_mask, d, d_mask)

  def score_pairs(self, q: jnp.ndarray, q_mask: jnp.ndarray, d: jnp.ndarray,
                  d_mask: jnp.ndarray) -> jnp.ndarray:
    """Paired scores: q [B, Tq, n], q_mask [B, Tq], d [B, Td, n], d_mask [B, Td] -> [B]."""
    q, q_mask = self.encode_queries(q, q_mask)
    d, d_mask = self.encode_docs(d, d_mask)
    s = jnp.einsum("bip,bjp->bij", q, d)
    return self._reduce(self._scorer_params(), s, q_mask, d_mask)

  def score_all(self, q: jnp.ndarray, q_mask: jnp.ndarray, docs: jnp.ndarray,
                docs_mask: jnp.ndarray) -> jnp.ndarray:
    """All pairs: q [B, Tq, n], q_mask [B, Tq], docs [N, Td, n], docs_mask [N, Td] -> [B, N]."""
    q, q_mask = self.encode_queries(q, q_mask)
    d, d_mask = self.encode_docs(docs, docs_mask)
    return self.score_all_encoded(q, q_mask, d, d_mask)

  def score_all_encoded(self, q: jnp.ndarray, q_mask: jnp.ndarray, d: jnp.ndarray,
                        d_mask: jnp.ndarray) -> jnp.ndarray:
    """All pairs from encoded tokens, `doc_chunk` docs at a time.

    Args:
      q: [B, Tq, P'] from `encode_queries`.
      q_mask: [B, Tq].
      d: [N, L2', P'] from `encode_docs` (precomputed, stored doc tokens).
      d_mask: [N, L2'].

    Returns:
      [B, N] scores.
    """
    p = self._scorer_params()
    q = q.astype(jnp.float32)
    b = q.shape[0]

    def one_doc(doc):
      dj, mj = doc  # [L2', P'], [L2']
      s = jnp.einsum("bip,jp->bij", q, dj.astype(jnp.float32))
      return self._reduce(p, s, q_mask, jnp.broadcast_to(mj, (b,) + mj.shape))

    out = jax.lax.map(one_doc, (d, d_mask), batch_size=min(self.doc_chunk, d.shape[0]))
    return out.T


class ColBERT(LateInteraction):
  """ColBERT sum-max: s = sum over real query tokens i of max over real doc tokens j of S_ij.

  ColBERT itself projects tokens to 128 dims (`token_dim=128`) and L2-normalises them
  (`normalize=True`); both are off by default (the LITE paper's ColBERT scores raw 768-dim
  tokens). With no projection or reduction it has no parameters (frozen-encoder ColBERT needs no
  training, LITE paper A.4).

  `topk = k > 1` is the top-k-aligned variant of the LITE paper's ablation (A.4, after Qian et
  al., 2022): each query token takes the mean of its k largest similarities over real doc tokens
  (fewer if the doc has fewer than k real tokens) instead of the max; k = 1 is ColBERT. (The
  paper does not say sum or mean; the mean keeps the score scale of k = 1, and ranks docs with at
  least k tokens exactly as the sum does.)

  Attributes:
    normalize: L2-normalise query and doc tokens (after projection): S holds cosines.
    topk: k, doc tokens aligned per query token.
  """
  registry_name = "colbert"

  normalize: bool = False
  topk: int = 1

  @property
  def unit_tokens(self) -> bool:
    """Cosine similarities when `normalize`."""
    return self.normalize

  def _setup_scorer(self) -> None:
    require(self.topk >= 1, f"must be >= 1, got {self.topk}", field="model.topk")

  def _reduce(self, p, s, q_mask, d_mask):
    """s [..., Tq, L2'], q_mask [..., Tq], d_mask [..., L2'] -> [...]."""
    s = jnp.where(d_mask[..., None, :], s, -jnp.inf)
    k = min(self.topk, s.shape[-1])
    if k == 1:
      best = jnp.max(s, axis=-1)
    else:
      vals = jax.lax.top_k(s, k)[0]  # [..., Tq, k], real tokens first.
      n_real = jnp.sum(d_mask, axis=-1)[..., None, None]
      real = jnp.arange(k) < n_real
      best = (jnp.sum(jnp.where(real, vals, 0.0), axis=-1)
              / jnp.maximum(jnp.minimum(n_real[..., 0], k), 1))
    return jnp.sum(jnp.where(q_mask, best, 0.0), axis=-1)


class SeparableLITE(LateInteraction):
  """Separable LITE, eq. (3)-(4) of the LITE paper, on S [L1, L2] (L1 = Tq, L2 = L2'):

      S'_{i,:}  = LN(ReLU(W2 LN(ReLU(W1 S_{i,:}  + b1)) + b2))   row MLP, L2 -> m2 -> L2
      S''_{:,j} = LN(ReLU(W4 LN(ReLU(W3 S'_{:,j} + b3)) + b4))   column MLP, L1 -> m1 -> L1
      score     = w^T vec(S'')

  W1 has the paper's shape (m2, L2), W2 (L2, m2), W3 (m1, L1), W4 (L1, m1) (stored transposed, as
  x @ W); each LN has its own learned scale and bias; w is stored as [L1, L2]. The paper uses
  m1 = 360, m2 = 2400; its "small" LITE keeps L2' = 50 doc tokens with W1 of shape (768, 50), i.e.
  m2 = 768.

  Tq and L2' are fixed (shorter inputs are padded with masked tokens). Masked entries — (i, j)
  with query token i or doc token j padding — are set to 0 in S, in S' and in S'': padding rows
  and columns enter the row and column MLPs as zeros and add nothing to w^T vec(S''). So the score
  never depends on the values of padding tokens, and with no padding this is exactly (3)-(4).

  Attributes:
    m1: hidden width of the column MLP (over the L1 query positions).
    m2: hidden width of the row MLP (over the L2' doc positions).
  """
  registry_name = "lite"

  m1: int = 360
  m2: int = 2400

  fixed_length = True

  def _setup_scorer(self) -> None:
    require(self.m1 >= 1 and self.m2 >= 1, f"widths must be >= 1, got m1={self.m1}, m2={self.m2}",
            field="model.m1")
    l1, l2 = self.query_len, self.l2
    lecun = nn.initializers.lecun_normal()
    zeros, ones = nn.initializers.zeros, nn.initializers.ones
    shapes = {"W1": (l2, self.m2), "W2": (self.m2, l2), "W3": (l1, self.m1), "W4": (self.m1, l1)}
    mlp = {k: self.param(k, lecun, shape, jnp.float32) for k, shape in shapes.items()}
    for name, width in (("1", self.m2), ("2", l2), ("3", self.m1), ("4", l1)):
      mlp["b" + name] = self.param("b" + name, zeros, (width,), jnp.float32)
      mlp["ln_scale" + name] = self.param("ln_scale" + name, ones, (width,), jnp.float32)
      mlp["ln_bias" + name] = self.param("ln_bias" + name, zeros, (width,), jnp.float32)
    self.mlp = mlp
    self.w = self.param("w", nn.initializers.normal((l1 * l2) ** -0.5), (l1, l2), jnp.float32)

  def _scorer_params(self):
    return {**self.mlp, "w": self.w}

  def _reduce(self, p, s, q_mask, d_mask):
    """s [..., L1, L2'], q_mask [..., L1], d_mask [..., L2'] -> [...]."""

    def block(x, i):  # LN(ReLU(x @ W_i + b_i))
      h = jax.nn.relu(x @ p[f"W{i}"] + p[f"b{i}"])
      return layer_norm(h, p[f"ln_scale{i}"], p[f"ln_bias{i}"])

    pair = q_mask[..., :, None] & d_mask[..., None, :]
    x = jnp.where(pair, s, 0.0)
    x = jnp.where(pair, block(block(x, 1), 2), 0.0)  # rows: over the doc axis.
    xt = block(block(jnp.swapaxes(x, -1, -2), 3), 4)  # columns: over the query axis.
    x = jnp.where(pair, jnp.swapaxes(xt, -1, -2), 0.0)
    return jnp.einsum("...ij,ij->...", x, p["w"])


class FlattenedLITE(LateInteraction):
  """Flattened LITE: a two-layer ReLU network on vec(S), score = a^T ReLU(W vec(S) + b).

  This is the paper's class F_f (section 3.1: "flatten S and then apply an MLP"); the paper gives
  no width for it. Masked entries of S are 0 in vec(S); Tq and L2' are fixed as for `lite`.

  Attributes:
    width: hidden units of the MLP.
  """
  registry_name = "lite_flat"

  width: int = 1024

  fixed_length = True

  def _setup_scorer(self) -> None:
    require(self.width >= 1, f"must be >= 1, got {self.width}", field="model.width")
    inputs = self.query_len * self.l2
    self.W = self.param("W", nn.initializers.lecun_normal(), (inputs, self.width), jnp.float32)
    self.b = self.param("b", nn.initializers.zeros, (self.width,), jnp.float32)
    self.a = self.param("a", nn.initializers.normal(self.width ** -0.5), (self.width,),
                        jnp.float32)

  def _scorer_params(self):
    return {"W": self.W, "b": self.b, "a": self.a}

  def _reduce(self, p, s, q_mask, d_mask):
    """s [..., L1, L2'], q_mask [..., L1], d_mask [..., L2'] -> [...]."""
    x = jnp.where(q_mask[..., :, None] & d_mask[..., None, :], s, 0.0)
    x = x.reshape(x.shape[:-2] + (-1,))
    return jax.nn.relu(x @ p["W"] + p["b"]) @ p["a"]


def knrm_features(s: jnp.ndarray, q_mask: jnp.ndarray, d_mask: jnp.ndarray) -> jnp.ndarray:
  """KNRM kernel pooling (Xiong et al., 2017) of cosine similarities.

  phi_k = sum over real query tokens i of log(max(K_k(i), 1e-10)), where
  K_k(i) = sum over real doc tokens j of exp(-(S_ij - mu_k)^2 / (2 sigma_k^2)).

  Args:
    s: [..., Tq, Td] similarities.
    q_mask: [..., Tq] bool.
    d_mask: [..., Td] bool.

  Returns:
    [..., 11] features, kernels in the order of KNRM_MUS.
  """
  mu = jnp.asarray(KNRM_MUS, jnp.float32)
  sigma = jnp.asarray(KNRM_SIGMAS, jnp.float32)
  k = jnp.exp(-jnp.square(s[..., None] - mu) / (2.0 * jnp.square(sigma)))  # [..., Tq, Td, 11]
  k = jnp.sum(jnp.where(d_mask[..., None, :, None], k, 0.0), axis=-2)  # [..., Tq, 11]
  logk = jnp.log(jnp.maximum(k, KNRM_CLAMP))
  return jnp.sum(jnp.where(q_mask[..., None], logk, 0.0), axis=-2)


class KNRM(LateInteraction):
  """KNRM: score = w^T phi(S) on cosine similarities (`knrm_features`), only w [11] trained.

  mu, sigma are fixed (LITE paper A.5). No tanh and no bias on the output (a bias does not change
  a ranking or the losses here). w starts ~ N(0, 0.01^2).
  """
  registry_name = "knrm"

  unit_tokens = True

  def _setup_scorer(self) -> None:
    self.w = self.param("w", nn.initializers.normal(0.01), (len(KNRM_MUS),), jnp.float32)

  def _scorer_params(self):
    return {"w": self.w}

  def _reduce(self, p, s, q_mask, d_mask):
    """s [..., Tq, L2'], q_mask [..., Tq], d_mask [..., L2'] -> [...]."""
    return knrm_features(s, q_mask, d_mask) @ p["w"]
