"""numpy's OpenBLAS kernel, chosen before numpy is imported (import this module first).

OpenBLAS picks its kernels once, when the library loads, from CPU detection or from
`OPENBLAS_CORETYPE`. An `OPENBLAS_CORETYPE` inherited from the environment (a sandbox or a cluster
profile may set one) can leave numpy's BLAS far below its best: on the development machine (an
AVX-512 EPYC) numpy's float32 GEMM ran at 115 GFLOP/s with the inherited `Haswell` and 218 with
OpenBLAS's own detection (SkylakeX kernels). A numpy peer must run at its best, so
`choose_numpy_coretype()` times numpy's GEMM in a subprocess per candidate (the inherited value,
unset, `CANDIDATES`) and sets the fastest in `os.environ` when it beats the inherited one by more
than 5%, before this process imports numpy. `NUMPY_BLAS` records the probes; the hardware line
(`timing.hardware`) names the core type numpy's OpenBLAS actually loaded.
"""
import json
import os
import subprocess
import sys

CANDIDATES = ("", "SkylakeX", "Haswell", "Zen")
NUMPY_BLAS = {"chosen": None, "inherited": None, "probes": {}}

_PROBE = r"""
import json, time
import numpy as np
rng = np.random.default_rng(0)
a = rng.standard_normal((1024, 384), dtype=np.float32)
b = rng.standard_normal((384, 16384), dtype=np.float32)
a @ b
times = []
for _ in range(5):
  t0 = time.perf_counter()
  a @ b
  times.append(time.perf_counter() - t0)
print(json.dumps({"gflops": 2 * 1024 * 384 * 16384 / min(times) / 1e9}))
"""


def run_probe(script: str, coretype: str, args=(), timeout: float = 120.0) -> dict | None:
  """Runs the Python `script` (with `args`) in a subprocess whose OPENBLAS_CORETYPE is `coretype`
  ("" = unset: OpenBLAS's detection) and returns the JSON object its last output line prints,
  or None when it failed, timed out or printed no JSON (an old OpenBLAS can crash on a core
  type it does not know)."""
  env = dict(os.environ)
  env.pop("OPENBLAS_CORETYPE", None)
  if coretype:
    env["OPENBLAS_CORETYPE"] = coretype
  try:
    out = subprocess.run([sys.executable, "-c", script, *map(str, args)], env=env,
                         capture_output=True, text=True, timeout=timeout, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])
  except (subprocess.SubprocessError, ValueError, IndexError):
    return None


def _probe(coretype: str) -> float | None:
  """numpy's float32 GEMM GFLOP/s with OPENBLAS_CORETYPE=coretype, or None."""
  result = run_probe(_PROBE, coretype)
  return float(result["gflops"]) if result and "gflops" in result else None


def choose_numpy_coretype() -> dict:
  """Probes and sets OPENBLAS_CORETYPE for numpy (no-op once numpy is imported); NUMPY_BLAS."""
  inherited = os.environ.get("OPENBLAS_CORETYPE", "")
  NUMPY_BLAS["inherited"] = inherited or None
  if "numpy" in sys.modules or os.environ.get("BLAS_SETUP_NO_PROBE") == "1":
    # numpy already loaded, or probes turned off (the accelerator check's --reduced smoke run)
    NUMPY_BLAS["chosen"] = inherited or None
    return NUMPY_BLAS
  for ct in dict.fromkeys((inherited,) + CANDIDATES):
    rate = _probe(ct)
    if rate is not None:
      NUMPY_BLAS["probes"][ct or "unset"] = round(rate, 1)
  probes = NUMPY_BLAS["probes"]
  keep = probes.get(inherited or "unset", 0.0)
  best = max(probes, key=probes.get) if probes else "unset"
  chosen = best if probes.get(best, 0.0) > 1.05 * keep else (inherited or "unset")
  if chosen == "unset":
    os.environ.pop("OPENBLAS_CORETYPE", None)
  else:
    os.environ["OPENBLAS_CORETYPE"] = chosen
  NUMPY_BLAS["chosen"] = None if chosen == "unset" else chosen
  return NUMPY_BLAS


def describe() -> str:
  """One line: what was inherited, probed and chosen for numpy's OpenBLAS."""
  probes = ", ".join(f"{k} {v:.0f}" for k, v in NUMPY_BLAS["probes"].items())
  return (f"numpy OPENBLAS_CORETYPE {NUMPY_BLAS['chosen'] or 'unset (detection)'} (inherited "
          f"{NUMPY_BLAS['inherited'] or 'none'}; GEMM GFLOP/s by core type: "
          f"{probes or 'no probe'})")
