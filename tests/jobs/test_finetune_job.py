"""The finetune job in-process on a shrunk config: a tiny random BERT (2 layers, n 32) on a tiny
BEIR collection with a planted signal (a query's words and its gold doc's words are disjoint,
paired by a fixed map the frozen encoder does not know).

Checks every row of the table (dot, BM25, the trained rows over frozen embeddings, the dev-best
one, the hybrid, both fine-tunes) and their fields (`finetune`, `cost`, `recovered`, the
unseen-answer view), the recovered fraction by hand from the written per-query values, the saved
encoder folders, that query_tower ranks with the frozen cache's doc embeddings bit for bit, that
a killed fine-tune's rerun ends with the numbers of an undisturbed one, and that dev (not test)
chose the steps and the dev-best row. The learning curve's fine-tune rows: one per n on the
seed's subset, and, where the curve's rows mine their negatives, a fixed pool (BM25's, or the
negatives the collection lists: the planted collection in InsuranceQA's layout).
"""
import gzip
import json
import os

import jax
import numpy as np
import pytest

from bilinear_ir.data import embeddings
from bilinear_ir.data import loaders
from bilinear_ir.encoders import hf_folder
from bilinear_ir.errors import InputError
from bilinear_ir.experiment import compare
from bilinear_ir.experiment import evaluate
from bilinear_ir.experiment import finetuning
from bilinear_ir.experiment import spec as spec_lib
from bilinear_ir.jobs import finetune as job
from bilinear_ir.jobs import learning_curve as curve_job
from bilinear_ir.report import outputs
from conftest import WORDS
from conftest import get_config
from conftest import write_model

# No claim here is about sharding: the jobs train and fine-tune on one device (fewer, smaller
# compiles).
pytestmark = pytest.mark.usefixtures("one_device_training")

QUERY_WORDS, DOC_WORDS = WORDS[:17], WORDS[17:34]  # word i of a query <-> word i of its doc
DOCS, TRAIN, DEV, TEST, SHARED = 60, 32, 12, 16, 4
FT_FIELDS = {"mode", "steps", "seconds", "device", "reindex_seconds", "negatives_from",
             "train_queries"}
TRAINED = ("bilinear", "adapter")  # the trained rows over the frozen embeddings, in the test


def write_planted(root: str) -> str:
  """A BEIR folder: query tJ (train), vJ (dev), xJ (test) judges one gold doc; the doc holds the
  partners of the query's 3 words plus 3 random doc words. x0..x3 share the gold docs of t0..t3
  (their answers are seen in training); every other query has a gold doc of its own."""
  rng = np.random.default_rng(0)
  folder = os.path.join(root, "planted")
  os.makedirs(os.path.join(folder, "qrels"))
  picks = [rng.choice(len(QUERY_WORDS), 3, replace=False) for _ in range(DOCS)]
  with open(os.path.join(folder, "corpus.jsonl"), "w", encoding="utf-8") as f:
    for i, p in enumerate(picks):
      words = [DOC_WORDS[j] for j in p] + list(rng.choice(DOC_WORDS, 3))
      f.write(json.dumps({"_id": f"d{i}", "title": "", "text": " ".join(rng.permutation(words))})
              + "\n")
  gold = {**{f"t{j}": j for j in range(TRAIN)}, **{f"v{j}": TRAIN + j for j in range(DEV)},
          **{f"x{j}": j if j < SHARED else TRAIN + DEV + j - SHARED for j in range(TEST)}}
  with open(os.path.join(folder, "queries.jsonl"), "w", encoding="utf-8") as f:
    for q, d in gold.items():
      text = " ".join(QUERY_WORDS[j] for j in rng.permutation(picks[d]))
      f.write(json.dumps({"_id": q, "text": text}) + "\n")
  for split, prefix in (("train", "t"), ("dev", "v"), ("test", "x")):
    with open(os.path.join(folder, "qrels", f"{split}.tsv"), "w", encoding="utf-8") as f:
      f.write("query-id\tcorpus-id\tscore\n")
      f.writelines(f"{q}\td{d}\t1\n" for q, d in gold.items() if q.startswith(prefix))
  return folder


def write_planted_iqa(root: str, beir: str, listed: int = 3) -> str:
  """The planted BEIR folder `beir` in InsuranceQA V2's layout (`answers.json.gz` and
  `{train,valid,test}.json.gz`), each question listing `listed` negatives: the docs after its
  gold one (mod the corpus), never a gold answer of its own."""
  folder = os.path.join(root, "planted_iqa")
  os.makedirs(folder)
  with open(os.path.join(beir, "corpus.jsonl"), encoding="utf-8") as f:
    docs = [json.loads(line) for line in f]
  with open(os.path.join(beir, "queries.jsonl"), encoding="utf-8") as f:
    texts = {q["_id"]: q["text"] for q in map(json.loads, f)}
  files = {"answers": {d["_id"]: {"en": d["text"], "zh": ""} for d in docs}}
  for split, name in (("train", "train"), ("dev", "valid"), ("test", "test")):
    with open(os.path.join(beir, "qrels", f"{split}.tsv"), encoding="utf-8") as f:
      gold = dict(line.split("\t")[:2] for line in list(f)[1:])
    files[name] = {q: {"en": texts[q], "zh": "", "domain": "planted", "answers": [d],
                       "negatives": [f"d{(int(d[1:]) + k) % DOCS}" for k in range(1, listed + 1)]}
                   for q, d in gold.items()}
  for name, obj in files.items():
    with gzip.open(os.path.join(folder, f"{name}.json.gz"), "wt", encoding="utf-8") as f:
      json.dump(obj, f)
  return folder


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
  root = str(tmp_path_factory.mktemp("finetune_job"))
  return root, write_planted(root), write_model(os.path.join(root, "bert"), "bert", seed=3)


def shrunk(planted, modes: str, steps: int = 8, rows: str = "table"):
  """The finetune config on the planted collection; `rows` "table": every row of the table with
  the trained rows full W and the adapter (16 steps at lr 0.05: there dev prefers the adapter,
  test full W), "dot": the dot row alone (the fine-tunes' tests)."""
  root, folder, model = planted
  c = get_config("finetune", f"collection={folder},modes={modes},steps={steps},"
                             "models=bilinear+adapter,max_steps=16")
  c.encoder.model, c.encoder.cache_dir, c.encoder.max_length = model, os.path.join(root, "cache"), 16
  c.train.hard_depth = 5
  c.evals = 4
  for name in TRAINED:
    c.row_train[name].lr = 0.05
  if rows == "dot":
    c.rows = tuple(r for r in c.rows if r["name"] == "dot")
  c.finetune.update(dict(batch_size=8, lr=2e-3, warmup_steps=0, eval_every=4,
                         checkpoint_every=2))
  c.eval.depth = 20
  c.stats.resamples = 200
  c.latency.update(dict(batch=8, repeats=1))
  c.lock()  # as main locks it
  job.validate(c)
  return c


def run_job(config, workdir: str):
  report = job.run(config, workdir)
  outputs.write(workdir, outputs.config_to_json(config), report)
  return report.results


@pytest.fixture(scope="module")
def done(planted):
  """(config, results, workdir) of the shrunk job with every row and both fine-tunes, run once."""
  config = shrunk(planted, "query_tower+two_tower")
  workdir = os.path.join(planted[0], "w-table")
  return config, run_job(config, workdir), workdir


def by_model(results):
  return {r["model"]: r for r in results["rows"]}


def test_rows_and_their_fields(done):
  config, results, workdir = done
  rows = by_model(results)
  assert list(rows) == ["dot", "bm25", *TRAINED, "learned", "hybrid", "query_tower", "two_tower"]
  test_ids = sorted(f"x{j}" for j in range(TEST))
  dot = rows["dot"]
  for r in rows.values():
    assert set(r["metrics"]) == set(config.eval.measures)
    assert sorted(r["per_query"]) == test_ids
    # the unseen-answer view: x0..x3 judge the gold docs of training queries
    assert r["unseen"]["n_queries"] == TEST - SHARED
    want = np.mean([r["per_query"][q] for q in test_ids if q not in ("x0", "x1", "x2", "x3")])
    assert r["unseen"]["mean"] == pytest.approx(want)
    cost = r["cost"]
    assert cost["ms_per_query"] > 0 and cost["raw_bytes_per_doc"] == 32 * 4
    if r["model"] == "dot":
      assert "vs_dot" not in r and "vs_dot" not in r["unseen"]
      continue
    assert r["vs_dot"]["n"] == TEST and r["unseen"]["vs_dot"]["n"] == TEST - SHARED
    assert r["vs_dot"]["diff"] == pytest.approx(r["metrics"]["ndcg@10"]
                                                - dot["metrics"]["ndcg@10"])
    assert r["vs_dot"]["p_holm"] >= r["vs_dot"]["p_perm"]  # Holm over the table
  # the index: the query-side rows keep the raw index, the two towers write a new one
  for name in ("dot", *TRAINED, "learned", "query_tower"):
    cost = rows[name]["cost"]
    assert (cost["index"], cost["index_changes"], cost["extra_bytes_per_doc"],
            cost["reencode_seconds"]) == ("raw", False, 0.0, 0.0), name
  assert all(rows[name]["cost"]["query_side"] for name in (*TRAINED, "learned"))
  assert not rows["dot"]["cost"]["query_side"] and not rows["query_tower"]["cost"]["query_side"]
  bm25, hybrid, two = rows["bm25"]["cost"], rows["hybrid"]["cost"], rows["two_tower"]["cost"]
  assert bm25["index"] == "bm25" and bm25["extra_bytes_per_doc"] > 0
  assert hybrid["index"] == "raw + bm25" and hybrid["index_changes"]
  assert hybrid["extra_bytes_per_doc"] == bm25["extra_bytes_per_doc"]
  assert two["index"] == "new" and two["extra_bytes_per_doc"] == 32 * 4
  assert two["reencode_seconds"] == rows["two_tower"]["finetune"]["reindex_seconds"] > 0
  assert rows["query_tower"]["cost"]["ms_per_query"] == dot["cost"]["ms_per_query"]
  for mode in ("query_tower", "two_tower"):
    f = rows[mode]["finetune"]
    assert set(f) == FT_FIELDS and f["mode"] == mode and f["steps"] == 8
    assert f["train_queries"] == [TRAIN] and f["negatives_from"] == "bm25"
    assert f["seconds"] > 0 and " x " in f["device"]
    assert [h["step"] for h in rows[mode]["history"][0]] == [0, 4, 8]
  assert rows["query_tower"]["finetune"]["reindex_seconds"] == 0.0  # the index never changes
  for name in TRAINED:
    assert rows[name]["seconds"] > 0 and len(rows[name]["best_steps"]) == 1
  assert rows["hybrid"]["seconds"] == rows["learned"]["seconds"]
  # the saved encoders: sentence-transformers folders holding each mode's chosen query side
  source = hf_folder.load_folder(config.encoder.model)
  for mode in ("query_tower", "two_tower"):
    folder = os.path.join(workdir, "model", f"mean-{mode}")
    assert os.path.isfile(os.path.join(folder, "modules.json"))
    saved = hf_folder.load_folder(folder)
    same = all(np.array_equal(a, b) for a, b in zip(
        jax_leaves(saved.params), jax_leaves(source.params)))
    assert same == (rows[mode]["best_steps"] == [0])  # the frozen encoder only at step 0
  with open(os.path.join(workdir, "results.json"), encoding="utf-8") as fh:
    written = json.loads(fh.read(), parse_constant=lambda c: pytest.fail(f"{c} in results.json"))
  assert written["rows"][-1]["finetune"] == rows["two_tower"]["finetune"]
  assert written["rows"][-1]["history"][0][0]["loss"] is None
  with open(os.path.join(workdir, "results.md"), encoding="utf-8") as fh:
    md = fh.read()
  for name in ("two-tower fine-tune", "query-tower fine-tune", "hybrid", "bm25"):
    assert f"| {name} |" in md
  assert f"{rows['two_tower']['metrics']['ndcg@10']:.4f}" in md


def test_recovered_fraction_by_hand(done):
  """(row - dot) / (two_tower - dot) from the per-query values written to results.json."""
  _, _, workdir = done
  with open(os.path.join(workdir, "results.json"), encoding="utf-8") as fh:
    rows = {r["model"]: r for r in json.load(fh)["rows"]}
  unseen = [f"x{j}" for j in range(SHARED, TEST)]
  views = {"all": lambda r: np.mean(list(r["per_query"].values())),
           "unseen": lambda r: np.mean([r["per_query"][q] for q in unseen])}
  for view, mean in views.items():
    gain = mean(rows["two_tower"]) - mean(rows["dot"])
    assert gain > 0, view  # the planted map is learned: the fraction is defined
    for name, r in rows.items():
      assert r["recovered"][view] == pytest.approx((mean(r) - mean(rows["dot"])) / gain), name
    assert rows["two_tower"]["recovered"][view] == pytest.approx(1.0)
    assert rows["dot"]["recovered"][view] == 0.0


def test_recovered_is_undefined_without_a_two_tower_gain():
  rows = [{"embedding": "mean", "model": m, "metrics": {"ndcg@10": v}, "unseen": {"mean": u}}
          for m, v, u in (("dot", 0.5, 0.4), ("wdp", 0.6, 0.5), ("two_tower", 0.5, 0.6))]
  compare.recovered(rows, "two_tower", "ndcg@10", ("embedding",))
  assert rows[1]["recovered"] == {"all": None, "unseen": pytest.approx(0.5)}
  compare.recovered(rows[:2], "two_tower", "ndcg@10", ("embedding",))  # no two-tower row
  assert rows[1]["recovered"] == {"all": None, "unseen": None}
  bare = [{"row": r["model"], "n": 1, "metrics": r["metrics"]} for r in rows]
  compare.recovered(bare, "wdp", "ndcg@10", ("n",), name="row")  # no unseen view: "all" only
  assert [r["recovered"] for r in bare] == [{"all": 0.0}, {"all": 1.0}, {"all": 0.0}]


def test_the_dev_best_row_is_chosen_on_dev(done):
  config, results, _ = done
  rows = by_model(results)
  trained = list(TRAINED)
  dev = {name: rows[name]["dev"]["ndcg@10"] for name in trained}
  test = {name: rows[name]["metrics"]["ndcg@10"] for name in trained}
  best = max(trained, key=lambda n: dev[n])  # the first on ties, as `rows.best_on_dev`
  learned = rows["learned"]
  assert [c.split("@")[0] for c in learned["chosen"]] == [best]
  assert learned["per_query"] == rows[best]["per_query"]
  assert learned["dev"]["ndcg@10"] == dev[best]
  # the hybrid blends that row with BM25 (lam on dev)
  assert rows["hybrid"]["cost"]["ms_per_query"] == pytest.approx(
      rows["learned"]["cost"]["ms_per_query"] + rows["bm25"]["cost"]["ms_per_query"])
  # dev and test disagree here, so a selection on test would pick another row
  assert max(trained, key=lambda n: test[n]) != best


def jax_leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


MODES = ("query_tower", "two_tower")


def test_the_planted_signal_is_learned(done):
  rows = by_model(done[1])
  for mode in MODES:
    history = rows[mode]["history"][0]
    assert rows[mode]["best_steps"][0] > 0, mode
    assert max(h["dev"] for h in history) > history[0]["dev"], mode


def test_dev_not_test_chose_the_step(done):
  rows = by_model(done[1])
  dot = rows["dot"]
  for mode in MODES:
    ft = rows[mode]
    history = ft["history"][0]
    # step 0 is the frozen encoder: its dev value is the dot row's dev metric, not its test one
    assert history[0]["dev"] == pytest.approx(dot["dev"]["ndcg@10"], abs=1e-9)
    assert dot["dev"]["ndcg@10"] != pytest.approx(dot["metrics"]["ndcg@10"])
    best = max(history, key=lambda h: h["dev"])  # the first on ties, as `fit` keeps
    assert ft["best_steps"] == [best["step"]] and ft["dev"]["ndcg@10"] == best["dev"]


def test_a_killed_query_tower_resumes_to_the_same_numbers_on_the_frozen_docs(planted, done,
                                                                             monkeypatch):
  """The query-tower fine-tune of the full table, killed after 3 steps and run again: the same
  numbers as the undisturbed run (the other rows do not touch it), and every ranking of the
  rerun (dot's dev and test, the fine-tune's dev and test) over the frozen cache's doc
  embeddings, bit for bit."""
  config = shrunk(planted, "query_tower", rows="dot")
  workdir = os.path.join(planted[0], "w-killed")
  fit = finetuning.finetune.fit
  monkeypatch.setattr(finetuning.finetune, "fit",
                      lambda *a, **k: fit(*a, **{**k, "stop_after": 3}))
  killed = by_model(run_job(config, workdir))["query_tower"]
  assert [h["step"] for h in killed["history"][0]] == [0]  # stopped before the evaluation at 4
  monkeypatch.setattr(finetuning.finetune, "fit", fit)
  seen = []
  call = evaluate.RankingEvaluator.__call__

  def spy(self, module, params, q_feats, d_feats):
    seen.append(np.array(d_feats))
    return call(self, module, params, q_feats, d_feats)

  monkeypatch.setattr(evaluate.RankingEvaluator, "__call__", spy)
  again = by_model(run_job(config, workdir))["query_tower"]
  coll = loaders.load(spec_lib.collection_block(config.data, config.collection))
  frozen = embeddings.embed_collection(coll, spec_lib.Recipe.of(config, "mean").encoder).docs
  assert len(seen) >= 4  # dot's dev and test, the fine-tune's dev at 4 and 8, its test
  for docs in seen:
    assert docs.dtype == frozen.dtype and np.array_equal(docs, frozen)
  want = by_model(done[1])["query_tower"]
  assert again["history"] == want["history"]
  assert again["best_steps"] == want["best_steps"]
  assert again["per_query"] == want["per_query"] and again["metrics"] == want["metrics"]
  assert os.path.isdir(os.path.join(workdir, "runs"))


def test_query_tower_with_the_corpus_loss(planted, tmp_path):
  config = shrunk(planted, "query_tower", rows="dot")
  config.finetune.loss = "corpus"
  results = run_job(config, str(tmp_path / "w"))
  ft = by_model(results)["query_tower"]
  assert results["loss"] == "corpus" and ft["finetune"]["reindex_seconds"] == 0.0
  assert all(np.isfinite(h["loss"]) for h in ft["history"][0][1:])
  assert ft["best_steps"][0] > 0  # the planted map is learned from the softmax over the corpus


def test_two_tower_refuses_the_corpus_loss():
  config = get_config("finetune", "modes=two_tower,loss=corpus")
  with pytest.raises(InputError, match="finetune.loss"):
    job.validate(config)
  config = get_config("finetune", "modes=two_tower+two_tower")
  with pytest.raises(InputError, match="modes"):
    job.validate(config)


def run_curve(planted, sizes: str, epochs: float, workdir: str, iqa: str = "",
              finetunes: str = "query_tower", **train) -> outputs.Report:
  """The learning curve's report on the planted collection: the wdp row (4 steps) and each
  fine-tune of `finetunes` at each of `sizes` (`epochs` epochs of batches of 8); `iqa`: the
  collection's InsuranceQA-layout copy (`write_planted_iqa`), read as collection=insuranceqa
  reads the package's files; `train`: changes to the train block."""
  root, folder, model = planted
  c = get_config("learning_curve", f"collection={'insuranceqa' if iqa else folder},"
                                   f"embeddings=mean,seeds=0,sizes={sizes},models=wdp,"
                                   f"max_steps=4,finetunes={finetunes},finetune_epochs={epochs}")
  c.data.path = iqa  # collection=insuranceqa reads the package's files from this folder
  c.encoder.model, c.encoder.cache_dir, c.encoder.max_length = model, os.path.join(root, "cache"), 16
  c.train.update(dict(hard_depth=5, **train))
  c.evals = 2
  c.finetune_evals = 1
  c.finetune.update(dict(batch_size=8, lr=2e-3, checkpoint_every=2))
  c.eval.depth = 20
  c.stats.resamples = 200
  c.lock()
  curve_job.validate(c)
  return curve_job.run(c, os.path.join(root, workdir))


def test_the_learning_curve_fine_tunes_each_seeds_subset_at_every_n(planted):
  """learning_curve with finetunes=query_tower: at every n one fine-tune row, trained on the n
  queries of the seed's subset (not the whole training split) for ceil(epochs n / batch)
  steps, compared with dot like the curve's other rows (Holm over the n of the curve)."""
  results = run_curve(planted, f"8+{TRAIN}", 1.5, "w-curve").results
  tuned = [r for r in results["rows"] if r["model"] == "query_tower"]
  assert [r["n_train"] for r in tuned] == [8, TRAIN]
  for r in tuned:
    n = r["n_train"]
    f = r["finetune"]
    assert f["train_queries"] == [n] and f["steps"] == int(np.ceil(1.5 * n / 8)), f
    assert f["negatives_from"] == "bm25"
    assert [h["step"] for h in r["history"][0]] == [0, f["steps"]]
    assert r["vs_dot"]["n"] == TEST and r["vs_dot"]["p_holm"] >= r["vs_dot"]["p_perm"]
  assert results["finetunes"] == {"modes": ["query_tower"], "epochs": 1.5, "evals": 1,
                                  "loss": "mnrl"}


def test_a_curve_with_two_towers_gives_each_row_the_fraction_of_their_gain_it_recovers(planted):
  """learning_curve with finetunes=query_tower+two_tower: at each n every row carries the
  finetune job's "recovered", (row - dot) / (two towers - dot) at that n, on all test queries
  and on the unseen-answer ones (None where the two towers did not gain or the view is empty),
  and the report prints it per n, all / unseen."""
  report = run_curve(planted, f"8+{TRAIN}", 1.5, "w-curve-tt", finetunes="query_tower+two_tower")
  rows, m0 = report.results["rows"], report.results["measure"]
  views = {"all": lambda r: r["metrics"][m0], "unseen": lambda r: r["unseen"]["mean"]}
  after = report.markdown.split("recovers at its own n")[1].splitlines()  # the table follows
  defined = 0
  for n in (8, TRAIN):
    at = {r["model"]: r for r in rows if r["n_train"] == n}
    assert {"dot", "query_tower", "two_tower"} <= set(at)
    for view, of in views.items():
      dot, top = of(at["dot"]), of(at["two_tower"])
      gain = top - dot if None not in (dot, top) else None
      for r in at.values():
        got = r["recovered"][view]
        if gain is None or gain <= 0:
          assert got is None, (n, view, r["model"])
        else:
          defined += 1
          assert got == pytest.approx((of(r) - dot) / gain), (n, view, r["model"])
    q = at["query_tower"]["recovered"]
    shown = [f"{x:.2f}" if x is not None else "-" for x in (q["all"], q["unseen"])]
    assert " / ".join(shown) in next(line for line in after if line.startswith(f"| {n} |"))
  assert defined  # else every fraction is None and the formula above checks nothing


def test_a_curve_whose_rows_mine_their_negatives_fine_tunes_on_a_fixed_pool(planted):
  """learning_curve with negatives mined by the model (its default on InsuranceQA) and
  finetunes=query_tower: the trained rows mine, the fine-tune draws its hard negatives from the
  collection's fixed pool (BM25's here: the planted collection lists none) and records it.
  Before, the fine-tune asked `pipeline.trainset` for a "mined" pool and the job stopped with
  exit code 2 after training every other row."""
  results = run_curve(planted, str(TRAIN), 0.5, "w-curve-mined", negatives_from="mined",
                      refresh_every=2).results
  rows = {r["model"]: r for r in results["rows"]}
  assert rows["wdp"]["negatives_from"] == "mined"
  assert rows["query_tower"]["finetune"]["negatives_from"] == "bm25"
  assert rows["query_tower"]["finetune"]["steps"] == TRAIN // 16


def test_a_curve_whose_rows_mine_fine_tunes_on_the_listed_negatives(planted):
  """The same on the planted collection in InsuranceQA's layout, which lists each question's
  negatives: the fine-tune draws its hard negatives from the listed ones ("dataset"), as the
  curve's fine-tune rows do on InsuranceQA itself."""
  root = planted[0]
  iqa = write_planted_iqa(root, planted[1])
  results = run_curve(planted, str(TRAIN), 0.5, "w-curve-mined-iqa", iqa=iqa,
                      negatives_from="mined", refresh_every=2).results
  rows = {r["model"]: r for r in results["rows"]}
  assert rows["wdp"]["negatives_from"] == "mined"
  assert rows["query_tower"]["finetune"]["negatives_from"] == "dataset"
  assert rows["query_tower"]["vs_dot"]["n"] == TEST
