"""Theorem 3 (pointwise bound + tightness), SVD factors and rank selection."""
import jax.numpy as jnp
import numpy as np
import pytest

from bilinear_ir import lowrank
from bilinear_ir import scorers


def _decaying(seed, n, decay=0.7):
  rng = np.random.default_rng(seed)
  U, _ = np.linalg.qr(rng.normal(size=(n, n)))
  V, _ = np.linalg.qr(rng.normal(size=(n, n)))
  return (U * decay ** np.arange(n)) @ V.T


@pytest.mark.parametrize("seed", range(4))
def test_theorem3_bound_holds_and_is_tight(seed):
  n = 24
  rng = np.random.default_rng(seed)
  W = jnp.asarray(rng.normal(size=(n, n)) if seed % 2 else _decaying(seed, n), jnp.float32)
  dec = lowrank.svd(W)
  q = jnp.asarray(rng.normal(size=(2000, n)) * rng.uniform(0.1, 10, size=(2000, 1)), jnp.float32)
  d = jnp.asarray(rng.normal(size=(2000, n)), jnp.float32)
  tol = 1e-5 * float(dec.S[0]) * np.linalg.norm(q, axis=1) * np.linalg.norm(d, axis=1)
  for r in (0, 1, 3, 8, 16, n - 1, n):
    W_r = lowrank.truncated(W, r, dec)
    err = np.asarray(lowrank.pointwise_error(W, W_r, q, d))
    bound = np.asarray(lowrank.pointwise_bound(dec.S, r, q, d))
    assert np.all(err <= bound + tol), (r, float(np.max(err - bound)))
    if r < n:
      wq, wd = lowrank.tightness_witness(dec, r)
      gap = float(lowrank.pointwise_error(W, W_r, wq[None], wd[None])[0])
      assert abs(gap - float(dec.S[r])) <= 1e-5 * float(dec.S[0])
      # The witness pair has unit norms, so the bound there is exactly sigma_{r+1}.
      np.testing.assert_allclose(float(lowrank.pointwise_bound(dec.S, r, wq[None], wd[None])[0]),
                                 float(dec.S[r]), rtol=1e-5)


def test_truncate_factors_are_the_eckart_young_optimum():
  W = jnp.asarray(_decaying(0, 16), jnp.float32)
  S = np.asarray(lowrank.spectrum(W))
  for r in (1, 4, 9):
    P, Q = lowrank.truncate(W, r)
    assert P.shape == (16, r) and Q.shape == (16, r)
    # Spectral-norm error equals sigma_{r+1}; Frobenius error equals the tail energy.
    E = np.asarray(W - P @ Q.T, np.float64)
    np.testing.assert_allclose(np.linalg.norm(E, 2), S[r], rtol=1e-4)
    np.testing.assert_allclose(np.linalg.norm(E), np.sqrt(np.sum(S[r:] ** 2)), rtol=1e-4)


@pytest.mark.parametrize("residual", ["none", "identity", "diag"])
def test_lowrank_params_reproduce_w_through_the_scorer(residual):
  n, r = 10, 10
  W = jnp.asarray(_decaying(1, n) + np.eye(n), jnp.float32)
  module = scorers.build("lowrank", dim=n, rank=r, residual=residual)
  params = lowrank.lowrank_params(W, r, residual)
  q = jnp.asarray(np.random.default_rng(2).normal(size=(5, n)), jnp.float32)
  d = jnp.asarray(np.random.default_rng(3).normal(size=(7, n)), jnp.float32)
  got = module.apply({"params": params}, q, d, method=module.score_all)
  np.testing.assert_allclose(np.asarray(got), np.asarray(q @ W @ d.T), rtol=1e-4, atol=1e-4)


def test_select_rank_energy_and_bound():
  S = np.array([4.0, 2.0, 1.0, 0.5, 0.0])
  energy = np.cumsum(S ** 2) / np.sum(S ** 2)  # 0.7529, 0.9412, 0.9882, 1.0, 1.0
  assert lowrank.select_rank(S, 0.75, "energy") == 1
  assert lowrank.select_rank(S, 0.76, "energy") == 2
  assert lowrank.select_rank(S, 0.99, "energy") == 4
  assert lowrank.select_rank(S, 0.0, "energy") == 0
  assert energy[2] < 0.99 <= energy[3]
  # bound: smallest r with sigma_{r+1} / sigma_1 <= target.
  assert lowrank.select_rank(S, 0.5, "bound") == 1
  assert lowrank.select_rank(S, 0.2, "bound") == 3
  assert lowrank.select_rank(S, 0.0, "bound") == 4
  assert lowrank.select_rank(S, 1.0, "bound") == 0
