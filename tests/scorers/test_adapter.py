"""The residual query adapter `<q + f(q), d>`: step 0 is the dot product, its tables factor its
scores, it learns a query map no bilinear similarity can, its matrix export is refused."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bilinear_ir import scorers
from bilinear_ir.errors import InputError
from bilinear_ir.scorers.base import table_matrices
from bilinear_ir.train import losses

N_DIM = 8


def _random(seed, *shape):
  return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def _perturbed(params, seed):
  leaves, tree = jax.tree.flatten(params)
  return jax.tree.unflatten(tree, [jnp.asarray(0.5 * _random(seed + i, *x.shape))
                                   for i, x in enumerate(leaves)])


def _np_query_table(params, q):
  """q + W2 silu(W1 q + b1) + b2 in float64."""
  p = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
  h = q.astype(np.float64) @ p["hidden"]["kernel"] + p["hidden"]["bias"]
  h = h / (1.0 + np.exp(-h))
  return q + h @ p["out"]["kernel"] + p["out"]["bias"]


def test_step_zero_is_exactly_the_dot_product():
  module = scorers.build("adapter", dim=N_DIM, hidden=16)
  params = scorers.init_params(module, jax.random.key(3))
  q, docs = _random(1, 5, N_DIM), _random(2, 30, N_DIM)
  dot = q.astype(np.float64) @ docs.T
  got = np.asarray(module.apply({"params": params}, q, docs, method=module.score_all))
  pairs = np.asarray(module.apply({"params": params}, q, docs[:5], method=module.score_pairs))
  diff = max(np.abs(got - dot).max(), np.abs(pairs - np.diag(dot[:, :5])).max())
  print(f"adapter at step 0 vs dot: max abs diff {diff:.3g} (scores up to {np.abs(dot).max():.3g})")
  assert diff <= 1e-5 * np.abs(dot).max()
  # f's last layer is zero, its first random: the last layer's gradient is not zero.
  assert not np.any(np.asarray(params["out"]["kernel"])) and np.any(
      np.asarray(params["hidden"]["kernel"]))


def test_scores_are_the_tables_inner_products_and_docs_stay_raw():
  module = scorers.build("adapter", dim=N_DIM, hidden=16)
  params = _perturbed(scorers.init_params(module, jax.random.key(0)), seed=7)
  q, docs = _random(3, 4, N_DIM), _random(4, 9, N_DIM)
  apply = lambda method, *a: np.asarray(module.apply({"params": params}, *a, method=method))
  qt, dt = apply(module.query_table, q), apply(module.doc_table, docs)
  np.testing.assert_allclose(qt, _np_query_table(params, q), rtol=1e-4, atol=1e-4)
  np.testing.assert_array_equal(dt, docs)  # the index of the raw docs serves it
  np.testing.assert_allclose(apply(module.score_all, q, docs), qt @ dt.T, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(apply(module.score_pairs, q, docs[:4]),
                             np.sum(qt * dt[:4], axis=-1), rtol=1e-5, atol=1e-5)
  # Not a linear map once f moves: no matrix export (at init, f = 0, it is the identity).
  with pytest.raises(InputError, match="not a linear map"):
    table_matrices(module, params)
  a, b = table_matrices(module, scorers.init_params(module, jax.random.key(0)))
  np.testing.assert_allclose(a, np.eye(N_DIM), atol=1e-6)
  np.testing.assert_allclose(b, np.eye(N_DIM), atol=1e-6)


def _train(name, q, docs, steps=150, **kw):
  """Adam on the softmax over every doc (temperature 0.1): (first loss, last loss, P@1)."""
  module = scorers.build(name, dim=N_DIM, **kw)
  params = scorers.init_params(module, jax.random.key(0))
  opt = optax.adam(1e-2)
  loss = lambda p: losses.softmax_cross_entropy(
      module.apply({"params": p}, q, docs, method=module.score_all), jnp.arange(len(q)),
      temperature=0.1)

  @jax.jit
  def step(p, state):
    value, grads = jax.value_and_grad(loss)(p)
    updates, state = opt.update(grads, state, p)
    return optax.apply_updates(p, updates), state, value

  state, values = opt.init(params), []
  for _ in range(steps):
    params, state, value = step(params, state)
    values.append(float(value))
  scores = np.asarray(module.apply({"params": params}, q, docs, method=module.score_all))
  return values[0], values[-1], float(np.mean(scores.argmax(1) == np.arange(len(q))))


def test_it_learns_a_nonlinear_query_map_no_bilinear_similarity_can():
  """Planted task: query i is its doc with every sign flipped when the doc's first coordinate is
  negative, q = sign(d_0) d. The dot product ranks half the positives last; no W fixes that
  (q^T W d flips sign with q), while q + f(q) can undo the flip."""
  docs = _random(10, 64, N_DIM)
  docs /= np.linalg.norm(docs, axis=1, keepdims=True)
  q = docs * np.sign(docs[:, :1])
  first, last, p_at_1 = _train("adapter", q, docs, hidden=64)
  _, bilinear_last, bilinear_p_at_1 = _train("bilinear", q, docs)
  print(f"planted task: adapter loss {first:.3f} -> {last:.3f}, P@1 {p_at_1:.2f}; full W "
        f"-> {bilinear_last:.3f}, P@1 {bilinear_p_at_1:.2f}")
  assert last < 0.3 * first
  assert last < 0.5 * bilinear_last and p_at_1 > bilinear_p_at_1 + 0.3


def test_bad_hidden_is_an_input_error():
  with pytest.raises(InputError, match="model.hidden"):
    scorers.init_params(scorers.build("adapter", dim=4, hidden=0), jax.random.key(0))
