"""benchmarks/finetune_peer.py at tiny size (a 2-layer random BERT, a random BEIR collection):
both sides train on the same triplets and the JSON names what a reader needs (no timing is
asserted)."""
import os
import sys

import numpy as np
import pytest

from conftest import REPO
from conftest import TINY_VOCAB
from conftest import write_beir
from conftest import write_model

pytest.importorskip("sentence_transformers")
pytest.importorskip("datasets")
pytest.importorskip("accelerate")
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
import finetune_peer  # noqa: E402  (benchmarks/finetune_peer.py)


@pytest.mark.parametrize("distinct", [False, True])
def test_tiny_run_prints_project_peer_and_ratio(tmp_path, capsys, distinct):
  folder = write_beir(str(tmp_path / "beir"), num_docs=200 if distinct else 30,
                      num_queries=24, seed=1)
  if distinct:  # query qI judges doc dI alone: no doc is relevant to two queries, and no
    # hard negative of the first batch at seed 2 is a positive of it (checked below)
    for split, queries in (("train", range(12)), ("test", range(12, 24))):
      with open(os.path.join(folder, "qrels", f"{split}.tsv"), "w", encoding="utf-8") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        f.writelines(f"q{i}\td{i}\t1\n" for i in queries)
  model = write_model(str(tmp_path / "bert"), "bert", seed=2, words=TINY_VOCAB[5:])
  args = ["--collection", folder, "--model", model, "--steps", "3", "--batch_size", "8",
          "--max_length", "16", "--hard_depth", "5", "--docs", "0", "--warmup", "1",
          "--lr", "1e-3", "--cache_dir", str(tmp_path / "cache"),
          "--seed", "2" if distinct else "0"]
  out = finetune_peer.main(args)
  assert capsys.readouterr().out.strip().endswith("}")
  work = finetune_peer.prepare(finetune_peer.parse(args))
  assert len(work.triplets) == 3 * 8 and out["docs_ranked"] == (200 if distinct else 30)
  assert all(p != n for _, p, n in work.triplets)  # the hard negative is not the positive
  run = out["cpu"]
  assert set(run) == {"project", "peer", "ratio"}
  common = {"metrics", "seconds", "examples_per_s", "device", "first_loss"}
  assert set(run["peer"]) == common
  assert set(run["project"]) == common | {"compiled_shapes", "compile_seconds", "tokens_per_step",
                                         "padding_free"}
  assert run["project"]["padding_free"] and run["project"]["compiled_shapes"] >= 1
  assert run["project"]["compile_seconds"] > 0
  # every packed token is a real one, or one of the few rows rounding T up (`packed_rows`)
  tokens = run["project"]["tokens_per_step"]
  assert 0 < tokens["project"] <= 1.125 * tokens["peer"] + 32
  for side in ("project", "peer"):
    assert set(run[side]["metrics"]) == set(finetune_peer.MEASURES)
    assert 0.0 <= run[side]["metrics"]["ndcg@10"] <= 1.0 and run[side]["examples_per_s"] > 0
  assert run["peer"]["device"].startswith("torch") and "threads" in run["peer"]["device"]
  assert run["ratio"]["examples_per_s"] == pytest.approx(
      run["project"]["examples_per_s"] / run["peer"]["examples_per_s"])
  # Step 1: the same weights on the same batch. The project leaves out of a query's negatives
  # the docs judged relevant to it (MNRL does not): equal losses when the batch has none, else
  # the project's is lower (fewer terms in each softmax's denominator).
  b = finetune_peer.batches.BatchSampler(work.data.trainset, 8, 1, 0, True,
                                        2 if distinct else 0).batch(0)
  off_diagonal = ~np.eye(8, b.mask.shape[1], dtype=bool)
  masked = bool(np.any(~b.mask & off_diagonal))
  assert masked == (not distinct)  # both cases are met
  first = run["project"]["first_loss"], run["peer"]["first_loss"]
  if masked:
    assert first[0] < first[1] - 1e-4
  else:
    assert first[0] == pytest.approx(first[1], abs=1.5e-4)  # the peer logs 4 decimals
  # the same recipe from the same start: after 3 small steps both rank alike
  assert abs(run["ratio"]["ndcg@10_diff"]) < 0.2
  assert np.isfinite(run["ratio"]["ndcg@10_diff"])
