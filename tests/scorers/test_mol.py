"""Mixture-of-Logits scorer (paper 003, eq. 2) against a numpy twin, and the L_MI loss (eq. 3)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bilinear_ir import scorers
from bilinear_ir.errors import InputError
from bilinear_ir.train import losses

N_DIM = 12


def _random(seed, *shape):
  return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def _perturbed(params, seed, scale=0.5):
  """Random params of the same structure (so tests do not only see the init)."""
  leaves, tree = jax.tree.flatten(params)
  return jax.tree.unflatten(tree, [jnp.asarray(scale * _random(seed + i, *x.shape))
                                   for i, x in enumerate(leaves)])


def _np(x):
  return np.asarray(x, np.float64)


def _silu(x):
  return x / (1.0 + np.exp(-x))


def _softmax(x, axis=-1):
  e = np.exp(x - x.max(axis=axis, keepdims=True))
  return e / e.sum(axis=axis, keepdims=True)


def _normalize(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _dense(p, x):
  return x @ _np(p["kernel"]) + _np(p["bias"])


def _mlp_components(p, x, num, d_p):
  h = _dense(p["out"], _silu(_dense(p["hidden"], _np(x))))
  return _normalize(h.reshape(x.shape[0], num, d_p))


def _pool_components(p, x, mask, num, d_p, max_len):
  x = np.where(mask[..., None], _np(x), 0.0)
  t = x.shape[1]
  logits = _dense(p["pool"], x[:, 0]).reshape(x.shape[0], max_len, num)[:, :t]
  logits = np.where(mask[..., None], logits, -np.inf)
  w = _softmax(logits, axis=1)
  pooled = np.einsum("btp,btn->bpn", w, x)
  return _normalize(np.einsum("bpn,pnd->bpd", pooled, _np(p["proj"])) + _np(p["bias"]))


def _mix(gate_params, logits):
  """(phi, gates) of the gating MLP over logits (..., P), in float64."""
  h = _silu(_dense(gate_params["hidden"], logits))
  gates = _softmax(_dense(gate_params["out"], h))
  return (gates * logits).sum(-1), gates


def _twin(module, params, qc, ic):
  """logits (B, N, P), gates, scores from components (numpy, float64)."""
  logits = np.einsum("bad,nxd->bnax", qc, ic).reshape(qc.shape[0], ic.shape[0], -1)
  logits = logits / module.temperature
  phi, gates = _mix(params["gate_net"], logits)
  return logits, gates, phi


def test_vector_mol_matches_numpy_twin():
  module = scorers.build("mol", dim=N_DIM, p_q=2, p_x=3, d_p=5, hidden=7, gate_hidden=6,
                         temperature=0.3)
  params = _perturbed(scorers.init_params(module, jax.random.key(0)), seed=3)
  q, docs = _random(1, 4, N_DIM), _random(2, 9, N_DIM)
  apply = lambda method, *a: module.apply({"params": params}, *a, method=method)
  qc = _mlp_components(params["query_net"], q, 2, 5)
  ic = _mlp_components(params["item_net"], docs, 3, 5)
  logits, gates, phi = _twin(module, params, qc, ic)

  np.testing.assert_allclose(apply(module.query_components, q), qc, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(apply(module.item_components, docs), ic, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.linalg.norm(ic, axis=-1), 1.0, rtol=1e-6)
  got_logits = apply(module.logits, q, docs)
  assert got_logits.shape == (4, 9, 6)
  np.testing.assert_allclose(got_logits, logits, rtol=1e-4, atol=1e-4)
  # Logit p = a * P_x + b is <f_a, g_b> / temperature.
  np.testing.assert_allclose(got_logits[1, 2, 1 * 3 + 2], qc[1, 1] @ ic[2, 2] / 0.3, rtol=1e-4)
  got_gates = apply(module.gates, q, docs)
  np.testing.assert_allclose(got_gates, gates, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(np.asarray(got_gates).sum(-1), 1.0, rtol=1e-5)
  np.testing.assert_allclose(apply(module.score_all, q, docs), phi, rtol=1e-4, atol=1e-4)
  scores, g2 = apply(module.score_all_with_gates, q, docs)
  np.testing.assert_allclose(scores, phi, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(g2, gates, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(apply(module.score_pairs, q, docs[:4]), np.diag(phi[:, :4]),
                             rtol=1e-4, atol=1e-4)
  # phi is a convex combination of the logits: min_p l_p <= phi <= max_p l_p.
  assert np.all(phi <= logits.max(-1) + 1e-9) and np.all(phi >= logits.min(-1) - 1e-9)


def test_token_mol_parameterised_pooling_matches_numpy_and_ignores_padding():
  max_len = 6
  module = scorers.build("mol", dim=N_DIM, p_q=2, p_x=2, d_p=4, gate_hidden=5,
                         inputs="tokens", max_len=max_len, example_len=3)
  init = scorers.init_params(module, jax.random.key(1))
  q, docs = _random(4, 3, 5, N_DIM), _random(5, 4, 6, N_DIM)
  q_mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], bool)
  d_mask = np.array([[1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0],
                     [1, 1, 1, 1, 0, 0]], bool)
  # At init the pooling layer is zero: components are projections of the masked mean.
  apply0 = lambda method, *a: module.apply({"params": init}, *a, method=method)
  mean = (np.where(q_mask[..., None], q, 0).sum(1) / q_mask.sum(1, keepdims=True))
  proj = _np(init["query_net"]["proj"])
  expected0 = _normalize(np.einsum("n,pnd->pd", mean[0], proj))
  np.testing.assert_allclose(apply0(module.query_components, q, q_mask)[0], expected0,
                             rtol=1e-4, atol=1e-5)

  params = _perturbed(init, seed=11)
  apply = lambda method, *a: module.apply({"params": params}, *a, method=method)
  qc = _pool_components(params["query_net"], q, q_mask, 2, 4, max_len)
  ic = _pool_components(params["item_net"], docs, d_mask, 2, 4, max_len)
  np.testing.assert_allclose(apply(module.query_components, q, q_mask), qc, rtol=1e-4,
                             atol=1e-5)
  _, gates, phi = _twin(module, params, qc, ic)
  np.testing.assert_allclose(apply(module.score_all, q, q_mask, docs, d_mask), phi, rtol=1e-4,
                             atol=1e-4)
  np.testing.assert_allclose(apply(module.gates, q, q_mask, docs, d_mask), gates, rtol=1e-4,
                             atol=1e-5)
  np.testing.assert_allclose(apply(module.score_pairs, q, q_mask, docs[:3], d_mask[:3]),
                             np.diag(phi[:, :3]), rtol=1e-4, atol=1e-4)
  # Padding never reaches arithmetic, even as nan.
  noisy = np.where(d_mask[..., None], docs, np.nan).astype(np.float32)
  np.testing.assert_allclose(apply(module.score_all, q, q_mask, noisy, d_mask), phi, rtol=1e-4,
                             atol=1e-4)
  with pytest.raises(InputError, match="max_len"):
    apply(module.score_all, q, q_mask, _random(6, 2, max_len + 1, N_DIM),
          np.ones((2, max_len + 1), bool))


def test_bad_options_are_input_errors():
  with pytest.raises(InputError, match="inputs"):
    scorers.init_params(scorers.build("mol", dim=4, inputs="image"), jax.random.key(0))
  with pytest.raises(InputError, match="temperature"):
    scorers.init_params(scorers.build("mol", dim=4, temperature=0.0), jax.random.key(0))
  with pytest.raises(InputError, match="p_x"):
    scorers.init_params(scorers.build("mol", dim=4, p_x=0), jax.random.key(0))
  with pytest.raises(InputError, match="no option"):
    scorers.build("mol", dim=4, rank=3)


def _np_mi(gates, weights=None):
  g = np.asarray(gates, np.float64).reshape(-1, gates.shape[-1])
  w = np.ones(len(g)) if weights is None else np.asarray(weights, np.float64).reshape(-1)
  w = w / w.sum()
  ent = lambda x: -np.sum(np.where(x > 0, x * np.log(np.where(x > 0, x, 1.0)), 0.0), axis=-1)
  return -ent((w[:, None] * g).sum(0)) + (w * ent(g)).sum()


def test_mol_load_balancing_loss_equals_numpy():
  gates = jax.nn.softmax(jnp.asarray(_random(0, 3, 5, 8) * 2.0), axis=-1)
  np.testing.assert_allclose(losses.mol_load_balancing_loss(gates), _np_mi(gates), rtol=1e-5,
                             atol=1e-6)
  flat = gates.reshape(15, 8)
  np.testing.assert_allclose(losses.mol_load_balancing_loss(flat), _np_mi(flat), rtol=1e-5,
                             atol=1e-6)
  mask = np.random.default_rng(1).random((3, 5)) < 0.6
  np.testing.assert_allclose(losses.mol_load_balancing_loss(gates, jnp.asarray(mask)),
                             _np_mi(np.asarray(gates)[mask]), rtol=1e-5, atol=1e-6)
  # Closed forms: uniform gates give 0; one-hot gates spread evenly over P give -log P.
  p = 4
  np.testing.assert_allclose(losses.mol_load_balancing_loss(jnp.full((6, p), 1 / p)), 0.0,
                             atol=1e-6)
  one_hot = jnp.eye(p)[jnp.arange(8) % p]
  np.testing.assert_allclose(losses.mol_load_balancing_loss(one_hot), -np.log(p), rtol=1e-6)
  # Gradients stay finite at exact zeros of the gates.
  grad = jax.grad(losses.mol_load_balancing_loss)(one_hot)
  assert np.all(np.isfinite(np.asarray(grad)))


def test_training_loss_is_cross_entropy_plus_weighted_mi():
  module = scorers.build("mol", dim=N_DIM, p_q=2, p_x=2, d_p=4, hidden=8, gate_hidden=8)
  params = scorers.init_params(module, jax.random.key(2))
  q, docs = jnp.asarray(_random(7, 4, N_DIM)), jnp.asarray(_random(8, 4, N_DIM))

  def loss(p):
    scores, gates = module.apply({"params": p}, q, docs, method=module.score_all_with_gates)
    ce = losses.softmax_cross_entropy(scores, jnp.arange(4))
    return ce + module.mi_weight * losses.mol_load_balancing_loss(gates), (scores, gates)

  (value, (scores, gates)), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  s, g = np.asarray(scores, np.float64), np.asarray(gates)
  ce = -np.mean(np.diag(s) - np.log(np.exp(s).sum(1)))
  np.testing.assert_allclose(value, ce + 0.001 * _np_mi(g), rtol=1e-5)
  norms = [float(jnp.linalg.norm(x)) for x in jax.tree.leaves(grads)]
  assert all(np.isfinite(norms)) and all(n > 0 for n in norms)  # every part learns


# ----- the residual MoL: the dot product is one more logit and the mixture starts on it -----

def _residual_mol(**kw):
  return scorers.build("mol", dim=N_DIM, p_q=2, p_x=3, d_p=5, hidden=7, gate_hidden=6,
                       temperature=0.3, residual="dot", **kw)


def test_residual_mol_at_step_zero_scores_exactly_as_dot():
  """lam = 0 at init: every score is q . d (float32), whatever the random MoL part says."""
  module = _residual_mol()
  params = scorers.init_params(module, jax.random.key(5))
  q, docs = _random(20, 6, N_DIM), _random(21, 40, N_DIM)
  dot = q.astype(np.float64) @ docs.T.astype(np.float64)
  got = np.asarray(module.apply({"params": params}, q, docs, method=module.score_all))
  pairs = np.asarray(module.apply({"params": params}, q, docs[:6], method=module.score_pairs))
  diff = max(np.abs(got - dot).max(), np.abs(pairs - np.diag(dot[:, :6])).max())
  print(f"residual MoL at step 0 vs dot: max abs diff {diff:.3g} (scores up to "
        f"{np.abs(dot).max():.3g})")
  assert diff <= 1e-5 * np.abs(dot).max()
  np.testing.assert_array_equal(params["lam"], [0.0])
  # The MoL part is not the dot product: only the start makes the scores equal.
  moved = dict(params, lam=jnp.full((1,), 0.5, jnp.float32))
  assert np.abs(np.asarray(module.apply({"params": moved}, q, docs, method=module.score_all))
                - dot).max() > 1e-2


def test_residual_mol_matches_numpy_twin():
  """phi = (1 - lam) q.d + lam sum_p pi_p l_p, pi = softmax over P + 1 of the gate MLP of the P
  component logits, the dot logit last and not divided by the temperature."""
  module = _residual_mol()
  params = _perturbed(scorers.init_params(module, jax.random.key(0)), seed=3)
  lam = float(params["lam"][0])
  assert lam != 0.0 and np.asarray(params["gate_net"]["out"]["kernel"]).shape == (6, 7)
  q, docs = _random(1, 4, N_DIM), _random(2, 9, N_DIM)
  apply = lambda method, *a: np.asarray(module.apply({"params": params}, *a, method=method))
  qc = _mlp_components(params["query_net"], q, 2, 5)
  ic = _mlp_components(params["item_net"], docs, 3, 5)
  comp = np.einsum("bad,nxd->bnax", qc, ic).reshape(4, 9, 6) / 0.3
  dot = _np(q) @ _np(docs).T
  logits = np.concatenate([comp, dot[..., None]], axis=-1)
  gates = _softmax(_dense(params["gate_net"]["out"],
                          _silu(_dense(params["gate_net"]["hidden"], comp))))
  phi = (1 - lam) * dot + lam * (gates * logits).sum(-1)
  assert module.num_logits == 7
  np.testing.assert_allclose(apply(module.logits, q, docs), logits, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(apply(module.gates, q, docs), gates, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(apply(module.score_all, q, docs), phi, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(apply(module.score_pairs, q, docs[:4]), np.diag(phi[:, :4]),
                             rtol=1e-4, atol=1e-4)


def test_residual_mol_learns_from_the_start():
  """At init only lam has a gradient (sum pi l - l_dot, not zero); once lam moves, every part
  does (the zero-factor start of LoRA)."""
  module = _residual_mol()
  params = scorers.init_params(module, jax.random.key(2))
  q, docs = jnp.asarray(_random(7, 4, N_DIM)), jnp.asarray(_random(8, 4, N_DIM))
  loss = lambda p: losses.softmax_cross_entropy(
      module.apply({"params": p}, q, docs, method=module.score_all), jnp.arange(4))
  grads = jax.grad(loss)(params)
  assert abs(float(grads["lam"][0])) > 1e-4
  moved = jax.grad(loss)(dict(params, lam=params["lam"] - 1e-3 * jnp.sign(grads["lam"])))
  norms = [float(jnp.linalg.norm(x)) for x in jax.tree.leaves(moved)]
  assert all(np.isfinite(norms)) and all(n > 0 for n in norms)


def test_residual_mol_options_are_checked():
  with pytest.raises(InputError, match="model.residual"):
    scorers.init_params(scorers.build("mol", dim=4, residual="identity"), jax.random.key(0))
  with pytest.raises(InputError, match="needs inputs 'vector'"):
    scorers.init_params(scorers.build("mol", dim=4, residual="dot", inputs="tokens",
                                      example_len=2, max_len=4), jax.random.key(0))
  # The model block's default residual ("none", low-rank's option) builds the plain MoL.
  plain = scorers.init_params(scorers.build("mol", dim=4, residual="none"), jax.random.key(0))
  assert "lam" not in plain


def test_residual_mol_survives_the_saved_model_round_trip(tmp_path):
  """The option and lam come back; the scores are the same."""
  from bilinear_ir.export import saved_model  # pylint: disable=g-import-not-at-top
  module = _residual_mol()
  params = _perturbed(scorers.init_params(module, jax.random.key(1)), seed=9)
  saved_model.save_model(str(tmp_path / "m"), module, params, {"kind": "precomputed"})
  got_module, got, config = saved_model.load_model(str(tmp_path / "m"))
  assert got_module == module and config["options"]["residual"] == "dot"
  np.testing.assert_array_equal(got["lam"], params["lam"])
  q, docs = _random(30, 3, N_DIM), _random(31, 5, N_DIM)
  np.testing.assert_array_equal(
      np.asarray(got_module.apply({"params": got}, q, docs, method=got_module.score_all)),
      np.asarray(module.apply({"params": params}, q, docs, method=module.score_all)))
