"""The lowrank_analysis job: Theorem 3 checks against a float64 twin, truncation metrics against
the dense W_r through the full bilinear scorer, the pair sampler, and the job end to end."""
import os

import jax.numpy as jnp
import numpy as np
import pytest

from bilinear_ir import lowrank
from bilinear_ir import scorers
from bilinear_ir.data import pipeline
from bilinear_ir.experiment import evaluate
from bilinear_ir.report import lowrank_analysis as lowrank_report
from bilinear_ir.studies import truncation
from conftest import get_config, random_prepared, write_beir

DIM = 12


def _decaying(seed: int, n: int, decay: float = 0.75) -> np.ndarray:
  """A W [n, n] with singular values decay**i and random singular vectors."""
  rng = np.random.default_rng(seed)
  U, _ = np.linalg.qr(rng.normal(size=(n, n)))
  V, _ = np.linalg.qr(rng.normal(size=(n, n)))
  return ((U * decay ** np.arange(n)) @ V.T).astype(np.float32)


def _truncated64(W: np.ndarray, r: int) -> np.ndarray:
  U, S, Vt = np.linalg.svd(np.asarray(W, np.float64))
  return (U[:, :r] * S[:r]) @ Vt[:r]


def test_config_uses_the_table_recipe():
  mine, table = get_config("lowrank_analysis"), get_config("reproduce_table")
  for block in ("data", "encoder", "bm25", "train", "train_overrides", "eval"):
    assert mine[block].to_dict() == table[block].to_dict(), block
  assert mine.seed == table.seed and mine.job == "lowrank_analysis"
  assert tuple(mine.ranks) == (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384)
  assert get_config("lowrank_analysis", "seeds=0+1,ranks=3+5").seeds == (0, 1)


@pytest.mark.parametrize("seed", range(3))
def test_theorem3_check_matches_a_float64_twin(seed):
  n, m = 16, 500
  rng = np.random.default_rng(seed)
  W = _decaying(seed, n) + np.eye(n, dtype=np.float32) * (seed == 1)
  S = np.asarray(lowrank.spectrum(jnp.asarray(W)), np.float64)
  q = (rng.normal(size=(m, n)) * rng.uniform(0.2, 5, size=(m, 1))).astype(np.float32)
  d = rng.normal(size=(m, n)).astype(np.float32)
  is_top = rng.random(m) < 0.3
  dec = lowrank.svd(jnp.asarray(W))
  for r in (1, 4, 9, n - 1, n):
    got = lowrank.check_theorem3(W, S, lowrank.lowrank_params(W, r), r, q, d, is_top,
                                          1e-5)
    q64, d64 = q.astype(np.float64), d.astype(np.float64)
    err = np.abs(np.einsum("bi,ij,bj->b", q64, W.astype(np.float64) - _truncated64(W, r), d64))
    scale = np.linalg.norm(q64, axis=1) * np.linalg.norm(d64, axis=1)
    assert got["checks"] == m and got["violations"] == 0
    if r == n:
      assert got["ratio_count"] == 0 and got["max_excess"] <= 1e-5
      continue
    ratio = err / (S[r] * scale)
    assert got["ratio_count"] == m
    np.testing.assert_allclose(got["ratio_sum"] / m, ratio.mean(), rtol=1e-3)
    np.testing.assert_allclose(got["ratio_max"], ratio.max(), rtol=1e-3)
    np.testing.assert_allclose(got["ratio_sum_top"], ratio[is_top].sum(), rtol=1e-3)
    assert got["ratio_count_top"] == is_top.sum() and got["ratio_max"] <= 1 + 1e-5
    # The tightness witness (u_{r+1}, v_{r+1}) meets the bound with equality.
    w = lowrank.witness_ratio(W, dec, lowrank.lowrank_params(W, r), r)
    assert abs(w - 1.0) <= 1e-4


def test_theorem3_check_flags_a_bound_that_is_too_small():
  n = 10
  W = _decaying(3, n)
  S = np.asarray(lowrank.spectrum(jnp.asarray(W)), np.float64)
  dec = lowrank.svd(jnp.asarray(W))
  r = 3
  wq, wd = (np.asarray(x)[None] for x in lowrank.tightness_witness(dec, r))
  factors = lowrank.lowrank_params(W, r)
  ok = lowrank.check_theorem3(W, S, factors, r, wq, wd, np.ones(1, bool), 1e-5)
  assert ok["violations"] == 0 and abs(ok["ratio_max"] - 1.0) <= 1e-4
  # Claim sigma_{r+1} 10% smaller than it is: the witness pair must now violate the bound.
  shrunk = S.copy()
  shrunk[r] *= 0.9
  bad = lowrank.check_theorem3(W, shrunk, factors, r, wq, wd, np.ones(1, bool), 1e-5)
  assert bad["violations"] == 1 and bad["ratio_max"] == pytest.approx(1 / 0.9, rel=1e-4)


def test_pointwise_pairs_top_then_distinct_random_docs():
  top = np.array([[3, 1, 7], [0, 2, 5]])
  q_pos, d_rows, is_top = lowrank.pointwise_pairs(top, 12, 4,
                                                           np.random.default_rng(0))
  assert q_pos.tolist() == [0] * 7 + [1] * 7
  for i in range(2):
    rows = d_rows[q_pos == i]
    assert rows[:3].tolist() == top[i].tolist() and is_top[q_pos == i].tolist() == [True] * 3 + [
        False] * 4
    assert len(set(rows.tolist())) == 7 and not set(rows[3:].tolist()) & set(top[i].tolist())
  # Fewer docs left than asked: all of them, once.
  _, d_rows, _ = lowrank.pointwise_pairs(np.array([[3, 1, 0]]), 5, 10,
                                                  np.random.default_rng(0))
  assert sorted(d_rows.tolist()) == [0, 1, 2, 3, 4] and d_rows[:3].tolist() == [3, 1, 0]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
  """A BEIR collection with random 12-d embeddings (no encoder), its BM25 and splits."""
  beir = write_beir(str(tmp_path_factory.mktemp("beir")), num_docs=80, num_queries=60)
  cfg = get_config("lowrank_analysis")
  with cfg.unlocked():
    cfg.data.format, cfg.data.path, cfg.data.dev_fraction = "beir", beir, 0.3
    cfg.eval.depth = 80
    cfg.pointwise.top_docs, cfg.pointwise.random_docs = 4, 6
  prepared = random_prepared(cfg.data, cfg.bm25, DIM)
  return cfg, prepared, pipeline.splits(prepared.collection, cfg.data, cfg.seed)[0]


def test_analyze_matches_dense_truncation_and_counts_checks(small):
  cfg, prepared, splitset = small
  W = _decaying(5, DIM, 0.85) + 0.3 * np.eye(DIM, dtype=np.float32)
  ranks = truncation.evaluated_ranks((1, 3, 6, 50), DIM)
  assert ranks == [1, 3, 6, DIM]
  out = truncation.analyze(W, prepared, splitset, cfg, ranks, seed=0)
  emb, measures = prepared.embeddings, tuple(cfg.eval.measures)
  n_test = len(splitset.test.query_ids)
  assert out["pairs"] == n_test * 10
  # W_r = W at r = n: the truncation's metrics are the full W's, exactly.
  for split in ("dev", "test"):
    assert out["by_rank"][DIM][split] == out["full"][split]
  # Each truncation ranks like the dense float64 W_r through the full bilinear scorer.
  module = scorers.build("bilinear", dim=DIM)
  for r in ranks:
    assert out["by_rank"][r]["pointwise"]["checks"] == n_test * 10
    for name, split in (("dev", splitset.dev), ("test", splitset.test)):
      rows = prepared.query_row_index(split.query_ids)
      want, _ = evaluate.RankingEvaluator(split.query_ids, emb.doc_ids, split.qrels, measures,
                                          depth=cfg.eval.depth)(
          module, {"W": jnp.asarray(_truncated64(W, r), jnp.float32)}, emb.queries[rows],
          emb.docs)
      for m in measures:
        assert out["by_rank"][r][name][m] == pytest.approx(want["mean"][m], abs=1e-12), (r, m)
  np.testing.assert_allclose(out["spectrum"], np.linalg.svd(W.astype(np.float64),
                                                            compute_uv=False), rtol=1e-5)


def test_job_end_to_end(tmp_path, tiny_bert_dir, run_main):
  beir = write_beir(str(tmp_path / "beir"), num_docs=60, num_queries=48)
  w = tmp_path / "w"
  res = run_main.in_process(
      "configs/lowrank_analysis.py:ranks=1+4+16+32+64,embeddings=mean+cls,seeds=0+1", w,
      "--config.data.format=beir", f"--config.data.path={beir}",
      "--config.data.dev_fraction=0.25", f"--config.encoder.model={tiny_bert_dir}",
      f"--config.encoder.cache_dir={tmp_path / 'cache'}", "--config.encoder.max_length=32",
      "--config.train.batch_size=8", "--config.train.steps=20", "--config.train.eval_every=10",
      "--config.eval.depth=50", "--config.pointwise.top_docs=5",
      "--config.pointwise.random_docs=7")
  for name in ("results.md", "config.json", "fig1a_metric_vs_rank.png",
               "fig1b_metric_vs_sigma_next.png", "fig1c_spectrum.png"):
    assert (w / name).exists(), name
  n = 32  # tiny BERT width
  test_queries = {line.split("\t")[0] for line in
                  open(os.path.join(beir, "qrels", "test.tsv")).read().splitlines()[1:]}
  total = 0
  for name, e in res["embeddings"].items():
    ranks = [r["rank"] for r in e["by_rank"]]
    assert {1, 4, 16, n} <= set(ranks) and max(ranks) == n  # 64 > n dropped
    # Two seeds x test queries x (5 top + 7 random docs) x ranks.
    assert e["pointwise_checks"] == 2 * len(test_queries) * 12 * len(ranks)
    assert all(set(row["std"]) == set(e["full"]["test"]) for row in e["by_rank"])
    total += e["pointwise_checks"]
    assert e["pointwise_violations"] == 0
    assert 0 < e["mean_error_over_bound"] <= e["max_error_over_bound"] <= 1 + 1e-5
    last = e["by_rank"][-1]
    assert last["sigma_next"] == 0.0 and last["pointwise"]["error_over_bound_mean"] is None
    if name == "mean":
      # r = n reproduces the full W (test and dev, every measure) exactly. Not asserted for
      # "cls": the random tiny BERT's CLS vectors are nearly identical (all dot products within
      # 2e-4 of 32, many exact ties), so float32 rounding alone orders its docs.
      assert {m: last[m] for m in e["full"]["test"]} == e["full"]["test"]
      assert last["dev"] == e["full"]["dev"]
    for row in e["by_rank"]:
      assert row["params_paper"] == n * row["rank"] and row["params_stored"] == 2 * n * row["rank"]
      assert row["compression_paper"] == pytest.approx(n / row["rank"])
    # The energy-selected rank is the smallest keeping the target share of sum sigma^2.
    s2 = np.asarray(e["spectrum"]) ** 2
    kept = np.concatenate([[0.0], np.cumsum(s2)]) / s2.sum()
    for sel in e["rank_selection"]["spectrum"]:
      assert sel["rank"] in ranks
      if sel["criterion"] == "energy":
        r = sel["rank"]
        assert kept[r] >= sel["target"] - 1e-9 and (r == 1 or kept[r - 1] < sel["target"])
    best = e["rank_selection"]["best_dev"]
    assert best["dev"] == max(row["dev"][res["measure"]] for row in e["by_rank"])
  assert res["pointwise_checks"] == total and res["pointwise_violations"] == 0
  assert res["max_error_over_bound"] <= 1 + res["pointwise_tolerance"]
  assert res["by_rank"] == res["embeddings"]["mean"]["by_rank"]
  # Fig. 1a plots the truncation curves and the full W's level; at r = n they meet.
  cfg = get_config("lowrank_analysis")
  figs = lowrank_report.figures(res, cfg)
  lines = {ln.get_label(): ln for ln in figs["fig1a_metric_vs_rank"].axes[0].get_lines()}
  for name, e in res["embeddings"].items():
    curve = lines[f"{name}: W_r test"]
    x, y = np.asarray(curve.get_xdata()), np.asarray(curve.get_ydata())
    assert x.tolist() == [r["rank"] for r in e["by_rank"]]
    assert y.tolist() == [r["ndcg@10"] for r in e["by_rank"]]
    full = np.asarray(lines[f"{name}: full W test"].get_ydata())
    assert full[0] == e["full"]["test"]["ndcg@10"]
    if name == "mean":
      assert x[-1] == n and y[-1] == full[0]
  md = (w / "results.md").read_text()
  assert "not the reproduce_table job's low-rank rows" in md and f"{total:,}" in md
