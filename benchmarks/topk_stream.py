"""An MS MARCO-sized index streamed from memory-mapped shards: q/s, the read bound, FAISS in RAM.

    python benchmarks/topk_stream.py                       # 8.8M x 384, float32 + bf16, 32 / 1,000
    python benchmarks/topk_stream.py --docs 200000 --queries 32 --repeats 2 \
        --dir runs/stream_small --json runs/stream_small.json    # smoke run

Opt-in (not part of `topk.py`'s default run): the first run writes the synthetic index, 13.5 GB of
float32 shards plus 6.8 GB of bf16 shards for 8.8M docs (the MS MARCO passage count) x 384, under
`--dir` (default `runs/msmarco_synthetic`, git-ignored; minutes); later runs reuse it when its
`synthetic.json` (generator, seed, sizes) matches.

Data: doc rows ~ N(0, I) float32, drawn by seed in blocks of 65,536 rows
(`np.random.default_rng([seed, block])`), written with `index.DocIndex.build` (no scorer: the rows
are the doc table) as float32 and as bfloat16 (the same rows rounded); queries ~ N(0, I) from
`--seed`.

Cases (per dtype and query count B, k = `--k`):
  stream_q{B}_d{N}_n{w}_k{k}       `DocIndex.search` on the float32 index: `exact.topk_stream`
                                   over the memory-mapped shards (exact float32 top-k).
  bf16stream_q{B}_d{N}_n{w}_k{k}   the same on the bf16 index (half the bytes; bf16 scores with
                                   float32 accumulation, approximate): recall@k vs float32.
Timing is interleaved (`timing.timed_interleaved`, rounds in rotating order, medians), in two
phases:
  1. ours and the read bound, nothing else resident (the page cache keeps what RAM allows: on the
     development machine, 24 GiB, the 13.5 GB of float32 shards stay cached between rounds):
       ours  the streamed search (`ms`, `qps`);
       read  the disk (or page-cache) read of the same shard files, in parallel: `--read-threads`
             threads (default max(8, cores), at most one per shard) each read whole shards
             (`readinto` a reused 64 MiB buffer per thread): `read_bound_ms`, `read_threads`;
             `ratio_vs_read` = ours / read (goal for 32 queries: <= 1.25). A figure of its own,
             not part of the roofline bound below.
Every case also carries the roofline bound (`timing.roofline`, peaks measured at the start of
the run: float32 / bf16 matmul peaks, the matmuls again timed interleaved with each case and the
larger rate kept): max(2 B N w FLOPs / the matmul peak of the index's dtype, the index's bytes /
the bandwidth a stream of host-resident shards can reach, `timing.stream_bandwidth`: on a CPU the
memory READ bandwidth (a sum by every core or by XLA, the larger); on an accelerator the
host-to-device link measured in the same run, `jax.device_put` of a 1 GiB host array, best of 3) as `bound_ms`,
`ratio_vs_bound`, `peak_flops`, `bandwidth_gbs` (the stream's bandwidth), with
`bound_bandwidth_source` naming it and `link_gb_per_s` (accelerators; null on a CPU). It is the
bound with the shards in host memory, so with shards on disk the read is the limit instead.
`bound_ms_table_in_device_memory` (with `device_memory_gbs`) is the bound of a table already in
the device's memory, which a stream from the host cannot reach on an accelerator. `peer_torch_ms` is null (with `note`): there
is no torch peer over memory-mapped shards.
  2. FAISS IndexFlatIP over the float32 rows held in RAM (the peer), only if MemAvailable exceeds
     the table by 2 GiB (checked before loading; said in the output when not), in the
     configuration of `faiss_peer` (BLAS core type probed, blocking tuned on the case), timed
     interleaved with ours and the read again: `faiss_ms`, `ms_faiss_resident`,
     `ratio_vs_faiss` = FAISS time / ours, and `read_bound_ms_faiss_resident` /
     `ratio_vs_read_faiss_resident` (with the FAISS table resident the shards no longer fit the
     page cache: both ours and the read go to disk).
The output prints MemAvailable and the table sizes, so which regime each number is in is visible.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import sys
import time

import blas_setup  # benchmarks/blas_setup.py: numpy's BLAS kernel, chosen before numpy loads

if __name__ == "__main__":
  blas_setup.choose_numpy_coretype()

import numpy as np  # noqa: E402

import faiss_peer  # noqa: E402  (benchmarks/faiss_peer.py: FAISS's BLAS, before faiss loads)

GEN_BLOCK = 65536
READ_BYTES = 64 << 20


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--dir", default=os.path.join("runs", "msmarco_synthetic"),
                 help="index folder (float32/ and bfloat16/ inside); created once")
  p.add_argument("--docs", type=int, default=8_800_000, help="docs N (MS MARCO: 8,841,823)")
  p.add_argument("--dim", type=int, default=384)
  p.add_argument("--queries", default="32,1000", help="comma list of query counts B")
  p.add_argument("--k", type=int, default=10)
  p.add_argument("--dtypes", default="float32,bfloat16")
  p.add_argument("--shard-docs", type=int, default=131072, help="docs per shard file")
  p.add_argument("--repeats", type=int, default=3, help="timed rounds (median)")
  p.add_argument("--peers", default="faiss,read", help="peers: faiss, read")
  p.add_argument("--faiss-coretype", default="auto",
                 help="auto (probe), default (OpenBLAS's detection) or a core type name")
  p.add_argument("--read-threads", type=int, default=None,
                 help="parallel readers of the read figure (default max(8, cores), at most one "
                      "per shard)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--generate-only", action="store_true", help="write the index and stop")
  p.add_argument("--json", default=None, help="write the results here")
  return p.parse_args(argv)


ARGS = parse_args() if __name__ == "__main__" else None
FAISS = (faiss_peer.configure(ARGS.faiss_coretype)
         if ARGS is not None and "faiss" in ARGS.peers and not ARGS.generate_only else None)

# jax after faiss's BLAS is configured.
import jax.numpy as jnp  # noqa: E402

from bilinear_ir import allocator, files  # noqa: E402
from bilinear_ir.retrieval import index as doc_index  # noqa: E402
from bilinear_ir import timing  # noqa: E402


class SyntheticDocs:
  """Doc rows [N, w] ~ N(0, I) float32, generated by seed block by block when sliced."""

  def __init__(self, num_docs: int, dim: int, seed: int):
    self.shape = (num_docs, dim)
    self.seed = seed

  def __getitem__(self, sl: slice) -> np.ndarray:
    lo, hi, _ = sl.indices(self.shape[0])
    parts = []
    for block in range(lo // GEN_BLOCK, -(-hi // GEN_BLOCK)):
      start = block * GEN_BLOCK
      size = min(GEN_BLOCK, self.shape[0] - start)
      rows = np.random.default_rng([self.seed, block]).standard_normal(
          (size, self.shape[1]), dtype=np.float32)
      parts.append(rows[max(lo, start) - start:min(hi, start + size) - start])
    return np.concatenate(parts) if parts else np.zeros((0, self.shape[1]), np.float32)


def meminfo(field: str = "MemAvailable") -> int | None:
  """Bytes of a /proc/meminfo field (None off Linux)."""
  try:
    with open("/proc/meminfo", encoding="utf-8") as f:
      for line in f:
        if line.startswith(field + ":"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return None


def ensure_index(folder: str, args: argparse.Namespace, dtype: str) -> doc_index.DocIndex:
  """The synthetic index in `folder`, built once (reused when `synthetic.json` matches)."""
  spec = {"generator": "standard_normal float32, np.random.default_rng([seed, block]), "
                       f"blocks of {GEN_BLOCK} rows", "seed": args.seed, "num_docs": args.docs,
          "dim": args.dim, "dtype": dtype, "shard_docs": args.shard_docs}
  spec_path = os.path.join(folder, "synthetic.json")
  if os.path.exists(spec_path):
    with open(spec_path, encoding="utf-8") as f:
      if json.load(f) == spec:
        return doc_index.DocIndex.open(folder)
  need = args.docs * args.dim * (4 if dtype == "float32" else 2)
  os.makedirs(folder, exist_ok=True)
  free = shutil.disk_usage(folder).free
  if free < need * 1.05:
    sys.exit(f"{folder}: {need / 2**30:.1f} GiB needed, {free / 2**30:.1f} GiB free")
  print(f"writing the {dtype} index ({need / 2**30:.1f} GiB) to {folder} ...", flush=True)
  t0 = time.perf_counter()
  index = doc_index.DocIndex.build(folder, None, {}, SyntheticDocs(args.docs, args.dim, args.seed),
                                   shard_docs=args.shard_docs, dtype=dtype, overwrite=True)
  files.atomic_write_json(spec_path, spec)
  print(f"  written in {time.perf_counter() - t0:.0f} s", flush=True)
  return index


def shard_paths(index: doc_index.DocIndex) -> list[str]:
  return [os.path.join(index.directory, e["rows"]) for e in index.manifest["shards"]]


def read_file(path: str, buf: bytearray) -> int:
  """One sequential read of a file into `buf` (reused), len(buf) bytes at a time; bytes read."""
  view = memoryview(buf)
  total = 0
  with open(path, "rb", buffering=0) as f:
    while True:
      n = f.readinto(view)
      if not n:
        break
      total += n
  return total


def read_all(paths: list[str], bufs: list[bytearray], pool) -> int:
  """Reads every file once, len(bufs) files at a time in parallel (file i into buffer i mod
  len(bufs), on `pool`'s threads; `readinto` releases the GIL); bytes read."""
  groups = [paths[i::len(bufs)] for i in range(len(bufs))]
  return sum(pool.map(lambda pb: sum(read_file(p, pb[1]) for p in pb[0]), zip(groups, bufs)))


def faiss_in_ram(index: doc_index.DocIndex):
  """FAISS IndexFlatIP over the float32 rows, filled in place (no second copy); or a reason."""
  need = index.num_docs * index.width * 4
  avail = meminfo()
  if avail is None or avail < need + (2 << 30):
    return None, (f"did not fit: the float32 table needs {need / 2**30:.1f} GiB, MemAvailable "
                  f"{'unknown' if avail is None else f'{avail / 2**30:.1f} GiB'} (2 GiB margin)")
  import faiss  # pylint: disable=g-import-not-at-top
  flat = faiss.IndexFlatIP(index.width)
  flat.codes.resize(need)
  flat.ntotal = index.num_docs
  table = faiss.rev_swig_ptr(flat.get_xb(), index.num_docs * index.width).reshape(
      index.num_docs, index.width)
  row = 0
  for shard in index.shards():
    table[row:row + shard.shape[0]] = shard
    row += shard.shape[0]
  return flat, f"in RAM ({need / 2**30:.1f} GiB; MemAvailable before {avail / 2**30:.1f} GiB)"


def print_case(case: dict) -> None:
  keys = ("bound_ms", "bound_limit", "ratio_vs_bound", "read_bound_ms", "ratio_vs_read",
          "recall_vs_fp32", "faiss_ms", "ms_faiss_resident",
          "ratio_vs_faiss", "read_bound_ms_faiss_resident", "ratio_vs_read_faiss_resident",
          "same_ids_as_faiss")
  extra = " ".join(f"{k}={case[k]}" for k in keys if k in case)
  print(f"{case['name']:40s} {case['ms']:10.1f} ms {case['qps']:9.2f} q/s "
        f"{case['stream_gb_per_s']:6.2f} GB/s  {extra}", flush=True)


def main(args: argparse.Namespace) -> None:
  allocator.keep_freed_memory()
  dtypes = [d for d in args.dtypes.split(",") if d]
  indexes = {d: ensure_index(os.path.join(args.dir, d), args, d) for d in dtypes}
  if args.generate_only:
    return
  hw = (f"{timing.hardware()}; {blas_setup.describe()}"
        + ("; " + FAISS.describe() if FAISS else ""))
  print(hw, flush=True)
  total = {d: sum(os.path.getsize(p) for p in shard_paths(ix)) for d, ix in indexes.items()}
  print(f"index {args.dir}: {args.docs:,} docs x {args.dim}; "
        + ", ".join(f"{d} {b / 2**30:.2f} GiB in {len(indexes[d].manifest['shards'])} shards"
                    for d, b in total.items())
        + f"; MemAvailable {(meminfo() or 0) / 2**30:.1f} GiB of "
        f"{(meminfo('MemTotal') or 0) / 2**30:.1f}", flush=True)
  peers = {p for p in args.peers.split(",") if p}
  peaks = timing.measure_peaks(min(5, max(2, args.repeats)))
  probes, probe_flops = timing.peak_probes()  # timed with each case too (the larger peak kept)
  print(timing.peaks_line({"measured": peaks}), flush=True)
  stream = timing.stream_bandwidth(peaks)  # the bound's bandwidth: what the stream can reach
  print(f"stream bandwidth of the bound: {stream['gb_per_s']:.1f} GB/s ({stream['source']})",
        flush=True)
  most = max(len(ix.manifest["shards"]) for ix in indexes.values())
  threads = min(most, args.read_threads or max(8, os.cpu_count() or 1))
  bufs = [bytearray(READ_BYTES) for _ in range(threads)]
  pool = concurrent.futures.ThreadPoolExecutor(threads)
  rng = np.random.default_rng(args.seed + 1)
  counts = [int(x) for x in args.queries.split(",") if x]
  queries = {b: rng.standard_normal((b, args.dim), dtype=np.float32) for b in counts}
  name_of = lambda dtype, b: (("stream" if dtype == "float32" else "bf16stream")
                              + f"_q{b}_d{args.docs}_n{args.dim}_k{args.k}")
  cases, found = {}, {}

  def fns_of(ix, qj):
    fns = {"ours": lambda: ix.search(qj, args.k)}
    if "read" in peers:
      fns["read"] = lambda paths=shard_paths(ix): read_all(paths, bufs, pool)
    return fns

  # Phase 1: ours and the read bound, the page cache as this machine leaves it (nothing else
  # resident: on a machine with more free RAM than the shards, a warm page cache).
  print("phase 1: ours vs the read bound (no FAISS table resident)", flush=True)
  for b in counts:
    qj = jnp.asarray(queries[b])
    for dtype, ix in indexes.items():
      fastest = {}
      ms = timing.timed_interleaved(fns_of(ix, qj) | probes, args.repeats, warmup=1,
                                    fastest=fastest)
      case_peaks = timing.with_interleaved_peaks(peaks, fastest, probe_flops)
      res = ix.search(qj, args.k)
      found[dtype, b] = np.asarray(res.ids)
      case = {"name": name_of(dtype, b), "queries": b, "docs": args.docs, "dim": args.dim,
              "k": args.k, "dtype": dtype, "ms": round(ms["ours"], 1),
              "qps": round(1e3 * b / ms["ours"], 2), "bytes": total[dtype],
              "stream_gb_per_s": round(total[dtype] / ms["ours"] / 1e6, 2),
              "gflops": round(2.0 * b * args.docs * args.dim / ms["ours"] / 1e6, 1),
              "method": f"DocIndex.search (exact.topk_stream over "
                        f"{len(indexes[dtype].manifest['shards'])} memory-mapped {dtype} shards)",
              "mem_available_gib": round((meminfo() or 0) / 2**30, 1)}
      work = (2.0 * b * args.docs * args.dim, total[dtype] + 4.0 * b * args.dim)
      bound = timing.roofline(*work, dtype, case_peaks | {"gb_per_s": stream["gb_per_s"],
                                                          "read_gb_per_s": stream["gb_per_s"]})
      resident = timing.roofline(*work, dtype, case_peaks)
      case |= {**bound, "ratio_vs_bound": round(ms["ours"] / bound["bound_ms"], 3),
               "bound_bandwidth_source": stream["source"],
               "link_gb_per_s": stream["link_gb_per_s"],
               "bound_ms_table_in_device_memory": resident["bound_ms"],
               "device_memory_gbs": resident["bandwidth_gbs"],
               "peer_torch_ms": None,
               "note": "no torch peer: torch has no reader of memory-mapped shards here"}
      if "read" in ms:
        case |= {"read_bound_ms": round(ms["read"], 1), "read_threads": threads,
                 "read_gb_per_s": round(total[dtype] / ms["read"] / 1e6, 2),
                 "ratio_vs_read": round(ms["ours"] / ms["read"], 3)}
      if dtype != "float32" and ("float32", b) in found:
        case["recall_vs_fp32"] = round(float(np.mean(
            [len(set(a) & set(f)) / args.k
             for a, f in zip(found[dtype, b], found["float32", b])])), 4)
      cases[dtype, b] = case
      print_case(case)

  # Phase 2: FAISS's float32 table resident in RAM (where it fits), timed interleaved with ours
  # and the read (which now compete with it for memory: the shards are read from disk if the
  # page cache no longer holds them).
  flat, faiss_note = None, "not requested"
  if "faiss" in peers and "float32" in indexes and FAISS and FAISS.available:
    flat, faiss_note = faiss_in_ram(indexes["float32"])
  elif "faiss" in peers:
    faiss_note = "faiss not installed" if not (FAISS and FAISS.available) else "no float32 index"
  print(f"phase 2: FAISS peer: {faiss_note}", flush=True)
  if flat is not None:
    for b in counts:
      q, qj = queries[b], jnp.asarray(queries[b])
      setting, grid = faiss_peer.tune_blocking(lambda q=q: flat.search(q, args.k), b,
                                               2.0 * b * args.docs * args.dim, repeats=1)
      print(f"  FAISS blocking for {b} queries: {faiss_peer.blocking_text(setting, b)} "
            f"(ms by threshold/query_bs/database_bs: {grid})", flush=True)
      _, faiss_ids = flat.search(q, args.k)
      for dtype, ix in indexes.items():
        fns = fns_of(ix, qj)
        fns["faiss"] = lambda q=q, setting=setting: (faiss_peer.set_blocking(*setting),
                                                     flat.search(q, args.k))
        ms = timing.timed_interleaved(fns, args.repeats, warmup=1)
        case = cases[dtype, b]
        case |= {"faiss_ms": round(ms["faiss"], 1),
                 "ms_faiss_resident": round(ms["ours"], 1),
                 "ratio_vs_faiss": round(ms["faiss"] / ms["ours"], 3),
                 "faiss_setting": f"IndexFlatIP, float32 table in RAM, "
                                  f"{faiss_peer.blocking_text(setting, b)}, "
                                  f"OPENBLAS_CORETYPE={FAISS.coretype or 'unset'}, "
                                  f"{FAISS.threads} threads",
                 "same_ids_as_faiss": round(float(np.mean(
                     [len(set(a) & set(f)) / args.k
                      for a, f in zip(found[dtype, b], faiss_ids)])), 4),
                 "mem_available_gib_faiss_resident": round((meminfo() or 0) / 2**30, 1)}
        if "read" in ms:
          case |= {"read_bound_ms_faiss_resident": round(ms["read"], 1),
                   "ratio_vs_read_faiss_resident": round(ms["ours"] / ms["read"], 3)}
        print_case(case)
  cases = list(cases.values())
  if args.json:
    files.atomic_write_json(args.json, {"hardware": hw, "peaks": peaks, "faiss": faiss_note,
                                        "cases": cases})


if __name__ == "__main__":
  main(ARGS)
