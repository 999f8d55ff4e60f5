"""Where `exact.tf32x3_topk`'s time goes, part by part, over a small grid of its configs.

    python benchmarks/tf32x3_profile.py --out runs/tf32x3_profile.json    # on a GPU: <= 60 s
    python benchmarks/tf32x3_profile.py --reduced --out runs/p.json      # CPU smoke test

Cases: 32 queries x 1M docs and 1,000 x 200k, width 384, k = 10, standard normal float32 (as
`benchmarks/topk.py`; `--reduced`: 8 x 16k and 64 x 4k, width 64). A config is (G, m, c,
selection): the 3xTF32 group maxima over groups of G docs (`exact.tf32x3_group_maxima`, XLA's
TF32_TF32_F32_X3 dot; emulated off a GPU), the m best groups picked (`exact.tf32x3_select`,
directly (c = 1) or through coarse groups of c groups, by `lax.top_k` or argmax passes), their
m G docs rescored in float32 and the k best picked by the same selection
(`exact.rescore_groups`). Each part is jitted and timed alone on the previous part's
output (`timing.timed_interleaved`: median of --repeats, after warm-up): `maxima_ms` per G,
`select_ms` per config, `rescore_ms` per (G, m, selection); `parts_ms` is their sum. Per config the
certificate is evaluated on the host from the parts' outputs (`fallback_queries`: the queries
the full call would redo with the float32 scan) and the certified queries' ids are checked
against the "xla" scan's (`same_ids_certified`).
Then the whole call, `exact.tf32x3_topk` with the table's max|d| computed before timing (as
`benchmarks/topk.py` does, host sync on the certificate included), at run 8's config (G = 128
for 32 queries, 32 for 1,000; m = 2k, c = 1, `exact.default_selection(k)`) and at the config
with the smallest `parts_ms` among those without fallback, timed in the same rounds as the
"xla" scan (`exact.topk`): `whole_ms`, `after_ms` = whole_ms - maxima_ms, `xla_ms`,
`same_ids_as_xla`; `best_config` is the best one in `benchmarks/topk.py --tf32x3-tiles` form.
One line per config; JSON to --out (after each case).
"""
from __future__ import annotations

import argparse
import sys

import jax
import numpy as np

from bilinear_ir import files, timing
from bilinear_ir.retrieval import exact, pallas_topk

CASES = {"q32_d1000000_n384_k10": (32, 1_000_000, 384), "q1000_d200000_n384_k10":
         (1000, 200_000, 384)}
REDUCED = {"q32_d1000000_n384_k10": (8, 16_384, 64), "q1000_d200000_n384_k10": (64, 4_096, 64)}
RUN8_GROUP = {"q32_d1000000_n384_k10": 128, "q1000_d200000_n384_k10": 32}  # run 8's best G


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--out", required=True, help="JSON output")
  p.add_argument("--reduced", action="store_true", help="tiny sizes (CPU smoke test)")
  p.add_argument("--cases", default=",".join(CASES))
  p.add_argument("--k", type=int, default=10)
  p.add_argument("--groups", default="32,64,128,256", help="G values (docs per group)")
  p.add_argument("--ms", default="", help="m values (default: k + 2, 2k)")
  p.add_argument("--coarse-docs", type=int, default=1024,
                 help="besides c = 1, coarse groups of this many docs (c = this / G; 0: none)")
  p.add_argument("--selections", default="top_k,argmax")
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--seed", type=int, default=0)
  return p.parse_args(argv)


def grid(args, k: int) -> tuple[list[int], list[int], list[str]]:
  """(G values, m values, selections) from the arguments."""
  ints = lambda text: [int(x) for x in text.split(",") if x]
  return (ints(args.groups), ints(args.ms) or [k + 2, 2 * k],
          [s for s in args.selections.split(",") if s])


def certificate(nxt, scores, slack, k: int) -> np.ndarray:
  """[B] bool: `_tf32x3_certified`'s test, nxt [B] the best maximum left out, scores [B, k]."""
  nxt, scores = np.asarray(nxt), np.asarray(scores)
  return (nxt == -np.inf) | (nxt + slack < scores[:, k - 1])


def profile_case(name: str, b: int, n: int, w: int, args) -> dict:
  """Times every config's parts and the whole call at two configs on one case; returns its
  JSON entry."""
  k = args.k
  rng = np.random.default_rng(args.seed)
  q = rng.standard_normal((b, w), dtype=np.float32)
  d = rng.standard_normal((n, w), dtype=np.float32)
  qj, dj = jax.device_put(q), jax.device_put(d)
  emulate = pallas_topk.interpret_default()
  norm = exact.max_doc_norm(dj)
  slack = (exact.tf32x3_relative_bound(w) * norm
           * np.linalg.norm(q.astype(np.float64), axis=1)).astype(np.float32)
  truth = np.asarray(jax.block_until_ready(exact.topk(qj, dj, k, strategy="xla")).ids)
  groups, ms_, sels = grid(args, k)
  fns, configs, outs = {}, [], {}
  for g in groups:
    maxima = jax.jit(lambda a, c, g=g: exact.tf32x3_group_maxima(a, c, g, emulate))
    fns[f"maxima@g{g}"] = lambda f=maxima: f(qj, dj)
    mx = jax.block_until_ready(fns[f"maxima@g{g}"]())
    coarse = sorted({1} | ({args.coarse_docs // g} if args.coarse_docs >= 2 * g else set()))
    for m in ms_:
      rescores = {sel: jax.jit(lambda a, e, bl, g=g, sel=sel: exact.rescore_groups(
          a, e, bl, g, k, 0, sel)) for sel in sels}  # compiled once per (G, m, selection)
      for c in coarse:
        for sel in sels:
          rescore = rescores[sel]
          cfg = f"g{g}.m{m}.c{c}.{sel}"
          select = jax.jit(lambda x, m=m, c=c, sel=sel: exact.tf32x3_select(x, m, c, sel))
          fns[f"select@{cfg}"] = lambda f=select, x=mx: f(x)
          blocks, nxt = jax.block_until_ready(fns[f"select@{cfg}"]())
          res = jax.block_until_ready(rescore(qj, dj, blocks))
          if f"rescore@g{g}.m{m}.{sel}" not in fns:
            fns[f"rescore@g{g}.m{m}.{sel}"] = lambda f=rescore, bl=blocks: f(qj, dj, bl)
          ok = certificate(nxt, res.scores, slack, k)
          outs[cfg] = {"fallback_queries": int((~ok).sum()), "same_ids_certified": bool(
              np.array_equal(np.asarray(res.ids)[ok], truth[ok]))}
          configs.append((cfg, g, m, c, sel))
  ms = timing.timed_interleaved(fns, args.repeats, warmup=1)
  rows = []
  for cfg, g, m, c, sel in configs:
    row = {"config": cfg, "group": g, "m": m, "coarse": c, "selection": sel,
           "maxima_ms": round(ms[f"maxima@g{g}"], 3), "select_ms": round(ms[f"select@{cfg}"], 3),
           "rescore_ms": round(ms[f"rescore@g{g}.m{m}.{sel}"], 3), **outs[cfg]}
    row["parts_ms"] = round(row["maxima_ms"] + row["select_ms"] + row["rescore_ms"], 3)
    rows.append(row)
    print(f"{name} {cfg:24s} maxima {row['maxima_ms']:7.3f}  select {row['select_ms']:7.3f}  "
          f"rescore+finish {row['rescore_ms']:7.3f}  parts {row['parts_ms']:7.3f} ms  "
          f"fallback {row['fallback_queries']}  same_ids {row['same_ids_certified']}",
          flush=True)
  clean = [r for r in rows if r["fallback_queries"] == 0 and r["same_ids_certified"]]
  best = min(clean or rows, key=lambda r: r["parts_ms"])
  run8 = {"group": RUN8_GROUP[name] if RUN8_GROUP[name] in groups else groups[0],
          "m": 2 * k, "coarse": 1, "selection": exact.default_selection(k)}
  whole = {"run8": run8, "best": {key: best[key] for key in ("group", "m", "coarse",
                                                             "selection")}}
  calls = {"xla": lambda: exact.topk(qj, dj, k, strategy="xla")}
  for tag, cfg in whole.items():
    tiles = pallas_topk.default_tiles(b, w)._replace(group=cfg["group"])
    calls[tag] = lambda t=tiles, cfg=cfg: exact.tf32x3_topk(
        qj, dj, k, t, groups=cfg["m"], doc_norm=norm, coarse=cfg["coarse"],
        selection=cfg["selection"])[0]
    res, fell = exact.tf32x3_topk(qj, dj, k, tiles, groups=cfg["m"], doc_norm=norm,
                                  coarse=cfg["coarse"], selection=cfg["selection"])
    cfg |= {"fallback_queries": fell, "same_ids_as_xla": bool(np.array_equal(
        np.asarray(res.ids), truth))}
  t = timing.timed_interleaved(calls, args.repeats, warmup=1, rewarm=1)
  for tag, cfg in whole.items():
    cfg |= {"whole_ms": round(t[tag], 3),
            "after_ms": round(t[tag] - ms[f"maxima@g{cfg['group']}"], 3)}
    print(f"{name} whole {tag:4s} g{cfg['group']}.m{cfg['m']}.c{cfg['coarse']}."
          f"{cfg['selection']}: {cfg['whole_ms']:.3f} ms (after the maxima "
          f"{cfg['after_ms']:.3f}; xla scan {t['xla']:.3f} ms)  fallback "
          f"{cfg['fallback_queries']}  same_ids_as_xla {cfg['same_ids_as_xla']}", flush=True)
  top = whole["best"]
  return {"name": name, "queries": b, "docs": n, "dim": w, "k": k,
          "xla_ms": round(t["xla"], 3), "configs": rows, "whole": whole,
          "best_config": f"g{top['group']}.c{top['coarse']}.m{top['m']}.{top['selection']}"}


def main(args) -> None:
  sizes = REDUCED if args.reduced else CASES
  chosen = [c for c in args.cases.split(",") if c]
  unknown = set(chosen) - set(sizes)
  if unknown:
    sys.exit(f"unknown case(s) {sorted(unknown)}; known: {list(sizes)}")
  hw = timing.hardware()
  print(hw, flush=True)
  out = {"hardware": hw, "reduced": args.reduced, "cases": []}
  for name in chosen:
    out["cases"].append(profile_case(name, *sizes[name], args))
    files.atomic_write_json(args.out, out)


if __name__ == "__main__":
  main(parse_args())
