"""`exact.tf32x3_topk`: the 3xTF32 error bound against a float64 twin, and the certificate.

On a CPU the 3xTF32 arithmetic is emulated (the same split and products, float32 sums; the
Pallas kernel in interpret mode); on a GPU (`launch/accelerator_check.sh`'s tests_device step)
the same tests run on the tensor cores, whose accumulation is what the bound's safety factor
covers. The certificate's tests inject an error beyond the bound (`perturb`) and a slack of
their own (`slack`), and check that the fallback fires and the result stays exact.
"""
import jax.numpy as jnp
import numpy as np
import pytest

from bilinear_ir.errors import InputError
from bilinear_ir.retrieval import exact, pallas_topk

INTERPRET = pallas_topk.interpret_default()
TILES = pallas_topk.Tiles(tq=16, td=16, steps=3, wk=16, group=4)
IMPLS = pytest.mark.parametrize("pallas", [False, True], ids=["xla", "pallas"])


def adversarial(rng, b: int, n: int, w: int) -> tuple[np.ndarray, np.ndarray]:
  """q [b, w], d [n, w] float32 over 2^-20 .. 2^20 whose split errors all point one way: each
  entry is +-2^e (1 + 2^-10 - 2^-23), i.e. hi = 2^e and lo ~ 2^-10 |x| (the largest a dropped
  cross term can be), and half the docs are copies of the queries (every product positive, so
  the errors add up: sum |q_i d_i| = |q| |d|). The rest have random signs and mantissas."""
  e = rng.integers(-20, 21, (b, w))
  q = np.ldexp(np.float32(1 + 2.0 ** -10 - 2.0 ** -23), e).astype(np.float32)
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


@IMPLS
def test_error_bound_holds_on_a_wide_dynamic_range(pallas):
  # |approximate group max - float64 group max| <= c |q| max|d| over the group, for c of the
  # width; on the same inputs a dropped hi.lo term or a single TF32 pass breaks that bound,
  # so the inputs do test it
  rng = np.random.default_rng(1)
  b, n, w = 16, 96, 40
  q, d = adversarial(rng, b, n, w)
  c = exact.tf32x3_relative_bound(w)
  tiles = TILES._replace(tf32x3=True)
  if pallas:
    got = np.asarray(pallas_topk.group_maxima(jnp.asarray(q), jnp.asarray(d), tiles, INTERPRET))
  else:
    got = np.asarray(exact.tf32x3_group_maxima(jnp.asarray(q), jnp.asarray(d), tiles.group,
                                               INTERPRET))
  want, dmax = group_max64(q, d, tiles.group)
  got = got[:, :want.shape[1]]
  allowed = c * np.linalg.norm(q.astype(np.float64), axis=1)[:, None] * dmax[None, :]
  assert (np.abs(got - want) <= allowed).all(), np.max(np.abs(got - want) / allowed)
  assert np.max(np.abs(got - want) / allowed) > 1e-4  # the arithmetic is not exact float32
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
  # w = 384: 1.1 (3 2^-20 + 8 (1 + 2^-9) gamma_1152 + gamma_384) (the docstring's 6.3e-4)
  u = 2.0 ** -24
  g = lambda m: m * u / (1 - m * u)
  assert exact.tf32x3_relative_bound(384) == pytest.approx(
      1.1 * (3 * 2.0 ** -20 + 2.0 ** -40 + 8 * (1 + 2.0 ** -9) * g(1152) + g(384)), rel=1e-12)
  assert 6.2e-4 < exact.tf32x3_relative_bound(384) < 6.4e-4
  with pytest.raises(InputError, match="groups"):
    exact.tf32x3_topk(np.ones((2, 8), np.float32), np.ones((20, 8), np.float32), 3, groups=2)
  with pytest.raises(InputError, match="coarse"):
    exact.tf32x3_topk(np.ones((2, 8), np.float32), np.ones((20, 8), np.float32), 3, coarse=0)


@IMPLS
@pytest.mark.parametrize("coarse", [1, 6])
def test_random_queries_are_certified_and_exact(pallas, coarse):
  # standard normal tables: every query certified (no fallback), the float32 brute force's ids;
  # with the groups picked through coarse groups of 6 (250 groups: 42 coarse, the last short)
  rng = np.random.default_rng(2)
  q = rng.standard_normal((24, 48)).astype(np.float32)
  d = rng.standard_normal((1000, 48)).astype(np.float32)
  res, fell = exact.tf32x3_topk(q, d, 5, TILES, pallas=pallas, coarse=coarse)
  truth = exact.brute_force(q, d, 5)
  assert fell == 0
  np.testing.assert_array_equal(np.asarray(res.ids), np.asarray(truth.ids))
  # float32 scores, summed in another order than the brute force's matmul
  np.testing.assert_allclose(np.asarray(res.scores), np.asarray(truth.scores), rtol=0,
                             atol=exact.gamma(48) * 48 * 2)


@IMPLS
@pytest.mark.parametrize("coarse", [1, 4])
def test_an_error_beyond_the_bound_falls_back_and_stays_exact(pallas, coarse):
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
  res, fell = exact.tf32x3_topk(q, d, 4, TILES, pallas=pallas, perturb=perturb, coarse=coarse)
  assert fell == 1
  np.testing.assert_array_equal(np.asarray(res.ids), truth)


@IMPLS
def test_certificate_is_strict_and_counts_the_bound(pallas):
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
  res, fell = exact.tf32x3_topk(q, d, 2, tiles, pallas=pallas, groups=2, slack=1.0,
                                perturb=perturb)
  assert fell == 1
  np.testing.assert_array_equal(np.asarray(res.ids), [[2, 0]])
  np.testing.assert_array_equal(np.asarray(res.scores), [[9, 5]])
  # a slack of 0.5 > the error would not have covered it: certified, and (as it must be, the
  # bound being broken) the other doc
  res, fell = exact.tf32x3_topk(q, d, 2, tiles, pallas=pallas, groups=2, slack=0.5,
                                perturb=perturb)
  assert fell == 0 and np.asarray(res.ids).tolist() == [[2, 5]]


def test_all_equal_docs_fall_back_to_the_lowest_ids():
  # every score ties: no group is strictly below the k-th score, every query falls back, the
  # result is ids 0 .. k - 1
  q = np.ones((5, 16), np.float32)
  d = np.ones((70, 16), np.float32)
  res, fell = exact.tf32x3_topk(q, d, 6, TILES)
  assert fell == 5
  np.testing.assert_array_equal(np.asarray(res.ids), np.tile(np.arange(6), (5, 1)))
