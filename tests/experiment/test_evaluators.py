"""The evaluators (experiment/evaluate.py), in-process on a tiny corpus against numpy brute force:
full-corpus ranking, re-ranking of candidates and the dev-tuned hybrid (own-pool P@1:
test_pool_p_at_1.py)."""
import jax.numpy as jnp
import numpy as np
import pytest

from bilinear_ir import scorers
from bilinear_ir.config import blocks
from bilinear_ir.data import pipeline
from bilinear_ir.eval import metrics
from bilinear_ir.experiment import evaluate
from conftest import random_prepared
from conftest import write_beir

MEASURES = ("ndcg@10", "map", "mrr@10")
DIM = 8


@pytest.fixture(scope="module")
def world(tmp_path_factory):
  """(prepared, dev, test, module, params, W [n, n] float64) over 50 docs, random embeddings."""
  folder = write_beir(str(tmp_path_factory.mktemp("ev") / "c"), num_docs=50, num_queries=30,
                      seed=7, splits=("dev", "test"))
  data = blocks.data_config()
  data.format, data.path = "beir", folder
  prepared = random_prepared(data, blocks.bm25_config(), dim=DIM, seed=3)
  coll = prepared.collection
  dev, test = (pipeline.Split(s, coll.split_query_ids(s), coll.qrels[s]) for s in ("dev", "test"))
  w = np.random.default_rng(1).normal(size=(DIM, DIM)).astype(np.float32)
  return prepared, dev, test, scorers.build("bilinear", dim=DIM), {"W": jnp.asarray(w)}, w


def _dense(prepared, split, w):
  """[Q_s, N] float64 scores q^T W d of the split's queries."""
  emb = prepared.embeddings
  q = emb.queries[prepared.query_row_index(split.query_ids)].astype(np.float64)
  return q @ w.astype(np.float64) @ emb.docs.astype(np.float64).T


def _run(split, doc_ids, scores, docs=None):
  """{qid: {doc id: score}} of `scores` [Q_s, N], over `docs` [Q_s, K] rows when given."""
  out = {}
  for i, q in enumerate(split.query_ids):
    rows = range(len(doc_ids)) if docs is None else docs[i]
    out[q] = {doc_ids[j]: float(scores[i, j]) for j in rows}
  return out


def test_full_ranking_equals_brute_force(world):
  prepared, _, test, module, params, w = world
  doc_ids = prepared.collection.doc_ids
  ev = evaluate.RankingEvaluator(test.query_ids, doc_ids, test.qrels, MEASURES, depth=50)
  assert ev.primary_metric == "ndcg@10"
  rows = prepared.query_row_index(test.query_ids)
  got, run = ev(module, params, prepared.embeddings.queries[rows], prepared.embeddings.docs)
  want = metrics.evaluate(test.qrels, _run(test, doc_ids, _dense(prepared, test, w)), MEASURES)
  for m in MEASURES:
    assert got["mean"][m] == pytest.approx(want["mean"][m], abs=1e-9)
    for q in test.query_ids:
      assert got["per_query"][q][m] == pytest.approx(want["per_query"][q][m], abs=1e-9)
  assert set(run) == set(test.query_ids) and all(len(d) == 50 for d in run.values())


def test_rerank_ranks_only_the_candidates(world):
  prepared, _, test, module, params, w = world
  doc_ids = prepared.collection.doc_ids
  rng = np.random.default_rng(4)
  cands = np.stack([rng.choice(50, size=12, replace=False) for _ in test.query_ids])
  ev = evaluate.RankingEvaluator(test.query_ids, doc_ids, test.qrels, MEASURES, mode="rerank",
                                 candidates=cands)
  rows = prepared.query_row_index(test.query_ids)
  got, run = ev(module, params, prepared.embeddings.queries[rows], prepared.embeddings.docs)
  for i, q in enumerate(test.query_ids):
    assert set(run[q]) == {doc_ids[j] for j in cands[i]}
  want = metrics.evaluate(test.qrels, _run(test, doc_ids, _dense(prepared, test, w), cands),
                          MEASURES)
  for m in MEASURES:
    assert got["mean"][m] == pytest.approx(want["mean"][m], abs=1e-9)
  with pytest.raises(Exception, match="rerank mode needs candidates"):
    evaluate.RankingEvaluator(test.query_ids, doc_ids, test.qrels, mode="rerank")(
        module, params, prepared.embeddings.queries[rows], prepared.embeddings.docs)


def test_hybrid_tunes_lam_on_dev_as_brute_force(world):
  prepared, dev, test, module, params, w = world
  doc_ids = prepared.collection.doc_ids
  depth, grid = 6, (0.25, 0.5, 0.75)
  cfg = blocks.hybrid_config()
  cfg.depth, cfg.grid = depth, grid
  bm25 = prepared.bm25
  minmax = lambda x: (x - x.min()) / (x.max() - x.min()) if x.max() > x.min() else 0.0 * x

  def fused_runs(split):
    """{lam: run} of the brute-force hybrid over each query's union of both top-`depth`s."""
    dense = _dense(prepared, split, w)
    qv = bm25.query_vectors([prepared.collection.queries[q] for q in split.query_ids])
    sparse = np.asarray((qv @ bm25.doc_vectors.T).todense())
    rows = prepared.query_row_index(split.query_ids)
    runs = {lam: {} for lam in grid}
    for i, q in enumerate(split.query_ids):
      union = np.union1d(np.argsort(-dense[i], kind="stable")[:depth],
                         prepared.bm25_idx[rows[i]][:depth])
      for lam in grid:
        fused = lam * minmax(dense[i, union]) + (1 - lam) * minmax(sparse[i, union])
        runs[lam][q] = {doc_ids[j]: float(v) for j, v in zip(union, fused)}
    return runs

  on_dev = {lam: metrics.evaluate(dev.qrels, run, ["ndcg@10"])["mean"]["ndcg@10"]
            for lam, run in fused_runs(dev).items()}
  want_lam = max(grid, key=lambda lam: (on_dev[lam], -lam))
  ev = evaluate.HybridEvaluator(dev, doc_ids, cfg, MEASURES)
  lam, res = ev(evaluate.full_corpus(module, params, prepared, depth), {"dev": dev, "test": test})
  assert lam == want_lam and len(set(on_dev.values())) > 1  # the grid's values differ on dev
  for name, split in (("dev", dev), ("test", test)):
    want = metrics.evaluate(split.qrels, fused_runs(split)[lam], MEASURES)
    for m in MEASURES:
      assert res[name][0]["mean"][m] == pytest.approx(want["mean"][m], abs=1e-9), (name, m)
    assert {q: set(d) for q, d in res[name][1].items()} == {
        q: set(d) for q, d in fused_runs(split)[lam].items()}
