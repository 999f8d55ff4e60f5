"""benchmarks/gpu_sweep.py: its exact selection variants against brute force (ties included), and
one tiny end-to-end run on the CPU writing its one JSON and text summary."""
import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from bilinear_ir.retrieval import exact
from conftest import xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import gpu_sweep  # noqa: E402  (benchmarks/gpu_sweep.py)


def tied_tables(b, n, w, seed):
  """Small-integer tables: every score is exact in float32 and ties are common."""
  rng = np.random.default_rng(seed)
  q = rng.integers(-2, 3, (b, w)).astype(np.float32)
  d = rng.integers(-2, 3, (n, w)).astype(np.float32)
  d[n // 2:n // 2 + 7] = d[3]  # exact duplicates of one row: ties across blocks and chunks
  return jnp.asarray(q), jnp.asarray(d)


@pytest.mark.parametrize("n,chunk,block", [(1000, 256, 32), (1037, 128, 8), (999, 2000, 128),
                                           (45, 16, 4)])
def test_two_pass_equals_brute_force_with_ties(n, chunk, block):
  q, d = tied_tables(9, n, 6, n)
  truth = exact.brute_force(q, d, 10)
  got = gpu_sweep._two_pass(q, d, k=10, chunk=chunk, block=block)
  np.testing.assert_array_equal(np.asarray(got.ids), np.asarray(truth.ids))
  np.testing.assert_array_equal(np.asarray(got.scores), np.asarray(truth.scores))


@pytest.mark.parametrize("chunk,block", [(None, None), (256, 32), (100, 8), (4096, 512)])
def test_selection_on_precomputed_scores_equals_top_k(chunk, block):
  q, d = tied_tables(7, 1001, 6, 3)
  scores = q @ d.T
  truth = exact.brute_force(q, d, 10)
  got = gpu_sweep._select_fn(10, chunk, block)(scores)
  np.testing.assert_array_equal(np.asarray(got.ids), np.asarray(truth.ids))
  np.testing.assert_array_equal(np.asarray(got.scores), np.asarray(truth.scores))


def test_loop_max_is_the_row_max():
  q, d = tied_tables(5, 300, 6, 4)
  np.testing.assert_array_equal(np.asarray(gpu_sweep._loop_max_fn(64)(q, d)),
                                np.max(np.asarray(q) @ np.asarray(d).T, axis=1))


def test_tiny_sweep_writes_one_json_and_summary(tmp_path):
  out = tmp_path / "sweep"
  env = dict(os.environ, XLA_FLAGS=xla_flags())
  proc = subprocess.run(
      [sys.executable, os.path.join(REPO, "benchmarks", "gpu_sweep.py"), "--out", str(out),
       "--scale", "0.002", "--items", "3000", "--mol-n", "200,400", "--mol-chunks", "1024", "--mol-rescore-chunks", "64",
       "--repeats", "1", "--torch-device", "cpu", "--blocks", "8,32", "--grid-budget-s", "20",
       "--budget-s", "200"], cwd=REPO, env=env, capture_output=True, text=True, timeout=400,
      check=False)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert sorted(os.listdir(out)) == ["gpu_sweep.json", "gpu_sweep.txt"]
  res = json.loads((out / "gpu_sweep.json").read_text())
  assert set(res["cases"]) == {"q1000_d200000_n384_k10", "q32_d1000000_n384_k10"}
  # the only errors allowed on a CPU: the GPU-only dot algorithms
  assert all("not supported" in e["error"] for e in res["errors"]), res["errors"]
  for case in res["cases"].values():
    grid = case["scan_grid"]
    assert grid[0]["setting"] == "device default" and len(grid) >= 5
    assert all(r["exact"] and r["same_ids"] for r in grid), grid
    assert all(t["exact"] for t in case["selection"].values())
    assert all(t["exact"] for t in case["variants"].values())
    assert all(t["exact"] for t in case["torch"]["grid"].values())
    assert case["bound"]["bound_ms"] > 0 and case["matmul"]["full"]["ms"] > 0
    assert 0 < case["time_split"]["matmul_fraction"]
  for key in ("profile", "profile_q32"):
    prof = res[key]["lines"]
    assert prof and prof[0]["total_ms"] > 0 and prof[0]["top"]
  mol = res["mol"]
  assert mol["brute_force_by_chunk"]["1024"]["same_ids"]
  assert set(mol["topk_avg_stages"]["fractions"]) == {"avg_matmul", "top_n", "rescore"}
  assert 0 < mol["topk_avg"]["400"]["hr_at_100"] <= 1
  assert mol["topk_avg_400_by_chunk"]["64"]["ms"] > 0
  text = (out / "gpu_sweep.txt").read_text()
  assert "scan default" in text and "profile of the default q32 scan" in text
