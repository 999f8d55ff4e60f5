"""The late-interaction setting (studies/late_interaction/): selection against the untrained
ColBERT,
the learning curve's subsets, each test query's own pool re-ranked by the re-ranking code."""
import ml_collections
import numpy as np
import pytest

from bilinear_ir import scorers
from bilinear_ir.config import blocks
from bilinear_ir.data import pipeline
from bilinear_ir.experiment import evaluate
from bilinear_ir.studies.late_interaction import rows as li_rows
from bilinear_ir.studies.late_interaction import setting as setting_lib
from conftest import random_prepared
from conftest import write_beir


def _scored(dev, test_mean, per_query):
  return setting_lib.Scored(run={}, dev=dev, test={"mean": test_mean, "per_query": per_query})


@pytest.mark.parametrize("trained_dev,kept", [(0.40, True), (0.55, True), (0.56, False)])
def test_selection_keeps_the_untrained_colbert_unless_a_trained_step_beats_it(trained_dev, kept):
  colbert = _scored({"ndcg@10": 0.55}, {"ndcg@10": 0.65}, {"q1": {"ndcg@10": 1.0}})
  trained = _scored({"ndcg@10": trained_dev}, {"ndcg@10": 0.70}, {"q1": {"ndcg@10": 0.0}})
  chosen, is_colbert = li_rows.select_over_colbert(trained, colbert, "ndcg@10")
  assert is_colbert is kept  # a tie keeps ColBERT: only a trained step that beats it is taken
  assert chosen is (colbert if kept else trained)
  assert chosen.test["mean"]["ndcg@10"] == (0.65 if kept else 0.70)
  # Without a dev split (no dev metric) nothing can beat it: ColBERT.
  assert li_rows.select_over_colbert(_scored({}, {}, {}), colbert, "ndcg@10") == (colbert, True)


def _splitset(n_train=30):
  qids = [f"q{i:02d}" for i in range(n_train + 10)]
  qrels = {q: {f"d{i}": 1} for i, q in enumerate(qids)}
  split = lambda name, ids: pipeline.Split(name, ids, {q: qrels[q] for q in ids})
  return pipeline.SplitSet("main", split("train", qids[:n_train]),
                           split("dev", qids[n_train:n_train + 5]), split("test", qids[-5:]))


def test_sizes_train_on_the_learning_curves_nested_subsets():
  splitset = _splitset()
  setting = setting_lib.Setting(None, splitset, None, {}, {}, {}, ("ndcg@10",))
  cuts = setting_lib.curve_settings(setting, (5, 12, 99), seed=3)
  assert sorted(cuts) == [5, 12, 30]  # 99 > the split: all of it
  # The learning_curve job's draw (studies.curve_subsets.nested_subsets, the seed's own order).
  order = np.random.default_rng([3, 23]).permutation(30)
  train = sorted(splitset.train.query_ids)
  for n, cut in cuts.items():
    assert cut.splitset.train.query_ids == sorted(train[i] for i in order[:n])
    assert cut.splitset.dev is splitset.dev and cut.splitset.test is splitset.test
    assert set(cut.splitset.train.qrels) == set(cut.splitset.train.query_ids)
  assert set(cuts[5].splitset.train.query_ids) < set(cuts[12].splitset.train.query_ids)
  assert cuts[5].splitset.train.query_ids != setting_lib.curve_settings(
      setting, (5,), seed=4)[5].splitset.train.query_ids
  # No sizes: the whole training split, in its own order.
  (n, whole), = setting_lib.curve_settings(setting, (), seed=3).items()
  assert n == 30 and whole.splitset.train.query_ids == splitset.train.query_ids


def test_pool_scores_are_in_pool_order_and_give_the_table_scorers_pool_p_at_1(tmp_path):
  data = blocks.data_config()
  data.format, data.path = "beir", write_beir(str(tmp_path / "c"), num_docs=40, num_queries=24)
  prepared = random_prepared(data, blocks.bm25_config(), dim=8, seed=2)
  coll = prepared.collection
  test = pipeline.Split("test", coll.split_query_ids("test"), coll.qrels["test"])
  rng = np.random.default_rng(0)
  for q in test.query_ids:
    coll.negatives[q] = [coll.doc_ids[i] for i in rng.choice(40, size=int(rng.integers(3, 9)),
                                                            replace=False)]
  pools = evaluate.candidate_pools(prepared, test)
  assert (pools < 0).any()  # ragged pools: padding to put back in place
  rows = prepared.query_row_index(test.query_ids)
  empty = pipeline.Split("x", [], {})
  setting = setting_lib.Setting(prepared, pipeline.SplitSet("m", empty, empty, test), None,
                           {"test": rows}, {}, {}, ("ndcg@10",), pools)
  module = scorers.build("bilinear", 8)
  params = {"W": rng.normal(size=(8, 8)).astype(np.float32)}
  got = setting.pool_scores(module, params, setting.pooled_queries, prepared.embeddings.docs)
  emb = prepared.embeddings
  for i in range(len(rows)):
    valid = pools[i] >= 0
    want = emb.docs[pools[i][valid]].astype(np.float64) @ (
        params["W"].T.astype(np.float64) @ emb.queries[rows[i]].astype(np.float64))
    np.testing.assert_allclose(got[i][valid], want, rtol=1e-4, atol=1e-4)
    assert np.all(np.isneginf(got[i][~valid]))
  for lam in (1.0, 0.4):  # the same P@1 as the table scorers' own path (pair scores)
    p_at_1 = evaluate.PoolEvaluator(prepared, test, pools)
    assert p_at_1(lam, "minmax", pool_scores=got) == p_at_1(lam, "minmax", module, params)


def _holm(p):
  """Holm-Bonferroni by hand: step-down (m - i) p_(i), kept monotone, capped at 1."""
  order, out, running = np.argsort(p, kind="stable"), np.empty(len(p)), 0.0
  for i, j in enumerate(order):
    running = max(running, min(1.0, (len(p) - i) * p[j]))
    out[j] = running
  return out


def test_rows_are_compared_with_colbert_and_dot_of_their_own_n_holm_per_baseline():
  """Also over each n's own unseen-answer test queries: the row's mean there and its paired
  difference with the dot row of the same n over those queries only."""
  rng = np.random.default_rng(4)
  qids = [f"q{i}" for i in range(12)]
  rows = [{"row": name, "n_train": n, "per_query": dict(zip(qids, rng.random(12) + shift))}
          for n in (5, 30) for name, shift in (("dot", 0.0), ("colbert", 0.1), ("lite", 0.3),
                                               ("hybrid (lite + BM25)", 0.4))]
  # the job's config: `models` names no fine-tuned row here (those are baselines too)
  config = ml_collections.ConfigDict({"seed": 0, "stats": blocks.stats_config(), "models": {}})
  config.stats.resamples = 500
  unseen = {5: qids[:9], 30: qids[4:7]}
  li_rows.compare_rows(rows, config, unseen)
  at = {(r["row"], r["n_train"]): r for r in rows}
  for r in rows:
    sub, dot = unseen[r["n_train"]], at["dot", r["n_train"]]["per_query"]
    assert r["unseen"]["n_queries"] == len(sub)
    assert r["unseen"]["mean"] == pytest.approx(np.mean([r["per_query"][q] for q in sub]))
    if r["row"] == "dot":
      assert "vs_dot" not in r["unseen"]
    else:
      assert r["unseen"]["vs_dot"]["diff"] == pytest.approx(
          np.mean([r["per_query"][q] - dot[q] for q in sub]))
  for base in ("colbert", "dot"):
    family = [r for r in rows if r["row"] != base]
    assert all(f"vs_{base}" not in r for r in rows if r["row"] == base)
    for r in family:  # the baseline of the same n
      b = at[base, r["n_train"]]["per_query"]
      assert r[f"vs_{base}"]["diff"] == pytest.approx(np.mean([r["per_query"][q] - b[q]
                                                               for q in qids]))
    p = np.array([r[f"vs_{base}"]["p_perm"] for r in family])
    np.testing.assert_allclose([r[f"vs_{base}"]["p_holm"] for r in family], _holm(p))


def test_each_row_recovers_a_fraction_of_the_finetuned_de_s_gain_at_its_own_n():
  """(row - dot) / (de_ft - dot) on the mean test measure, per n, over all test queries and over
  that n's unseen-answer ones; undefined at an n where the fine-tuned DE did not gain over
  dot."""
  rng = np.random.default_rng(5)
  qids = [f"q{i}" for i in range(12)]
  shifts = {5: (("dot", 0.0), ("colbert", 0.1), ("colbert_ft", 0.15), ("de_ft", 0.2)),
            30: (("dot", 0.0), ("colbert", 0.1), ("colbert_ft", 0.15), ("de_ft", -0.05))}
  rows = []
  for n, named in shifts.items():
    for name, shift in named:
      pq = dict(zip(qids, rng.random(12) + shift))
      rows.append({"row": name, "n_train": n, "per_query": pq,
                   "metrics": {"ndcg@10": float(np.mean(list(pq.values())))}})
  config = ml_collections.ConfigDict({
      "seed": 0, "stats": blocks.stats_config(), "eval": {"measures": ("ndcg@10", "mrr@10")},
      "models": {"colbert_ft": {"finetune": {}}, "de_ft": {"finetune": {}}}})
  config.stats.resamples = 200
  unseen = {5: qids[2:], 30: qids[:7]}
  li_rows.compare_rows(rows, config, unseen)
  at = {(r["row"], r["n_train"]): r for r in rows}
  for r in rows:
    n, want = r["n_train"], {}
    for view, of in (("all", lambda x: x["metrics"]["ndcg@10"]),
                     ("unseen", lambda x: np.mean([x["per_query"][q] for q in unseen[n]]))):
      gain = of(at["de_ft", n]) - of(at["dot", n])
      want[view] = (of(r) - of(at["dot", n])) / gain if gain > 0 else None
    assert (want["all"] is not None) == (n == 5)
    assert r["recovered"] == {k: pytest.approx(v) for k, v in want.items()}, (r["row"], n)
  assert at["colbert", 5]["recovered"]["all"] != pytest.approx(
      at["colbert", 5]["recovered"]["unseen"])  # the two views differ: neither copies the other
  # without a de_ft row, no row carries the fraction
  bare = [{k: v for k, v in r.items() if k.startswith(("row", "n_", "per", "met"))}
          for r in rows if r["row"] != "de_ft"]
  li_rows.compare_rows(bare, config, unseen)
  assert all("recovered" not in r for r in bare)


def test_a_row_s_line_shows_its_own_model_where_dev_kept_colbert():
  """A run stopped before its results file keeps only the printed lines: a kept row's line
  holds its own model's test and dev values, a trained row's its best step; an untrained row's
  neither."""
  kept = {"row": "lite", "n_train": 300, "metrics": {"ndcg@10": 0.4315},
          "dev": {"ndcg@10": 0.4134}, "best_step": 1500, "train_seconds": 12.34,
          "kept_colbert": True, "model_metrics": {"ndcg@10": 0.289}, "model_dev": {"ndcg@10": 0.28}}
  line = li_rows.row_line(kept, "ndcg@10", "ndcg@10")
  assert line.startswith("lite ") and "n=300 test ndcg@10 0.4315 (dev ndcg@10 0.4134)" in line
  assert line.endswith(", best step 1500, train 12.3 s; kept ColBERT, own model: test 0.2890 "
                       "(dev 0.2800)")
  mine = {**kept, "kept_colbert": False}
  assert li_rows.row_line(mine, "ndcg@10", "ndcg@10").endswith(", best step 1500, train 12.3 s")
  untrained = {"row": "colbert", "n_train": 300, "metrics": {"ndcg@10": 0.4315},
               "dev": {"ndcg@10": 0.4134}, "best_step": None}
  assert li_rows.row_line(untrained, "ndcg@10", "ndcg@10").endswith("(dev ndcg@10 0.4134)")


@pytest.fixture(scope="module")
def setting_and_config(tmp_path_factory, tiny_bert_dir):
  """The late-interaction setting of a random BEIR folder (BM25 top 3 + 4 random docs per
  query, out of 60 docs) and its config."""
  from conftest import get_config  # pylint: disable=g-import-not-at-top
  from bilinear_ir.experiment import spec as spec_lib  # pylint: disable=g-import-not-at-top
  root = tmp_path_factory.mktemp("setting")
  config = get_config("late_interaction")
  config.encoder.model, config.encoder.cache_dir = tiny_bert_dir, str(root / "cache")
  config.encoder.max_length, config.encoder.query_max_length = 32, 8
  config.encoder.doc_max_length = 16
  config.rerank.bm25_depth, config.rerank.random_docs = 3, 4
  config.data.dev_fraction = 0.25
  data = spec_lib.collection_block(config.data, write_beir(str(root / "c"), num_docs=60,
                                                           num_queries=48, seed=4))
  return setting_lib.build_setting(config, data), config


def test_gold_outside_bm25s_top_depth_stays_out_of_the_candidates(setting_and_config):
  """A test query's gold doc that BM25 ranks below its top 3 and the seeded draw misses is no
  candidate: the candidates are BM25's top 3 and the draw (numpy twin), whatever the qrels say;
  recall counts the golds found, and no positive is reported injected."""
  setting, config = setting_and_config
  test, doc_ids = setting.split("test"), setting.prepared.collection.doc_ids
  row = {d: i for i, d in enumerate(doc_ids)}
  outside, found, total = 0, 0, 0
  for i, (q, r) in enumerate(zip(test.query_ids, setting.rows["test"])):
    top = setting.prepared.bm25_idx[r][:3]
    rest = np.setdiff1d(np.arange(len(doc_ids)), top)
    drawn = np.sort(np.random.default_rng([config.seed, 7, int(r)]).choice(rest, 4, replace=False))
    np.testing.assert_array_equal(setting.cands["test"][i], np.concatenate([top, drawn]))
    for d, rel in test.qrels[q].items():
      if rel > 0:
        total += 1
        found += row[d] in setting.cands["test"][i]
        outside += row[d] not in top and row[d] not in drawn
  assert outside > 0  # golds the draw left out: injecting them would change the candidates
  described = setting.describe(config.rerank, 8, 16)["candidates"]
  assert described["positives_injected"] is False
  assert described["recall"]["test"] == pytest.approx(found / total) and found < total


def test_positives_injected_is_computed_from_the_candidates_and_the_qrels(setting_and_config):
  """Each test query's gold docs added to its candidates (what a re-ranker that peeks at the
  qrels would score): the setting says so, and recall reaches 1."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  setting, config = setting_and_config
  test, doc_ids = setting.split("test"), setting.prepared.collection.doc_ids
  golds = [[doc_ids.index(d) for d, rel in test.qrels[q].items() if rel > 0]
           for q in test.query_ids]
  width = setting.cands["test"].shape[1] + max(map(len, golds))
  injected = np.full((len(golds), width), -1, np.int64)
  for i, g in enumerate(golds):
    row = list(dict.fromkeys(list(setting.cands["test"][i]) + g))
    injected[i, :len(row)] = row
  peeked = dataclasses.replace(setting, cands={**setting.cands, "test": injected})
  described = peeked.describe(config.rerank, 8, 16)["candidates"]
  assert described["positives_injected"] is True
  assert described["recall"]["test"] == 1.0
