"""The protocol the training jobs share: one row's config, training with dev selection, seeds.

`train_and_evaluate` is the recipe every trained row follows (train on `splitset.train`, select
on `.dev`, evaluate on `.test`); `embeddings_of` walks the embeddings a table compares, loading
the collection and BM25 once; `row_config`, `aggregate`, `unseen_doc_queries` and `subset_mean`
build and summarise the rows of a table over seeds.
"""
from __future__ import annotations

import copy
import dataclasses
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bilinear_ir import defaults
from bilinear_ir import lowrank
from bilinear_ir import scorers
from bilinear_ir.data import batches
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


@dataclasses.dataclass
class TrainingData:
  """What a model trains and is selected on, whatever the source of its pairs.

  Attributes:
    queries: [Q_t, ...] query features of the training pairs' query rows.
    docs: [N + R, ...] doc features: the corpus, then R extra docs (ICT positives whose span was
      cut).
    trainset: the pairs over those rows and the negative pools.
    dev: source "ict": (query features [Q_d, ...], doc features [N, ...], query ids, qrels) of
      the held-out ICT pairs (None when there are none: the last step wins); the other sources
      select on the split set's dev split (None here).
    source: "qrels", "ict" or "both".
    ict_pairs: ICT training pairs used (0 for "qrels").
  """
  queries: Any
  docs: Any
  trainset: Any
  dev: tuple | None
  source: str
  ict_pairs: int


def training_data(config: ml_collections.ConfigDict, prepared: pipeline.Prepared,
                  splitset: pipeline.SplitSet) -> TrainingData:
  """The training pairs of `config.train.source` (see `defaults.train_config`).

  "qrels": the judged pairs of `splitset.train`, selected on `splitset.dev`. "ict": pairs the
  corpus makes itself (`pipeline.ict_set`); no judgement is read, and the model is selected on
  the held-out ICT pairs, ranked over the corpus in which each held-out doc is its positive.
  "both": the judged pairs plus `train.ict.ratio` ICT pairs per judged pair (drawn by the ICT
  seed), selected on `splitset.dev`.
  """
  tcfg, emb = config.train, prepared.embeddings
  source = tcfg.get("source", "qrels")
  hard_depth = tcfg.hard_depth if tcfg.hard_negatives else 0
  n = prepared.collection.num_docs
  negatives_from = tcfg.get("negatives_from", "bm25")
  if source == "qrels":
    ts, rows = pipeline.trainset(prepared, splitset.train, hard_depth, negatives_from)
    return TrainingData(emb.queries[rows], emb.docs, ts, None, source, 0)
  data = pipeline.ict_set(prepared, config.encoder, tcfg.ict, max(hard_depth, 1))
  docs = np.concatenate([emb.docs, data.extra_docs])
  is_dev = data.pairs.dev
  if source == "ict":
    ts = pipeline.ict_trainset(data, ~is_dev, n, hard_depth)
    dev_docs = np.array(emb.docs)
    cut = np.flatnonzero(is_dev & data.pairs.removed)
    dev_docs[data.pairs.sources[cut]] = data.extra_docs[data.positive_rows[cut] - n]
    dev_idx = np.flatnonzero(is_dev)
    qids = [f"ict{i}" for i in dev_idx]
    qrels = {q: {prepared.collection.doc_ids[data.pairs.sources[i]]: 1}
             for q, i in zip(qids, dev_idx)}
    dev = (data.queries[dev_idx], dev_docs, qids, qrels) if len(dev_idx) else None
    return TrainingData(data.queries[~is_dev], docs, ts, dev, source, int(np.sum(~is_dev)))
  judged, rows = pipeline.trainset(prepared, splitset.train, hard_depth, negatives_from)
  pool = np.flatnonzero(~is_dev)
  take = min(len(pool), int(round(float(tcfg.ict.ratio) * len(judged.pairs))))
  keep = np.zeros(len(is_dev), bool)
  keep[np.random.default_rng([int(tcfg.ict.seed), 13]).choice(pool, take, replace=False)] = True
  ts = pipeline.ict_trainset(data, keep, n, hard_depth, query_offset=judged.num_queries)
  hard = None
  if hard_depth:
    hard = np.full((ts.num_queries, max(judged.hard_negatives.shape[1],
                                        ts.hard_negatives.shape[1])), -1, np.int64)
    hard[:judged.num_queries, :judged.hard_negatives.shape[1]] = judged.hard_negatives
    hard[judged.num_queries:, :ts.hard_negatives.shape[1]] = ts.hard_negatives[
        judged.num_queries:]
  both = batches.TrainSet(np.concatenate([judged.pairs, ts.pairs]), ts.num_queries, n, hard,
                          ts.excluded)
  queries = np.concatenate([emb.queries[rows], data.queries[keep]])
  return TrainingData(queries, docs, both, None, source, take)


def train_and_evaluate(config: ml_collections.ConfigDict, prepared: pipeline.Prepared,
                       splitset: pipeline.SplitSet, workdir: str | None = None,
                       progress: bool = True,
                       aux_loss: Callable[[Any, tuple, tuple], jnp.ndarray] | None | str = "auto"
                       ) -> dict[str, Any]:
  """Trains `config.model` on the pairs of `config.train.source` (`training_data`), selects on
  their dev set, evaluates on `splitset.test`.

  Args:
    config: a train_eval-style config (model, train, eval, encoder, seed).
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
     "mode", "params", "run", "temperature", "train_source", "ict_pairs"}.
  """
  emb = prepared.embeddings
  module = scorers.from_config(config.model, prepared.dim)
  if aux_loss == "auto":
    aux_loss = losses.mi_loss(module) if hasattr(module, "mi_weight") else None
  params = initial_params(module, config.seed, emb.docs)
  tcfg, ecfg = config.train, config.eval
  doc_ids = prepared.collection.doc_ids

  def evaluate_on(split, p, measures, depth):
    rows = prepared.query_row_index(split.query_ids)
    cands = prepared.bm25_idx[rows][:, :ecfg.rerank_depth] if ecfg.mode == "rerank" else None
    return ranking.evaluate_scorer(module, p, emb.queries[rows], emb.docs, split.query_ids,
                                   doc_ids, split.qrels, mode=ecfg.mode, depth=depth,
                                   candidates=cands, measures=measures)

  # Dev evaluations only need the depth of their measures (all @k), not the run's full depth.
  dev_measures = sorted({tcfg.select_metric, "ndcg@10", "mrr@10"})
  dev_depth = (max(int(m.split("@")[1]) for m in dev_measures)
               if all("@" in m for m in dev_measures) else ecfg.depth)
  has_params = bool(jax.tree.leaves(params))
  data = training_data(config, prepared, splitset) if has_params else None
  evaluate = None
  if data is not None and data.source == "ict":
    if data.dev is not None:
      q_dev, d_dev, dev_ids, dev_qrels = data.dev
      evaluate = lambda p: ranking.evaluate_scorer(
          module, p, q_dev, d_dev, dev_ids, doc_ids, dev_qrels, mode="full", depth=dev_depth,
          measures=dev_measures)[0]["mean"]
  elif splitset.dev.query_ids:
    evaluate = lambda p: evaluate_on(splitset.dev, p, dev_measures, dev_depth)[0]["mean"]
  if has_params:
    if data.source == "ict" and int(tcfg.steps) == 0:
      tcfg = copy.deepcopy(tcfg)
      tcfg.epochs = int(tcfg.ict.epochs)
    result = trainer.fit(module, params, data.queries, data.docs, data.trainset, tcfg,
                         config.seed, evaluate=evaluate,
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
          "run": run, "temperature": temperature,
          "train_source": tcfg.get("source", "qrels"),
          "ict_pairs": data.ict_pairs if data is not None else 0}


def row_config(config: ml_collections.ConfigDict, spec: dict[str, Any], seed: int
               ) -> ml_collections.ConfigDict:
  """A copy of `config` for one table row `spec` ({"scorer", "rank", "residual"}, and the
  training `source` when it is not "qrels") and `seed`."""
  c = copy.deepcopy(config)
  with c.unlocked():
    c.seed = seed
    c.model.scorer = spec["scorer"]
    if spec["rank"] is not None:
      c.model.rank = spec["rank"]
      c.model.residual = spec["residual"]
    if "source" in spec:
      c.train.source = spec["source"]
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
