"""Sparse-dense hybrid fusion and lambda tuning against a direct computation."""
from __future__ import annotations

import numpy as np
import pytest

from bilinear_ir.errors import InputError
from bilinear_ir.retrieval import hybrid

Q, N, TOP = 5, 40, 6


def _systems(seed):
  rng = np.random.default_rng(seed)
  dense = rng.normal(size=(Q, N))
  bm25 = np.abs(rng.normal(size=(Q, N)) * 5 + 3)  # BM25-like: non-negative, no ties
  return dense, bm25


def _top(full, n):
  ids = np.argsort(-full, axis=1, kind="stable")[:, :n]
  return ids, np.take_along_axis(full, ids, axis=1)


class _PairFn:
  """Scores pairs from a full [Q, N] matrix and records which pairs were asked for."""

  def __init__(self, full):
    self.full, self.asked = full, []

  def __call__(self, q_rows, d_rows):
    self.asked.extend(zip(q_rows.tolist(), d_rows.tolist()))
    return self.full[q_rows, d_rows]


def _fuse_direct(dense, bm25, dense_ids, bm25_ids, lam, normalize):
  """Per query: union, exact scores, min-max (or raw), mix, sort by (-score, doc row)."""
  out = []
  for q in range(Q):
    union = sorted(set(dense_ids[q].tolist()) | set(bm25_ids[q].tolist()))
    parts = []
    for full in (dense, bm25):
      s = full[q, union]
      if normalize == "minmax":
        s = (s - s.min()) / (s.max() - s.min())
      parts.append(s)
    fused = lam * parts[0] + (1 - lam) * parts[1]
    out.append(sorted(zip(union, fused), key=lambda x: (-x[1], x[0])))
  return out


@pytest.mark.parametrize("lam,normalize", [(0.3, "minmax"), (0.8, "none"), (1.0, "minmax"),
                                           (0.0, "minmax")])
def test_fuse_matches_direct_computation(lam, normalize):
  dense, bm25 = _systems(0)
  dense_ids, dense_scores = _top(dense, TOP)
  bm25_ids, bm25_scores = _top(bm25, TOP + 2)
  dense_fn, bm25_fn = _PairFn(dense), _PairFn(bm25)
  ids, scores = hybrid.fuse(dense_ids, dense_scores, bm25_ids, bm25_scores, lam, dense_fn,
                            bm25_fn, normalize=normalize)
  want = _fuse_direct(dense, bm25, dense_ids, bm25_ids, lam, normalize)
  for q in range(Q):
    n = len(want[q])
    np.testing.assert_array_equal(ids[q, :n], [d for d, _ in want[q]])
    np.testing.assert_allclose(scores[q, :n], [s for _, s in want[q]], rtol=1e-12)
    assert np.all(ids[q, n:] == -1) and np.all(np.isneginf(scores[q, n:]))
  # Exact scores were asked for exactly the union docs a list lacks, once each.
  for fn, list_ids in ((dense_fn, dense_ids), (bm25_fn, bm25_ids)):
    want_missing = {(q, d) for q in range(Q) for d, _ in want[q] if d not in list_ids[q]}
    assert len(fn.asked) == len(want_missing) and set(fn.asked) == want_missing


def test_lam_one_ranks_by_dense_and_zero_by_bm25_over_the_union():
  dense, bm25 = _systems(1)
  dense_ids, dense_scores = _top(dense, TOP)
  bm25_ids, bm25_scores = _top(bm25, TOP)
  cands = hybrid.union_candidates(dense_ids, dense_scores, bm25_ids, bm25_scores, _PairFn(dense),
                                  _PairFn(bm25))
  for lam, full in ((1.0, dense), (0.0, bm25)):
    ids, _ = hybrid.rank_candidates(cands, lam, k=TOP)
    np.testing.assert_array_equal(ids, _top(full, TOP)[0])  # global top-n is in the union


def test_missing_list_entries_and_bad_input():
  dense, bm25 = _systems(2)
  dense_ids, dense_scores = _top(dense, 3)
  dense_ids[1, 2] = -1  # query 1 got only 2 dense results
  bm25_ids, bm25_scores = _top(bm25, 3)
  ids, _ = hybrid.fuse(dense_ids, dense_scores, bm25_ids, bm25_scores, 0.5, _PairFn(dense),
                       _PairFn(bm25))
  assert set(ids[1][ids[1] >= 0].tolist()) == set(dense_ids[1, :2]) | set(bm25_ids[1])
  # exact.TopK pads short lists with a huge id and a -inf score: also a missing entry.
  padded_ids, padded_scores = dense_ids.copy(), dense_scores.copy()
  padded_ids[1, 2], padded_scores[1, 2] = np.iinfo(np.int32).max, -np.inf
  ids2, _ = hybrid.fuse(padded_ids, padded_scores, bm25_ids, bm25_scores, 0.5, _PairFn(dense),
                        _PairFn(bm25))
  np.testing.assert_array_equal(ids2, ids)
  with pytest.raises(InputError, match="hybrid.lam"):
    hybrid.fuse(dense_ids, dense_scores, bm25_ids, bm25_scores, 1.5, _PairFn(dense),
                _PairFn(bm25))
  with pytest.raises(InputError, match="hybrid.normalize"):
    hybrid.fuse(dense_ids, dense_scores, bm25_ids, bm25_scores, 0.5, _PairFn(dense),
                _PairFn(bm25), normalize="zscore")


def test_tune_lambda_picks_the_best_grid_value():
  dense, bm25 = _systems(3)
  dense_ids, dense_scores = _top(dense, TOP)
  bm25_ids, bm25_scores = _top(bm25, TOP)
  rng = np.random.default_rng(4)
  query_ids = [f"q{i}" for i in range(Q)]
  doc_ids = [f"d{j}" for j in range(N)]
  # Two relevant docs per query, drawn from its union (so lam matters).
  qrels = {}
  for q in range(Q):
    union = sorted(set(dense_ids[q].tolist()) | set(bm25_ids[q].tolist()))
    qrels[query_ids[q]] = {doc_ids[d]: 1 for d in rng.choice(union, 2, replace=False)}
  cands = hybrid.union_candidates(dense_ids, dense_scores, bm25_ids, bm25_scores, _PairFn(dense),
                                  _PairFn(bm25))
  grid = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
  best, table = hybrid.tune_lambda(cands, qrels, query_ids, doc_ids, measure="mrr@10",
                                   grid=grid)
  want = {}
  for lam in grid:
    ranked = _fuse_direct(dense, bm25, dense_ids, bm25_ids, lam, "minmax")
    rr = []
    for q in range(Q):
      hits = [r for r, (d, _) in enumerate(ranked[q][:10]) if doc_ids[d] in qrels[query_ids[q]]]
      rr.append(1.0 / (hits[0] + 1) if hits else 0.0)
    want[lam] = np.mean(rr)
  assert set(table) == set(grid)
  np.testing.assert_allclose([table[lam] for lam in grid], [want[lam] for lam in grid])
  assert best == min(lam for lam in grid if want[lam] == max(want.values()))
