"""Evaluation of a ranking, a scorer or a sparse-dense hybrid: the protocol's one way to score.

Two modes, and results say which: "full" ranks the whole corpus (`retrieval.ranking.score_topk`);
"rerank" re-scores given candidates per query (`retrieval.ranking.rerank`, e.g. BM25's top 1,000,
as the bilinear paper's public code does). A hybrid's lam is always chosen on dev (`tune_on_dev`).
Where a collection lists each query's own candidates (InsuranceQA's negatives), `pool_p_at_1` is
the answer-selection view: P@1 over the query's gold answers plus its listed negatives.
"""
from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import numpy as np

from bilinear_ir.data import pipeline
from bilinear_ir.errors import require
from bilinear_ir.eval import metrics as metrics_lib
from bilinear_ir.retrieval import hybrid
from bilinear_ir.retrieval import ranking

MODES = ("full", "rerank")
DEFAULT_MEASURES = ("ndcg@10", "mrr@10", "map", "recall@100")


def dev_measures(select_metric: str) -> tuple[str, ...]:
  """The measures a model is selected on: `select_metric`, ndcg@10 and mrr@10, sorted."""
  return tuple(sorted({select_metric, "ndcg@10", "mrr@10"}))


def evaluate_run(query_ids: Sequence[str], doc_ids: Sequence[str], idx: np.ndarray,
                 scores: np.ndarray, qrels: dict[str, dict[str, int]],
                 measures: Sequence[str] = DEFAULT_MEASURES) -> tuple[dict[str, Any], dict]:
  """Turns top-k arrays into a run and evaluates it.

  Args:
    query_ids: [Q] ids of the rows of `idx`.
    doc_ids: [N] ids of the doc rows.
    idx, scores: [Q, k] from `score_topk` or `rerank` (-1 rows are dropped).
    qrels: {qid: {doc_id: rel}} of the evaluated split.

  Returns:
    (metrics `{"mean": ..., "per_query": ...}`, equal to `eval.metrics.evaluate` of the run but
    computed from the arrays (`metrics.evaluate_topk`), run dict).
  """
  idx, scores = np.asarray(idx), np.asarray(scores)
  metrics = metrics_lib.evaluate_topk(qrels, query_ids, doc_ids, idx, scores, list(measures))
  names = np.asarray(doc_ids, dtype=object)[np.maximum(idx, 0)]  # [Q, k] doc ids
  values = scores.astype(np.float64).tolist()  # float32 values kept exactly
  run = {}
  for i, qid in enumerate(query_ids):  # one dict per query, built by C loops
    keep = idx[i] >= 0
    run[qid] = (dict(zip(names[i].tolist(), values[i])) if keep.all() else
                dict(zip(names[i][keep].tolist(), scores[i][keep].astype(np.float64).tolist())))
  return metrics, run


def evaluate_scorer(module: nn.Module, params: Any, q_feats: Any, d_feats: Any,
                    query_ids: Sequence[str], doc_ids: Sequence[str],
                    qrels: dict[str, dict[str, int]], mode: str = "full", depth: int = 1000,
                    candidates: np.ndarray | None = None,
                    measures: Sequence[str] = DEFAULT_MEASURES) -> tuple[dict[str, Any], dict]:
  """Ranks (full corpus or re-rank of `candidates`) and evaluates: (metrics, run)."""
  require(mode in MODES, f"must be one of {MODES}, got {mode!r}", field="eval.mode")
  if mode == "full":
    idx, scores = ranking.score_topk(module, params, q_feats, d_feats, depth)
  else:
    require(candidates is not None, "rerank mode needs candidates", field="eval.mode")
    idx, scores = ranking.rerank(module, params, q_feats, d_feats, candidates)
  return evaluate_run(query_ids, doc_ids, idx, scores, qrels, measures)


def evaluate_hybrid(module: nn.Module, params: Any, prepared, dev, test, cfg,
                    measures: Sequence[str] = DEFAULT_MEASURES) -> tuple[dict[str, Any], float,
                                                                         dict]:
  """Hybrid of a trained dense scorer and BM25: lam tuned on `dev`, evaluated on `test`.

  Args:
    module, params: the dense scorer.
    prepared: `data.pipeline.Prepared` (embeddings, BM25 rankings and model).
    dev, test: `data.pipeline.Split`s.
    cfg: `config.blocks.hybrid_config()`.

  Returns:
    (test metrics `{"mean", "per_query"}`, the chosen lam, the test run).
  """
  emb = prepared.embeddings

  def candidates(split):
    rows = prepared.query_row_index(split.query_ids)
    d_idx, d_scores = ranking.score_topk(module, params, emb.queries[rows], emb.docs, cfg.depth)
    b_idx = prepared.bm25_idx[rows][:, :cfg.depth]
    b_scores = prepared.bm25_scores[rows][:, :cfg.depth]
    dense_fn = lambda qi, di: ranking.pair_scores(module, params, emb.queries[rows[qi]],
                                                  emb.docs[di])
    bm25_fn = lambda qi, di: prepared.bm25_pair_scores(rows[qi], di)
    return hybrid.union_candidates(d_idx, d_scores, b_idx, b_scores, dense_fn, bm25_fn)

  lam, ((idx, scores),) = tune_on_dev(candidates(dev), dev, [candidates(test)],
                                      prepared.collection.doc_ids, cfg)
  metrics, run = evaluate_run(test.query_ids, prepared.collection.doc_ids, idx, scores,
                              test.qrels, measures)
  return metrics, lam, run


def tune_on_dev(dev_cands: hybrid.Candidates, dev, cands: Sequence[hybrid.Candidates],
                doc_ids: Sequence[str], cfg) -> tuple[float, list[tuple[np.ndarray, np.ndarray]]]:
  """The dev-chosen hybrid: lam tuned on the dev split's candidates, then every `cands` ranked.

  Args:
    dev_cands: the dev queries' `retrieval.hybrid.Candidates` [Q_dev, U].
    dev: the dev `data.pipeline.Split` (query ids and qrels of those rows).
    cands: the candidates [Q_s, U_s] of each split to rank.
    doc_ids: [N] doc ids.
    cfg: `config.blocks.hybrid_config()` (measure, grid, normalize).

  Returns:
    (lam, [(idx [Q_s, U_s], scores [Q_s, U_s])] per entry of `cands`).
  """
  lam, _ = hybrid.tune_lambda(dev_cands, dev.qrels, dev.query_ids, doc_ids, cfg.measure,
                              tuple(cfg.grid), cfg.normalize)
  return lam, [hybrid.rank_candidates(c, lam, cfg.normalize) for c in cands]


def candidate_pools(prepared, split) -> np.ndarray | None:
  """Each query's own candidate pool: its relevant docs and the non-relevant docs the collection
  lists for it (`Collection.negatives`), as doc rows.

  Args:
    prepared: `data.pipeline.Prepared`.
    split: the evaluated `data.pipeline.Split`.

  Returns:
    [Q_s, M] int64 doc rows, ascending per query, -1 padding (a doc listed twice or both
    relevant and listed counts once); None when the collection lists no negatives for some
    query of `split` (no answer-selection view).
  """
  coll = prepared.collection
  if not split.query_ids or any(q not in coll.negatives for q in split.query_ids):
    return None
  listed = pipeline.listed_negatives(coll, split.query_ids)
  index = coll.doc_index()
  pools = [np.union1d(listed[i][listed[i] >= 0],
                      [index[d] for d, rel in split.qrels[q].items() if rel > 0])
           for i, q in enumerate(split.query_ids)]
  out = np.full((len(pools), max(len(p) for p in pools)), -1, np.int64)
  for i, p in enumerate(pools):
    out[i, :len(p)] = p
  return out


def pool_p_at_1(prepared, split, pools: np.ndarray, lam: float, normalize: str = "minmax",
                module: nn.Module | None = None, params: Any = None,
                pool_scores: np.ndarray | None = None) -> dict[str, Any]:
  """P@1 over each query's own pool (`candidate_pools`): the answer-selection view.

  The pool is ranked by `lam * dense + (1 - lam) * BM25` over its normalised scores
  (`retrieval.hybrid.rank_candidates`, ties to the lower doc row): lam = 1 is the dense scorer
  alone (its ranking; `normalize` is monotone), lam = 0 BM25 alone.

  Args:
    prepared: `data.pipeline.Prepared` (embeddings, BM25 model).
    split: the evaluated `data.pipeline.Split` (its query ids and qrels).
    pools: [Q_s, M] doc rows per query of `split`, -1 padding.
    lam: weight of the dense scorer, in [0, 1].
    normalize: `hybrid.normalize` (used when 0 < lam < 1).
    module, params: the dense scorer over the pooled embeddings (needed when lam > 0 and
      `pool_scores` is None).
    pool_scores: [Q_s, M] the dense scores of the pools computed elsewhere (in pool order, e.g.
      a token scorer's, `studies.late_interaction.setting.Setting.pool_scores`), instead of module / params.

  Returns:
    {"mean": float, "per_query": {qid: 1.0 if the top doc is relevant else 0.0}}.
  """
  pools = np.asarray(pools)
  valid = pools >= 0
  q_idx, pos = np.nonzero(valid)
  rows = prepared.query_row_index(split.query_ids)
  dense, sparse = np.zeros(pools.shape), np.zeros(pools.shape)
  if lam > 0 and pool_scores is not None:
    dense[q_idx, pos] = np.asarray(pool_scores)[q_idx, pos]
  elif lam > 0:
    require(module is not None, "a dense weight needs the dense scorer", field="lam")
    emb = prepared.embeddings
    dense[q_idx, pos] = ranking.pair_scores(module, params, emb.queries[rows[q_idx]],
                                            emb.docs[pools[q_idx, pos]])
  if lam < 1:
    sparse[q_idx, pos] = prepared.bm25_pair_scores(rows[q_idx], pools[q_idx, pos])
  top, _ = hybrid.rank_candidates(hybrid.Candidates(pools, dense, sparse), lam,
                                  normalize if 0 < lam < 1 else "minmax", k=1)
  doc_ids = prepared.collection.doc_ids
  per_query = {q: float(top[i, 0] >= 0 and split.qrels[q].get(doc_ids[top[i, 0]], 0) > 0)
               for i, q in enumerate(split.query_ids)}
  return {"mean": float(np.mean(list(per_query.values()))), "per_query": per_query}
