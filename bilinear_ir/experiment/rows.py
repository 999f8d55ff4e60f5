"""What the rows of a table are made of: a spec trained over seeds (`seed_runs`), means over
seeds and queries (`aggregate`, `seed_mean`, `query_means`, `dev_mean`), dev selection
(`best_on_dev`), the unseen-doc test queries (`unseen_doc_queries`, `unseen_mean`), P@1 over
each query's own pool (`pool_p_at_1`) and the fit to the training queries (`training_fit`).
`experiment.table` runs a table's rows with them.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from bilinear_ir.config import tables
from bilinear_ir.data import pipeline
from bilinear_ir.eval import metrics as metrics_lib
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


def without_run(fit: dict[str, Any]) -> dict[str, Any]:
  """A fit (`training.train_and_evaluate`'s out) without its "run": a table reads per-query
  metrics, and a run dict (query -> doc -> score, `eval.depth` deep) is 100 MB at 2,000 queries
  x 1,000 docs, which a curve's 75 runs per embedding would each keep to the end."""
  return {k: v for k, v in fit.items() if k != "run"}


def seed_runs(recipe: spec_lib.Recipe, spec: Mapping[str, Any], seeds: Sequence[int],
              prepared: pipeline.Prepared, splitset: pipeline.SplitSet,
              train: Mapping[str, Any] | None = None,
              each: Callable[[int, dict[str, Any]], None] | None = None,
              workdir: str | None = None, name: str | None = None) -> list[dict[str, Any]]:
  """`training.train_and_evaluate` of row `spec` (`Recipe.row`, with the `train` changes) at
  every seed, each out with its "seconds" and `without_run`; `each(seed, out)` after each. With a
  `workdir`, each run checkpoints in its own folder (`training.run_dir`:
  "<embedding>-<name>-seed<seed>", name default `tables.row_slug(spec)`), so a killed job's rerun
  resumes it."""
  outs = []
  for seed in seeds:
    row = recipe.row(spec, seed, train)
    folder = training.run_dir(workdir, row, prepared, splitset,
                              f"{recipe.name or 'run'}-{name or tables.row_slug(spec)}-seed{seed}")
    started = time.perf_counter()
    out = without_run(training.train_and_evaluate(row, prepared, splitset, workdir=folder,
                                                  progress=False))
    out["seconds"] = time.perf_counter() - started
    outs.append(out)
    if each is not None:
      each(seed, out)
  return outs


def fit_queries(split: pipeline.Split, k: int, seed: int) -> list[str]:
  """Up to `k` of `split`'s query ids (all when it has no more), drawn by `seed`, sorted."""
  ids = list(split.query_ids)
  if len(ids) <= k:
    return ids
  return sorted(np.random.default_rng(seed).choice(ids, k, replace=False).tolist())


def training_fit(prepared: pipeline.Prepared, ecfg, runs: Sequence[tuple[int, pipeline.Split,
                                                                        dict[str, Any]]],
                 k: int, measure: str) -> dict[str, Any]:
  """How much better the selected params rank their own training queries than step 0 does: the
  gap between this and the gain on dev is what the model learnt of its training questions only.

  Args:
    prepared: the cell's collection, embeddings and BM25.
    ecfg: the `eval` block (mode, rerank depth).
    runs: one (seed, the training split it trained on, its `train_and_evaluate` out) per run.
    k: training queries evaluated per run (`fit_queries`, drawn by the run's seed).
    measure: the measure (the dev selection metric; an @k measure).

  Returns:
    {"queries": [per run: how many], "step0": mean over runs of `measure` at the initial params
    (`training.initial_params`, the dot product for a scorer that starts at it), "selected":
    the same at the params dev selected}.
  """
  depth = metrics_lib.parse_measure(measure)[1] or ecfg.depth
  counts, step0, selected = [], [], []
  for seed, split, out in runs:
    qids = fit_queries(split, k, seed)
    sub = pipeline.Split("fit", qids, {q: split.qrels[q] for q in qids})
    module = out["module"]
    for params, into in ((training.initial_params(module, seed, prepared.embeddings.docs),
                          step0), (out["params"], selected)):
      metrics, _ = training.evaluate_split(prepared, ecfg, sub, module, params, [measure], depth)
      into.append(metrics["mean"][measure])
    counts.append(len(qids))
  return {"queries": counts, "step0": float(np.mean(step0)),
          "selected": float(np.mean(selected))}


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
