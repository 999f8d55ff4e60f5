"""The evaluators: the protocol's one way to score a system, one interface for every view.

As sentence-transformers' `SentenceEvaluator`, an evaluator is built once with what it evaluates
on (a split's queries and qrels, the doc ids, the measures) and called with the system; it
returns metrics {"mean": {measure: v}, "per_query": {qid: {measure: v}}} and names its
`primary_metric`. Three evaluators:

  RankingEvaluator  ranks a split's queries with a scorer: "full" the whole corpus
                    (`retrieval.ranking.score_topk`) or "rerank" given candidates per query
                    (`retrieval.ranking.rerank`, e.g. BM25's top 1,000, as the bilinear paper's
                    public code does); results say which mode;
  PoolEvaluator     P@1 over each query's own pool where the collection lists one (InsuranceQA's
                    negatives: gold answers plus listed negatives), the answer-selection view;
  HybridEvaluator   `lam * dense + (1 - lam) * BM25` over each split's candidates, lam tuned on
                    dev: the one entry point of every hybrid, full-corpus (`full_corpus`) or
                    over a re-ranking's candidates.

`evaluate_run` scores ranked arrays (the evaluators' common last step).
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Any, Callable, Sequence

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


class Evaluator(abc.ABC):
  """One way to score a system on a split: a callable returning metrics {"mean", "per_query"}
  (`__call__`'s own signature says what the system is), with the measure a table reads first."""

  measures: Sequence[str]

  @property
  def primary_metric(self) -> str:
    """The first of `measures`."""
    return self.measures[0]

  @abc.abstractmethod
  def __call__(self, *system: Any, **options: Any) -> Any:
    """Scores the system; returns (or holds first in what it returns) {"mean", "per_query"}."""


@dataclasses.dataclass
class RankingEvaluator(Evaluator):
  """Ranks the queries of a split with a scorer and scores the ranking.

  Attributes:
    query_ids: [Q] the evaluated queries; doc_ids: [N] ids of the doc rows.
    qrels: {qid: {doc_id: rel}} of the evaluated split.
    measures: reported measures (the first is the primary metric).
    mode: "full" (the whole corpus, to `depth`) or "rerank" (`candidates` [Q, K] doc rows).
  """
  query_ids: Sequence[str]
  doc_ids: Sequence[str]
  qrels: dict[str, dict[str, int]]
  measures: Sequence[str] = DEFAULT_MEASURES
  mode: str = "full"
  depth: int = 1000
  candidates: np.ndarray | None = None

  def __call__(self, module: nn.Module, params: Any, q_feats: Any, d_feats: Any
               ) -> tuple[dict[str, Any], dict]:
    """(metrics, run) of (module, params) over query features [Q, ...] and doc features
    [N, ...]."""
    require(self.mode in MODES, f"must be one of {MODES}, got {self.mode!r}", field="eval.mode")
    if self.mode == "full":
      idx, scores = ranking.score_topk(module, params, q_feats, d_feats, self.depth)
    else:
      require(self.candidates is not None, "rerank mode needs candidates", field="eval.mode")
      idx, scores = ranking.rerank(module, params, q_feats, d_feats, self.candidates)
    return evaluate_run(self.query_ids, self.doc_ids, idx, scores, self.qrels, self.measures)


@dataclasses.dataclass
class HybridEvaluator(Evaluator):
  """The dev-chosen hybrid `lam * dense + (1 - lam) * BM25` (`retrieval.hybrid`), the one entry
  point of every hybrid: lam tuned on the dev split's candidates (`cfg.measure` over `cfg.grid`,
  scores normalised by `cfg.normalize`), then each evaluated split's candidates ranked with it.

  Attributes:
    dev: the dev `data.pipeline.Split` (query ids and qrels of the dev candidates' rows).
    doc_ids: [N] doc ids.
    cfg: `config.blocks.hybrid_config()`.
    measures: reported measures.
  """
  dev: pipeline.Split
  doc_ids: Sequence[str]
  cfg: Any
  measures: Sequence[str] = DEFAULT_MEASURES

  def __call__(self, candidates_of: Callable[[str, pipeline.Split], hybrid.Candidates],
               splits: dict[str, pipeline.Split]
               ) -> tuple[float, dict[str, tuple[dict[str, Any], dict]]]:
    """Tunes lam on the dev candidates, then ranks and evaluates each of `splits`.

    Args:
      candidates_of: (split name, split) -> its `retrieval.hybrid.Candidates` [Q_s, U_s] (the
        dense and BM25 scores of each query's candidates: `full_corpus`, or a re-ranking's).
      splits: {name: split} evaluated ("dev" reuses the tuning candidates).

    Returns:
      (lam, {name: (metrics {"mean", "per_query"}, run)}).
    """
    cfg = self.cfg
    dev_cands = candidates_of("dev", self.dev)
    lam, _ = hybrid.tune_lambda(dev_cands, self.dev.qrels, self.dev.query_ids, self.doc_ids,
                                cfg.measure, tuple(cfg.grid), cfg.normalize)
    out = {}
    for name, split in splits.items():
      cands = dev_cands if name == "dev" else candidates_of(name, split)
      idx, scores = hybrid.rank_candidates(cands, lam, cfg.normalize)
      out[name] = evaluate_run(split.query_ids, self.doc_ids, idx, scores, split.qrels,
                               self.measures)
    return lam, out


def full_corpus(module: nn.Module, params: Any, prepared, depth: int
                ) -> Callable[[str, pipeline.Split], hybrid.Candidates]:
  """A full-corpus hybrid's `candidates_of` (`HybridEvaluator`): for a split's queries, the
  union of the dense scorer's top `depth` over the corpus and BM25's, each scored by both
  (`retrieval.hybrid.union_candidates`).

  Args:
    module, params: the dense scorer over `prepared`'s pooled embeddings.
    prepared: `data.pipeline.Prepared` (embeddings, BM25 rankings and model).
  """
  emb = prepared.embeddings

  # pylint: disable-next=unused-argument
  def candidates_of(name: str, split: pipeline.Split) -> hybrid.Candidates:
    rows = prepared.query_row_index(split.query_ids)
    d_idx, d_scores = ranking.score_topk(module, params, emb.queries[rows], emb.docs, depth)
    b_idx = prepared.bm25_idx[rows][:, :depth]
    b_scores = prepared.bm25_scores[rows][:, :depth]
    dense_fn = lambda qi, di: ranking.pair_scores(module, params, emb.queries[rows[qi]],
                                                  emb.docs[di])
    bm25_fn = lambda qi, di: prepared.bm25_pair_scores(rows[qi], di)
    return hybrid.union_candidates(d_idx, d_scores, b_idx, b_scores, dense_fn, bm25_fn)

  return candidates_of


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


@dataclasses.dataclass
class PoolEvaluator(Evaluator):
  """P@1 over each query's own pool (`candidate_pools`): the answer-selection view.

  The pool is ranked by `lam * dense + (1 - lam) * BM25` over its normalised scores
  (`retrieval.hybrid.rank_candidates`, ties to the lower doc row): lam = 1 is the dense scorer
  alone (its ranking; `normalize` is monotone), lam = 0 BM25 alone.

  Attributes:
    prepared: `data.pipeline.Prepared` (embeddings, BM25 model).
    split: the evaluated `data.pipeline.Split` (its query ids and qrels).
    pools: [Q_s, M] doc rows per query of `split`, -1 padding.
  """
  prepared: Any
  split: pipeline.Split
  pools: np.ndarray
  measures: Sequence[str] = ("p_at_1_pool",)

  def __call__(self, lam: float, normalize: str = "minmax", module: nn.Module | None = None,
               params: Any = None, pool_scores: np.ndarray | None = None) -> dict[str, Any]:
    """P@1 of the pools ranked with dense weight `lam` in [0, 1] (`normalize`: `hybrid.normalize`,
    used when 0 < lam < 1). The dense scores come from `module`, `params` over the pooled
    embeddings, or from `pool_scores` [Q_s, M] computed elsewhere (in pool order, e.g. a token
    scorer's, `studies.late_interaction.setting.Setting.pool_scores`); neither is needed at
    lam = 0.

    Returns:
      {"mean": float, "per_query": {qid: 1.0 if the top doc is relevant else 0.0}}.
    """
    prepared, split, pools = self.prepared, self.split, np.asarray(self.pools)
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
