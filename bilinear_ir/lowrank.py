"""Low-rank analysis of a bilinear `W` [n, n] (paper 000, section 5).

SVD truncation into factors, the spectrum, Theorem 3's pointwise bound
`|q^T W d - q^T W_r d| <= sigma_{r+1} |q| |d|`, its tightness witness (`q = u_{r+1}`,
`d = v_{r+1}`), the bound checked pointwise on real (query, doc) pairs (`check_theorem3`), and
rank selection from the spectrum.

Precision: the jax matmuls behind the Theorem-3 checks (`truncated`, `pointwise_error`) run at
float32 (`lax.Precision.HIGHEST`, explicit) and the SVD is traced under float32 matmul precision,
on every backend (JAX's default is TF32 on recent NVIDIA GPUs, bf16 passes on TPU, whose errors
would swamp the bound being checked); `score_gap` / `check_theorem3` are float64 numpy.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from bilinear_ir.errors import require


class SVD(NamedTuple):
  """`W = U diag(S) Vt`: U [n, n], S [n] (descending), Vt [n, n]."""
  U: jnp.ndarray
  S: jnp.ndarray
  Vt: jnp.ndarray


def svd(W: jnp.ndarray) -> SVD:
  """Full SVD of W [n, n] with `jax.numpy.linalg.svd`; singular values descending.

  Traced at float32 matmul precision (TPU's SVD iterates with matmuls).
  """
  with jax.default_matmul_precision("highest"):
    U, S, Vt = jnp.linalg.svd(jnp.asarray(W), full_matrices=True)
  return SVD(U, S, Vt)


def spectrum(W: jnp.ndarray) -> jnp.ndarray:
  """Singular values of W [n, n], descending: [n] (float32 matmul precision, as `svd`)."""
  with jax.default_matmul_precision("highest"):
    return jnp.linalg.svd(jnp.asarray(W), compute_uv=False)


def truncate(W: jnp.ndarray, rank: int, decomposition: SVD | None = None
             ) -> tuple[jnp.ndarray, jnp.ndarray]:
  """Factors of the best rank-r approximation (Eckart-Young-Mirsky): `W_r = P Q^T`.

  Args:
    W: [n, n].
    rank: r, 0 <= r <= n.
    decomposition: `svd(W)` if already computed.

  Returns:
    P [n, r] = U_r sqrt(S_r) and Q [n, r] = V_r sqrt(S_r), so `P @ Q.T == W_r`.
  """
  n = W.shape[0]
  require(0 <= rank <= n, f"rank must be in [0, {n}], got {rank}", field="rank")
  U, S, Vt = decomposition if decomposition is not None else svd(W)
  root = jnp.sqrt(S[:rank])
  return U[:, :rank] * root[None, :], Vt[:rank, :].T * root[None, :]


def truncated(W: jnp.ndarray, rank: int, decomposition: SVD | None = None) -> jnp.ndarray:
  """The dense best rank-r approximation W_r [n, n] (`P @ Q.T` at float32 precision)."""
  P, Q = truncate(W, rank, decomposition)
  return jnp.matmul(P, Q.T, precision=lax.Precision.HIGHEST)


def sigma_next(S: jnp.ndarray, rank: int) -> jnp.ndarray:
  """sigma_{r+1} from the descending spectrum S [n] (0 when r >= n)."""
  return S[rank] if rank < S.shape[0] else jnp.zeros((), S.dtype)


def pointwise_bound(S: jnp.ndarray, rank: int, q: jnp.ndarray, d: jnp.ndarray) -> jnp.ndarray:
  """Theorem 3's bound `sigma_{r+1} |q| |d|` for paired q [B, n], d [B, n] -> [B]."""
  return sigma_next(S, rank) * jnp.linalg.norm(q, axis=-1) * jnp.linalg.norm(d, axis=-1)


def pointwise_error(W: jnp.ndarray, W_r: jnp.ndarray, q: jnp.ndarray, d: jnp.ndarray
                    ) -> jnp.ndarray:
  """`|q^T W d - q^T W_r d|` for paired q [B, n], d [B, n] -> [B] (float32 precision)."""
  return jnp.abs(jnp.einsum("bi,ij,bj->b", q, W - W_r, d, precision=lax.Precision.HIGHEST))


def tightness_witness(decomposition: SVD, rank: int) -> tuple[jnp.ndarray, jnp.ndarray]:
  """`(q, d) = (u_{r+1}, v_{r+1})`, unit vectors [n] at which Theorem 3 holds with equality."""
  U, _, Vt = decomposition
  return U[:, rank], Vt[rank, :]


def select_rank(S: np.ndarray | jnp.ndarray, target: float, criterion: str = "energy") -> int:
  """Smallest rank meeting `target`, read from the spectrum S [n] (descending).

  Args:
    S: singular values, descending.
    target: for "energy", the share of `sum sigma_i^2` to keep (e.g. 0.9); for "bound", the
      largest allowed `sigma_{r+1} / sigma_1` (Theorem 3's bound relative to the top mode).
    criterion: "energy" or "bound".

  Returns:
    r in [0, n].
  """
  S = np.asarray(S, np.float64)
  require(criterion in ("energy", "bound"), f"unknown criterion {criterion!r}", field="criterion")
  if criterion == "energy":
    require(0.0 <= target <= 1.0, f"energy target must be in [0, 1], got {target}", field="target")
    total = float(np.sum(S ** 2))
    if total == 0.0:
      return 0
    kept = np.concatenate([[0.0], np.cumsum(S ** 2)]) / total
    return int(np.argmax(kept >= target - 1e-12))
  require(target >= 0.0, f"bound target must be >= 0, got {target}", field="target")
  if S[0] == 0.0:
    return 0
  rel_next = np.concatenate([S / S[0], [0.0]])  # rel_next[r] = sigma_{r+1} / sigma_1
  return int(np.argmax(rel_next <= target))


def lowrank_params(W: jnp.ndarray, rank: int, residual: str = "none") -> dict[str, jnp.ndarray]:
  """Parameters of the `lowrank` scorer that start from a given W [n, n].

  residual "none": P, Q = `truncate(W, r)`. "identity": factors of `W - I`. "diag": `v = diag(W)`
  and factors of `W - diag(v)`.

  Returns:
    `{"P": [n, r], "Q": [n, r]}` (+ `"v": [n]` for "diag").
  """
  W = jnp.asarray(W, jnp.float32)
  require(residual in ("none", "identity", "diag"), f"unknown residual {residual!r}",
          field="model.residual")
  params = {}
  if residual == "identity":
    W = W - jnp.eye(W.shape[0], dtype=W.dtype)
  elif residual == "diag":
    params["v"] = jnp.diagonal(W)
    W = W - jnp.diag(params["v"])
  params["P"], params["Q"] = truncate(W, rank)
  return params


def pca_factors(x: np.ndarray | jnp.ndarray, rank: int) -> tuple[jnp.ndarray, jnp.ndarray]:
  """P = Q = the top-r eigenvectors of the uncentred second moment `x^T x / m` of rows x [m, n].

  `P Q^T` is then the rank-r projection that keeps the most of `|x|^2` on average, i.e. the
  rank-r bilinear form closest to the dot product on this data: the natural pure low-rank
  starting point.

  Returns:
    (P [n, r], Q [n, r]), equal, with orthonormal columns.
  """
  x = jnp.asarray(x, jnp.float32)
  require(1 <= rank <= x.shape[1], f"rank must be in [1, {x.shape[1]}], got {rank}",
          field="model.rank")
  _, vecs = jnp.linalg.eigh(x.T @ x / x.shape[0])  # ascending eigenvalues
  top = vecs[:, ::-1][:, :rank]
  return top, top


# ---------------------------------------------------------------------------------------------
# Theorem 3 checked pointwise on real (query, doc) pairs.


def pointwise_pairs(top_idx: np.ndarray, num_docs: int, random_docs: int,
                    rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The (query, doc) pairs of the Theorem 3 checks.

  Args:
    top_idx: [Q, k] each query's top docs (doc rows) under the full W.
    num_docs: N.
    random_docs: docs per query drawn uniformly, without replacement, from the docs outside its
      top k (fewer if fewer are left).
    rng: host-side generator (from the seed).

  Returns:
    (query positions [M] in 0..Q-1, doc rows [M], is_top [M] bool), M = Q (k + random_docs).
  """
  q_pos, d_rows, is_top = [], [], []
  for i, top in enumerate(np.asarray(top_idx)):
    rest = np.setdiff1d(np.arange(num_docs), top)
    rand = rng.choice(rest, size=min(random_docs, rest.size), replace=False)
    q_pos += [i] * (top.size + rand.size)
    d_rows += list(top) + list(rand)
    is_top += [True] * top.size + [False] * rand.size
  return (np.asarray(q_pos, np.int64), np.asarray(d_rows, np.int64), np.asarray(is_top, bool))


def score_gap(W: np.ndarray, P: np.ndarray, Q: np.ndarray, q: np.ndarray, d: np.ndarray
              ) -> np.ndarray:
  """`|q^T W d - (q P) . (d Q)|` in float64 for paired q [M, n], d [M, n]; W [n, n], P, Q [n, r].

  The exact gap between the scores of the stored float32 models (full and low-rank scorer);
  float64 keeps the arithmetic's own rounding out of the check.
  """
  q, d = np.asarray(q, np.float64), np.asarray(d, np.float64)
  full = np.einsum("bi,bi->b", q @ np.asarray(W, np.float64), d)
  low = np.einsum("br,br->b", q @ np.asarray(P, np.float64), d @ np.asarray(Q, np.float64))
  return np.abs(full - low)


def check_theorem3(W: np.ndarray, S: np.ndarray, factors: dict[str, Any], rank: int,
                   q: np.ndarray, d: np.ndarray, is_top: np.ndarray, tolerance: float
                   ) -> dict[str, float]:
  """Theorem 3 on paired q [M, n], d [M, n] for W_r = P Q^T (`factors` {"P", "Q"} [n, r]).

  A check passes when `err <= sigma_{r+1} |q| |d| + tolerance * sigma_1 |q| |d|` (the slack
  covers the float32 SVD factors). The ratio err / bound is taken where the bound is > 0.

  Returns:
    Sums over the M checks: {"checks", "violations", "ratio_sum", "ratio_count", "ratio_max",
    "ratio_sum_top", "ratio_count_top", "max_excess"} (`max_excess`: the largest
    (err - bound) / (sigma_1 |q| |d|)).
  """
  scale = np.linalg.norm(np.asarray(q, np.float64), axis=1) * np.linalg.norm(
      np.asarray(d, np.float64), axis=1)
  err = score_gap(W, factors["P"], factors["Q"], q, d)
  bound = float(sigma_next(jnp.asarray(S), rank)) * scale
  ok = err <= bound + tolerance * float(S[0]) * scale
  pos = bound > 0
  ratio = err[pos] / bound[pos]
  return {"checks": int(err.size), "violations": int(np.sum(~ok)),
          "ratio_sum": float(np.sum(ratio)), "ratio_count": int(ratio.size),
          "ratio_max": float(np.max(ratio)) if ratio.size else 0.0,
          "ratio_sum_top": float(np.sum(ratio[is_top[pos]])),
          "ratio_count_top": int(np.sum(is_top[pos])),
          "max_excess": float(np.max((err - bound) / (float(S[0]) * scale)))}


def witness_ratio(W: np.ndarray, decomposition: SVD, factors: dict[str, Any],
                  rank: int) -> float | None:
  """err / bound at Theorem 3's tightness witness (u_{r+1}, v_{r+1}); None for r = n."""
  if rank >= W.shape[0]:
    return None
  wq, wd = tightness_witness(decomposition, rank)
  err = score_gap(W, factors["P"], factors["Q"], np.asarray(wq)[None], np.asarray(wd)[None])[0]
  return float(err / float(decomposition.S[rank]))
