"""The cost of each row of the learning curve at query time: latency and what the index holds.

    python benchmarks/row_costs.py              # N = 27,413 docs (InsuranceQA), n = 384, 768
    python benchmarks/row_costs.py --docs 2000 --dims 48 --repeats 2 --json runs/c.json  # smoke

Rows: every row type of the learning curve, built from `configs/learning_curve.py` with models
wdp, lowrank (residual I + P Q^T at r = 32 and 128), bilinear, adapter, mol, mol_residual (their
options as the curve sets them: `tables.model_specs` and the config's `mol` / `mol_residual`
blocks), plus dot and the pure low-rank P Q^T (r = 32; the bilinear table's form) for reference.
Data: random unit-norm embeddings from --seed ([N, n] docs, [128, n] queries), float32; params:
each scorer's init moved by 0.01 N(0, 1) noise from --seed (every table is a generic one, as
after training: W is not I, Q is not 0).

Per row and width n, two facts about the index and two latencies (`bilinear_ir.experiment.costs`
reads the index and builds the searches; the finetune job uses them on trained rows):
  * `index`: "raw" when the row is served from the raw doc embeddings (the query-side form,
    `export.sentence_transformers.query_side_layers`: dot, wdp, bilinear, residual low-rank, the
    adapter; each checked: a linear table scorer's matrices, the adapter's raw doc table), "doc
    table" when its own doc table is narrower than the raw embedding (pure P Q^T: an r-wide
    table, smaller than raw though it could be folded too), "MoL tables" (`mol_topk.MolIndex`).
    `extra_bytes_per_doc`: 0 for "raw", else the nbytes of the doc-side arrays the scorer builds
    (`doc_table(docs)`, or the MolIndex's item components and TopKAvg table; a residual MoL's
    raw docs are the index already there) divided by N, read off the arrays built here;
    `raw_bytes_per_doc`: the raw embedding's n x 4 bytes.
  * `ms_per_query` (at batch 1 and batch 128: the call's time / the batch): the exact top-10
    search the project runs for the row (`retrieval.ranking.score_topk`'s path): a table scorer's
    jitted `query_table` then `exact.topk` over its precomputed `doc_table`; MoL's jitted
    `query_components` then `mol_topk.brute_force` over its precomputed `MolIndex` (the exact
    top-k the project evaluates with; the mol job's approximate algorithms are its own study).
    `served_ms_per_query`: the query-side form over the raw docs (`q M`, M =
    `query_side_matrix`, then `exact.topk` over the raw [N, n]) where that differs from the
    project's path (wdp, bilinear, residual low-rank); else the same number.
    `extra_ms_over_dot` = ms - dot's ms and `ratio_vs_dot` (`served_ratio_vs_dot`) = ms / dot's
    ms, dot being the same path over the same raw docs in the same rounds;
    `fastest_ratio_vs_dot` ("best x"): the ratio of each one's fastest round, less moved by other
    processes on a shared machine than the medians.
  * numpy peer for dot: `q @ docs.T`, `argpartition` and a sort of the top 10 (its BLAS core
    and thread count in the hardware line; its core type chosen by `blas_setup` before numpy
    loads), timed after the rows (its BLAS threads spin on after a call and would slow the next
    function), its ratio against dot's median.
Timing: every function compiled and run once before timing (`timing.timed_interleaved`'s
warm-up), then --repeats rounds, in each every row called twice, the second call timed (so the
previous call's after-effects fall on the untimed one), in an order that rotates between rounds;
the median. On a shared machine the medians move with the load; the ratios to dot,
measured in the same rounds, move less.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from typing import Any

import blas_setup  # benchmarks/blas_setup.py: numpy's BLAS kernel, before numpy loads

if __name__ == "__main__":
  blas_setup.choose_numpy_coretype()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from bilinear_ir import files, scorers, timing  # noqa: E402
from bilinear_ir.experiment import costs  # noqa: E402
from bilinear_ir.experiment import table as table_lib  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CURVE_MODELS = ("wdp", "lowrank", "bilinear", "adapter", "mol", "mol_residual")
CURVE_RANKS = (32, 128)
PURE_RANK = 32
K = costs.K
BATCHES = (1, 128)


def curve_rows() -> list[tuple[str, dict[str, Any]]]:
  """(name, model options) of dot, every trained row type of the learning curve (its config,
  `CURVE_MODELS` at `CURVE_RANKS`) and the pure low-rank P Q^T at `PURE_RANK`."""
  spec = importlib.util.spec_from_file_location(
      "learning_curve_config", os.path.join(REPO, "configs", "learning_curve.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config(f"models={'+'.join(CURVE_MODELS)},"
                             f"ranks={'+'.join(map(str, CURVE_RANKS))}")
  rows = [("dot", {"scorer": "dot"})]
  rows += [(r["name"], table_lib.model_of(config, r)) for r in config.rows
           if r["type"] == "trained"]
  rows.append((f"lowrank_r{PURE_RANK}_pure", {"scorer": "lowrank", "rank": PURE_RANK,
                                              "residual": "none"}))
  return rows


def build(options: dict[str, Any], dim: int, seed: int):
  """(module, params) of a row's scorer for width `dim`: init moved by 0.01 N(0, 1) (seeded)."""
  module = scorers.build(options["scorer"], dim=dim,
                         **{k: v for k, v in options.items()
                            if k in scorers.options(options["scorer"])})
  params = scorers.init_params(module, jax.random.key(seed))
  leaves, tree = jax.tree.flatten(params)
  rng = np.random.default_rng(seed)
  return module, jax.tree.unflatten(tree, [
      np.asarray(x) + 0.01 * rng.standard_normal(np.shape(x)).astype(np.float32)
      for x in leaves])


def numpy_topk(q: np.ndarray, docs: np.ndarray) -> np.ndarray:
  """numpy's dot top-K: q [B, n], docs [N, n] -> ids [B, K] (BLAS matmul, argpartition, sort)."""
  s = q @ docs.T
  part = np.argpartition(-s, K - 1, axis=1)[:, :K]
  order = np.argsort(-np.take_along_axis(s, part, 1), axis=1, kind="stable")
  return np.take_along_axis(part, order, 1)


def unit_rows(rng: np.random.Generator, rows: int, dim: int) -> np.ndarray:
  """[rows, dim] float32 rows of unit norm."""
  x = rng.standard_normal((rows, dim)).astype(np.float32)
  return x / np.linalg.norm(x, axis=1, keepdims=True)


def measure(num_docs: int, dim: int, repeats: int, seed: int,
            batches: tuple[int, ...] = BATCHES) -> list[dict[str, Any]]:
  """Every row of `curve_rows` at N = num_docs, width dim: index facts and ms per query at each
  batch (module docstring), the numpy peer last. Each row's top-K ids at the largest batch are
  checked against a brute-force twin of its scores (`score_all`, float64 top-K sets)."""
  rng = np.random.default_rng(seed)
  docs_np = unit_rows(rng, num_docs, dim)
  queries = unit_rows(rng, max(batches), dim)
  docs = jnp.asarray(docs_np)
  rows, fns = [], {}
  for i, (name, options) in enumerate(curve_rows()):
    module, params = build(options, dim, seed + i)
    facts, doc_side = costs.index_facts(module, params, docs_np)
    project, served = costs.search_fns(module, params, facts, doc_side, docs)
    rows.append({"row": name, "scorer": options["scorer"],
                 "options": files.to_jsonable(options), **facts})
    fns[name] = project
    if served is not None:
      fns[f"{name}@served"] = served
    _check_ids(name, module, params, project, served, queries[:8], docs)
  numpy_row = {"row": "numpy dot", "scorer": "dot", "peer": True}
  for b in batches:
    qb = jnp.asarray(queries[:b])
    calls = {name: (lambda f=f, qb=qb: f(qb)) for name, f in fns.items()}
    fastest = {}
    ms = timing.timed_interleaved(calls, repeats, warmup=1, rewarm=1, fastest=fastest)
    # numpy after the rows, not among them: its BLAS threads spin on after each call and would
    # slow whichever row follows it
    ms |= timing.timed_interleaved({"numpy": lambda qn=queries[:b]: numpy_topk(qn, docs_np)},
                                   repeats, warmup=1, fastest=fastest)
    for row in rows:
      per_q = ms[row["row"]] / b
      served = ms.get(f"{row['row']}@served", ms[row["row"]]) / b
      dot = ms["dot"] / b
      row.setdefault("ms_per_query", {})[str(b)] = per_q
      row.setdefault("fastest_ratio_vs_dot", {})[str(b)] = fastest[row["row"]] / fastest["dot"]
      row.setdefault("served_ms_per_query", {})[str(b)] = served
      row.setdefault("extra_ms_over_dot", {})[str(b)] = per_q - dot
      row.setdefault("ratio_vs_dot", {})[str(b)] = per_q / dot
      row.setdefault("served_ratio_vs_dot", {})[str(b)] = served / dot
    numpy_row.setdefault("ms_per_query", {})[str(b)] = ms["numpy"] / b
    numpy_row.setdefault("ratio_vs_dot", {})[str(b)] = ms["numpy"] / ms["dot"]
    numpy_row.setdefault("fastest_ratio_vs_dot", {})[str(b)] = fastest["numpy"] / fastest["dot"]
  rows.append(numpy_row)
  for row in rows:
    row.update(docs=num_docs, dim=dim)
  return rows


def _check_ids(name, module, params, project, served, q, docs) -> None:
  """The row's search returns the top-K of its own `score_all` (sets, ties aside)."""
  scores = np.asarray(module.apply({"params": params}, q, docs, method=module.score_all),
                      np.float64)
  kth = -np.sort(-scores, axis=1)[:, K - 1:K]
  for label, fn in (("project", project), ("served", served)):
    if fn is None:
      continue
    got = np.take_along_axis(scores, np.asarray(fn(q)), axis=1)
    if not np.all(got >= kth - 1e-4 * (1 + np.abs(kth))):
      raise AssertionError(f"{name} ({label} path): not the exact top-{K}")


def hardware() -> str:
  """The machine, jax's backend and threads, and numpy's BLAS core and threads."""
  from threadpoolctl import threadpool_info  # pylint: disable=g-import-not-at-top
  blas = [f"{i.get('prefix')} ({os.path.basename(os.path.dirname(i.get('filepath', '')))}) "
          f"{i.get('num_threads')} threads"
          for i in threadpool_info() if i.get("user_api") == "blas"]
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return (f"{timing.hardware()}; XLA:CPU intra-op threads: its default (the {cores} usable "
          f"cores); numpy BLAS: {', '.join(blas) or 'unknown'}")


def table(rows: list[dict[str, Any]], batches: tuple[int, ...] = BATCHES) -> str:
  """The printed table of one width's rows."""
  head = (f"{'row':<22} {'index':<10} {'extra B/doc':>11} {'raw B/doc':>9}"
          + "".join(f" {'ms/q b' + str(b):>10} {'x dot':>6} {'+ms':>8} {'best x':>6}"
                    for b in batches)
          + "".join(f" {'served b' + str(b):>11}" for b in batches))
  lines = [head, "-" * len(head)]
  for r in rows:
    extra = "" if r.get("peer") else f"{r['extra_bytes_per_doc']:.0f}"
    line = (f"{r['row']:<22} {r.get('index', 'peer'):<10} {extra:>11} "
            f"{r.get('raw_bytes_per_doc', ''):>9}")
    for b in batches:
      k = str(b)
      more = r.get("extra_ms_over_dot", {}).get(k)
      line += (f" {r['ms_per_query'][k]:>10.3f} {r['ratio_vs_dot'][k]:>6.2f} "
               + (f"{more:>8.3f}" if more is not None else f"{'':>8}")
               + f" {r['fastest_ratio_vs_dot'][k]:>6.2f}")
    for b in batches:
      s = r.get("served_ms_per_query", {}).get(str(b))
      line += f" {s:>11.3f}" if s is not None else f" {'':>11}"
    lines.append(line)
  return "\n".join(lines)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--docs", type=int, default=27413, help="N (InsuranceQA V2's answers)")
  p.add_argument("--dims", type=int, nargs="+", default=[384, 768],
                 help="widths n (MiniLM 384, mpnet 768)")
  p.add_argument("--batches", type=int, nargs="+", default=list(BATCHES),
                 help="query batch sizes timed")
  p.add_argument("--repeats", type=int, default=15)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--json", default="", help="also write the results here")
  args = p.parse_args(argv)
  hw = hardware()
  print(f"# row costs: exact top-{K} over N = {args.docs:,} random unit docs; median of "
        f"{args.repeats} interleaved rounds; ms per query\n# {hw}")
  print(f"# {blas_setup.describe()}")
  out = {"hardware": hw, "k": K, "docs": args.docs, "repeats": args.repeats,
         "seed": args.seed, "batches": args.batches, "rows": []}
  for dim in args.dims:
    rows = measure(args.docs, dim, args.repeats, args.seed, tuple(args.batches))
    print(f"\n## n = {dim}\n{table(rows, tuple(args.batches))}", flush=True)
    out["rows"] += rows
  print("\n" + json.dumps(out))
  if args.json:
    files.atomic_write_json(args.json, out)


if __name__ == "__main__":
  sys.exit(main())
