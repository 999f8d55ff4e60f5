"""IR measures equal to trec_eval's (as pytrec_eval computes them) to 1e-9, ties included.

Measure names (k is any integer >= 1):

  mrr@k         trec_eval `recip_rank` on the run cut at depth k (0 if no relevant doc in top k)
  map, map@k    trec_eval `map` (no cutoff) and `map_cut_k`: sum of precision at each relevant
                doc ranked within k, divided by ALL the query's relevant docs
  ndcg, ndcg@k  trec_eval `ndcg` (no cutoff) and `ndcg_cut_k`: gain = the qrels grade (grades
                <= 0 gain 0), discount log2(rank + 1), ideal from the query's judged grades
  recall@k      trec_eval `recall_k`: relevant docs in top k / relevant docs of the query
  precision@k   trec_eval `P_k`: relevant docs in top k / k (k, even if fewer docs were retrieved)
  hr@k          hit rate (trec_eval `success_k`): 1 if any relevant doc is in the top k, else 0

Relevant means qrels grade >= 1 (trec_eval's default relevance level); docs of the run absent
from the qrels are not relevant. Each query's docs are ranked as trec_eval ranks them
(`bilinear_ir.eval.trec.rank_order`): score descending with scores compared as float32, ties
broken by doc id descending in byte order (reversed Python `str` order: "b" before "a",
"9" before "10").

Which queries count (the research convention, trec_eval `-c`): every query of the qrels with
at least one relevant doc is evaluated, and one absent from the run scores 0 on every measure;
queries of the run that are not in the qrels, and qrels queries without a relevant doc, are
ignored. pytrec_eval differs: it reports only the queries present in the run (including ones
without a relevant doc, where every measure is 0), so its per-query values equal ours on the
queries they share, and its mean equals ours when the run covers every qrels query that has a
relevant doc and no other.
"""
from __future__ import annotations

import itertools
import re
from typing import Any, Mapping, Sequence

import numpy as np

from bilinear_ir.errors import input_error
from bilinear_ir.eval.trec import rank_order

_MEASURE = re.compile(r"(mrr|map|ndcg|recall|precision|hr)(?:@([1-9][0-9]*))?")
_CUTOFF_OPTIONAL = ("map", "ndcg")
MEASURE_FORMS = "mrr@k, map, map@k, ndcg, ndcg@k, recall@k, precision@k, hr@k (k >= 1)"


def parse_measure(name: str) -> tuple[str, int | None]:
  """Splits a measure name into (kind, cutoff k or None).

  Raises:
    InputError (field 'eval.measures'): the name is not one of `MEASURE_FORMS`.
  """
  match = _MEASURE.fullmatch(name) if isinstance(name, str) else None
  if match is None or (match.group(2) is None and match.group(1) not in _CUTOFF_OPTIONAL):
    raise input_error(f"unknown measure {name!r}; use {MEASURE_FORMS}", file="config",
                      field="eval.measures")
  k = match.group(2)
  return match.group(1), None if k is None else int(k)


def _relevant_query_ids(qrels: Mapping[str, Mapping[str, int]]) -> list[str]:
  """Sorted ids of the qrels queries with a doc of grade >= 1 (grades checked to be ints)."""
  qids = []
  for qid, judged in qrels.items():
    for docid, rel in judged.items():
      if isinstance(rel, bool) or not isinstance(rel, (int, np.integer)):
        raise input_error(f"relevance must be an int, got {rel!r}", file="qrels",
                          record=f"query {qid!r} doc {docid!r}", field="rel")
    if any(rel >= 1 for rel in judged.values()):
      qids.append(qid)
  if not qids:
    raise input_error("no query has a relevant doc (grade >= 1)", file="qrels")
  return sorted(qids)


def _padded(rows: list[np.ndarray]) -> np.ndarray:
  """[Q, L] int matrix of the rows, right-padded with 0 (L >= 1)."""
  out = np.zeros((len(rows), max([1] + [len(r) for r in rows])), np.int64)
  for i, r in enumerate(rows):
    out[i, :len(r)] = r
  return out


def evaluate(qrels: Mapping[str, Mapping[str, int]], run: Mapping[str, Mapping[str, float]],
             measures: Sequence[str]) -> dict[str, Any]:
  """Evaluates a run against qrels (module docstring: measures, tie order, query set).

  Args:
    qrels: `{qid: {docid: grade int}}`.
    run: `{qid: {docid: score}}`.
    measures: measure names, e.g. `["mrr@10", "ndcg@10", "map", "recall@100"]`.

  Returns:
    `{"mean": {measure: float}, "per_query": {qid: {measure: float}}}`, the mean over the Q
    evaluated queries (the qrels queries with a relevant doc), per_query in sorted qid order.

  Raises:
    InputError: an unknown measure name (field 'eval.measures'), a non-int grade, no qrels
      query with a relevant doc, a NaN score.
  """
  specs, qids, depth = _specs_and_queries(qrels, measures)
  rel_rows = []
  for qid in qids:
    ranked, _ = rank_order(run.get(qid, {}), qid)
    judged = qrels[qid]
    ranked = ranked[:depth]
    rel_rows.append(np.fromiter(map(judged.get, ranked, itertools.repeat(0)), np.int64,
                                len(ranked)))
  return _measures(qids, specs, _padded(rel_rows), _ideal(qrels, qids))


def _specs_and_queries(qrels: Mapping[str, Mapping[str, int]], measures: Sequence[str]
                       ) -> tuple[dict[str, tuple[str, int | None]], list[str], int | None]:
  """(parsed measures, evaluated query ids, the rank depth that matters: None = all)."""
  if isinstance(measures, str) or not measures:
    raise input_error(f"must be a non-empty list of measure names, got {measures!r}",
                      file="config", field="eval.measures")
  specs = {name: parse_measure(name) for name in measures}
  qids = _relevant_query_ids(qrels)
  cutoffs = [k for _, k in specs.values()]
  return specs, qids, None if None in cutoffs else max(cutoffs)  # deeper ranks never matter


def _ideal(qrels: Mapping[str, Mapping[str, int]], qids: list[str]) -> np.ndarray:
  """[Q, R] each evaluated query's judged grades, descending, 0-padded (one pass over qrels)."""
  return _padded([np.sort(np.fromiter(qrels[q].values(), np.int64, len(qrels[q])))[::-1]
                  for q in qids])


def _measures(qids: list[str], specs: dict[str, tuple[str, int | None]], rel: np.ndarray,
              ideal: np.ndarray) -> dict[str, Any]:
  """The measures from grades in rank order.

  Args:
    qids: [Q] the evaluated query ids.
    specs: {name: (kind, k)} (`parse_measure`).
    rel: [Q, L] each query's grades in rank order (to the depth that matters), 0-padded.
    ideal: [Q, R] its judged grades, descending, 0-padded (`_ideal`).

  Returns:
    `{"mean": {measure: float}, "per_query": {qid: {measure: float}}}` (as `evaluate`).
  """
  ideal = np.maximum(ideal, 0)                       # [Q, R] ideal gains, descending
  hit = (rel >= 1).astype(np.float64)                # [Q, L]
  num_rel = (ideal >= 1).sum(axis=1)                 # [Q], >= 1 for every evaluated query
  ranks = np.arange(1, rel.shape[1] + 1)
  precision_at_hits = np.cumsum(hit, axis=1) / ranks * hit
  dcg_terms = np.maximum(rel, 0) / np.log2(ranks + 1)
  idcg_terms = ideal / np.log2(np.arange(2, ideal.shape[1] + 2))

  values = {}
  for name, (kind, k) in specs.items():
    top = hit[:, :k]
    if kind == "mrr":
      first = np.argmax(top, axis=1)
      values[name] = np.where(top.any(axis=1), 1.0 / (first + 1), 0.0)
    elif kind == "map":
      values[name] = precision_at_hits[:, :k].sum(axis=1) / num_rel
    elif kind == "ndcg":
      values[name] = dcg_terms[:, :k].sum(axis=1) / idcg_terms[:, :k].sum(axis=1)
    elif kind == "recall":
      values[name] = top.sum(axis=1) / num_rel
    elif kind == "precision":
      values[name] = top.sum(axis=1) / k
    else:  # hr
      values[name] = top.any(axis=1).astype(np.float64)
  per_query = {qid: {name: float(values[name][i]) for name in specs}
               for i, qid in enumerate(qids)}
  mean = {name: float(np.mean(values[name])) for name in specs}
  return {"mean": mean, "per_query": per_query}


def evaluate_topk(qrels: Mapping[str, Mapping[str, int]], query_ids: Sequence[str],
                  doc_ids: Sequence[str], idx: np.ndarray, scores: np.ndarray,
                  measures: Sequence[str]) -> dict[str, Any]:
  """`evaluate` of the run held in top-k arrays, without building it: the same numbers, with
  no Python loop over the run's entries (ranking and grade look-up are array operations).

  The run is row i = query `query_ids[i]`, docs `doc_ids[idx[i, c]]` with scores `scores[i, c]`
  where `idx[i, c] >= 0`; it is ranked in trec_eval's order (score descending as float32, ties by
  doc id descending), whatever the order of the columns.

  Args:
    qrels: `{qid: {docid: grade int}}`.
    query_ids: [Q] unique query ids of the rows.
    doc_ids: [N] doc ids, the rows `idx` indexes.
    idx: [Q, k] int doc rows (-1 = none), no row repeating a doc.
    scores: [Q, k] their scores.
    measures: measure names.

  Returns:
    `{"mean": ..., "per_query": ...}`, equal to `evaluate(qrels, run, measures)`.

  Raises:
    InputError: as `evaluate`, and for arrays of other shapes, a repeated query id, a doc row out
      of range or repeated in a row.
  """
  specs, qids, depth = _specs_and_queries(qrels, measures)
  idx = np.asarray(idx)
  scores = np.asarray(scores, np.float64)
  where = "top-k arrays"
  if idx.ndim != 2 or idx.shape != scores.shape or idx.shape[0] != len(query_ids):
    raise input_error(f"idx {idx.shape} and scores {scores.shape} must both be [Q, k] with "
                      f"Q = {len(query_ids)} query ids", file=where, field="idx")
  n_docs = len(doc_ids)
  if idx.size and idx.max(initial=-1) >= n_docs:
    raise input_error(f"doc rows must lie in [0, {n_docs})", file=where, field="idx")
  row_of = {q: i for i, q in enumerate(query_ids)}
  if len(row_of) != len(query_ids):
    raise input_error("query ids repeat", file=where, field="query_ids")
  rows = np.fromiter(map(row_of.get, qids, itertools.repeat(-1)), np.int64, len(qids))
  if not len(query_ids):  # an empty run: every evaluated query scores 0
    idx, scores = np.full((1, 0), -1, np.int64), np.zeros((1, 0))
  present = rows >= 0  # [Qe] evaluated queries with a row (the others score 0)
  docs = np.where(present[:, None], idx[np.maximum(rows, 0)].astype(np.int64), -1)  # [Qe, k]
  vals = scores[np.maximum(rows, 0)]
  valid = docs >= 0
  bad = valid & np.isnan(vals)
  if bad.any():
    i, c = np.argwhere(bad)[0]
    raise input_error("score is NaN", file="run", record=f"query {qids[i]!r} doc "
                      f"{doc_ids[docs[i, c]]!r}", field="score")
  ordered = np.sort(np.where(valid, docs, -1 - np.arange(docs.shape[1])), axis=1)
  if (ordered[:, 1:] == ordered[:, :-1]).any():
    i = int(np.argmax((ordered[:, 1:] == ordered[:, :-1]).any(axis=1)))
    raise input_error("a doc row repeats", file=where, record=f"query {qids[i]!r}", field="idx")
  # trec_eval's order (score descending compared as float32, ties by doc id descending) as one
  # int64 key per entry, ascending: -(the float32's order-preserving int) * 2^32 + the doc's
  # rank in descending id order; absent entries last.
  by_id_desc = np.asarray(sorted(range(n_docs), key=doc_ids.__getitem__, reverse=True),
                          np.int64)  # doc rows, largest id first
  id_desc = np.empty(n_docs, np.int64)
  id_desc[by_id_desc] = np.arange(n_docs)
  with np.errstate(over="ignore"):
    bits = (vals.astype(np.float32) + np.float32(0.0)).view(np.int32)  # -0.0 ties +0.0
  sortable = np.where(bits >= 0, bits, bits ^ np.int32(0x7FFFFFFF)).astype(np.int64)
  last = np.iinfo(np.int64).max
  key = np.where(valid, -sortable * (1 << 32) + id_desc[np.maximum(docs, 0)], last)
  if depth is not None and depth < key.shape[1]:
    key = np.partition(key, depth - 1, axis=1)[:, :depth]  # the entries that can matter
  key.sort(axis=1)
  kept = key != last
  docs = np.where(kept, by_id_desc[np.where(kept, key & 0xFFFFFFFF, 0)], -1)  # [Qe, <= depth]
  # Grades of (evaluated query, doc row) pairs, as sorted keys query * N + doc row.
  doc_row = {d: j for j, d in enumerate(doc_ids)}
  judged = [(i, doc_row[d], g) for i, q in enumerate(qids) for d, g in qrels[q].items()
            if d in doc_row]
  pair = np.asarray(judged, np.int64).reshape(-1, 3)
  pair_keys = pair[:, 0] * n_docs + pair[:, 1]
  by_key = np.argsort(pair_keys)
  pair_keys, grades = pair_keys[by_key], pair[by_key, 2]
  keys = np.arange(len(qids), dtype=np.int64)[:, None] * n_docs + np.maximum(docs, 0)
  at = np.minimum(np.searchsorted(pair_keys, keys), max(len(pair_keys) - 1, 0))
  found = (docs >= 0) & (pair_keys[at] == keys) if len(pair_keys) else np.zeros(keys.shape, bool)
  rel = np.where(found, grades[at] if len(pair_keys) else 0, 0)
  # [Qe, L] as `_padded` makes it from the run's rows: L = the longest row (at least 1).
  width = max(1, int((docs >= 0).sum(axis=1).max(initial=0)))
  out = np.zeros((len(qids), width), np.int64)
  out[:, :min(width, rel.shape[1])] = rel[:, :width]
  return _measures(qids, specs, out, _ideal(qrels, qids))
