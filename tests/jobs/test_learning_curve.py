"""The learning curve: nested subsets, the unseen-answer view, and the job on a tiny collection."""
import importlib.util
import os
import types

import numpy as np
import pytest

from bilinear_ir.data import pipeline
from bilinear_ir.eval import stats
from bilinear_ir.studies import curve_subsets as curve
from bilinear_ir.experiment import spec as spec_lib
from bilinear_ir.experiment import training
from bilinear_ir.jobs import learning_curve
from bilinear_ir.report import learning_curve as curve_report
from bilinear_ir.train import trainer
from conftest import REPO
from conftest import write_beir



def test_subsets_are_nested_and_drawn_by_seed():
  qids = [f"q{i}" for i in range(500)]
  sizes = (10, 50, 200, 10_000)
  a = curve.nested_subsets(qids, sizes, seed=0)
  assert sorted(a) == [10, 50, 200, 500]  # a size above the split means all of it
  for small, large in zip(sorted(a), sorted(a)[1:]):
    assert set(a[small]) < set(a[large])
  assert all(len(a[n]) == len(set(a[n])) == n for n in a)
  assert a == curve.nested_subsets(list(reversed(qids)), sizes, seed=0)  # input order ignored
  b = curve.nested_subsets(qids, sizes, seed=1)
  assert a[10] != b[10] and a[200] != b[200]
  assert b[500] == a[500] == sorted(qids)


def test_sizes_are_capped_and_deduplicated():
  assert curve.sizes_of((100, 300, 1000, 3000, 12889), 809) == [100, 300, 809]
  assert curve.sizes_of((5, 5, 2), 10) == [2, 5]


def test_unseen_answer_queries_by_hand():
  train = pipeline.Split("train", ["t1", "t2", "t3"],
                         {"t1": {"a": 1}, "t2": {"b": 1, "c": 0}, "t3": {"d": 1}})
  test = pipeline.Split("test", ["x", "y", "z", "w"],
                        {"x": {"a": 1}, "y": {"c": 1}, "z": {"b": 1, "e": 1}, "w": {"d": 1}})
  # Subsets {t1} (seed 0) and {t2} (seed 1): gold answers a and b are seen, c is judged 0.
  assert curve.unseen_answer_queries(train, [["t1"], ["t2"]], test) == ["w", "y"]
  assert curve.unseen_answer_queries(train, [["t1", "t2", "t3"]], test) == ["y"]
  assert curve.unseen_answer_queries(train, [[]], test) == ["w", "x", "y", "z"]


def test_schedule_caps_steps_and_spreads_evaluations():
  config = _config("unused", "unused")
  config.max_steps, config.evals = 50, 5
  # 2 epochs of ceil(20 / 8) batches of 8 pairs (the config below)
  assert learning_curve.schedule(config, config.train, 20, False) == {"steps": 6,
                                                                      "eval_every": 1}
  s = learning_curve.schedule(config, config.train, 10_000, True)
  assert s["steps"] == 50 and s["eval_every"] == 10 and s["temperature"] == 0.05


def _config(folder, cache):
  spec = importlib.util.spec_from_file_location(
      "curve_cfg", os.path.join(REPO, "configs", "learning_curve.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config(f"collection={folder},embeddings=mean,seeds=0+1,sizes=8+14+100,"
                        "models=wdp+lowrank,ranks=4,max_steps=12")
  c.train.batch_size, c.train.epochs = 8, 2
  c.evals = 3
  c.encoder.max_length, c.encoder.cache_dir = 32, str(cache)
  c.stats.resamples = 500
  c.hybrid.depth = 10
  return c


@pytest.fixture(scope="module")
def curve_run(tmp_path_factory):
  root = tmp_path_factory.mktemp("curve")
  folder = write_beir(str(root / "c"), num_docs=40, num_queries=60, seed=3,
                      splits=("train", "dev", "test"))
  config = _config(folder, root / "cache")
  learning_curve.validate(config)
  results = learning_curve.run(config, str(root / "w")).results
  return config, {**results, "_workdir": str(root / "w")}


def test_rows_cover_every_model_and_size(curve_run):
  config, res = curve_run
  models = ["dot", "wdp", "lowrank_r4", "learned"]
  # All 20 training queries (100 means all of them): the dev split is the folder's own
  # qrels/dev.tsv, not a part carved out of train.
  assert res["sizes"] == [8, 14, 20]
  for n in res["sizes"]:
    rows = [r for r in res["rows"] if r["n_train"] == n]
    assert [r["model"] for r in rows] == models
    for r in rows:
      assert r["collection"] == "c" and r["embedding"] == "mean"
      assert len(r["per_query"]) == 20  # every test query
      assert r["metrics"]["ndcg@10"] == pytest.approx(np.mean(list(r["per_query"].values())))
      assert set(r["vs_dot"] if r["model"] != "dot" else {}) <= {
          "diff", "ci95", "p_perm", "p_t", "effect_size", "n", "p_holm"}
  assert set(res) >= {"rows", "unseen_queries", "crossover", "hybrid_dot_bm25"}
  h = res["hybrid_dot_bm25"]["mean"]
  learned = [r for r in res["rows"] if r["model"] == "learned"][-1]
  assert h["learned_vs_hybrid"]["n_train"] == 20
  assert h["learned_vs_hybrid"]["diff"] == pytest.approx(np.mean(
      [learned["per_query"][q] - h["per_query"][q] for q in h["per_query"]]))
  assert 0.0 <= h["lambda"] <= 1.0 and len(h["per_query"]) == 20
  assert set(res["crossover"]) == {"mean"}


def test_comparisons_are_paired_against_dot_and_holm_over_the_curve(curve_run):
  config, res = curve_run
  dots = {r["n_train"]: r for r in res["rows"] if r["model"] == "dot"}
  for model in ("wdp", "lowrank_r4", "learned"):
    rows = [r for r in res["rows"] if r["model"] == model]
    for r in rows:
      d = dots[r["n_train"]]
      diffs = [r["per_query"][q] - d["per_query"][q] for q in d["per_query"]]
      assert r["vs_dot"]["diff"] == pytest.approx(np.mean(diffs))
      unseen = res["unseen_queries"][str(r["n_train"])]
      assert r["unseen"]["n_queries"] == len(unseen)
      if len(unseen) >= 2:
        assert r["unseen"]["vs_dot"]["diff"] == pytest.approx(
            np.mean([r["per_query"][q] - d["per_query"][q] for q in unseen]))
    assert [r["vs_dot"]["p_holm"] for r in rows] == pytest.approx(
        stats.holm([r["vs_dot"]["p_perm"] for r in rows]))


def test_unseen_queries_shrink_as_the_subsets_grow(curve_run):
  _, res = curve_run
  sets = [set(res["unseen_queries"][str(n)]) for n in res["sizes"]]
  for small, large in zip(sets, sets[1:]):
    assert large <= small


def test_learned_is_the_dev_best_candidate_per_seed(curve_run):
  config, res = curve_run
  sel = config.train.select_metric
  for n in res["sizes"]:
    rows = {r["model"]: r for r in res["rows"] if r["n_train"] == n}
    learned = rows["learned"]
    assert len(learned["chosen"]) == len(config.seeds)
    assert all(c in ("dot", "wdp", "lowrank_r4") for c in learned["chosen"])
    # Choosing trains every candidate: the learned row's time is theirs together.
    assert learned["seconds"] == pytest.approx(rows["wdp"]["seconds"]
                                               + rows["lowrank_r4"]["seconds"], abs=0.11)
    # One seed's choice equal for every seed: its dev mean is that candidate's.
    if len(set(learned["chosen"])) == 1:
      chosen = rows[learned["chosen"][0]]
      assert learned["dev"][sel] == pytest.approx(chosen["dev"][sel])
      assert learned["dev"][sel] >= max(r["dev"][sel] for r in rows.values()
                                        if r["model"] != "learned") - 1e-9


def test_crossover_is_the_smallest_significant_n(curve_run):
  config, res = curve_run
  gains = [r["n_train"] for r in res["rows"] if r["model"] == "learned"
           and r["unseen"].get("vs_dot")
           and stats.mark(r["unseen"]["vs_dot"], config.stats.alpha) == stats.GAIN]
  assert res["crossover"]["mean"] == (min(gains) if gains else None)


def test_a_rerun_resumes_every_finished_run_from_its_checkpoint(curve_run, monkeypatch):
  config, res = curve_run
  workdir = res["_workdir"]
  folders = sorted(os.listdir(os.path.join(workdir, "runs")))
  # One folder per (n, seed, trained model): 3 sizes x 2 seeds x (wdp, lowrank_r4).
  assert len(folders) == 12 and len({f.rsplit("-", 1)[0] for f in folders}) == 12

  def no_training(*args, **kwargs):
    raise AssertionError("a finished run was trained again")

  monkeypatch.setattr(trainer, "train_steps", no_training)
  again = learning_curve.run(config, workdir).results
  assert sorted(os.listdir(os.path.join(workdir, "runs"))) == folders
  for a, b in zip(res["rows"], again["rows"]):
    assert (a["model"], a["n_train"]) == (b["model"], b["n_train"])
    assert a["per_query"] == b["per_query"] and a["dev"] == b["dev"]
    assert a.get("best_steps") == b.get("best_steps") and a.get("chosen") == b.get("chosen")


def test_run_dir_changes_with_the_row_and_the_subset(curve_run):
  config, _ = curve_run
  recipe = spec_lib.Recipe.of(config, "mean")
  row = recipe.row({"scorer": "wdp"}, 0, {"steps": 5})
  split = lambda ids, dev=("d1",): types.SimpleNamespace(
      train=types.SimpleNamespace(query_ids=list(ids)),
      dev=types.SimpleNamespace(query_ids=list(dev)))
  coll = types.SimpleNamespace(collection=types.SimpleNamespace(name="c", num_docs=9))
  base = training.run_dir("w", row, coll, split(["a", "b"]), "mean:x/n2")
  assert base.startswith(os.path.join("w", "runs", "mean_x_n2-"))
  assert training.run_dir("w", row, coll, split(["a", "b"]), "mean:x/n2") == base
  others = [training.run_dir("w", recipe.row({"scorer": "wdp"}, 1, {"steps": 5}), coll,
                             split(["a", "b"]), "mean:x/n2"),
            training.run_dir("w", recipe.row({"scorer": "wdp"}, 0, {"steps": 6}), coll,
                             split(["a", "b"]), "mean:x/n2"),
            training.run_dir("w", row, coll, split(["b", "a"]), "mean:x/n2"),
            training.run_dir("w", row, coll, split(["a", "b"], ("d2",)), "mean:x/n2")]
  assert len(set(others + [base])) == 5
  assert len(set(others + [base] + [training.run_dir("w", row, other, split(["a", "b"]),
                                                     "mean:x/n2") for other in (
      types.SimpleNamespace(collection=types.SimpleNamespace(name="d", num_docs=9)),
      types.SimpleNamespace(collection=types.SimpleNamespace(name="c", num_docs=8)))])) == 7
  assert training.run_dir(None, row, coll, split(["a"]), "x") is None


def test_bad_arguments_are_refused(tmp_path):
  from bilinear_ir.errors import InputError  # pylint: disable=g-import-not-at-top
  config = _config(str(tmp_path / "missing"), tmp_path)
  with pytest.raises(InputError, match="collection"):
    learning_curve.validate(config)
  folder = write_beir(str(tmp_path / "c"), num_docs=10, num_queries=6)
  config = _config(folder, tmp_path)
  config.models = ("wdp", "colbert")
  with pytest.raises(InputError, match="models"):
    learning_curve.validate(config)
  config = _config(folder, tmp_path)
  config.sizes = (0, 10)
  with pytest.raises(InputError, match="sizes"):
    learning_curve.validate(config)


def test_plot_goes_symlog_only_where_a_difference_leaves_the_linear_band():
  def point(model, n, diff):
    test = {"diff": diff, "ci95": [diff - 0.005, diff + 0.005]}
    return {"embedding": emb, "model": model, "n_train": n, "vs_dot": test,
            "unseen": {"vs_dot": test}}
  rows = []
  for emb, far in (("near", -0.01), ("far", -0.4)):  # MoL's -0.4 at n = 100 on InsuranceQA
    for n in (100, 1000):
      rows += [point("wdp", n, 0.01), point("mol", n, far if n == 100 else 0.0)]
  config = types.SimpleNamespace(embeddings=("near", "far"))
  fig = curve_report.plot({"rows": rows, "measure": "ndcg@10"}, config)
  near, far = fig.axes[:2], fig.axes[2:]
  assert [ax.get_yscale() for ax in near] == ["linear"] * 2
  assert [ax.get_yscale() for ax in far] == ["symlog"] * 2
  for ax in far:
    lo, hi = ax.get_ylim()
    assert lo <= -0.4 - 0.005 and hi >= 0.015  # every point and its CI drawn
    assert set(ax.get_yticks()) <= set(curve_report.Y_TICKS)
    assert ax.get_yaxis().get_label().get_text().endswith("(symlog)")
