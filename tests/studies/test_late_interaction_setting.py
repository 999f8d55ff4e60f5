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
  rng = np.random.default_rng(4)
  qids = [f"q{i}" for i in range(12)]
  rows = [{"row": name, "n_train": n, "per_query": dict(zip(qids, rng.random(12) + shift))}
          for n in (5, 30) for name, shift in (("dot", 0.0), ("colbert", 0.1), ("lite", 0.3),
                                               ("hybrid (lite + BM25)", 0.4))]
  config = ml_collections.ConfigDict({"seed": 0, "stats": blocks.stats_config()})
  config.stats.resamples = 500
  li_rows.compare_rows(rows, config)
  at = {(r["row"], r["n_train"]): r for r in rows}
  for base in ("colbert", "dot"):
    family = [r for r in rows if r["row"] != base]
    assert all(f"vs_{base}" not in r for r in rows if r["row"] == base)
    for r in family:  # the baseline of the same n
      b = at[base, r["n_train"]]["per_query"]
      assert r[f"vs_{base}"]["diff"] == pytest.approx(np.mean([r["per_query"][q] - b[q]
                                                               for q in qids]))
    p = np.array([r[f"vs_{base}"]["p_perm"] for r in family])
    np.testing.assert_allclose([r[f"vs_{base}"]["p_holm"] for r in family], _holm(p))


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
