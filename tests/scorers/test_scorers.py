"""Scorer contract, Theorem 1 (inclusion + the 2-D tie example) and init-at-dot-product."""
import importlib
import pkgutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bilinear_ir import scorers
from bilinear_ir.errors import InputError
from bilinear_ir.scorers import registry

N_DIM = 12
CASES = [
    ("dot", {}),
    ("wdp", {}),
    ("bilinear", {}),
    ("lowrank", {"rank": 5}),
    ("lowrank", {"rank": 5, "factor_init": "random"}),
    ("lowrank", {"rank": 5, "residual": "identity"}),
    ("lowrank", {"rank": 5, "residual": "diag"}),
]


def _random(seed, *shape):
  return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def _perturbed(params, seed):
  """Random params of the same structure (so tests do not only see the init)."""
  leaves, tree = jax.tree.flatten(params)
  return jax.tree.unflatten(tree, [jnp.asarray(_random(seed + i, *x.shape)) for i, x in
                                   enumerate(leaves)])


def _dense_w(name, kw, params):
  """The W [n, n] each family stands for, built directly from its parameters."""
  if name == "dot":
    return np.eye(N_DIM)
  if name == "wdp":
    return np.diag(np.asarray(params["v"]))
  if name == "bilinear":
    return np.asarray(params["W"])
  P, Q = np.asarray(params["P"], np.float64), np.asarray(params["Q"], np.float64)
  residual = kw.get("residual", "none")
  base = {"none": np.zeros((N_DIM, N_DIM)), "identity": np.eye(N_DIM)}.get(
      residual, np.diag(np.asarray(params["v"])) if residual == "diag" else None)
  return base + P @ Q.T


@pytest.mark.parametrize("name,kw", CASES)
def test_scores_equal_q_w_d_and_tables_factor_them(name, kw):
  module = scorers.build(name, dim=N_DIM, **kw)
  params = _perturbed(scorers.init_params(module, jax.random.key(0)), seed=7)
  q, docs = _random(1, 4, N_DIM), _random(2, 9, N_DIM)
  W = _dense_w(name, kw, params)
  expected = q.astype(np.float64) @ W @ docs.T.astype(np.float64)
  apply = lambda method, *a: np.asarray(module.apply({"params": params}, *a, method=method))
  np.testing.assert_allclose(apply(module.score_all, q, docs), expected, rtol=1e-4, atol=1e-4)
  pairs = apply(module.score_pairs, q, docs[:4])
  np.testing.assert_allclose(pairs, np.diag(expected[:, :4]), rtol=1e-4, atol=1e-4)
  qt, dt = apply(module.query_table, q), apply(module.doc_table, docs)
  np.testing.assert_allclose(qt @ dt.T, expected, rtol=1e-4, atol=1e-4)
  width = {"none": 5, "identity": N_DIM + 5, "diag": N_DIM + 5}[kw.get("residual", "none")] \
      if name == "lowrank" else N_DIM
  assert qt.shape == (4, width) and dt.shape == (9, width)


@pytest.mark.parametrize("name,kw", [c for c in CASES if c[0] != "lowrank" or "residual" in c[1]])
def test_step_zero_is_exactly_the_dot_product(name, kw):
  """Theorem 1 (inclusion) as the upgrade path: these families start at W = I."""
  module = scorers.build(name, dim=N_DIM, **kw)
  params = scorers.init_params(module, jax.random.key(3))
  q, docs = _random(4, 3, N_DIM), _random(5, 6, N_DIM)
  got = module.apply({"params": params}, q, docs, method=module.score_all)
  # Equal up to float32 summation order (the tables of a residual form add exact zeros).
  np.testing.assert_allclose(np.asarray(got), q.astype(np.float64) @ docs.T, rtol=1e-6, atol=1e-6)


def test_residual_lowrank_init_moves_under_gradient():
  """P random, Q zero: the gradient w.r.t. Q is non-zero (both zero would never move)."""
  module = scorers.build("lowrank", dim=N_DIM, rank=3, residual="identity")
  params = scorers.init_params(module, jax.random.key(0))
  assert np.all(np.asarray(params["Q"]) == 0) and np.any(np.asarray(params["P"]) != 0)
  q, d = jnp.asarray(_random(6, 4, N_DIM)), jnp.asarray(_random(7, 4, N_DIM))
  grads = jax.grad(lambda p: jnp.sum(module.apply({"params": p}, q, d)))(params)
  assert float(jnp.abs(grads["Q"]).sum()) > 0.0


def test_orthogonal_lowrank_init_is_a_projection():
  module = scorers.build("lowrank", dim=N_DIM, rank=4)
  params = scorers.init_params(module, jax.random.key(1))
  P, Q = np.asarray(params["P"]), np.asarray(params["Q"])
  np.testing.assert_array_equal(P, Q)
  W = P @ Q.T
  np.testing.assert_allclose(W @ W, W, atol=1e-5)
  assert np.isclose(np.trace(W), 4.0, atol=1e-5)


def test_theorem1_tie_broken_by_diagonal_w():
  """q = [1, 1], d1 = [1, 0], d2 = [0, 1]: dot ties at 1; W* = diag(2, 1) gives 2 > 1."""
  q = jnp.array([[1.0, 1.0]])
  docs = jnp.array([[1.0, 0.0], [0.0, 1.0]])
  dot = scorers.build("dot", dim=2)
  s_dot = np.asarray(dot.apply({}, q, docs, method=dot.score_all))[0]
  assert s_dot[0] == s_dot[1] == 1.0
  bil = scorers.build("bilinear", dim=2)
  s_w = np.asarray(bil.apply({"params": {"W": jnp.diag(jnp.array([2.0, 1.0]))}}, q, docs,
                             method=bil.score_all))[0]
  np.testing.assert_array_equal(s_w, [2.0, 1.0])
  # A WDP with v = (2, 1) is the same W*: the example needs no cross-feature term.
  wdp = scorers.build("wdp", dim=2)
  s_v = np.asarray(wdp.apply({"params": {"v": jnp.array([2.0, 1.0])}}, q, docs,
                             method=wdp.score_all))[0]
  np.testing.assert_array_equal(s_v, s_w)


def test_theorem1_inclusion_pointwise_on_random_embeddings():
  bil = scorers.build("bilinear", dim=N_DIM)
  dot = scorers.build("dot", dim=N_DIM)
  params = scorers.init_params(bil, jax.random.key(0))
  np.testing.assert_array_equal(np.asarray(params["W"]), np.eye(N_DIM))
  q, d = _random(8, 50, N_DIM), _random(9, 50, N_DIM)
  np.testing.assert_array_equal(np.asarray(bil.apply({"params": params}, q, d)),
                                np.asarray(dot.apply({}, q, d)))


def test_registry_rejects_unknown_names_and_options():
  with pytest.raises(InputError, match="unknown scorer"):
    scorers.build("cosine_magic", dim=4)
  with pytest.raises(InputError, match="no option"):
    scorers.build("bilinear", dim=4, rank=3)
  module = scorers.build("lowrank", dim=4, rank=2, residual="full")
  with pytest.raises(InputError, match="model.residual"):
    scorers.init_params(module, jax.random.key(0))


def test_the_table_holds_every_scorer_class_once():
  """A family class that declares a `registry_name` but is missing from `SCORERS`, or two
  classes with one name (the dict would keep only the last), fail here."""
  modules = [importlib.import_module(f"bilinear_ir.scorers.{m.name}")
             for m in pkgutil.iter_modules(scorers.__path__)]
  declared = {cls for module in modules for cls in vars(module).values()
              if isinstance(cls, type) and "registry_name" in vars(cls)}
  assert len(declared) == 11
  assert sorted(cls.registry_name for cls in declared) == scorers.names()
  assert all(registry.SCORERS[cls.registry_name] is cls for cls in declared)
