"""FAISS as a benchmark peer in its best configuration on this machine (BLAS kernel, blocking).

Used by `topk.py` and `topk_stream.py`; FAISS is optional (`pip install faiss-cpu`).

The faiss-cpu wheel bundles its own OpenBLAS (0.3.15 in faiss-cpu 1.15.1), which picks its kernels
by CPU detection at load time; on CPUs newer than it (e.g. AVX-512 Xeons and EPYCs) it may pick a
slower kernel than the machine's best BLAS: measured on the development machine, FAISS's
brute-force search ran at 20 GFLOP/s by default and 150-165 with `OPENBLAS_CORETYPE=SkylakeX`.
`configure()` therefore, before faiss is imported in this process:
  1. probes each candidate core type (one inherited from the environment, unset = OpenBLAS's
     detection, then `CORETYPES`) in a subprocess
     that imports faiss with `OPENBLAS_CORETYPE` set and times `IndexFlatIP.search` on a pure-GEMM
     case (1,024 x 384 queries, 65,536 docs, k = 1, database blocks of 16,384 rows: the GEMM is
     almost all of the work), best of 3 calls;
  2. times the same GEMM with numpy (its own OpenBLAS) and XLA (`jax.jit` matmul) here, the
     reference "best BLAS on the machine";
  3. sets `OPENBLAS_CORETYPE` to the fastest probe when it beats the default by more than 5%,
     then imports faiss and reads back the core name of faiss's loaded OpenBLAS
     (`openblas_get_corename` via ctypes);
  4. when a core type was forced, checks FAISS's top-k ids and scores against an exact float64
     numpy computation on a sample (64 queries x 100,000 docs, k = 10): scores within the float32
     rounding bound gamma_w |q| |d| of their float64 values, ids equal wherever the float64 gap
     at the k-th place exceeds twice that bound.
OpenMP: FAISS parallelises with OpenMP, whose threads by default spin while they wait; on a
machine with any other load a descheduled thread then stalls every parallel region. Measured on
the development machine (2 cores shared with other jobs): one search of 1,000 x 32 queries
over 200,000 docs took 1.1-2.7 s with the default policy and 0.16 s with
`OMP_WAIT_POLICY=PASSIVE` (torch's OpenMP loop behaved the same). `configure` therefore sets
`OMP_WAIT_POLICY` (default PASSIVE, unless the environment already sets it) before faiss is
imported, for the probes and for this process.
`describe()` gives the line the benchmarks append to their hardware line.

`tune_blocking(index, q, k)` times FAISS's blocked brute-force search over a small grid of
`faiss.cvar.distance_compute_blas_query_bs` x `distance_compute_blas_database_bs` (and, for at
most 64 queries, the non-BLAS SIMD path: `distance_compute_blas_threshold` above the query count)
on the case itself and leaves FAISS set to the fastest.
"""
from __future__ import annotations

import ctypes
import dataclasses
import importlib.util
import os
import sys
import time

import jax
import numpy as np

import blas_setup  # benchmarks/blas_setup.py: the core-type probe subprocess

CORETYPES = ("", "SkylakeX", "Cooperlake", "Haswell", "Zen")
PROBE_SHAPE = (1024, 65536, 384)  # queries, docs, width of the pure-GEMM probe
DEFAULT_BLOCKING = (20, 4096, 1024)  # faiss 1.15 defaults: threshold, query_bs, database_bs

_PROBE = r"""
import json, sys, time
import numpy as np
import faiss
b, n, w = (int(x) for x in sys.argv[1:4])
rng = np.random.default_rng(0)
q = rng.standard_normal((b, w), dtype=np.float32)
d = rng.standard_normal((n, w), dtype=np.float32)
index = faiss.IndexFlatIP(w)
index.add(d)
faiss.cvar.distance_compute_blas_database_bs = 16384
index.search(q, 1)
times = []
for _ in range(3):
  t0 = time.perf_counter()
  index.search(q, 1)
  times.append(time.perf_counter() - t0)
print(json.dumps({"seconds": min(times)}))
"""


@dataclasses.dataclass
class FaissSetup:
  """What `configure` found and set.

  Attributes:
    available: faiss imported.
    coretype: OPENBLAS_CORETYPE in force ("" = not set: OpenBLAS's own detection).
    corename: the core name faiss's OpenBLAS reports after loading (None if not readable).
    probes: {core type or "default": GFLOP/s of FAISS's pure-GEMM probe}.
    numpy_gflops, xla_gflops: the same GEMM by numpy and by XLA here.
    check: the float64 check's outcome (None when no core type was forced).
    threads: FAISS's OpenMP threads.
  """
  available: bool
  coretype: str = ""
  corename: str | None = None
  probes: dict = dataclasses.field(default_factory=dict)
  numpy_gflops: float | None = None
  xla_gflops: float | None = None
  check: str | None = None
  threads: int | None = None
  version: str | None = None
  omp_wait_policy: str | None = None

  def describe(self) -> str:
    """One line for the hardware line."""
    if not self.available:
      return "faiss not installed"
    gemm = max(self.probes.values()) if self.probes else None
    best = max(x for x in (self.numpy_gflops, self.xla_gflops) if x) if (
        self.numpy_gflops or self.xla_gflops) else None
    forced = (f"OPENBLAS_CORETYPE={self.coretype} (forced)" if self.coretype
              else "OPENBLAS_CORETYPE unset (OpenBLAS's detection)")
    probes = ", ".join(f"{k} {v:.0f}" for k, v in self.probes.items())
    line = (f"faiss {self.version} ({self.threads} threads, OMP_WAIT_POLICY="
            f"{self.omp_wait_policy or 'unset'}), its OpenBLAS core {self.corename}: {forced}")
    if gemm and best:
      line += (f"; FAISS GEMM probe {gemm:.0f} GFLOP/s vs best BLAS here {best:.0f} "
               f"(numpy {self.numpy_gflops:.0f}, XLA {self.xla_gflops:.0f}); probes by core type: "
               f"{probes}")
    line += f"; float64 check: {self.check or 'not needed (no core type forced)'}"
    return line


def _probe(coretype: str, shape=PROBE_SHAPE, timeout: float = 300.0) -> float | None:
  """GFLOP/s of FAISS's pure-GEMM search in a subprocess with OPENBLAS_CORETYPE=coretype."""
  result = blas_setup.run_probe(_PROBE, coretype, shape, timeout)
  if not result or "seconds" not in result:
    return None
  b, n, w = shape
  return 2.0 * b * n * w / result["seconds"] / 1e9


def _gemm_rates(shape=PROBE_SHAPE) -> tuple[float, float]:
  """GFLOP/s of numpy's and XLA's float32 matmul of the probe's shapes (best of 3)."""
  b, n, w = shape
  rng = np.random.default_rng(0)
  q = rng.standard_normal((b, w), dtype=np.float32)
  d = rng.standard_normal((n, w), dtype=np.float32)
  flops = 2.0 * b * n * w

  def best(fn):
    fn()
    times = []
    for _ in range(3):
      t0 = time.perf_counter()
      fn()
      times.append(time.perf_counter() - t0)
    return flops / min(times) / 1e9

  rate_np = best(lambda: q @ d.T)
  mm = jax.jit(lambda a, c: jax.numpy.matmul(a, c.T, precision=jax.lax.Precision.HIGHEST))
  qj, dj = jax.device_put(q), jax.device_put(d)
  rate_xla = best(lambda: jax.block_until_ready(mm(qj, dj)))
  return rate_np, rate_xla


def corename() -> str | None:
  """The core name of the OpenBLAS that faiss loaded (after `import faiss`), via ctypes."""
  try:
    with open("/proc/self/maps", encoding="utf-8") as f:
      libs = {line.split()[-1] for line in f if "openblas" in line.lower() and "faiss" in line}
  except OSError:
    return None
  for path in sorted(libs):
    try:
      fn = ctypes.CDLL(path).openblas_get_corename
    except (OSError, AttributeError):
      continue
    fn.restype = ctypes.c_char_p
    return fn().decode()
  return None


def gamma(m: int) -> float:
  """Higham's gamma_m for float32: the worst-case relative error of an m-term inner product."""
  u = 2.0 ** -24
  return m * u / (1.0 - m * u)


def check_float64(search, q: np.ndarray, d: np.ndarray, k: int) -> tuple[bool, str]:
  """FAISS's top-k (`search(q, k) -> (scores, ids)`) vs an exact float64 numpy top-k.

  Returns (ok, text): scores within gamma_w |q| |d| of their float64 values, and ids equal to
  the float64 top-k (as sets) wherever the float64 gap at the k-th place exceeds twice that.
  """
  scores, ids = search(np.ascontiguousarray(q, np.float32), k)
  s = np.asarray(q, np.float64) @ np.asarray(d, np.float64).T
  order = np.argsort(-s, axis=1, kind="stable")[:, :k + 1]
  vals = np.take_along_axis(s, order, axis=1)
  bound = gamma(q.shape[1]) * np.linalg.norm(q, axis=1)[:, None] * np.linalg.norm(d, axis=1)
  got = np.take_along_axis(s, ids, axis=1)
  err = np.abs(np.asarray(scores, np.float64) - got) / np.take_along_axis(bound, ids, axis=1)
  clear = (vals[:, k - 1] - vals[:, k]) > 2 * bound.max(axis=1)
  same = np.array_equal(np.sort(ids[clear], 1), np.sort(order[clear, :k], 1))
  ok = bool(same and err.max() <= 1.0)
  text = (f"{'ok' if ok else 'FAILED'} ({q.shape[0]} queries x {d.shape[0]:,} docs, k {k}: ids "
          f"{'equal' if same else 'DIFFER'} on {int(clear.sum())} queries without near-ties, "
          f"max |score error| = {err.max():.3f} of the float32 bound)")
  return ok, text


def configure(coretype: str = "auto", omp_wait_policy: str = "PASSIVE") -> FaissSetup:
  """Picks FAISS's BLAS core type (module docstring), imports faiss, checks it when forced.

  Args:
    omp_wait_policy: OMP_WAIT_POLICY set before faiss is imported (and for the probes) unless
      the environment already sets one; "" leaves it alone.
    coretype: "auto" (probe; an OPENBLAS_CORETYPE inherited from the environment is one of the
      candidates and is kept unless another is > 5% faster), "default" (unset it: OpenBLAS's
      own detection), or a core type name.
  """
  if importlib.util.find_spec("faiss") is None:
    return FaissSetup(available=False)
  setup = FaissSetup(available=True)
  if omp_wait_policy and "faiss" not in sys.modules:
    os.environ.setdefault("OMP_WAIT_POLICY", omp_wait_policy)
  setup.omp_wait_policy = os.environ.get("OMP_WAIT_POLICY")
  inherited = os.environ.get("OPENBLAS_CORETYPE", "")
  if "faiss" in sys.modules:  # too late to choose: report what it runs with
    chosen = inherited
  elif coretype == "auto":
    for ct in dict.fromkeys((inherited,) + CORETYPES):
      rate = _probe(ct)
      if rate is not None:
        setup.probes[ct or "unset"] = rate
    keep = setup.probes.get(inherited or "unset", 0.0)
    best = max(setup.probes, key=setup.probes.get) if setup.probes else "unset"
    chosen = best if setup.probes.get(best, 0.0) > 1.05 * keep else inherited
    chosen = "" if chosen == "unset" else chosen
  elif coretype == "default":
    chosen = ""
  else:
    chosen = coretype
  if "faiss" not in sys.modules:
    if chosen:
      os.environ["OPENBLAS_CORETYPE"] = chosen
    else:
      os.environ.pop("OPENBLAS_CORETYPE", None)
  import faiss  # pylint: disable=g-import-not-at-top
  setup.coretype = chosen
  setup.corename = corename()
  setup.threads = faiss.omp_get_max_threads()
  setup.version = faiss.__version__
  setup.numpy_gflops, setup.xla_gflops = _gemm_rates()
  if chosen:
    rng = np.random.default_rng(12345)
    q = rng.standard_normal((64, 384), dtype=np.float32)
    d = rng.standard_normal((100_000, 384), dtype=np.float32)
    index = faiss.IndexFlatIP(384)
    index.add(d)
    ok, setup.check = check_float64(index.search, q, d, 10)
    if not ok:
      raise SystemExit(f"FAISS with OPENBLAS_CORETYPE={chosen} fails the float64 check: "
                       f"{setup.check}")
  return setup


def set_blocking(threshold: int, query_bs: int, database_bs: int) -> None:
  """Sets FAISS's brute-force blocking (global cvars)."""
  import faiss  # pylint: disable=g-import-not-at-top
  faiss.cvar.distance_compute_blas_threshold = int(threshold)
  faiss.cvar.distance_compute_blas_query_bs = int(query_bs)
  faiss.cvar.distance_compute_blas_database_bs = int(database_bs)


def blocking_text(setting: tuple[int, int, int], num_queries: int) -> str:
  """Human text of a (threshold, query_bs, database_bs) setting for `num_queries` queries."""
  threshold, qbs, dbs = setting
  if num_queries < threshold:
    return f"SIMD kernel, no BLAS (blas_threshold {threshold} > {num_queries} queries)"
  return f"BLAS blocks query_bs {qbs} x database_bs {dbs} (blas_threshold {threshold})"


def tune_blocking(search, num_queries: int, flops: float, repeats: int = 2
                  ) -> tuple[tuple[int, int, int], dict[str, float]]:
  """Times `search()` over the blocking grid; leaves FAISS set to the fastest setting.

  Args:
    search: a no-argument call of the case's FAISS search.
    num_queries: B (the non-BLAS path is tried for B <= 64).
    flops: 2 B N w, to skip the slow non-BLAS path on big cases.
    repeats: calls per setting (best taken), after one warm-up call.

  Returns:
    (best (threshold, query_bs, database_bs), {setting text: ms}).
  """
  grid = [(DEFAULT_BLOCKING[0], qbs, dbs) for qbs in (1024, 4096)
          for dbs in (1024, 4096, 16384, 65536)]
  if num_queries <= 64 and flops <= 1e11:
    grid.append((num_queries + 1, DEFAULT_BLOCKING[1], DEFAULT_BLOCKING[2]))
  times = {}
  for setting in grid:
    set_blocking(*setting)
    search()
    best = float("inf")
    for _ in range(repeats):
      t0 = time.perf_counter()
      search()
      best = min(best, time.perf_counter() - t0)
    times[setting] = best * 1e3
  chosen = min(times, key=times.get)
  set_blocking(*chosen)
  return chosen, {f"{s[0]}/{s[1]}/{s[2]}": round(v, 2) for s, v in times.items()}
