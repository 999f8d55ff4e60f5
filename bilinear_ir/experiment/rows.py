"""The rows of a table: baselines, a spec over seeds, the dev-selected learned row, the hybrid.

A table compares, per embedding, the untrained dot product and BM25 (`baselines`) with trained
rows, each run over every seed (`seed_runs`) and summarised (`summary`: mean and sample std over
seeds, the dev metric, the mean over the unseen-doc test queries, `unseen_doc_queries`). The
learned row is the one best on dev (`best_on_dev`); its hybrid with BM25 is
`evaluate.HybridEvaluator`'s.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from bilinear_ir.data import pipeline
from bilinear_ir.experiment import evaluate
from bilinear_ir.experiment import spec as spec_lib
from bilinear_ir.experiment import training


def unseen_doc_queries(splitsets: Sequence[pipeline.SplitSet]) -> list[str]:
  """Sorted test queries of every split set none of whose relevant docs is relevant to one of
  its training or dev queries.

  On SciFact most test claims cite abstracts that training claims cite too, so a learned
  similarity can gain by learning which docs get cited; this subset shows the gain without it.
  """
  out = []
  for s in splitsets:
    seen = {d for split in (s.train, s.dev) for q in split.query_ids
            for d, rel in split.qrels[q].items() if rel > 0}
    out += [q for q in s.test.query_ids
            if not any(rel > 0 and d in seen for d, rel in s.test.qrels[q].items())]
  return sorted(out)


def subset_mean(per_query: dict[str, dict[str, float]], qids: list[str], measure: str) -> float:
  """Mean of `measure` over the queries `qids` of per-query metrics (nan when empty)."""
  return float(np.mean([per_query[q][measure] for q in qids])) if qids else float("nan")


def aggregate(outs: list[dict[str, float]], measures) -> tuple[dict, dict]:
  """[{measure: value}] over seeds -> ({measure: mean}, {measure: std}); the sample std
  (ddof = 1) over the seeds, 0 for a single seed."""
  mean = {m: float(np.mean([o[m] for o in outs])) for m in measures}
  std = {m: float(np.std([o[m] for o in outs], ddof=1)) if len(outs) > 1 else 0.0
         for m in measures}
  return mean, std


def seed_mean(per_query: list[dict[str, dict[str, float]]], measure: str) -> dict[str, float]:
  """One measure per query, averaged over seeds: [{qid: {measure: v}}] -> {qid: v}."""
  return {q: float(np.mean([p[q][measure] for p in per_query])) for q in sorted(per_query[0])}


def query_means(per_query_metrics: list[dict[str, dict[str, float]]], measures) -> dict[str, float]:
  """Mean over queries of the seed-mean of each measure."""
  qids = sorted(per_query_metrics[0])
  return {m: float(np.mean([np.mean([o[q][m] for o in per_query_metrics]) for q in qids]))
          for m in measures}


def dev_mean(outs: list[dict[str, Any]], sel: str) -> float | None:
  """Mean dev metric `sel` over seeds; None without a dev split (`data.dev_fraction = 0`)."""
  vals = [o["dev"].get(sel) for o in outs]
  return None if any(v is None for v in vals) else float(np.mean(vals))


def best_on_dev(items: Sequence[Any], dev_of: Callable[[Any], float | None]) -> Any:
  """The item with the best dev metric (the first on ties); the first without a dev split (some
  `dev_of` None)."""
  if any(dev_of(x) is None for x in items):
    return items[0]
  return max(items, key=dev_of)


def baselines(recipe: spec_lib.Recipe, prepared: pipeline.Prepared,
              splitsets: Sequence[pipeline.SplitSet], measures: Sequence[str]
              ) -> tuple[dict[str, Any], dict[str, Any], dict]:
  """The untrained dot product (`recipe.row({"scorer": "dot"}, recipe.seed)`, through
  `training.train_and_evaluate` on each split set) and BM25, on every test query.

  Returns:
    (dot: `train_and_evaluate` of the first split set with "per_query" over every split set's
     test queries, BM25 metrics {"mean", "per_query"}, BM25 run).
  """
  dot, per_query = None, {}
  for s in splitsets:
    out = training.train_and_evaluate(recipe.row({"scorer": "dot"}, recipe.seed), prepared, s,
                                      progress=False)
    dot = dot or out
    per_query.update(out["per_query"])
  qids = sorted(q for s in splitsets for q in s.test.query_ids)
  qrels = {q: s.test.qrels[q] for s in splitsets for q in s.test.query_ids}
  rows = prepared.query_row_index(qids)
  bm25, run = evaluate.evaluate_run(qids, prepared.collection.doc_ids, prepared.bm25_idx[rows],
                                    prepared.bm25_scores[rows], qrels, measures)
  return {**dot, "per_query": per_query}, bm25, run


def baseline_rows(dot: dict[str, Any], bm25: dict[str, Any], unseen: list[str],
                  measures: Sequence[str]) -> list[dict[str, Any]]:
  """The rows of `baselines`' dot and BM25 (one run each: std 0; BM25 ranks the full corpus)."""
  zero = {m: 0.0 for m in measures}
  return [{"scorer": "dot", "metrics": dot["metrics"], "std": zero, "dev": dot["dev"],
           "seeds": 1, "unseen_docs": unseen_mean([dot], unseen, measures[0])},
          {"scorer": "bm25", "mode": "full", "metrics": bm25["mean"], "std": zero, "seeds": 1,
           "unseen_docs": unseen_mean([bm25], unseen, measures[0])}]


def seed_runs(recipe: spec_lib.Recipe, spec: dict[str, Any], seeds: Sequence[int],
              prepared: pipeline.Prepared, splitset: pipeline.SplitSet,
              train: dict[str, Any] | None = None,
              each: Callable[[int, dict[str, Any]], None] | None = None,
              workdir: str | None = None) -> list[dict[str, Any]]:
  """`training.train_and_evaluate` of row `spec` (`Recipe.row`, with the `train` changes) at
  every seed; `each(seed, out)` after each. With a `workdir`, each run checkpoints in its own
  folder (`training.run_dir`), so a killed job's rerun resumes it."""
  outs = []
  for seed in seeds:
    row = recipe.row(spec, seed, train)
    folder = training.run_dir(workdir, row, prepared, splitset,
                              f"{recipe.name or 'run'}-{spec_lib.row_slug(spec)}-seed{seed}")
    out = training.train_and_evaluate(row, prepared, splitset, workdir=folder, progress=False)
    outs.append(out)
    if each is not None:
      each(seed, out)
  return outs


def summary(outs: list[dict[str, Any]], measures: Sequence[str], sel: str, unseen: list[str]
            ) -> dict[str, Any]:
  """A row over seeds: test metrics (mean, sample std), dev `sel` (mean; None without dev),
  seeds, best steps, and the first measure on the unseen-doc queries (mean over seeds)."""
  mean, std = aggregate([o["metrics"] for o in outs], measures)
  m0 = measures[0]
  return {"metrics": mean, "std": std, "dev": {sel: dev_mean(outs, sel)}, "seeds": len(outs),
          "best_steps": [o["best_step"] for o in outs],
          "unseen_docs": unseen_mean(outs, unseen, m0)}


def unseen_mean(outs: list[dict[str, Any]], unseen: list[str], measure: str) -> dict[str, float]:
  """{measure: mean over seeds of its mean over the unseen-doc test queries}."""
  return {measure: float(np.mean([subset_mean(o["per_query"], unseen, measure) for o in outs]))}


def pool_p_at_1(prepared: pipeline.Prepared, split: pipeline.Split, pools: np.ndarray | None,
                runs: Sequence[tuple[float, Any, Any]], normalize: str) -> dict[str, float]:
  """{"p_at_1_pool": mean over queries of the seed-mean P@1 over each query's own pool}
  (`evaluate.PoolEvaluator`), or {} without pools (`evaluate.candidate_pools` None).

  Args:
    runs: one (lam, module, params) per seed: lam 1 a dense row, 0 BM25, else the hybrid.
  """
  if pools is None:
    return {}
  evaluator = evaluate.PoolEvaluator(prepared, split, pools)
  per_query = [evaluator(lam, normalize, module, params)["per_query"]
               for lam, module, params in runs]
  return {"p_at_1_pool": float(np.mean([np.mean([p[q] for p in per_query])
                                        for q in split.query_ids]))}
