"""Structured Agreement Ranking Task: Wilson intervals, Theorem 2 (i), the closed-form WDP, the LP
answers cross-checked by brute force, training, and the job end to end through `main`."""
import itertools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from bilinear_ir import scorers
from bilinear_ir.synthetic import feasibility, task, training

Z = stats.norm.ppf(0.975)


def _instances(n):
  """Every (q, I0) instance, brute force: q [M, n], pair [M, 2], e [M, n] (numpy, no task code)."""
  qs = np.array(list(itertools.product([-1.0, 1.0], repeat=n)), np.float32)
  prs = list(itertools.combinations(range(n), 2))
  q = np.repeat(qs, len(prs), axis=0)
  pair = np.tile(np.array(prs), (len(qs), 1))
  e = -np.ones_like(q)
  e[np.arange(len(q)), pair[:, 0]] = 1.0
  e[np.arange(len(q)), pair[:, 1]] = 1.0
  return q, pair, e


def _np_scores(W, q, e):
  """q^T W d for the four documents (numpy twin): W [n, n] or [M, n, n] -> [M, 4]."""
  docs = np.stack([q, q * e, -q, -q * e], axis=1).astype(np.float64)
  W = np.broadcast_to(W, (len(q),) + W.shape[-2:]).astype(np.float64)
  return np.einsum("mi,mij,mkj->mk", q.astype(np.float64), W, docs)


def _np_solved(s):
  return s[:, :2].min(axis=1) > s[:, 2:].max(axis=1)


# -- Wilson interval -------------------------------------------------------------------------------


def test_wilson_all_successes_closed_form():
  lo, hi = task.wilson_interval(1000, 1000)
  assert lo == pytest.approx(1.0 / (1.0 + Z ** 2 / 1000), abs=1e-12)  # p = 1: 1 / (1 + z^2/m)
  assert round(lo, 5) == 0.99617 and hi == 1.0
  lo, hi = task.wilson_interval(0, 1000)  # the paper's WDP row: [0.0, 0.4]%
  assert lo == 0.0
  assert hi == pytest.approx((Z ** 2 / 1000) / (1.0 + Z ** 2 / 1000), abs=1e-12)
  assert round(100 * hi, 1) == 0.4


@pytest.mark.parametrize("wins,total", [(37, 200), (1, 7), (500, 1000)])
def test_wilson_bounds_are_roots_of_the_score_equation(wins, total):
  # Wilson bounds solve (p_hat - p)^2 = z^2 p (1 - p) / m for p.
  p_hat, c = wins / total, Z ** 2 / total
  roots = np.sort(np.roots([1.0 + c, -(2.0 * p_hat + c), p_hat ** 2]).real)
  np.testing.assert_allclose(task.wilson_interval(wins, total), roots, atol=1e-12)


# -- the task and Theorem 2 (i) --------------------------------------------------------------------


def test_queries_pairs_and_documents_match_the_definition():
  q = task.all_queries(5)
  assert q.shape == (32, 5) and set(np.unique(q)) == {-1.0, 1.0}
  assert len({tuple(r) for r in q}) == 32
  assert [tuple(p) for p in task.pairs(5)] == list(itertools.combinations(range(5), 2))
  e = task.indicator(np.array([[1, 3]]), 5)
  np.testing.assert_array_equal(e, [[-1, 1, -1, 1, -1]])
  docs = np.asarray(task.documents(jnp.asarray(q[7:8]), jnp.asarray(e)))[0]
  qe = q[7] * e[0]
  np.testing.assert_array_equal(docs, np.stack([q[7], qe, -q[7], -qe]))
  assert np.all(docs[1, [1, 3]] == q[7, [1, 3]]) and np.all(docs[1, [0, 2, 4]] == -q[7, [0, 2, 4]])


def test_sampled_instances_are_deterministic_and_cover_the_pairs():
  q1, p1 = task.sample_instances(jax.random.key(3), 4000, 10)
  q2, p2 = task.sample_instances(jax.random.key(3), 4000, 10)
  np.testing.assert_array_equal(q1, q2)
  np.testing.assert_array_equal(p1, p2)
  assert set(np.unique(np.asarray(q1))) == {-1.0, 1.0}
  assert set(np.asarray(p1).tolist()) == set(range(45))
  assert abs(float(np.mean(np.asarray(q1) > 0)) - 0.5) < 0.02
  _, p = task.sample_instances(jax.random.key(4), 2000, 10, np.array([3, 40]))
  assert set(np.asarray(p).tolist()) == {3, 40}


def test_constructed_rank2_w_scores_plus_minus_two_on_all_46080_instances():
  n = 10
  q, pair, e = _instances(n)
  assert len(q) == 1024 * 45 == 46080
  module = scorers.build("bilinear", n)
  W = np.zeros((len(q), n, n), np.float32)
  W[np.arange(len(q)), pair[:, 0], pair[:, 0]] = 1.0
  W[np.arange(len(q)), pair[:, 1], pair[:, 1]] = 1.0
  assert np.all(np.linalg.matrix_rank(W[:: 997]) == 2)
  s = np.asarray(task.per_instance_scores(module, {"W": jnp.asarray(W)}, jnp.asarray(q),
                                          jnp.asarray(e)))
  np.testing.assert_array_equal(s, np.tile([2.0, 2.0, -2.0, -2.0], (len(q), 1)))
  np.testing.assert_array_equal(s, _np_scores(W, q, e))
  assert np.all(np.asarray(task.solved(s)))
  row = task.summarize(s)
  assert row["success"] == 1.0 and row["n"] == 46080 and row["min_gap"] == 4.0


def test_closed_form_wdp_solves_its_own_pair_on_all_queries_and_no_other_pair():
  n = 10
  module = scorers.build("wdp", n)
  q = task.all_queries(n)
  for pair in [(0, 3), (4, 9)]:
    v = np.zeros(n, np.float32)
    v[list(pair)] = 1.0
    for other in task.pairs(n):
      e = np.broadcast_to(task.indicator(other, n), q.shape)
      s = np.asarray(task.instance_scores(module, {"v": jnp.asarray(v)}, q, e))
      np.testing.assert_allclose(s, _np_scores(np.diag(v), q, e), atol=0)
      if tuple(other) == pair:
        assert np.all(_np_solved(s)) and np.all(s == [2.0, 2.0, -2.0, -2.0])
      else:  # A_I <= 1 <= B_I or A_I = B_I = 1: never strictly separated
        assert not np.any(_np_solved(s))


def test_wdp_scores_are_the_papers_equations_7_to_10():
  n = 6
  v = np.random.default_rng(0).normal(size=n).astype(np.float32)
  q, pair, e = _instances(n)
  s = np.asarray(task.instance_scores(scorers.build("wdp", n), {"v": jnp.asarray(v)}, q, e))
  A = v[pair[:, 0]] + v[pair[:, 1]]
  B = v.sum() - A
  np.testing.assert_allclose(s, np.stack([A + B, A - B, -(A + B), -(A - B)], 1), atol=1e-5)


# -- the LP, cross-checked by brute force ----------------------------------------------------------


def test_lp_universal_v_feasible_at_n3_and_v_equal_one_solves_every_instance():
  v = feasibility.universal_solution(3, "wdp")
  assert v is not None and v.shape == (3,)
  q, _, e = _instances(3)
  assert np.all(_np_solved(_np_scores(np.diag(v), q, e)))
  s_ones = _np_scores(np.eye(3), q, e)  # v = 1: scores (3, 1, -3, -1) for every instance
  np.testing.assert_array_equal(s_ones, np.tile([3.0, 1.0, -3.0, -1.0], (len(q), 1)))
  assert np.all(_np_solved(s_ones))


@pytest.mark.parametrize("n", [4, 5, 6])
def test_lp_universal_v_infeasible_from_n4_and_the_pair_sum_identity(n):
  assert feasibility.universal_solution(n, "wdp") is None
  # Brute force: sum over pairs of (A_I - B_I) = S (n-1)(4-n)/2, and solving needs S > 0 and every
  # A_I - B_I > 0; so no v exists for n >= 4. Check the identity and that random v always fail.
  rng = np.random.default_rng(n)
  q, pair, e = _instances(n)
  for _ in range(20):
    v = rng.normal(size=n)
    A = v[task.pairs(n)].sum(axis=1)
    assert np.sum(A - (v.sum() - A)) == pytest.approx(v.sum() * (n - 1) * (4 - n) / 2)
    assert not np.all(_np_solved(_np_scores(np.diag(v), q, e)))


def test_lp_universal_full_w_feasible_at_n3_infeasible_at_n4_with_averaging_check():
  W3 = feasibility.universal_solution(3, "bilinear")
  assert W3 is not None and W3.shape == (3, 3)
  q3, _, e3 = _instances(3)
  assert np.all(_np_solved(_np_scores(W3, q3, e3)))
  assert feasibility.universal_solution(4, "bilinear") is None
  # Why: averaging q^T W diag(e) q over all q gives trace(W diag(e)) (E[q q^T] = I), so diag(W)
  # would have to be a universal v, which the n = 4 LP above rules out.
  W = np.random.default_rng(2).normal(size=(4, 4))
  qs = task.all_queries(4).astype(np.float64)
  for pair in task.pairs(4):
    D = np.diag(task.indicator(pair, 4))
    assert np.mean(np.einsum("mi,ij,mj->m", qs, W @ D, qs)) == pytest.approx(np.trace(W @ D))


def test_constraint_rows_agree_with_brute_force_scores():
  n = 4
  q, _, e = _instances(n)
  W = np.random.default_rng(5).normal(size=(n, n))
  s = _np_scores(W, q, e)
  diffs = np.concatenate([s[:, a] - s[:, b] for a, b in feasibility.PAIRS_OF_DOCS])
  rows = feasibility.constraint_rows(n, "bilinear")
  np.testing.assert_allclose(np.sort(np.unique(np.round(diffs, 9))),
                             np.sort(np.unique(np.round(rows @ W.ravel(), 9))))


# -- training --------------------------------------------------------------------------------------


def test_all_pairs_loss_is_the_mean_of_the_four_hinges_and_public_loss_ignores_i0():
  n = 6
  module = scorers.build("bilinear", n)
  W = np.random.default_rng(0).normal(size=(n, n)).astype(np.float32)
  q, _, e = _instances(n)
  q, e = q[:64], e[:64]
  s = _np_scores(W, q, e)
  hinges = [np.maximum(0.0, 1.0 - (s[:, a] - s[:, b])) for a, b in feasibility.PAIRS_OF_DOCS]
  spec = training.TrainSpec(margin=1.0)
  assert float(training.loss(module, {"W": W}, q, e, spec)) == pytest.approx(
      np.mean(hinges), rel=1e-5)
  public = training.TrainSpec(protocol="public")
  qq = np.einsum("mi,ij,mj->m", q, W, q)
  expected = np.mean(np.maximum(0.0, 1.0 - 2.0 * qq))  # pos = q, neg = -q
  assert float(training.loss(module, {"W": W}, q, e, public)) == pytest.approx(expected, rel=1e-5)
  assert float(training.loss(module, {"W": W}, q, -e, public)) == pytest.approx(expected, rel=1e-5)


def test_fit_wdp_on_a_fixed_pair_learns_it_and_is_deterministic():
  n, pair = 8, 5  # pair index 5 of pairs(8) = (0, 6)
  module = scorers.build("wdp", n)
  q, _ = task.sample_instances(jax.random.key(0), 1024, n)
  e = np.broadcast_to(task.indicator(task.pairs(n)[pair], n), q.shape)
  v0 = {"v": jax.random.uniform(jax.random.key(1), (n,), minval=-0.1, maxval=0.1)}
  spec = training.TrainSpec(batch_size=128, learning_rate=1e-2)
  params, history = training.fit(module, v0, q, e, jax.random.key(2), 4, spec)
  again, _ = training.fit(module, v0, q, e, jax.random.key(2), 4, spec)
  np.testing.assert_array_equal(params["v"], again["v"])
  assert history[-1] < history[0]
  v = np.asarray(params["v"])
  A = v[[0, 6]].sum()
  assert A > abs(v.sum() - A)  # the WDP condition A_I > |B_I| for its pair
  qa = task.all_queries(n)
  s = task.instance_scores(module, params, qa, np.broadcast_to(e[0], qa.shape))
  assert np.all(np.asarray(task.solved(s)))


# -- the job through main --------------------------------------------------------------------------


TINY = "configs/synthetic_agreement.py:tiny=true"


def test_job_end_to_end_writes_results(run_main, tmp_path):
  results = run_main.in_process(TINY, tmp_path)
  rows = results["rows"]
  for name in ["bilinear_rank2_constructed", "bilinear_rank2_constructed_exhaustive",
               "wdp_closed_form", "wdp_trained_512_1ep", "wdp_public_protocol_256_1ep",
               "lowrank_r2_trained_256_1ep"]:
    row = rows[name]
    assert 0.0 <= row["success"] <= 1.0 and row["ci95"][0] <= row["success"] <= row["ci95"][1]
    assert isinstance(row["n"], int)
  assert rows["bilinear_rank2_constructed"]["n"] == 200
  assert rows["bilinear_rank2_constructed_exhaustive"]["n"] == 46080
  assert rows["bilinear_rank2_constructed_exhaustive"]["success"] == 1.0
  assert rows["bilinear_rank2_constructed"]["scores_agreeing"] == [2.0]
  assert rows["wdp_closed_form"]["success"] == 1.0
  assert rows["wdp_trained_512_1ep"]["success"] == 0.0  # v near uniform: A_I - B_I < 0
  assert results["lp_feasibility"] == {"wdp": {"3": True, "4": False},
                                       "bilinear": {"3": True, "4": False}}
  assert "What Theorem 2 does and does not claim" in (tmp_path / "results.md").read_text()
  assert (tmp_path / "score_distributions.png").read_bytes()[:4] == b"\x89PNG"
  assert json.loads((tmp_path / "config.json").read_text())["job"] == "synthetic_agreement"


def test_bad_config_exits_2_with_one_line_and_no_results(run_main, tmp_path):
  run_main(TINY, tmp_path, "--config.n=1").one_error_line("'n'")
