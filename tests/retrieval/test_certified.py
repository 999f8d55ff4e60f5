"""Certified low-rank retrieval equals the full-W brute-force top-k (float64 twin)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bilinear_ir.errors import InputError
from bilinear_ir.retrieval import certified


def decaying(rng, n, decay):
  U, _ = np.linalg.qr(rng.normal(size=(n, n)))
  V, _ = np.linalg.qr(rng.normal(size=(n, n)))
  return ((U * decay ** np.arange(n)) @ V.T).astype(np.float32), U, V


def full_w_twin(W, q, d, k):
  s = np.asarray(q, np.float64) @ np.asarray(W, np.float64) @ np.asarray(d, np.float64).T
  order = np.lexsort((np.broadcast_to(np.arange(s.shape[1]), s.shape), -s), axis=1)[:, :k]
  return order, np.take_along_axis(s, order, axis=1), s


# Theorem 3's bound is worst case (q, d aligned with the (r+1)-th singular pair): it prunes when
# sigma_{r+1} |q| |d| is small next to the spread of the scores, i.e. for fast-decaying spectra.
@pytest.mark.parametrize("seed,decay,rank,k", [(0, 0.5, 8, 10), (2, 0.4, 6, 1),
                                               (3, 0.55, 10, 20)])
def test_equals_brute_force_on_decaying_spectra(seed, decay, rank, k):
  rng = np.random.default_rng(seed)
  n = 32
  W, _, _ = decaying(rng, n, decay)
  q = rng.normal(size=(12, n)).astype(np.float32)
  d = (rng.normal(size=(3000, n)) * rng.uniform(0.5, 2.0, size=(3000, 1))).astype(np.float32)
  index = certified.build_certified(W, d, rank)
  assert index.sigma_next == pytest.approx(decay ** rank, rel=1e-6)
  assert abs(index.residual_norm - index.sigma_next) <= 1e-5
  assert 0 < index.slack < 1e-2 * index.sigma_next + 1e-3
  res = certified.certified_topk(index, q, k, chunk=256)
  ids, scores, s = full_w_twin(W, q, d, k)
  np.testing.assert_array_equal(np.asarray(res.ids), ids)
  np.testing.assert_allclose(np.asarray(res.scores), scores, rtol=1e-5, atol=1e-5)
  rescored = np.asarray(res.rescored)
  assert np.all(rescored >= k) and np.all(rescored <= res.scanned)
  # The certificate: every doc outside the rescored set has an upper bound below tau; check with
  # the bound itself (Theorem 3), in float64: s_W <= s_Wr + e|q||d| < tau <= the k-th s_W.
  qn, dn = np.linalg.norm(q, axis=1), np.linalg.norm(d, axis=1)
  kth = scores[:, -1]
  assert np.all(np.asarray(res.threshold) <= kth + 1e-5)
  above = (s >= kth[:, None]).sum(axis=1)
  assert np.all(rescored >= above)
  # Low rank pays off here: on average far fewer docs than N are rescored.
  assert rescored.mean() < 0.2 * d.shape[0]
  err = np.abs(s - q.astype(np.float64) @ np.asarray(index.P, np.float64)
               @ np.asarray(index.Q, np.float64).T @ d.astype(np.float64).T)
  assert np.all(err <= index.bound * qn[:, None] * dn[None, :])


def test_adversarial_near_ties_all_rescored_and_exact():
  """Docs differ only in W's tail directions: equal rank-r scores, full scores within the bound."""
  rng = np.random.default_rng(5)
  n, r, k = 24, 6, 8
  W, U, V = decaying(rng, n, 0.75)
  q = (U[:, 0] + 0.05 * rng.normal(size=n))[None].astype(np.float32)
  base = 8.0 * V[:, 0] + V[:, 1]
  tail = V[:, r:]                                   # invisible to W_r = U_r S_r V_r^T
  twins = base + 0.3 * rng.normal(size=(400, n - r)) @ tail.T
  others = rng.normal(size=(600, n))
  d = np.concatenate([others[:300], twins, others[300:]]).astype(np.float32)
  index = certified.build_certified(W, d, r)
  res = certified.certified_topk(index, q, k)
  ids, scores, s = full_w_twin(W, q, d, k)
  # Near-ties: the twins' full scores spread less than the bound around the k-th score.
  spread = np.ptp(s[0, 300:700])
  assert spread < 2 * index.bound * np.linalg.norm(q) * np.linalg.norm(d[300:700], axis=1).max()
  assert np.all((ids >= 300) & (ids < 700))
  np.testing.assert_array_equal(np.asarray(res.ids), ids)
  np.testing.assert_allclose(np.asarray(res.scores), scores, rtol=1e-5)
  assert int(res.rescored[0]) >= 400       # every twin had to be rescored


def test_fallback_to_full_scan_is_exact_and_says_so():
  rng = np.random.default_rng(6)
  W, _, _ = decaying(rng, 16, 0.95)       # slow decay + rank 1: a loose bound
  q = rng.normal(size=(3, 16)).astype(np.float32)
  d = rng.normal(size=(500, 16)).astype(np.float32)
  index = certified.build_certified(W, d, 1)
  res = certified.certified_topk(index, q, 5, first_candidates=8, max_candidates=16)
  ids, _, _ = full_w_twin(W, q, d, 5)
  np.testing.assert_array_equal(np.asarray(res.ids), ids)
  assert res.scanned == 500 and np.all(np.asarray(res.rescored) == 500)


def test_full_rank_needs_no_slack_beyond_rounding():
  rng = np.random.default_rng(7)
  W, _, _ = decaying(rng, 12, 0.8)
  d = rng.normal(size=(200, 12)).astype(np.float32)
  q = rng.normal(size=(4, 12)).astype(np.float32)
  index = certified.build_certified(W, d, 12)
  assert index.sigma_next == 0.0 and index.residual_norm < 1e-5
  res = certified.certified_topk(index, q, 3)
  np.testing.assert_array_equal(np.asarray(res.ids), full_w_twin(W, q, d, 3)[0])
  assert np.all(np.asarray(res.rescored) < 20)


def test_bad_inputs():
  W = np.eye(4, dtype=np.float32)
  with pytest.raises(InputError, match="square"):
    certified.build_certified(np.ones((3, 4), np.float32), np.ones((5, 4), np.float32), 1)
  with pytest.raises(InputError, match="docs"):
    certified.build_certified(W, np.ones((5, 3), np.float32), 1)
  index = certified.build_certified(W, np.ones((5, 4), np.float32), 1)
  with pytest.raises(InputError, match="k must be"):
    certified.certified_topk(index, np.ones((1, 4), np.float32), 6)
  with pytest.raises(InputError, match="queries"):
    certified.certified_topk(index, np.ones((1, 3), np.float32), 2)


def test_bf16_candidates_give_the_float32_top_k():
  rng = np.random.default_rng(8)
  q = rng.normal(size=(40, 48)).astype(np.float32)
  d = (rng.normal(size=(6000, 48)) * rng.uniform(0.5, 1.5, (6000, 1))).astype(np.float32)
  low, norm = certified.bf16_table(d)
  res = certified.bf16_topk(q, d, 10, doc_table_bf16=low, max_doc_norm=norm)
  s = q.astype(np.float64) @ d.T.astype(np.float64)
  ids = np.lexsort((np.broadcast_to(np.arange(6000), s.shape), -s), axis=1)[:, :10]
  np.testing.assert_array_equal(np.asarray(res.ids), ids)
  np.testing.assert_allclose(np.asarray(res.scores), np.take_along_axis(s, ids, 1), rtol=1e-5)
  assert np.all(np.asarray(res.rescored) >= 10)
  # The bf16 error bound holds for every pair (bf16 inputs, float32 accumulation, as the scan).
  s_low = jax.lax.dot_general(jnp.asarray(q, jnp.bfloat16), low, (((1,), (1,)), ((), ())),
                              preferred_element_type=jnp.float32)
  s_low = np.asarray(s_low, np.float64)
  c = certified.bf16_relative_bound(48)
  qn, dn = np.linalg.norm(q, axis=1), np.linalg.norm(d, axis=1)
  assert np.all(np.abs(s_low - s) <= c * qn[:, None] * dn[None, :])
  assert np.max(np.abs(s_low - s) / (qn[:, None] * dn[None, :])) > 0.05 * c   # not vacuous


def test_bf16_candidates_with_ties_and_growth():
  rng = np.random.default_rng(9)
  q = rng.integers(-2, 3, (6, 10)).astype(np.float32)
  d = rng.integers(-2, 3, (3000, 10)).astype(np.float32)   # many exact ties at the k-th score
  res = certified.bf16_topk(q, d, 7, first_candidates=8)
  s = q.astype(np.float64) @ d.T
  ids = np.lexsort((np.broadcast_to(np.arange(3000), s.shape), -s), axis=1)[:, :7]
  np.testing.assert_array_equal(np.asarray(res.ids), ids)
  assert res.scanned > 8                     # some query needed a longer candidate list


def test_bf16_pays_rule():
  """docs/benchmarks/README.md: bf16_topk only on CPUs with AVX512-BF16, never GPUs or TPUs."""
  assert certified.bf16_pays("cpu", "fpu avx512f avx512_bf16 amx_bf16")
  assert not certified.bf16_pays("cpu", "fpu avx2 avx512f")
  assert not certified.bf16_pays("gpu", "fpu avx512_bf16")
  assert not certified.bf16_pays("tpu", "fpu avx512_bf16")
