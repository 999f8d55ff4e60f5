"""Sparse-dense hybrids (Luan et al., TACL 2021, 4.1): `lam * dense + (1 - lam) * BM25`.

Retrieval re-ranks the union of each system's top-n, as the paper does ("re-ranking n-best top
scoring candidates from each system"). A doc of the union that one system did not return gets
that system's EXACT score from a scoring function the caller passes (both a dense scorer and BM25
can score any (query, doc) pair), never an imputed value; so on the union the fused score is exact.

Scores are normalised per query before mixing (`normalize`):
  "minmax"  (default) each system's scores min-max scaled to [0, 1] over that query's union
            (all 0 when they are all equal), so lam weighs comparable ranges;
  "none"    raw scores (the paper's "single trainable weight"): lam then also absorbs the ratio
            of the two score scales, and a uniform lam grid may be coarse where it matters.

    cands = union_candidates(dense_ids, dense_scores, bm25_ids, bm25_scores, dense_fn, bm25_fn)
    lam, table = tune_lambda(cands, dev_qrels, dev_query_ids, doc_ids, measure="ndcg@10")
    ids, scores = fuse(..., lam)            # == rank_candidates(cands, lam)

`fuse` is the one fusion path: `union_candidates` (scoring the union once) then `rank_candidates`
(mixing with one lam), split only so that `tune_lambda` scores the union once for all lams.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Sequence

import numpy as np

from bilinear_ir.config import blocks
from bilinear_ir.errors import require
from bilinear_ir.eval import metrics

NORMALIZATIONS = ("minmax", "none")
DEFAULT_GRID = blocks.HYBRID_GRID

# score_fn(query_rows [K] int, doc_rows [K] int) -> [K] float: exact scores of K (query, doc) pairs.
PairScoreFn = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclasses.dataclass
class Candidates:
  """Each query's union of both systems' top-n with both exact scores.

  Attributes:
    ids: [Q, U] int64 doc rows, ascending per query, -1 padding (U = largest union).
    dense: [Q, U] float64 dense scores (0 on padding).
    sparse: [Q, U] float64 BM25 scores (0 on padding).
  """
  ids: np.ndarray
  dense: np.ndarray
  sparse: np.ndarray

  @property
  def valid(self) -> np.ndarray:
    """[Q, U] bool, False on padding."""
    return self.ids >= 0


def _check_top(ids: np.ndarray, scores: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
  """Validates a [Q, n] (ids, scores) top list; returns ids with -1 for missing entries.

  Missing entries are ids < 0 or scores of -inf (how `exact.TopK` pads a list shorter than k).
  """
  ids, scores = np.asarray(ids), np.asarray(scores, np.float64)
  require(ids.ndim == 2 and ids.shape == scores.shape,
          f"ids {ids.shape} and scores {scores.shape} must both be [Q, n]", file=name,
          field="ids")
  require(np.issubdtype(ids.dtype, np.integer), f"ids must be integer, got {ids.dtype}",
          file=name, field="ids")
  return np.where((ids < 0) | np.isneginf(scores), -1, ids).astype(np.int64), scores


def union_candidates(dense_ids: np.ndarray, dense_scores: np.ndarray, bm25_ids: np.ndarray,
                     bm25_scores: np.ndarray, dense_fn: PairScoreFn, bm25_fn: PairScoreFn
                     ) -> Candidates:
  """The union of both top-n lists per query, with exact scores from both systems.

  Scores a list provides are used as given; the missing ones (a doc only the other system
  returned) come from one batched call of `dense_fn` / `bm25_fn` over all such pairs.

  Args:
    dense_ids: [Q, n] doc rows from the dense system; -1 ids or -inf scores mark missing entries.
    dense_scores: [Q, n] their dense scores.
    bm25_ids: [Q, n'] doc rows from BM25, missing entries as for dense_ids.
    bm25_scores: [Q, n'] their BM25 scores.
    dense_fn: exact dense scores of (query row, doc row) pairs.
    bm25_fn: exact BM25 scores of (query row, doc row) pairs.

  Returns:
    `Candidates` [Q, U].
  """
  dense_ids, dense_scores = _check_top(dense_ids, dense_scores, "dense top-n")
  bm25_ids, bm25_scores = _check_top(bm25_ids, bm25_scores, "bm25 top-n")
  require(dense_ids.shape[0] == bm25_ids.shape[0],
          f"dense lists cover {dense_ids.shape[0]} queries, bm25 lists {bm25_ids.shape[0]}",
          file="bm25 top-n", field="ids")
  num_q = dense_ids.shape[0]
  unions = [np.union1d(dense_ids[i][dense_ids[i] >= 0], bm25_ids[i][bm25_ids[i] >= 0])
            for i in range(num_q)]
  width = max([1] + [len(u) for u in unions])
  ids = np.full((num_q, width), -1, np.int64)
  for i, u in enumerate(unions):
    ids[i, :len(u)] = u
  out = {"dense": np.zeros((num_q, width)), "sparse": np.zeros((num_q, width))}
  for name, list_ids, list_scores, fn in (("dense", dense_ids, dense_scores, dense_fn),
                                          ("sparse", bm25_ids, bm25_scores, bm25_fn)):
    missing_q, missing_pos = [], []
    for i, u in enumerate(unions):
      listed = list_ids[i] >= 0
      given = dict(zip(list_ids[i][listed].tolist(), list_scores[i][listed].tolist()))
      for pos, doc in enumerate(u.tolist()):
        if doc in given:
          out[name][i, pos] = given[doc]
        else:
          missing_q.append(i)
          missing_pos.append(pos)
    if missing_q:
      mq, mp = np.asarray(missing_q), np.asarray(missing_pos)
      scores = np.asarray(fn(mq, ids[mq, mp]), np.float64)
      require(scores.shape == mq.shape, f"returned shape {scores.shape} for {len(mq)} pairs",
              file=f"{name} score function", field="scores")
      out[name][mq, mp] = scores
  return Candidates(ids=ids, dense=out["dense"], sparse=out["sparse"])


def normalize_scores(scores: np.ndarray, valid: np.ndarray, normalize: str) -> np.ndarray:
  """Per-query score normalisation over the valid entries (module docstring).

  Args:
    scores: [Q, U].
    valid: [Q, U] bool.
    normalize: one of NORMALIZATIONS.

  Returns:
    [Q, U] float64 (padding entries are 0).
  """
  require(normalize in NORMALIZATIONS, f"must be one of {NORMALIZATIONS}, got {normalize!r}",
          field="hybrid.normalize")
  scores = np.where(valid, scores, 0.0)
  if normalize == "none":
    return scores
  lo = np.min(np.where(valid, scores, np.inf), axis=1, keepdims=True)
  hi = np.max(np.where(valid, scores, -np.inf), axis=1, keepdims=True)
  span = hi - lo
  ok = np.isfinite(span) & (span > 0)
  scaled = (scores - np.where(np.isfinite(lo), lo, 0.0)) / np.where(ok, span, 1.0)
  return np.where(valid & ok, scaled, 0.0)


def rank_candidates(cands: Candidates, lam: float, normalize: str = "minmax",
                    k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """Ranks each query's union by `lam * dense + (1 - lam) * bm25` (normalised scores).

  Args:
    cands: from `union_candidates`.
    lam: weight of the dense system, in [0, 1].
    normalize: one of NORMALIZATIONS.
    k: keep the top k per query (default: the whole union).

  Returns:
    (ids [Q, k] int64, fused scores [Q, k]) best first; ties by lower doc row; -1 / -inf where a
    query's union has fewer than k docs.
  """
  require(0.0 <= lam <= 1.0, f"must be in [0, 1], got {lam}", field="hybrid.lam")
  valid = cands.valid
  fused = (lam * normalize_scores(cands.dense, valid, normalize)
           + (1.0 - lam) * normalize_scores(cands.sparse, valid, normalize))
  fused = np.where(valid, fused, -np.inf)
  # Descending score, then ascending doc row (ids ascend within a row; padding sorts last).
  order = np.argsort(-fused, axis=1, kind="stable")
  k = order.shape[1] if k is None else min(k, order.shape[1])
  order = order[:, :k]
  ids = np.take_along_axis(cands.ids, order, axis=1)
  scores = np.take_along_axis(fused, order, axis=1)
  return np.where(np.isfinite(scores), ids, -1), scores


def fuse(dense_ids: np.ndarray, dense_scores: np.ndarray, bm25_ids: np.ndarray,
         bm25_scores: np.ndarray, lam: float, dense_fn: PairScoreFn, bm25_fn: PairScoreFn,
         normalize: str = "minmax", k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """Hybrid retrieval: re-ranks the union of both top-n lists by the fused score.

  Args:
    dense_ids, dense_scores: [Q, n] the dense system's top-n (rows, scores); -1 ids or -inf
      scores mark missing entries (e.g. `exact.TopK` padding).
    bm25_ids, bm25_scores: [Q, n'] BM25's top-n'.
    lam: weight of the dense system, in [0, 1].
    dense_fn, bm25_fn: exact scores of (query row, doc row) pairs, for union docs a list lacks.
    normalize: one of NORMALIZATIONS.
    k: keep the top k per query (default: the whole union).

  Returns:
    (ids [Q, k], fused scores [Q, k]), best first, -1 / -inf padding.
  """
  cands = union_candidates(dense_ids, dense_scores, bm25_ids, bm25_scores, dense_fn, bm25_fn)
  return rank_candidates(cands, lam, normalize, k)


def tune_lambda(cands: Candidates, qrels: Mapping[str, Mapping[str, int]],
                query_ids: Sequence[str], doc_ids: Sequence[str], measure: str = "ndcg@10",
                grid: Sequence[float] = DEFAULT_GRID, normalize: str = "minmax"
                ) -> tuple[float, dict[float, float]]:
  """Picks lam on a dev split: the grid value with the best mean `measure`.

  Args:
    cands: the dev queries' `Candidates` [Q, U].
    qrels: dev qrels `{qid: {docid: grade}}`.
    query_ids: [Q] ids of the candidate rows.
    doc_ids: [N] doc ids, indexed by doc rows.
    measure: a `bilinear_ir.eval.metrics` measure name, e.g. "ndcg@10", "mrr@10".
    grid: lam values to try, each in [0, 1].
    normalize: one of NORMALIZATIONS.

  Returns:
    (best lam, {lam: mean measure}); ties go to the smallest lam.
  """
  require(len(query_ids) == cands.ids.shape[0],
          f"{len(query_ids)} query ids for {cands.ids.shape[0]} candidate rows",
          field="hybrid.query_ids")
  require(len(grid) > 0, "the lam grid is empty", field="hybrid.grid")
  table = {}
  for lam in grid:
    ids, scores = rank_candidates(cands, float(lam), normalize)
    # The run's measure straight from the arrays (no run dict per lam; -1 ids are no doc).
    table[float(lam)] = metrics.evaluate_topk(qrels, query_ids, doc_ids, ids, scores,
                                              [measure])["mean"][measure]
  best = max(table, key=lambda lam: (table[lam], -lam))
  return best, table
