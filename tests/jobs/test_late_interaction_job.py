"""The late_interaction job: candidates, distillation in the trainer, the job through main."""
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bilinear_ir import scorers
from bilinear_ir.config import blocks
from bilinear_ir.data.batches import TrainSet
from bilinear_ir.errors import InputError
from bilinear_ir.jobs import late_interaction as job
from bilinear_ir.report import late_interaction as job_report
from bilinear_ir.retrieval import candidates
from bilinear_ir.train import trainer
from conftest import REPO, main_env, write_beir


# ---------------------------------------------------------------------------------------------
# Candidates: BM25 top-n + random, judged docs never added.


def test_candidates_are_bm25_top_plus_distinct_random_docs():
  rng = np.random.default_rng(0)
  n_docs, depth, extra = 300, 20, 30
  bm25 = np.stack([rng.permutation(n_docs)[:50] for _ in range(12)])
  rows = np.array([3, 7, 0, 11])
  c = candidates.rerank_candidates(bm25, rows, n_docs, depth, extra, seed=5)
  assert c.shape == (4, depth + extra)
  for i, r in enumerate(rows):
    np.testing.assert_array_equal(c[i, :depth], bm25[r, :depth])  # BM25 order kept
    drawn = c[i, depth:]
    assert len(set(drawn)) == extra and not set(drawn) & set(bm25[r, :depth])
    assert np.all(np.diff(drawn) > 0) and drawn.min() >= 0 and drawn.max() < n_docs
  # A query's candidates do not depend on the other queries asked for; the seed changes them.
  np.testing.assert_array_equal(
      candidates.rerank_candidates(bm25, rows[1:2], n_docs, depth, extra, 5), c[1:2])
  reseeded = candidates.rerank_candidates(bm25, rows, n_docs, depth, extra, 6)
  assert not np.array_equal(reseeded[:, depth:], c[:, depth:])
  # The random part is uniform over the docs outside the BM25 list (numpy twin of the draw).
  rest = np.setdiff1d(np.arange(n_docs), bm25[7, :depth])
  twin = np.sort(np.random.default_rng([5, 7, 7]).choice(rest, size=extra, replace=False))
  np.testing.assert_array_equal(c[1, depth:], twin)


def test_small_corpus_pads_and_positives_are_not_injected():
  bm25 = np.array([[4, 2, 0, 1, 3, 5]])
  c = candidates.rerank_candidates(bm25, np.array([0]), num_docs=6, bm25_depth=2, random_docs=10,
                            seed=0)
  np.testing.assert_array_equal(c[0, :2], [4, 2])
  assert sorted(c[0, 2:6]) == [0, 1, 3, 5] and np.all(c[0, 6:] == -1)
  # A judged doc outside the BM25 top-n is a candidate only if the random draw hits it.
  bm25 = np.tile(np.arange(100), (1, 1))
  c = candidates.rerank_candidates(bm25, np.array([0]), num_docs=1000, bm25_depth=10, random_docs=5,
                            seed=1)
  doc_ids = [f"d{i}" for i in range(1000)]
  missing = next(d for d in range(10, 1000) if d not in c[0])
  qrels = {"q": {"d3": 1, f"d{missing}": 1, "d7": 0}}
  assert candidates.candidate_recall(c, ["q"], doc_ids, qrels) == pytest.approx(0.5)


# ---------------------------------------------------------------------------------------------
# Distillation losses inside the trainer.


def _batch(rng, n_q=6, n_docs=20, dim=5, b=4, m=2):
  q = rng.normal(size=(n_q, dim)).astype(np.float32)
  d = rng.normal(size=(n_docs, dim)).astype(np.float32)
  teacher = rng.normal(size=(n_q, n_docs)).astype(np.float32) * 3
  q_rows = rng.choice(n_q, b, replace=False).astype(np.int32)
  cand = rng.integers(0, n_docs, b * (1 + m)).astype(np.int32)
  mask = rng.random((b, b * (1 + m))) > 0.2
  mask[np.arange(b), np.arange(b)] = True
  return q, d, teacher, q_rows, cand, mask


def _np_kl(s, t, mask, temp, t_temp):
  out = []
  for srow, trow, mrow in zip(s, t, mask):
    ls = srow[mrow] / temp
    lt = trow[mrow] / t_temp
    ps = np.exp(ls - ls.max()) / np.exp(ls - ls.max()).sum()
    pt = np.exp(lt - lt.max()) / np.exp(lt - lt.max()).sum()
    out.append(np.sum(pt * (np.log(pt) - np.log(ps))))
  return np.mean(out)


def _np_margin_mse(s, t, mask, t_temp):
  t = t / t_temp
  out = []
  for i in range(s.shape[0]):
    neg = mask[i] & (np.arange(s.shape[1]) != i)
    out.append(np.sum(((t[i, i] - t[i, neg]) - (s[i, i] - s[i, neg])) ** 2))
  return np.mean(out)


@pytest.mark.parametrize("loss", ["kl", "margin_mse"])
def test_trainer_distillation_loss_equals_numpy(loss):
  rng = np.random.default_rng(1)
  q, d, teacher, q_rows, cand, mask = _batch(rng)
  module = scorers.build("wdp", dim=q.shape[1])
  params = {"v": jnp.asarray(rng.uniform(0.5, 1.5, q.shape[1]), jnp.float32)}
  hp = trainer.StepConfig(loss=loss, temperature=0.7, margin=1.0, batch_size=4, negatives=2,
                          l2_to_init=0.0, lr=1e-3, warmup_steps=1, total_steps=10,
                          end_lr_fraction=0.1, weight_decay=0.0, clip_norm=1.0,
                          teacher_temperature=2.5)
  state = {"params": params, "opt_state": trainer.make_optimizer(hp, 10).init(params),
           "step": jnp.zeros((), jnp.int32)}
  t = teacher[q_rows][:, cand]  # the batch's teacher scores [B, C]
  _, stats = trainer.train_steps(jax.tree.map(jnp.copy, state), params, q, d, q_rows[None],
                                 cand[None], mask[None], t[None], module=module, hp=hp)
  s = (q[q_rows] * np.asarray(params["v"])) @ d[cand].T  # WDP scores [B, C]
  want = (_np_kl(s, t, mask, 0.7, 2.5) if loss == "kl" else _np_margin_mse(s, t, mask, 2.5))
  assert float(stats["loss"][0]) == pytest.approx(want, rel=1e-4)


def test_distillation_pulls_the_student_toward_the_teacher():
  """A bilinear student distilled from a planted bilinear teacher learns its argmax."""
  rng = np.random.default_rng(0)
  n, n_docs, n_q = 8, 120, 300
  w = np.eye(n) + rng.normal(size=(n, n))
  docs = rng.normal(size=(n_docs, n)).astype(np.float32)
  qs = rng.normal(size=(n_q, n)).astype(np.float32)
  teacher = (qs @ w @ docs.T).astype(np.float32)
  best = teacher.argmax(1)
  module = scorers.build("bilinear", dim=n)
  params = scorers.init_params(module, jax.random.key(0))
  acc = lambda p: float(np.mean(np.asarray(module.apply(
      {"params": p}, qs[250:], docs, method=module.score_all)).argmax(1) == best[250:]))
  ts = TrainSet(np.stack([np.arange(250), best[:250]], 1), 250, n_docs)
  cfg = blocks.train_config()
  cfg.loss, cfg.steps, cfg.batch_size, cfg.lr = "margin_mse", 300, 32, 3e-2
  cfg.hard_negatives, cfg.random_negatives, cfg.teacher_temperature = 0, 4, float(teacher.std())
  calls = []

  def block(q_rows, cand_rows):  # the teacher sees only each batch's pairs
    calls.append((len(q_rows), len(cand_rows)))
    return teacher[np.asarray(q_rows)][:, np.asarray(cand_rows)]

  res = trainer.fit(module, params, qs[:250], docs, ts, cfg, seed=0, progress=False,
                    teacher=block)
  assert len(calls) == 300 and set(calls) == {(32, 32 * 5)}
  assert acc(params) <= 0.2 and acc(res.params) >= 0.8, (acc(params), acc(res.params))


def test_fit_refuses_missing_or_misshaped_teachers():
  q = np.zeros((8, 3), np.float32)
  d = np.zeros((10, 3), np.float32)
  ts = TrainSet(np.stack([np.arange(8), np.arange(8) + 1], 1), 8, 10)
  module = scorers.build("wdp", dim=3)
  params = scorers.init_params(module, jax.random.key(0))
  cfg = blocks.train_config()
  cfg.steps, cfg.hard_negatives = 1, 0
  wrong_shape = lambda q_rows, cand_rows: np.zeros((len(q_rows), len(cand_rows) + 1))
  right_shape = lambda q_rows, cand_rows: np.zeros((len(q_rows), len(cand_rows)))
  for loss, teacher, field in (("kl", None, "train.loss"),
                               ("margin_mse", np.zeros((8, 10)), "teacher"),
                               ("margin_mse", wrong_shape, "teacher"),
                               ("softmax", right_shape, "train.loss")):
    cfg.loss = loss
    with pytest.raises(InputError, match=field):
      trainer.fit(module, params, q, d, ts, cfg, 0, progress=False, teacher=teacher)


# ---------------------------------------------------------------------------------------------
# The job end to end through main.


def _config():
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location(
      "late_interaction_config", os.path.join(REPO, "configs", "late_interaction.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


@pytest.mark.parametrize("field,value", [("rows", ("dot", "nope")), ("distill.teacher", "ce"),
                                         ("distill.losses", ("softmax",)),
                                         ("models.lite.m1", 0), ("rerank.bm25_depth", 0),
                                         ("collection", "no/such/folder"), ("collection", ""),
                                         ("sizes", (300, 0)), ("rows", ("dot", "lite")),
                                         ("models.colbert.token_dim", 8)])
def test_bad_config_is_an_input_error_before_any_data_is_read(field, value):
  config = _config()
  *path, last = field.split(".")
  node = config
  for p in path:
    node = node[p]
  node[last] = value
  with pytest.raises(InputError):
    job.validate(config)
  job.validate(_config())


@pytest.mark.parametrize("arg,field", [("sizes=300+x", "'sizes'"),
                                       ("collection=no/such/folder", "'collection'")])
def test_bad_arguments_exit_2_with_one_line_and_nothing_written(tmp_path, arg, field):
  env = main_env()
  proc = subprocess.run([sys.executable, "-m", "bilinear_ir.main",
                         f"--config=configs/late_interaction.py:{arg}",
                         f"--workdir={tmp_path / 'w'}"], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and field in lines[0] and not (tmp_path / "w").exists()


def test_job_end_to_end_writes_the_documented_rows(tmp_path, tiny_bert_dir):
  beir = write_beir(str(tmp_path / "beir"), num_docs=60, num_queries=48)
  w = tmp_path / "w"
  cmd = [sys.executable, "-m", "bilinear_ir.main", "--config=configs/late_interaction.py",
         f"--workdir={w}", f"--config.collection={beir}",
         "--config.data.dev_fraction=0.25",
         f"--config.encoder.model={tiny_bert_dir}", f"--config.encoder.cache_dir={tmp_path}/c",
         "--config.encoder.max_length=32", "--config.encoder.query_max_length=8",
         "--config.encoder.doc_max_length=16", "--config.rerank.bm25_depth=10",
         "--config.rerank.random_docs=10", "--config.models.lite.m1=4",
         "--config.models.lite.m2=8", "--config.models.lite_flat.width=8",
         "--config.models.mebert.proj_dim=8", "--config.models.colbert_proj.token_dim=8",
         "--config.train.steps=2", "--config.train.eval_every=2", "--config.train.batch_size=8",
         "--config.train.auto_temperature=False", "--config.teacher.train.epochs=1",
         "--config.teacher.train.eval_every=2", "--config.teacher.train.auto_temperature=False",
         "--config.latency.docs=5", "--config.latency.repeats=1", "--config.latency.rounds=2",
         # every documented scorer once (colbert untrained), one distillation loss (compiles
         # dominate this test; the other loss is checked against numpy above)
         "--config.rows=('dot','colbert','mebert','lite','lite_flat','knrm','hybrid')",
         "--config.distill.losses=('kl',)"]
  env = main_env()
  proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  res = json.loads((w / "results.json").read_text())
  by = {}
  n_train = 18  # 24 train queries of the BEIR folder, a quarter carved out for dev
  for r in res["rows"]:
    assert r["mode"] == "rerank" and r["encoder"] == "frozen"
    assert r["collection"] == res["collection"] and r["n_train"] == n_train
    assert set(r["metrics"]) == {"ndcg@10", "mrr@10", "map", "recall@100"}
    assert len(r["per_query"]) == res["test_queries"] == 24
    assert r["metrics"]["ndcg@10"] == pytest.approx(np.mean(list(r["per_query"].values())))
    assert all(0.0 <= v <= 1.0 for v in r["metrics"].values())
    assert isinstance(r["bytes_per_doc"], int) and isinstance(r["ms_1q_100d"], float)
    assert r["ms_1q_100d"] > 0
    by[r["row"]] = r
  assert {r["scorer"] for r in res["rows"]} == {"dot", "colbert", "mebert", "lite", "lite_flat",
                                                 "knrm", "hybrid"}
  # Bytes per doc in float16 (2 bytes): DE one n = 32 vector; ColBERT Td x n; ME-BERT m = 8
  # vectors of width 8; LITE Td x n.
  assert by["dot"]["bytes_per_doc"] == 32 * 2
  assert by["colbert"]["bytes_per_doc"] == 16 * 32 * 2 and not by["colbert"]["trained"]
  assert by["mebert"]["bytes_per_doc"] == 8 * 8 * 2
  assert by["lite"]["bytes_per_doc"] == by["lite_flat"]["bytes_per_doc"] == 16 * 32 * 2
  # Distillation rows of LITE with the teacher chosen on dev.
  assert res["teacher"] in ("bm25", "bilinear")
  t = res["teacher"]
  dev = {k: v["dev"]["ndcg@10"] for k, v in res["teachers"].items()}
  assert dev[t] == max(dev.values())
  assert {(r["loss"], r["teacher"]) for r in res["rows"] if r["scorer"] == "lite"} == {
      ("softmax", None), ("kl", t)}
  hyb = next(r for r in res["rows"] if r["scorer"] == "hybrid")
  assert hyb["dense"] in by and 0.0 <= hyb["lambda"] <= 1.0
  assert res["candidates"]["positives_injected"] is False
  assert res["sizes"] == [n_train]
  # Every trained row, and the bilinear teacher, checkpointed in its own folder (a rerun of the
  # same command resumes them: `training.run_dir`); the untrained ColBERT has none.
  folders = {f.rsplit("-", 1)[0] for f in os.listdir(w / "runs")}
  assert folders == {f"{name}-n{n_train}" for name in ("mebert", "lite", "lite_flat", "knrm",
                                                       f"lite-kl-{t}")} | {"teacher-bilinear"}
  # Every trained token row was selected on dev against the untrained ColBERT: kept (reporting
  # ColBERT's numbers) exactly when its own dev nDCG@10 does not beat ColBERT's.
  col = by["colbert"]
  for r in (r for r in res["rows"] if r["scorer"] != "hybrid" and r["trained"]):
    assert r["kept_colbert"] == (r["model_dev"]["ndcg@10"] <= col["dev"]["ndcg@10"]), r["row"]
    if r["kept_colbert"]:
      assert (r["metrics"], r["per_query"], r["dev"]) == (col["metrics"], col["per_query"],
                                                          col["dev"])
    else:
      assert r["metrics"] == r["model_metrics"] and r["dev"] == r["model_dev"]
  # Paired tests against ColBERT and dot: one Holm family per baseline over every other row.
  for base in ("colbert", "dot"):
    others = [r for r in res["rows"] if r["row"] != base]
    assert all(f"vs_{base}" not in r for r in res["rows"] if r["row"] == base)
    p = sorted(r[f"vs_{base}"]["p_perm"] for r in others)
    for r in others:
      t = r[f"vs_{base}"]
      assert set(t) >= {"diff", "ci95", "p_perm", "p_holm"}
      assert t["diff"] == pytest.approx(np.mean([r["per_query"][q] - by[base]["per_query"][q]
                                                 for q in r["per_query"]]))
      rank = p.index(t["p_perm"])  # Holm: p_holm >= (m - rank) p of the sorted p-values
      assert t["p_holm"] >= min(1.0, (len(p) - rank) * t["p_perm"]) - 1e-12
  assert 0.0 < res["candidates"]["recall"]["test"] <= 1.0
  assert (w / "results.md").read_text().count("| ") > 10


def _tiny_config(tmp_path, tiny_bert_dir):
  """The job on a 60-doc BEIR folder (48 queries, a quarter of train carved out for dev) and a
  tiny BERT, its trained rows at 2 steps, 10 BM25 + 10 random candidates."""
  c = _config()
  c.collection = write_beir(str(tmp_path / "beir"), num_docs=60, num_queries=48)
  c.data.dev_fraction = 0.25
  c.encoder.model, c.encoder.cache_dir = tiny_bert_dir, str(tmp_path / "c")
  c.encoder.max_length, c.encoder.query_max_length, c.encoder.doc_max_length = 32, 8, 16
  c.rerank.bm25_depth = c.rerank.random_docs = 10
  c.models.lite.m1, c.models.lite.m2 = 4, 8
  c.train.steps = c.train.eval_every = 2
  c.train.batch_size = 8
  c.latency.docs, c.latency.repeats, c.latency.rounds = 5, 1, 1
  return c


def test_the_bm25_row_ranks_the_candidates_by_their_exact_bm25_scores(tmp_path, tiny_bert_dir):
  """The "bm25" row, the first stage itself as a row of the table: each query's candidates in
  the order of their exact BM25 scores, so its top scores are the full-corpus BM25 top list's
  (the candidates hold it); its timed call scores the first test query's latency docs; it
  stores BM25's sparse vectors, which the hybrid adds to its dense row's."""
  # pylint: disable=g-import-not-at-top
  from bilinear_ir.experiment import spec as spec_lib
  from bilinear_ir.studies.late_interaction import latency
  from bilinear_ir.studies.late_interaction import setting as setting_lib
  from bilinear_ir.studies.late_interaction import teachers
  # pylint: enable=g-import-not-at-top
  c = _tiny_config(tmp_path, tiny_bert_dir)
  c.rows, c.distill.scorers = ("dot", "colbert", "bm25", "hybrid"), ()
  setting = setting_lib.build_setting(c, spec_lib.collection_block(c.data, c.collection))
  prepared, depth = setting.prepared, c.rerank.bm25_depth
  docs = latency.latency_inputs(setting, c.latency.docs)[4]
  scored = teachers.bm25_scored(setting, docs)
  for split in ("dev", "test"):
    idx, scores = scored.run[split]
    rows = setting.rows[split]
    assert np.all(np.diff(scores, axis=1) <= 0)
    exact = prepared.bm25_pair_scores(np.repeat(rows, idx.shape[1]), np.maximum(idx, 0).ravel())
    np.testing.assert_allclose(scores, exact.reshape(idx.shape), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(scores[:, :depth], prepared.bm25_scores[rows][:, :depth],
                               rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(scored.latency_fn(), prepared.bm25_pair_scores(
      np.repeat(setting.rows["test"][:1], len(docs)), docs))
  job.validate(c)
  res = job.run(c, str(tmp_path / "w")).results
  by = {r["row"]: r for r in res["rows"]}
  bm25 = by["bm25"]
  assert bm25["metrics"] == scored.test["mean"] == res["teachers"]["bm25"]["metrics"]
  assert bm25["scorer"] == "bm25" and not bm25["trained"] and bm25["stored"] is None
  assert bm25["bytes_per_doc"] == round(prepared.bm25.doc_vectors.nnz / 60 * 8) > 0
  assert bm25["vs_dot"]["diff"] == pytest.approx(np.mean(
      [bm25["per_query"][q] - by["dot"]["per_query"][q] for q in bm25["per_query"]]))
  hybrid = next(r for r in res["rows"] if r["scorer"] == "hybrid")
  assert hybrid["dense"] in ("dot", "colbert")
  assert hybrid["bytes_per_doc"] == by[hybrid["dense"]]["bytes_per_doc"] + bm25["bytes_per_doc"]
  assert bm25["ms_1q_100d"] > 0


def test_table_row_at_w_equal_identity_is_the_dot_row_and_a_baseline(tmp_path, tiny_bert_dir):
  """The "table" row: full W trained at lr 1e-30 stays W = I (its init) to float32 precision,
  so it re-ranks the same candidates as dot; every other row gets its paired test against it (`vs_table`) and
  the findings compare the token row best on dev with it."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  c = _tiny_config(tmp_path, tiny_bert_dir)
  c.rows, c.distill.scorers = ("dot", "colbert", "lite", "table", "hybrid"), ()
  c.table.models = ml_collections.ConfigDict({"bilinear": blocks.model_config()})
  c.table.train.lr, c.table.train.epochs, c.table.train.eval_every = 1e-30, 2, 1
  job.validate(c)
  res = job.run(c, str(tmp_path / "w")).results
  by = {r["row"]: r for r in res["rows"]}
  table, dot = by["table"], by["dot"]
  assert table["model"] == "bilinear" and set(table["table_dev"]) == {"bilinear"}
  assert table["trained"] and table["bytes_per_doc"] == dot["bytes_per_doc"] == 32 * 2
  assert table["per_query"] == dot["per_query"] and table["metrics"] == dot["metrics"]
  assert table["vs_dot"]["diff"] == 0.0
  for r in (r for r in res["rows"] if r["row"] != "table"):
    assert r["vs_table"]["diff"] == pytest.approx(np.mean(
        [r["per_query"][q] - table["per_query"][q] for q in r["per_query"]]))
  assert "vs_table" not in table
  assert os.path.isdir(tmp_path / "w" / "runs") and any(
      f.startswith("table-bilinear-n18") for f in os.listdir(tmp_path / "w" / "runs"))
  md = job_report.markdown(res, c)
  assert "| table (bilinear) |" in md and "against the table similarity (bilinear" in md
  # The same command again resumes every trained row from its finished checkpoint: each reports
  # the seconds its training took, not those of its restore.
  seconds = lambda out: {r["row"]: r["train_seconds"] for r in out["rows"] if "train_seconds" in r}
  again = job.run(c, str(tmp_path / "w")).results
  assert set(seconds(res)) == {"table", "lite"} and seconds(res)["table"] > 0
  assert seconds(again) == seconds(res)


def test_curve_plot_draws_each_trained_row_s_own_model_per_n():
  """A row that dev kept as ColBERT is drawn at its own model's value (`model_metrics`), not at
  ColBERT's; the untrained rows at theirs; the hybrid not at all."""
  rows = []
  for n, own in ((300, 0.30), (3000, 0.35)):
    rows += [{"row": "dot", "scorer": "dot", "n_train": n, "trained": False,
              "metrics": {"ndcg@10": 0.40}},
             {"row": "colbert", "scorer": "colbert", "n_train": n, "trained": False,
              "metrics": {"ndcg@10": 0.43}},
             {"row": "lite", "scorer": "lite", "n_train": n, "trained": True,
              "kept_colbert": True, "metrics": {"ndcg@10": 0.43},
              "model_metrics": {"ndcg@10": own}},
             {"row": "hybrid (colbert + BM25)", "scorer": "hybrid", "n_train": n,
              "metrics": {"ndcg@10": 0.44}}]
  fig = job_report.plot({"rows": rows, "sizes": [300, 3000], "measure": "ndcg@10",
                  "collection": "c"})
  lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
  assert set(lines) == {"dot", "colbert", "lite"}
  assert list(lines["lite"].get_ydata()) == [0.30, 0.35]
  assert list(lines["colbert"].get_ydata()) == [0.43, 0.43]
  assert list(lines["lite"].get_xdata()) == [300, 3000]
  assert lines["dot"].get_linestyle() == "--" and lines["lite"].get_linestyle() == "-"
