"""Latency and storage of scoring 1 query x 100 docs (the LITE paper's Table 3 layout).

    python benchmarks/late_interaction_latency.py          # Tq 32, Td 180, n 384, 100 docs
    python benchmarks/late_interaction_latency.py --tq 8 --td 24 --dim 32 --docs 10 \
        --m2 64 --m1 16 --small_tokens 8 --small_m2 32 --repeats 3            # smoke run

Scorers (random parameters and random token vectors: latency does not depend on the values):
  DE            dot product of one pooled n-vector per query and doc ("dot")
  ColBERT       sum-max over Tq x Td token similarities ("colbert", no projection)
  LITE          separable LITE, m1 = 360, m2 = 2400 on the Tq x Td matrix ("lite")
  small LITE    separable LITE on L2' = 50 stored doc tokens (learned token map), W1 of shape
                (m2 = 768, 50) as in the paper ("lite", doc_tokens=50, doc_reduction="linear")
  ME-BERT       max over m = 8 doc vectors of one query vector ("mebert")
Doc-side work is precomputed, as in the paper: each doc is stored in the scorer's stored form
(`encode_docs` / `doc_vectors` / pooled vector) before timing. A timed call is one jitted
function of the raw query tokens [1, Tq, n] that computes the query side and scores the 100
stored docs. Unlike the paper's Table 3, query encoder (transformer) time is NOT included: it is
the same for every scorer here (add it to every row to compare with the paper's milliseconds).
Latency: median of `--repeats` warm calls; ratio = latency / DE latency in the same run.
Storage: bytes of one stored doc (`multivector.bytes_per_doc`) in `--dtype`, and its ratio to DE.
"""
from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from bilinear_ir import allocator, files, scorers
from bilinear_ir.scorers import multivector
from bilinear_ir.timing import de_case, hardware, late_case, mebert_case, timed

PAPER_MS = {"DE": 42, "ColBERT": 62, "LITE": 111, "small LITE": 56}  # LITE paper Table 3


def run(args: argparse.Namespace) -> list[dict]:
  """Times every scorer on the same inputs; returns the table rows."""
  rng = np.random.default_rng(args.seed)
  n, dtype = args.dim, jnp.dtype(args.dtype)
  q = jnp.asarray(rng.standard_normal((1, args.tq, n)), jnp.float32)
  d = jnp.asarray(rng.standard_normal((args.docs, args.td, n)), jnp.float32)
  qm = jnp.ones((1, args.tq), bool)
  dm = jnp.ones((args.docs, args.td), bool)
  key = jax.random.key(args.seed)
  common = {"query_len": args.tq, "doc_len": args.td, "doc_chunk": args.docs}
  cases = []

  cases.append(("DE", *de_case(q, qm, jnp.mean(d, axis=1), dtype)))

  for label, name, kw in (
      ("ColBERT", "colbert", {}),
      ("LITE", "lite", {"m1": args.m1, "m2": args.m2}),
      ("small LITE", "lite", {"m1": args.m1, "m2": args.small_m2,
                              "doc_tokens": args.small_tokens, "doc_reduction": "linear"})):
    module = scorers.build(name, dim=n, **common, **kw)
    params = jax.jit(lambda k, module=module: scorers.init_params(module, k))(key)
    fn, tokens, width = late_case(module, params, q, qm, d, dm, dtype)
    cases.append((label, fn, tokens, width))

  me = scorers.build("mebert", dim=n, num_vectors=args.mebert_m, query_len=args.tq,
                     doc_len=args.td)
  me_params = jax.jit(lambda k: scorers.init_params(me, k))(key)
  cases.append(("ME-BERT", *mebert_case(me, me_params, q, qm, d, dm, dtype)))

  rows = []
  for label, fn, tokens, width in cases:
    out = jax.block_until_ready(fn())
    assert out.shape == (1, args.docs), (label, out.shape)
    rows.append({"scorer": label, "ms": timed(fn, args.repeats), "stored_tokens": tokens,
                 "stored_dim": width,
                 "bytes_per_doc": multivector.bytes_per_doc(tokens, width, dtype)})
  de_ms, de_bytes = rows[0]["ms"], rows[0]["bytes_per_doc"]
  for r in rows:
    r["ms_vs_de"] = r["ms"] / de_ms
    r["storage_vs_de"] = r["bytes_per_doc"] / de_bytes
    r["paper_ms"] = PAPER_MS.get(r["scorer"])
  return rows


def main() -> None:
  allocator.keep_freed_memory()  # as the project's binary does (bilinear_ir.allocator)
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--tq", type=int, default=32, help="query tokens")
  parser.add_argument("--td", type=int, default=180, help="doc tokens (SciFact-like abstracts)")
  parser.add_argument("--dim", type=int, default=384, help="token width n (MiniLM: 384)")
  parser.add_argument("--docs", type=int, default=100, help="docs scored per query")
  parser.add_argument("--m1", type=int, default=360, help="LITE column-MLP width")
  parser.add_argument("--m2", type=int, default=2400, help="LITE row-MLP width")
  parser.add_argument("--small_tokens", type=int, default=50, help="small LITE stored tokens")
  parser.add_argument("--small_m2", type=int, default=768, help="small LITE row-MLP width")
  parser.add_argument("--mebert_m", type=int, default=8, help="ME-BERT vectors per doc")
  parser.add_argument("--dtype", default="float32", help="storage dtype of the stored docs")
  parser.add_argument("--repeats", type=int, default=50)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--json", default=None, help="write the rows here")
  args = parser.parse_args()

  hw = hardware()
  print(f"hardware: {hw}")
  print(f"1 query x {args.docs} docs, Tq {args.tq}, Td {args.td}, n {args.dim}, stored as "
        f"{args.dtype}; median of {args.repeats}; query encoder time not included\n")
  rows = run(args)
  print("| scorer | stored per doc | bytes/doc | storage vs DE | ms | latency vs DE | paper ms |")
  print("|---|---|---|---|---|---|---|")
  for r in rows:
    paper = "-" if r["paper_ms"] is None else str(r["paper_ms"])
    print(f"| {r['scorer']} | {r['stored_tokens']} x {r['stored_dim']} | {r['bytes_per_doc']:,} "
          f"| {r['storage_vs_de']:.0f}x | {r['ms']:.3f} | {r['ms_vs_de']:.2f}x | {paper} |")
  if args.json:
    files.atomic_write_json(args.json, {"hardware": hw, "args": vars(args), "rows": rows})


if __name__ == "__main__":
  main()
