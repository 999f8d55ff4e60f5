"""The protocol the training jobs share: one row's config, training with dev selection, seeds.

`train_and_evaluate` is the recipe every trained row follows (train on `splitset.train`, select
on `.dev`, evaluate on `.test`); `embeddings_of` walks the embeddings a table compares, loading
the collection and BM25 once; `row_config`, `aggregate`, `unseen_doc_queries` and `subset_mean`
build and summarise the rows of a table over seeds.
"""
from __future__ import annotations

import copy
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bilinear_ir import defaults
from bilinear_ir import lowrank
from bilinear_ir import scorers
from bilinear_ir.data import pipeline
from bilinear_ir.eval import stats
from bilinear_ir.retrieval import ranking
from bilinear_ir.train import losses
from bilinear_ir.train import trainer


def initial_params(module, seed: int, docs: np.ndarray) -> Any:
  """The params a trained row starts from: `scorers.init_params` by `seed`, except that a pure
  low-rank P Q^T with `factor_init = "pca"` starts at the top-r principal projection of `docs`
  [N, n] (P = Q = the top-r right singular vectors)."""
  params = scorers.init_params(module, jax.random.key(seed))
  if getattr(module, "factor_init", None) == "pca" and module.residual == "none":
    params = dict(params)
    params["P"], params["Q"] = lowrank.pca_factors(docs, module.rank)
  return params


def train_and_evaluate(config: ml_collections.ConfigDict, prepared: pipeline.Prepared,
                       splitset: pipeline.SplitSet, workdir: str | None = None,
                       progress: bool = True,
                       aux_loss: Callable[[Any, tuple, tuple], jnp.ndarray] | None | str = "auto"
                       ) -> dict[str, Any]:
  """Trains `config.model` on `splitset.train`, selects on `.dev`, evaluates on `.test`.

  Args:
    config: a train_eval-style config (model, train, eval, seed).
    prepared: `data.pipeline.Prepared` (collection, embeddings, BM25 rankings).
    splitset: `data.pipeline.SplitSet`.
    workdir: checkpoints go to `workdir/checkpoints`, TensorBoard scalars to `workdir/tb`
      (None: neither).
    progress: show progress bars.
    aux_loss: optional `(params, q, docs) -> scalar` added to the training loss (passed to
      `fit`; e.g. MoL's L_MI, `losses.MiLoss`). "auto": `losses.mi_loss(module)` for a scorer
      with an `mi_weight` (MoL; None when the weight is 0), nothing otherwise. It is a static
      argument of the jitted step: pass a value that compares and hashes by content (a frozen
      dataclass over the module and weight), not a new lambda per call, or every call compiles
      the step again.

  Returns:
    {"metrics": test means, "per_query": ..., "dev": best dev metrics, "history", "best_step",
     "mode", "params", "run", "temperature"}.
  """
  emb = prepared.embeddings
  module = scorers.from_config(config.model, prepared.dim)
  if aux_loss == "auto":
    aux_loss = losses.mi_loss(module) if hasattr(module, "mi_weight") else None
  params = initial_params(module, config.seed, emb.docs)
  tcfg, ecfg = config.train, config.eval
  ts, train_rows = pipeline.trainset(prepared, splitset.train,
                                     tcfg.hard_depth if tcfg.hard_negatives else 0)
  docs = emb.docs
  doc_ids = prepared.collection.doc_ids

  def evaluate_on(split, p, measures, depth):
    rows = prepared.query_row_index(split.query_ids)
    cands = prepared.bm25_idx[rows][:, :ecfg.rerank_depth] if ecfg.mode == "rerank" else None
    return ranking.evaluate_scorer(module, p, emb.queries[rows], docs, split.query_ids, doc_ids,
                                   split.qrels, mode=ecfg.mode, depth=depth,
                                   candidates=cands, measures=measures)

  # Dev evaluations only need the depth of their measures (all @k), not the run's full depth.
  dev_measures = sorted({tcfg.select_metric, "ndcg@10", "mrr@10"})
  dev_depth = (max(int(m.split("@")[1]) for m in dev_measures)
               if all("@" in m for m in dev_measures) else ecfg.depth)
  evaluate = None
  if splitset.dev.query_ids:
    evaluate = lambda p: evaluate_on(splitset.dev, p, dev_measures, dev_depth)[0]["mean"]
  if jax.tree.leaves(params):
    result = trainer.fit(module, params, emb.queries[train_rows], docs, ts, tcfg, config.seed,
                         evaluate=evaluate,
                         checkpoint_dir=os.path.join(workdir, "checkpoints") if workdir else None,
                         log_dir=(os.path.join(workdir, "tb")
                                  if workdir and tcfg.get("tensorboard", False) else None),
                         aux_loss=aux_loss, progress=progress)
    params, history, best_step, temperature = (result.params, result.history, result.best_step,
                                               result.temperature)
  else:
    history, best_step, temperature = [], 0, None
  dev = evaluate(params) if evaluate is not None else {}
  metrics, run = evaluate_on(splitset.test, params, tuple(ecfg.measures), ecfg.depth)
  return {"metrics": metrics["mean"], "per_query": metrics["per_query"], "dev": dev,
          "history": history, "best_step": best_step, "mode": ecfg.mode, "params": params,
          "run": run, "temperature": temperature}


def row_config(config: ml_collections.ConfigDict, spec: dict[str, Any], seed: int
               ) -> ml_collections.ConfigDict:
  """A copy of `config` for one table row `spec` ({"scorer", "rank", "residual"}) and `seed`."""
  c = copy.deepcopy(config)
  with c.unlocked():
    c.seed = seed
    c.model.scorer = spec["scorer"]
    if spec["rank"] is not None:
      c.model.rank = spec["rank"]
      c.model.residual = spec["residual"]
  return c


def embedding_config(config: ml_collections.ConfigDict, name: str) -> ml_collections.ConfigDict:
  """A copy of `config` with the encoder of embedding `name` (`defaults.embedding_spec`) and its
  `train_overrides`."""
  c = copy.deepcopy(config)
  with c.unlocked():
    for key, value in defaults.embedding_spec(name).items():
      c.encoder[key] = value
    for key, value in config.train_overrides.get(name, {}).items():
      c.train[key] = value
  return c


def embeddings_of(config: ml_collections.ConfigDict):
  """(name, `embedding_config(config, name)`, its `pipeline.Prepared`, splits) for each of
  `config.embeddings`, lazily. The collection and BM25 do not depend on the encoder: they are
  loaded once (`pipeline.prepare`) and only the embeddings are redone (`pipeline.reembed`)."""
  prepared = None
  for name in config.embeddings:
    cfg = embedding_config(config, name)
    prepared = (pipeline.prepare(cfg) if prepared is None
                else pipeline.reembed(prepared, cfg.encoder))
    yield name, cfg, prepared, pipeline.splits(prepared.collection, cfg.data, cfg.seed)[0]


def unseen_doc_queries(collection, train_split: str, test: pipeline.Split) -> list[str]:
  """Test queries none of whose relevant docs is relevant to any training query.

  On SciFact most test claims cite abstracts that training claims cite too, so a learned
  similarity can gain by learning which docs get cited; this subset shows the gain without it.
  """
  seen = {d for judged in collection.qrels[train_split].values()
          for d, rel in judged.items() if rel > 0}
  return [q for q in test.query_ids
          if not any(rel > 0 and d in seen for d, rel in test.qrels[q].items())]


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


def add_paired(rows: list[dict[str, Any]], per_query: list[dict[str, float]], baseline,
               field: str, config) -> list[dict[str, Any]]:
  """Adds `row[field]` = `eval.stats.paired(row's per-query values, its baseline's)` to every
  row that has a baseline, then Holm-adjusts them together (`p_holm`).

  Args:
    rows: the rows.
    per_query: [len(rows)] {qid: value} of each row (e.g. `seed_mean`).
    baseline: row index -> the index of the row it is compared with, or None (no comparison).
    field: where the comparison goes ("vs_dot", "vs_bm25").
    config: has `seed` and `stats` (`defaults.stats_config()`).

  Returns:
    The comparisons (one family, Holm-adjusted).
  """
  family = []
  for i, row in enumerate(rows):
    j = baseline(i)
    if j is None:
      continue
    row[field] = stats.paired(per_query[i], per_query[j], seed=config.seed,
                              resamples=config.stats.resamples,
                              bootstrap=config.stats.resamples, alpha=config.stats.alpha)
    family.append(row[field])
  stats.apply_holm(family)
  return family
