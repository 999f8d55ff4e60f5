"""The `study` job on two tiny collections: one with its own train / test split, one test-only
(cross-validated), the frozen all-MiniLM-L6-v2 "mean" embedding, a few training steps (the
through-main test: a tiny random BERT's)."""
import copy
import types

import numpy as np
import pytest

from bilinear_ir.config import blocks
from bilinear_ir.data import loaders
from bilinear_ir.data import pipeline
from bilinear_ir.eval import metrics
from bilinear_ir.eval import stats
from bilinear_ir.experiment import rows as rows_lib
from bilinear_ir.experiment import spec as spec_lib
from bilinear_ir.experiment import table as table_lib
from bilinear_ir.jobs import study
from conftest import get_config, write_beir

# No claim here is about sharding: the jobs train on one device (fewer, smaller compiles).
pytestmark = pytest.mark.usefixtures("one_device_training")


def _config(collections, cache):
  c = get_config("study", f"collections={'+'.join(collections)},embeddings=mean,seeds=0+1,folds=3,"
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
  # As many docs as the test-only collection, and as many training queries (10 - 2 for dev) as
  # each of its folds: the trained rows of both share their compiled steps.
  split = write_beir(str(root / "split"), num_docs=30, num_queries=20, seed=1)
  test_only = write_beir(str(root / "only"), num_docs=30, num_queries=15, seed=2,
                         splits=("test",))
  config = _config([split, test_only], root / "cache")
  study.validate(config)
  return config, study.run(config, str(root / "w")).results


def test_rows_cover_every_model_and_every_query_once(study_run):
  config, res = study_run
  models = ["dot", "bm25", "wdp", "bilinear", "lowrank_r4", "learned", "hybrid", "bilinear_ict"]
  for coll, n_q in (("split", 10), ("only", 15)):
    rows = [r for r in res["rows"] if r["collection"] == coll]
    assert [r["model"] for r in rows] == models
    for r in rows:
      assert len(r["per_query"]) == r["n_queries"] == n_q  # each test query scored once
      assert r["metrics"]["ndcg@10"] == pytest.approx(np.mean(list(r["per_query"].values())))
  only = [r for r in res["rows"] if r["collection"] == "only"]
  assert all(r["folds"] == config.folds for r in only)
  # The ICT rows carry the guard's blend weight per seed (train.ict.guard, on by default).
  for r in res["rows"]:
    assert ("ict_lam" in r) == r["model"].endswith("_ict")
    if "ict_lam" in r:
      assert len(r["ict_lam"]) == len(config.seeds)
      assert all(lam in config.train.ict.guard_grid for lam in r["ict_lam"])


def test_dot_and_bm25_rows_equal_a_direct_evaluation(study_run):
  config, res = study_run
  c = spec_lib.collection_block(config.data, config.collections[1])
  cfg = blocks.encoder_config()
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


def test_study_through_main_writes_table_and_forest_plot(tmp_path, run_main, tiny_bert_dir):
  data = write_beir(str(tmp_path / "only"), num_docs=30, num_queries=15, seed=2,
                    splits=("test",))
  w = tmp_path / "w"
  res = run_main.in_process(
      f"configs/study.py:collections={data},embeddings=mean,seeds=0,folds=3,ranks=4,"
      "models=bilinear+lowrank,ict_rows=", w, "--config.train.ict.dev_docs=4",
      "--config.train.steps=6", "--config.train.eval_every=3", "--config.train.batch_size=8",
      f"--config.encoder.model={tiny_bert_dir}", "--config.encoder.max_length=32",
      f"--config.encoder.cache_dir={tmp_path / 'cache'}",
      "--config.stats.resamples=200")
  assert {r["model"] for r in res["rows"]} == {"dot", "bm25", "bilinear", "lowrank_r4",
                                               "learned", "hybrid"}
  assert (w / "forest.png").stat().st_size > 1000
  assert "significantly better than dot on" in (w / "results.md").read_text()


def _fake_outcomes(monkeypatch):
  """Replaces training and the hybrid by made-up outcomes, drawn per (model, seed, split set):
  a dev metric at the best step, a dev metric at the last step (history), per-query test
  values. Returns the record {(name, seed, split name): out}."""
  import zlib  # pylint: disable=g-import-not-at-top
  record = {}

  def name_of(c):
    m = c.model
    name = f"lowrank_r{m.rank}" if m.scorer == "lowrank" else m.scorer
    return name + ("_ict" if c.train.get("source", "qrels") == "ict" else "")

  def fake_train(c, prepared, s, workdir=None, progress=True):  # pylint: disable=unused-argument
    key = (name_of(c), int(c.seed), s.name)
    rng = np.random.default_rng(zlib.crc32(repr(key).encode()))
    sel = c.train.select_metric
    per_query = {q: {m: float(rng.random()) for m in c.eval.measures} for q in s.test.query_ids}
    out = {"per_query": per_query, "dev": {sel: float(rng.random())}, "best_step": 6,
           "history": [{"step": 12, sel: float(rng.random())}], "params": None,
           "metrics": {m: float(np.mean([v[m] for v in per_query.values()]))
                       for m in c.eval.measures}, "module": None}
    record[key] = out
    return out

  def fake_hybrid(self, candidates_of, splits):  # pylint: disable=unused-argument
    return 0.5, {name: ({"mean": {m: 0.5 for m in self.measures},
                         "per_query": {q: {m: 0.5 for m in self.measures} for q in s.query_ids}},
                        {}) for name, s in splits.items()}

  monkeypatch.setattr(table_lib.rows_lib.training, "train_and_evaluate", fake_train)
  monkeypatch.setattr(table_lib.evaluate.HybridEvaluator, "__call__", fake_hybrid)
  return record


def test_learned_is_the_dev_argmax_per_fold_and_seed(study_run, monkeypatch):
  # Made-up outcomes where the dev metric, the test metric and the last step's dev metric each
  # pick a different model in some fold: `learned` must take the dev pick, per fold and seed.
  config, _ = study_run
  record = _fake_outcomes(monkeypatch)
  # 3 folds x 2 seeds
  table = table_lib.run(config, study.cells(config, config.collections[1]), None)
  rows, name = table.rows, table.cells[0].fields["collection"]
  specs = [sp["name"] for sp in config.rows if sp["type"] == "trained" and sp["split"] == "folds"]
  sel, m0 = config.train.select_metric, config.eval.measures[0]
  learned = next(r for r in rows if r["model"] == "learned")
  folds = sorted({k[2] for k in record if k[0] == specs[0]})
  assert len(folds) == 3 and name == "only"
  want, chosen, differs = [], [], {"test": 0, "last": 0}
  for seed in config.seeds:
    per_seed = {}
    for fold in folds:
      outs = {n: record[n, seed, fold] for n in specs}
      pick = max(specs, key=lambda n: outs[n]["dev"][sel])
      test_mean = lambda n: np.mean([v[m0] for v in outs[n]["per_query"].values()])
      differs["test"] += max(specs, key=test_mean) != pick
      differs["last"] += max(specs, key=lambda n: outs[n]["history"][-1][sel]) != pick
      per_seed.update(outs[pick]["per_query"])
      chosen.append(pick)
    want.append(per_seed)
  assert differs["test"] and differs["last"], differs  # the outcomes can tell them apart
  assert learned["chosen"] == chosen
  assert learned["per_query"] == pytest.approx(
      {q: np.mean([w[q][m0] for w in want]) for q in want[0]}, abs=1e-12)


def test_unseen_doc_is_judged_against_training_and_dev_queries():
  # Hand-made split sets: a test query is unseen-doc when none of its relevant docs is relevant
  # to a training or dev query of its own split set. Docs shared only among test queries (d3),
  # judged 0 in training (d5), or relevant in another split set's training (d7) do not make a
  # test query seen; a relevant doc of a dev query (d2) does.
  split = lambda name, qrels: pipeline.Split(name, sorted(qrels), qrels)
  a = pipeline.SplitSet("fold0", split("train", {"q1": {"d1": 1, "d5": 0}}),
                        split("dev", {"q2": {"d2": 1}}),
                        split("test", {"q3": {"d1": 1}, "q4": {"d3": 1}, "q5": {"d3": 1},
                                       "q6": {"d2": 1, "d9": 1}, "q8": {"d5": 1},
                                       "q9": {"d1": 0, "d7": 1}}))
  b = pipeline.SplitSet("fold1", split("train", {"q4": {"d7": 1}}), split("dev", {}),
                        split("test", {"q1": {"d1": 1}, "q10": {"d8": 1}}))
  assert rows_lib.unseen_doc_queries([a, b]) == ["q1", "q10", "q4", "q5", "q8", "q9"]


def test_unseen_doc_queries_of_the_run_are_those_of_the_definition(study_run):
  # The study's unseen-doc ids, recomputed from the collections' qrels and split sets.
  config, res = study_run
  for entry in config.collections:
    data = spec_lib.collection_block(config.data, entry)
    coll = loaders.load(data)
    cfg = copy.deepcopy(config)
    with cfg.unlocked():
      cfg.data = data
    sets = study.spec_lib.splitsets(types.SimpleNamespace(collection=coll), cfg.data, cfg.seed,
                                    int(config.folds))
    want = []
    for s in sets:
      seen = {d for q in s.train.query_ids + s.dev.query_ids
              for d, rel in coll_qrels(coll, q).items() if rel > 0}
      want += [q for q in s.test.query_ids
               if not {d for d, rel in coll_qrels(coll, q).items() if rel > 0} & seen]
    assert res["unseen_doc"][coll.name] == sorted(want)
    assert 0 < len(want) < sum(len(s.test.query_ids) for s in sets)  # not all, not none


def coll_qrels(coll, qid):
  """The judgements of `qid` in whichever split of `coll` holds them."""
  return next(q[qid] for q in coll.qrels.values() if qid in q)
