"""The one-command accelerator check: exactness and sharding tests on the device, then the top-k,
streamed top-k, training-throughput, MoL and fidelity benchmarks at sizes that fit the time.

    launch/accelerator_check.sh                                   # on a GPU / TPU machine
    python benchmarks/accelerator_check.py --out runs/acc        # the same, without the wrapper
    python benchmarks/accelerator_check.py --reduced --out runs/acc_cpu   # end to end on a CPU

Every step is a subprocess with its own time limit (the steps share `--budget-s`, default 450 s,
so a GPU / TPU run ends within 8 minutes including start-up), its output in `OUT/<step>.log`, and
(for the benchmarks) its `--json` in `OUT/<step>.json`; a failing or timed-out step is recorded
and the check goes on. At the end `OUT/summary.json` and `OUT/summary.md` list the device, each
step's status and time, the tests' pass/fail counts and the benchmarks' headline numbers (for the
top-k scans: achieved GFLOP/s and table bandwidth as fractions of the device's peaks, measured in
the same run and, for known cards, from the data-sheet table of `timing.KNOWN_PEAKS`).

Steps:
  device        device name, count, measured and data-sheet peaks (`OUT/device.json`).
  tests_device  pytest on the default device (JAX_PLATFORMS left unset, so the accelerator):
                tests/test_device_exactness.py (the exactness claims against float64 numpy
                twins, sharded top-k over the device's chips), test_precision.py,
                test_retrieval_exact.py, test_certified.py, test_mol_topk.py.
  tests_sharding  pytest of the shard_map / multi-process logic on 8 fake CPU devices
                (tests/test_retrieval_sharded.py, test_multihost.py; JAX_PLATFORMS=cpu).
  topk          benchmarks/topk.py: all cases. Accelerator: the default sizes, peer = the bare
                matmul on the device (FAISS here is CPU-only, not a like-for-like peer);
                reduced: --scale 0.05 with the FAISS, numpy and matmul peers.
  stream        benchmarks/topk_stream.py on a small synthetic index written to a temporary
                folder outside OUT (deleted afterwards): 262,144 docs (reduced: 131,072), 32
                queries, with the read bound.
  train         benchmarks/train_throughput.py: bilinear and lowrank at n = 384 (reduced: 128,
                fewer steps). Accelerator: ours only (--no-torch: the torch peer is a CPU loop);
                reduced: with the torch eager and compiled peers when torch is installed.
  mol           benchmarks/mol_topk.py: 1,000,000 items, P = 4 (reduced: 20,000 items).
  fidelity      benchmarks/fidelity.py: the default workload (reduced: smaller), vs numpy.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, "benchmarks")

DEVICE_SCRIPT = r"""
import json, sys
import jax
from bilinear_ir import allocator
from bilinear_ir import timing
allocator.keep_freed_memory()  # as the benchmarks run
dev = jax.devices()[0]
peaks = {"measured": timing.measure_peaks(), "table": timing.known_peaks()}
out = {"platform": dev.platform, "device_kind": dev.device_kind,
       "device_count": jax.device_count(), "jax": jax.__version__,
       "hardware": timing.hardware(), "peaks": peaks, "peaks_line": timing.peaks_line(peaks)}
json.dump(out, open(sys.argv[1], "w"), indent=2)
print(json.dumps(out, indent=2))
"""


def steps(out: str, reduced: bool, accelerator: bool, tmp: str, torch_ok: bool) -> list[dict]:
  """The plan: [{"name", "cmd", "env", "timeout", "json"}]."""
  py = sys.executable
  dev_env = {"JAX_PLATFORMS": ""}  # the default backend: the accelerator if there is one
  cpu_env = {"JAX_PLATFORMS": "cpu"}
  j = lambda name: os.path.join(out, f"{name}.json")
  tests_device = ["tests/test_device_exactness.py", "tests/test_precision.py",
                  "tests/test_retrieval_exact.py", "tests/test_certified.py",
                  "tests/test_mol_topk.py"]
  plan = [
      {"name": "device", "cmd": [py, "-c", DEVICE_SCRIPT, j("device")], "env": dev_env,
       "timeout": 60},
      {"name": "tests_device", "cmd": [py, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                                       *tests_device], "env": dev_env, "timeout": 200},
      {"name": "tests_sharding", "cmd": [py, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                         "tests/test_retrieval_sharded.py",
                                         "tests/test_multihost.py"],
       "env": cpu_env, "timeout": 90},
  ]
  topk = [py, os.path.join(BENCH, "topk.py"), "--json", j("topk")]
  if reduced:
    topk += ["--scale", "0.05", "--repeats", "2"]
  else:
    topk += ["--repeats", "5"]
  if accelerator:
    topk += ["--peers", "matmul"]
  plan.append({"name": "topk", "cmd": topk, "env": dev_env, "timeout": 150, "json": j("topk")})
  stream = [py, os.path.join(BENCH, "topk_stream.py"), "--dir", os.path.join(tmp, "stream"),
            "--docs", "131072" if reduced else "262144", "--queries", "32", "--repeats", "2",
            "--shard-docs", "32768", "--json", j("stream")]
  if accelerator:
    stream += ["--peers", "read"]
  plan.append({"name": "stream", "cmd": stream, "env": dev_env, "timeout": 90,
               "json": j("stream")})
  train = [py, os.path.join(BENCH, "train_throughput.py"), "--json", j("train")]
  if reduced:
    train += ["--dims", "128", "--steps", "60", "--warmup", "20", "--rounds", "2", "--docs",
              "4000", "--queries", "1000"]
  else:
    train += ["--dims", "384", "--steps", "200", "--warmup", "50", "--rounds", "2"]
  if accelerator or not torch_ok:
    train += ["--no-torch"]
  plan.append({"name": "train", "cmd": train, "env": dev_env, "timeout": 150,
               "json": j("train")})
  mol = [py, os.path.join(BENCH, "mol_topk.py"), "--p", "4", "--json", j("mol")]
  mol += (["--items", "20000", "--repeats", "2"] if reduced
          else ["--items", "1000000", "--repeats", "3"])
  plan.append({"name": "mol", "cmd": mol, "env": dev_env, "timeout": 120, "json": j("mol")})
  fid = [py, os.path.join(BENCH, "fidelity.py"), "--json", j("fidelity")]
  if reduced:
    fid += ["--rows", "600", "--vocab", "8000", "--k", "2048", "--triples", "500", "--trials",
            "2"]
  plan.append({"name": "fidelity", "cmd": fid, "env": dev_env, "timeout": 90,
               "json": j("fidelity")})
  return plan


def run_step(step: dict, out: str, remaining: float) -> dict:
  """Runs one step (its output to OUT/<name>.log); returns its record."""
  limit = max(1.0, min(step["timeout"], remaining))
  env = dict(os.environ)
  # JAX_PLATFORMS="" (set, empty) means jax's default backend choice, and it stops
  # tests/conftest.py from defaulting the tests to CPU (it only fills in an unset variable).
  env.update(step["env"])
  env["PYTHONPATH"] = os.pathsep.join([REPO, BENCH] + ([env["PYTHONPATH"]]
                                                       if env.get("PYTHONPATH") else []))
  log = os.path.join(out, f"{step['name']}.log")
  t0 = time.perf_counter()
  with open(log, "w", encoding="utf-8") as f:
    shown = step["cmd"][:2] + ["<script>"] + step["cmd"][3:] if step["cmd"][1] == "-c" \
        else step["cmd"]
    f.write("$ " + " ".join(shown) + "\n")
    f.flush()
    try:
      proc = subprocess.run(step["cmd"], cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT,
                            timeout=limit, check=False)
      status = "ok" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
    except subprocess.TimeoutExpired:
      status = f"timed out after {limit:.0f} s"
  record = {"name": step["name"], "status": status, "seconds": round(time.perf_counter() - t0, 1),
            "log": os.path.basename(log)}
  with open(log, encoding="utf-8", errors="replace") as f:
    text = f.read()
  if step["name"].startswith("tests"):
    m = re.findall(r"(\d+) (passed|failed|skipped|error|errors)", text[-2000:])
    record["pytest"] = {kind: int(n) for n, kind in m}
  if step.get("json") and os.path.exists(step["json"]):
    record["json"] = os.path.basename(step["json"])
  print(f"[{record['seconds']:6.1f} s] {step['name']:15s} {status}", flush=True)
  return record


def headline(name: str, data: dict) -> list[str]:
  """The key numbers of a benchmark's JSON, as lines."""
  lines = []
  if name == "topk":
    for c in data.get("cases", []):
      frac = ", ".join(f"{k.replace('_fraction_of_', ' / ').replace('_peak', ' peak')} "
                       f"{v:.2f}" for k, v in c.items() if "_fraction_of_" in k)
      lines.append(f"{c['name']}: {c['ms']:.2f} ms, {c['qps']:.0f} q/s, {c['gflops']:.0f} GFLOP/s, "
                   f"{c['table_gb_per_s']:.1f} GB/s; vs matmul {c.get('ratio_vs_matmul')}, "
                   f"vs faiss {c.get('ratio_vs_faiss')}; {frac}")
  elif name == "stream":
    for c in data.get("cases", []):
      lines.append(f"{c['name']}: {c['ms']:.1f} ms, {c['qps']:.1f} q/s, read bound "
                   f"{c.get('read_bound_ms')} ms, ratio_vs_read {c.get('ratio_vs_read')}")
  elif name == "train":
    r2 = lambda v: "null" if v is None else f"{v:.2f}"
    for c in data.get("cases", []):
      lines.append(f"{c['name']}: {c['examples_per_s']:.0f} examples/s, vs torch eager "
                   f"{r2(c.get('ratio_vs_torch'))}, compiled "
                   f"{r2(c.get('ratio_vs_torch_compiled'))}"
                   + (f" ({c['note']})" if c.get("note") else ""))
  elif name == "mol":
    for r in data.get("rows", []):
      lines.append(f"{r['items']} items P={r['P_q']} {r['method']} {r['N']}: "
                   f"HR@100 {r['hr_rel'].get('100', float('nan')):.3f}, {r['ms']:.1f} ms, "
                   f"{r['speedup_vs_brute']:.1f}x brute force")
  elif name == "fidelity":
    lines.append(f"{data['evals_per_s']:,.0f} evals/s, ratio_vs_numpy "
                 f"{data['ratio_vs_numpy']:.2f}")
  return lines


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--out",
                 default=os.environ.get("OUT") or os.path.join("runs", "accelerator_check"),
                 help="output folder (default: $OUT, else runs/accelerator_check)")
  p.add_argument("--reduced", action="store_true",
                 help="small sizes: the whole check on a CPU in a few minutes")
  p.add_argument("--budget-s", type=float, default=450.0, help="seconds for all steps together")
  p.add_argument("--steps", default="", help="comma list of steps to run (default: all)")
  args = p.parse_args(argv)
  out = os.path.abspath(args.out)
  os.makedirs(out, exist_ok=True)
  probe_env = dict(os.environ)
  probe_env.pop("JAX_PLATFORMS", None)
  platform = subprocess.run(
      [sys.executable, "-c", "import jax; print(jax.devices()[0].platform)"], cwd=REPO,
      env=probe_env, capture_output=True, text=True, check=False).stdout.strip() or "unknown"
  accelerator = platform not in ("cpu", "unknown")
  torch_ok = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True,
                            check=False).returncode == 0
  print(f"accelerator check: default platform {platform}; "
        f"{'reduced (CPU-sized)' if args.reduced else 'full'} mode; output {out}", flush=True)
  if not accelerator and not args.reduced:
    print("no GPU/TPU found: the full sizes target an accelerator; pass --reduced on a CPU",
          flush=True)
  start = time.perf_counter()
  tmp = tempfile.mkdtemp(prefix="accelerator_check_")
  records = []
  chosen = {s for s in args.steps.split(",") if s}
  try:
    for step in steps(out, args.reduced, accelerator, tmp, torch_ok):
      if chosen and step["name"] not in chosen:
        continue
      remaining = args.budget_s - (time.perf_counter() - start)
      if remaining <= 1:
        records.append({"name": step["name"], "status": "skipped (budget spent)"})
        print(f"{'':10s}{step['name']:15s} skipped (budget spent)", flush=True)
        continue
      records.append(run_step(step, out, remaining))
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  device = {}
  if os.path.exists(os.path.join(out, "device.json")):
    with open(os.path.join(out, "device.json"), encoding="utf-8") as f:
      device = json.load(f)
  lines = [f"# Accelerator check ({'reduced' if args.reduced else 'full'} mode)", "",
           f"device: {device.get('platform')} {device.get('device_kind')} x "
           f"{device.get('device_count')} (jax {device.get('jax')})",
           f"hardware: {device.get('hardware')}", f"{device.get('peaks_line')}", "",
           "| step | status | seconds | detail |", "|---|---|---|---|"]
  for r in records:
    detail = ", ".join(f"{v} {k}" for k, v in r.get("pytest", {}).items())
    lines.append(f"| {r['name']} | {r['status']} | {r.get('seconds', '-')} | {detail} |")
  for r in records:
    if r.get("json"):
      with open(os.path.join(out, r["json"]), encoding="utf-8") as f:
        data = json.load(f)
      r["headline"] = headline(r["name"], data)
      lines += ["", f"## {r['name']}", ""] + [f"- {x}" for x in r["headline"]]
  total = round(time.perf_counter() - start, 1)
  lines += ["", f"total: {total} s"]
  summary = {"mode": "reduced" if args.reduced else "full", "platform": platform,
             "device": device, "steps": records, "total_seconds": total}
  with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as f:
    json.dump(summary, f, indent=2)
  with open(os.path.join(out, "summary.md"), "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines), flush=True)
  ok = all(r["status"] == "ok" for r in records)
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
