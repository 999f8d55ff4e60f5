"""Exact top-k throughput against FAISS IndexFlatIP, the bare matmul and numpy, on this machine.

    python benchmarks/topk.py                                   # the default cases (minutes)
    python benchmarks/topk.py --scale 0.01 --repeats 2 --json runs/topk.json   # smoke run
    python benchmarks/topk.py --cases q1000_d200000_n384_k10 --queries 100 --docs 50000
    python benchmarks/topk.py --devices 2        # our scans sharded over 2 (fake CPU) devices
    python benchmarks/topk.py --w-path W.npy     # certified case with a trained W [n, n]
    python benchmarks/topk_stream.py             # the 8.8M-doc streamed index (opt-in, separate)

Cases (names as in the JSON; sizes follow --queries/--docs/--dim/--k/--scale when given):
  q1000_d200000_n384_k10          `exact.topk`, the float32 chunked scan.
  bf16cand_q1000_d200000_n384_k10 `certified.bf16_topk`: bf16 candidate scan + float32 rescoring,
                                   certified exact (same ids as the float32 scan).
  bf16_q1000_d200000_n384_k10     `exact.topk` on a bf16 table: approximate; its recall@k against
                                   float32 is reported (half the table memory).
  lowrank32_q1000_d200000_n384_k10 rank-32 tables (`lowrank` scorer, r = 32): the engine
                                   comparison `ratio_vs_faiss` is against FAISS flat over the
                                   same 32-wide tables; `ratio_vs_faiss_full_width` against FAISS
                                   flat over the full 384-wide embeddings (the product claim:
                                   what a rank-32 model saves over searching the embeddings).
  q32_d1000000_n384_k10           few queries, many docs; also vs numpy matmul + argpartition.
  certified_r32_q1000_d200000_n384_k10  `certified.certified_topk` on a random W with spectrum
                                   sigma_i = decay^i (or --w-path) vs the full-W scan; reports the
                                   fraction of docs rescored.
Data: standard normal embeddings from --seed (queries and docs), float32.

The FAISS peer runs in its best configuration on this machine (`faiss_peer.py`): before faiss is
imported, the core type of its bundled OpenBLAS is probed (`--faiss-coretype auto`) against the
machine's best BLAS (numpy and XLA matmuls of the same shapes) and forced when faster, with a
float64 check of FAISS's top-k in the same run; per case, FAISS's brute-force blocking
(`distance_compute_blas_{threshold,query_bs,database_bs}`) is tuned on the case itself and the
fastest setting used (`faiss_setting` in the JSON); its OpenMP threads wait passively
(`OMP_WAIT_POLICY=PASSIVE`, set before faiss loads: with the default spinning, FAISS ran up to 10x
slower whenever anything else used the cores). The hardware line names the core type, the wait
policy, the probe rates and the check's outcome; numpy's BLAS core is named too (numpy's own
kernel is chosen the same way before numpy loads, `blas_setup.py`).
Timing: `time.perf_counter` around the call + `block_until_ready`, one warm-up call, median of
--repeats rounds; in each round every method and peer of the case is called twice, the second
call timed (its data warm in the caches, as in back-to-back calls), in an order that rotates
between rounds (`timing.timed_interleaved`), so a drifting machine speed favours none; tables
(doc tables, bf16 copies, FAISS index) are built before timing.
ratio_vs_faiss = FAISS time / our time (> 1: faster than FAISS); ratio_vs_matmul = our time /
bare jitted matmul `qt @ dt.T` time of the same shapes (a peer, not a bound: it writes the whole
score matrix, which the scan never does).
Roofline bound (`timing.roofline`, the peaks measured in this run: at the start, and the square
matmuls again interleaved with each case's calls (their fastest call), the larger kept, so a
shared machine's load drift cannot make the bound too loose): `bound_ms` = max(2 B N w FLOPs /
the measured matmul peak at the scanned dtype, the table's and queries' bytes / the measured
READ bandwidth: a reduction over as many bytes as the case's table, timed in the same rounds
(`timing.read_probe`; at the start also every core summing at once on a CPU), `bandwidth_kind`
"read": a scan only reads, so a copy rate (read plus write) would make the bound too loose);
`ratio_vs_bound` = our time / bound_ms (`bound_limit` says which term); `peak_flops`,
`bandwidth_gbs`. Torch peer (`torch_peer.py`, on a CUDA device only, `--torch-device`):
`torch.topk(q @ d.T)` over chunks at its best chunk size, float32 with TF32 off and bf16:
`peer_torch_ms`, `ratio_vs_torch` = torch time / ours, `torch_setting`; null with `note` where
it does not run. `--chunks` also times our scan at other chunk sizes (`scan_chunk_ms`;
`default_chunk` is the device's). Where `bf16_topk`'s ids differ from the float32 scan's,
`other_ids` lists each such query's float64 gap and whether both lists are a correct top-k up to
float32 rounding (`explained`: a near-tie, not a bug); `bf16_pays_here` is `certified.bf16_pays`.
Strategies (`--strategies xla,pallas`, `strategy` in every row): "xla" is `exact.topk`'s chunked
scan; "pallas" adds a `pallas_<case>` row beside it for the two float32 plain cases: the fused
Pallas scan-and-select kernel (`retrieval.pallas_topk`, compiled on a GPU, interpret mode
elsewhere), at each tile config of a small sweep (`--tiles`, default `TILE_SWEEP` on a GPU:
`tile_sweep_ms` holds every config's ms, the row the best; each config compiled and its ids
checked before timing, so compile time is excluded; a config that fails to compile is listed
in `tile_errors` and the run goes on), `same_ids_as_fp32` against the XLA scan, explained per
query (`id_agreement`) where they differ. "pallas_blockmax" (`--strategies xla,pallas,
pallas_blockmax`) adds a `pallas_blockmax_<case>` row the same way (`--blockmax-tiles`, its own
sweep): `exact.blockmax_topk`, a Pallas kernel writing each query's maximum per group of G docs,
then the XLA selection; with its kernel alone timed in the same rounds (`kernel_ms`: the dot
and the group maxima; `after_kernel_ms`: the selection and rescoring after it). "tf32x3" and
"tf32x3_pallas" (`--tf32x3-tiles`, `--tf32x3-pallas-tiles`) add `tf32x3_<case>` and
`tf32x3_pallas_<case>` rows the same way: `exact.tf32x3_topk`, 3xTF32 group maxima on tensor
cores (XLA's TF32_TF32_F32_X3 dot, configs "gN": the group, "gN.cC.mM.argmax" with
`tf32x3_topk`'s coarse, groups and selection, `tf32x3_options`; or the Pallas kernel's split)
with the m best groups (2k unless .mM) rescored in float32 and a certificate per query, the
queries it does not certify redone by the float32 scan (`fallback_queries`, at the best config);
their group maxima alone are `kernel_ms`; the table's max|d| is computed once, before timing
(as an index). Their bound (`scan_dtype` "tf32x3") is the roofline at three passes of the
measured default-precision (TF32) matmul peak, or the float32 table read once, whichever is
larger. "tf32" (`--tf32-tiles`, configs as `--tf32x3-tiles`) adds `tf32_<case>` rows the same
way: `exact.tf32x3_topk(passes=1)`, the group maxima from ONE TF32 pass (XLA's TF32_TF32_F32
dot) and the one-pass bound in the certificate; its roofline bound (`scan_dtype` "default") is
one pass of the default-precision peak. Torch float32 with TF32 on is timed beside them as a
labelled reference
(`torch_tf32_ms`, `ratio_vs_torch_tf32`: TF32 scores are not exact, so it is not the peer;
`peer_torch_ms` stays torch with TF32 off).
Each case also reports its achieved GFLOP/s (2 B N w / time; the certified case counts its bound
scan's width r + 1) and table bandwidth (N w bytes / time) and their fractions of the device's
peaks, measured in the same run (a copy and float32 / bf16 matmuls, `timing.measure_peaks`; on a
shared machine a peak measured in a busy moment can make a fraction exceed 1) and, for known
accelerators, from the data-sheet table (`timing.KNOWN_PEAKS`).
"""
from __future__ import annotations

import argparse
import os
import sys


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--cases", default="", help="comma-separated case names (default: all)")
  p.add_argument("--queries", type=int, default=None, help="queries per case (override)")
  p.add_argument("--docs", type=int, default=None, help="docs per case (override)")
  p.add_argument("--dim", type=int, default=None, help="embedding width n (override)")
  p.add_argument("--k", type=int, default=10, help="results per query")
  p.add_argument("--rank", type=int, default=32, help="rank of the low-rank / certified cases")
  p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                 help="table dtype of the plain scan cases")
  p.add_argument("--scale", type=float, default=1.0, help="multiply every doc count (smoke runs)")
  p.add_argument("--devices", type=int, default=1,
                 help="shard our scans over this many devices (CPU: fake devices)")
  p.add_argument("--peers", default="faiss,matmul,numpy,torch",
                 help="peers to time (torch: on a CUDA device only, see --torch-device)")
  p.add_argument("--repeats", type=int, default=5, help="timed runs (median)")
  p.add_argument("--decay", type=float, default=0.7, help="spectrum decay of the certified W")
  p.add_argument("--w-path", default=None, help=".npy W [n, n] for the certified case")
  p.add_argument("--faiss-coretype", default="auto",
                 help="FAISS's OpenBLAS core type: auto (probe), default (its own detection) "
                      "or a name (SkylakeX, Haswell, ...)")
  p.add_argument("--no-faiss-tuning", action="store_true",
                 help="keep FAISS's default blocking instead of tuning it per case")
  p.add_argument("--torch-device", default="cuda", choices=("cuda", "cpu"),
                 help="torch peer device: cuda (only where jax runs on a GPU and torch has CUDA; "
                      "elsewhere null with the reason) or cpu (a smoke test of the peer's code)")
  p.add_argument("--chunks", default="",
                 help="comma list of extra scan chunk sizes to time on the float32 cases "
                      "(`scan_chunk_ms`; the default chunk is the device's, exact.default_chunk)")
  p.add_argument("--selections", default="",
                 help="comma list of the scan's selections to time beside the default "
                      "(top_k,argmax: `scan_selection_ms`; exact.default_selection per device)")
  p.add_argument("--strategies", default="xla",
                 help="comma list: xla (the chunked scan), pallas (the fused Pallas "
                      "scan-and-select kernel), pallas_blockmax (Pallas group maxima + XLA "
                      "selection), tf32x3 / tf32x3_pallas (3xTF32 group maxima by XLA / Pallas "
                      "+ a certificate), tf32 (one TF32 pass by XLA + a certificate): a "
                      "`<strategy>_<case>` row beside the scan's; interpret mode (Pallas) or "
                      "emulated TF32 arithmetic off a GPU")
  p.add_argument("--tiles", default="",
                 help="the pallas strategy's tile configs to sweep, ';'-separated "
                      "tq.td.steps.num_warps.num_stages[.wkN][.insert][.noskip] (default: "
                      "TILE_SWEEP per "
                      "device and query count)")
  p.add_argument("--blockmax-tiles", default="",
                 help="the pallas_blockmax strategy's tile configs, as --tiles with .gN (the "
                      "group of docs per maximum, dividing td; default 16)")
  p.add_argument("--tf32x3-tiles", default="",
                 help="the tf32x3 strategy's (XLA) configs, ';'-separated gN (the group), "
                      "optionally .cN (coarse groups), .mN (groups rescored), .top_k/.argmax")
  p.add_argument("--tf32x3-pallas-tiles", default="",
                 help="the tf32x3_pallas strategy's tile configs, as --blockmax-tiles")
  p.add_argument("--tf32-tiles", default="",
                 help="the tf32 strategy's (one TF32 pass, XLA) configs, as --tf32x3-tiles")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--json", default=None, help="write the results here")
  return p.parse_args(argv)


ARGS = parse_args() if __name__ == "__main__" else None
if ARGS is not None and ARGS.devices > 1 and "XLA_FLAGS" not in os.environ:
  os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={ARGS.devices}"

import blas_setup  # noqa: E402  (benchmarks/blas_setup.py: numpy's BLAS, before numpy loads)

if ARGS is not None:
  blas_setup.choose_numpy_coretype()

# jax is imported after XLA_FLAGS is set (--devices) and numpy's BLAS kernel is chosen.
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import faiss_peer  # noqa: E402  (benchmarks/faiss_peer.py)
import torch_peer  # noqa: E402  (benchmarks/torch_peer.py)
from bilinear_ir import allocator, files, scorers  # noqa: E402
from bilinear_ir import timing  # noqa: E402
from bilinear_ir.retrieval import certified, exact, pallas_topk, sharded  # noqa: E402

# The Pallas kernels' tile sweeps on a GPU (tq.td.steps.num_warps.num_stages[.wkN][.gN]), per
# strategy: few queries (the 32 x 1M case: one query tile, many doc blocks) and many (1,000 x
# 200k: compute-bound tiles). Every config fits the H200's 232,448 bytes of shared memory per
# program (`shared_bytes`): td = 128 or 3 stages read the width in chunks of wk = 64 (or 32)
# columns (round 1: td = 128 at wk = 128 and num_stages = 3 asked for 245,776 to 491,536 bytes
# and failed to compile). ".insert" is the insert merge (`Tiles.insert`) beside the default k
# passes. The model fits the running top-k kernel; `group_maxima` asks for about 3x more (its
# [tq, td/G, G] reshape): on one H200 every "many" blockmax config below failed to compile.
TILE_SWEEP = {
    "pallas": {"few": ("32.64.32.4.2", "32.128.16.4.2.wk64", "32.64.32.4.2.insert"),
               "many": ("64.64.32.4.2", "64.128.16.8.2.wk64")},
    "pallas_blockmax": {
        "few": ("32.64.16.4.2.g16", "32.128.16.8.2.wk64.g32", "16.128.16.4.2.wk64.g16",
                "32.256.8.8.2.wk32.g32"),
        "many": ("64.128.16.8.2.wk64.g16", "128.128.8.8.2.wk64.g32", "128.64.16.8.2.wk64.g16",
                 "128.128.8.8.3.wk32.g32")},
    # 3xTF32 group maxima: XLA (the group only) and the Pallas kernel, mostly with G = td (a
    # row maximum, no reshape); the split doubles the dot operands (`shared_bytes`). The many
    # case keeps G small: the rescoring gathers 2k G rows per query.
    "tf32x3": {"few": ("g32", "g64", "g128"), "many": ("g16", "g32")},
    "tf32x3_pallas": {
        "few": ("32.64.16.4.2.wk64.g64", "32.128.8.8.2.wk32.g128", "32.32.32.4.2.wk64.g32",
                "32.64.16.4.2.wk64.g16"),
        "many": ("64.16.64.4.2.wk64.g16", "64.32.32.4.2.wk64.g32", "128.32.16.8.2.wk32.g32",
                 "64.64.16.4.2.wk64.g16")},
}
# one TF32 pass (its bound 3.75x the three passes'): on one H200 (run 10) the fastest 32 x 1M
# config was g64.c16.m20; at 1,000 x 200k m = 20 sent a query to the float32 scan in every
# config, so more groups there
TILE_SWEEP["tf32"] = {"few": ("g64.c16.m20", "g128.m20.argmax", "g32.m20"),
                      "many": ("g32.m40", "g16.m40", "g32.m20")}
PALLAS_STRATEGIES = tuple(TILE_SWEEP)
# the XLA TF32 strategies: configs "gN[.cN][.mN][.top_k|.argmax]" (`parse_tiles`,
# `tf32x3_options`), no Pallas tiles
XLA_TF32_STRATEGIES = ("tf32", "tf32x3")
TILES_ARG = {"pallas": "tiles", "pallas_blockmax": "blockmax_tiles", "tf32x3": "tf32x3_tiles",
             "tf32x3_pallas": "tf32x3_pallas_tiles",
             "tf32": "tf32_tiles"}  # each strategy's --*-tiles option
SHARED_BYTES = 232_448  # shared memory per program on an H100 / H200 (Triton's limit there)


def shared_bytes(tiles: pallas_topk.Tiles) -> int:
  """The shared memory a Pallas scan program asks Triton for, as round 1's compile errors on
  one H200 fit it: 1.5 x the pipelined dot operands, (tq + td) wk 4 bytes per stage (32.128.16
  at wk 128, 2 stages: 245,760 + 16 requested); twice that with `tf32x3` (hi and lo operands;
  a guess until a device run)."""
  per_stage = 1.5 * (tiles.tq + tiles.td) * tiles.wk * 4 * (2 if tiles.tf32x3 else 1)
  return int(per_stage * (tiles.num_stages or 2))


def parse_tiles(text: str, width: int, tf32x3: bool = False) -> pallas_topk.Tiles:
  """"tq.td.steps.num_warps.num_stages[.wkN][.gN][.insert][.noskip]" -> `pallas_topk.Tiles`:
  wkN the width chunk (default the power of two >= w, at most 128), gN blockmax's group (default
  16), insert: the insert merge (`insert=True`) instead of k passes per step, noskip: the k
  passes without their skip; "gN" alone: the default tiles with group N (the XLA 3xTF32
  strategy's config; `tf32x3_options` reads its other parts). `tf32x3`: the kernel's 3xTF32
  mode."""
  if text.startswith("g"):
    return pallas_topk.default_tiles(1, width)._replace(group=int(text.split(".")[0][1:]),
                                                        tf32x3=tf32x3)
  parts = text.split(".")
  tq, td, steps, warps, stages = (int(x) for x in parts[:5])
  extra = parts[5:]
  wk = next((int(x[2:]) for x in extra if x.startswith("wk")),
            int(min(128, pallas_topk.next_pow2(width))))
  group = next((int(x[1:]) for x in extra if x.startswith("g")), 16)
  return pallas_topk.Tiles(tq=tq, td=td, steps=steps, wk=wk, num_warps=warps,
                           num_stages=stages, skip="noskip" not in extra, group=group,
                           insert="insert" in extra, tf32x3=tf32x3)


def tf32x3_options(text: str) -> dict:
  """`exact.tf32x3_topk`'s options in a 3xTF32 config's parts (after "gN" or the tiles): ".cN"
  coarse groups of N groups, ".mN" m = N groups rescored, ".top_k" / ".argmax" the selection;
  e.g. "g32.c32.m12.argmax" -> {"coarse": 32, "groups": 12, "selection": "argmax"} (absent
  parts: the defaults)."""
  out = {}
  for part in text.split(".")[1:]:
    if part in exact.SELECTIONS:
      out["selection"] = part
    elif part[:1] in ("c", "m") and part[1:].isdigit():
      out["coarse" if part[0] == "c" else "groups"] = int(part[1:])
  return out


def tf32_on(torch, fn):
  """fn run with torch's float32 matmuls at TF32 (`allow_tf32`), switched off again after each
  call (the torch peer's setting, `torch_peer.setup`)."""
  def run(*args, **kwargs):
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
      return fn(*args, **kwargs)
    finally:
      torch.backends.cuda.matmul.allow_tf32 = False
  return run


def hardware(setup: faiss_peer.FaissSetup | None) -> str:
  """One line: the machine (timing.hardware) and FAISS's configuration and check."""
  return (f"{timing.hardware()}; {blas_setup.describe()}; "
          + (setup.describe() if setup else "faiss not used"))


def certificate(rescored, num_docs: int) -> dict:
  """What `bf16_topk` rescored: queries that fell back to the float32 scan (rescored == N) and
  the mean candidates rescored by the others."""
  rescored = np.asarray(rescored)
  fell = rescored == num_docs
  rest = rescored[~fell]
  return {"fell_back_queries": int(fell.sum()),
          "mean_rescored_others": round(float(rest.mean()), 2) if rest.size else None}


def id_agreement(queries, docs, ids, truth_ids, listed: int = 20) -> dict:
  """Where two exact top-k lists differ (ids [B, k] each, e.g. bf16_topk vs the float32 scan).

  Both methods claim the float32 top-k, so two lists may differ only where float32 rounding can
  reorder docs: near-ties. For each query whose lists differ (order included; the first `listed`
  of them), in float64: `gap`, the largest difference between the two lists' sorted scores; the
  float32 rounding bound of one score, `rounding` = 2 w u max|q.d| terms (u = 2^-24: w products
  and sums of |q_i d_i| <= |q| max|d|); and for each list whether it is a correct top-k up to
  that rounding: its lowest float64 score >= the true float64 k-th score - 2 `rounding`.
  `explained` is True when every listed query differs only by such near-ties (both lists
  correct), i.e. the difference is float32 summation order, not a bug.

  Args:
    queries: [B, w]; docs: [N, w]; ids, truth_ids: [B, k].

  Returns:
    {"queries_with_other_ids", "max_float64_gap_of_other_ids", "other_ids": [{"query", "gap",
     "rounding", "ours_correct", "fp32_correct"}], "explained"}.
  """
  ids, truth_ids = np.asarray(ids), np.asarray(truth_ids)
  rows = np.flatnonzero((ids != truth_ids).any(axis=1))
  if not rows.size:
    return {"queries_with_other_ids": 0, "max_float64_gap_of_other_ids": None, "other_ids": [],
            "explained": True}
  d = np.asarray(docs)  # one copy to the host
  k, w = ids.shape[1], d.shape[1]
  max_norm = float(np.sqrt(np.max(np.sum(np.square(d, dtype=np.float64), axis=1))))
  listed_rows = []
  gaps = []
  for r in rows:
    q = np.asarray(queries[r], np.float64)
    score = lambda i, q=q: np.sort(d[i].astype(np.float64) @ q)[::-1]
    gap = float(np.max(np.abs(score(ids[r]) - score(truth_ids[r]))))
    gaps.append(gap)
    if len(listed_rows) >= listed:
      continue
    every = np.concatenate([d[lo:lo + 65536].astype(np.float64) @ q
                            for lo in range(0, d.shape[0], 65536)])
    kth = float(np.partition(every, -k)[-k])
    rounding = 2.0 * w * 2.0 ** -24 * float(np.linalg.norm(q)) * max_norm
    ok = lambda i, kth=kth, rounding=rounding, every=every: bool(
        every[i].min() >= kth - 2 * rounding)
    listed_rows.append({"query": int(r), "gap": gap, "rounding": rounding,
                        "ours_correct": ok(ids[r]), "fp32_correct": ok(truth_ids[r])})
  return {"queries_with_other_ids": int(rows.size), "max_float64_gap_of_other_ids": max(gaps),
          "other_ids": listed_rows,
          "explained": all(x["ours_correct"] and x["fp32_correct"] for x in listed_rows)}


def recall(found, truth) -> float:
  """Mean |found_i & truth_i| / k over queries: ids [B, k] each."""
  found, truth = np.asarray(found), np.asarray(truth)
  return float(np.mean([len(set(f) & set(t)) / truth.shape[1] for f, t in zip(found, truth)]))


class Runner:
  """Times our method and the peers on one case and prints a line."""

  def __init__(self, args, peaks: dict):
    self.args = args
    self.peers = {p for p in args.peers.split(",") if p}
    self.torch, self.torch_device, self.torch_note = (
        torch_peer.setup(args.torch_device) if "torch" in self.peers
        else (None, None, "torch peer not requested (--peers)"))
    self.torch_settings = {}
    self.rng = np.random.default_rng(args.seed)
    self.mesh = sharded.doc_mesh(args.devices) if args.devices > 1 else None
    self.cases = []
    self.peaks = peaks
    self.case_peaks = peaks["measured"]  # raised per case by time_all
    # The bare matmul at the scan's precision (float32 on every backend).
    self._mm = jax.jit(lambda a, b: jnp.matmul(a, b.T, precision=exact.PRECISION,
                                               preferred_element_type=jnp.float32))
    self.faiss_settings = {}

  def data(self, b: int, n: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    return (self.rng.standard_normal((b, w), dtype=np.float32),
            self.rng.standard_normal((n, w), dtype=np.float32))

  def scan(self, qt, dt, k):
    """Our exact scan: one device, or sharded over --devices."""
    if self.mesh is None:
      return lambda: exact.topk(qt, dt, k)
    placed = sharded.shard_rows(dt, self.mesh)
    n = dt.shape[0]
    return lambda: sharded.sharded_topk(qt, placed, k, mesh=self.mesh, num_docs=n)

  def faiss_fn(self, q: np.ndarray, d: np.ndarray, k: int, name: str = "faiss"):
    """FAISS IndexFlatIP over d [N, w] searched with q [B, w] (built here, untimed), its blocking
    tuned on this case (unless --no-faiss-tuning); the call sets that blocking, then searches."""
    import faiss  # pylint: disable=g-import-not-at-top
    index = faiss.IndexFlatIP(d.shape[1])
    index.add(np.ascontiguousarray(d, np.float32))
    qc = np.ascontiguousarray(q, np.float32)
    b = qc.shape[0]
    if self.args.no_faiss_tuning:
      setting, grid = faiss_peer.DEFAULT_BLOCKING, None
    else:
      setting, grid = faiss_peer.tune_blocking(lambda: index.search(qc, k), b,
                                               2.0 * b * d.shape[0] * d.shape[1])
    text = faiss_peer.blocking_text(setting, b)
    self.faiss_settings[name] = {"setting": text, "grid_ms": grid}
    print(f"  {name}: {text}" + (f" (tuning, ms by threshold/query_bs/database_bs: {grid})"
                                 if grid else " (defaults)"), flush=True)

    def search():
      faiss_peer.set_blocking(*setting)
      return index.search(qc, k)
    return search

  def peers_of(self, q: np.ndarray, d: np.ndarray, qt, dt, k: int) -> dict:
    """The selected peers' timed calls: FAISS IndexFlatIP over d [N, n] searched with q [B, n]
    (`faiss_fn`), the bare jitted matmul of qt [B, w] and dt [N, w]."""
    fns = {}
    self.faiss_settings = {}
    if "faiss" in self.peers:
      fns["faiss"] = self.faiss_fn(q, d, k)
    if "matmul" in self.peers:
      fns["matmul"] = lambda: self._mm(qt, dt)
    return fns

  def torch_fn(self, q: np.ndarray, d: np.ndarray, k: int, dtype: str, fns: dict,
               name: str = "torch", tf32: bool = False) -> None:
    """Adds torch's `torch.topk(q @ d.T)` over d [N, w] at its best chunk size (q [B, w]) to
    `fns` as `name`, where the torch peer runs (`torch_peer.setup`); `tf32`: float32 matmuls
    with TF32 on (tuned and timed so, then off again: a reference, not the exact peer)."""
    if self.torch is None:
      return
    wrap = (lambda fn: tf32_on(self.torch, fn)) if tf32 else (lambda fn: fn)
    chunk, grid = wrap(torch_peer.best_chunk)(self.torch, self.torch_device, q, d, k, dtype)
    self.torch_settings[name] = {"chunk": chunk, "grid_ms": grid, "dtype": dtype,
                                 "allow_tf32": tf32}
    print(f"  {name}: {dtype}{' (TF32 on)' if tf32 else ''} on {self.torch_device}, chunk "
          f"{chunk} (ms by chunk: {grid})", flush=True)
    fns[name] = wrap(torch_peer.topk_fn(self.torch, self.torch_device, q, d, k, dtype, chunk))

  def torch_tf32_fn(self, q: np.ndarray, d: np.ndarray, k: int, fns: dict) -> None:
    """torch float32 with TF32 on as `torch_tf32`, where a TF32 strategy is timed."""
    if any(s in exact.TF32_PASSES for s in self.args.strategies.split(",")):
      self.torch_fn(q, d, k, "float32", fns, name="torch_tf32", tf32=True)

  def chunk_variants(self, qt, dt, k: int, fns: dict) -> None:
    """Adds our scan at each `--chunks` size to `fns` as `scan_c<chunk>`, and with each
    `--selections` way of selecting as `scan_sel_<selection>`."""
    for c in (int(x) for x in self.args.chunks.split(",") if x):
      fns[f"scan_c{c}"] = lambda c=c: exact.topk(qt, dt, k, chunk=c)
    for sel in (x for x in self.args.selections.split(",") if x):
      fns[f"scan_sel_{sel}"] = lambda sel=sel: exact.topk(qt, dt, k, selection=sel)

  @staticmethod
  def selection_ms(ms: dict, k: int) -> dict:
    """{"default": exact.default_selection(k), SELECTION: ms, ...} of the `--selections` runs,
    or {} when none ran."""
    out = {name[9:]: round(v, 3) for name, v in ms.items() if name.startswith("scan_sel_")}
    return {"default": exact.default_selection(k), **out} if out else {}

  def time_all(self, fns: dict, table_bytes: float) -> dict:
    """Median ms of every call, timed interleaved, each timed call after an untimed one; None for
    peers not selected. The float32 and bf16 peak probes (`timing.peak_probes`) and the
    read-only bandwidth probe over as many bytes as the case's table (`timing.read_probe`) are
    timed in the same rounds, and the bound of the cases recorded next uses the larger of each
    peak measured at the start and here (`self.case_peaks`)."""
    probes, flops = timing.peak_probes()
    probes["peak_read"], read_bytes = timing.read_probe(int(table_bytes // 4))
    fastest = {}
    ms = timing.timed_interleaved(fns | probes, self.args.repeats, warmup=1, rewarm=1,
                                  fastest=fastest)
    self.case_peaks = timing.with_interleaved_peaks(self.peaks["measured"], fastest, flops,
                                                    read_bytes)
    return {name: ms.get(name) for name in ("faiss", "matmul", "numpy")} | ms

  def pallas_variants(self, qj, dj, k: int, truth, fns: dict) -> dict:
    """Adds each Pallas or 3xTF32 strategy of --strategies (`PALLAS_STRATEGIES`) at each tile
    config to `fns` as `<strategy>@<config>` (its `--*-tiles` option, else TILE_SWEEP on a
    GPU, the default tiles off it), and for the group-maxima strategies (all but pallas) the
    maxima alone (no selection after them) as `<strategy>_kernel@<config>`. Each config is run
    once first (compiled: compile time is not timed) and checked against the float32 scan's
    ids `truth`; a config that fails is left out and its error kept. The TF32 strategies
    get the table's max|d| computed once here, and their fallback count per config.
    Returns {strategy: {"configs": {config: same_ids}, "errors": {config: error},
    "fallback": {config: queries that fell back}}}."""
    b, w = qj.shape
    out = {}
    interpret = pallas_topk.interpret_default()
    norm = exact.max_doc_norm(dj)
    for strategy in (s for s in self.args.strategies.split(",") if s in PALLAS_STRATEGIES):
      given = getattr(self.args, TILES_ARG[strategy])
      is_tf32 = strategy in exact.TF32_PASSES
      if given:
        configs = [c for c in given.split(";") if c]
      elif jax.default_backend() == "gpu":
        configs = list(TILE_SWEEP[strategy]["few" if b <= 64 else "many"])
      elif strategy in XLA_TF32_STRATEGIES:
        configs = ["g16"]
      else:
        t = pallas_topk.default_tiles(b, w)
        configs = [f"{t.tq}.{t.td}.{t.steps}.{t.num_warps}.{t.num_stages}.g{t.group}"]
      found = out[strategy] = {"configs": {}, "errors": {}, "fallback": {}}
      for cfg in configs:
        tiles = parse_tiles(cfg, w, tf32x3=strategy == "tf32x3_pallas")
        if is_tf32:
          call = lambda tiles=tiles, s=strategy, o=tf32x3_options(cfg): exact.tf32x3_topk(
              qj, dj, k, tiles, pallas=s == "tf32x3_pallas", doc_norm=norm,
              passes=exact.TF32_PASSES[s], **o)
          fn = lambda call=call: call()[0]
        else:
          fn = lambda tiles=tiles, s=strategy: exact.topk(qj, dj, k, strategy=s, tiles=tiles)
        try:
          if is_tf32:
            res, found["fallback"][cfg] = call()
          else:
            res = jax.block_until_ready(fn())
          if strategy in XLA_TF32_STRATEGIES:
            maxima = jax.jit(lambda q, d, g=tiles.group, p=exact.TF32_PASSES[strategy]:
                             exact.tf32x3_group_maxima(q, d, g, interpret, p))
            kernel = lambda maxima=maxima: maxima(qj, dj)
          elif strategy != "pallas":
            kernel = lambda tiles=tiles: pallas_topk.group_maxima(qj, dj, tiles, interpret)
          if strategy != "pallas":
            jax.block_until_ready(kernel())
            fns[f"{strategy}_kernel@{cfg}"] = kernel
        except Exception as e:  # pylint: disable=broad-except  (recorded; the run goes on)
          found["errors"][cfg] = f"{type(e).__name__}: {str(e)[:400]}"
          found["fallback"].pop(cfg, None)
          print(f"  {strategy} {cfg}: FAILED {found['errors'][cfg]}", flush=True)
          continue
        found["configs"][cfg] = bool(np.array_equal(np.asarray(res.ids), np.asarray(truth.ids)))
        fns[f"{strategy}@{cfg}"] = fn
    return out

  def record_pallas(self, tag, b, n, w, k, ms, truth, qj, dj, sweeps, torch_ms):
    """Per Pallas / 3xTF32 strategy, the `<strategy>_<tag>` row: the best tile config's time
    (`tile_sweep_ms`: every config), its ids against the float32 scan's (`same_ids_as_fp32`,
    explained per query by `id_agreement`); for the group-maxima strategies also the maxima
    alone at the best config (`kernel_ms`: the scores and the group maxima; `after_kernel_ms`
    = ms - kernel_ms: the selection and rescoring after them, and for 3xTF32 the certificate
    and any fallback; `kernel_sweep_ms`: every config's; `kernel_ratio_vs_bound`); for 3xTF32
    `fallback_queries` at the best config, its bound at three TF32 passes (`scan_dtype`
    "tf32x3"; tf32: one pass, "default") and torch with TF32 on (`torch_tf32_ms`, a
    reference); a row with `error` when no config ran."""
    methods = {
        "pallas": "fused Pallas scan-and-select",
        "pallas_blockmax": "Pallas group maxima + XLA selection of the k best groups, rescored",
        "tf32x3": "3xTF32 group maxima (XLA TF32_TF32_F32_X3) + the m best groups rescored "
                  "in float32 + a certificate, fallback to the float32 scan",
        "tf32x3_pallas": "3xTF32 group maxima (Pallas kernel) + the m best groups rescored "
                         "in float32 + a certificate, fallback to the float32 scan",
        "tf32": "one-pass TF32 group maxima (XLA TF32_TF32_F32) + the m best groups rescored "
                "in float32 + a certificate, fallback to the float32 scan"}
    for strategy, sweep in sweeps.items():
      name = f"{strategy}_{tag}"
      times = {c: round(ms[f"{strategy}@{c}"], 3) for c in sweep["configs"]}
      if not times:
        self.cases.append({"name": name, "strategy": strategy, "queries": b, "docs": n,
                           "dim": w, "k": k, "ms": None, "error": sweep["errors"],
                           "tile_sweep_ms": {}})
        print(f"{name}: every tile config failed: {sweep['errors']}", flush=True)
        continue
      best = min(times, key=times.get)
      is_tf32 = strategy in exact.TF32_PASSES
      passes = exact.TF32_PASSES.get(strategy)
      tiles = parse_tiles(best, w, tf32x3=strategy == "tf32x3_pallas")
      res = (exact.tf32x3_topk(qj, dj, k, tiles, pallas=strategy == "tf32x3_pallas",
                               passes=passes, **tf32x3_options(best))[0] if is_tf32
             else exact.topk(qj, dj, k, strategy=strategy, tiles=tiles))
      extra = {}
      if strategy != "pallas":
        kernel = {c: round(ms[f"{strategy}_kernel@{c}"], 3) for c in sweep["configs"]}
        extra = {"kernel_ms": kernel[best],
                 "after_kernel_ms": round(ms[f"{strategy}@{best}"] - kernel[best], 3),
                 "kernel_sweep_ms": kernel}
      if is_tf32:
        tf32_ms = ms.get("torch_tf32")
        extra |= {"fallback_queries": sweep["fallback"][best],
                  "fallback_by_config": sweep["fallback"],
                  "bound_relative": exact.tf32x3_relative_bound(w, passes=passes),
                  "torch_tf32_ms": tf32_ms and round(tf32_ms, 3),
                  "ratio_vs_torch_tf32": round(tf32_ms / ms[f"{strategy}@{best}"], 3)
                  if tf32_ms else None,
                  "torch_tf32_note": "torch float32 with TF32 on: a reference, not exact, "
                                     "not the peer"}
      row = self.record(
          name, b, n, w, k, "float32", ms[f"{strategy}@{best}"], ms["faiss"], ms["matmul"],
          f"exact.topk(strategy={strategy!r}): {methods[strategy]}",
          scan_dtype={1: "default", 3: "tf32x3"}.get(passes),
          torch_ms=torch_ms, strategy=strategy, tiles=best, tile_sweep_ms=times,
          tile_errors=sweep["errors"], interpret=pallas_topk.interpret_default(),
          same_ids_as_fp32=bool(np.array_equal(np.asarray(res.ids), np.asarray(truth.ids))),
          **extra, **id_agreement(qj, dj, res.ids, truth.ids))
      if "kernel_ms" in extra:
        row["kernel_ratio_vs_bound"] = round(extra["kernel_ms"] / row["bound_ms"], 3)
        print(f"  {name}: group maxima alone {extra['kernel_ms']:.3f} ms "
              f"(ratio_vs_bound {row['kernel_ratio_vs_bound']}); selection after "
              f"{extra['after_kernel_ms']:.3f} ms", flush=True)

  def record(self, name, b, n, w, k, dtype, ms, faiss_ms, matmul_ms, method, scan_dtype=None,
             faiss_key="faiss", scan_width=None, torch_ms=None, torch_key="torch",
             chunk_ms=None, **extra):
    """Prints and keeps one case; `scan_dtype`: the dtype of the scanned table (FLOP/s, bytes and
    the bound's peak; default `dtype`); `faiss_key`: which FAISS peer's setting `ratio_vs_faiss`
    refers to; `scan_width`: the width of the table scanned (FLOP/s and bytes; default w);
    `torch_ms`: the torch peer's time (`torch_key`: its setting); `chunk_ms`: our times at the
    `--chunks` sizes.

    The roofline bound (`timing.roofline`, peaks measured in this run): 2 B N w FLOPs at the
    scanned dtype's matmul peak, and the bytes of the scanned table plus the queries read once.
    """
    scan_dtype = scan_dtype or dtype
    sw = scan_width or w
    gflops = 2.0 * b * n * sw / ms / 1e6
    table_bytes = n * sw * (2 if scan_dtype == "bfloat16" else 4)
    gbs = table_bytes / ms / 1e6
    bound = timing.roofline(2.0 * b * n * sw, table_bytes + 4.0 * b * w, scan_dtype,
                            self.case_peaks)
    bound["peaks_interleaved_gflops"] = {
        k: self.case_peaks.get(k) for k in ("f32_gflops_interleaved", "bf16_gflops_interleaved",
                                            "default_gflops_interleaved")}
    torch_setting = self.torch_settings.get(torch_key)
    case = {"name": name, "queries": b, "docs": n, "dim": w, "k": k, "dtype": dtype,
            "ms": round(ms, 3), "qps": round(1e3 * b / ms, 1),
            "ratio_vs_faiss": round(faiss_ms / ms, 3) if faiss_ms else None,
            "ratio_vs_matmul": round(ms / matmul_ms, 3) if matmul_ms else None,
            "method": method, "faiss_ms": faiss_ms and round(faiss_ms, 3),
            "matmul_ms": matmul_ms and round(matmul_ms, 3),
            "faiss_setting": (self.faiss_settings.get(faiss_key) or {}).get("setting"),
            "gflops": round(gflops, 1), "table_gb_per_s": round(gbs, 2),
            **timing.fractions(gflops, gbs, scan_dtype, self.peaks),
            **bound, "ratio_vs_bound": round(ms / bound["bound_ms"], 3),
            "peer_torch_ms": torch_ms and round(torch_ms, 3),
            "ratio_vs_torch": round(torch_ms / ms, 3) if torch_ms else None,
            "torch_setting": torch_setting,
            "note": None if torch_ms else f"no torch peer: {self.torch_note or 'not timed'}",
            **({"scan_chunk_ms": {c: round(v, 3) for c, v in chunk_ms.items()}}
               if chunk_ms else {}),
            "default_chunk": exact.default_chunk(k, b),
            **({"strategy": "xla"} if "strategy" not in extra else {}), **extra}
    self.cases.append(case)
    more = " ".join(f"{key}={val}" for key, val in extra.items())
    print(f"{name:42s} {ms:9.1f} ms {case['qps']:10.1f} q/s  bound {bound['bound_ms']:.1f} ms "
          f"({bound['bound_limit']}) ratio_vs_bound {case['ratio_vs_bound']}  vs faiss "
          f"{case['ratio_vs_faiss']}  vs matmul {case['ratio_vs_matmul']}  vs torch "
          f"{case['ratio_vs_torch']}  {gflops:.0f} GFLOP/s  [{method}] {more}", flush=True)
    return case

  # ---- cases -----------------------------------------------------------------------------------

  def plain(self, b, n, w, k):
    q, d = self.data(b, n, w)
    qj, dj = jnp.asarray(q), jnp.asarray(d)
    tag = f"q{b}_d{n}_n{w}_k{k}"
    truth = exact.topk(qj, dj, k)
    low, norm = certified.bf16_table(dj)
    ql = qj.astype(jnp.bfloat16)
    fns = self.peers_of(q, d, qj, dj, k)
    self.torch_fn(q, d, k, "float32", fns)
    self.torch_fn(q, d, k, "bfloat16", fns, name="torch_bf16")
    self.torch_tf32_fn(q, d, k, fns)
    sweep = {}
    if self.args.dtype == "float32":
      fns["scan"] = self.scan(qj, dj, k)
      self.chunk_variants(qj, dj, k, fns)
      sweep = self.pallas_variants(qj, dj, k, truth, fns)
    fns["bf16cand"] = lambda: certified.bf16_topk(qj, dj, k, doc_table_bf16=low,
                                                  max_doc_norm=norm)
    fns["bf16"] = self.scan(ql, low, k)
    ms = self.time_all(fns, 4.0 * n * w)
    chunk_ms = {int(name[6:]): v for name, v in ms.items() if name.startswith("scan_c")}
    pays = certified.bf16_pays()
    if "scan" in ms:
      self.record(tag, b, n, w, k, "float32", ms["scan"], ms["faiss"], ms["matmul"],
                  "exact.topk float32 scan", torch_ms=ms.get("torch"), chunk_ms=chunk_ms,
                  **({"scan_selection_ms": sel} if (sel := self.selection_ms(ms, k)) else {}))
      self.record_pallas(tag, b, n, w, k, ms, truth, qj, dj, sweep, ms.get("torch"))
    res = fns["bf16cand"]()
    same = bool(np.array_equal(np.asarray(res.ids), np.asarray(truth.ids)))
    self.record("bf16cand_" + tag, b, n, w, k, "float32", ms["bf16cand"], ms["faiss"],
                ms["matmul"], "certified.bf16_topk (bf16 scan + fp32 rescore, exact)",
                scan_dtype="bfloat16", torch_ms=ms.get("torch"), same_ids_as_fp32=same,
                bf16_pays_here=pays, **certificate(res.rescored, n),
                **id_agreement(qj, dj, res.ids, truth.ids))
    rec = recall(exact.topk(ql, low, k).ids, truth.ids)
    self.record("bf16_" + tag, b, n, w, k, "bfloat16", ms["bf16"], ms["faiss"], ms["matmul"],
                "exact.topk on a bf16 table (approximate)", torch_ms=ms.get("torch_bf16"),
                torch_key="torch_bf16", recall_vs_fp32=round(rec, 4))

  def lowrank(self, b, n, w, k, r):
    q, d = self.data(b, n, w)
    module = scorers.build("lowrank", dim=w, rank=r)
    params = scorers.init_params(module, jax.random.key(self.args.seed))
    v = {"params": params}
    qt = module.apply(v, jnp.asarray(q), method=module.query_table)
    dt = jax.block_until_ready(module.apply(v, jnp.asarray(d), method=module.doc_table))
    width = dt.shape[1]
    # The engine peer: FAISS flat over the same width-r tables; the product peer: FAISS flat
    # over the full-width embeddings, searched with the raw queries.
    fns = self.peers_of(np.asarray(qt), np.asarray(dt), qt, dt, k)
    if "faiss" in self.peers:
      fns["faiss_full_width"] = self.faiss_fn(q, d, k, name="faiss_full_width")
    self.torch_fn(np.asarray(qt), np.asarray(dt), k, "float32", fns)
    fns["scan"] = self.scan(qt, dt, k)
    ms = self.time_all(fns, 4.0 * dt.shape[0] * width)
    full = ms.get("faiss_full_width")
    full_setting = (self.faiss_settings.get("faiss_full_width") or {}).get("setting")
    self.record(f"lowrank{r}_q{b}_d{n}_n{w}_k{k}", b, n, width, k, "float32", ms["scan"],
                ms["faiss"], ms["matmul"],
                f"exact.topk over rank-{r} tables (width {width}); FAISS peer over the same "
                f"tables, full-width FAISS at width {w}",
                torch_ms=ms.get("torch"),
                ratio_vs_faiss_full_width=round(full / ms["scan"], 3) if full else None,
                faiss_full_width_ms=full and round(full, 3),
                faiss_full_width_setting=full_setting)

  def few_queries(self, b, n, w, k):
    q, d = self.data(b, n, w)
    qj, dj = jnp.asarray(q), jnp.asarray(d)
    low, norm = certified.bf16_table(dj)
    fns = self.peers_of(q, d, qj, dj, k)
    if "numpy" in self.peers:  # numpy's own BLAS (its core type is in the hardware line)
      def numpy_topk():
        s = q @ d.T
        part = np.argpartition(-s, k - 1, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(s, part, 1), axis=1, kind="stable")
        return np.take_along_axis(part, order, 1)
      fns["numpy"] = numpy_topk
    self.torch_fn(q, d, k, "float32", fns)
    self.torch_tf32_fn(q, d, k, fns)
    fns["scan"] = self.scan(qj, dj, k)
    self.chunk_variants(qj, dj, k, fns)
    truth = exact.topk(qj, dj, k)
    sweep = self.pallas_variants(qj, dj, k, truth, fns)
    fns["bf16cand"] = lambda: certified.bf16_topk(qj, dj, k, doc_table_bf16=low,
                                                  max_doc_norm=norm)
    ms = self.time_all(fns, 4.0 * n * w)
    chunk_ms = {int(name[6:]): v for name, v in ms.items() if name.startswith("scan_c")}
    for name, method in (("scan", "exact.topk float32 scan"),
                         ("bf16cand", "certified.bf16_topk (exact)")):
      extra = {}
      if ms["numpy"]:
        extra = {"numpy_ms": round(ms["numpy"], 3),
                 "ratio_vs_numpy": round(ms["numpy"] / ms[name], 3)}
      if name == "scan":
        extra["chunk_ms"] = chunk_ms
        if sel := self.selection_ms(ms, k):
          extra["scan_selection_ms"] = sel
      else:
        extra["bf16_pays_here"] = certified.bf16_pays()
      self.record(("" if name == "scan" else "bf16cand_") + f"q{b}_d{n}_n{w}_k{k}", b, n, w, k,
                  "float32", ms[name], ms["faiss"], ms["matmul"], method,
                  scan_dtype="bfloat16" if name == "bf16cand" else None,
                  torch_ms=ms.get("torch"), **extra)
      if name == "scan":
        self.record_pallas(f"q{b}_d{n}_n{w}_k{k}", b, n, w, k, ms, truth, qj, dj, sweep,
                           ms.get("torch"))

  def certified_case(self, b, n, w, k, r):
    q, d = self.data(b, n, w)
    if self.args.w_path:
      W = files.load_npy(self.args.w_path)
      w = W.shape[0]
      q, d = self.data(b, n, w)
      source = f"W from {os.path.basename(self.args.w_path)}"
    else:
      u, _ = np.linalg.qr(self.rng.standard_normal((w, w)))
      v, _ = np.linalg.qr(self.rng.standard_normal((w, w)))
      W = ((u * self.args.decay ** np.arange(w)) @ v.T).astype(np.float32)
      source = f"random W, sigma_i = {self.args.decay}^i"
    index = certified.build_certified(W, d, r)
    qj, dj = jnp.asarray(q), jnp.asarray(d)
    qw = jnp.matmul(qj, jnp.asarray(W), precision=exact.PRECISION)  # full-W table: (q W) . d
    res = certified.certified_topk(index, qj, k)
    same = bool(np.array_equal(np.asarray(res.ids), np.asarray(exact.topk(qw, dj, k).ids)))
    fns = self.peers_of(np.asarray(qw), d, qw, dj, k) | {
        "full_w_scan": self.scan(qw, dj, k),
        "certified": lambda: certified.certified_topk(index, qj, k)}
    self.torch_fn(np.asarray(qw), d, k, "float32", fns)  # torch over the full-W tables
    ms = self.time_all(fns, 4.0 * n * w)
    self.record(f"certified_r{r}_q{b}_d{n}_n{w}_k{k}", b, n, w, k, "float32", ms["certified"],
                ms["faiss"], ms["matmul"], f"certified.certified_topk rank {r} ({source})",
                scan_width=r + 1,  # FLOP/s and bytes of its bound scan (width r + 1)
                torch_ms=ms.get("torch"),
                fraction_rescored=round(float(np.mean(np.asarray(res.rescored))) / n, 6),
                speedup_vs_full_w_scan=round(ms["full_w_scan"] / ms["certified"], 3),
                full_w_scan_ms=round(ms["full_w_scan"], 3), same_ids_as_full_w=same,
                sigma_next=index.sigma_next, bound=index.bound)


def main(args) -> None:
  # FAISS's BLAS is chosen (and faiss imported) before anything else touches it.
  setup = faiss_peer.configure(args.faiss_coretype) if "faiss" in args.peers else None
  allocator.keep_freed_memory()  # as the project's binary does (bilinear_ir.allocator)
  peaks = {"measured": timing.measure_peaks(min(5, max(2, args.repeats))),
           "table": timing.known_peaks()}
  run = Runner(args, peaks)
  hw = hardware(setup)
  print(hw, flush=True)
  print(timing.peaks_line(peaks), flush=True)
  size = lambda default: max(args.k, int(round((args.docs or default) * args.scale)))
  w = args.dim or 384
  b = args.queries
  plan = {
      "q1000_d200000_n384_k10": lambda: run.plain(b or 1000, size(200_000), w, args.k),
      "lowrank32_q1000_d200000_n384_k10": lambda: run.lowrank(b or 1000, size(200_000), w,
                                                              args.k, args.rank),
      "q32_d1000000_n384_k10": lambda: run.few_queries(b or 32, size(1_000_000), w, args.k),
      "certified_r32_q1000_d200000_n384_k10": lambda: run.certified_case(
          b or 1000, size(200_000), w, args.k, args.rank),
  }
  chosen = [c for c in args.cases.split(",") if c] or list(plan)
  unknown = set(chosen) - set(plan)
  if unknown:
    sys.exit(f"unknown case(s) {sorted(unknown)}; known: {list(plan)}")
  for name in chosen:
    plan[name]()
    if args.json:  # after every case: a run stopped at a time limit keeps what it measured
      files.atomic_write_json(args.json, {"hardware": hw, "peaks": peaks, "cases": run.cases,
                                          "torch": run.torch_note or str(run.torch_device)})


if __name__ == "__main__":
  main(ARGS)
