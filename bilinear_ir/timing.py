"""Timing and the hardware: the line every benchmark prints, interleaved medians, the device's
peaks and roofline bounds, and the timed scoring calls of the LITE latency protocol.

The benchmarks' shared measurement helpers: `hardware` (the line every benchmark prints),
`timed_interleaved`, and the device's peaks, from a table of known accelerators
(`KNOWN_PEAKS`) and measured in the same run (`measure_peaks`: a copy with every core, or a
device copy, and two matmuls), so a benchmark can state its achieved FLOP/s and bandwidth as
fractions of them (`fractions`) and its time against the roofline bound (`roofline`).

Scoring latency of 1 query x K stored docs (the LITE paper's Table 3 protocol): doc-side work is
precomputed, as in the paper: each doc is first put in its scorer's stored form (`encode_docs`
for late interaction, `doc_vectors` for ME-BERT, one pooled vector for DE) in the storage dtype.
A timed call is one jitted function of the raw query input that computes the query side and
scores the K stored docs; query encoder (transformer) time is not included (it is the same for
every scorer). Used by `benchmarks/late_interaction_latency.py` (random inputs) and the
`late_interaction` job (real SciFact tokens and trained params).
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import os
import platform
import statistics
import time
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bilinear_ir import allocator


# Dense peaks of known accelerators (vendor data sheets), matched by a substring of
# `device_kind` (first match wins, so the specific names come first): float32 TFLOP/s as
# `Precision.HIGHEST` runs it (GPUs: the CUDA cores, no TF32; TPUs: 6 bf16 passes, 1/6 of bf16),
# bf16 TFLOP/s (tensor cores / MXU, float32 accumulation) and memory GB/s.
KNOWN_PEAKS = (
    ("H100 PCIe", 51.2, 756.0, 2000.0),
    ("H100 NVL", 60.0, 835.0, 3900.0),
    ("H100", 66.9, 989.0, 3350.0),
    ("H200", 66.9, 989.0, 4800.0),
    ("GH200", 66.9, 989.0, 4000.0),
    ("A100-SXM4-40GB", 19.5, 312.0, 1555.0),
    ("A100-PCIE-40GB", 19.5, 312.0, 1555.0),
    ("A100", 19.5, 312.0, 2039.0),
    ("A10G", 31.2, 70.0, 600.0),
    ("L40S", 91.6, 362.0, 864.0),
    ("L4", 30.3, 121.0, 300.0),
    ("V100", 15.7, 0.0, 900.0),
    ("T4", 8.1, 0.0, 320.0),
    ("TPU v4", 275.0 / 6, 275.0, 1200.0),
    ("TPU v5 lite", 197.0 / 6, 197.0, 819.0),
    ("TPU v5e", 197.0 / 6, 197.0, 819.0),
    ("TPU v5", 459.0 / 6, 459.0, 2765.0),
    ("TPU v6", 918.0 / 6, 918.0, 1640.0),
)


def cpu_model() -> str:
  """The CPU model name (/proc/cpuinfo), else the platform's processor string."""
  cpu = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
  except (OSError, StopIteration):
    pass
  return cpu


def numpy_blas() -> str:
  """numpy's BLAS and, for OpenBLAS, the core type it runs (read through ctypes)."""
  try:
    with open("/proc/self/maps", encoding="utf-8") as f:
      libs = sorted({line.split()[-1] for line in f
                     if "openblas" in line.lower() and "numpy" in line})
  except OSError:
    libs = []
  for path in libs:
    lib = ctypes.CDLL(path)
    for prefix in ("scipy_openblas", "openblas"):
      for suffix in ("64_", ""):
        fn = getattr(lib, f"{prefix}_get_corename{suffix}", None)
        if fn is not None:
          fn.restype = ctypes.c_char_p
          return f"numpy OpenBLAS core {fn().decode()}"
  return "numpy BLAS core unknown"


def hardware() -> str:
  """One line: CPU model, core count, jax backend and devices, allocator setting, and the core
  type numpy's OpenBLAS runs (as loaded, whatever OPENBLAS_CORETYPE says now)."""
  dev = jax.devices()[0]
  return (f"{cpu_model()}; {os.cpu_count()} cores; jax {jax.__version__} {dev.platform} "
          f"({jax.device_count()} x {dev.device_kind}); {allocator.describe()}; {numpy_blas()}")


def known_peaks(device_kind: str | None = None) -> dict[str, float] | None:
  """{"f32_gflops", "bf16_gflops", "gb_per_s"} of `device_kind` (default: device 0) from
  `KNOWN_PEAKS`, or None for a device not in the table (CPUs)."""
  kind = jax.devices()[0].device_kind if device_kind is None else device_kind
  for name, f32, bf16, bw in KNOWN_PEAKS:
    if name.lower() in kind.lower():
      return {"f32_gflops": f32 * 1e3, "bf16_gflops": bf16 * 1e3 or None, "gb_per_s": bw,
              "source": f"table ({name})"}
  return None


def best_s(fn: Callable[[], Any], repeats: int) -> float:
  """Fewest seconds of `repeats` calls of `fn` (each blocked on) after one warm-up call."""
  jax.block_until_ready(fn())
  out = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    out.append(time.perf_counter() - t0)
  return min(out)


def host_copy_gb_per_s(words: int = 1 << 26, repeats: int = 5,
                       threads: int | None = None) -> float:
  """Host memory bandwidth with every core: `threads` (default os.cpu_count()) threads each copy
  one slice of a float32 array into a preallocated one (`np.copyto` releases the GIL, so the
  slices are copied at once); GB/s counts the bytes read plus the bytes written."""
  src = np.ones((words,), np.float32)
  dst = np.zeros_like(src)
  threads = threads or os.cpu_count() or 1
  cuts = np.linspace(0, words, threads + 1).astype(int)
  parts = [(dst[lo:hi], src[lo:hi]) for lo, hi in zip(cuts[:-1], cuts[1:])]
  with concurrent.futures.ThreadPoolExecutor(threads) as pool:
    seconds = best_s(lambda: list(pool.map(lambda ab: np.copyto(*ab), parts)), repeats)
  return 2 * 4 * words / seconds / 1e9


def host_read_gb_per_s(words: int = 1 << 26, repeats: int = 5,
                       threads: int | None = None) -> float:
  """Host read bandwidth with every core: `threads` (default os.cpu_count()) threads each sum one
  slice of a float32 array (numpy's reduction releases the GIL); GB/s counts the bytes read."""
  src = np.random.default_rng(0).random(words, np.float32)  # not zeros (pages touched)
  threads = threads or os.cpu_count() or 1
  cuts = np.linspace(0, words, threads + 1).astype(int)
  parts = [src[lo:hi] for lo, hi in zip(cuts[:-1], cuts[1:])]
  with concurrent.futures.ThreadPoolExecutor(threads) as pool:
    seconds = best_s(lambda: list(pool.map(np.sum, parts)), repeats)
  return 4 * words / seconds / 1e9


def read_probe(words: int) -> tuple[Callable[[], Any], float]:
  """The read-only bandwidth probe as a call a benchmark can time beside its cases: XLA's sum of
  a float32 array of `words` elements on device 0 (`words` ~ the scan's table: the same size
  class of memory traffic): (call, bytes read by one call)."""
  x = jax.random.uniform(jax.random.key(2), (words,), jnp.float32)
  return (lambda: _read(x)), 4.0 * words


def host_to_device_gb_per_s(nbytes: int = 1 << 30, repeats: int = 3) -> float:
  """Host-to-device link bandwidth: `jax.device_put` of a host float32 numpy array of `nbytes`
  (ordinary pageable memory, as a streamed shard is) to device 0, blocked on; the fewest seconds
  of `repeats` puts after one warm-up; GB/s of bytes moved.

  Meant for accelerators (the PCIe / NVLink-C2C link a host-resident stream must cross). On a CPU
  backend `device_put` may alias the host buffer: no link is crossed, and a stream's limit there
  is the memory bandwidth (`measure_peaks`).
  """
  x = np.ones((nbytes // 4,), np.float32)  # pages touched before timing
  dev = jax.devices()[0]
  return 4 * (nbytes // 4) / best_s(lambda: jax.device_put(x, dev), repeats) / 1e9


def stream_bandwidth(peaks: dict[str, Any]) -> dict[str, Any]:
  """The bandwidth a stream of host-resident rows (memory-mapped shards) can reach on device 0:
  on a CPU the memory read bandwidth of `peaks` (`measure_peaks`: a sum with every core or XLA,
  the larger; the copy rate where no read rate was measured); on an accelerator the
  host-to-device link measured now (`host_to_device_gb_per_s`).

  Returns:
    {"gb_per_s", "source": what was measured, "link_gb_per_s": the link (None on a CPU)}.
  """
  if jax.devices()[0].platform == "cpu":
    if peaks.get("read_gb_per_s"):
      return {"gb_per_s": peaks["read_gb_per_s"], "link_gb_per_s": None,
              "source": "host memory: a read (sum) with every core or XLA (timing.measure_peaks)"}
    return {"gb_per_s": peaks["gb_per_s"], "link_gb_per_s": None,
            "source": "host memory: a copy with every core (timing.measure_peaks)"}
  link = host_to_device_gb_per_s()
  return {"gb_per_s": link, "link_gb_per_s": round(link, 2),
          "source": "host-to-device link: jax.device_put of a 1 GiB host array, best of 3"}


def measure_peaks(repeats: int = 5) -> dict[str, Any]:
  """Peaks measured on device 0 now: memory bandwidth and float32 (HIGHEST), float32 operands at
  the backend's default precision (TF32 on GPUs) and bf16 (float32 accumulation) square matmuls;
  best of `repeats` calls each.

  Two bandwidths. `gb_per_s` counts bytes read plus bytes written by a copy: on a CPU the larger
  of a copy by every core at once (`host_copy_gb_per_s`) and XLA's copy (`x * 1`); on an
  accelerator, a device-to-device copy by XLA. `read_gb_per_s`, the bound of every memory-limited
  scan (a scan only reads): a reduction (sum) of a float32 array, by XLA, and on a CPU also by
  every core at once (`host_read_gb_per_s`); on an accelerator also XLA's row sums of a
  [rows, READ_ROW_WIDTH] array shaped like a scan's table and torch's sum of the same bytes on
  the same device where torch has it (`torch_read_gb_per_s`: the hardware's rate, measured by a
  peer); the largest kept, so no memory-bound code of the run can beat it by using other
  threads or another reduction. Sizes: 256 MiB and n = 2,048 on CPU, 1 GiB and n = 8,192 on
  accelerators.

  Returns:
    {"gb_per_s", "read_gb_per_s", "f32_gflops", "bf16_gflops", "default_gflops",
     "source": "measured", "copy": how measured, "read": how measured}.
  """
  cpu = jax.devices()[0].platform == "cpu"
  words, n = (1 << 26, 2048) if cpu else (1 << 28, 8192)
  x = jax.random.uniform(jax.random.key(1), (words,), jnp.float32)  # not zeros (METHOD)
  xla = 2 * 4 * words / best_s(lambda: _copy(x), repeats) / 1e9
  xla_read = 4 * words / best_s(lambda: _read(x), repeats) / 1e9
  del x
  copy = {"xla_gb_per_s": round(xla, 2)}
  read = {"xla_gb_per_s": round(xla_read, 2), "how": "sum of a float32 array"}
  if cpu:
    copy["threads"] = read["threads"] = os.cpu_count()
    copy["all_cores_gb_per_s"] = round(host_copy_gb_per_s(words, repeats), 2)
    read["all_cores_gb_per_s"] = round(host_read_gb_per_s(words, repeats), 2)
  else:
    rows = jax.random.uniform(jax.random.key(3), (words // READ_ROW_WIDTH, READ_ROW_WIDTH),
                              jnp.float32)
    read["xla_rows_gb_per_s"] = round(4 * rows.size / best_s(lambda: _row_sums(rows), repeats)
                                      / 1e9, 2)
    read["xla_rows_how"] = f"row sums of a float32 [{rows.shape[0]}, {READ_ROW_WIDTH}] array"
    del rows
    read["torch_gb_per_s"], read["torch_how"] = torch_read_gb_per_s(words, repeats)
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  f32 = best_s(lambda: _matmul(a, a), repeats)
  default = best_s(lambda: _matmul_default(a, a), repeats)
  b = a.astype(jnp.bfloat16)
  bf16 = best_s(lambda: _matmul(b, b), repeats)
  return {"gb_per_s": max(xla, copy.get("all_cores_gb_per_s", 0.0)),
          "read_gb_per_s": max(xla_read, *(read.get(key) or 0.0 for key in (
              "all_cores_gb_per_s", "xla_rows_gb_per_s", "torch_gb_per_s"))),
          "f32_gflops": 2 * n ** 3 / f32 / 1e9, "bf16_gflops": 2 * n ** 3 / bf16 / 1e9,
          "default_gflops": 2 * n ** 3 / default / 1e9, "source": "measured", "copy": copy,
          "read": read}


_copy = jax.jit(lambda v: v * 1.0)
_read = jax.jit(jnp.sum)
_row_sums = jax.jit(lambda v: jnp.sum(v, axis=1))
READ_ROW_WIDTH = 384  # the row-sum read probe's width: a scan's table at width 384


def torch_read_gb_per_s(words: int, repeats: int = 5) -> tuple[float | None, str]:
  """torch's read rate of the accelerator jax runs on: `torch.sum` of a float32 CUDA tensor of
  `words` elements, synchronized, best of `repeats` after one warm-up; GB/s of bytes read.
  (None, why) where torch is missing or has no CUDA device. The tensor is freed afterwards."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None, "torch is not installed"
  if not torch.cuda.is_available() or jax.devices()[0].platform != "gpu":
    return None, "no CUDA device for torch beside jax's GPU"
  x = torch.rand(words, device="cuda", dtype=torch.float32)

  def run():
    x.sum()
    torch.cuda.synchronize()

  rate = 4 * words / best_s(run, repeats) / 1e9
  del x
  torch.cuda.empty_cache()
  return round(rate, 2), f"torch {torch.__version__} sum of a float32 CUDA tensor"
_matmul = jax.jit(lambda p, q: jnp.matmul(p, q, precision=jax.lax.Precision.HIGHEST,
                                          preferred_element_type=jnp.float32))
# float32 operands at the backend's default precision (CPU: float32; GPU: TF32; TPU: bf16 passes)
_matmul_default = jax.jit(lambda p, q: jnp.matmul(p, q, precision=jax.lax.Precision.DEFAULT))


def peak_probes() -> tuple[dict[str, Callable[[], Any]], float]:
  """The square float32 (HIGHEST), default-precision (TF32 on GPUs) and bf16 matmuls of
  `measure_peaks`, as calls a benchmark can time interleaved with its own (so the peak and the
  case meet the same machine load): ({"peak_f32": call, "peak_default": call, "peak_bf16":
  call}, FLOPs of one call)."""
  n = 2048 if jax.devices()[0].platform == "cpu" else 8192
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  b = a.astype(jnp.bfloat16)
  return {"peak_f32": lambda: _matmul(a, a), "peak_default": lambda: _matmul_default(a, a),
          "peak_bf16": lambda: _matmul(b, b)}, 2.0 * n ** 3


def with_interleaved_peaks(peaks: dict[str, Any], ms: dict[str, float], flops: float,
                           read_bytes: float | None = None) -> dict:
  """`peaks` with each matmul peak raised to the rate of its probe timed in `ms` (the fastest ms
  of "peak_f32" / "peak_bf16" / "peak_default", from `peak_probes`) where that is higher, and the read bandwidth
  to that of "peak_read" (`read_probe`, `read_bytes` per call): the largest rate measured, so the
  roofline bound stays a bound on a machine whose load drifts."""
  out = dict(peaks)
  if read_bytes and ms.get("peak_read"):
    rate = read_bytes / ms["peak_read"] / 1e6
    out["read_gb_per_s"] = max(out.get("read_gb_per_s") or 0.0, rate)
    out["read_gb_per_s_interleaved"] = round(rate, 2)
  for key, probe in (("f32_gflops", "peak_f32"), ("bf16_gflops", "peak_bf16"),
                     ("default_gflops", "peak_default")):
    if ms.get(probe):
      rate = flops / ms[probe] / 1e6
      out[key] = max(out.get(key) or 0.0, rate)
      out[key.replace("gflops", "gflops_interleaved")] = round(rate, 1)
  return out


def roofline(flops: float, bytes_read: float, dtype: str, peaks: dict[str, Any]) -> dict:
  """The least time a computation can take on this device: max(FLOPs / the measured matmul peak
  at `dtype`, bytes that must be read / the measured READ bandwidth), in ms.

  Args:
    flops: floating-point operations the computation must do (2 per multiply-add).
    bytes_read: bytes it must read from memory (each input once, nothing counted twice).
    dtype: the precision its matmuls run at: "float32" (float32 operands, float32 products:
      `Precision.HIGHEST`), "bfloat16" (bf16 operands, float32 accumulation), "default"
      (float32 operands at the backend's default precision: TF32 on GPUs) or "tf32x3" (three
      default-precision passes, the 3xTF32 split: the peak is default_gflops / 3, `flops`
      counting the float32 products as for "float32").
    peaks: `measure_peaks()` (maybe raised by `with_interleaved_peaks`); the bandwidth is its
      `read_gb_per_s` (a reduction: reads only), or its copy rate `gb_per_s` where absent.

  Returns:
    {"bound_ms", "bound_compute_ms", "bound_memory_ms", "bound_limit" ("compute" / "memory"),
     "peak_flops" (FLOP/s), "bandwidth_gbs", "bandwidth_kind" ("read" / "copy")}.
  """
  if dtype not in ("float32", "bfloat16", "default", "tf32x3"):
    raise ValueError(f"dtype must be float32, bfloat16, default or tf32x3, got {dtype!r}")
  key = {"bfloat16": "bf16_gflops", "default": "default_gflops",
         "tf32x3": "default_gflops"}.get(dtype, "f32_gflops")
  peak = (peaks.get(key) or peaks["f32_gflops"]) * 1e9 / (3 if dtype == "tf32x3" else 1)
  kind = "read" if peaks.get("read_gb_per_s") else "copy"
  bandwidth = peaks["read_gb_per_s"] if kind == "read" else peaks["gb_per_s"]
  compute = flops / peak * 1e3
  memory = bytes_read / (bandwidth * 1e9) * 1e3
  return {"bound_ms": round(max(compute, memory), 4), "bound_compute_ms": round(compute, 4),
          "bound_memory_ms": round(memory, 4),
          "bound_limit": "compute" if compute >= memory else "memory",
          "peak_flops": round(peak, -6), "bandwidth_gbs": round(bandwidth, 2),
          "bandwidth_kind": kind}


def fractions(gflops: float, gb_per_s: float, dtype: str, peaks: dict[str, Any]) -> dict:
  """Achieved FLOP/s and bandwidth as fractions of each peak in `peaks` ({"measured": ...,
  "table": ... or None}), for matmuls of `dtype` ("float32" or "bfloat16")."""
  out = {}
  key = "bf16_gflops" if dtype == "bfloat16" else "f32_gflops"
  for name, peak in peaks.items():
    if not peak:
      continue
    if peak.get(key):
      out[f"flops_fraction_of_{name}_peak"] = round(gflops / peak[key], 3)
    if peak.get("gb_per_s"):
      out[f"bandwidth_fraction_of_{name}_peak"] = round(gb_per_s / peak["gb_per_s"], 3)
  return out


def peaks_line(peaks: dict[str, Any]) -> str:
  """One line naming the peaks the fractions refer to."""
  parts = []
  for name, p in peaks.items():
    if p:
      bf = f"{p['bf16_gflops']:.0f}" if p.get("bf16_gflops") else "-"
      how = p.get("copy") or {}
      detail = (f" (XLA copy {how['xla_gb_per_s']:.1f}"
                + (f", {how['threads']} threads {how['all_cores_gb_per_s']:.1f}"
                   if "threads" in how else "") + ")") if how else ""
      probes = {label: (p.get("read") or {}).get(key) for label, key in (
          ("XLA sum", "xla_gb_per_s"), ("XLA row sums", "xla_rows_gb_per_s"),
          ("torch sum", "torch_gb_per_s"), ("all cores", "all_cores_gb_per_s"))}
      probes = ", ".join(f"{label} {v:.1f}" for label, v in probes.items() if v)
      read = (f"read {p['read_gb_per_s']:.1f} GB/s{f' ({probes})' if probes else ''}, "
              if p.get("read_gb_per_s") else "")
      parts.append(f"{name}: {read}copy {p['gb_per_s']:.1f} GB/s{detail}, float32 matmul "
                   f"{p['f32_gflops']:.0f} GFLOP/s, bf16 {bf} GFLOP/s ({p['source']})")
    else:
      parts.append(f"{name}: device not in the table")
  return "peaks: " + "; ".join(parts)


def timed(fn: Callable[[], Any], repeats: int, warmup: int = 3) -> float:
  """Median latency in ms of `repeats` calls of `fn` (each blocked on) after `warmup` calls."""
  return timed_interleaved({"fn": fn}, repeats, warmup)["fn"]


def timed_interleaved(fns: dict[str, Callable[[], Any]], repeats: int, warmup: int = 3,
                      rewarm: int = 0, fastest: dict[str, float] | None = None
                      ) -> dict[str, float]:
  """Median latency in ms of each of `fns`, timed in `repeats` rounds of one timed call each.

  Each function is warmed up `warmup` times first. The order within a round rotates, so a
  machine whose speed drifts during the measurement (shared hosts, thermal limits) favours none
  of the functions compared. `rewarm` untimed calls precede each timed call, so the timed one
  finds its own data in the caches as in back-to-back calls, not evicted by the previous
  function's. Every call is blocked on. `fastest`, if given, receives each function's fastest
  timed call (ms).
  """
  names = list(fns)
  for name in names:
    for _ in range(warmup):
      jax.block_until_ready(fns[name]())
  times = {name: [] for name in names}
  for r in range(repeats):
    for name in names[r % len(names):] + names[:r % len(names)]:
      for _ in range(rewarm):
        jax.block_until_ready(fns[name]())
      t0 = time.perf_counter()
      jax.block_until_ready(fns[name]())
      times[name].append((time.perf_counter() - t0) * 1e3)
  if fastest is not None:
    fastest.update({name: min(v) for name, v in times.items()})
  return {name: statistics.median(v) for name, v in times.items()}


def late_case(module: nn.Module, params: Any, q, qm, d, dm, dtype
              ) -> tuple[Callable[[], jnp.ndarray], int, int]:
  """A late-interaction scorer's timed call on stored docs.

  Args:
    module, params: a `scorers.token_interaction.LateInteraction` scorer and its params.
    q: [1, Tq, n] query tokens; qm: [1, Tq] mask.
    d: [K, Td, n] doc tokens; dm: [K, Td] mask.
    dtype: storage dtype of the stored docs.

  Returns:
    (call -> [1, K] scores, stored tokens per doc L2', stored width P').
  """
  stored, stored_mask = jax.jit(lambda d, dm: module.apply(
      {"params": params}, d, dm, method=module.encode_docs))(d, dm)
  stored = jax.block_until_ready(stored.astype(dtype))

  @jax.jit
  def score(q, qm, stored, stored_mask):
    eq, eqm = module.apply({"params": params}, q, qm, method=module.encode_queries)
    return module.apply({"params": params}, eq, eqm, stored, stored_mask,
                        method=module.score_all_encoded)

  return (lambda: score(q, qm, stored, stored_mask)), stored.shape[1], stored.shape[2]


def mebert_case(module: nn.Module, params: Any, q, qm, d, dm, dtype
                ) -> tuple[Callable[[], jnp.ndarray], int, int]:
  """ME-BERT's timed call on stored doc vectors (shapes as `late_case`).

  Returns:
    (call -> [1, K] scores, m vectors per doc, their width).
  """
  vecs, valid = jax.jit(lambda d, dm: module.apply({"params": params}, d, dm,
                                                   method=module.doc_vectors))(d, dm)
  vecs = jax.block_until_ready(vecs.astype(dtype))

  @jax.jit
  def score(q, qm, vecs, valid):
    qv = module.apply({"params": params}, q, qm, method=module.query_table)
    return module.apply({"params": params}, qv, vecs, valid, method=module.score_all_encoded)

  return (lambda: score(q, qm, vecs, valid)), vecs.shape[1], vecs.shape[2]


def de_case(q, qm, docs, dtype, module: nn.Module | None = None, params: Any = None
            ) -> tuple[Callable[[], jnp.ndarray], int, int]:
  """A dual encoder's timed call: masked mean of the query tokens, then the dot product with the
  stored pooled vectors, or with `module` a table similarity's `score_all` (W, low rank, ...)
  of that mean against them (the table applied at query time; the docs stored as for dot).

  Args:
    q: [1, Tq, n] query tokens; qm: [1, Tq] mask.
    docs: [K, n] pooled doc vectors (stored in `dtype`).
    dtype: storage dtype.
    module, params: a table scorer (`scorers.base`) and its params; None: the dot product.

  Returns:
    (call -> [1, K] scores, 1, n).
  """
  stored = jax.block_until_ready(jnp.asarray(docs).astype(dtype))
  mean = lambda q, qm: jnp.sum(jnp.where(qm[..., None], q, 0), 1) / jnp.sum(qm, 1, keepdims=True)
  if module is None:
    # The dot scorer's score_all (scorers.dot.Dot: one dot_general of the tables' last axes).
    score = jax.jit(lambda q, qm, docs: jax.lax.dot_general(
        mean(q, qm), docs.astype(jnp.float32), (((1,), (1,)), ((), ()))))
  else:
    score = jax.jit(lambda q, qm, docs: module.apply(
        {"params": params}, mean(q, qm), docs.astype(jnp.float32), method=module.score_all))
  return (lambda: score(q, qm, stored)), 1, stored.shape[-1]
