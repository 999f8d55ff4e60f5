"""Exact chunked top-k vs a numpy brute-force twin: sizes, ties, dtypes, scorers, multi-vector."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bilinear_ir import scorers
from bilinear_ir.errors import InputError
from bilinear_ir.retrieval import exact


def twin(q, d, k):
  """numpy top-k in float64: order by (score desc, id asc)."""
  s = np.asarray(q, np.float64) @ np.asarray(d, np.float64).T
  ids = np.broadcast_to(np.arange(s.shape[1]), s.shape)
  order = np.lexsort((ids, -s), axis=1)[:, :k]
  return order, np.take_along_axis(s, order, axis=1)


def ints(rng, shape, lo=-3, hi=4):
  """Small integers as float32: every score is exact and ties are frequent."""
  return rng.integers(lo, hi, shape).astype(np.float32)


@pytest.mark.parametrize("n,k,chunk,block", [
    (1000, 10, 128, None),   # several chunks + a tail (1000 = 7 * 128 + 104)
    (37, 37, 16, None),      # k == N, tail only partly filled
    (5000, 3, 2048, 32),     # default-like chunk, tail of 904
    (100, 50, 64, None),     # k near N: block falls back to 1
    (33, 1, 32, 8),          # k = 1, N = chunk + 1
    (7, 5, 2048, None),      # N smaller than one block
    (640, 10, 64, 16),       # N a multiple of the chunk (no tail)
])
def test_topk_equals_brute_force_with_ties(n, k, chunk, block):
  rng = np.random.default_rng(n + k)
  q, d = ints(rng, (6, 8)), ints(rng, (n, 8))
  ids, scores = twin(q, d, k)
  res = exact.topk(q, d, k, chunk=chunk, block=block)
  np.testing.assert_array_equal(np.asarray(res.ids), ids)
  np.testing.assert_array_equal(np.asarray(res.scores), scores)
  ref = exact.brute_force(q, d, k)
  np.testing.assert_array_equal(np.asarray(ref.ids), ids)


def test_ties_across_chunks_prefer_lower_id():
  rng = np.random.default_rng(0)
  d = rng.normal(size=(300, 4)).astype(np.float32) * 0.01
  best = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
  dup = [290, 5, 150, 64, 63]       # same best row in many chunks/blocks, listed out of order
  d[dup] = best
  q = best[None]
  res = exact.topk(q, d, 4, chunk=32, block=8)
  np.testing.assert_array_equal(np.asarray(res.ids)[0], sorted(dup)[:4])


def test_random_real_scores_and_query_tiles():
  rng = np.random.default_rng(1)
  q = rng.normal(size=(23, 16)).astype(np.float32)
  d = rng.normal(size=(3001, 16)).astype(np.float32)
  ids, scores = twin(q, d, 10)
  res = exact.topk(q, d, 10, chunk=256, query_chunk=8)   # 3 query tiles, the last padded
  np.testing.assert_array_equal(np.asarray(res.ids), ids)
  np.testing.assert_allclose(np.asarray(res.scores), scores, rtol=1e-5, atol=1e-5)


def test_bf16_table_matches_rounded_brute_force():
  rng = np.random.default_rng(2)
  q, d = ints(rng, (5, 12), -8, 9), ints(rng, (700, 12), -8, 9)  # exact in bf16
  res = exact.topk(q, jnp.asarray(d, jnp.bfloat16), 7, chunk=128)
  ids, scores = twin(q, d, 7)
  assert res.scores.dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(res.ids), ids)
  np.testing.assert_array_equal(np.asarray(res.scores), scores)


@pytest.mark.parametrize("name,kw", [("dot", {}), ("wdp", {}), ("bilinear", {}),
                                     ("lowrank", {"rank": 4}),
                                     ("lowrank", {"rank": 4, "residual": "identity"})])
def test_every_table_scorer(name, kw):
  n = 16
  module = scorers.build(name, dim=n, **kw)
  params = scorers.init_params(module, jax.random.key(0))
  rng = np.random.default_rng(3)
  # Move away from the identity init so the tables are not the raw embeddings.
  params = jax.tree.map(lambda p: p + 0.3 * rng.normal(size=p.shape).astype(np.float32), params)
  q = rng.normal(size=(9, n)).astype(np.float32)
  docs = rng.normal(size=(500, n)).astype(np.float32)
  v = {"params": params}
  # The scorer's own matmuls run at the backend's default precision (TF32 on recent GPUs): the
  # tables and the reference are computed at float32, the precision the exact scan works at.
  with jax.default_matmul_precision("float32"):
    qt = module.apply(v, q, method=module.query_table)
    dt = module.apply(v, docs, method=module.doc_table)
    full = np.asarray(module.apply(v, q, docs, method=module.score_all), np.float64)
  order = np.argsort(-full, axis=1, kind="stable")[:, :10]
  res = exact.topk(qt, dt, 10, chunk=64)
  np.testing.assert_array_equal(np.asarray(res.ids), order)
  np.testing.assert_allclose(np.asarray(res.scores), np.take_along_axis(full, order, 1),
                             rtol=1e-4, atol=1e-4)


def test_bad_inputs_are_input_errors():
  q, d = np.zeros((2, 4), np.float32), np.zeros((10, 4), np.float32)
  with pytest.raises(InputError, match="k must be"):
    exact.topk(q, d, 11)
  with pytest.raises(InputError, match="k must be"):
    exact.topk(q, d, 0)
  with pytest.raises(InputError, match="width 5 does not match"):
    exact.topk(q, np.zeros((10, 5), np.float32), 3)
  with pytest.raises(InputError, match="2-D"):
    exact.topk(q[0], d, 3)
  with pytest.raises(InputError, match="k must be"):
    exact.topk_stream(q, [d[:4], d[4:]], 11)


def test_merge_orders_by_score_then_id():
  scores = np.array([[1.0, 3.0, 3.0, 2.0, 3.0]], np.float32)
  ids = np.array([[7, 9, 4, 1, 6]], np.int32)
  res = exact.merge(scores, ids, 4)
  np.testing.assert_array_equal(np.asarray(res.ids), [[4, 6, 9, 1]])
  np.testing.assert_array_equal(np.asarray(res.scores), [[3.0, 3.0, 3.0, 2.0]])


def test_stream_equals_topk_over_concatenation(tmp_path):
  rng = np.random.default_rng(4)
  q, d = ints(rng, (4, 6)), ints(rng, (900, 6))
  paths = []
  for i, (lo, hi) in enumerate([(0, 3), (3, 400), (400, 401), (401, 900)]):  # shards < k too
    paths.append(str(tmp_path / f"s{i}.npy"))
    np.save(paths[-1], d[lo:hi])
  shards = (np.load(p, mmap_mode="r", allow_pickle=False) for p in paths)
  res = exact.topk_stream(q, shards, 12, num_docs=900, chunk=64)
  ids, scores = twin(q, d, 12)
  np.testing.assert_array_equal(np.asarray(res.ids), ids)
  np.testing.assert_array_equal(np.asarray(res.scores), scores)


def test_stream_scans_memory_mapped_shards_in_place(tmp_path):
  """On CPU a memory-mapped shard reaches XLA without a copy (a copy-on-write mapping of the same
  bytes, never written); slices and dtype views of a mapping map the right bytes."""
  rng = np.random.default_rng(5)
  q, d = ints(rng, (3, 8)), ints(rng, (1000, 8))
  path = str(tmp_path / "rows.npy")
  np.save(path, d)
  mm = np.load(path, mmap_mode="r", allow_pickle=False)
  table, mapping = exact._device_rows(mm[100:700])  # a slice: offset moves into the file
  if jax.default_backend() == "cpu":
    assert mapping is not None and table.unsafe_buffer_pointer() == mapping.ctypes.data
  else:  # an accelerator copies the rows to its memory: no host mapping is kept
    assert mapping is None
  np.testing.assert_array_equal(np.asarray(table), d[100:700])
  shards = [mm[:100], mm[100:700], mm[700:]]
  res = exact.topk_stream(q, shards, 15, chunk=64)
  ids, scores = twin(q, d, 15)
  np.testing.assert_array_equal(np.asarray(res.ids), ids)
  np.testing.assert_array_equal(np.asarray(res.scores), scores)
  assert not np.asarray(mm).flags.writeable and np.array_equal(np.load(path), d)  # untouched
  # A dtype view (bf16 indexes store uint16 bit patterns) and a non-contiguous view.
  bits = np.load(path, mmap_mode="r").view(np.uint16)[5:9]
  np.testing.assert_array_equal(np.asarray(exact._device_rows(bits)[0]), d.view(np.uint16)[5:9])
  assert exact._device_rows(mm[:, :4])[1] is None


def multi_twin(q, rows, doc_ids, valid, k):
  s = np.asarray(q, np.float64) @ np.asarray(rows, np.float64).T
  s = np.where(valid[None], s, -np.inf)
  n_docs = doc_ids.max() + 1
  best = np.full((q.shape[0], n_docs), -np.inf)
  for r, doc in enumerate(doc_ids):
    best[:, doc] = np.maximum(best[:, doc], s[:, r])
  ids = np.broadcast_to(np.arange(n_docs), best.shape)
  order = np.lexsort((ids, -best), axis=1)[:, :k]
  return order, np.take_along_axis(best, order, axis=1)


@pytest.mark.parametrize("seed,k", [(0, 1), (1, 10), (2, 40)])
def test_multi_vector_max_by_doc(seed, k):
  rng = np.random.default_rng(seed)
  counts = rng.integers(1, 6, size=150)            # 1..5 rows per doc
  doc_ids = np.repeat(np.arange(150), counts)
  rows = ints(rng, (doc_ids.size, 5))
  valid = rng.random(doc_ids.size) > 0.2
  valid[np.searchsorted(doc_ids, np.arange(150))] = True   # every doc keeps its first row
  q = ints(rng, (7, 5))
  ids, scores = multi_twin(q, rows, doc_ids, valid, k)
  res = exact.multi_vector_topk(q, rows, doc_ids, k, row_valid=valid, chunk=64)
  np.testing.assert_array_equal(np.asarray(res.ids), ids)
  np.testing.assert_array_equal(np.asarray(res.scores), scores)


def test_multi_vector_rejects_unsorted_doc_ids():
  rows = np.zeros((4, 3), np.float32)
  with pytest.raises(InputError, match="nondecreasing"):
    exact.multi_vector_topk(np.zeros((1, 3), np.float32), rows, np.array([0, 1, 0, 2]), 1)
  with pytest.raises(InputError, match="k must be"):
    exact.multi_vector_topk(np.zeros((1, 3), np.float32), rows, np.array([0, 0, 1, 1]), 3)


def test_mebert_doc_table_rows_retrieve_like_score_all():
  from bilinear_ir.scorers import multivector  # pylint: disable=g-import-not-at-top
  module = scorers.build("mebert", dim=8, num_vectors=3)
  params = scorers.init_params(module, jax.random.key(0))
  rng = np.random.default_rng(5)
  q = rng.normal(size=(4, 5, 8)).astype(np.float32)
  q_mask = np.ones((4, 5), bool)
  docs = rng.normal(size=(60, 6, 8)).astype(np.float32)
  d_mask = np.arange(6)[None] < rng.integers(1, 7, size=(60, 1))   # some docs < m tokens
  v = {"params": params}
  with jax.default_matmul_precision("float32"):  # as in test_every_table_scorer
    qt = module.apply(v, q, q_mask, method=module.query_table)
    rows, row_doc, row_valid = module.apply(v, docs, d_mask, method=module.doc_table)
    full = np.asarray(module.apply(v, q, q_mask, docs, d_mask, method=module.score_all),
                      np.float64)
  res = exact.multi_vector_topk(qt, rows, row_doc, 10, row_valid=row_valid, chunk=32)
  order = np.argsort(-full, axis=1, kind="stable")[:, :10]
  np.testing.assert_array_equal(np.asarray(res.ids), order)
  np.testing.assert_allclose(np.asarray(res.scores), np.take_along_axis(full, order, 1),
                             rtol=1e-5, atol=1e-5)
  assert multivector.MEBERT is type(module)


def test_count_at_least_matches_numpy():
  rng = np.random.default_rng(6)
  q, d = ints(rng, (5, 4)), ints(rng, (1000, 4))
  cutoff = np.array([0.0, 3.0, -2.0, 9.0, 100.0], np.float32)
  got = exact.count_at_least(q, d, cutoff, chunk=128)   # 7 chunks + a tail of 104
  np.testing.assert_array_equal(np.asarray(got), np.sum(q @ d.T >= cutoff[:, None], axis=1))


def test_default_chunk_per_device():
  """CPU: the measured 8,192 (grown with k up to 32,768); accelerators: the largest power of two
  whose [B, chunk] float32 score block fits 128 MiB, within [the CPU chunk, 2^20]."""
  assert exact.default_chunk(10, 1000, "cpu") == 8192
  assert exact.default_chunk(300, 1000, "cpu") == 32768
  assert exact.default_chunk(10, 1000, "gpu") == 1 << 18    # 1 GiB / 4,000 B = 268,435 rows
  assert exact.default_chunk(10, 32, "gpu") == 1 << 20      # capped
  assert exact.default_chunk(10, 4096, "tpu") == 1 << 16    # 1 GiB / 16 KiB = 65,536
  assert exact.default_chunk(10, 1_000_000, "gpu") == 8192  # never below the CPU chunk
  assert exact.default_chunk(10, 1000) == exact.default_chunk(10, 1000, jax.default_backend())


def _near_tie_tables(seed):
  """Small-integer tables with exact ties (duplicate rows) and near-ties (rows of the best
  scores nudged by 2^-22 .. 2^-20, below or at the float32 resolution of the scores)."""
  rng = np.random.default_rng(seed)
  q, d = ints(rng, (9, 12)), ints(rng, (2000, 12))
  top = np.argsort(-(q[0] @ d.T))[:40]
  d[rng.choice(2000, 40, replace=False)] = d[top]                   # exact ties, other ids
  nudged = rng.choice(2000, 60, replace=False)
  d[nudged] = d[rng.choice(top, 60)] + (2.0 ** -rng.integers(20, 23, (60, 1))
                                        * rng.choice([-1, 1], (60, 12))).astype(np.float32)
  return q, d


def assert_correct_up_to_rounding(q, d, res, k):
  """Distinct ids, scores in descending order within float32 rounding of their float64 values,
  and a true top-k: every returned doc's float64 score >= the float64 k-th score - 2 rounding."""
  ids, scores = np.asarray(res.ids), np.asarray(res.scores, np.float64)
  s64 = np.asarray(q, np.float64) @ np.asarray(d, np.float64).T
  kth = -np.sort(-s64, axis=1)[:, k - 1]
  rounding = (2 * q.shape[1] * 2.0 ** -24 * np.linalg.norm(q, axis=1)
              * np.linalg.norm(d, axis=1).max())
  for i in range(q.shape[0]):
    assert len(set(ids[i])) == k
    assert np.all(np.diff(scores[i]) <= 0)
    np.testing.assert_allclose(scores[i], s64[i, ids[i]], rtol=0, atol=rounding[i])
    assert s64[i, ids[i]].min() >= kth[i] - 2 * rounding[i]


@pytest.mark.parametrize("chunk,unroll", [(128, True), (128, False), (256, None),
                                           (exact.default_chunk(10, 9, "gpu"), None)])
def test_selection_with_ties_and_near_ties(chunk, unroll):
  """The block-max selection, looped or unrolled (the accelerator form) and in one step (the
  accelerator chunk exceeds N): near-ties give a correct top-k up to float32 rounding (float64
  twin), the same on every call; exact ties rank the lower id first, as the float64 twin.

  Near-ties need not match `brute_force` bit for bit: a chunk's matmul may sum in another order
  than the full one (seen here: 31.999996 vs 32.0), which can swap near-tied docs, as two exact
  float32 methods can (`benchmarks/topk.py` records such queries as `other_ids`).
  """
  for seed in range(3):
    q, d = _near_tie_tables(seed)
    res = exact.topk(q, d, 10, chunk=chunk, unroll=unroll)
    assert_correct_up_to_rounding(q, d, res, 10)
    again = exact.topk(q, d, 10, chunk=chunk, unroll=unroll)
    np.testing.assert_array_equal(np.asarray(res.ids), np.asarray(again.ids))
    # exact ties only (integer tables): the float64 twin's order, lower id first
    qi, di = ints(np.random.default_rng(seed), (9, 12)), _near_tie_tables(seed)[1].round()
    ids, scores = twin(qi, di, 10)
    res = exact.topk(qi, di, 10, chunk=chunk, unroll=unroll)
    np.testing.assert_array_equal(np.asarray(res.ids), ids)
    np.testing.assert_array_equal(np.asarray(res.scores), scores)


@pytest.mark.parametrize("n,k,block", [(1000, 37, 8), (1003, 37, 16), (4096, 250, 4),
                                       (777, 777, 1), (640, 40, 32)])
def test_block_top_k_equals_lax_top_k(n, k, block):
  """`block_top_k` returns `lax.top_k`'s scores and ids exactly: random scores, exact ties across
  and inside blocks (integers), a tie at the k-th place, N not a multiple of the block, k = N."""
  rng = np.random.default_rng(n + k)
  rows = [rng.standard_normal(n), rng.integers(-5, 6, n).astype(np.float64),
          np.repeat(rng.standard_normal(n // 7 + 1), 7)[:n]]
  tied = rng.standard_normal(n)
  tied[np.argsort(-tied)[k - 1:k + 5]] = tied[np.argsort(-tied)[k - 1]]  # 6 ties at the k-th
  scores = jnp.asarray(np.stack(rows + [tied]), jnp.float32)
  got = jax.jit(exact.block_top_k, static_argnames=("k", "block"))(scores, k=k, block=block)
  want_scores, want_ids = jax.lax.top_k(scores, k)
  np.testing.assert_array_equal(np.asarray(got.ids), np.asarray(want_ids))
  np.testing.assert_array_equal(np.asarray(got.scores), np.asarray(want_scores))


def test_argmax_top_k_equals_lax_top_k():
  """k argmax passes give `lax.top_k`'s values and positions exactly: random rows, integer ties,
  -inf entries taken in position order, 0.0 above -0.0 (XLA's total order), k = M."""
  rng = np.random.default_rng(3)
  x = np.stack([rng.standard_normal(50), rng.integers(-3, 4, 50).astype(np.float64),
                np.where(rng.random(50) < 0.8, -np.inf, rng.standard_normal(50)),
                rng.choice([-0.0, 0.0, 1.0, -1.0], 50)]).astype(np.float32)
  for k in (1, 10, 16, 50):
    vals, pos = jax.jit(exact.argmax_top_k, static_argnums=1)(jnp.asarray(x), k)
    want_vals, want_pos = jax.lax.top_k(jnp.asarray(x), k)
    np.testing.assert_array_equal(np.asarray(pos), np.asarray(want_pos))
    np.testing.assert_array_equal(np.asarray(vals), np.asarray(want_vals))


def test_default_selection_per_device():
  assert exact.default_selection(10, "cpu") == "top_k"
  assert exact.default_selection(exact.ARGMAX_MAX_K, "gpu") == "argmax"
  assert exact.default_selection(exact.ARGMAX_MAX_K + 1, "gpu") == "top_k"
  assert exact.default_selection(10, "tpu") == "top_k"
  assert exact.default_selection(10) == exact.default_selection(10, jax.default_backend())


@pytest.mark.parametrize("chunk,block", [(128, 8), (256, 32), (exact.default_chunk(10, 9, "gpu"),
                                                                None)])
def test_scan_selections_agree_with_ties_and_near_ties(chunk, block):
  """The scan with the argmax selection (the GPUs' default for small k) returns exactly
  what it returns with `lax.top_k`, on near-tied and exactly tied (integer) tables, with masked
  rows and k past the number of blocks."""
  for seed in range(2):
    q, d = _near_tie_tables(seed)
    qi = ints(np.random.default_rng(seed), (9, 12))
    valid = np.random.default_rng(seed).random(d.shape[0]) < 0.9
    for qt, dt in ((q, d), (qi, d.round())):
      for k, rv in ((10, None), (16, valid)):
        a = exact.topk(qt, dt, k, chunk=chunk, block=block, row_valid=rv, selection="argmax")
        b = exact.topk(qt, dt, k, chunk=chunk, block=block, row_valid=rv, selection="top_k")
        np.testing.assert_array_equal(np.asarray(a.ids), np.asarray(b.ids))
        np.testing.assert_array_equal(np.asarray(a.scores), np.asarray(b.scores))
  with pytest.raises(InputError, match="selection"):
    exact.topk(q, d, 10, selection="sort")
