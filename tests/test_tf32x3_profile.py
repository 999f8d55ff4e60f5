"""benchmarks/tf32x3_profile.py: one tiny run on the CPU (the 3xTF32 arithmetic emulated) writing
its JSON, every config's certificate and ids checked against the float32 scan; and the
certificate it evaluates on the host is `_tf32x3_certified`'s."""
import json
import os
import subprocess
import sys

import numpy as np

from conftest import main_env

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import tf32x3_profile  # noqa: E402  (benchmarks/tf32x3_profile.py)


def test_host_certificate_is_strict():
  # next + slack must be strictly below the k-th score; -inf (no group left) always certifies
  nxt = np.array([1.0, 1.0, -np.inf, 2.0], np.float32)
  scores = np.array([[5, 2], [5, 1.5], [0, -1], [9, 2.5]], np.float32)
  got = tf32x3_profile.certificate(nxt, scores, np.float32(0.5), k=2)
  assert got.tolist() == [True, False, True, False]


def test_reduced_run_writes_every_config(tmp_path):
  out = tmp_path / "p.json"
  env = main_env()
  proc = subprocess.run(
      [sys.executable, os.path.join(REPO, "benchmarks", "tf32x3_profile.py"), "--reduced",
       "--out", str(out), "--cases", "q32_d1000000_n384_k10", "--groups", "32,128",
       "--coarse-docs", "256", "--repeats", "1"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
  (case,) = json.loads(out.read_text())["cases"]
  # G 32 with c 1 and 8, G 128 with c 1 and 2; m 12 and 20; two selections
  assert sorted(r["config"] for r in case["configs"]) == sorted(
      f"g{g}.m{m}.c{c}.{s}" for g, cs in ((32, (1, 8)), (128, (1, 2))) for m in (12, 20)
      for c in cs for s in ("top_k", "argmax"))
  for r in case["configs"]:
    assert r["same_ids_certified"] and r["fallback_queries"] == 0, r
    assert r["parts_ms"] >= r["maxima_ms"] > 0
  assert case["whole"]["run8"]["group"] == 128 and case["whole"]["run8"]["m"] == 20
  for tag in ("run8", "best"):
    assert case["whole"][tag]["same_ids_as_xla"] and case["whole"][tag]["whole_ms"] > 0
  assert len([ln for ln in proc.stdout.splitlines() if ln.startswith("q32_")]) == 16 + 2
  best = case["whole"]["best"]  # in benchmarks/topk.py's config form
  assert case["best_config"] == (f"g{best['group']}.c{best['coarse']}.m{best['m']}."
                                 f"{best['selection']}")
