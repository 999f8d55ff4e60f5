"""Train and select on dev: the one training protocol of every trained row.

`train_and_evaluate` is the recipe every table scorer follows (train on `splitset.train` or on
pairs the corpus makes itself, select on dev, evaluate on `splitset.test`);
`train_token_model` is the same protocol for token-level scorers in the re-ranking setting
(`studies.late_interaction.setting.Setting`: selected on the dev split's re-ranked candidates);
`scorer_teacher` trains a table scorer with it and hands its scores to distillation.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from bilinear_ir import files
from bilinear_ir import lowrank
from bilinear_ir import scorers
from bilinear_ir.data import batches
from bilinear_ir.data import pipeline
from bilinear_ir.errors import require
from bilinear_ir.eval import metrics as metrics_lib
from bilinear_ir.experiment import evaluate
from bilinear_ir.experiment import spec
from bilinear_ir.retrieval import ranking
from bilinear_ir.train import losses
from bilinear_ir.train import teachers
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


def blends_with_dot(module) -> bool:
  """Whether `blend_with_dot` can blend `module` with the dot product: the scorers that start at
  it (wdp; bilinear; lowrank with residual "identity" or "diag")."""
  name = getattr(module, "registry_name", "")
  return name in ("wdp", "bilinear") or (name == "lowrank" and module.residual != "none")


def blend_with_dot(module, params: Any, lam: float) -> Any:
  """The params of `module` whose scores are `(1 - lam) q.d + lam s(q, d)`, `s` the scorer at
  `params`: W -> (1 - lam) I + lam W (bilinear), v -> 1 + lam (v - 1) (wdp, the diag residual),
  P Q^T -> lam P Q^T (lowrank with a residual: Q scaled). lam = 0 is the dot product, 1 the
  model. Only for `blends_with_dot(module)` scorers (else InputError)."""
  require(blends_with_dot(module), f"scorer {getattr(module, 'registry_name', module)!r} does "
          "not start at the dot product, so it cannot be blended with it",
          field="train.ict.guard")
  out = dict(params)
  if "W" in out:
    eye = jnp.eye(out["W"].shape[0], dtype=out["W"].dtype)
    out["W"] = (1.0 - lam) * eye + lam * out["W"]
  if "v" in out:
    out["v"] = 1.0 + lam * (out["v"] - 1.0)
  if "Q" in out:
    out["Q"] = lam * out["Q"]
  return out


def bm25_guard(module, params: Any, queries: np.ndarray, docs: np.ndarray,
               pseudo: np.ndarray, grid, measure: str = "ndcg@10") -> tuple[float, dict]:
  """The label-free ICT guard: the blend weight lam of `grid` (`blend_with_dot`) whose ranking
  of the collection's own query texts agrees best with BM25's.

  Each query's pseudo-relevant docs are BM25's top few (`pseudo`); no judgement is read. BM25
  does not depend on the dense model, so it can tell when ICT training moves the rankings of
  real queries away from the lexical evidence, which held-out ICT pairs cannot (they always
  prefer more ICT training). Ties go to the smaller lam (nearer the dot product). The whole
  corpus is ranked, whatever `eval.mode`.

  Args:
    module, params: the ICT-trained scorer (`blends_with_dot`).
    queries: [Q, n] features of the collection's queries.
    docs: [N, n] doc features.
    pseudo: [Q, k] doc rows BM25 ranks first for each query (-1: none).
    grid: lam values tried.
    measure: the agreement, a metric of `eval.metrics` at depth <= 1000 (e.g. ndcg@10) of the
      blended ranking against the pseudo-relevant docs.

  Returns:
    (the chosen lam, {lam: agreement}).
  """
  require(len(grid) > 0 and all(0.0 <= float(x) <= 1.0 for x in grid),
          f"needs lam values in [0, 1], got {list(grid)}", field="train.ict.guard_grid")
  depth = metrics_lib.parse_measure(measure)[1] or 1000
  qids = [str(i) for i in range(len(queries))]
  doc_ids = [str(j) for j in range(len(docs))]
  pseudo_qrels = {q: {doc_ids[int(d)]: 1 for d in row if d >= 0} for q, row in zip(qids, pseudo)}
  agreement = {}
  for lam in sorted(float(x) for x in grid):
    metrics, _ = evaluate.RankingEvaluator(qids, doc_ids, pseudo_qrels, [measure], depth=depth)(
        module, blend_with_dot(module, params, lam), queries, docs)
    agreement[lam] = float(metrics["mean"][measure])
  best = max(agreement.values())
  return min(lam for lam, v in agreement.items() if v == best), agreement


def data_pool(tcfg) -> tuple[int, str]:
  """(hard_depth, source) of the hard pool the data provides (`pipeline.trainset`) for the `train`
  block `tcfg`: depth 0 when no hard negatives are drawn, or when `negatives_from` is one the
  model provides in `trainer.fit` ("corpus", "mined": `trainer.MODEL_NEGATIVES`)."""
  negatives_from = tcfg.get("negatives_from", "bm25")
  if negatives_from in trainer.MODEL_NEGATIVES:
    return 0, "bm25"
  return (tcfg.hard_depth if tcfg.hard_negatives else 0), negatives_from


@dataclasses.dataclass
class TrainingData:
  """What a model trains and is selected on, whatever the source of its pairs.

  Attributes:
    queries: [Q_t, ...] query features of the training pairs' query rows.
    docs: [N + R, ...] doc features: the corpus, then R extra docs (ICT positives whose span was
      cut).
    trainset: the pairs over those rows and the negative pools.
    dev: source "ict": the held-out ICT pairs as rounds, each (query features [Q_r, ...], doc
      features [N, ...], query ids, qrels), a doc's row holding the version (cut or whole) that
      is the positive of the round's pairs from it; one round unless `pairs_per_doc > 1` gives
      a doc pairs with different positives (None when there are no held-out pairs: the last
      step wins). The other sources select on the split set's dev split (None here).
    source: "qrels", "ict" or "both".
    ict_pairs: ICT training pairs used (0 for "qrels").
  """
  queries: Any
  docs: Any
  trainset: Any
  dev: tuple | None
  source: str
  ict_pairs: int


def training_data(row: spec.Row, prepared: pipeline.Prepared,
                  splitset: pipeline.SplitSet) -> TrainingData:
  """The training pairs of `row.train.source` (see `config.blocks.train_config`).

  "qrels": the judged pairs of `splitset.train`, selected on `splitset.dev`. "ict": pairs the
  corpus makes itself (`pipeline.ict_set`); no judgement is read, and the model is selected on
  the held-out ICT pairs, ranked over the corpus in which each held-out doc is its positive
  (then guarded by `bm25_guard` in `train_and_evaluate`).
  "both": the judged pairs plus `train.ict.ratio` ICT pairs per judged pair (drawn by the ICT
  seed), selected on `splitset.dev`.
  """
  tcfg, emb = row.train, prepared.embeddings
  source = tcfg.get("source", "qrels")
  hard_depth, negatives_from = data_pool(tcfg)
  n = prepared.collection.num_docs
  if source == "qrels":
    ts, rows = pipeline.trainset(prepared, splitset.train, hard_depth, negatives_from)
    return TrainingData(emb.queries[rows], emb.docs, ts, None, source, 0)
  data = pipeline.ict_set(prepared, row.encoder, tcfg.ict, max(hard_depth, 1))
  docs = np.concatenate([emb.docs, data.extra_docs])
  is_dev = data.pairs.dev
  if source == "ict":
    ts = pipeline.ict_trainset(data, ~is_dev, n, hard_depth)
    sources, positives = data.pairs.sources, data.positive_rows
    # A doc's dev pairs with different positives (cut versions, the whole doc) go to different
    # rounds: one doc table holds one version of each doc.
    rounds, versions = {}, {}
    for i in np.flatnonzero(is_dev):
      key = (int(sources[i]), int(positives[i]))
      versions.setdefault(key, sum(k[0] == key[0] for k in versions))
      rounds.setdefault(versions[key], []).append(i)
    dev = []
    for r in sorted(rounds):
      idx = np.asarray(rounds[r])
      dev_docs = np.array(emb.docs)
      cut = idx[data.pairs.removed[idx]]
      dev_docs[sources[cut]] = data.extra_docs[positives[cut] - n]
      qids = [f"ict{i}" for i in idx]
      qrels = {q: {prepared.collection.doc_ids[sources[i]]: 1} for q, i in zip(qids, idx)}
      dev.append((data.queries[idx], dev_docs, qids, qrels))
    return TrainingData(data.queries[~is_dev], docs, ts, tuple(dev) or None, source,
                        int(np.sum(~is_dev)))
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


def train_and_evaluate(row: spec.Row, prepared: pipeline.Prepared,
                       splitset: pipeline.SplitSet, workdir: str | None = None,
                       progress: bool = True,
                       aux_loss: Callable[[Any, tuple, tuple], jnp.ndarray] | None | str = "auto"
                       ) -> dict[str, Any]:
  """Trains `row.model` on the pairs of `row.train.source` (`training_data`), selects on
  their dev set, evaluates on `splitset.test`.

  Args:
    row: the row (`experiment.spec.Row`: model, train, eval, encoder, seed).
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

  Source "ict" with `train.ict.guard = "bm25"`, for a scorer that starts at the dot product
  (`blends_with_dot`): the selected params are then blended with the dot product by the weight
  `bm25_guard` picks (label-free: the collection's query texts against BM25); the dev metrics
  and the test evaluation are those of the blend.

  Returns:
    {"metrics": test means, "per_query": ..., "dev": best dev metrics, "history", "best_step",
     "train_seconds" (`trainer.FitResult.seconds`; 0.0 untrained), "mode", "params", "module",
     "run", "temperature", "train_source", "negatives_from", "ict_pairs",
     "ict_guard": None, or {"lam": the blend weight, "agreement": {str(lam): agreement}}}.
  """
  emb = prepared.embeddings
  module = scorers.from_config(row.model, prepared.dim)
  if aux_loss == "auto":
    aux_loss = losses.mi_loss(module) if hasattr(module, "mi_weight") else None
  params = initial_params(module, row.seed, emb.docs)
  tcfg, ecfg = row.train, row.eval
  doc_ids = prepared.collection.doc_ids

  def evaluate_on(split, p, measures, depth):
    return evaluate_split(prepared, ecfg, split, module, p, measures, depth)

  # Dev evaluations only need the depth of their measures (all @k), not the run's full depth.
  dev_measures = list(evaluate.dev_measures(tcfg.select_metric))
  cutoffs = [metrics_lib.parse_measure(m)[1] for m in dev_measures]
  dev_depth = max(cutoffs) if all(k is not None for k in cutoffs) else ecfg.depth
  has_params = bool(jax.tree.leaves(params))
  data = training_data(row, prepared, splitset) if has_params else None
  on_dev = None
  if data is not None and data.source == "ict":
    if data.dev is not None:
      def on_dev(p):  # mean over the dev pairs of every round
        per_query = {}
        for q_dev, d_dev, dev_ids, dev_qrels in data.dev:
          per_query.update(evaluate.RankingEvaluator(
              dev_ids, doc_ids, dev_qrels, dev_measures, "full", dev_depth)(
                  module, p, q_dev, d_dev)[0]["per_query"])
        return {m: float(np.mean([v[m] for v in per_query.values()])) for m in dev_measures}
  elif splitset.dev.query_ids:
    on_dev = lambda p: evaluate_on(splitset.dev, p, dev_measures, dev_depth)[0]["mean"]
  if has_params:
    if data.source == "ict" and int(tcfg.steps) == 0:
      tcfg = copy.deepcopy(tcfg)
      tcfg.epochs = int(tcfg.ict.epochs)
    mine = None
    if tcfg.get("negatives_from", "bm25") == "mined":  # the current model's exact top k
      corpus = data.docs[:prepared.collection.num_docs]
      mine = lambda p, k: ranking.score_topk(module, p, data.queries, corpus, k)[0]
    result = trainer.fit(module, params, data.queries, data.docs, data.trainset, tcfg,
                         row.seed, evaluate=on_dev,
                         checkpoint_dir=os.path.join(workdir, "checkpoints") if workdir else None,
                         log_dir=(os.path.join(workdir, "tb")
                                  if workdir and tcfg.get("tensorboard", False) else None),
                         aux_loss=aux_loss, progress=progress, mine=mine)
    params, history, best_step, temperature = (result.params, result.history, result.best_step,
                                               result.temperature)
    train_seconds = result.seconds
  else:
    history, best_step, temperature, train_seconds = [], 0, None, 0.0
  guard = None
  if (data is not None and data.source == "ict" and tcfg.ict.get("guard", "none") == "bm25"
      and blends_with_dot(module)):
    lam, agreement = bm25_guard(module, params, emb.queries, emb.docs,
                                prepared.bm25_idx[:, :int(tcfg.ict.guard_depth)],
                                tcfg.ict.guard_grid, tcfg.select_metric)
    params = blend_with_dot(module, params, lam)
    guard = {"lam": lam, "agreement": {str(k): v for k, v in agreement.items()}}
  dev = on_dev(params) if on_dev is not None else {}
  metrics, run = evaluate_on(splitset.test, params, tuple(ecfg.measures), ecfg.depth)
  return {"metrics": metrics["mean"], "per_query": metrics["per_query"], "dev": dev,
          "history": history, "best_step": best_step, "train_seconds": train_seconds,
          "mode": ecfg.mode, "params": params,
          "run": run, "temperature": temperature, "module": module,
          "train_source": tcfg.get("source", "qrels"),
          "negatives_from": tcfg.get("negatives_from", "bm25"),
          "ict_pairs": data.ict_pairs if data is not None else 0, "ict_guard": guard}


def evaluate_split(prepared: pipeline.Prepared, ecfg, split: pipeline.Split, module, params: Any,
                   measures, depth: int) -> tuple[dict[str, Any], dict]:
  """(metrics, run) of (module, params) on the queries of `split` over the whole corpus, as the
  `eval` block `ecfg` says (`mode` full, or rerank of BM25's top `rerank_depth`), to `depth`."""
  rows = prepared.query_row_index(split.query_ids)
  cands = prepared.bm25_idx[rows][:, :ecfg.rerank_depth] if ecfg.mode == "rerank" else None
  return evaluate.RankingEvaluator(split.query_ids, prepared.collection.doc_ids, split.qrels,
                                   measures, ecfg.mode, depth, cands)(
                                       module, params, prepared.embeddings.queries[rows],
                                       prepared.embeddings.docs)


def run_dir(workdir: str | None, row: spec.Row | Mapping[str, Any],
            prepared: pipeline.Prepared, splitset: pipeline.SplitSet, name: str) -> str | None:
  """The folder of one training run of a job that trains many (`train_and_evaluate`'s
  `workdir`, or `fit`'s checkpoint folder, so a killed job's rerun resumes each run where it
  stopped and skips the finished ones): `workdir/runs/<name>-<key>`.

  key = 12 hex digits of a SHA-256 of what determines the run: the row's blocks (a `spec.Row`:
  model, train, eval, encoder, seed; or a JSON-able mapping of them, for runs that are not table
  rows), the collection's name and size, and the train and dev query ids in order. A changed
  config, collection or subset never resumes another run's checkpoint. `name`: any text, e.g.
  "mean-n100-seed0-wdp" (characters other than letters, digits, ".", "_" and "-" become "_").
  None without a workdir.
  """
  if not workdir:
    return None
  blocks = ({"model": row.model.to_dict(), "train": row.train.to_dict(),
             "eval": row.eval.to_dict(), "encoder": row.encoder.to_dict(),
             "seed": int(row.seed)} if isinstance(row, spec.Row) else dict(row))
  blocks_json = json.dumps({**blocks, "collection": prepared.collection.name,
                            "num_docs": int(prepared.collection.num_docs)},
                           sort_keys=True, default=str)
  key = files.sha256_texts([blocks_json, "train", *splitset.train.query_ids, "dev",
                            *splitset.dev.query_ids])[:12]
  return os.path.join(workdir, "runs", re.sub(r"[^A-Za-z0-9._-]+", "_", name) + f"-{key}")


def train_token_model(setting, module, params, tcfg, seed: int,
                      teacher: teachers.Teacher | None = None,
                      checkpoint_dir: str | None = None) -> trainer.FitResult:
  """Fits a token scorer on the train split (hard negatives from `tcfg.negatives_from`),
  selecting on dev re-ranking.

  Args:
    setting: the re-ranking setting (`studies.late_interaction.setting.Setting`).
    module, params: the token scorer and its initial params.
    tcfg: its `train` block.
    seed: the row's seed.
    teacher: the distillation losses' teacher (`train.teachers`) of rows of
      `prepared.embeddings.query_ids`, else None.
    checkpoint_dir: where the run checkpoints and resumes (`run_dir`), or None.
  """
  prepared = setting.prepared
  ts, train_rows = pipeline.trainset(prepared, setting.splitset.train, *data_pool(tcfg))
  measures = evaluate.dev_measures(tcfg.select_metric)
  scorer = setting.eval_module(module)
  on_dev = None
  if setting.split("dev").query_ids:
    on_dev = lambda p: setting.rerank("dev", scorer, p, setting.token_queries, setting.token_docs,
                                      measures)[1]["mean"]
  return trainer.fit(module, params, setting.token_queries(train_rows), setting.token_docs, ts,
                     tcfg, seed, evaluate=on_dev, progress=False, checkpoint_dir=checkpoint_dir,
                     teacher=None if teacher is None else
                     lambda q_rows, cand_rows: teacher(train_rows[q_rows], cand_rows))


def scorer_teacher(row: spec.Row, prepared: pipeline.Prepared, splitset: pipeline.SplitSet,
                   workdir: str | None = None) -> tuple[teachers.Teacher, Any, Any]:
  """Trains the table scorer of `row` (`train_and_evaluate`, checkpointing in `workdir`) as a
  distillation teacher.

  Returns:
    (the teacher: its scores of blocks of rows of `prepared.embeddings`, module, params).
  """
  out = train_and_evaluate(row, prepared, splitset, workdir=workdir, progress=False)
  module = scorers.from_config(row.model, prepared.dim)
  emb = prepared.embeddings
  return (teachers.scorer_teacher(module, out["params"], emb.queries, emb.docs), module,
          out["params"])
