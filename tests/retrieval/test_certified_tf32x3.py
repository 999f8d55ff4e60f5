"""`exact.tf32x3_topk`: the TF32 error bounds (three passes, "tf32x3" / "tf32x3_pallas"; one
pass, "tf32") against a float64 twin, and the certificate.

On a CPU the TF32 arithmetic is emulated (the same split and products, float32 sums; the
Pallas kernel in interpret mode); on a GPU (`launch/accelerator_check.sh`'s tests_device step)
the same tests run on the tensor cores, whose accumulation is what the bound's safety factor
covers. The certificate's tests inject an error beyond the bound (`perturb`) and a slack of
their own (`slack`), and check that the fallback fires and the result stays exact; one of them
meets a real one-pass TF32 error that only the one-pass bound covers.
"""
import jax.numpy as jnp
import numpy as np
import pytest

from bilinear_ir.errors import InputError
from bilinear_ir.retrieval import exact, pallas_topk

INTERPRET = pallas_topk.interpret_default()
TILES = pallas_topk.Tiles(tq=16, td=16, steps=3, wk=16, group=4)
STRATEGIES = pytest.mark.parametrize("strategy", list(exact.TF32_PASSES))


def how(strategy: str) -> dict:
  """`tf32x3_topk`'s arguments for a TF32 strategy: {"pallas": bool, "passes": 1 or 3}."""
  return {"pallas": strategy == "tf32x3_pallas", "passes": exact.TF32_PASSES[strategy]}


def adversarial(rng, b: int, n: int, w: int, below: float = 2.0 ** -10
                ) -> tuple[np.ndarray, np.ndarray]:
  """q [b, w], d [n, w] float32 over 2^-20 .. 2^20 whose split errors all point one way: each
  entry is 2^e (1 + below - 2^-23), i.e. hi = 2^e; `below` 2^-10: lo ~ 2^-10 |x| (the largest
  a dropped cross term of 3xTF32 can be); 2^-11: just below the TF32 rounding midpoint, so a
  truncating and a rounding conversion both drop ~2^-11 |x| (one pass). Half the docs are copies
  of the queries (every product positive, so the errors add up: sum |q_i d_i| = |q| |d|); the
  rest have random signs and mantissas."""
  e = rng.integers(-20, 21, (b, w))
  q = np.ldexp(np.float32(1 + below - 2.0 ** -23), e).astype(np.float32)
  d = np.concatenate([np.tile(q, (n // (2 * b), 1)),
                      (rng.choice([-1, 1], (n - n // (2 * b) * b, w))
                       * np.ldexp(rng.uniform(1, 2, (n - n // (2 * b) * b, w)),
                                  rng.integers(-20, 21, (n - n // (2 * b) * b, w))))])
  return q, d.astype(np.float32)


def group_max64(q, d, g: int) -> tuple[np.ndarray, np.ndarray]:
  """float64 group maxima [B, ceil(N / g)] and each group's largest |d| [ceil(N / g)]."""
  s = np.asarray(q, np.float64) @ np.asarray(d, np.float64).T
  norms = np.linalg.norm(np.asarray(d, np.float64), axis=1)
  cols = range(0, d.shape[0], g)
  return (np.stack([s[:, c:c + g].max(axis=1) for c in cols], axis=1),
          np.array([norms[c:c + g].max() for c in cols]))


def test_split_tf32_parts_are_tf32_and_capture_x():
  rng = np.random.default_rng(0)
  x = (rng.choice([-1, 1], 4096) * np.ldexp(rng.uniform(1, 2, 4096),
                                            rng.integers(-40, 41, 4096))).astype(np.float32)
  hi, lo = (np.asarray(v) for v in pallas_topk.split_tf32(jnp.asarray(x)))
  for part in (hi, lo):  # 13 low mantissa bits clear: exact TF32 values
    assert not (part.view(np.int32) & 0x1FFF).any()
  x64 = x.astype(np.float64)
  assert (np.abs(x64 - hi) < 2.0 ** -10 * np.abs(x64)).all()
  assert (np.abs(x64 - hi - lo) < 2.0 ** -20 * np.abs(x64)).all()
  assert (np.abs(x64 - hi - lo) > 2.0 ** -26 * np.abs(x64)).mean() > 0.5  # lo is truncated
  # products of the parts are exact in float32
  np.testing.assert_array_equal((hi * lo).astype(np.float64), hi.astype(np.float64) * lo)


@STRATEGIES
def test_error_bound_holds_on_a_wide_dynamic_range(strategy):
  # |approximate group max - float64 group max| <= c |q| max|d| over the group, for c of the
  # width and passes; on the same inputs a dropped hi.lo term or a single TF32 pass breaks the
  # three passes' bound, so the inputs do test it. One pass: its bound is nearly reached (a
  # bound 3x too loose fails) and the three passes' bound is broken (28x here): the one-pass
  # certificate needs its own
  rng = np.random.default_rng(1)
  b, n, w = 16, 96, 40
  passes = exact.TF32_PASSES[strategy]
  q, d = adversarial(rng, b, n, w, 2.0 ** -10 if passes == 3 else 2.0 ** -11)
  c = exact.tf32x3_relative_bound(w, passes=passes)
  tiles = TILES._replace(tf32x3=True)
  if how(strategy)["pallas"]:
    got = np.asarray(pallas_topk.group_maxima(jnp.asarray(q), jnp.asarray(d), tiles, INTERPRET))
  else:
    got = np.asarray(exact.tf32x3_group_maxima(jnp.asarray(q), jnp.asarray(d), tiles.group,
                                               INTERPRET, passes))
  want, dmax = group_max64(q, d, tiles.group)
  got = got[:, :want.shape[1]]
  norms = np.linalg.norm(q.astype(np.float64), axis=1)[:, None] * dmax[None, :]
  allowed = c * norms
  assert (np.abs(got - want) <= allowed).all(), np.max(np.abs(got - want) / allowed)
  assert np.max(np.abs(got - want) / allowed) > 1e-4  # the arithmetic is not exact float32
  if passes == 1:
    assert np.max(np.abs(got - want) / allowed) > 0.3  # about 0.45: the bound is not slack
    assert (np.abs(got - want) > exact.tf32x3_relative_bound(w) * norms).any()
  else:
    (qh, ql), (dh, dl) = (pallas_topk.split_tf32(jnp.asarray(x)) for x in (q, d))
    for cruder in (qh @ dh.T + ql @ dh.T, qh @ dh.T):  # hi.lo dropped; one TF32 pass
      crude, _ = group_max64(np.eye(b), np.asarray(cruder, np.float64).T, tiles.group)
      assert (np.abs(crude - want) > allowed).any()


@pytest.mark.parametrize("selection", exact.SELECTIONS)
@pytest.mark.parametrize("ng, m, coarse", [(97, 6, 4), (40, 5, 7), (12, 5, 3), (30, 3, 1),
                                           (5, 6, 1)])
def test_select_through_coarse_groups_is_the_one_stage_selection(selection, ng, m, coarse):
  # distinct maxima (some -inf, as empty groups): the m groups kept are the m best of all, and
  # `next` is the (m + 1)-th best (-inf where fewer groups), the brute force's by sorting; with
  # ng = 12, m = 5, c = 3 there are fewer coarse groups (4) than m + 1 (padded)
  rng = np.random.default_rng(ng)
  x = rng.permutation(ng * 4).astype(np.float32)[:ng].reshape(1, ng) - 2.0 * ng
  x = np.concatenate([x, np.where(np.arange(ng) % 5 == 0, -np.inf, x[:, ::-1])]).astype(
      np.float32)
  ids, nxt = exact.tf32x3_select(jnp.asarray(x), m, coarse, selection)
  for row, got, got_next in zip(x, np.asarray(ids), np.asarray(nxt)):
    order = np.argsort(-row, kind="stable")
    want = np.concatenate([row[order], np.full(m + 1, -np.inf)])
    assert sorted(np.asarray(row[got[got < ng]]).tolist() + [-np.inf] * int((got >= ng).sum()),
                  reverse=True) == want[:m].tolist()
    assert got_next == want[m]
    assert len(set(got.tolist())) == m  # no group twice


def test_bound_constant_and_bad_groups():
  # w = 384: 1.1 (3 2^-20 + 8 (1 + 2^-9) gamma_1152 + gamma_384) (the docstring's 6.3e-4);
  # one pass 1.1 (2 2^-10 + 2^-20 + 8 (1 + 2^-9) gamma_384 + gamma_384) (2.4e-3, 3.7x)
  u = 2.0 ** -24
  g = lambda m: m * u / (1 - m * u)
  assert exact.tf32x3_relative_bound(384) == pytest.approx(
      1.1 * (3 * 2.0 ** -20 + 2.0 ** -40 + 8 * (1 + 2.0 ** -9) * g(1152) + g(384)), rel=1e-12)
  assert 6.2e-4 < exact.tf32x3_relative_bound(384) < 6.4e-4
  one = exact.tf32x3_relative_bound(384, passes=1)
  assert one == pytest.approx(
      1.1 * (2 * 2.0 ** -10 + 2.0 ** -20 + 8 * (1 + 2.0 ** -9) * g(384) + g(384)), rel=1e-12)
  assert 2.3e-3 < one < 2.4e-3 and 3.7 < one / exact.tf32x3_relative_bound(384) < 3.8
  q, d = np.ones((2, 8), np.float32), np.ones((20, 8), np.float32)
  with pytest.raises(InputError, match="groups"):
    exact.tf32x3_topk(q, d, 3, groups=2)
  with pytest.raises(InputError, match="coarse"):
    exact.tf32x3_topk(q, d, 3, coarse=0)
  # passes: 1 or 3 (the Pallas kernel: 3 only), as an argument and in the bound
  for bad in ({"passes": 2}, {"passes": 0}, {"passes": True}, {"passes": 1, "pallas": True}):
    with pytest.raises(InputError, match="passes"):
      exact.tf32x3_topk(q, d, 3, **bad)
  with pytest.raises(InputError, match="passes"):
    exact.tf32x3_relative_bound(384, passes=2)


@STRATEGIES
@pytest.mark.parametrize("coarse", [1, 6])
def test_random_queries_are_certified_and_exact(strategy, coarse):
  # standard normal tables: every query certified (no fallback), the float32 brute force's ids;
  # with the groups picked through coarse groups of 6 (250 groups: 42 coarse, the last short)
  rng = np.random.default_rng(2)
  q = rng.standard_normal((24, 48)).astype(np.float32)
  d = rng.standard_normal((1000, 48)).astype(np.float32)
  res, fell = exact.tf32x3_topk(q, d, 5, TILES, coarse=coarse, **how(strategy))
  truth = exact.brute_force(q, d, 5)
  assert fell == 0
  np.testing.assert_array_equal(np.asarray(res.ids), np.asarray(truth.ids))
  # float32 scores, summed in another order than the brute force's matmul
  np.testing.assert_allclose(np.asarray(res.scores), np.asarray(truth.scores), rtol=0,
                             atol=exact.gamma(48) * 48 * 2)


@STRATEGIES
@pytest.mark.parametrize("coarse", [1, 4])
def test_an_error_beyond_the_bound_falls_back_and_stays_exact(strategy, coarse):
  # query 3's approximate maxima raised far above its scores, the most to the lowest group ids
  # (an error far beyond the bound): the m = 8 groups rescored are groups 0 .. 7, which miss
  # its top-4, and its (m + 1)-th group is not below its k-th score, so it falls back to the
  # float32 scan; the other queries stay certified; every id is the brute force's
  rng = np.random.default_rng(3)
  q = rng.standard_normal((8, 24)).astype(np.float32)
  d = rng.standard_normal((203, 24)).astype(np.float32)  # N not a multiple of G = 4
  perturb = np.zeros((8, 51), np.float32)
  perturb[3] = 1e3 * np.arange(51, 0, -1)
  truth = np.asarray(exact.brute_force(q, d, 4).ids)
  assert truth[3].max() >= 8 * 4  # groups 0 .. 7 alone would give other ids
  res, fell = exact.tf32x3_topk(q, d, 4, TILES, perturb=perturb, coarse=coarse,
                                **how(strategy))
  assert fell == 1
  np.testing.assert_array_equal(np.asarray(res.ids), truth)


@STRATEGIES
def test_certificate_is_strict_and_counts_the_bound(strategy):
  # one-hot query: scores = d[:, 0] = [5, 0, 9, 0, 0, 5] in groups of 2 -> maxima 5, 9, 5; the
  # top-2 is docs 2 (9) and 0 (5, lower id than doc 5). Group 0's approximate maximum is made
  # 4 (an error of 1, which the slack of 1 allows): the m = 2 best groups are 1 and 2, whose
  # top-2 is docs 2 and 5, k-th score 5 = group 0's 4 + 1. Only a strict certificate (4 + 1 <
  # 5 fails) that adds the slack sends the query to the scan and returns doc 0.
  d = np.zeros((6, 8), np.float32)
  d[:, 0] = [5, 0, 9, 0, 0, 5]
  q = np.eye(8, dtype=np.float32)[:1]
  tiles = TILES._replace(group=2)
  perturb = np.array([[-1.0, 0.0, 0.0]], np.float32)
  res, fell = exact.tf32x3_topk(q, d, 2, tiles, groups=2, slack=1.0, perturb=perturb,
                                **how(strategy))
  assert fell == 1
  np.testing.assert_array_equal(np.asarray(res.ids), [[2, 0]])
  np.testing.assert_array_equal(np.asarray(res.scores), [[9, 5]])
  # a slack of 0.5 > the error would not have covered it: certified, and (as it must be, the
  # bound being broken) the other doc
  res, fell = exact.tf32x3_topk(q, d, 2, tiles, groups=2, slack=0.5, perturb=perturb,
                                **how(strategy))
  assert fell == 0 and np.asarray(res.ids).tolist() == [[2, 5]]


@STRATEGIES
def test_all_equal_docs_fall_back_to_the_lowest_ids(strategy):
  # every score ties: no group is strictly below the k-th score, every query falls back, the
  # result is ids 0 .. k - 1
  q = np.ones((5, 16), np.float32)
  d = np.ones((70, 16), np.float32)
  res, fell = exact.tf32x3_topk(q, d, 6, TILES, **how(strategy))
  assert fell == 5
  np.testing.assert_array_equal(np.asarray(res.ids), np.tile(np.arange(6), (5, 1)))


def test_one_pass_strategy_is_exact_on_ties_near_ties_and_padding():
  # exact.topk(strategy="tf32"): integer scores with many exact ties (250 docs: groups of 4,
  # the last one short; duplicates of doc 7 across groups), exact in float32 and in one TF32
  # pass: the brute force's ids and scores, ties by lower id
  rng = np.random.default_rng(4)
  q = rng.integers(-2, 3, (37, 40)).astype(np.float32)
  d = rng.integers(-2, 3, (250, 40)).astype(np.float32)
  d[[60, 130, 249]] = d[7]
  res = exact.topk(q, d, 10, strategy="tf32", tiles=TILES)
  truth = exact.brute_force(q, d, 10)
  np.testing.assert_array_equal(np.asarray(res.ids), np.asarray(truth.ids))
  np.testing.assert_array_equal(np.asarray(res.scores), np.asarray(truth.scores))
  assert (np.diff(np.asarray(truth.scores), axis=1) == 0).any()  # ties inside the top-10
  # 1-ulp near-ties (one-hot queries: score = d[:, 0]) in 5 groups, which one TF32 pass cannot
  # tell apart (1 and the next float32 above both have TF32 part 1): the groups' maxima tie,
  # the float32 rescoring orders their docs, and the rest (0.5) is far below: certified, k = 5.
  # k = 6 reaches the ties at 0.5, which no certificate can settle: the scan, the same order
  x = np.float32(1.0)
  up = np.nextafter(x, np.float32(2))
  near = np.full((130, 24), 0.5, np.float32)
  near[[5, 70, 129], 0] = x
  near[[100, 3], 0] = up
  hot = np.eye(24, dtype=np.float32)[[0, 0, 0]]
  for k, falls in ((5, 0), (6, 3)):
    res, fell = exact.tf32x3_topk(hot, near, k, TILES, passes=1)
    assert fell == falls
    np.testing.assert_array_equal(np.asarray(res.ids),
                                  np.tile([3, 100, 5, 70, 129, 0][:k], (3, 1)))
    np.testing.assert_array_equal(np.asarray(res.scores)[0], [up, up, x, x, x, 0.5][:k])
    np.testing.assert_array_equal(np.asarray(exact.topk(hot, near, k, strategy="tf32").ids),
                                  np.asarray(res.ids))
  # k > N (6 docs, k = 9; exact.topk rejects it, tf32x3_topk pads): -inf / NO_DOC slots
  small = rng.integers(-3, 4, (6, 20)).astype(np.float32)
  few = rng.integers(-3, 4, (5, 20)).astype(np.float32)
  res, _ = exact.tf32x3_topk(few, small, 9, TILES, passes=1, id_offset=1000)
  truth = exact.brute_force(few, small, 6)
  np.testing.assert_array_equal(np.asarray(res.ids)[:, :6], np.asarray(truth.ids) + 1000)
  np.testing.assert_array_equal(np.asarray(res.scores)[:, :6], np.asarray(truth.scores))
  assert (np.asarray(res.ids)[:, 6:] == exact.NO_DOC).all()
  assert (np.asarray(res.scores)[:, 6:] == -np.inf).all()


def test_the_certificate_counts_the_one_pass_bound():
  # docs 0 (group 0) and 2 (group 1) score 1 + 2^-13 and 1 + 2^-12 for query e_0; one TF32
  # pass (truncated or rounded) makes both 1, so group 0 wins the tie and doc 0 is rescored.
  # The certificate then needs 1 + e < 1 + 2^-13: with the three passes' e (c = 1.6e-5 at
  # w = 8, times max|d| ~ 2.8) it holds and would return doc 0, the wrong doc; the one-pass e
  # (c = 2.2e-3) sends the query to the scan, which returns doc 2. Query e_1's best doc (6,
  # score 4) is far ahead: certified either way.
  d = np.full((8, 8), 0.5, np.float32)
  d[0] = 1 + 2.0 ** -13
  d[2] = 1 + 2.0 ** -12
  d[6, 1] = 4.0
  q = np.eye(8, dtype=np.float32)[:2]
  tiles = TILES._replace(group=2)
  res, fell = exact.tf32x3_topk(q, d, 1, tiles, groups=1, passes=1)
  assert fell == 1
  np.testing.assert_array_equal(np.asarray(res.ids), [[2], [6]])
  np.testing.assert_array_equal(np.asarray(res.ids), np.asarray(exact.brute_force(q, d, 1).ids))
  # the difference matters here: with the three passes' slack the same maxima certify both
  # queries and query 0 gets doc 0
  wrong = exact.tf32x3_relative_bound(8) * exact.max_doc_norm(d)
  res, fell = exact.tf32x3_topk(q, d, 1, tiles, groups=1, passes=1, slack=wrong)
  assert fell == 0 and np.asarray(res.ids).tolist() == [[0], [6]]
