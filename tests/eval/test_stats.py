"""Paired statistics: closed-form sign-flip p-values, scipy t-test, bootstrap coverage, Holm."""
import json
import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from bilinear_ir.errors import InputError
from bilinear_ir.eval import stats


def _exact_p(d):
  return stats.permutation_p(np.asarray(d, np.float64), rng=None)


# ---------------------------------------------------------------------------------------------
# Randomization (sign-flip) test.


@pytest.mark.parametrize("n", [3, 4, 5, 6])
def test_exact_p_all_positive_distinct_is_two_over_two_to_n(n):
  # Only the all-plus and all-minus sign vectors reach |sum| = sum(d).
  d = np.arange(1, n + 1) * 0.37
  assert _exact_p(d) == 2 / 2**n
  assert _exact_p(-d) == 2 / 2**n


@pytest.mark.parametrize("d, want", [
    ([1.0, 2.0, 3.0], 2 / 8),  # |sums| 6,4,2,0,0,2,4,6: two reach 6
    # |d| = {3,1,2,1}, total 7, S = 7 - 2F (F = flipped magnitudes); |S| >= 5 iff F <= 1 or
    # F >= 6: {}, {1a}, {1b} and their complements -> 6 of 16.
    ([3.0, -1.0, 2.0, 1.0], 6 / 16),
    # Zeros are kept and change no sum: same p as [2, 1] (2 of 4).
    ([2.0, 0.0, 0.0, 1.0], 8 / 16),
    # Float ties: |d| = {.1,.2,.3,.4}, total 1, observed 0.4; |S| >= 0.4 iff F <= 0.3 or
    # F >= 0.7: {}, {.1}, {.2}, {.3}, {.1,.2} and complements -> 10 of 16. F = 0.3 via {.3}
    # and via {.1,.2} ties only up to rounding (without the tolerance this gives 8/16).
    ([0.1, 0.2, -0.3, 0.4], 10 / 16),
    # Mathematically the observed mean is 0, so every sign vector counts (rounding gives 15/16
    # without the tolerance).
    ([0.1, 0.2, 0.3, -0.6], 1.0),
    ([1.0, 1.0, 1.0, 1.0, 1.0], 2 / 32),  # all equal: only +/- all
])
def test_exact_p_hand_counted(d, want):
  assert _exact_p(d) == pytest.approx(want, abs=1e-15)


def test_exact_p_matches_brute_force_loop():
  rng = np.random.default_rng(0)
  for _ in range(5):
    d = np.round(rng.normal(size=8), 1)  # rounded: many exact ties
    obs = abs(d.sum())
    count = 0
    for code in range(2**8):
      s = np.array([-1.0 if (code >> i) & 1 else 1.0 for i in range(8)])
      count += abs(float(np.sum(s * d))) >= obs - 1e-9
    assert _exact_p(d) == count / 256


def test_monte_carlo_p_close_to_exact():
  # n = 18 enumerated exactly (2^18 sign vectors) vs Monte Carlo with R = 20,000.
  # The MC p is (X + 1) / (R + 1), X ~ Binomial(R, p): SE = sqrt(p (1 - p) / R) <= 0.0035;
  # we allow 4.5 SE plus the 1/(R+1) shift.
  # d: normal quantiles (symmetric about 0) plus a shift that sets p between 0.05 and 0.4.
  z = scipy_stats.norm.ppf((np.arange(18) + 0.5) / 18)
  r = 20_000
  for shift, seed in ((0.2, 11), (0.35, 12), (0.5, 13)):
    d = z + shift
    exact = stats.permutation_p(d, rng=None, exact_max_n=18)
    assert 0.04 < exact < 0.45  # a regime where the comparison means something
    mc = stats.permutation_p(d, rng=np.random.default_rng(seed), resamples=r, exact_max_n=0)
    assert mc * (r + 1) == pytest.approx(round(mc * (r + 1)))  # on the (count+1)/(R+1) lattice
    se = math.sqrt(exact * (1 - exact) / r)
    assert abs(mc - exact) <= 4.5 * se + 1 / (r + 1), (exact, mc)


def test_monte_carlo_floor_is_one_over_r_plus_one():
  # n = 40 all positive: a random sign vector reaches |sum(d)| with probability 2^-39, so the
  # count is 0 and p = 1 / (R + 1) exactly.
  a = np.linspace(0.5, 0.9, 40)
  out = stats.paired(a, a - 0.1 - np.linspace(0, 0.01, 40), seed=0, resamples=999)
  assert out["p_perm"] == 1 / 1000


# ---------------------------------------------------------------------------------------------
# t-test, effect size, bootstrap.


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("n", [5, 30, 300])
def test_t_test_matches_scipy_ttest_rel(seed, n):
  rng = np.random.default_rng(seed)
  b = rng.random(n)
  a = np.clip(b + 0.05 * seed + 0.2 * rng.normal(size=n), 0, 1)
  want = scipy_stats.ttest_rel(a, b)
  out = stats.paired(a, b, seed=seed, resamples=200, bootstrap=200)
  assert out["p_t"] == pytest.approx(float(want.pvalue), rel=1e-9, abs=1e-300)
  # d_z = t / sqrt(n) for the paired t statistic.
  assert out["effect_size"] == pytest.approx(float(want.statistic) / math.sqrt(n), rel=1e-9)
  assert out["diff"] == pytest.approx(float(np.mean(a - b)), abs=1e-15)
  assert out["n"] == n


def test_bootstrap_ci_coverage():
  # 2,000 data sets of n = 50 N(mu, 1) differences. The percentile CI of the mean is about
  # mean +- z * s_plugin / sqrt(n) with s_plugin = s sqrt((n-1)/n), so it covers mu with
  # probability P(|T_{n-1}| <= z sqrt((n-1)/n)) ~= 0.942 (slightly under 0.95). Binomial SE over
  # 2,000 repetitions ~= 0.0052; band = 3.5 SE (+-0.018), which excludes a 90% or a 99% CI.
  n, reps, mu = 50, 2000, 0.3
  z = scipy_stats.norm.ppf(0.975)
  expected = 1 - 2 * scipy_stats.t.sf(z * math.sqrt((n - 1) / n), n - 1)
  data = np.random.default_rng(123).normal(mu, 1.0, size=(reps, n))
  rng = np.random.default_rng(7)
  covered, widths = 0, []
  for d in data:
    lo, hi = stats.bootstrap_ci(d, rng=rng, resamples=1000)
    covered += lo <= mu <= hi
    widths.append(hi - lo)
  se = math.sqrt(expected * (1 - expected) / reps)
  assert abs(covered / reps - expected) <= 3.5 * se, (covered / reps, expected)
  # Width ~= 2 z sigma sqrt((n-1)/n) / sqrt(n) on average (E[s] ~ sigma).
  assert np.mean(widths) == pytest.approx(2 * z * math.sqrt((n - 1) / n) / math.sqrt(n), rel=0.03)


@pytest.mark.parametrize("alpha", [0.05, 0.2])
def test_bootstrap_ci_is_the_percentile_interval_of_resampled_means(alpha):
  # Brute-force twin: the same generator's [B, n] query indices, the means of the resampled
  # differences, their alpha/2 and 1 - alpha/2 quantiles. A basic (2 mean - quantiles) or a
  # normal (mean +- z sd) interval differs from it on these skewed differences.
  d = np.random.default_rng(3).exponential(size=15) ** 2
  got = stats.bootstrap_ci(d, rng=np.random.default_rng(11), resamples=2000, alpha=alpha)
  idx = np.random.default_rng(11).integers(0, d.shape[0], size=(2000, d.shape[0]))
  want = np.quantile(d[idx].mean(axis=1), [alpha / 2, 1 - alpha / 2])
  assert got == pytest.approx(list(want), rel=1e-12, abs=1e-15)


def test_bootstrap_ci_follows_the_skew_of_the_means():
  # Right-skewed differences: the resampled means are right-skewed, so the percentile interval
  # mostly reaches further above the mean than below it; a basic interval (2 mean - quantiles)
  # is skewed the other way, a normal one (mean +- z sd) is symmetric. Over 200 lognormal
  # samples of n = 20 (measured: 199 of 200 with a longer upper arm, median ratio 1.24).
  rng = np.random.default_rng(5)
  ratios = []
  for _ in range(200):
    d = rng.lognormal(sigma=1.2, size=20)
    lo, hi = stats.bootstrap_ci(d, rng=rng, resamples=2000)
    ratios.append((hi - d.mean()) / (d.mean() - lo))
  assert np.mean(np.array(ratios) > 1.05) > 0.8 and np.median(ratios) > 1.15


def test_bootstrap_ci_level_follows_alpha():
  d = np.random.default_rng(0).normal(size=200)
  w95 = np.diff(stats.bootstrap_ci(d, rng=np.random.default_rng(0), resamples=4000))[0]
  w50 = np.diff(stats.bootstrap_ci(d, rng=np.random.default_rng(0), resamples=4000,
                                   alpha=0.5))[0]
  # Normal quantile ratio z_.975 / z_.75 = 2.906; bootstrap noise well under 8%.
  assert w95 / w50 == pytest.approx(scipy_stats.norm.ppf(0.975) / scipy_stats.norm.ppf(0.75),
                                    rel=0.08)


# ---------------------------------------------------------------------------------------------
# paired(): form, determinism, pairing, degenerate cases, errors.


def test_paired_form_is_json_and_deterministic_by_seed():
  rng = np.random.default_rng(5)
  a, b = rng.random(200), rng.random(200)
  out = stats.paired(a, b, seed=7)
  assert set(out) == {"diff", "ci95", "p_perm", "p_t", "effect_size", "n"}
  assert json.loads(json.dumps(out, allow_nan=False)) == out
  assert out == stats.paired(a, b, seed=7)
  other = stats.paired(a, b, seed=8)
  assert other["ci95"] != out["ci95"] and other["p_perm"] != out["p_perm"]
  assert other["p_t"] == out["p_t"] and other["diff"] == out["diff"]
  assert out["ci95"][0] <= out["diff"] <= out["ci95"][1]
  # Independent streams: more sign vectors leave the bootstrap CI unchanged.
  assert stats.paired(a, b, seed=7, resamples=500)["ci95"] == out["ci95"]


def test_dicts_pair_by_key_in_sorted_order():
  a = {"q1": 0.9, "q2": 0.1, "q3": 0.5}
  b = {"q3": 0.4, "q1": 0.8, "q2": 0.3}  # other insertion order
  np.testing.assert_allclose(stats.paired_differences(a, b), [0.1, -0.2, 0.1], atol=1e-15)
  # Large enough for Monte Carlo and a random bootstrap: order must not change anything.
  rng = np.random.default_rng(2)
  ids = [f"q{i}" for i in range(60)]
  va, vb = rng.random(60), rng.random(60)
  da = dict(zip(ids, va))
  db = dict(reversed(list(zip(ids, vb))))
  order = np.argsort(ids, kind="stable")  # sorted string order: q0, q1, q10, q11, ...
  assert stats.paired(da, db, seed=1) == stats.paired(va[order], vb[order], seed=1)
  assert stats.paired(da, db, seed=1) != stats.paired(va, vb, seed=1)


def test_dicts_with_different_queries_name_the_missing_ids():
  a = {"q1": 1.0, "q2": 0.5, "q9": 0.2}
  b = {"q1": 0.5, "q2": 0.5, "q7": 0.1}
  with pytest.raises(InputError, match=r"missing from b: \['q9'\].*missing from a: \['q7'\]"):
    stats.paired(a, b, seed=0)
  with pytest.raises(InputError, match=r"missing from a: \['q3'\]"):
    stats.paired({"q1": 1.0, "q2": 0.0}, {"q1": 1.0, "q2": 0.0, "q3": 0.0}, seed=0)


@pytest.mark.parametrize("n", [5, 40])  # exact and Monte Carlo
def test_all_zero_differences(n):
  a = np.linspace(0, 1, n)
  out = stats.paired(a, a.copy(), seed=0, resamples=500, bootstrap=500)
  assert out == {"diff": 0.0, "ci95": [0.0, 0.0], "p_perm": 1.0, "p_t": 1.0,
                 "effect_size": 0.0, "n": n}


def test_a_seed_mean_of_identical_runs_ties_with_the_single_run():
  """Averaging three equal values can move the last bit; those differences are ties, not a
  significant gain (a step-0 full W, ranking exactly as dot, was marked "+" over dot)."""
  rng = np.random.default_rng(0)
  single = rng.uniform(size=400)
  seed_mean = np.array([np.mean([v, v, v]) for v in single])
  d = seed_mean - single
  assert np.count_nonzero(d) > 50 and np.all(np.abs(d) < 1e-15)  # the premise: ulp noise
  out = stats.paired(seed_mean, single, seed=0, resamples=500, bootstrap=500)
  assert out["diff"] == 0.0 and out["p_perm"] == 1.0 and out["ci95"] == [0.0, 0.0]
  real = seed_mean.copy()
  real[:3] += 1e-3  # a real difference on three queries still counts
  assert stats.paired(real, single, seed=0, resamples=500, bootstrap=500)["diff"] == (
      pytest.approx(3e-3 / 400))


def test_all_equal_nonzero_differences():
  a = np.full(6, 0.75)
  out = stats.paired(a, a - 0.25, seed=0)
  assert out["p_t"] == 0.0 and out["p_perm"] == 2 / 64
  assert out["effect_size"] is None and out["ci95"] == [0.25, 0.25]  # d_z = +inf: no JSON value
  assert stats.effect_size(np.full(6, -0.25)) == -math.inf


@pytest.mark.parametrize("a, b, match", [
    ([0.1], [0.2], "at least 2 queries"),
    ([0.1, 0.2], [0.1, 0.2, 0.3], "equal length"),
    ([[0.1, 0.2]], [[0.1, 0.2]], "1-D"),
    ([0.1, float("nan")], [0.1, 0.2], r"non-finite .* in a for query 1"),
    ({"x": 0.1, "y": 0.2}, [0.1, 0.2], "both be dicts"),
    ({"x": 0.1, "y": 0.2}, {"x": 0.1, "y": float("inf")}, r"in b for query 'y'"),
])
def test_bad_inputs_raise_input_error(a, b, match):
  with pytest.raises(InputError, match=match):
    stats.paired(a, b, seed=0)


def test_bad_settings_raise_input_error():
  with pytest.raises(InputError, match="seed"):
    stats.paired([0.1, 0.2], [0.0, 0.0], seed=-1)
  with pytest.raises(InputError, match="alpha"):
    stats.paired([0.1, 0.2], [0.0, 0.0], seed=0, alpha=1.5)
  with pytest.raises(InputError, match="bootstrap"):
    stats.paired([0.1, 0.2], [0.0, 0.0], seed=0, bootstrap=0)


# ---------------------------------------------------------------------------------------------
# Holm and marks.


@pytest.mark.parametrize("p, want", [
    # sorted 0.005*4=0.02, 0.01*3=0.03, 0.03*2=0.06, 0.04*1=0.04 -> running max 0.06
    ([0.01, 0.04, 0.03, 0.005], [0.03, 0.06, 0.06, 0.02]),
    ([0.3, 0.9, 0.02], [0.6, 0.9, 0.06]),
    ([0.4, 0.45, 0.5], [1.0, 1.0, 1.0]),  # 0.4*3 = 1.2 capped at 1
    ([0.2, 0.2], [0.4, 0.4]),  # ties
    ([0.07], [0.07]),
    ([], []),
])
def test_holm_hand_computed(p, want):
  np.testing.assert_allclose(stats.holm(p), want, rtol=1e-12)


def test_holm_monotone_and_capped():
  rng = np.random.default_rng(0)
  for m in (2, 7, 50):
    p = rng.random(m) ** 3
    adj = np.array(stats.holm(p))
    assert np.all(adj >= p) and np.all(adj <= 1.0)
    order = np.argsort(p)
    assert np.all(np.diff(adj[order]) >= 0)
    assert adj[order[0]] == pytest.approx(min(1.0, m * p[order[0]]))
    assert adj[order[-1]] == pytest.approx(max(adj))


def test_holm_rejects_values_outside_unit_interval():
  with pytest.raises(InputError, match="position 1"):
    stats.holm([0.1, 1.5])
  with pytest.raises(InputError, match="position 0"):
    stats.holm([float("nan")])


def test_apply_holm_and_mark():
  comps = [{"diff": 0.02, "p_perm": 0.01}, {"diff": -0.03, "p_perm": 0.004},
           {"diff": 0.05, "p_perm": 0.03}]
  assert [stats.mark(c) for c in comps] == ["+", "\u2212", "+"]  # raw p before Holm
  stats.apply_holm(comps)
  np.testing.assert_allclose([c["p_holm"] for c in comps], [0.02, 0.012, 0.03])
  assert [stats.mark(c) for c in comps] == ["+", "\u2212", "+"]
  assert [stats.mark(c, alpha=0.025) for c in comps] == ["+", "\u2212", ""]
  assert stats.mark({"diff": 0.0, "p_perm": 0.0}) == ""
  assert stats.mark({"diff": 0.1, "p_perm": 0.001, "p_holm": 0.2}) == ""  # p_holm wins
