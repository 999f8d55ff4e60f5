"""The `study` job on two tiny collections: one with its own train / test split, one test-only
(cross-validated), the frozen all-MiniLM-L6-v2 "mean" embedding, a few training steps."""
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bilinear_ir import defaults
from bilinear_ir.data import loaders
from bilinear_ir.data import pipeline
from bilinear_ir.eval import metrics
from bilinear_ir.eval import stats
from bilinear_ir.jobs import study
from conftest import write_beir

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(collections, cache):
  spec = importlib.util.spec_from_file_location("study_cfg", os.path.join(REPO, "configs",
                                                                          "study.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config(f"collections={'+'.join(collections)},embeddings=mean,seeds=0+1,folds=3,"
                        "ranks=4,ict_rows=bilinear")
  c.train.steps, c.train.eval_every, c.train.batch_size = 12, 6, 8
  c.encoder.max_length, c.encoder.cache_dir = 32, str(cache)
  c.stats.resamples = 500
  c.train.ict.dev_docs = 6
  c.hybrid.depth = 10
  return c


@pytest.fixture(scope="module")
def study_run(tmp_path_factory):
  root = tmp_path_factory.mktemp("study")
  split = write_beir(str(root / "split"), num_docs=40, num_queries=24, seed=1)
  test_only = write_beir(str(root / "only"), num_docs=30, num_queries=15, seed=2,
                         splits=("test",))
  config = _config([split, test_only], root / "cache")
  study.validate(config)
  return config, study.run(config, str(root / "w")).results


def test_rows_cover_every_model_and_every_query_once(study_run):
  config, res = study_run
  models = ["dot", "bm25", "wdp", "bilinear", "lowrank_r4", "learned", "hybrid", "bilinear_ict"]
  for coll, n_q in (("split", 12), ("only", 15)):
    rows = [r for r in res["rows"] if r["collection"] == coll]
    assert [r["model"] for r in rows] == models
    for r in rows:
      assert len(r["per_query"]) == r["n_queries"] == n_q  # each test query scored once
      assert r["metrics"]["ndcg@10"] == pytest.approx(np.mean(list(r["per_query"].values())))
  only = [r for r in res["rows"] if r["collection"] == "only"]
  assert all(r["folds"] == config.folds for r in only)


def test_dot_and_bm25_rows_equal_a_direct_evaluation(study_run):
  config, res = study_run
  c = study.collection_data(config, config.collections[1])
  cfg = defaults.encoder_config()
  cfg.max_length, cfg.cache_dir = 32, config.encoder.cache_dir
  coll = loaders.load(c)
  emb = pipeline.embed(coll, cfg)
  qids = coll.split_query_ids("test")
  scores = emb.queries[[emb.query_ids.index(q) for q in qids]] @ emb.docs.T
  run = {q: {d: float(s) for d, s in zip(emb.doc_ids, row)} for q, row in zip(qids, scores)}
  want = metrics.evaluate(coll.qrels["test"], run, ["ndcg@10"])["per_query"]
  got = next(r for r in res["rows"] if r["collection"] == "only" and r["model"] == "dot")
  for q in qids:
    assert got["per_query"][q] == pytest.approx(want[q]["ndcg@10"], abs=1e-6)


def test_comparisons_are_paired_and_holm_adjusted(study_run):
  _, res = study_run
  rows = res["rows"]
  dots = {(r["collection"], r["embedding"]): r for r in rows if r["model"] == "dot"}
  family = [r["vs_dot"] for r in rows if r["model"] != "dot"]
  assert [c["p_holm"] for c in family] == pytest.approx(
      stats.holm([c["p_perm"] for c in family]))
  for r in rows:
    if r["model"] == "dot":
      assert "vs_dot" not in r
      continue
    d = dots[r["collection"], r["embedding"]]["per_query"]
    diff = np.mean([r["per_query"][q] - d[q] for q in d])
    assert r["vs_dot"]["diff"] == pytest.approx(diff)
    assert r["vs_dot"]["ci95"][0] <= r["vs_dot"]["diff"] <= r["vs_dot"]["ci95"][1]
    assert r["vs_dot"]["p_holm"] >= r["vs_dot"]["p_perm"]
  counts = {m: sum(c.values()) for m, c in res["summary"].items()}
  assert counts == {m: 2 for m in ["bm25", "wdp", "bilinear", "lowrank_r4", "learned", "hybrid",
                                   "bilinear_ict"]}


def test_unseen_doc_queries_follow_the_folds(study_run):
  _, res = study_run
  # Test-only collection: a query is unseen-doc when none of its relevant docs is relevant to a
  # query of the other folds; pooled rows gather them over collections.
  for coll in ("split", "only"):
    rows = [r for r in res["rows"] if r["collection"] == coll]
    assert all(r["unseen_doc"]["n_queries"] == len(res["unseen_doc"][coll]) for r in rows)
  pooled = {(e["embedding"], e["model"]): e for e in res["pooled_unseen_doc"]}
  n = len(res["unseen_doc"]["split"]) + len(res["unseen_doc"]["only"])
  assert pooled["mean", "bilinear"]["n_queries"] == n


def test_study_through_main_writes_table_and_forest_plot(tmp_path):
  data = write_beir(str(tmp_path / "only"), num_docs=30, num_queries=15, seed=2,
                    splits=("test",))
  w = tmp_path / "w"
  out = subprocess.run(
      [sys.executable, "-m", "bilinear_ir.main",
       f"--config=configs/study.py:collections={data},embeddings=mean,seeds=0,folds=3,ranks=4,"
       "models=bilinear+lowrank,ict_rows=", "--config.train.ict.dev_docs=4",
       "--config.train.steps=6", "--config.train.eval_every=3",
       "--config.train.batch_size=8", "--config.encoder.max_length=32",
       f"--config.encoder.cache_dir={tmp_path / 'cache'}", "--config.stats.resamples=200",
       f"--workdir={w}"], cwd=REPO, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-2000:]
  res = json.loads((w / "results.json").read_text())
  assert {r["model"] for r in res["rows"]} == {"dot", "bm25", "bilinear", "lowrank_r4",
                                               "learned", "hybrid"}
  assert (w / "forest.png").stat().st_size > 1000
  assert "significantly better than dot on" in (w / "results.md").read_text()
