"""shard_map top-k over 1..8 fake CPU devices equals single-device brute force for every N, k."""
import jax
import numpy as np
import pytest

from bilinear_ir.errors import InputError
from bilinear_ir.retrieval import exact, sharded


def twin(q, d, k):
  s = np.asarray(q, np.float64) @ np.asarray(d, np.float64).T
  order = np.lexsort((np.broadcast_to(np.arange(s.shape[1]), s.shape), -s), axis=1)[:, :k]
  return order, np.take_along_axis(s, order, axis=1)


def test_mesh_is_one_dimensional_auto():
  mesh = sharded.doc_mesh()
  assert mesh.axis_names == (sharded.AXIS,)
  assert mesh.shape[sharded.AXIS] == jax.device_count() == 8
  assert mesh.axis_types == (jax.sharding.AxisType.Auto,)


# (devices, N, k): N divisible and not by the device count, N < devices, k > rows per shard.
CASES = [(1, 50, 7), (2, 51, 10), (3, 100, 1), (4, 10, 10), (5, 203, 20), (6, 6, 4),
         (7, 300, 33), (8, 1001, 10), (8, 13, 13)]


@pytest.mark.parametrize("devices,n,k", CASES)
def test_sharded_equals_brute_force_with_ties(devices, n, k):
  rng = np.random.default_rng(devices * 1000 + n)
  q = rng.integers(-3, 4, (5, 6)).astype(np.float32)   # integer scores: exact, many ties
  d = rng.integers(-3, 4, (n, 6)).astype(np.float32)
  ids, scores = twin(q, d, k)
  res = sharded.sharded_topk(q, d, k, mesh=sharded.doc_mesh(devices), chunk=32)
  np.testing.assert_array_equal(np.asarray(res.ids), ids)
  np.testing.assert_array_equal(np.asarray(res.scores), scores)


def test_sharded_real_scores_equal_single_device():
  rng = np.random.default_rng(7)
  q = rng.normal(size=(9, 32)).astype(np.float32)
  d = rng.normal(size=(4099, 32)).astype(np.float32)
  single = exact.topk(q, d, 10)
  res = sharded.sharded_topk(q, d, 10, id_offset=100)
  np.testing.assert_array_equal(np.asarray(res.ids), np.asarray(single.ids) + 100)
  np.testing.assert_allclose(np.asarray(res.scores), np.asarray(single.scores), rtol=1e-6)


def test_ties_across_shards_prefer_lower_id():
  d = np.zeros((64, 2), np.float32)
  d[[60, 9, 33, 17]] = [1.0, 1.0]     # shards 7, 1, 4, 2 of 8
  res = sharded.sharded_topk(np.ones((1, 2), np.float32), d, 3)
  np.testing.assert_array_equal(np.asarray(res.ids)[0], [9, 17, 33])


def test_process_rows_split_and_merge():
  n, p = 103, 3
  spans = [sharded.process_rows(n, i, p) for i in range(p)]
  assert spans[0][0] == 0 and spans[-1][1] == n
  assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
  assert max(hi - lo for lo, hi in spans) - min(hi - lo for lo, hi in spans) <= 1
  # Simulated processes: per-process top-k with global ids, then the merge.
  rng = np.random.default_rng(0)
  q = rng.integers(-2, 3, (4, 5)).astype(np.float32)
  d = rng.integers(-2, 3, (n, 5)).astype(np.float32)
  parts = [exact.topk(q, d[lo:hi], 8, id_offset=lo) for lo, hi in spans]
  res = sharded.merge_processes(np.stack([p_.scores for p_ in parts]),
                                np.stack([p_.ids for p_ in parts]), 8)
  ids, _ = twin(q, d, 8)
  np.testing.assert_array_equal(res.ids, ids)


def test_bad_inputs():
  q = np.zeros((2, 3), np.float32)
  with pytest.raises(InputError, match="k must be"):
    sharded.sharded_topk(q, np.zeros((5, 3), np.float32), 6)
  with pytest.raises(InputError, match="must be in"):
    sharded.doc_mesh(9)
