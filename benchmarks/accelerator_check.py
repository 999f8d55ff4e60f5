"""The one-command accelerator check: exactness and sharding tests on the device, then the top-k,
streamed top-k, training-throughput, MoL and fidelity benchmarks at sizes that fit the time.

    launch/accelerator_check.sh                                   # on a GPU / TPU machine
    python benchmarks/accelerator_check.py --out runs/acc        # the same, without the wrapper
    python benchmarks/accelerator_check.py --reduced --out runs/acc_cpu   # end to end on a CPU
    launch/accelerator_check.sh --kernels --out DIR   # issue 42's subset, at most 300 s on a GPU

Every step is a subprocess (its own process group, killed whole at its limit) with its own time
limit (`LIMITS`; the whole check, probes included, stays within `--budget-s`, default 450 s, so a
GPU run ends within 8 minutes including the wheel install and start-up), its output in
`OUT/<step>.log`, and (for the benchmarks) its `--json` in `OUT/<step>.json`; a failing or
timed-out step is recorded and the check goes on. At the end ONE file, `OUT/summary.json`:

  {"device": str, "steps": {STEP: {"passed": bool, "status": str, "seconds": float,
                                   "cases": [...]}}, "mode", "budget_s", "total_seconds"}

(the mol step adds "avg_selection": TopKAvg's top-N selection alone per block, its JSON's
`avg_selection_rows`), and "kernels": the issue-42 headline (`kernel_headline`: per top-k case
32 x 1M and 1,000 x 200k, the XLA scan's and the Pallas kernel's ms, ratio_vs_bound,
ratio_vs_torch, same_ids_as_fp32 and the faster strategy; each TopKAvg row's speedup over brute
force and HR@100, per selection strategy).

Every bound is the roofline with the READ-only bandwidth (`bandwidth_kind` "read": a reduction
over as many bytes as the case's table, timed in the same rounds). The Pallas kernels
(`retrieval.pallas_topk`) are compiled on a GPU and run in interpret mode elsewhere; a kernel that
fails to compile is recorded in its step's JSON (`tile_errors`, or a row with `error`) and the
check goes on; where a kernel test's process crashed in tests_device (e.g. an illegal memory
access), topk and mol run without the kernels (`pallas_skipped` in their summary entry names it).

`--kernels` (issue 42's subset, on a GPU at most 300 s, `KERNEL_LIMITS`): device; tests_device on
the exactness file, the Pallas kernel tests (compiled), the TF32 bound and certificate tests
(on the tensor cores) and the roofline unit test; topk on the two issue cases with
`KERNEL_STRATEGIES`: the XLA scan and the TF32 strategies' sweeps (tf32, XLA's one-pass
TF32_TF32_F32 dot; tf32x3, XLA's TF32_TF32_F32_X3 dot; each with its group maxima timed
alone, its fallback count and its bound at its TF32 passes) beside torch float32 with TF32 off
(the peer), bf16, and TF32 on (a labelled reference). The Pallas kernels (pallas,
pallas_blockmax: 5 to 170 ms in runs 5 and 6; tf32x3_pallas, the kernel's own split: 2x XLA's
tf32x3 in runs 8 and 9) are left out there. The mol step (1M
items, P = 4, TopKAvg(2,000 / 4,000) with the XLA and the Pallas top-N selection, brute force at
its best step and torch; 75 s) runs with `--kernels` only when `--steps` names it.

where a benchmark's cases are its JSON cases with every ratio (`ratio_vs_bound`, `bound_ms`,
`peak_flops`, `bandwidth_gbs`, `peer_torch_ms` / `note`, `ratio_vs_torch`, ...), a test step's
case is its pytest counts and failing tests, and the device step's is its peaks. The headline
ratios are printed last.

Steps (in this order: the device's own numbers first, CPU-only logic last):
  device        device name, count, measured and data-sheet peaks (`OUT/device.json`).
  tests_device  pytest on the default device (JAX_PLATFORMS set empty, so the accelerator):
                tests/test_device_exactness.py (the exactness claims against float64 numpy
                twins, sharded top-k over the device's chips), tests/test_precision.py,
                tests/retrieval/: test_retrieval_exact.py (the selection with ties and
                near-ties), test_certified.py, test_mol_topk.py,
                test_mol_topk_chunks.py, test_pallas_topk.py (the Pallas kernels compiled),
                test_certified_tf32x3.py (the TF32 bounds on the tensor cores);
                in TESTS_DEVICE_WORKERS pytest-xdist processes where xdist is installed.
                Reduced: test_device_exactness.py without the MoL and certified cases, and the
                Pallas kernels' Triton lowering (CI runs the rest).
  topk          benchmarks/topk.py, every case, default sizes, peers on the same device: the bare
                matmul and torch (float32 with TF32 off, and bf16) at its best chunk; our scan also
                at the former default chunk, 8,192 rows (`scan_chunk_ms`), and with each
                selection, lax.top_k and argmax passes (`scan_selection_ms`); the Pallas kernels
                and the 3xTF32 strategies (`--strategies` STRATEGIES: `<strategy>_<case>`
                rows, a tile sweep each on a GPU; 3xTF32 with torch TF32 on beside it).
                Reduced: --scale 0.01,
                64 queries, one case (q1000_d200000_n384_k10), the matmul and torch on the CPU
                (a smoke test of the peer).
  mol           benchmarks/mol_topk.py: 1,000,000 items, P = 4, a short grid, brute force also
                at 4,096 and 65,536 items per step, torch brute force on the device at its
                fastest step, TopKAvg's top-N selection alone per block, and TopKAvg /
                CombTopK also with the Pallas selection (reduced: 5,000 items, torch on the
                CPU).
  train         benchmarks/train_throughput.py: bilinear and lowrank at n = 384, one round, torch
                eager and compiled on the same device (reduced: lowrank n = 64, 10 steps, eager).
  stream        benchmarks/topk_stream.py on a small synthetic index written to a temporary
                folder outside OUT (deleted afterwards): 262,144 docs (reduced: 16,384), 32
                queries, with the roofline bound and the parallel read.
  tests_sharding  pytest of the shard_map / multi-process logic on 8 fake CPU devices
                (tests/retrieval/: test_retrieval_sharded.py, test_multihost.py;
                JAX_PLATFORMS=cpu). Reduced: two tests of test_retrieval_sharded.py (CI runs the
                rest).
  fidelity      benchmarks/fidelity.py: the default workload (reduced: smaller), vs numpy.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import signal
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


# Seconds per step (accelerator / reduced). The accelerator limits add up to the default budget
# (450 s) caps them: with the wheel install and start-up, the whole check ends within 8 minutes on
# a GPU (the first H200 run needed more than 90 s for tests_device and 100 s for topk).
LIMITS = {"device": (40, 30), "tests_device": (150, 50), "topk": (160, 95), "mol": (90, 75),
          "train": (70, 35), "stream": (30, 35), "tests_sharding": (40, 45), "fidelity": (20, 30)}
# Seconds per step with --kernels on an accelerator (device, tests_device, topk within 300 s:
# with the wheel install, under 5.5 minutes of device time; the topk step compiles both Pallas
# strategies at each of their tile configs). mol (75 s) only when --steps names it.
KERNEL_LIMITS = {"device": 30, "tests_device": 80, "topk": 190, "mol": 75}
# The top-k strategies the topk step times (benchmarks/topk.py --strategies): the XLA scan
# first, then the Pallas kernels.
STRATEGIES = ("xla", "pallas", "pallas_blockmax", "tf32", "tf32x3", "tf32x3_pallas")
# The strategies --kernels times: the XLA scan and the TF32 certified strategies by XLA (one
# pass, three passes); not the Pallas kernel's 3xTF32, 2x slower than XLA's on the H200 (runs 8
# and 9: 3.50 against 1.80 ms at 32 x 1M, 9.04 against 4.65 ms at 1,000 x 200k), whose tile
# sweep would not fit the topk step's limit beside the one-pass sweep.
KERNEL_STRATEGIES = ("xla", "tf32", "tf32x3")
# pytest-xdist workers of tests_device on an accelerator, where the package is installed (the
# device machines' image has it); else the tests run in one process.
TESTS_DEVICE_WORKERS = 8


def steps(out: str, reduced: bool, accelerator: bool, tmp: str, torch_ok: bool,
          kernels: bool = False) -> list[dict]:
  """The plan, most device-relevant first: [{"name", "cmd", "env", "timeout", "json"}];
  `kernels`: the issue-42 subset (`--kernels`: the module docstring)."""
  py = sys.executable
  dev_env = {"JAX_PLATFORMS": ""}  # the default backend: the accelerator if there is one
  cpu_env = {"JAX_PLATFORMS": "cpu"}
  if reduced or accelerator:  # no BLAS core-type probes (blas_setup): a smoke run, or numpy's
    # BLAS is no peer (the peers run on the device)
    dev_env["BLAS_SETUP_NO_PROBE"] = cpu_env["BLAS_SETUP_NO_PROBE"] = "1"
  j = lambda name: os.path.join(out, f"{name}.json")
  limit = lambda name: (KERNEL_LIMITS.get(name) if kernels and not reduced else None) or \
      LIMITS[name][1 if reduced else 0]
  if reduced:  # the Pallas kernels: their Triton lowering (interpret-mode tests run in CI)
    tests_device = ["tests/test_device_exactness.py",
                    "tests/retrieval/test_pallas_topk.py::test_triton_lowering_is_full_float32",
                    "tests/retrieval/test_pallas_topk.py::"
                    "test_triton_lowering_of_the_3xtf32_kernel_uses_tf32",
                    "-k", "not mol and not certified"]
  elif kernels:
    tests_device = ["tests/test_device_exactness.py", "tests/retrieval/test_pallas_topk.py",
                    "tests/retrieval/test_certified_tf32x3.py", "tests/test_timing_roofline.py"]
  else:
    tests_device = ["tests/test_device_exactness.py", "tests/test_precision.py",
                    "tests/retrieval/test_retrieval_exact.py", "tests/retrieval/test_certified.py",
                    "tests/retrieval/test_mol_topk.py", "tests/retrieval/test_mol_topk_chunks.py",
                    "tests/retrieval/test_pallas_topk.py", "tests/retrieval/test_certified_tf32x3.py"]
  tests_env = dict(dev_env)
  if accelerator and not reduced and importlib.util.find_spec("xdist") is not None:
    # Compilation, on the host, is most of these tests' time (the first H200 run: 72 of 110
    # tests in 150 s): TESTS_DEVICE_WORKERS pytest-xdist processes share the device, each
    # allocating device memory as it needs it instead of 75% of it up front.
    tests_device = ["-n", str(TESTS_DEVICE_WORKERS), *tests_device]
    tests_env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
  plan = [
      {"name": "device", "cmd": [py, "-c", DEVICE_SCRIPT, j("device")], "env": dev_env,
       "json": j("device")},
      {"name": "tests_device", "cmd": [py, "-m", "pytest", "-q", "-rfs", "-p",
                                       "no:cacheprovider", *tests_device], "env": tests_env},
  ]
  topk = [py, os.path.join(BENCH, "topk.py"), "--json", j("topk"), "--strategies",
          ",".join(KERNEL_STRATEGIES if kernels else STRATEGIES)]
  if reduced:
    # torch on the CPU: a smoke test of the torch peer's code that runs on a GPU; the Pallas
    # kernel in interpret mode; one case (each case compiles every strategy again)
    topk += ["--scale", "0.01", "--queries", "64", "--repeats", "1", "--peers", "matmul,torch",
             "--torch-device", "cpu", "--cases", "q1000_d200000_n384_k10"]
  elif kernels:  # the issue-42 cases only: the XLA scan, the Pallas kernel's sweep, torch
    topk += ["--repeats", "5", "--peers", "matmul,torch",
             "--cases", "q32_d1000000_n384_k10,q1000_d200000_n384_k10"]
  else:
    # on an accelerator: the bare matmul and torch on the same device (FAISS is CPU-only), and
    # the scan at other chunk sizes than the device default
    topk += ["--repeats", "5", "--peers", "matmul,torch", "--chunks", "8192",
             "--selections", "top_k,argmax"]
  plan.append({"name": "topk", "cmd": topk, "env": dev_env, "json": j("topk")})
  mol = [py, os.path.join(BENCH, "mol_topk.py"), "--p", "4", "--json", j("mol"),
         "--selections", "xla", "pallas"]
  if reduced:
    mol += ["--items", "5000", "--repeats", "1", "--avg", "500", "--per_embd", "--comb",
            "--torch-device", "cpu"]
  elif kernels:  # TopKAvg(2,000 / 4,000) on 1M items, brute force at its best step, torch
    mol += ["--items", "1000000", "--repeats", "3", "--avg", "2000", "4000", "--per_embd",
            "--comb", "--brute_chunks", "65536"]
  else:
    mol += ["--items", "1000000", "--repeats", "3", "--avg", "2000", "4000", "8000",
            "--per_embd", "200", "--comb", "100_1000", "--brute_chunks", "4096", "65536"]
  plan.append({"name": "mol", "cmd": mol, "env": dev_env, "json": j("mol")})
  train = [py, os.path.join(BENCH, "train_throughput.py"), "--json", j("train")]
  if reduced:
    train += ["--dims", "64", "--steps", "10", "--warmup", "5", "--rounds", "1", "--docs",
              "2000", "--queries", "500", "--cases", "lowrank", "--no-compile"]
  else:
    train += ["--dims", "384", "--steps", "200", "--warmup", "50", "--rounds", "1"]
  if not torch_ok:
    train += ["--no-torch"]
  plan.append({"name": "train", "cmd": train, "env": dev_env, "json": j("train")})
  stream = [py, os.path.join(BENCH, "topk_stream.py"), "--dir", os.path.join(tmp, "stream"),
            "--docs", "16384" if reduced else "262144", "--queries", "32", "--repeats",
            "1" if reduced else "2", "--shard-docs", "4096" if reduced else "32768",
            "--peers", "read", "--json", j("stream")]
  plan.append({"name": "stream", "cmd": stream, "env": dev_env, "json": j("stream")})
  sharding = (["tests/retrieval/test_retrieval_sharded.py"]
              + ([] if reduced else ["tests/retrieval/test_multihost.py"]))
  if reduced:  # two of its tests: the step's wiring (the test suite runs the whole file)
    sharding += ["-k", "real_scores_equal_single_device or ties_across_shards"]
  plan.append({"name": "tests_sharding", "cmd": [py, "-m", "pytest", "-q", "-rfs", "-p",
                                                 "no:cacheprovider", *sharding],
               "env": cpu_env})
  fid = [py, os.path.join(BENCH, "fidelity.py"), "--json", j("fidelity")]
  if reduced:
    fid += ["--rows", "300", "--vocab", "4000", "--k", "1024", "--triples", "200", "--trials",
            "1"]
  plan.append({"name": "fidelity", "cmd": fid, "env": dev_env, "json": j("fidelity")})
  for step in plan:
    step["timeout"] = limit(step["name"])
  return plan


def run_step(step: dict, out: str, remaining: float) -> dict:
  """Runs one step (its output to OUT/<name>.log) in its own process group, killed whole at its
  time limit (min(its limit, the budget left)); returns its record."""
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
    proc = subprocess.Popen(step["cmd"], cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
      code = proc.wait(timeout=limit)
      status = "ok" if code == 0 else f"failed (exit {code})"
    except subprocess.TimeoutExpired:
      os.killpg(proc.pid, signal.SIGKILL)  # the step and anything it started (compilers)
      proc.wait()
      status = f"timed out after {limit:.0f} s"
  record = {"name": step["name"], "status": status, "seconds": round(time.perf_counter() - t0, 1),
            "limit_s": round(limit, 1), "log": os.path.basename(log)}
  with open(log, encoding="utf-8", errors="replace") as f:
    text = f.read()
  if step["name"].startswith("tests"):
    m = re.findall(r"(\d+) (passed|failed|skipped|error|errors)", text[-3000:])
    record["pytest"] = {kind: int(n) for n, kind in m}
    record["failed_tests"] = re.findall(r"^(?:FAILED|ERROR) (\S+)", text, re.M)
    # tests whose process died (an xdist worker crashed, or pytest itself killed by a signal)
    record["crashed_tests"] = re.findall(r"crashed while running '([^']+)'", text)
    if status.startswith("failed") and proc.returncode < 0:  # faulthandler's traceback
      record["crashed_tests"] += [f"{m} (the pytest process died)" for m in sorted(set(
          re.findall(r"tests/\S+?\.py", text[-6000:])))]
  if step.get("json") and os.path.exists(step["json"]):
    record["json"] = os.path.basename(step["json"])
  print(f"[{record['seconds']:6.1f} s] {step['name']:15s} {status}", flush=True)
  return record


def cases_of(record: dict, out: str) -> tuple[list[dict], dict]:
  """The step's cases for summary.json: a benchmark's JSON cases (rows for MoL, the whole JSON
  for fidelity and device), or the pytest counts and failing tests; and the step's extra
  summary fields (MoL: "avg_selection", its JSON's `avg_selection_rows`)."""
  if record["name"].startswith("tests"):
    return [{"pytest": record.get("pytest", {}),
             "failed_tests": record.get("failed_tests", []),
             "crashed_tests": record.get("crashed_tests", [])}], {}
  if not record.get("json"):
    return [], ({"avg_selection": []} if record["name"] == "mol" else {})
  with open(os.path.join(out, record["json"]), encoding="utf-8") as f:
    data = json.load(f)
  if "cases" in data:
    return data["cases"], {}
  if "rows" in data:
    extra = ({"avg_selection": data.get("avg_selection_rows", [])}
             if record["name"] == "mol" else {})
    return data["rows"], extra
  return [data], {}


def headline(name: str, cases: list[dict]) -> list[str]:
  """The key ratios of a step's cases, as lines (printed at the end)."""
  lines = []
  r = lambda v: "null" if v is None else f"{v:.3g}" if isinstance(v, float) else str(v)
  for c in cases:
    if name in ("topk", "mol") and c.get("ms") is None:
      lines.append(f"{c.get('name') or c.get('method')} ({c.get('strategy')}): FAILED "
                   f"{c.get('error')}")
    elif name == "topk":
      lines.append(f"{c['name']} [{c.get('strategy')}"
                   + (f" {c['tiles']}" if c.get("tiles") else "")
                   + f"]: {c['ms']:.3f} ms, bound {r(c.get('bound_ms'))} ms "
                   f"({c.get('bound_limit')}, {c.get('bandwidth_kind')}), ratio_vs_bound "
                   f"{r(c.get('ratio_vs_bound'))}, "
                   f"vs torch {r(c.get('ratio_vs_torch'))}, vs matmul "
                   f"{r(c.get('ratio_vs_matmul'))}, vs faiss {r(c.get('ratio_vs_faiss'))}"
                   + (f"; group maxima alone {c['kernel_ms']:.3f} ms (ratio_vs_bound "
                      f"{r(c.get('kernel_ratio_vs_bound'))}), selection after "
                      f"{r(c.get('after_kernel_ms'))} ms" if c.get("kernel_ms") else "")
                   + (f"; fallback_queries {c['fallback_queries']}, torch TF32 on (reference) "
                      f"{r(c.get('torch_tf32_ms'))} ms" if "fallback_queries" in c else "")
                   + (f", same_ids_as_fp32 {c['same_ids_as_fp32']}"
                      if "same_ids_as_fp32" in c else ""))
    elif name == "stream":
      lines.append(f"{c['name']}: {c['ms']:.1f} ms, ratio_vs_bound {r(c.get('ratio_vs_bound'))}, "
                   f"read {r(c.get('read_bound_ms'))} ms ({c.get('read_threads')} threads), "
                   f"ratio_vs_read {r(c.get('ratio_vs_read'))}")
    elif name == "train":
      lines.append(f"{c['name']}: {c['examples_per_s']:.0f} examples/s, vs torch eager "
                   f"{r(c.get('ratio_vs_torch'))}, compiled "
                   f"{r(c.get('ratio_vs_torch_compiled'))}"
                   + (f" ({c['note']})" if c.get("note") else ""))
    elif name == "mol_avg_selection":
      lines.append(f"TopKAvg top-N selection, {c['items']} items, N {c['N']}, block "
                   f"{c['block']}{' (default)' if c['default'] else ''}: "
                   + (f"{c['ms']:.2f} ms, same ids as lax.top_k {c['same_ids_as_lax_top_k']}"
                      if c.get("ms") is not None else f"FAILED {c.get('error')}"))
    elif name == "mol":
      lines.append(f"{c['items']} items P={c['P_q']} {c['method']} {c['N']} "
                   f"[{c.get('strategy', 'xla')}]: HR@100 "
                   f"{c['hr_rel'].get('100', float('nan')):.3f}, {c['ms']:.2f} ms, "
                   f"{c['speedup_vs_brute']:.1f}x brute force, ratio_vs_bound "
                   f"{r(c.get('ratio_vs_bound'))}, torch brute {r(c.get('peer_torch_ms'))} ms")
    elif name == "fidelity":
      lines.append(f"{c['evals_per_s']:,.0f} evals/s, ratio_vs_numpy {c['ratio_vs_numpy']:.2f}")
    elif name == "device":
      lines.append(f"{c.get('platform')} {c.get('device_kind')} x {c.get('device_count')}: "
                   f"{c.get('peaks_line')}")
    elif name.startswith("tests"):
      lines.append(", ".join(f"{v} {k}" for k, v in c["pytest"].items()) or "no pytest summary")
      lines += [f"FAILED {t}" for t in c["failed_tests"]]
  return lines


def pallas_failures(records: list[dict]) -> list[str]:
  """The Pallas kernel tests whose process crashed in tests_device (a failing test is only
  recorded: the benchmarks check their ids themselves; a crash could take a benchmark down)."""
  return [t for r in records if r.get("name") == "tests_device"
          for t in r.get("crashed_tests", []) if "test_pallas_topk" in t]


def without_pallas(cmd: list[str]) -> list[str]:
  """A topk / mol command with its Pallas strategies dropped (`--strategies` / `--selections`):
  topk keeps the XLA scan only."""
  out = []
  for arg in cmd:
    if out and out[-1] == "--strategies":
      arg = "xla"
    if arg != "pallas":
      out.append(arg)
  return out


def kernel_headline(steps: dict) -> dict:
  """The issue-42 ratios from the steps' cases: per float32 top-k case with a Pallas or 3xTF32
  row (full sizes: q32_d1000000_n384_k10 and q1000_d200000_n384_k10), each strategy's ms,
  ratio_vs_bound (the read-only / compute bound), vs torch and same_ids_as_fp32 (3xTF32:
  also fallback_queries and torch with TF32 on), the group maxima alone where timed, and the
  faster strategy; for MoL, each TopKAvg row's speedup over brute force and HR@100."""
  out = {}
  cases = {c.get("name"): c for c in (steps.get("topk") or {}).get("cases", [])}
  tags = {c["name"][len(c["strategy"]) + 1:] for c in cases.values()
          if c.get("strategy") in STRATEGIES[1:] and c.get("name")}
  for tag in sorted(tags):
    found = {}
    for strategy in STRATEGIES:
      c = cases.get(tag if strategy == "xla" else f"{strategy}_{tag}")
      if not c:
        continue
      found[strategy] = {key: c.get(key) for key in (
          "ms", "bound_ms", "bound_limit", "bandwidth_kind", "ratio_vs_bound", "peer_torch_ms",
          "ratio_vs_torch", "same_ids_as_fp32", "explained", "tiles", "error") + (
              ("kernel_ms", "after_kernel_ms", "kernel_ratio_vs_bound")
              if strategy not in ("xla", "pallas") else ()) + (
              ("fallback_queries", "torch_tf32_ms", "ratio_vs_torch_tf32")
              if strategy.startswith("tf32") else ())}
    timed = {k: v for k, v in found.items() if v.get("ms")}
    if timed:
      found["best"] = min(timed, key=lambda k: timed[k]["ms"])
    if found:
      out[tag] = found
  mol = [{key: c.get(key) for key in ("items", "N", "strategy", "ms", "speedup_vs_brute",
                                      "ratio_vs_bound", "same_ids_as_xla", "error")}
         | {"hr_at_100": (c.get("hr_rel") or {}).get("100")}
         for c in (steps.get("mol") or {}).get("cases", []) if c.get("method") == "TopKAvg"]
  if mol:
    out["mol_topkavg"] = mol
  return out


def main(argv=None) -> int:
  start = time.perf_counter()  # the budget counts everything from here
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--out",
                 default=os.environ.get("OUT") or os.path.join("runs", "accelerator_check"),
                 help="output folder (default: $OUT, else runs/accelerator_check)")
  p.add_argument("--reduced", action="store_true",
                 help="CPU sizes: the whole check on a 2-core CPU in about two minutes")
  p.add_argument("--budget-s", type=float, default=450.0,
                 help="seconds for the whole check (probes and every step)")
  p.add_argument("--steps", default="", help="comma list of steps to run (default: all)")
  p.add_argument("--kernels", action="store_true",
                 help="the issue-42 subset in at most 300 s on a GPU: device, tests_device (the "
                      "exactness and Pallas kernel tests), topk (32 x 1M and 1,000 x 200k: XLA "
                      "scan, both Pallas strategies' sweeps, torch); mol (TopKAvg on 1M items, "
                      "both selections) only with --steps")
  args = p.parse_args(argv)
  out = os.path.abspath(args.out)
  os.makedirs(out, exist_ok=True)
  probe_env = dict(os.environ)
  probe_env.pop("JAX_PLATFORMS", None)
  probe = subprocess.run(
      [sys.executable, "-c", "import jax; print(jax.devices()[0].platform)"], cwd=REPO,
      env=probe_env, capture_output=True, text=True, check=False, timeout=60)
  platform = probe.stdout.strip() or "unknown"
  accelerator = platform not in ("cpu", "unknown")
  torch_ok = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True,
                            check=False, timeout=60).returncode == 0
  print(f"accelerator check: default platform {platform}; "
        f"{'reduced (CPU-sized)' if args.reduced else 'full'} mode; budget {args.budget_s:.0f} s; "
        f"output {out}", flush=True)
  if not accelerator and not args.reduced:
    print("no GPU/TPU found: the full sizes target an accelerator; pass --reduced on a CPU",
          flush=True)
  tmp = tempfile.mkdtemp(prefix="accelerator_check_")
  records = []
  chosen = {s for s in args.steps.split(",") if s}
  if args.kernels and not chosen:
    chosen = {"device", "tests_device", "topk"}
  try:
    for step in steps(out, args.reduced, accelerator, tmp, torch_ok, args.kernels):
      if chosen and step["name"] not in chosen:
        continue
      remaining = args.budget_s - (time.perf_counter() - start)
      if remaining <= 1:
        records.append({"name": step["name"], "status": "skipped (budget spent)"})
        print(f"{'':10s}{step['name']:15s} skipped (budget spent)", flush=True)
        continue
      broken = pallas_failures(records)
      if broken and step["name"] in ("topk", "mol"):
        # a kernel whose test crashed in tests_device could take the whole benchmark process
        # down: the benchmark runs without it, and says so
        step["cmd"] = without_pallas(step["cmd"])
        print(f"{'':10s}{step['name']:15s} without the Pallas kernels: {broken}", flush=True)
      records.append(run_step(step, out, remaining))
      if broken and step["name"] in ("topk", "mol"):
        records[-1]["pallas_skipped"] = f"crashed in tests_device: {broken}"
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  summary_steps = {}
  lines = []
  for rec in records:
    cases, extra = (cases_of(rec, out) if rec["status"] != "skipped (budget spent)"
                    else ([], {}))
    summary_steps[rec["name"]] = {"passed": rec["status"] == "ok", "status": rec["status"],
                                  "seconds": rec.get("seconds"), "cases": cases, **extra,
                                  **({"pallas_skipped": rec["pallas_skipped"]}
                                     if rec.get("pallas_skipped") else {})}
    lines += [f"## {rec['name']}: {rec['status']} ({rec.get('seconds', '-')} s)"]
    lines += [f"  {x}" for x in headline(rec["name"], cases)]
    if "avg_selection" in extra:
      lines += [f"  {x}" for x in headline("mol_avg_selection", extra["avg_selection"])]
  device_cases = summary_steps.get("device", {}).get("cases") or [{}]
  dev = device_cases[0]
  device = (f"{dev.get('platform', platform)} {dev.get('device_kind', '')} x "
            f"{dev.get('device_count', '?')}; {dev.get('hardware', '')}").strip()
  total = round(time.perf_counter() - start, 1)
  kernels = kernel_headline(summary_steps)
  summary = {"device": device, "steps": summary_steps, "mode": "reduced" if args.reduced
             else "kernels" if args.kernels else "full", "budget_s": args.budget_s,
             "total_seconds": total, "kernels": kernels}
  lines += ["## issue 42 (kernels): " + json.dumps(kernels)]
  # written whole or not at all (temp file + rename); this process never imports jax, so it
  # holds no device memory while the steps run
  fd, tmp_path = tempfile.mkstemp(dir=out, suffix=".json.tmp")
  with os.fdopen(fd, "w", encoding="utf-8") as f:
    json.dump(summary, f, indent=2)
  os.replace(tmp_path, os.path.join(out, "summary.json"))
  print("\n".join(lines + [f"total: {total} s (budget {args.budget_s:.0f} s); "
                           f"{os.path.join(out, 'summary.json')}"]), flush=True)
  return 0 if all(r["status"] == "ok" for r in records) else 1


if __name__ == "__main__":
  sys.exit(main())
