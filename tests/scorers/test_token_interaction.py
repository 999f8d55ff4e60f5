"""Late-interaction scorers (ColBERT, separable / flattened LITE, KNRM) against numpy twins."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bilinear_ir.errors import InputError
from bilinear_ir.scorers import registry, token_interaction
from conftest import jit_apply, perturbed_params

N_DIM, TQ, TD, B, N = 8, 5, 7, 3, 6


def _inputs(seed, b=B, n=N, tq=TQ, td=TD):
  """Random token inputs with ragged masks; padding filled with garbage (huge values, NaN)."""
  rng = np.random.default_rng(seed)
  q = rng.normal(size=(b, tq, N_DIM)).astype(np.float32)
  d = rng.normal(size=(n, td, N_DIM)).astype(np.float32)
  q_len = rng.integers(1, tq + 1, size=b)
  d_len = rng.integers(1, td + 1, size=n)
  q_len[0], d_len[0], d_len[1] = tq, td, 1  # a full query, a full doc, a one-token doc
  qm = np.arange(tq)[None] < q_len[:, None]
  dm = np.arange(td)[None] < d_len[:, None]
  return q, qm, d, dm


def _garbage(x, mask, seed):
  """x with every masked token replaced by huge values or NaN."""
  rng = np.random.default_rng(seed)
  junk = rng.choice([1e30, -1e30, 3e4, np.nan], size=x.shape).astype(np.float32)
  return np.where(mask[..., None], x, junk)


def _score_all(module, params, q, qm, d, dm):
  return np.asarray(jit_apply(module, module.score_all, params, q, qm, d, dm))


def _score_pairs(module, params, q, qm, d, dm):
  return np.asarray(jit_apply(module, module.score_pairs, params, q, qm, d, dm))


def _unit(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _colbert_np(q, qm, d, dm, topk=1, normalize=False, dim_map=None):
  """Direct twin: for each pair, only the real tokens; sum over query tokens of max (top-k mean)."""
  out = np.zeros((len(q), len(d)))
  for b in range(len(q)):
    for n in range(len(d)):
      qq, dd = q[b][qm[b]].astype(np.float64), d[n][dm[n]].astype(np.float64)
      if dim_map is not None:
        qq, dd = qq @ dim_map, dd @ dim_map
      if normalize:
        qq, dd = _unit(qq), _unit(dd)
      s = qq @ dd.T
      out[b, n] = sum(np.mean(np.sort(row)[::-1][:topk]) for row in s)
  return out


@pytest.mark.parametrize("kw", [{}, {"topk": 3}, {"token_dim": 4, "normalize": True}])
def test_colbert_matches_numpy(kw):
  module = registry.build("colbert", dim=N_DIM, doc_chunk=4, **kw)  # chunks 4 + remainder 2
  params = perturbed_params(module)
  q, qm, d, dm = _inputs(1)
  dim_map = np.asarray(params["reduction"]["dim_map"]) if "token_dim" in kw else None
  want = _colbert_np(q, qm, d, dm, kw.get("topk", 1), kw.get("normalize", False), dim_map)
  got = _score_all(module, params, _garbage(q, qm, 2), qm, _garbage(d, dm, 3), dm)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  pairs = _score_pairs(module, params, q, qm, d[:B], dm[:B])
  np.testing.assert_allclose(pairs, np.diag(want[:, :B]), rtol=1e-4, atol=1e-4)


def test_float16_tokens_are_scored_in_float32():
  module = registry.build("colbert", dim=N_DIM)
  q, qm, d, dm = _inputs(20)
  q16, d16 = q.astype(np.float16), d.astype(np.float16)
  want = _colbert_np(q16.astype(np.float64), qm, d16.astype(np.float64), dm)
  got = _score_all(module, {}, q16, qm, d16, dm)
  assert got.dtype == np.float32
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_colbert_without_projection_has_no_params():
  assert registry.init_params(registry.build("colbert", dim=N_DIM), jax.random.key(0)) == {}


def test_colbert_with_avgpool_doc_reduction_matches_numpy():
  module = registry.build("colbert", dim=N_DIM, doc_len=TD, doc_tokens=3,
                          doc_reduction="avgpool")
  q, qm, d, dm = _inputs(4)
  windows = [range(0, 2), range(2, 4), range(4, 7)]  # floor(k * 7 / 3) edges: 0, 2, 4, 7
  pooled = np.zeros((N, 3, N_DIM), np.float32)
  pm = np.zeros((N, 3), bool)
  for n in range(N):
    for k, w in enumerate(windows):
      real = [t for t in w if dm[n, t]]
      if real:
        pooled[n, k], pm[n, k] = d[n, real].mean(axis=0), True
  want = _colbert_np(q, qm, pooled, pm)
  got = _score_all(module, {}, q, qm, _garbage(d, dm, 5), dm)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["colbert", "knrm"])
def test_appended_padding_never_changes_a_score(name):
  module = registry.build(name, dim=N_DIM, topk=2) if name == "colbert" else registry.build(
      name, dim=N_DIM)
  params = perturbed_params(module)
  q, qm, d, dm = _inputs(6)
  base = _score_all(module, params, q, qm, d, dm)
  # Append 4 padding tokens aligned with the query (they would win any unmasked max).
  q2 = np.concatenate([q, np.full((B, 4, N_DIM), 1e6, np.float32)], axis=1)
  d2 = np.concatenate([d, np.full((N, 4, N_DIM), 1e6, np.float32)], axis=1)
  qm2 = np.concatenate([qm, np.zeros((B, 4), bool)], axis=1)
  dm2 = np.concatenate([dm, np.zeros((N, 4), bool)], axis=1)
  np.testing.assert_allclose(_score_all(module, params, q2, qm2, d2, dm2), base, rtol=1e-5,
                             atol=1e-5)
  np.testing.assert_allclose(
      _score_all(module, params, _garbage(q2, qm2, 7), qm2, _garbage(d2, dm2, 8), dm2), base,
      rtol=1e-5, atol=1e-5)


def _ln(x, scale, bias):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + 1e-6) * scale + bias


def _lite_np(p, q, qm, d, dm):
  """Eq. (3)-(4) with the paper's matrix orientation (W1 is (m2, L2), applied as W1 @ row)."""
  relu = lambda x: np.maximum(x, 0.0)
  p = {k: np.asarray(v, np.float64) for k, v in p.items()}
  out = np.zeros((len(q), len(d)))
  for b in range(len(q)):
    for n in range(len(d)):
      pair = np.outer(qm[b], dm[n])
      s = np.where(pair, q[b].astype(np.float64) @ d[n].astype(np.float64).T, 0.0)
      s1 = np.zeros_like(s)
      for i in range(s.shape[0]):
        h = _ln(relu(p["W1"].T @ s[i] + p["b1"]), p["ln_scale1"], p["ln_bias1"])
        s1[i] = _ln(relu(p["W2"].T @ h + p["b2"]), p["ln_scale2"], p["ln_bias2"])
      s1 = np.where(pair, s1, 0.0)
      s2 = np.zeros_like(s)
      for j in range(s.shape[1]):
        h = _ln(relu(p["W3"].T @ s1[:, j] + p["b3"]), p["ln_scale3"], p["ln_bias3"])
        s2[:, j] = _ln(relu(p["W4"].T @ h + p["b4"]), p["ln_scale4"], p["ln_bias4"])
      out[b, n] = np.sum(np.where(pair, s2, 0.0) * p["w"])
  return out


def _lite_flat_np(p, q, qm, d, dm):
  p = {k: np.asarray(v, np.float64) for k, v in p.items()}
  out = np.zeros((len(q), len(d)))
  for b in range(len(q)):
    for n in range(len(d)):
      s = np.where(np.outer(qm[b], dm[n]), q[b].astype(np.float64) @ d[n].astype(np.float64).T,
                   0.0)
      out[b, n] = np.maximum(s.reshape(-1) @ p["W"] + p["b"], 0.0) @ p["a"]
  return out


@pytest.mark.parametrize("name,twin,kw", [
    ("lite", _lite_np, {"m1": 6, "m2": 9}),
    ("lite_flat", _lite_flat_np, {"width": 10}),
])
def test_lite_matches_numpy_and_ignores_padding(name, twin, kw):
  module = registry.build(name, dim=N_DIM, query_len=TQ, doc_len=TD, doc_chunk=4, **kw)
  params = perturbed_params(module)
  q, qm, d, dm = _inputs(9)
  want = twin(params, q, qm, d, dm)
  got = _score_all(module, params, _garbage(q, qm, 10), qm, _garbage(d, dm, 11), dm)
  np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)
  np.testing.assert_allclose(_score_pairs(module, params, q, qm, d[:B], dm[:B]),
                             np.diag(want[:, :B]), rtol=2e-4, atol=2e-4)
  # Shorter inputs are padded to the fixed Tq / Td with masked tokens: same scores.
  q_short = np.where(qm[:, :3, None], q[:, :3], 0.0)
  d_short = np.where(dm[:, :4, None], d[:, :4], 0.0)
  want_short = twin(params, np.pad(q_short, ((0, 0), (0, TQ - 3), (0, 0))),
                    np.pad(qm[:, :3], ((0, 0), (0, TQ - 3))),
                    np.pad(d_short, ((0, 0), (0, TD - 4), (0, 0))),
                    np.pad(dm[:, :4], ((0, 0), (0, TD - 4))))
  np.testing.assert_allclose(_score_all(module, params, q_short, qm[:, :3], d_short, dm[:, :4]),
                             want_short, rtol=2e-4, atol=2e-4)


def test_lite_at_the_papers_widths_matches_numpy():
  """m1 = 360, m2 = 2400 (A.1) on tiny inputs (Tq = 5, Td = 7), padding filled with garbage."""
  module = registry.build("lite", dim=N_DIM, query_len=TQ, doc_len=TD, doc_chunk=N, m1=360,
                          m2=2400)
  # Random params of the module's own tree (its init is timed by other tests; here only the
  # forward pass): weights ~ N(0, 1/fan_in), LayerNorm scales ~ 1 and biases ~ 0, perturbed.
  rng = np.random.default_rng(3)
  shapes = jax.eval_shape(lambda: registry.init_params(module, jax.random.key(0)))
  params = {k: (rng.normal(size=v.shape) / np.sqrt(v.shape[0] if len(v.shape) == 2 else 1)
                + (k.startswith("ln_scale"))).astype(np.float32) for k, v in shapes.items()}
  assert params["W1"].shape == (TD, 2400) and params["W3"].shape == (TQ, 360)
  q, qm, d, dm = _inputs(16)
  got = _score_all(module, params, _garbage(q, qm, 17), qm, _garbage(d, dm, 18), dm)
  np.testing.assert_allclose(got, _lite_np(params, q, qm, d, dm), rtol=2e-4, atol=2e-4)


def test_lite_shapes_follow_the_paper():
  module = registry.build("lite", dim=N_DIM, query_len=30, doc_len=200, doc_tokens=50,
                          doc_reduction="linear", m1=360, m2=768)
  params = jax.eval_shape(lambda: registry.init_params(module, jax.random.key(0)))
  shapes = {k: v.shape for k, v in params.items() if k != "reduction"}
  # Paper A.1 (transposed, x @ W): W1 (m2, L2), W2 (L2, m2), W3 (m1, L1), W4 (L1, m1).
  assert shapes["W1"] == (50, 768) and shapes["W2"] == (768, 50)
  assert shapes["W3"] == (30, 360) and shapes["W4"] == (360, 30)
  assert shapes["w"] == (30, 50)
  assert params["reduction"]["token_map"].shape == (200, 50)


def test_lite_rejects_longer_inputs():
  module = registry.build("lite", dim=N_DIM, query_len=TQ, doc_len=TD, m1=3, m2=3)
  params = jax.eval_shape(lambda: registry.init_params(module, jax.random.key(0)))
  q, qm, d, dm = _inputs(12, td=TD + 1)
  with pytest.raises(InputError, match="model.doc_len"):
    jax.eval_shape(lambda p: module.apply({"params": p}, q, qm, d, dm, method=module.score_all),
                   params)


def test_lite_gradients_are_finite_with_garbage_padding():
  module = registry.build("lite", dim=N_DIM, query_len=TQ, doc_len=TD, m1=4, m2=5)
  params = perturbed_params(module)
  q, qm, d, dm = _inputs(13)
  q, d = _garbage(q, qm, 14), _garbage(d, dm, 15)
  grads = jax.jit(jax.grad(lambda p: jnp.sum(module.apply({"params": p}, q, qm, d, dm,
                                                          method=module.score_all))))(params)
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))


def test_normalised_projection_gradients_over_padding_are_those_of_the_real_tokens():
  """ColBERT with a trained P' projection and L2-normalised tokens (the job's colbert_proj): with
  garbage padding the gradient is finite and equals the sum of each pair's gradient over its
  real tokens alone. The norm of a zeroed padding token was once sqrt(0), whose gradient is NaN:
  every training step was non-finite, the optimiser skipped each one, and the projection never
  moved from its initialisation."""
  module = registry.build("colbert", dim=N_DIM, token_dim=4, normalize=True)
  params = perturbed_params(module)
  q, qm, d, dm = _inputs(16)

  def total(p, *x):
    return jnp.sum(module.apply({"params": p}, *x, method=module.score_all))

  grad = jax.jit(jax.grad(total))  # one compile per pair's shapes, not op by op
  grads = grad(params, _garbage(q, qm, 17), qm, _garbage(d, dm, 18), dm)
  twin = jax.tree.map(jnp.zeros_like, params)
  for b in range(B):
    for n in range(N):
      g = grad(params, q[b:b + 1][:, qm[b]], qm[b:b + 1][:, qm[b]],
               d[n:n + 1][:, dm[n]], dm[n:n + 1][:, dm[n]])
      twin = jax.tree.map(jnp.add, twin, g)
  for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(twin)):
    assert bool(jnp.all(jnp.isfinite(got)))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_knrm_features_by_hand():
  # Query tokens e1, e2 (+ a padding token); doc tokens e1, e2 (+ a padding token at 45 degrees
  # that would add to the mu = 0.7 kernel). Each real query token has cosines {1, 0}.
  q = np.array([[[1, 0], [0, 1], [3, 3]]], np.float32)
  d = np.array([[[2, 0], [0, 5], [1, 1]]], np.float32)
  qm = np.array([[True, True, False]])
  dm = np.array([[True, True, False]])
  clamp = np.log(1e-10)
  # Per query token, K = exp(-(1 - mu)^2 / (2 s^2)) + exp(-mu^2 / (2 s^2)); by hand (s = 0.1):
  # mu 0.9: e^-0.5 + e^-40.5; 0.7: e^-4.5 + e^-24.5; 0.5: 2 e^-12.5; 0.3, 0.1: mirror images;
  # -0.1: e^-60.5 + e^-0.5; -0.3: e^-84.5 + e^-4.5; -0.5: e^-112.5 + e^-12.5;
  # -0.7: e^-24.5 < 1e-10 (clamped); -0.9: e^-40.5 (clamped); mu 1, s 1e-3: e^0 + e^-500000.
  per_token = [-0.5, -4.5, np.log(2) - 12.5, -4.5, -0.5, -0.5, -4.5, -12.5, clamp, clamp, 0.0]
  unit = q / np.linalg.norm(q, axis=-1, keepdims=True)
  s = np.einsum("bip,bjp->bij", unit, d / np.linalg.norm(d, axis=-1, keepdims=True))
  phi = np.asarray(token_interaction.knrm_features(jnp.asarray(s), qm, dm))
  np.testing.assert_allclose(phi[0], 2 * np.array(per_token), rtol=1e-5, atol=1e-5)
  # The scorer: w^T phi with cosine similarities.
  module = registry.build("knrm", dim=2, query_len=3, doc_len=3)
  params = {"w": jnp.arange(11, dtype=jnp.float32) / 10}
  got = _score_pairs(module, params, q, qm, d, dm)
  np.testing.assert_allclose(got, [2 * np.dot(per_token, np.arange(11) / 10)], rtol=1e-5)


def _knrm_np(w, q, qm, d, dm):
  mus, sigmas = np.array(token_interaction.KNRM_MUS), np.array(token_interaction.KNRM_SIGMAS)
  out = np.zeros((len(q), len(d)))
  for b in range(len(q)):
    for n in range(len(d)):
      s = _unit(q[b][qm[b]].astype(np.float64)) @ _unit(d[n][dm[n]].astype(np.float64)).T
      k = np.exp(-(s[..., None] - mus) ** 2 / (2 * sigmas ** 2)).sum(axis=1)
      out[b, n] = np.log(np.maximum(k, 1e-10)).sum(axis=0) @ w
  return out


def test_knrm_matches_numpy():
  module = registry.build("knrm", dim=N_DIM, doc_chunk=5)
  params = perturbed_params(module)
  q, qm, d, dm = _inputs(16)
  want = _knrm_np(np.asarray(params["w"], np.float64), q, qm, d, dm)
  got = _score_all(module, params, _garbage(q, qm, 17), qm, _garbage(d, dm, 18), dm)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
  assert set(params) == {"w"}  # only the final linear weights are trained


def test_score_all_encoded_from_stored_docs_equals_score_all():
  module = registry.build("lite", dim=N_DIM, query_len=TQ, doc_len=TD, doc_tokens=3,
                          doc_reduction="linear", token_dim=4, m1=4, m2=5)
  params = perturbed_params(module)
  q, qm, d, dm = _inputs(19)
  stored, stored_mask = jit_apply(module, module.encode_docs, params, d, dm)
  assert stored.shape == (N, 3, 4) and stored_mask.shape == (N, 3)
  eq, eqm = jit_apply(module, module.encode_queries, params, q, qm)
  from_stored = jit_apply(module, module.score_all_encoded, params, eq, eqm, stored, stored_mask)
  np.testing.assert_allclose(np.asarray(from_stored), _score_all(module, params, q, qm, d, dm),
                             rtol=1e-5, atol=1e-5)
