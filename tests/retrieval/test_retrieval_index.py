"""DocIndex: shards + manifest on disk, memory-mapped streaming search, checks on open."""
import json
import os

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import pytest

from bilinear_ir import scorers
from bilinear_ir.errors import InputError
from bilinear_ir.retrieval import exact
from bilinear_ir import files
from bilinear_ir.retrieval.index import DocIndex


def bilinear(seed=0, n=8):
  module = scorers.build("bilinear", dim=n)
  rng = np.random.default_rng(seed)
  params = {"W": jnp.asarray(np.eye(n) + 0.5 * rng.normal(size=(n, n)), jnp.float32)}
  return module, params


def test_build_open_search_equals_exact(tmp_path):
  module, params = bilinear()
  rng = np.random.default_rng(1)
  np.save(tmp_path / "emb.npy", rng.normal(size=(1000, 8)).astype(np.float32))
  docs = np.load(tmp_path / "emb.npy", mmap_mode="r")    # built from a memmap, shard by shard
  index = DocIndex.build(str(tmp_path / "idx"), module, params, docs, shard_docs=300)
  m = json.loads((tmp_path / "idx" / "manifest.json").read_text())
  assert m["scorer"] == "bilinear" and m["scorer_config"] == {"dim": 8}
  assert m["params_sha256"] == files.tree_sha256(params) and m["dtype"] == "float32"
  assert m["width"] == 8 and m["num_docs"] == m["num_rows"] == 1000
  assert [s["num_rows"] for s in m["shards"]] == [300, 300, 300, 100]
  shard = np.load(tmp_path / "idx" / m["shards"][1]["rows"], allow_pickle=False)
  v = {"params": params}
  dt = np.asarray(module.apply(v, np.asarray(docs), method=module.doc_table))
  np.testing.assert_allclose(shard, dt[300:600], rtol=1e-6)
  q = rng.normal(size=(7, 8)).astype(np.float32)
  qt = module.apply(v, q, method=module.query_table)
  opened = DocIndex.open(str(tmp_path / "idx"))
  opened.check_scorer(module, params)
  res = opened.search(qt, 15, chunk=64)
  want = exact.topk(qt, dt, 15)
  np.testing.assert_array_equal(np.asarray(res.ids), np.asarray(want.ids))
  np.testing.assert_allclose(np.asarray(res.scores), np.asarray(want.scores), rtol=1e-6)
  assert index.num_docs == 1000


def test_check_scorer_rejects_other_params_or_scorer(tmp_path):
  module, params = bilinear()
  index = DocIndex.build(str(tmp_path), module, params, np.ones((10, 8), np.float32))
  with pytest.raises(InputError, match="params_sha256"):
    index.check_scorer(module, bilinear(seed=1)[1])
  with pytest.raises(InputError, match="scorer"):
    index.check_scorer(scorers.build("dot", dim=8), {})
  with pytest.raises(InputError, match="already exists"):
    DocIndex.build(str(tmp_path), module, params, np.ones((10, 8), np.float32))
  rebuilt = DocIndex.build(str(tmp_path), None, None, np.ones((4, 8), np.float32), shard_docs=2,
                           overwrite=True)
  assert rebuilt.manifest["scorer"] == "table" and rebuilt.num_docs == 4
  assert sorted(os.listdir(tmp_path)) == ["manifest.json", "rows-00000.npy", "rows-00001.npy"]


def test_bf16_index_halves_bytes_and_matches_rounded_table(tmp_path):
  rng = np.random.default_rng(2)
  table = rng.integers(-8, 9, (500, 6)).astype(np.float32)      # exact in bf16
  index = DocIndex.build(str(tmp_path), None, None, table, shard_docs=128, dtype="bfloat16")
  first = tmp_path / index.manifest["shards"][0]["rows"]
  assert np.load(first).dtype == np.uint16
  assert os.path.getsize(first) < 128 * 6 * 4 * 0.6
  q = rng.integers(-8, 9, (4, 6)).astype(np.float32)
  res = index.search(q, 9)
  want = exact.topk(q, table, 9)
  np.testing.assert_array_equal(np.asarray(res.ids), np.asarray(want.ids))
  np.testing.assert_array_equal(np.asarray(res.scores), np.asarray(want.scores))


class TwoRows(nn.Module):
  """Toy multi-vector scorer: doc d -> rows (d, -d); the second row is padding for odd doc ids."""
  dim: int = 4

  def doc_table(self, docs):
    n_docs = docs.shape[0]
    rows = jnp.stack([docs, -docs], axis=1).reshape(2 * n_docs, self.dim)
    valid = jnp.stack([jnp.ones(n_docs, bool), jnp.arange(n_docs) % 2 == 0], 1).reshape(-1)
    return rows, jnp.repeat(jnp.arange(n_docs, dtype=jnp.int32), 2), valid

  def __call__(self, docs):
    return self.doc_table(docs)


def test_multi_vector_index(tmp_path):
  rng = np.random.default_rng(3)
  docs = rng.integers(-3, 4, (301, 4)).astype(np.float32)
  module = TwoRows()
  index = DocIndex.build(str(tmp_path), module, {}, docs, shard_docs=100)
  assert index.manifest["multi_vector"] and index.manifest["num_rows"] == 301 + 151
  q = rng.integers(-3, 4, (5, 4)).astype(np.float32)
  s = q.astype(np.float64) @ docs.T.astype(np.float64)
  best = np.where(np.arange(301) % 2 == 0, np.abs(s), s)   # max(s, -s) where both rows are real
  want = np.lexsort((np.broadcast_to(np.arange(301), best.shape), -best), axis=1)[:, :20]
  res = index.search(q, 20, chunk=32)
  np.testing.assert_array_equal(np.asarray(res.ids), want)
  np.testing.assert_array_equal(np.asarray(res.scores), np.take_along_axis(best, want, 1))


def test_open_rejects_bad_shards(tmp_path):
  index = DocIndex.build(str(tmp_path), None, None, np.ones((6, 3), np.float32), shard_docs=3)
  shard = tmp_path / index.manifest["shards"][1]["rows"]
  np.save(shard, np.ones((2, 3), np.float32))                  # wrong row count
  with pytest.raises(InputError, match="rows-00001.npy.*expected"):
    DocIndex.open(str(tmp_path))
  np.save(shard, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)  # pickled
  with pytest.raises(InputError, match="rows-00001.npy.*plain .npy"):
    DocIndex.open(str(tmp_path))
  (tmp_path / "manifest.json").write_text("{not json")
  with pytest.raises(InputError, match="manifest.json.*JSON"):
    DocIndex.open(str(tmp_path))
  with pytest.raises(InputError, match="no index manifest"):
    DocIndex.open(str(tmp_path / "nothing"))


def test_search_k_too_large(tmp_path):
  index = DocIndex.build(str(tmp_path), None, None, np.ones((6, 3), np.float32))
  with pytest.raises(InputError, match="k must be"):
    index.search(np.ones((1, 3), np.float32), 7)
  with pytest.raises(InputError, match="width"):
    index.search(np.ones((1, 4), np.float32), 2)
