"""Re-ranking candidates drawn without looking at the judgements, and how many positives they hold.

The late-interaction table re-ranks, for each query, BM25's top-n plus docs drawn at random from
the rest of the corpus; judged positives are not injected, so the candidate set is what a real
two-stage system would score and does not depend on the qrels.
"""
from __future__ import annotations

import numpy as np


def rerank_candidates(bm25_idx: np.ndarray, query_rows: np.ndarray, num_docs: int,
                      bm25_depth: int, random_docs: int, seed: int) -> np.ndarray:
  """Re-ranking candidates: BM25 top-n plus random docs from the rest, no judged docs added.

  The draw for query row r comes from `np.random.default_rng([seed, 7, r])`, so a query's
  candidates do not depend on which other queries are asked for.

  Args:
    bm25_idx: [Q_all, K] BM25 doc rows per query row, best first.
    query_rows: [Q] the query rows wanted.
    num_docs: N, docs in the collection.
    bm25_depth: n, BM25 candidates kept (at most K).
    random_docs: docs drawn without replacement among the N - n others (fewer if the corpus is
      smaller).

  Returns:
    [Q, n + random_docs] int64 doc rows: the BM25 top-n in BM25 order, then the random docs in
    ascending order; -1 pads a row the corpus cannot fill.
  """
  width = bm25_depth + random_docs
  out = np.full((len(query_rows), width), -1, np.int64)
  for i, r in enumerate(np.asarray(query_rows)):
    top = np.asarray(bm25_idx[r][:bm25_depth], np.int64)
    top = top[top >= 0]
    rest = np.setdiff1d(np.arange(num_docs), top)
    rng = np.random.default_rng([seed, 7, int(r)])
    drawn = np.sort(rng.choice(rest, size=min(random_docs, len(rest)), replace=False))
    row = np.concatenate([top, drawn])
    out[i, :len(row)] = row
  return out


def injected_positives(cands: np.ndarray, drawn: np.ndarray, query_ids: list[str],
                       doc_ids: list[str], qrels: dict[str, dict[str, int]]) -> int:
  """Judged-relevant (query, doc) pairs among the candidates that the draw did not give them.

  Args:
    cands: [Q, K] the candidates as used (-1 pads).
    drawn: [Q, K'] the candidates the draw gives (`rerank_candidates` of the same BM25 ranking,
      depth, random docs and seed).
    query_ids: [Q] the query of each row.
    doc_ids: [N] doc id of each doc row.
    qrels: judgements.

  Returns:
    How many judged positives are candidates but not drawn: 0 when no positive was injected.
  """
  count = 0
  for i, q in enumerate(query_ids):
    extra = {doc_ids[d] for d in cands[i] if d >= 0} - {doc_ids[d] for d in drawn[i] if d >= 0}
    count += sum(qrels.get(q, {}).get(d, 0) > 0 for d in extra)
  return count


def candidate_recall(cands: np.ndarray, query_ids: list[str], doc_ids: list[str],
                     qrels: dict[str, dict[str, int]]) -> float:
  """Share of the judged-relevant (query, doc) pairs that are among the candidates: [Q, K] -> ."""
  found = total = 0
  for i, q in enumerate(query_ids):
    have = {doc_ids[d] for d in cands[i] if d >= 0}
    rel = [d for d, g in qrels.get(q, {}).items() if g > 0]
    total += len(rel)
    found += sum(d in have for d in rel)
  return found / max(total, 1)
