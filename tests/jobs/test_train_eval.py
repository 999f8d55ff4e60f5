"""The train_eval job end to end through main: outputs, folds, SIGKILL + resume, bad input."""
import os
import signal
import time

import numpy as np
import pytest

from bilinear_ir.config import blocks
from bilinear_ir.eval import metrics, trec
from bilinear_ir.export import saved_model
from conftest import write_beir


CONFIG = "configs/train_eval.py:scorer=lowrank,rank=4,residual=identity"


def _flags(beir, bert, cache, *extra):
  return ["--config.data.format=beir", f"--config.data.path={beir}",
          f"--config.encoder.model={bert}", f"--config.encoder.cache_dir={cache}",
          "--config.encoder.max_length=32", "--config.train.batch_size=8",
          "--config.eval.depth=50", *extra]


@pytest.fixture(scope="module")
def beir(tmp_path_factory):
  return write_beir(str(tmp_path_factory.mktemp("beir")), num_docs=60, num_queries=48)


def test_train_eval_writes_consistent_results(tmp_path, beir, tiny_bert_dir, run_main):
  w = tmp_path / "w"
  res = run_main.in_process(CONFIG, w, *_flags(beir, tiny_bert_dir, tmp_path / "cache",
                                               "--config.train.steps=30",
                                               "--config.train.eval_every=10"))
  assert res["mode"] == "full" and set(res["metrics"]) == {"ndcg@10", "mrr@10", "map",
                                                           "recall@100"}
  assert [h["step"] for h in res["history"]] == [0, 10, 20, 30]
  # The reported metrics are those of the written run against the collection's test qrels.
  run = trec.read_run(str(w / "run.trec"))
  qrels = {}
  for line in open(os.path.join(beir, "qrels", "test.tsv")).read().splitlines()[1:]:
    q, d, r = line.split("\t")
    qrels.setdefault(q, {})[d] = int(r)
  again = metrics.evaluate(qrels, run, list(res["metrics"]))["mean"]
  for m, v in res["metrics"].items():
    assert again[m] == pytest.approx(v, abs=1e-9)
  assert all(len(docs) == 50 for docs in run.values()) and set(run) == set(qrels)
  for name in ("config.json", "results.md"):
    assert (w / name).exists()


def test_folds_report_mean_and_std(tmp_path, tiny_bert_dir, run_main):
  beir = write_beir(str(tmp_path / "one_split"), num_docs=50, num_queries=30, seed=3,
                    splits=("test",))
  w = tmp_path / "w"
  res = run_main.in_process(CONFIG, w, *_flags(beir, tiny_bert_dir, tmp_path / "cache",
                                               "--config.data.folds=3", "--config.train.steps=10",
                                               "--config.train.eval_every=5"))
  assert len(res["folds"]) == 3 and sum(f["queries"] for f in res["folds"]) == 30
  for m in res["metrics"]:
    vals = [f["metrics"][m] for f in res["folds"]]
    assert res["metrics"][m] == pytest.approx(np.mean(vals))
    assert res["std"][m] == pytest.approx(np.std(vals, ddof=1))  # the sample std over folds
  assert len(trec.read_run(str(w / "run.trec"))) == 30  # every query held out exactly once


def test_sigkill_then_rerun_resumes_and_matches_uninterrupted(tmp_path, beir, tiny_bert_dir,
                                                              run_main):
  extra = ("--config.train.steps=1500", "--config.train.eval_every=250",
           "--config.train.checkpoint_every=50", "--config.train.hard_negatives=0")
  cache = tmp_path / "cache"
  ref = tmp_path / "ref"
  want = run_main(CONFIG, ref, *_flags(beir, tiny_bert_dir, cache, *extra)).results()

  w = tmp_path / "w"
  ckpts = w / "checkpoints"
  p = run_main.popen(CONFIG, w, *_flags(beir, tiny_bert_dir, cache, *extra))
  deadline = time.time() + 300
  while time.time() < deadline and p.poll() is None:
    steps = [int(s) for s in os.listdir(ckpts) if s.isdigit()] if ckpts.exists() else []
    if steps and max(steps) >= 100:
      break
    time.sleep(0.05)
  assert p.poll() is None, "training finished before it could be killed"
  os.kill(p.pid, signal.SIGKILL)
  p.communicate()
  assert not (w / "results.json").exists()
  killed_at = max(int(s) for s in os.listdir(ckpts) if s.isdigit())
  assert 100 <= killed_at < 1500

  got = run_main(CONFIG, w, *_flags(beir, tiny_bert_dir, cache, *extra)).results()
  assert got["metrics"] == want["metrics"]
  assert got["history"] == want["history"] and got["best_step"] == want["best_step"]
  assert (w / "run.trec").read_text() == (ref / "run.trec").read_text()


def test_unknown_scorer_exits_2_without_results(tmp_path, beir, tiny_bert_dir, run_main):
  run_main(CONFIG, tmp_path / "w", *_flags(beir, tiny_bert_dir, tmp_path / "cache",
                                           "--config.model.scorer=cosine_magic")
           ).one_error_line("cosine_magic")


def test_saved_model_reloads_and_scores_like_the_run(tmp_path, beir, tiny_bert_dir, run_main):
  from bilinear_ir.data import embeddings, loaders  # pylint: disable=g-import-not-at-top
  w = tmp_path / "w"
  run_main.in_process(CONFIG, w, *_flags(beir, tiny_bert_dir, tmp_path / "cache",
                                         "--config.train.steps=20", "--config.train.eval_every=10"))
  module, params, meta = saved_model.load_model(str(w / "model"))
  assert meta["scorer"] == "lowrank" and meta["options"]["rank"] == 4 and meta["dim"] == 32
  data = blocks.data_config()
  data.format, data.path = "beir", beir
  coll = loaders.load(data)
  enc = blocks.encoder_config()
  for key, value in meta["embedding"].items():
    enc[key] = value
  enc.cache_dir = str(tmp_path / "cache")
  emb = embeddings.embed_collection(coll, enc)
  # The run's top doc of every test query is the reloaded model's argmax over the corpus.
  run = trec.read_run(str(w / "run.trec"))
  for qid, docs in list(run.items())[:5]:
    q = emb.query_rows([qid])
    scores = np.asarray(module.apply({"params": params}, q, emb.docs, method=module.score_all))[0]
    top = max(docs, key=lambda d: (docs[d], -emb.doc_ids.index(d)))
    assert emb.doc_ids[int(np.argmax(scores))] == top
