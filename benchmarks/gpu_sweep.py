"""Where the exact float32 scan's time goes on this device, and which settings are fastest.

    python benchmarks/gpu_sweep.py --out $OUT/sweep             # on the GPU (within --budget-s)
    python benchmarks/gpu_sweep.py --out runs/sweep --scale 0.01 --items 20000 \\
        --torch-device cpu                                      # CPU smoke run (a minute)

Writes ONE `OUT/gpu_sweep.json` (rewritten after every part, so a run stopped at a limit keeps
what it measured) and a short `OUT/gpu_sweep.txt` summary (also printed).

Cases (standard normal float32 data from --seed, drawn on the device; --scale multiplies the doc
counts and the chunk grid):
  q1000_d200000_n384_k10, q32_d1000000_n384_k10 (`exact.topk`, the float32 scan), each with:
  bound       the roofline bound (`timing.roofline`, peaks measured at the start of this run).
  matmul      the bare jitted float32 matmul `qt @ dt.T` of the whole table (writes [B, N]); per
              chunk size, one chunk's matmul x the number of chunks (`one_chunk_x_steps_ms`) and a
              loop of chunk matmuls each reduced to its row maxima (`loop_max_ms`: the matmul plus
              the cheapest consumer of every score, a floor for any selection that reads the
              scores once); and the whole matmul at the other dot algorithms of this jax (3-pass
              TF32 / bf16: NOT float32, informational, with their largest relative error).
  scan_grid   `exact.topk` at each (chunk, block) of the grid, unroll by the device default, and
              at block 32 with the loop unrolled and not (`unroll`); each checked against
              `exact.brute_force` (`same_ids`; where the ids differ, `benchmarks/topk.py`'s
              `id_agreement` in float64: `exact` is true when every differing list is a correct
              top-k up to float32 rounding).
  selection   the scan's selection alone (`exact.select_topk` over the precomputed [B, N] scores:
              block maxima, the running `lax.top_k` over k + chunk / block maxima, the gathers,
              the final top-k; plus reading the scores once) at the default and the fastest grid
              setting, and one `lax.top_k` over all N scores; `fraction_of_scan`.
  variants    exact alternatives of the selection: `two_pass` (pass 1: the block maxima of every
              block, matmul + max, nothing gathered in the loop; one `lax.top_k` of the k best
              blocks; pass 2: the k * block docs of those blocks rescored in float32 and one
              `lax.top_k`); exact up to float32 rounding (the rescoring sums in another order),
              checked as the grid is.
  torch       `torch.topk(q @ d.T)` per chunk (`torch_peer.py`, float32 with TF32 off) at each of
              its chunk sizes; null with the reason where torch has no CUDA device
              (`--torch-device cpu`: the CPU, a smoke test of the peer's code).
profile       a `jax.profiler` trace of 3 calls of each case's default scan (`profile`: q1000;
              `profile_q32`), summarised per device line (GPU streams / XLA ops; on a CPU the
              host threads): the ops or kernels with the most time, their share, and the share
              of matmul-like names (gemm, cublas, cutlass, dot, ...). `time_split` gives the same split from the timed parts (matmul vs the
              rest).
mol           MoL at `benchmarks/mol_topk.py`'s sizes (1M items, P_q = P_x = 4, d_P = 64, 32
              queries, its synthetic generator): brute force at several chunk sizes and split into
              logits / gating MLP / running top-k; TopKAvg(N) (tight_bound False) at several N
              with HR@100 against brute force, split into its stages (the [B, N] mean-logit
              matmul, the top-N `lax.top_k`, the MoL rescoring), the largest N at other steps
              (`--mol-rescore-chunks`: candidates per rescoring step), and TopKAvg with the
              top-N taken by `lax.approx_max_k` (approximate, as TopKAvg itself; HR@100
              reported).

Every sub-measurement runs in try/except (an error is recorded as its string and the sweep goes
on) and only while the time budget (--budget-s, default 220 s, counted from the start, jax
import included) lasts: each case's scan grid within --grid-budget-s (35 s), the scan cases
leaving --mol-reserve-s (50 s) to MoL; what is left is recorded in `skipped`. Order: q1000
(matmul, scan grid, selection, variants, torch), its profile, q32 (the same), MoL. Timing:
`timing.timed_interleaved` (one warm-up call, median of --repeats, `min_ms` the fastest), every
call blocked on.
"""
from __future__ import annotations

import time

START = time.perf_counter()

# pylint: disable=g-import-not-at-top,wrong-import-position,protected-access
import argparse
import functools
import glob
import os
import re
import shutil
import sys
import tempfile
import traceback
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:  # the package from this checkout when PYTHONPATH does not name it
  sys.path.append(REPO)

import mol_topk as mol_bench  # benchmarks/mol_topk.py
import topk as topk_bench  # benchmarks/topk.py (id_agreement)
import torch_peer  # benchmarks/torch_peer.py
from bilinear_ir import allocator, files, scorers, timing
from bilinear_ir.retrieval import exact
from bilinear_ir.retrieval import mol_topk as mol_retrieval

CASES = {"q1000_d200000_n384_k10": (1000, 200_000), "q32_d1000000_n384_k10": (32, 1_000_000)}
CHUNKS = (8192, 32768, 131072, 262144, 1 << 20)
BLOCKS = (32, 128, 1, 512, 8)  # in order of interest (block 1: a running lax.top_k of all)
MAX_UNROLLED_STEPS = 32  # the unroll=True grid points are skipped above this many loop steps
MATMUL_NAMES = re.compile(r"gemm|cublas|cutlass|matmul|dot|sm\d\d_xmma|xmma|wgmma|ynn|eigen",
                          re.IGNORECASE)


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--out", required=True, help="output folder (gpu_sweep.json, gpu_sweep.txt)")
  p.add_argument("--scale", type=float, default=1.0,
                 help="multiply the doc counts and the chunk grid (CPU smoke runs: 0.01)")
  p.add_argument("--budget-s", type=float, default=220.0,
                 help="seconds for the whole sweep; parts past it are recorded as skipped")
  p.add_argument("--grid-budget-s", type=float, default=35.0,
                 help="seconds for each case's scan grid (later grid points are skipped)")
  p.add_argument("--repeats", type=int, default=5, help="timed calls per measurement (median)")
  p.add_argument("--k", type=int, default=10)
  p.add_argument("--dim", type=int, default=384)
  p.add_argument("--cases", default=",".join(CASES), help="comma list of " + ", ".join(CASES))
  p.add_argument("--chunks", default=",".join(map(str, CHUNKS)),
                 help="scan chunk grid (scaled by --scale; chunks >= N collapse to one step)")
  p.add_argument("--blocks", default=",".join(map(str, BLOCKS)), help="scan block grid")
  p.add_argument("--parts", default="matmul,scan,selection,variants,torch,profile,mol",
                 help="comma list of the parts to run")
  p.add_argument("--torch-device", default="cuda", choices=("cuda", "cpu"),
                 help="torch peer device (cuda: only where jax runs on a GPU)")
  p.add_argument("--items", type=int, default=1_000_000, help="MoL items (not scaled)")
  p.add_argument("--mol-p", type=int, default=4, help="MoL P_q = P_x")
  p.add_argument("--mol-batch", type=int, default=32, help="MoL queries")
  p.add_argument("--mol-n", default="1000,2000,4000", help="TopKAvg N grid")
  p.add_argument("--mol-chunks", default="4096,16384,65536", help="MoL brute-force chunk grid")
  p.add_argument("--mol-rescore-chunks", default="512,16384",
                 help="TopKAvg(largest N) at these steps (its rescoring's candidates per step)")
  p.add_argument("--mol-reserve-s", type=float, default=50.0,
                 help="seconds of the budget the scan cases leave for the MoL part")
  p.add_argument("--seed", type=int, default=0)
  return p.parse_args(argv)


def err(e: BaseException) -> str:
  """An exception as one line: its type, message and where it was raised."""
  tb = traceback.extract_tb(e.__traceback__)
  where = f" at {os.path.basename(tb[-1].filename)}:{tb[-1].lineno}" if tb else ""
  return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}{where}"[:500]


def ms_of(fn: Callable[[], Any], repeats: int) -> dict[str, float]:
  """{"ms": median, "min_ms": fastest} of `repeats` timed calls after one warm-up."""
  fastest = {}
  med = timing.timed_interleaved({"f": fn}, repeats, warmup=1, fastest=fastest)["f"]
  return {"ms": round(med, 4), "min_ms": round(fastest["f"], 4)}


class Sweep:
  """The sweep's state: results, the budget and the JSON / text writers."""

  def __init__(self, args):
    self.args = args
    self.out = {"args": vars(args), "hardware": timing.hardware(),
                "device_kind": jax.devices()[0].device_kind, "platform": jax.default_backend(),
                "cases": {}, "skipped": [], "errors": []}
    self.json = os.path.join(args.out, "gpu_sweep.json")
    self.txt = os.path.join(args.out, "gpu_sweep.txt")

  def left(self) -> float:
    return self.args.budget_s - (time.perf_counter() - START)

  def attempt(self, where: str, fn: Callable[[], Any], default=None, reserve: float = 0.0):
    """fn() unless the budget (less `reserve` seconds kept for later parts) is spent (then a
    `skipped` note); an exception is recorded as its string in `errors` and `default` returned."""
    if self.left() <= reserve:
      self.out["skipped"].append(f"{where}: budget of {self.args.budget_s:.0f} s spent")
      print(f"  skipped {where} (budget spent)", flush=True)
      return default
    try:
      return fn()
    except Exception as e:  # pylint: disable=broad-except
      self.out["errors"].append({"where": where, "error": err(e)})
      print(f"  error in {where}: {err(e)}", flush=True)
      return default

  def save(self) -> None:
    self.out["seconds"] = round(time.perf_counter() - START, 1)
    files.atomic_write_json(self.json, self.out)


# ---- the scan cases ------------------------------------------------------------------------------


class Case:
  """One scan case: its tables on the device, the brute-force truth and its results dict."""

  def __init__(self, sweep: Sweep, name: str, b: int, n: int):
    self.sweep, self.args = sweep, sweep.args
    self.name, self.b, self.n, self.w, self.k = name, b, n, sweep.args.dim, sweep.args.k
    key = jax.random.key(self.args.seed + len(sweep.out["cases"]))
    kq, kd = jax.random.split(key)
    self.qt = jax.random.normal(kq, (b, self.w), jnp.float32)
    self.dt = jax.block_until_ready(jax.random.normal(kd, (n, self.w), jnp.float32))
    self.truth = exact.brute_force(self.qt, self.dt, self.k)
    self._host = None
    self.res = sweep.out["cases"].setdefault(name, {"queries": b, "docs": n, "dim": self.w,
                                                    "k": self.k})
    self.chunks = sorted({min(n, max(64, int(round(int(c) * self.args.scale))))
                          for c in self.args.chunks.split(",") if c})
    self.blocks = [int(g) for g in self.args.blocks.split(",") if g]
    self.default_chunk = exact.default_chunk(self.k, b)
    self.default_block = exact.default_block(self.k, self.default_chunk)

  def host(self) -> tuple[np.ndarray, np.ndarray]:
    """The tables on the host (once): (q [B, w], d [N, w])."""
    if self._host is None:
      self._host = (np.asarray(self.qt), np.asarray(self.dt))
    return self._host

  def check(self, res) -> dict:
    """How a TopK (or ids [B, k]) compares with brute force: same_ids, exact, max score diff."""
    ids = np.asarray(res.ids if hasattr(res, "ids") else res)
    truth = np.asarray(self.truth.ids)
    out = {"same_ids": bool(np.array_equal(ids, truth))}
    if hasattr(res, "scores"):
      out["max_abs_score_diff"] = float(np.max(np.abs(np.asarray(res.scores)
                                                       - np.asarray(self.truth.scores))))
    if out["same_ids"]:
      out["exact"] = True
      return out
    q, d = self.host()
    agree = topk_bench.id_agreement(q, d, ids, truth, listed=5)
    out.update(exact=bool(agree["explained"]),
               queries_with_other_ids=agree["queries_with_other_ids"],
               other_ids_checked=len(agree["other_ids"]),
               max_float64_gap_of_other_ids=agree["max_float64_gap_of_other_ids"])
    return out

  def timed_checked(self, fn: Callable[[], Any]) -> dict:
    """Timing of fn plus its check against brute force."""
    return {**ms_of(fn, self.args.repeats), **self.check(fn())}

  # -- parts --

  def bound(self) -> None:
    b, n, w = self.b, self.n, self.w
    self.res["bound"] = timing.roofline(2.0 * b * n * w, 4.0 * (n * w + b * w), "float32",
                                        self.sweep.out["peaks"])

  def matmul(self) -> None:
    qt, dt = self.qt, self.dt
    mm = self.res.setdefault("matmul", {})
    full = jax.jit(lambda q, d: exact._dot(q, d))
    mm["full"] = self.sweep.attempt(f"{self.name} matmul full",
                                    lambda: ms_of(lambda: full(qt, dt), self.args.repeats))
    per_chunk = {}
    for c in self.chunks:
      steps = -(-self.n // c)
      one = jax.jit(lambda q, d: exact._dot(q, d))
      part = dt[:c]
      row = {"steps": steps}
      t = self.sweep.attempt(f"{self.name} matmul one chunk {c}",
                             lambda: ms_of(lambda: one(qt, part), self.args.repeats))
      if t:
        row["one_chunk_ms"] = t["ms"]
        row["one_chunk_x_steps_ms"] = round(t["ms"] * self.n / c, 4)
      loop = _loop_max_fn(c)
      t = self.sweep.attempt(f"{self.name} matmul loop max {c}",
                             lambda: ms_of(lambda: loop(qt, dt), self.args.repeats))
      if t:
        row["loop_max_ms"] = t["ms"]
      per_chunk[c] = row
    mm["per_chunk"] = per_chunk
    algos = {}
    for name in ("TF32_TF32_F32_X3", "BF16_BF16_F32_X3", "TF32_TF32_F32", "BF16_BF16_F32_X6"):
      def one_algo(name=name):
        preset = getattr(lax.DotAlgorithmPreset, name)
        fn = jax.jit(lambda q, d: lax.dot_general(q, d, (((1,), (1,)), ((), ())),
                                                  precision=preset))
        ref = full(qt, dt[:65536])
        got = fn(qt, dt[:65536])
        rel = float(jnp.max(jnp.abs(got - ref)) / jnp.max(jnp.abs(ref)))
        return {**ms_of(lambda: fn(qt, dt), self.args.repeats),
                "max_rel_err_vs_float32": rel, "float32": False}
      algos[name] = self.sweep.attempt(f"{self.name} matmul {name}", one_algo)
    mm["other_algorithms_not_float32"] = algos

  def scan_grid(self) -> None:
    grid = self.res.setdefault("scan_grid", [])
    # In order of interest: the device default, block 32 at every chunk, the other blocks, the
    # loop unrolled and not; the grid stops after --grid-budget-s seconds (the rest skipped).
    points = [(None, None, None)] + [(c, 32, None) for c in self.chunks]
    points += [(c, g, None) for g in self.blocks if g != 32 for c in self.chunks]
    points += [(c, 32, u) for c in self.chunks for u in (True, False)
               if not (u and -(-self.n // c) > MAX_UNROLLED_STEPS)]
    same = (self.default_chunk, self.default_block, None)  # the default, timed first already
    points = [pt for pt in points if pt != same]
    start = time.perf_counter()
    for c, g, u in points:
      if time.perf_counter() - start > self.args.grid_budget_s:
        self.sweep.out["skipped"].append(f"{self.name} scan chunk {c} block {g} unroll {u}: "
                                         f"grid budget of {self.args.grid_budget_s:.0f} s spent")
        continue
      cc = self.default_chunk if c is None else c
      gg = exact.default_block(self.k, cc) if g is None else g
      row = {"chunk": c, "block": g, "unroll": u, "effective_chunk": -(-cc // gg) * gg,
             "effective_block": gg, "steps": -(-self.n // (-(-cc // gg) * gg))}
      if c is None:
        row["setting"] = "device default"
      fn = lambda c=c, g=g, u=u: exact.topk(self.qt, self.dt, self.k, chunk=c, block=g, unroll=u)
      t = self.sweep.attempt(f"{self.name} scan chunk {c} block {g} unroll {u}",
                             lambda fn=fn: self.timed_checked(fn))
      row.update(t or {"failed": True})
      grid.append(row)
      print(f"  {self.name} scan chunk {c} block {g} unroll {u}: {row.get('ms')} ms "
            f"exact {row.get('exact')}", flush=True)
    timed = [r for r in grid if r.get("ms") is not None and r.get("exact")]
    if timed:
      best = min(timed, key=lambda r: r["ms"])
      self.res["scan_best"] = best
      self.res["scan_default"] = grid[0] if grid[0].get("ms") is not None else None

  def selection(self) -> None:
    sel = self.res.setdefault("selection", {})
    s = jax.block_until_ready(exact._dot(self.qt, self.dt))
    settings = [("default", None, None, None)]
    best = self.res.get("scan_best")
    if best:
      settings.append(("best_scan_setting", best["effective_chunk"], best["effective_block"],
                       best["unroll"]))
    for label, c, g, u in settings:
      fn = _select_fn(self.k, c, g, u)
      t = self.sweep.attempt(f"{self.name} selection {label}",
                             lambda fn=fn: self.timed_checked(lambda: fn(s)))
      if t:
        t.update(chunk=c, block=g)
        scan = (self.res.get("scan_default") or {}).get("ms") if c is None else best["ms"]
        if scan:
          t["scan_ms"] = scan
          t["fraction_of_scan"] = round(t["ms"] / scan, 3)
      sel[label] = t
    full = jax.jit(lambda x: lax.top_k(x, self.k))
    sel["lax_top_k_all_scores"] = self.sweep.attempt(
        f"{self.name} selection lax.top_k", lambda: self.timed_checked(
            lambda: exact.TopK(*full(s))))
    del s

  def variants(self) -> None:
    var = self.res.setdefault("variants", {})
    c = self.default_chunk
    for g in (32, 128):
      fn = functools.partial(_two_pass, k=self.k, chunk=c, block=g)
      t = self.sweep.attempt(f"{self.name} two_pass block {g}",
                             lambda fn=fn: self.timed_checked(lambda: fn(self.qt, self.dt)))
      var[f"two_pass_chunk{c}_block{g}"] = t and {**t, "chunk": c, "block": g}
    # the two-pass over the whole table in one matmul
    fn = functools.partial(_two_pass, k=self.k, chunk=self.n, block=32)
    var["two_pass_one_step_block32"] = self.sweep.attempt(
        f"{self.name} two_pass one step", lambda: self.timed_checked(lambda: fn(self.qt,
                                                                                self.dt)))

  def torch(self) -> None:
    torch, device, note = torch_peer.setup(self.args.torch_device)
    if torch is None:
      self.res["torch"] = {"note": f"no torch peer: {note}"}
      return
    q, d = self.host()
    grid = {}
    for c in sorted({min(c, self.n) for c in torch_peer.CHUNKS}):
      fn = torch_peer.topk_fn(torch, device, q, d, self.k, "float32", c)
      t = self.sweep.attempt(f"{self.name} torch chunk {c}",
                             lambda fn=fn: {**ms_of(fn, self.args.repeats),
                                            **self.check(fn().cpu().numpy())})
      grid[c] = t
      del fn
    ok = {c: t for c, t in grid.items() if t}
    self.res["torch"] = {"device": str(device), "dtype": "float32, TF32 off", "grid": grid,
                         "best_chunk": min(ok, key=lambda c: ok[c]["ms"]) if ok else None}


@functools.lru_cache(maxsize=None)
def _loop_max_fn(chunk: int):
  """jit: qt [B, w], dt [N, w] -> [B] row maxima, one chunk matmul of `chunk` rows per step."""
  def run(qt, dt):
    n = dt.shape[0]
    nfull = n // chunk
    acc = jnp.full((qt.shape[0],), -jnp.inf, jnp.float32)
    if nfull:
      step = lambda i, a: jnp.maximum(a, jnp.max(exact._dot(
          qt, lax.dynamic_slice_in_dim(dt, i * chunk, chunk)), axis=1))
      acc = lax.fori_loop(0, nfull, step, acc)
    if n > nfull * chunk:
      acc = jnp.maximum(acc, jnp.max(exact._dot(qt, dt[nfull * chunk:]), axis=1))
    return acc
  return jax.jit(run)


def _select_fn(k: int, chunk: int | None, block: int | None, unroll: bool | None = None):
  """jit: scores [B, N] -> TopK [B, k] by the scan's selection (`exact.select_topk`)."""
  def run(s):
    def scores(start, size, pad):
      cols = s[:, start:start + size] if pad else lax.dynamic_slice_in_dim(s, start, size, 1)
      return jnp.pad(cols, ((0, 0), (0, pad)), constant_values=-jnp.inf) if pad else cols
    return exact.select_topk(scores, s.shape[0], s.shape[1], k, chunk, block, unroll=unroll)
  return jax.jit(run)


@functools.partial(jax.jit, static_argnames=("k", "chunk", "block"))
def _two_pass(qt, dt, k: int, chunk: int, block: int) -> exact.TopK:
  """Exact top-k in two passes: qt [B, w], dt [N, w] -> TopK [B, k].

  Pass 1: the maximum of every block of `block` rows ([B, ceil(N / block)]), `chunk` rows per
  matmul, nothing else kept. Then the k best blocks by (max desc, block id asc) hold the k best
  docs (`exact` module docstring); pass 2 rescores their k * block docs in float32 (gathered
  rows, one batched matmul) and takes one `lax.top_k`, ties to the lower id.
  """
  b, n = qt.shape[0], dt.shape[0]
  g = block
  c = max(g, chunk // g * g)
  nfull = n // c
  parts = []
  if nfull:
    def body(i, acc):
      s = exact._dot(qt, lax.dynamic_slice_in_dim(dt, i * c, c))
      return lax.dynamic_update_slice_in_dim(acc, s.reshape(b, c // g, g).max(2), i * (c // g),
                                             axis=1)
    parts.append(lax.fori_loop(0, nfull, body, jnp.zeros((b, nfull * (c // g)), jnp.float32)))
  rest = n - nfull * c
  if rest:
    s = exact._dot(qt, dt[nfull * c:])
    pad = -rest % g
    s = jnp.pad(s, ((0, 0), (0, pad)), constant_values=-jnp.inf)
    parts.append(s.reshape(b, (rest + pad) // g, g).max(2))
  maxima = jnp.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]
  kb = min(k, maxima.shape[1])
  _, blocks = lax.top_k(maxima, kb)
  blocks = jnp.sort(blocks, axis=1)  # id order: equal scores then rank the lower id first
  rows = (blocks[:, :, None] * g + jnp.arange(g)).reshape(b, kb * g)
  valid = rows < n
  cand = dt[jnp.minimum(rows, n - 1)]  # [B, k g, w]
  s = jnp.einsum("bw,bjw->bj", qt, cand, precision=exact.PRECISION,
                 preferred_element_type=jnp.float32)
  s = jnp.where(valid, s, -jnp.inf)
  top, pos = lax.top_k(s, k)
  return exact.TopK(top, jnp.take_along_axis(rows, pos, axis=1).astype(jnp.int32))


# ---- the profile ---------------------------------------------------------------------------------


def profile(fn: Callable[[], Any], calls: int = 3, top: int = 12) -> dict:
  """A `jax.profiler` trace of `calls` calls of fn (warm), summarised per profiler line: total
  ms, the `top` event names by time with their share, and the share of matmul-like names."""
  jax.block_until_ready(fn())
  tmp = tempfile.mkdtemp(prefix="gpu_sweep_trace_")
  try:
    with jax.profiler.trace(tmp):
      for _ in range(calls):
        jax.block_until_ready(fn())
    found = glob.glob(os.path.join(tmp, "**", "*.xplane.pb"), recursive=True)
    if not found:
      return {"error": "the trace wrote no .xplane.pb"}
    data = jax.profiler.ProfileData.from_file(found[0])
    planes = [p for p in data.planes if p.name.startswith("/device:")]
    if not planes:  # a CPU run: the host threads that run XLA's work
      planes = [p for p in data.planes if p.name == "/host:CPU"]
    lines = []
    for plane in planes:
      for line in plane.lines:
        if line.name in ("python", "Steps") or line.name.startswith("python"):
          continue
        totals: dict[str, float] = {}
        details: dict[str, str] = {}
        for ev in line.events:
          if ev.name.startswith(("end: ", "ThreadpoolListener")):
            continue
          totals[ev.name] = totals.get(ev.name, 0.0) + ev.duration_ns
          if ev.name not in details:  # the HLO text / kernel details the profiler attaches
            details[ev.name] = " ".join(str(v) for key, v in ev.stats
                                        if key in ("long_name", "hlo_op", "kernel_details"))
        whole = sum(totals.values())
        if not whole:
          continue
        matmul = lambda name: bool(MATMUL_NAMES.search(name + " " + details[name]))
        mm = sum(v for name, v in totals.items() if matmul(name))
        lines.append({"plane": plane.name, "line": line.name, "total_ms": round(whole / 1e6, 4),
                      "per_call_ms": round(whole / 1e6 / calls, 4),
                      "matmul_like_fraction": round(mm / whole, 3),
                      "top": [{"name": name[:160], "detail": details[name][:240],
                               "matmul_like": matmul(name), "ms": round(v / 1e6, 4),
                               "fraction": round(v / whole, 3)}
                              for name, v in sorted(totals.items(), key=lambda x: -x[1])[:top]]})
    lines.sort(key=lambda x: -x["total_ms"])
    return {"calls": calls, "lines": lines[:8], "matmul_like_names": MATMUL_NAMES.pattern}
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


# ---- MoL -----------------------------------------------------------------------------------------


def mol_part(sweep: Sweep) -> None:
  """MoL brute force and TopKAvg: times, stage split and settings (module docstring)."""
  args = sweep.args
  res = sweep.out.setdefault("mol", {})
  p, d_p, batch, items, k = args.mol_p, 64, args.mol_batch, args.items, 100
  module = scorers.build("mol", dim=d_p, p_q=p, p_x=p, d_p=d_p, gate_hidden=128,
                         temperature=0.05)
  params = scorers.init_params(module, jax.random.key(args.seed))
  qc, ic = mol_bench.synthetic(items, p, p, d_p, batch, args.seed + 1,
                               clusters=max(1, items // 100))
  index = mol_retrieval.index_from_components(jnp.asarray(ic), p)
  del ic
  src = mol_retrieval.MolSource(jnp.asarray(qc), index, params, module)
  res.update(items=items, p_q=p, p_x=p, d_p=d_p, queries=batch, k=k,
             data=mol_bench.DATA)
  reps = args.repeats
  truth = np.asarray(mol_retrieval.brute_force(src, k).ids)
  hr = lambda ids: mol_bench.hit_rates(np.asarray(ids), truth).get("100")
  brute = {}
  for c in (int(x) for x in args.mol_chunks.split(",") if x):
    brute[c] = sweep.attempt(f"mol brute chunk {c}", lambda c=c: {
        **ms_of(lambda: mol_retrieval.brute_force(src, k, chunk=c), reps),
        "same_ids": bool(np.array_equal(np.asarray(mol_retrieval.brute_force(src, k,
                                                                              chunk=c).ids),
                                        truth))})
  res["brute_force_by_chunk"] = brute
  c0 = mol_retrieval.DEFAULT_CHUNK
  res["brute_force_stages"] = sweep.attempt("mol brute stages", lambda: _brute_stages(src, c0,
                                                                                      reps))
  ns = [int(x) for x in args.mol_n.split(",") if x]
  avg = {}
  for n in ns:
    avg[n] = sweep.attempt(f"mol topk_avg {n}", lambda n=n: {
        **ms_of(lambda: mol_retrieval.topk_avg(src, k, n, tight_bound=False), reps),
        "hr_at_100": hr(mol_retrieval.topk_avg(src, k, n, tight_bound=False).ids)})
  res["topk_avg"] = avg
  n = max(ns)
  by_chunk = {}
  for c in (int(x) for x in args.mol_rescore_chunks.split(",") if x):
    by_chunk[c] = sweep.attempt(f"mol topk_avg {n} chunk {c}", lambda c=c: ms_of(
        lambda: mol_retrieval.topk_avg(src, k, n, tight_bound=False, chunk=c), reps))
  res[f"topk_avg_{n}_by_chunk"] = by_chunk
  res["topk_avg_stages"] = sweep.attempt("mol topk_avg stages",
                                         lambda: _avg_stages(src, k, n, c0, reps, hr))
  bf = (brute.get(c0) or {}).get("ms")
  for n2, t in avg.items():
    if t and bf:
      t["speedup_vs_brute_force"] = round(bf / t["ms"], 2)


def _brute_stages(src, chunk: int, reps: int) -> dict:
  """Brute force split: logits only, logits + gating MLP (phi), and the whole (+ running top-k);
  each a loop over the items consuming every value (a running max)."""
  n = src.num_items

  def loop(value):
    @jax.jit
    def run(src):
      with jax.default_matmul_precision(mol_retrieval.FLOAT32):
        init = jnp.full((src.qc.shape[0],), -jnp.inf, jnp.float32)
        body = lambda acc, start, size: jnp.maximum(acc, value(src, start, size))
        return mol_retrieval._scan_ranges(n, chunk, body, init)
    return run

  logits = loop(lambda s, st, z: jnp.max(s.logits(st, z), axis=(1, 2)))
  phi = loop(lambda s, st, z: jnp.max(s.phi(s.logits(st, z), None), axis=1))
  out = {"chunk": chunk,
         "logits_ms": ms_of(lambda: logits(src), reps)["ms"],
         "logits_and_gating_ms": ms_of(lambda: phi(src), reps)["ms"],
         "brute_force_ms": ms_of(lambda: mol_retrieval.brute_force(src, 100, chunk=chunk),
                                 reps)["ms"]}
  whole = out["brute_force_ms"]
  out["fractions"] = {"logits": round(out["logits_ms"] / whole, 3),
                      "gating_mlp": round((out["logits_and_gating_ms"] - out["logits_ms"])
                                          / whole, 3),
                      "running_topk": round((whole - out["logits_and_gating_ms"]) / whole, 3)}
  return out


def _avg_stages(src, k: int, n: int, chunk: int, reps: int, hr) -> dict:
  """TopKAvg(n) split: the [B, N] mean-logit matmul, the top-n, the MoL rescoring; and the top-n
  by `lax.approx_max_k` (approximate, HR@100 reported)."""
  items = src.num_items
  avg_fn = jax.jit(lambda s: s.avg_scores(0, items))
  top_fn = jax.jit(lambda a: lax.top_k(a, n)[1])
  resc = jax.jit(lambda s, cand: mol_retrieval._rescore(s, cand, k, chunk))
  scores = jax.block_until_ready(avg_fn(src))
  cand = jax.block_until_ready(top_fn(scores))
  out = {"n": n, "avg_matmul_ms": ms_of(lambda: avg_fn(src), reps)["ms"],
         "top_n_ms": ms_of(lambda: top_fn(scores), reps)["ms"],
         "rescore_ms": ms_of(lambda: resc(src, cand), reps)["ms"],
         "topk_avg_ms": ms_of(lambda: mol_retrieval.topk_avg(src, k, n, tight_bound=False),
                              reps)["ms"]}
  whole = out["topk_avg_ms"]
  out["fractions"] = {s: round(out[f"{s}_ms"] / whole, 3)
                      for s in ("avg_matmul", "top_n", "rescore")}

  @jax.jit
  def approx(s):
    _, ids = lax.approx_max_k(s.avg_scores(0, items), n)
    return mol_retrieval._rescore(s, ids, k, chunk)
  try:
    out["approx_max_k_topk_avg"] = {**ms_of(lambda: approx(src), reps),
                                    "hr_at_100": hr(approx(src)[1]), "exact_selection": False}
  except Exception as e:  # pylint: disable=broad-except
    out["approx_max_k_topk_avg"] = {"error": err(e)}
  return out


# ---- summary -------------------------------------------------------------------------------------


def summary(out: dict) -> str:
  """A short text summary of the JSON."""
  lines = [f"gpu_sweep on {out['device_kind']} ({out['platform']}); {out['seconds']} s",
           out.get("peaks_line", "")]
  for name, c in out["cases"].items():
    bound = c.get("bound") or {}
    lines.append(f"\n{name}: bound {bound.get('bound_ms')} ms ({bound.get('bound_limit')})")
    mm = c.get("matmul") or {}
    if mm.get("full"):
      lines.append(f"  bare matmul (whole table): {mm['full']['ms']} ms")
    for ch, row in (mm.get("per_chunk") or {}).items():
      lines.append(f"  chunk {ch} ({row.get('steps')} steps): one chunk x steps "
                   f"{row.get('one_chunk_x_steps_ms')} ms, matmul + row max loop "
                   f"{row.get('loop_max_ms')} ms")
    for algo, t in (mm.get("other_algorithms_not_float32") or {}).items():
      if t:
        lines.append(f"  matmul {algo} (not float32): {t['ms']} ms, rel err "
                     f"{t['max_rel_err_vs_float32']:.1e}")
    d, best = c.get("scan_default"), c.get("scan_best")
    if d:
      lines.append(f"  scan default (chunk {d['effective_chunk']}, block {d['effective_block']}):"
                   f" {d['ms']} ms = {d['ms'] / bound['bound_ms']:.2f}x bound")
    if best:
      lines.append(f"  scan best: chunk {best['chunk']} block {best['block']} unroll "
                   f"{best['unroll']}: {best['ms']} ms = {best['ms'] / bound['bound_ms']:.2f}x "
                   "bound")
    grid = [r for r in c.get("scan_grid", []) if r.get("ms") is not None]
    for g in sorted({r["effective_block"] for r in grid}):
      lines.append(f"  scan ms at block {g} by chunk (unroll default / on / off): " + ", ".join(
          f"{r['effective_chunk']}{'' if r['unroll'] is None else ' u' + str(r['unroll'])[0]}: "
          f"{r['ms']}" for r in grid if r["effective_block"] == g and r["chunk"] is not None))
    bad = [r for r in c.get("scan_grid", []) if r.get("exact") is False]
    if bad:
      lines.append(f"  NOT exact grid points: {[(r['chunk'], r['block']) for r in bad]}")
    for label, t in (c.get("selection") or {}).items():
      if t:
        lines.append(f"  selection alone ({label}): {t['ms']} ms"
                     + (f" = {t['fraction_of_scan']} of the scan" if "fraction_of_scan" in t
                        else "") + f", exact {t.get('exact')}")
    for label, t in (c.get("variants") or {}).items():
      if t:
        lines.append(f"  variant {label}: {t['ms']} ms, exact {t.get('exact')} "
                     f"(same ids {t.get('same_ids')})")
    tr = c.get("torch") or {}
    if tr.get("grid"):
      lines.append("  torch float32 by chunk: " + ", ".join(
          f"{ch}: {t['ms'] if t else 'error'}" for ch, t in tr["grid"].items()))
    elif tr:
      lines.append(f"  torch: {tr.get('note')}")
    split = c.get("time_split")
    if split:
      lines.append(f"  time split (timed parts): {split}")
  for key in [key for key in out if key.startswith("profile")]:
    lines += _profile_lines(key, out[key])
  m = out.get("mol")
  if m:
    lines.append(f"\nMoL {m.get('items')} items, P = {m.get('p_q')}:")
    keys = [key for key in m if key.startswith("topk_avg_") and key.endswith("_by_chunk")]
    for key in ["brute_force_by_chunk", "topk_avg", "brute_force_stages", "topk_avg_stages"] + keys:
      if m.get(key):
        lines.append(f"  {key}: {m[key]}")
  if out["errors"]:
    lines.append(f"\nerrors ({len(out['errors'])}): " + "; ".join(
        f"{e['where']}: {e['error'][:160]}" for e in out["errors"][:10]))
  if out["skipped"]:
    lines.append(f"skipped ({len(out['skipped'])}): " + "; ".join(out["skipped"][:10]))
  return "\n".join(lines) + "\n"


def _profile_lines(key: str, prof: dict | None) -> list[str]:
  """Summary lines of one profile (`profile`): its 3 busiest lines and their top ops."""
  if not prof or not prof.get("lines"):
    return [f"\n{key}: {prof}"]
  case = "q1000" if key == "profile" else key.split("_", 1)[1]
  lines = [f"\nprofile of the default {case} scan ({prof['calls']} calls):"]
  for ln in prof["lines"][:3]:
    lines.append(f"  {ln['plane']} / {ln['line']}: {ln['per_call_ms']} ms per call, "
                 f"matmul-like {ln['matmul_like_fraction']}")
    for t in ln["top"][:6]:
      lines.append(f"    {t['fraction']:.3f} {t['ms']:.3f} ms {t['name'][:70]}"
                   + (f" [{t['detail'][:80]}]" if t.get("detail") else "")
                   + (" (matmul)" if t.get("matmul_like") else ""))
  return lines


def time_split(res: dict) -> dict | None:
  """The default scan's time split from the timed parts: matmul (the matmul + row max loop at
  the default chunk, else one chunk x steps) vs the rest."""
  d = res.get("scan_default")
  if not d:
    return None
  row = (res.get("matmul") or {}).get("per_chunk", {}).get(d["effective_chunk"]) or {}
  mm = row.get("loop_max_ms") or row.get("one_chunk_x_steps_ms") or (
      (res.get("matmul") or {}).get("full") or {}).get("ms")
  if not mm:
    return None
  return {"scan_ms": d["ms"], "matmul_ms": mm, "matmul_fraction": round(mm / d["ms"], 3),
          "rest_fraction": round(1 - mm / d["ms"], 3)}


def main(argv=None) -> int:
  args = parse_args(argv)
  os.makedirs(args.out, exist_ok=True)
  allocator.keep_freed_memory()  # as the benchmarks run
  sweep = Sweep(args)
  parts = set(args.parts.split(","))
  print(sweep.out["hardware"], flush=True)
  peaks = sweep.attempt("peaks", lambda: timing.measure_peaks(3))
  if peaks is None:
    peaks = timing.known_peaks() or {"gb_per_s": 1.0, "f32_gflops": 1.0, "source": "none"}
  sweep.out["peaks"] = peaks
  sweep.out["peaks_line"] = timing.peaks_line({"measured": peaks})
  print(sweep.out["peaks_line"], flush=True)
  sweep.save()
  reserve = args.mol_reserve_s if "mol" in parts else 0.0
  for name in [c for c in args.cases.split(",") if c]:
    if name not in CASES:
      sweep.out["errors"].append({"where": name, "error": f"unknown case; known: {list(CASES)}"})
      continue
    b, n = CASES[name]
    n = max(args.k, int(round(n * args.scale)))
    case = sweep.attempt(f"{name} data", lambda b=b, n=n, name=name: Case(sweep, name, b, n),
                         reserve=reserve)
    if case is None:
      continue
    print(f"{name}: {b} x {n}", flush=True)
    sweep.attempt(f"{name} bound", case.bound)
    for part in ("matmul", "scan", "selection", "variants", "torch"):
      if part in parts:
        method = case.scan_grid if part == "scan" else getattr(case, part)
        sweep.attempt(f"{name} {part}", method, reserve=reserve)
        sweep.save()
    case.res["time_split"] = time_split(case.res)
    if "profile" in parts:  # "profile": the q1000 scan's; "profile_q32": the q32 scan's
      key = "profile" if name.startswith("q1000") else "profile_" + name.split("_")[0]
      sweep.out[key] = sweep.attempt(
          f"profile {name}", lambda case=case: profile(
              lambda: exact.topk(case.qt, case.dt, case.k)), reserve=reserve)
    del case  # free its tables before the next case
    sweep.save()
  if "profile" in parts and "profile" not in sweep.out:
    sweep.out["profile"] = {"note": "the q1000 case did not run"}
  if "mol" in parts:
    sweep.attempt("mol", lambda: mol_part(sweep))
    sweep.save()
  sweep.save()
  try:
    text = summary(sweep.out)
  except Exception as e:  # pylint: disable=broad-except
    text = f"the summary failed ({err(e)}); the results are in {sweep.json}\n"
  files.atomic_write_text(sweep.txt, text)
  print(text, flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
