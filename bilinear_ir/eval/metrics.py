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
  if isinstance(measures, str) or not measures:
    raise input_error(f"must be a non-empty list of measure names, got {measures!r}",
                      file="config", field="eval.measures")
  specs = {name: parse_measure(name) for name in measures}
  qids = _relevant_query_ids(qrels)
  cutoffs = [k for _, k in specs.values()]
  depth = None if None in cutoffs else max(cutoffs)  # ranks beyond it never matter

  rel_rows, ideal_rows = [], []
  for qid in qids:
    ranked, _ = rank_order(run.get(qid, {}), qid)
    judged = qrels[qid]
    ranked = ranked[:depth]
    rel_rows.append(np.fromiter(map(judged.get, ranked, itertools.repeat(0)), np.int64,
                                len(ranked)))
    ideal_rows.append(np.sort(np.fromiter(judged.values(), np.int64, len(judged)))[::-1])
  rel = _padded(rel_rows)                            # [Q, L] grades in rank order, 0-padded
  ideal = np.maximum(_padded(ideal_rows), 0)         # [Q, R] ideal gains, descending
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
