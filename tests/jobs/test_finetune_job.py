"""The finetune job in-process on a shrunk config: a tiny random BERT (2 layers, n 32) on a tiny
BEIR collection with a planted signal (a query's words and its gold doc's words are disjoint,
paired by a fixed map the frozen encoder does not know).

Checks the rows and their `finetune` fields, the saved encoder folder, that query_tower ranks with
the frozen cache's doc embeddings bit for bit, that a killed fine-tune's rerun ends with the
numbers of an undisturbed one, and that dev (not test) chose the step.
"""
import json
import os

import jax
import numpy as np
import pytest

from bilinear_ir.data import embeddings
from bilinear_ir.data import loaders
from bilinear_ir.encoders import hf_folder
from bilinear_ir.errors import InputError
from bilinear_ir.experiment import evaluate
from bilinear_ir.experiment import finetuning
from bilinear_ir.experiment import spec as spec_lib
from bilinear_ir.jobs import finetune as job
from bilinear_ir.report import outputs
from conftest import WORDS
from conftest import get_config
from conftest import write_model

QUERY_WORDS, DOC_WORDS = WORDS[:17], WORDS[17:34]  # word i of a query <-> word i of its doc
DOCS, TRAIN, DEV, TEST, SHARED = 60, 32, 12, 16, 4
FT_FIELDS = {"mode", "steps", "seconds", "device", "reindex_seconds"}


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


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
  root = str(tmp_path_factory.mktemp("finetune_job"))
  return root, write_planted(root), write_model(os.path.join(root, "bert"), "bert", seed=3)


def shrunk(planted, mode: str, steps: int = 8):
  root, folder, model = planted
  c = get_config("finetune", f"collection={folder},mode={mode},steps={steps}")
  c.encoder.model, c.encoder.cache_dir, c.encoder.max_length = model, os.path.join(root, "cache"), 16
  c.train.hard_depth = 5
  c.finetune.update(dict(batch_size=8, lr=2e-3, warmup_steps=0, eval_every=4,
                         checkpoint_every=2))
  c.eval.depth = 20
  c.stats.resamples = 200
  job.validate(c)
  return c


def run_job(config, workdir: str):
  report = job.run(config, workdir)
  outputs.write(workdir, outputs.config_to_json(config), report)
  return report.results


@pytest.fixture(scope="module")
def finished(planted):
  """mode -> (config, results, workdir, docs) of the shrunk job, run once per mode; docs: the
  d_feats [N, n] of every `RankingEvaluator` call of the run, copied."""
  cache = {}
  call = evaluate.RankingEvaluator.__call__

  def get(mode: str):
    if mode not in cache:
      config = shrunk(planted, mode)
      workdir = os.path.join(planted[0], f"w-{mode}")
      seen = []

      def spy(self, module, params, q_feats, d_feats):
        seen.append(np.array(d_feats))
        return call(self, module, params, q_feats, d_feats)

      with pytest.MonkeyPatch.context() as patch:
        patch.setattr(evaluate.RankingEvaluator, "__call__", spy)
        cache[mode] = config, run_job(config, workdir), workdir, seen
    return cache[mode]

  return get


@pytest.fixture(params=["query_tower", "two_tower"])
def done(request, finished):
  return finished(request.param)


def test_rows_and_their_fields(done):
  config, results, workdir, _ = done
  dot, ft = results["rows"]
  assert (dot["model"], ft["model"]) == ("dot", "finetune")
  test_ids = sorted(f"x{j}" for j in range(TEST))
  for r in (dot, ft):
    assert set(r["metrics"]) == set(config.eval.measures)
    assert sorted(r["per_query"]) == test_ids
    # the unseen-answer view: x0..x3 judge the gold docs of training queries
    assert r["unseen"]["n_queries"] == TEST - SHARED
    want = np.mean([r["per_query"][q] for q in test_ids if q not in ("x0", "x1", "x2", "x3")])
    assert r["unseen"]["mean"] == pytest.approx(want)
  assert ft["vs_dot"]["n"] == TEST and ft["unseen"]["vs_dot"]["n"] == TEST - SHARED
  assert ft["vs_dot"]["diff"] == pytest.approx(ft["metrics"]["ndcg@10"] - dot["metrics"]["ndcg@10"])
  f = ft["finetune"]
  assert set(f) == FT_FIELDS and f["mode"] == config.finetune.mode and f["steps"] == 8
  assert f["seconds"] > 0 and " x " in f["device"]
  if config.finetune.mode == "query_tower":
    assert f["reindex_seconds"] == 0.0  # the index never changes
  else:
    assert f["reindex_seconds"] > 0
  assert [h["step"] for h in ft["history"][0]] == [0, 4, 8]
  # the saved encoder: a sentence-transformers folder holding the chosen query side
  folder = os.path.join(workdir, "model", "mean")
  assert os.path.isfile(os.path.join(folder, "modules.json"))
  saved = hf_folder.load_folder(folder)
  source = hf_folder.load_folder(config.encoder.model)
  same = all(np.array_equal(a, b) for a, b in zip(
      jax_leaves(saved.params), jax_leaves(source.params)))
  assert same == (ft["best_steps"] == [0])  # the frozen encoder only when step 0 was chosen
  with open(os.path.join(workdir, "results.json"), encoding="utf-8") as fh:
    written = json.loads(fh.read(), parse_constant=lambda c: pytest.fail(f"{c} in results.json"))
  assert written["rows"][1]["finetune"] == f and written["rows"][1]["history"][0][0]["loss"] is None
  with open(os.path.join(workdir, "results.md"), encoding="utf-8") as fh:
    md = fh.read()
  assert "| finetune |" in md and f"{ft['metrics']['ndcg@10']:.4f}" in md


def jax_leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_the_planted_signal_is_learned(done):
  _, results, _, _ = done
  ft = results["rows"][1]
  history = ft["history"][0]
  assert ft["best_steps"][0] > 0 and max(h["dev"] for h in history) > history[0]["dev"]


def test_dev_not_test_chose_the_step(done):
  _, results, _, _ = done
  dot, ft = results["rows"]
  history = ft["history"][0]
  # step 0 is the frozen encoder: its dev value is the dot row's dev metric, not its test one
  assert history[0]["dev"] == pytest.approx(dot["dev"]["ndcg@10"], abs=1e-9)
  assert dot["dev"]["ndcg@10"] != pytest.approx(dot["metrics"]["ndcg@10"])
  best = max(history, key=lambda h: h["dev"])  # the first on ties, as `fit` keeps
  assert ft["best_steps"] == [best["step"]] and ft["dev"]["ndcg@10"] == best["dev"]


def test_query_tower_ranks_with_the_frozen_cache_bit_for_bit(finished):
  config, _, _, seen = finished("query_tower")
  coll = loaders.load(spec_lib.collection_block(config.data, config.collection))
  frozen = embeddings.embed_collection(coll, spec_lib.Recipe.of(config, "mean").encoder).docs
  assert len(seen) >= 6  # dot's dev and test, the fine-tune's dev at 0, 4 and 8, its test
  for docs in seen:
    assert docs.dtype == frozen.dtype and np.array_equal(docs, frozen)


def test_a_killed_fine_tune_resumes_to_the_same_numbers(planted, finished, monkeypatch):
  config, results, _, _ = finished("query_tower")
  workdir = os.path.join(planted[0], "w-killed")
  fit = finetuning.finetune.fit
  monkeypatch.setattr(finetuning.finetune, "fit",
                      lambda *a, **k: fit(*a, **{**k, "stop_after": 3}))
  killed = run_job(config, workdir)["rows"][1]
  assert [h["step"] for h in killed["history"][0]] == [0]  # stopped before the evaluation at 4
  monkeypatch.setattr(finetuning.finetune, "fit", fit)
  again = run_job(config, workdir)["rows"][1]
  want = results["rows"][1]
  assert again["history"] == want["history"]
  assert again["best_steps"] == want["best_steps"]
  assert again["per_query"] == want["per_query"] and again["metrics"] == want["metrics"]
  assert os.path.isdir(os.path.join(workdir, "runs"))


def test_query_tower_with_the_corpus_loss(planted, tmp_path):
  config = shrunk(planted, "query_tower")
  config.finetune.loss = "corpus"
  results = run_job(config, str(tmp_path / "w"))
  ft = results["rows"][1]
  assert results["loss"] == "corpus" and ft["finetune"]["reindex_seconds"] == 0.0
  assert all(np.isfinite(h["loss"]) for h in ft["history"][0][1:])
  assert ft["best_steps"][0] > 0  # the planted map is learned from the softmax over the corpus


def test_two_tower_refuses_the_corpus_loss():
  config = get_config("finetune", "mode=two_tower,loss=corpus")
  with pytest.raises(InputError, match="finetune.loss"):
    job.validate(config)
