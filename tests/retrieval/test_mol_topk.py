"""MoL top-K algorithms (paper 003, section 3): appendix B, exactness, gap bounds, numpy twins."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bilinear_ir import scorers
from bilinear_ir.errors import InputError
from bilinear_ir.retrieval import mol_topk as mt
from bilinear_ir.retrieval import ranking

# Appendix B, Table 6: items a..e, two components, K = 2.
TABLE6_LOGITS = [[1.0, 1.0], [0.8, 0.0], [0.0, 0.8], [0.7, 0.0], [0.2, 0.2]]
TABLE6_GATES = [[0.5, 0.5], [0.5, 0.5], [0.5, 0.5], [1.0, 0.0], [0.5, 0.5]]
A, B, C, D, E = range(5)


def _table6():
  return mt.DenseSource(jnp.asarray([TABLE6_LOGITS], jnp.float32),
                        jnp.asarray([TABLE6_GATES], jnp.float32))


def test_appendix_b_exact_algorithm_returns_a_and_d():
  src = _table6()
  out = mt.exact_two_pass(src, k=2, max_range=4)
  np.testing.assert_array_equal(out.ids, [[A, D]])
  np.testing.assert_allclose(out.scores, [[1.0, 0.7]], rtol=1e-6)
  assert not bool(out.fallback[0])
  # S_min = 0.4 puts exactly a, b, c, d in the range: a bound of 3 overflows (brute force answers).
  small = mt.exact_two_pass(src, k=2, max_range=3)
  assert bool(small.fallback[0])
  np.testing.assert_array_equal(small.ids, [[A, D]])
  np.testing.assert_array_equal(mt.brute_force(src, k=2).ids, [[A, D]])


def test_appendix_b_topk_per_embedding_gap_bounds():
  src = _table6()
  out = mt.topk_per_embedding(src, k=2, n=2)
  np.testing.assert_array_equal(out.ids, [[A, B]])  # b and c tie at 0.4: the lower index wins
  np.testing.assert_allclose(out.scores, [[1.0, 0.4]], rtol=1e-6)
  np.testing.assert_allclose(out.gap_bound, [0.3], rtol=1e-6)  # S = max{0.7, 0.2}, S_K = 0.4
  np.testing.assert_allclose(out.gap_bound_retrieved, [0.4], rtol=1e-6)  # 0.8 - 0.4
  # The bound is tight here: the real second score (d, 0.7) is 0.3 above S_K.
  np.testing.assert_allclose(mt.brute_force(src, k=2).scores[0, 1] - out.scores[0, 1], 0.3,
                             rtol=1e-6)
  # The candidates are exactly {a, b, c}: asking for 5 results returns those three.
  np.testing.assert_array_equal(mt.topk_per_embedding(src, k=5, n=2).ids, [[A, B, C, -1, -1]])


# ----- numpy twins of the algorithms' definitions, on dyadic values (exact in float32) -----

def _order(vals):
  """Ids by (value desc, id asc)."""
  return np.lexsort((np.arange(len(vals)), -vals))


def _np_rescore(phi, cand, k):
  cand = np.array(sorted(set(cand)), int)
  top = cand[_order(phi[cand])][:k]
  return top, phi[top]


def _np_approx(logits, phi, k, n1, n2):
  """CombTopK(n1, n2) of one query: ids, tight bound, looser bound (TopKAvg: n1 = 0 etc.)."""
  num, p = logits.shape
  per = [_order(logits[:, j]) for j in range(p)]
  avg = _order(logits.mean(-1))[:n2]
  cand = np.concatenate([pp[:n1] for pp in per] + [avg]).astype(int)
  ids, scores = _np_rescore(phi, cand, k)
  s_k = scores[k - 1]
  if n2 == 0:
    s = max(logits[per[j][n1], j] for j in range(p)) if n1 < num else -np.inf  # Theorem 2
  else:
    s = max((logits[x, j] for j in range(p) for x in range(num)
             if x not in set(per[j][:n1]) and x not in set(avg)), default=-np.inf)  # Theorem 3
  s_ret = max(logits[per[j][n1 - 1], j] for j in range(p)) if n1 else logits.max()
  gap = lambda v: 0.0 if v == -np.inf else max(v - s_k, 0.0)
  return ids, gap(s), gap(s_ret)


def _dyadic_source(seed, batch, num, p, dup=0):
  """Logits in multiples of 1/8 and gates in multiples of 1/4: sums are exact, ties abound."""
  rng = np.random.default_rng(seed)
  logits = rng.integers(-8, 9, (batch, num, p)) / 8.0
  quarters = rng.integers(0, p, (batch, num, 4))
  gates = np.zeros((batch, num, p))
  for j in range(4):
    np.put_along_axis(gates, quarters[..., j:j + 1],
                      np.take_along_axis(gates, quarters[..., j:j + 1], -1) + 0.25, -1)
  if dup:  # duplicated items: exact ties of every quantity
    logits[:, -dup:], gates[:, -dup:] = logits[:, :dup], gates[:, :dup]
  phi = (logits * gates).sum(-1)
  src = mt.DenseSource(jnp.asarray(logits, jnp.float32), jnp.asarray(gates, jnp.float32))
  return src, logits, phi


@pytest.mark.parametrize("k,n1,n2", [(5, 3, 0), (5, 0, 7), (5, 2, 4), (12, 4, 10)])
def test_approximate_algorithms_match_numpy_definitions(k, n1, n2):
  for seed in range(6):
    src, logits, phi = _dyadic_source(seed, batch=3, num=37, p=4, dup=6)
    if n2 == 0:
      out = mt.topk_per_embedding(src, k=k, n=n1, chunk=8)
    elif n1 == 0:
      out = mt.topk_avg(src, k=k, n=n2, chunk=8)
    else:
      out = mt.comb_topk(src, k=k, n1=n1, n2=n2, chunk=8)
    for b in range(3):
      ids, tight, loose = _np_approx(logits[b], phi[b], k, n1, n2)
      np.testing.assert_array_equal(out.ids[b], ids)
      np.testing.assert_array_equal(out.scores[b], phi[b, ids])
      assert float(out.gap_bound[b]) == tight and float(out.gap_bound_retrieved[b]) == loose


def test_exact_algorithms_match_numpy_with_exact_ties():
  for seed in range(6):
    src, _, phi = _dyadic_source(seed + 10, batch=3, num=37, p=4, dup=8)
    for out in (mt.brute_force(src, k=9, chunk=8), mt.exact_two_pass(src, k=9, max_range=30,
                                                                        chunk=8)):
      for b in range(3):
        ids = _order(phi[b])[:9]
        np.testing.assert_array_equal(out.ids[b], ids)


# ----- a real MoL: random gating MLP over random components -----

def _mol_source(seed, batch=4, num=300, p_q=4, p_x=4, d_p=8, dup=20, temperature=0.1):
  module = scorers.build("mol", dim=d_p, p_q=p_q, p_x=p_x, d_p=d_p, gate_hidden=16,
                         temperature=temperature)
  params = scorers.init_params(module, jax.random.key(seed))
  rng = np.random.default_rng(seed)
  centre = rng.normal(size=(1, 1, d_p))
  items = rng.normal(size=(num, p_x, d_p)) + centre  # correlated with the queries
  items[-dup:] = items[:dup]  # exact duplicates: ties
  items /= np.linalg.norm(items, axis=-1, keepdims=True)
  qc = rng.normal(size=(batch, p_q, d_p)) + centre
  qc /= np.linalg.norm(qc, axis=-1, keepdims=True)
  index = mt.index_from_components(jnp.asarray(items, jnp.float32), p_q)
  src = mt.MolSource(jnp.asarray(qc, jnp.float32), index, params, module)
  logits = np.einsum("bad,nxd->bnax", qc, items).reshape(batch, num, -1) / temperature
  h = logits @ np.asarray(params["gate_net"]["hidden"]["kernel"], np.float64)
  h = h + np.asarray(params["gate_net"]["hidden"]["bias"])
  h = h / (1 + np.exp(-h))
  z = h @ np.asarray(params["gate_net"]["out"]["kernel"], np.float64)
  z = z + np.asarray(params["gate_net"]["out"]["bias"])
  gates = np.exp(z - z.max(-1, keepdims=True))
  gates /= gates.sum(-1, keepdims=True)
  return src, logits, (gates * logits).sum(-1)


def _assert_valid_topk(ids, scores, phi, k, tol=1e-4):
  """ids are a correct top-k of phi (any order among near-ties), with their scores."""
  assert len(set(ids.tolist())) == k
  np.testing.assert_allclose(scores, phi[ids], rtol=tol, atol=tol)
  np.testing.assert_allclose(np.sort(phi[ids])[::-1], np.sort(phi)[::-1][:k], rtol=tol, atol=tol)


def test_exact_two_pass_equals_brute_force_on_random_mols():
  fallbacks = 0
  for seed in range(4):
    p = (2, 4)[seed % 2]  # P = 4 and 16
    src, _, phi = _mol_source(seed, p_q=p, p_x=p)
    bf = mt.brute_force(src, k=10, chunk=64)
    for max_range in (40, 300):
      ex = mt.exact_two_pass(src, k=10, max_range=max_range, chunk=64)
      fallbacks += int(np.sum(ex.fallback))
      np.testing.assert_allclose(ex.scores, bf.scores, rtol=1e-5, atol=1e-5)
      for b in range(phi.shape[0]):
        _assert_valid_topk(np.asarray(ex.ids[b]), np.asarray(ex.scores[b]), phi[b], 10)
        _assert_valid_topk(np.asarray(bf.ids[b]), np.asarray(bf.scores[b]), phi[b], 10)
      if max_range == 300:  # the whole corpus fits the range: never a fallback
        assert not np.any(ex.fallback)
  assert fallbacks > 0  # the small range did overflow somewhere, and the fallback was exact


@pytest.mark.parametrize("method,n", [("per", 3), ("per", 12), ("avg", 15), ("avg", 60),
                                      ("comb", (2, 10)), ("comb", (6, 30))])
def test_gap_bounds_are_upper_bounds_of_the_true_gap(method, n):
  with jax.default_matmul_precision("float32"):  # the reference phi is float64 numpy
    _check_gap_bounds(method, n)


def _check_gap_bounds(method, n):
  """The approximate methods' gap bounds bound the true gap; their scores are phi's. The
  approximate methods' matmuls follow the backend's default precision (TF32 on recent GPUs,
  ~1e-3 off at these scores): the test runs them at float32 to check the algorithm."""
  k = 10
  for seed in range(6):
    src, logits, phi = _mol_source(100 + seed, p_q=2, p_x=4)
    if method == "per":
      out = mt.topk_per_embedding(src, k=k, n=n, chunk=64)
    elif method == "avg":
      out = mt.topk_avg(src, k=k, n=n, chunk=64)
    else:
      out = mt.comb_topk(src, k=k, n1=n[0], n2=n[1], chunk=64)
    for b in range(phi.shape[0]):
      ids, s_k = np.asarray(out.ids[b]), float(out.scores[b, k - 1])
      true_top = _order(phi[b])[:k]
      kth_gap = phi[b, true_top[-1]] - s_k  # real K-th score minus retrieved K-th
      missed = [phi[b, x] for x in true_top if x not in set(ids.tolist())]
      def2_gap = max(missed) - s_k if missed else 0.0  # Definition 2: best missed item
      tight, loose = float(out.gap_bound[b]), float(out.gap_bound_retrieved[b])
      assert tight >= max(kth_gap, def2_gap) - 1e-4
      assert loose >= tight - 1e-4
      np.testing.assert_allclose(out.scores[b], phi[b, ids], rtol=1e-4, atol=1e-4)
  untight = mt.topk_avg(src, k=k, n=15, tight_bound=False, chunk=64)
  assert np.all(np.isinf(untight.gap_bound))


def test_shapes_padding_and_index():
  src, _, _ = _mol_source(3, batch=2, num=50, p_q=2, p_x=2, dup=1)
  out = mt.topk_per_embedding(src, k=20, n=2, chunk=16)  # at most 4 * 2 = 8 candidates
  assert out.ids.shape == (2, 20) and out.scores.shape == (2, 20)
  assert out.gap_bound.shape == (2,) and out.fallback.shape == (2,)
  assert np.all(np.asarray(out.ids[:, 8:]) == -1) and np.all(np.isneginf(out.scores[:, 8:]))
  assert np.all(np.isinf(out.gap_bound))  # fewer than K candidates: no finite bound
  full = mt.topk_avg(src, k=5, n=50, chunk=16)  # every item is a candidate: exact, gap 0
  np.testing.assert_array_equal(mt.topk_avg(src, k=5, n=80, chunk=16).ids, full.ids)  # N > items
  np.testing.assert_array_equal(full.ids, mt.brute_force(src, k=5, chunk=16).ids)
  assert np.all(np.asarray(full.gap_bound) == 0) and np.all(
      np.asarray(full.gap_bound_retrieved) == 0)

  module = scorers.build("mol", dim=6, p_q=2, p_x=3, d_p=4, hidden=5, gate_hidden=4)
  params = scorers.init_params(module, jax.random.key(0))
  docs = np.random.default_rng(0).normal(size=(11, 6)).astype(np.float32)
  # The scorer's own matmuls follow the backend's default precision (TF32 on recent GPUs);
  # the index and the references are compared at float32.
  with jax.default_matmul_precision("float32"):
    index = mt.build_index(module, params, docs, chunk=4)
    comps = module.apply({"params": params}, docs, method=module.item_components)
    np.testing.assert_allclose(index.items, comps, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(index.avg, np.asarray(comps).sum(1) / 6, rtol=1e-6, atol=1e-6)
    # The avg table gives the mean logit: <sum_a f_a / temperature, avg> = mean_p l_p.
    q = np.random.default_rng(1).normal(size=(3, 6)).astype(np.float32)
    qc = module.apply({"params": params}, q, method=module.query_components)
    logits = module.apply({"params": params}, q, docs, method=module.logits)
    s = mt.MolSource(qc, index, params, module)
    np.testing.assert_allclose(s.avg_scores(0, 11), np.asarray(logits).mean(-1), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(mt.brute_force(s, k=11).scores,
                               -np.sort(-np.asarray(module.apply(
                                   {"params": params}, q, docs, method=module.score_all)), axis=1),
                               rtol=1e-5, atol=1e-5)


def test_residual_mol_brute_force_is_exact_and_bound_algorithms_refuse_it(monkeypatch):
  """The residual MoL (dot product as logit P + 1, unconstrained lam): the index keeps the raw
  docs, brute force and `ranking.score_topk` equal its `score_all`; the algorithms that rest on
  phi <= max_p l_p refuse it."""
  monkeypatch.setattr(ranking, "MOL_QUERY_CHUNK", 4)  # 3 query batches
  module = scorers.build("mol", dim=6, p_q=2, p_x=3, d_p=4, hidden=5, gate_hidden=4,
                         residual="dot")
  params = dict(scorers.init_params(module, jax.random.key(0)), lam=jnp.full((1,), 1.7, jnp.float32))  # > 1
  rng = np.random.default_rng(4)
  q = rng.normal(size=(10, 6)).astype(np.float32)
  docs = rng.normal(size=(37, 6)).astype(np.float32)
  with jax.default_matmul_precision("float32"):
    full = np.asarray(module.apply({"params": params}, q, docs, method=module.score_all))
    logits = np.asarray(module.apply({"params": params}, q, docs, method=module.logits))
    assert np.any(full > logits.max(-1) + 1e-3)  # not bounded by its largest logit
    index = mt.build_index(module, params, docs, chunk=8)
    np.testing.assert_array_equal(index.docs, docs)
    qc = module.apply({"params": params}, q, method=module.query_components)
    src = mt.MolSource(qc, index, params, module, jnp.asarray(q))
    np.testing.assert_allclose(src.logits(0, 37), logits, rtol=1e-5, atol=1e-5)
    ids = rng.integers(0, 37, (10, 5))
    np.testing.assert_allclose(src.logits_at(jnp.asarray(ids)),
                               np.take_along_axis(logits, ids[..., None], 1), rtol=1e-5,
                               atol=1e-5)
    bf = mt.brute_force(src, k=6, chunk=8)
    idx, scores = ranking.score_topk(module, params, q, docs, 6)
  want = np.lexsort((np.broadcast_to(np.arange(37), full.shape), -full), axis=1)[:, :6]
  np.testing.assert_array_equal(bf.ids, want)
  np.testing.assert_allclose(bf.scores, np.take_along_axis(full, want, 1), rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(idx, want)
  for run in (lambda s: mt.exact_two_pass(s, k=3), lambda s: mt.topk_per_embedding(s, k=3, n=4),
              lambda s: mt.topk_avg(s, k=3, n=8), lambda s: mt.comb_topk(s, k=3, n1=2, n2=4)):
    with pytest.raises(InputError, match="not bounded by its largest logit"):
      run(src)
  with pytest.raises(InputError, match="needs the raw queries"):
    mt.brute_force(mt.MolSource(qc, index, params, module), k=3)
