"""Precomputed embeddings in (`encoder.kind = "precomputed"`) and out (the `embed` job)."""
import json
import os
import pickle
import shutil
import subprocess
import sys

import numpy as np
import pytest

from bilinear_ir.config import blocks
from bilinear_ir.data import loaders
from bilinear_ir.data import pipeline
from bilinear_ir.data import precomputed
from bilinear_ir.errors import InputError
from conftest import REPO
from conftest import main_env
from conftest import write_beir
from conftest import write_model

DIM = 6


@pytest.fixture(scope="module")
def beir(tmp_path_factory):
  return write_beir(str(tmp_path_factory.mktemp("beir")), num_docs=30, num_queries=12)


@pytest.fixture(scope="module")
def collection(beir):
  c = blocks.data_config()
  c.format, c.path = "beir", beir
  return loaders.load(c)


def _write(folder, doc_ids, docs, query_ids, queries):
  os.makedirs(folder, exist_ok=True)
  np.save(os.path.join(folder, "corpus.npy"), docs)
  np.save(os.path.join(folder, "queries.npy"), queries)
  with open(os.path.join(folder, "corpus_ids.txt"), "w", encoding="utf-8") as f:
    f.write("".join(f"{i}\n" for i in doc_ids))
  with open(os.path.join(folder, "queries_ids.txt"), "w", encoding="utf-8") as f:
    f.write("".join(f"{i}\n" for i in query_ids))
  return folder


@pytest.fixture(scope="module")
def shuffled(collection, tmp_path_factory):
  """A valid folder whose rows come in a random order, and the vectors by id."""
  rng = np.random.default_rng(0)
  doc_ids, query_ids = list(collection.doc_ids), sorted(collection.queries)
  docs = {d: rng.normal(size=DIM).astype(np.float32) for d in doc_ids}
  queries = {q: rng.normal(size=DIM).astype(np.float32) for q in query_ids}
  d_order, q_order = rng.permutation(doc_ids), rng.permutation(query_ids)
  folder = _write(str(tmp_path_factory.mktemp("pre") / "ok"), d_order,
                  np.stack([docs[d] for d in d_order]), q_order,
                  np.stack([queries[q] for q in q_order]))
  return folder, docs, queries


def test_rows_any_order_come_back_in_collection_order(collection, shuffled):
  folder, docs, queries = shuffled
  emb = precomputed.load(folder, collection, normalize=False)
  assert emb.doc_ids == list(collection.doc_ids)
  assert emb.query_ids == sorted(collection.queries)
  np.testing.assert_array_equal(emb.docs, np.stack([docs[d] for d in emb.doc_ids]))
  np.testing.assert_array_equal(emb.queries, np.stack([queries[q] for q in emb.query_ids]))


def test_normalize_applies_on_top_and_keeps_unit_rows_as_they_are(collection, shuffled,
                                                                   tmp_path):
  folder, _, _ = shuffled
  emb = precomputed.load(folder, collection, normalize=True)
  np.testing.assert_allclose(np.linalg.norm(emb.docs, axis=1), 1.0, rtol=1e-6)
  unit = str(tmp_path / "unit")
  precomputed.write(unit, emb, {"normalize": True})
  again = precomputed.load(unit, collection, normalize=True)
  np.testing.assert_array_equal(again.docs, emb.docs)  # bitwise: not divided by ~1 again
  np.testing.assert_array_equal(again.queries, emb.queries)


def test_float16_rows_are_read_as_float32(collection, shuffled, tmp_path):
  folder, _, _ = shuffled
  half = str(tmp_path / "half")
  shutil.copytree(folder, half)
  np.save(os.path.join(half, "corpus.npy"),
          np.load(os.path.join(folder, "corpus.npy")).astype(np.float16))
  emb = precomputed.load(half, collection, normalize=False)
  assert emb.docs.dtype == np.float32
  ref = precomputed.load(folder, collection, normalize=False).docs
  np.testing.assert_allclose(emb.docs, ref, rtol=1e-3, atol=1e-3)


def test_pipeline_embed_dispatches_on_kind(collection, shuffled):
  folder, _, _ = shuffled
  enc = blocks.encoder_config()
  enc.kind, enc.path, enc.normalize = "precomputed", folder, False
  emb = pipeline.embed(collection, enc)
  assert emb.docs.shape == (collection.num_docs, DIM) and emb.manifest["kind"] == "precomputed"


def test_write_then_load_round_trips_with_manifest(collection, shuffled, tmp_path):
  folder, _, _ = shuffled
  emb = precomputed.load(folder, collection, normalize=False)
  out = str(tmp_path / "out")
  precomputed.write(out, emb, {"encoder": "x"})
  assert sorted(os.listdir(out)) == ["corpus.npy", "corpus_ids.txt", "manifest.json",
                                     "queries.npy", "queries_ids.txt"]
  with open(os.path.join(out, "manifest.json"), encoding="utf-8") as f:
    assert json.load(f) == {"encoder": "x"}
  back = precomputed.load(out, collection, normalize=False)
  np.testing.assert_array_equal(back.docs, emb.docs)


# ---------------------------------------------------------------------------------------------
# Malformed inputs, each through `python -m bilinear_ir.main` (train_eval on the collection).


def _corrupt(name, folder, collection):
  """Applies corruption `name` to a copy of a valid folder; returns the file the error names."""
  p = lambda f: os.path.join(folder, f)
  d = np.load(p("corpus.npy"))
  ids = open(p("corpus_ids.txt"), encoding="utf-8").read().split("\n")[:-1]
  write_ids = lambda lines: open(p("corpus_ids.txt"), "w", encoding="utf-8").write(
      "".join(f"{x}\n" for x in lines))
  if name == "missing_id":
    np.save(p("corpus.npy"), d[1:])
    write_ids(ids[1:])
    return "corpus_ids.txt"
  if name == "unknown_id":
    write_ids(ids[:-1] + ["no_such_doc"])
    return "corpus_ids.txt"
  if name == "duplicate_id":
    write_ids(ids[:-1] + [ids[0]])
    return "corpus_ids.txt"
  if name == "row_count":
    np.save(p("corpus.npy"), d[:-1])
    return "corpus_ids.txt"
  if name == "width":
    q = np.load(p("queries.npy"))
    np.save(p("queries.npy"), q[:, :-1])
    return "queries.npy"
  if name == "nan":
    d[3, 1] = np.nan
    np.save(p("corpus.npy"), d)
    return "corpus.npy"
  if name == "inf":
    d[0, 0] = np.inf
    np.save(p("corpus.npy"), d)
    return "corpus.npy"
  if name == "integer":
    np.save(p("corpus.npy"), d.astype(np.int32))
    return "corpus.npy"
  if name == "object":
    np.save(p("corpus.npy"), np.array([list(r) for r in d] + [["x"]], dtype=object),
            allow_pickle=True)
    return "corpus.npy"
  if name == "pickled":
    with open(p("queries.npy"), "wb") as f:
      pickle.dump({"not": "an array"}, f)
    return "queries.npy"
  if name == "missing_file":
    os.remove(p("queries_ids.txt"))
    return "queries_ids.txt"
  raise ValueError(name)


CASES = ("missing_id", "unknown_id", "duplicate_id", "row_count", "width", "nan", "inf",
         "integer", "object", "pickled", "missing_file")


@pytest.fixture(scope="module")
def outcomes(collection, shuffled, beir, tmp_path_factory):
  root = tmp_path_factory.mktemp("bad")
  folder, _, _ = shuffled
  procs = {}
  for name in CASES:
    bad = str(root / name)
    shutil.copytree(folder, bad)
    named = _corrupt(name, bad, collection)
    work = str(root / f"work_{name}")
    procs[name] = (subprocess.Popen(
        [sys.executable, "-m", "bilinear_ir.main", "--config=configs/train_eval.py",
         "--config.data.format=beir", f"--config.data.path={beir}",
         "--config.encoder.kind=precomputed", f"--config.encoder.path={bad}",
         "--config.train.steps=2", f"--workdir={work}"], cwd=REPO,
        env=main_env(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True), named, work)
  out = {}
  for name, (proc, named, work) in procs.items():
    stdout, stderr = proc.communicate(timeout=600)
    out[name] = (proc.returncode, stdout, stderr, named, work)
  return out


@pytest.mark.parametrize("name", CASES)
def test_malformed_precomputed_input_exits_2_naming_the_file(outcomes, name):
  code, stdout, stderr, named, work = outcomes[name]
  lines = [line for line in stderr.splitlines() if line.strip()]
  assert code == 2, stderr
  assert len(lines) == 1 and lines[0].startswith("error: "), stderr
  assert named in lines[0], lines[0]
  assert "Traceback" not in stdout + stderr
  assert not os.path.exists(work) or not os.listdir(work), os.listdir(work)


def test_nan_error_names_row_and_id(outcomes):
  line = outcomes["nan"][2].strip()
  assert "row 3" in line and "NaN or Inf" in line and "doc id '" in line


def test_precomputed_errors_in_process(collection, shuffled, tmp_path):
  folder, _, _ = shuffled
  bad = str(tmp_path / "dup")
  shutil.copytree(folder, bad)
  _corrupt("duplicate_id", bad, collection)
  with pytest.raises(InputError, match="duplicate doc id"):
    precomputed.load(bad, collection, normalize=False)
  with pytest.raises(InputError, match="no such folder"):
    precomputed.load(str(tmp_path / "nowhere"), collection, normalize=False)


def test_embed_then_precomputed_trains_to_the_same_numbers(beir, tmp_path):
  """configs/embed.py writes the collection's embeddings; train_eval on them equals train_eval
  on the encoder itself, metric for metric."""
  model = write_model(str(tmp_path / "bert"), "bert", seed=1)
  enc = [f"--config.encoder.model={model}", f"--config.encoder.cache_dir={tmp_path / 'cache'}",
         "--config.encoder.max_length=24"]
  data = ["--config.data.format=beir", f"--config.data.path={beir}"]
  train = ["--config.train.steps=10", "--config.train.eval_every=5",
           "--config.train.batch_size=4"]
  env = main_env()
  run = lambda *args: subprocess.run([sys.executable, "-m", "bilinear_ir.main", *args], cwd=REPO,
                                     env=env, capture_output=True, text=True, timeout=600)
  out = run("--config=configs/embed.py:pooling=mean", *enc, *data, f"--workdir={tmp_path / 'e'}")
  assert out.returncode == 0, out.stderr[-2000:]
  folder = tmp_path / "e" / "embeddings"
  manifest = json.loads((folder / "manifest.json").read_text())
  assert manifest["pooling"] == "mean" and manifest["normalize"] is True
  assert manifest["max_length"] == 24 and manifest["collection"]["docs"] == 30
  direct = run("--config=configs/train_eval.py:scorer=bilinear,pooling=mean", *enc, *data,
               *train, f"--workdir={tmp_path / 'direct'}")
  pre = run("--config=configs/train_eval.py:scorer=bilinear,pooling=mean", *data, *train,
            "--config.encoder.kind=precomputed", f"--config.encoder.path={folder}",
            f"--workdir={tmp_path / 'pre'}")
  assert direct.returncode == 0 and pre.returncode == 0, direct.stderr[-1000:] + pre.stderr[-1000:]
  a = json.loads((tmp_path / "direct" / "results.json").read_text())
  b = json.loads((tmp_path / "pre" / "results.json").read_text())
  assert a["metrics"] == b["metrics"] and a["dev"] == b["dev"] and a["history"] == b["history"]
