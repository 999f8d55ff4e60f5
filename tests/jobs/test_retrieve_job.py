"""The retrieve job: a saved train_eval model through a DocIndex gives the train_eval run.

Subprocesses (each pays the jax import and the encoder load): one train_eval, one two-process
(distributed, sharded) retrieve reusing the index, one bad model_dir. The rest runs in-process.
"""
import json
import os
import subprocess

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bilinear_ir import main
from bilinear_ir.errors import InputError
from bilinear_ir.eval import trec
from bilinear_ir.retrieval import index as index_lib
from bilinear_ir.export import saved_model
from bilinear_ir.jobs import retrieve as job
from bilinear_ir.retrieval import serving
from bilinear_ir.retrieval import sharded
from conftest import MainRunner, free_port, get_config, write_beir

K = 50  # = train_eval's eval.depth below: both runs hold the same 50 of the 60 docs


def _data(beir, cache, *extra):
  return ["--config.data.format=beir", f"--config.data.path={beir}",
          f"--config.encoder.cache_dir={cache}", *extra]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_bert_dir):
  """A train_eval run (low-rank residual scorer) on a tiny BEIR folder: (root, beir, cache)."""
  root = tmp_path_factory.mktemp("retrieve")
  beir = write_beir(str(root / "beir"), num_docs=60, num_queries=48, seed=5)
  cache = root / "cache"
  MainRunner()("configs/train_eval.py:scorer=lowrank,rank=4,residual=identity", root / "train",
               *_data(beir, cache, f"--config.encoder.model={tiny_bert_dir}",
                      "--config.encoder.max_length=32", "--config.train.batch_size=8",
                      "--config.train.steps=20", "--config.train.eval_every=10",
                      f"--config.eval.depth={K}")).results()
  return root, beir, cache


def _config(beir, cache, bert, **fields):
  """configs/retrieve.py over the BEIR folder; `bert` None leaves the encoder to the model."""
  c = get_config("retrieve")
  c.data.format, c.data.path = "beir", str(beir)
  c.encoder.cache_dir = str(cache)
  if bert is not None:
    c.encoder.model, c.encoder.max_length = bert, 32
  for key, value in fields.items():
    c[key] = value
  return c


def _same_runs(got, want):
  assert set(got) == set(want)
  for qid in want:
    g, w = trec.rank_order(got[qid], qid), trec.rank_order(want[qid], qid)
    assert g[0] == w[0], qid
    np.testing.assert_allclose(g[1], w[1], rtol=1e-5, atol=1e-6)


def _mtimes(folder):
  return {name: os.stat(os.path.join(folder, name)).st_mtime_ns for name in os.listdir(folder)}


def test_retrieve_equals_train_eval_then_two_processes_reuse_the_index(trained, run_main):
  root, beir, cache = trained
  train = json.loads((root / "train" / "results.json").read_text())
  want = trec.read_run(str(root / "train" / "run.trec"))
  # In-process through main.run (what main does after parsing flags). The encoder comes from
  # the model's meta: only max_length is repeated here, with the trained value.
  arg = f"model_dir={root / 'train' / 'model'},k={K}"
  c = _config(beir, cache, None, shard_docs=16)
  c.model_dir, c.k, c.encoder.max_length = str(root / "train" / "model"), K, 32
  w1 = root / "r1"
  main.run(c, str(w1))
  res = json.loads((w1 / "results.json").read_text())
  _same_runs(trec.read_run(str(w1 / "run.trec")), want)
  for m, v in train["metrics"].items():
    assert res["metrics"][m] == pytest.approx(v, abs=1e-9)
  assert (res["mode"], res["queries"], res["k"]) == ("full", 24, K)
  assert res["index"]["reused"] is False and res["index"]["shards"] == 4  # 60 docs / 16
  assert res["index"]["scorer"] == "lowrank" and res["index"]["num_docs"] == 60

  # Two processes (launched as SLURM would; main calls jax.distributed.initialize()), two
  # devices each: each scans its half of the index sharded over its devices; the index is reused.
  index_dir = w1 / "index"
  before = _mtimes(index_dir)
  w2 = root / "r2"
  port = free_port()
  procs = []
  for i in range(2):
    env = dict(JAX_COORDINATOR_ADDRESS=f"localhost:{port}", SLURM_JOB_ID="1",
               SLURM_STEP_NODELIST="localhost", SLURM_NTASKS="2", SLURM_PROCID=str(i),
               SLURM_LOCALID=str(i))
    procs.append(run_main.popen(
        f"configs/retrieve.py:{arg}", w2, *_data(beir, cache, f"--config.index_dir={index_dir}",
                                                 "--config.distributed=True",
                                                 "--config.sharded=True",
                                                 "--config.query_batch=10",
                                                 "--config.rebuild=False"),
        devices=2, env=env))
  logs = []
  for p in procs:
    try:
      logs.append(p.communicate(timeout=300)[0])
    except subprocess.TimeoutExpired:
      for other in procs:
        other.kill()
      raise
  assert all(p.returncode == 0 for p in procs), "\n".join(logs)[-3000:]
  res2 = json.loads((w2 / "results.json").read_text())
  assert res2["index"]["reused"] is True
  assert res2["search"] == {"sharded": True, "processes": 2, "local_devices": 2}
  assert res2["metrics"] == pytest.approx(res["metrics"], abs=1e-9)
  _same_runs(trec.read_run(str(w2 / "run.trec")), want)
  assert _mtimes(index_dir) == before


def test_bad_model_dir_exits_2_without_results(trained, run_main):
  root, beir, cache = trained
  # The train_eval workdir itself is not a model folder (its model is in WORKDIR/model).
  run_main(f"configs/retrieve.py:model_dir={root / 'train'}", root / "bad",
           *_data(beir, cache)).one_error_line("config.json")


def test_dot_product_mode_equals_numpy_brute_force(trained, tiny_bert_dir, tmp_path):
  from bilinear_ir.data import embeddings, loaders  # pylint: disable=g-import-not-at-top
  root, beir, cache = trained
  coll = loaders.load(ml_collections.ConfigDict({"format": "beir", "path": str(beir)}))
  enc = saved_model.resolve_encoder(_config(beir, cache, tiny_bert_dir).encoder, None)
  emb = embeddings.embed_collection(coll, enc)
  k = 20

  def check(report, q, d):
    path = tmp_path / "run.trec"
    path.write_text(report.extra_files["run.trec"])
    run = trec.read_run(str(path))
    s = q.astype(np.float64) @ d.astype(np.float64).T
    ids = np.lexsort((np.broadcast_to(np.arange(len(d)), s.shape), -s), axis=1)[:, :k]
    assert sorted(run) == emb.query_ids  # data.split "": every query, no metrics
    for row, qid in enumerate(emb.query_ids):
      docs, scores = trec.rank_order(run[qid], qid)
      assert docs == [emb.doc_ids[i] for i in ids[row]]
      np.testing.assert_allclose(scores, s[row, ids[row]], rtol=1e-5, atol=1e-6)
    assert "metrics" not in report.results and report.results["queries"] == 48

  index_dir = str(tmp_path / "index")
  c = _config(beir, cache, tiny_bert_dir, model_dir="", k=k, index_dir=index_dir, shard_docs=7)
  c.data.split = ""
  rep = job.run(c, str(tmp_path))
  assert rep.results["scorer"] == "dot" and rep.results["index"]["shards"] == 9
  check(rep, emb.queries, emb.docs)

  # bf16 rows, sharded over the 8 test devices: a dtype change rebuilds the index; the scores
  # are those of bf16-rounded tables (float32 accumulation).
  c.dtype, c.sharded = "bfloat16", True
  rep = job.run(c, str(tmp_path))
  assert rep.results["index"]["reused"] is False and rep.results["index"]["dtype"] == "bfloat16"
  assert rep.results["search"]["local_devices"] == 8
  bf16 = lambda a: np.asarray(a, jnp.bfloat16).astype(np.float32)
  check(rep, bf16(emb.queries), bf16(emb.docs))

  # rebuild=False refuses an index built otherwise (dtype; then another scorer), names why.
  c.dtype, c.rebuild = "float32", False
  with pytest.raises(InputError, match="dtype"):
    job.run(c, str(tmp_path))
  c.dtype, c.model_dir = "bfloat16", str(root / "train" / "model")
  c.encoder.model, c.encoder.max_length = None, None
  with pytest.raises(InputError, match="scorer"):
    job.run(c, str(tmp_path))
  # An unreadable manifest: an error without rebuild, rebuilt over with it.
  c.model_dir, c.encoder.model, c.encoder.max_length = "", tiny_bert_dir, 32
  (tmp_path / "index" / "manifest.json").write_text("{not json")
  with pytest.raises(InputError, match="not valid JSON"):
    job.run(c, str(tmp_path))
  c.rebuild = True
  rep = job.run(c, str(tmp_path))
  assert rep.results["index"]["reused"] is False
  check(rep, bf16(emb.queries), bf16(emb.docs))


def test_encoder_comes_from_the_model_and_a_mismatch_is_an_error(trained, tiny_bert_dir):
  root, beir, cache = trained
  meta = {"embedding": {"kind": "flax", "model": tiny_bert_dir, "pooling": "mean",
                        "normalize": True, "max_length": 32, "query_prompt": "",
                        "doc_prompt": ""}}
  cfg = _config(beir, cache, tiny_bert_dir).encoder
  cfg.model, cfg.max_length, cfg.batch_size = None, 32, 16
  out = saved_model.resolve_encoder(cfg, meta)
  assert (out.model, out.pooling, out.normalize, out.max_length) == (tiny_bert_dir, "mean", True,
                                                                     32)
  assert (out.batch_size, out.cache_dir) == (16, str(cache))  # no effect on the numbers: config's
  cfg.pooling = "cls"
  with pytest.raises(InputError, match="encoder.pooling"):
    saved_model.resolve_encoder(cfg, meta)
  cfg.pooling = None
  assert saved_model.resolve_encoder(cfg, None).model == ""  # no model: encoder_config() defaults
  # Through the job: the trained model's encoder is the tiny BERT with mean pooling.
  c = _config(beir, cache, tiny_bert_dir, model_dir=str(root / "train" / "model"))
  c.encoder.pooling = "cls"
  with pytest.raises(InputError, match="encoder.pooling"):
    job.run(c, str(root / "never"))
  assert not os.path.exists(root / "never")


def test_local_rows_tile_the_table_across_shard_boundaries(tmp_path):
  table = np.random.default_rng(0).normal(size=(30, 4)).astype(np.float32)
  index = index_lib.DocIndex.build(str(tmp_path), None, {}, table, shard_docs=7)
  for p in (1, 3, 4, 32):  # 32 processes > 30 docs: some processes hold no rows
    parts = [serving.local_rows(index, *sharded.process_rows(30, i, p)) for i in range(p)]
    assert all(part.shape[1] == 4 for part in parts)
    np.testing.assert_array_equal(np.concatenate(parts), table)
