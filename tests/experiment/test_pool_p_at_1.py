"""The answer-selection view: P@1 over each query's own pool, against numpy brute force."""
import numpy as np
import pytest

from bilinear_ir.config import blocks
from bilinear_ir import scorers
from bilinear_ir.data import pipeline
from bilinear_ir.experiment import evaluate
from conftest import random_prepared
from conftest import write_beir


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
  folder = write_beir(str(tmp_path_factory.mktemp("pool") / "c"), num_docs=40, num_queries=24,
                      seed=5)
  data = blocks.data_config()
  data.format, data.path = "beir", folder
  prepared = random_prepared(data, blocks.bm25_config(), dim=8, seed=2)
  coll = prepared.collection
  rng = np.random.default_rng(0)
  test = pipeline.Split("test", coll.split_query_ids("test"), coll.qrels["test"])
  for q in test.query_ids:  # listed negatives: random docs, a gold one among them for some
    coll.negatives[q] = [coll.doc_ids[i] for i in rng.choice(40, size=6, replace=False)]
  return prepared, test


def _brute(prepared, test, pools, fused_of):
  out = {}
  for i, q in enumerate(test.query_ids):
    docs = pools[i][pools[i] >= 0]
    fused = fused_of(i, docs)
    best = docs[np.flatnonzero(fused == fused.max())[0]]  # ties: the lower row (docs ascend)
    out[q] = float(test.qrels[q].get(prepared.collection.doc_ids[best], 0) > 0)
  return out


def test_pools_hold_gold_and_listed_negatives(setting):
  prepared, test = setting
  pools = evaluate.candidate_pools(prepared, test)
  index = prepared.collection.doc_index()
  for i, q in enumerate(test.query_ids):
    want = {index[d] for d in prepared.collection.negatives[q]} | {
        index[d] for d, rel in test.qrels[q].items() if rel > 0}
    got = pools[i][pools[i] >= 0]
    assert list(got) == sorted(want)
  missing = pipeline.Split("x", ["q0"], {"q0": {}})
  prepared.collection.negatives.pop("q0", None)
  assert evaluate.candidate_pools(prepared, missing) is None


@pytest.mark.parametrize("lam", [1.0, 0.0, 0.4])
def test_pool_p_at_1_matches_brute_force(setting, lam):
  prepared, test = setting
  pools = evaluate.candidate_pools(prepared, test)
  module = scorers.build("bilinear", 8)
  w = np.random.default_rng(1).normal(size=(8, 8)).astype(np.float32)
  rows = prepared.query_row_index(test.query_ids)
  emb = prepared.embeddings
  bm25 = prepared.bm25
  qv = bm25.query_vectors([prepared.collection.queries[q] for q in test.query_ids])
  full_bm25 = np.asarray((qv @ bm25.doc_vectors.T).todense())

  def minmax(x):
    span = x.max() - x.min()
    return (x - x.min()) / span if span > 0 else np.zeros_like(x)

  def fused_of(i, docs):
    dense = emb.docs[docs].astype(np.float64) @ (w.T.astype(np.float64)
                                                 @ emb.queries[rows[i]].astype(np.float64))
    sparse = full_bm25[i, docs]
    if lam == 1.0:
      return dense
    if lam == 0.0:
      return sparse
    return lam * minmax(dense) + (1 - lam) * minmax(sparse)

  got = evaluate.PoolEvaluator(prepared, test, pools)(lam, "minmax", module, {"W": w})
  want = _brute(prepared, test, pools, fused_of)
  assert got["per_query"] == want
  assert got["mean"] == pytest.approx(np.mean(list(want.values())))
  assert 0 < got["mean"] < 1  # neither trivially right nor wrong on this collection
