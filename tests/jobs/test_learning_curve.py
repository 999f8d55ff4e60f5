"""The learning curve: nested subsets, the unseen-answer view, and the job on a planted collection
where models learn and differ."""
import glob
import importlib.util
import json
import os
import types

import numpy as np
import orbax.checkpoint as ocp
import pytest
import scipy.linalg

from bilinear_ir.data import embeddings
from bilinear_ir.data import pipeline
from bilinear_ir.data import precomputed
from bilinear_ir.eval import stats
from bilinear_ir.studies import curve_subsets as curve
from bilinear_ir.experiment import spec as spec_lib
from bilinear_ir.experiment import training
from bilinear_ir.jobs import learning_curve
from bilinear_ir.report import learning_curve as curve_report
from bilinear_ir.train import trainer
from conftest import REPO
from conftest import TINY_VOCAB
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
  config.train.batch_size, config.train.epochs = 8, 2
  config.max_steps, config.evals = 50, 5
  # 2 epochs of ceil(20 / 8) batches of 8 pairs
  assert curve.schedule(config, config.train, 20) == {"steps": 6, "eval_every": 1}
  assert curve.schedule(config, config.train, 10_000) == {"steps": 50, "eval_every": 10}


# The planted collection: DIM-wide embeddings where a query is its gold doc mapped by a planted
# matrix plus noise. Training and test queries use A = S expm(0.8 K) (S: the signs +1, -1, +1,
# ...; K: a random skew-symmetric matrix), dev queries use S alone. The dot product cannot undo the
# sign flips (near chance everywhere); the full W learns A and wins on test; the diagonal WDP
# learns S, which wins on dev. So dev and test disagree on the best model. Train query tI has
# gold doc dI; test query xJ has the gold of tJ for J < SHARED (its answer is seen once tJ is
# trained on) and an answer no training query has otherwise.
DIM, DOCS, TRAIN, TEST, DEV = 16, 300, 40, 40, 40


def _planted_gold(shared: int) -> dict[str, int]:
  """{query id: gold doc row}: t0..t39 -> 0..39; x0..x39 -> J below `shared`, 100 + J above;
  v0..v39 (dev) -> 200 + J."""
  gold = {f"t{i}": i for i in range(TRAIN)}
  gold.update({f"x{j}": j if j < shared else 100 + j for j in range(TEST)})
  gold.update({f"v{j}": 200 + j for j in range(DEV)})
  return gold


def write_planted(root: str, shared: int = 30, seed: int = 0) -> tuple[str, str]:
  """Writes the planted BEIR folder `root/c` (random texts for BM25; qrels train, dev, test)
  and its precomputed embeddings `root/emb` (docs [DOCS, DIM], queries [120, DIM]); returns both
  paths."""
  rng = np.random.default_rng(seed)
  signs = np.diag(np.where(np.arange(DIM) % 2 == 0, 1.0, -1.0))
  k = rng.normal(size=(DIM, DIM))
  planted = signs @ scipy.linalg.expm(0.8 * (k - k.T) / np.sqrt(2 * DIM))
  docs = rng.normal(size=(DOCS, DIM)) / np.sqrt(DIM)
  gold = _planted_gold(shared)
  maps = {"t": planted, "x": planted, "v": signs}
  qids = list(gold)
  queries = np.stack([maps[q[0]] @ docs[gold[q]] + 0.3 * rng.normal(size=DIM) / np.sqrt(DIM)
                      for q in qids])
  folder = os.path.join(root, "c")
  os.makedirs(os.path.join(folder, "qrels"))
  words = TINY_VOCAB[5:]
  text = lambda size: " ".join(rng.choice(words, size=size))
  with open(os.path.join(folder, "corpus.jsonl"), "w", encoding="utf-8") as f:
    f.writelines(json.dumps({"_id": f"d{i}", "text": text(8)}) + "\n" for i in range(DOCS))
  with open(os.path.join(folder, "queries.jsonl"), "w", encoding="utf-8") as f:
    f.writelines(json.dumps({"_id": q, "text": text(4)}) + "\n" for q in qids)
  for split, prefix in (("train", "t"), ("dev", "v"), ("test", "x")):
    with open(os.path.join(folder, "qrels", f"{split}.tsv"), "w", encoding="utf-8") as f:
      f.write("query-id\tcorpus-id\tscore\n")
      f.writelines(f"{q}\td{gold[q]}\t1\n" for q in qids if q[0] == prefix)
  emb = os.path.join(root, "emb")
  precomputed.write(emb, embeddings.Embeddings(
      doc_ids=[f"d{i}" for i in range(DOCS)], docs=docs.astype(np.float32), query_ids=qids,
      queries=queries.astype(np.float32), manifest={}), {})
  return folder, emb


def _config(folder, emb, args="seeds=0+1,sizes=8+16+40,models=wdp+bilinear"):
  spec = importlib.util.spec_from_file_location(
      "curve_cfg", os.path.join(REPO, "configs", "learning_curve.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config(f"collection={folder},embeddings=precomputed:{emb},max_steps=40,{args}")
  # 5 epochs of batches of 8 pairs (5, 10 and 25 steps at n = 8, 16, 40), lr 0.2: WDP's
  # weights cross zero to learn the signs within the run (every row: its `row_train` block too).
  c.train.batch_size, c.train.epochs, c.train.lr = 8, 5, 0.2
  for block in c.row_train.values():
    block.lr = 0.2
  c.evals = 4
  c.stats.resamples = 500
  c.hybrid.depth = 10
  return c


@pytest.fixture(scope="module")
def curve_run(tmp_path_factory):
  root = tmp_path_factory.mktemp("curve")
  config = _config(*write_planted(str(root)))
  learning_curve.validate(config)
  results = learning_curve.run(config, str(root / "w")).results
  return config, {**results, "_workdir": str(root / "w")}


def _emb(config):
  (name,) = config.embeddings
  return name


def test_rows_cover_every_model_and_size(curve_run):
  config, res = curve_run
  models = ["dot", "wdp", "bilinear", "learned"]
  # The dev split is the folder's own qrels/dev.tsv, not a part carved out of train.
  assert res["sizes"] == [8, 16, 40]
  for n in res["sizes"]:
    rows = [r for r in res["rows"] if r["n_train"] == n]
    assert [r["model"] for r in rows] == models
    for r in rows:
      assert r["collection"] == "c" and r["embedding"] == _emb(config)
      assert sorted(r["per_query"]) == sorted(f"x{j}" for j in range(TEST))  # every test query
      assert r["metrics"]["ndcg@10"] == pytest.approx(np.mean(list(r["per_query"].values())))
      assert set(r["vs_dot"] if r["model"] != "dot" else {}) <= {
          "diff", "ci95", "p_perm", "p_t", "effect_size", "n", "p_holm"}
  assert set(res) >= {"rows", "unseen_queries", "crossover", "hybrid_dot_bm25"}
  h = res["hybrid_dot_bm25"][_emb(config)]
  learned = [r for r in res["rows"] if r["model"] == "learned"][-1]
  assert h["learned_vs_hybrid"]["n_train"] == 40
  assert h["learned_vs_hybrid"]["diff"] == pytest.approx(np.mean(
      [learned["per_query"][q] - h["per_query"][q] for q in h["per_query"]]))
  assert 0.0 <= h["lambda"] <= 1.0 and len(h["per_query"]) == TEST
  assert set(res["crossover"]) == {_emb(config)}
  # The hard-negative pool the curve trained with (InsuranceQA: the first 100 of 200 listed).
  assert res["negatives"] == {"from": "bm25", "hard_depth": 100}


def test_models_learn_the_planted_map_and_dev_and_test_disagree(curve_run):
  """The fixture's premise, so the tests below can tell a right protocol from a wrong one: at
  the largest n both trained models beat dot by a margin on dev and on test, WDP is the best on
  dev and the full W the best on test."""
  _, res = curve_run
  at = {r["model"]: r for r in res["rows"] if r["n_train"] == 40}
  for split, metric in (("dev", lambda r: r["dev"]["ndcg@10"]),
                        ("test", lambda r: r["metrics"]["ndcg@10"])):
    assert min(metric(at["wdp"]), metric(at["bilinear"])) > metric(at["dot"]) + 0.1, split
  assert at["wdp"]["dev"]["ndcg@10"] > at["bilinear"]["dev"]["ndcg@10"] + 0.1
  assert at["bilinear"]["metrics"]["ndcg@10"] > at["wdp"]["metrics"]["ndcg@10"] + 0.02


def test_comparisons_are_paired_against_dot_and_holm_over_the_curve(curve_run):
  config, res = curve_run
  dots = {r["n_train"]: r for r in res["rows"] if r["model"] == "dot"}
  for model in ("wdp", "bilinear", "learned"):
    rows = [r for r in res["rows"] if r["model"] == model]
    for r in rows:
      d = dots[r["n_train"]]
      diffs = [r["per_query"][q] - d["per_query"][q] for q in d["per_query"]]
      assert r["vs_dot"]["diff"] == pytest.approx(np.mean(diffs))
      unseen = res["unseen_queries"][str(r["n_train"])]
      assert r["unseen"]["n_queries"] == len(unseen) >= 2
      assert r["unseen"]["vs_dot"]["diff"] == pytest.approx(
          np.mean([r["per_query"][q] - d["per_query"][q] for q in unseen]))
    for view in (lambda r: r["vs_dot"], lambda r: r["unseen"]["vs_dot"]):
      assert [view(r)["p_holm"] for r in rows] == pytest.approx(
          stats.holm([view(r)["p_perm"] for r in rows]))


def test_unseen_set_is_the_union_over_seeds_of_that_ns_subsets(curve_run):
  """Test query xJ is unseen at n when no seed's subset of size n holds tJ (J < 30); x30..x39
  are always unseen. Counted from the planted answers, not by the job's function."""
  config, res = curve_run
  gold = _planted_gold(30)
  train = [f"t{i}" for i in range(TRAIN)]
  subsets = {s: curve.nested_subsets(train, res["sizes"], s) for s in config.seeds}
  unseen = lambda picked: sorted(f"x{j}" for j in range(TEST)
                                 if gold[f"x{j}"] not in {gold[t] for t in picked})
  for n in res["sizes"]:
    union = {t for s in config.seeds for t in subsets[s][n]}
    assert res["unseen_queries"][str(n)] == unseen(union), n
  # The wrong sets differ from the union at the smaller n, so the check above tells them apart:
  # one seed's subset only, or the largest subset for every n.
  for n in res["sizes"][:-1]:
    assert unseen(subsets[config.seeds[0]][n]) != res["unseen_queries"][str(n)]
    assert unseen(subsets[config.seeds[0]][40]) != res["unseen_queries"][str(n)]
  sets = [set(res["unseen_queries"][str(n)]) for n in res["sizes"]]
  for small, large in zip(sets, sets[1:]):
    assert large < small


def test_learned_is_the_dev_argmax_not_the_test_argmax(curve_run):
  config, res = curve_run
  sel = config.train.select_metric
  disagree = 0
  for n in res["sizes"]:
    rows = {r["model"]: r for r in res["rows"] if r["n_train"] == n}
    learned = rows["learned"]
    candidates = {m: rows[m] for m in ("dot", "wdp", "bilinear")}
    by_dev = max(candidates, key=lambda m: candidates[m]["dev"][sel])
    by_test = max(candidates, key=lambda m: candidates[m]["metrics"][sel])
    # Every seed chose the dev-best candidate (one choice for all seeds here), and the learned
    # row is that candidate's.
    assert learned["chosen"] == [by_dev] * len(config.seeds), n
    assert learned["per_query"] == rows[by_dev]["per_query"]
    assert learned["dev"][sel] == pytest.approx(rows[by_dev]["dev"][sel])
    disagree += by_dev != by_test
    # Choosing trains every candidate: the learned row's time is theirs together.
    assert learned["seconds"] == pytest.approx(rows["wdp"]["seconds"]
                                               + rows["bilinear"]["seconds"], abs=0.11)
  assert disagree >= 2  # picking by test would choose another learned row at these n


def _ndcg10_one_gold(queries: np.ndarray, docs: np.ndarray, gold: np.ndarray) -> float:
  """nDCG@10 of queries [Q, n] with one gold doc row each (gold [Q]) over docs [N, n], by hand."""
  scores = queries @ docs.T
  rank = 1 + (scores > scores[np.arange(len(gold)), gold][:, None]).sum(1)
  return float(np.mean(np.where(rank <= 10, 1.0 / np.log2(rank + 1), 0.0)))


def test_fit_is_scored_on_each_runs_own_training_questions(curve_run):
  """A trained row's "fit" is the dev metric on the run's own training subset (all of it here:
  n <= `runner.fit_queries`), at step 0 (the dot product) and at the params dev selected (the
  full W restored from the run's checkpoint), against a numpy twin; the report shows the gap."""
  config, res = curve_run
  assert config.train.select_metric == "ndcg@10"
  ((_, prepared, (splitset, *_)),) = list(spec_lib.embeddings_of(
      config, spec_lib.collection_block(config.data, config.collection)))
  emb, gold = prepared.embeddings, _planted_gold(30)
  rows_of = {q: i for i, q in enumerate(emb.query_ids)}
  doc_row = {d: i for i, d in enumerate(emb.doc_ids)}
  workdir = res["_workdir"]
  for r in res["rows"]:
    if r["model"] not in ("wdp", "bilinear"):
      assert "fit" not in r
      continue
    n = r["n_train"]
    assert r["fit"]["queries"] == [n] * len(config.seeds)
    step0, selected = [], []
    for seed in config.seeds:
      qids = curve.nested_subsets(splitset.train.query_ids, res["sizes"], seed)[n]
      q = emb.queries[[rows_of[x] for x in qids]]
      g = np.array([doc_row[f"d{gold[x]}"] for x in qids])
      step0.append(_ndcg10_one_gold(q, emb.docs, g))
      if r["model"] == "bilinear":
        (folder,) = glob.glob(os.path.join(workdir, "runs", f"*-n{n}-bilinear-seed{seed}-*"))
        ckpt = os.path.join(folder, "checkpoints")
        step = max(int(x) for x in os.listdir(ckpt) if x.isdigit())
        tree = ocp.StandardCheckpointer().restore(os.path.join(ckpt, str(step), "tree"))
        selected.append(_ndcg10_one_gold(q @ np.asarray(tree["best"]["params"]["W"]),
                                         emb.docs, g))
    assert r["fit"]["step0"] == pytest.approx(np.mean(step0), abs=1e-6), (r["model"], n)
    if selected:
      assert r["fit"]["selected"] == pytest.approx(np.mean(selected), abs=1e-6), n
  # The training questions share the planted map: the full W fits them far above dot at n = 40.
  at40 = {r["model"]: r for r in res["rows"] if r["n_train"] == 40}
  assert at40["bilinear"]["fit"]["selected"] > at40["bilinear"]["fit"]["step0"] + 0.2
  md = curve_report.markdown(res, config)
  fit = at40["bilinear"]["fit"]
  dev_gain = at40["bilinear"]["dev"]["ndcg@10"] - at40["dot"]["dev"]["ndcg@10"]
  assert f"| 40 |" in md and f"{fit['selected'] - fit['step0']:+.3f} / {dev_gain:+.3f}" in md


def test_crossover_is_the_smallest_n_whose_holm_p_is_below_alpha(curve_run):
  config, res = curve_run
  learned = [r for r in res["rows"] if r["model"] == "learned"]
  tests = [r["unseen"]["vs_dot"] for r in learned]
  holm = stats.holm([t["p_perm"] for t in tests])  # Holm over the curve, recomputed
  significant = [r["n_train"] for r, t, p in zip(learned, tests, holm)
                 if p < config.stats.alpha and t["diff"] > 0]
  assert significant and significant[0] > res["sizes"][0]  # a case that is neither None nor n0
  assert res["crossover"][_emb(config)] == significant[0]


def test_fewer_than_two_unseen_queries_mark_the_view_empty(tmp_path, capsys, monkeypatch):
  """Every test answer is a training answer: at n = 40 no test query is unseen. The job says so
  before any training, and ends in a result whose unseen view is marked empty, with no
  crossover."""
  config = _config(*write_planted(str(tmp_path), shared=TEST),
                   args="seeds=0,sizes=8+40,models=wdp")
  said_before_training = []
  train_steps = trainer.train_steps

  def first_training(*args, **kwargs):
    if not said_before_training:
      said_before_training.append("n=40: 0 unseen-answer test queries: view empty"
                                  in capsys.readouterr().err)
    return train_steps(*args, **kwargs)

  monkeypatch.setattr(trainer, "train_steps", first_training)
  res = learning_curve.run(config, str(tmp_path / "w"))
  assert said_before_training == [True]
  rows = [r for r in res.results["rows"] if r["n_train"] == 40]
  assert res.results["unseen_queries"]["40"] == []
  assert res.results["unseen_queries"]["8"]  # the answers of the 32 others are unseen at n = 8
  for r in rows:
    assert r["unseen"] == {"n_queries": 0, "mean": None, "empty": True}
  assert res.results["crossover"] == {_emb(config): None}
  assert res.markdown.endswith(f"{_emb(config)}: none.\n")
  assert "| 40 | 0 | - | - (-) | - (-) |" in res.markdown  # the unseen view's row at n = 40


def test_a_rerun_resumes_every_finished_run_from_its_checkpoint(curve_run, monkeypatch):
  config, res = curve_run
  workdir = res["_workdir"]
  folders = sorted(os.listdir(os.path.join(workdir, "runs")))
  # One folder per (n, seed, trained model): 3 sizes x 2 seeds x (wdp, bilinear).
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
  config = _config(folder, tmp_path, args="seeds=0,sizes=8,models=wdp+colbert")
  with pytest.raises(InputError, match=r"rows\[2\]\.model\.scorer"):
    learning_curve.validate(config)
  config = _config(folder, tmp_path)
  config.sizes = (0, 10)
  with pytest.raises(InputError, match="sizes"):
    learning_curve.validate(config)
  for bad in (0, -1):  # (a float is refused by the ConfigDict itself)
    config = _config(folder, tmp_path)
    config.runner.fit_queries = bad
    with pytest.raises(InputError, match=r"runner\.fit_queries"):
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
