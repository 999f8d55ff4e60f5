"""TREC runs and qrels: trec_eval's ranking order, top-k arrays -> run, strict file I/O.

In memory a run is `{qid: {docid: score}}` and qrels are `{qid: {docid: relevance int}}`, the
dicts pytrec_eval takes. On disk:

  run:   `qid Q0 docid rank score tag`   (6 whitespace-separated fields a line)
  qrels: `qid iter docid rel`            (4 fields a line; `iter` is ignored, written as 0)

trec_eval's ranking order (`rank_order`) is the one the metrics and run files use:
it ignores the rank column and sorts each query's docs by score descending, comparing scores as
float32 (trec_eval keeps `float sim`), and breaks ties by doc id descending in byte order
(`strcmp(docno2, docno1)` in trec_eval's `form_res_rels.c`, `comp_sim_docno`).
"""
from __future__ import annotations

import re
from typing import Mapping, Sequence

import numpy as np

from bilinear_ir import files
from bilinear_ir.errors import input_error

Run = dict[str, dict[str, float]]
Qrels = dict[str, dict[str, int]]

_INT = re.compile(r"[+-]?[0-9]+")
_SPACE = re.compile(r"\s")
_FLOAT = re.compile(r"[+-]?(([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|inf|infinity)",
                    re.IGNORECASE)


def rank_order(docs: Mapping[str, float], qid: str = "?") -> tuple[list[str], np.ndarray]:
  """One query's docs in trec_eval's ranking order.

  The rule (checked against pytrec_eval 0.5, pytrec-eval-terrier, which wraps trec_eval): score
  descending, with scores compared after rounding to float32 (so 1.0 and 1.0 + 1e-12 tie, and
  every score above the float32 range ties at +inf); ties broken by doc id DESCENDING in byte
  order, which for Python strings is reversed `str` order: on equal scores "b" ranks above "a",
  "a" above "B" and "9" above "10".

  Args:
    docs: `{docid: score}` (N docs).
    qid: the query id, for error messages.

  Returns:
    (doc ids [N] in rank order, their float64 scores [N] in the same order).

  Raises:
    InputError: a score is NaN (it has no place in the order).
  """
  ids = sorted(docs, reverse=True)
  scores = np.fromiter(map(docs.__getitem__, ids), np.float64, len(ids))
  if np.isnan(scores).any():
    bad = ids[int(np.argmax(np.isnan(scores)))]
    raise input_error("score is NaN", file="run", record=f"query {qid!r} doc {bad!r}",
                      field="score")
  with np.errstate(over="ignore"):
    key = scores.astype(np.float32)
  order = np.argsort(-key, kind="stable")  # stable: keeps doc id descending among ties
  return [ids[i] for i in order], scores[order]


def rank_arrays_to_run(query_ids: Sequence[str], doc_ids: Sequence[str], top_idx: np.ndarray,
                       top_scores: np.ndarray) -> Run:
  """The bridge from retrieval's top-k arrays to a run dict.

  Args:
    query_ids: [Q] query ids, row order of the arrays (unique).
    doc_ids: [N] doc ids, the doc order `top_idx` indexes.
    top_idx: [Q, k] int doc rows, each row without repeats, each in [0, N).
    top_scores: [Q, k] float scores (float32 values are kept exactly as float64).

  Returns:
    `{qid: {docid: score}}` with k docs for each of the Q queries.

  Raises:
    InputError: shapes disagree, an index is out of range or repeats in a row, a query id repeats.
  """
  top_idx = np.asarray(top_idx)
  top_scores = np.asarray(top_scores)
  where = "top-k arrays"
  if top_idx.ndim != 2 or top_idx.shape != top_scores.shape or top_idx.shape[0] != len(query_ids):
    raise input_error(f"top_idx {top_idx.shape} and top_scores {top_scores.shape} must both be "
                      f"[Q, k] with Q = {len(query_ids)} query ids", file=where, field="top_idx")
  if not np.issubdtype(top_idx.dtype, np.integer):
    raise input_error(f"must be integer, got {top_idx.dtype}", file=where, field="top_idx")
  if len(set(query_ids)) != len(query_ids):
    raise input_error("query ids repeat", file=where, field="query_ids")
  if top_idx.size and (top_idx.min() < 0 or top_idx.max() >= len(doc_ids)):
    raise input_error(f"doc rows must lie in [0, {len(doc_ids)})", file=where, field="top_idx")
  run = {}
  for row, (qid, idx, scores) in enumerate(zip(query_ids, top_idx.tolist(),
                                               top_scores.astype(np.float64).tolist())):
    docs = {doc_ids[i]: s for i, s in zip(idx, scores)}
    if len(docs) != len(idx):
      raise input_error("a doc row repeats", file=where, record=f"row {row} (query {qid!r})",
                        field="top_idx")
    run[qid] = docs
  return run


def _check_tokens(values: Sequence[str], file: str, record: str, field: str) -> None:
  """Raises unless every value can be one field of a TREC line (non-empty, no whitespace)."""
  if (all(isinstance(v, str) for v in values) and all(values)
      and not _SPACE.search("".join(values))):
    return
  bad = next(v for v in values if not isinstance(v, str) or v.split() != [v])
  raise input_error(f"must be a non-empty string without whitespace, got {bad!r}", file=file,
                    record=record, field=field)


def run_to_text(run: Mapping[str, Mapping[str, float]], tag: str) -> str:
  """A run as TREC run-file text (e.g. for a Report's `extra_files["run.trec"]`).

  Queries in sorted id order; each query's docs in trec_eval's order (`rank_order`) with ranks
  1..n and scores written with `repr`, so reading the file back gives the same floats. A query
  with no docs writes no line.

  Args:
    run: `{qid: {docid: score}}`.
    tag: the run name (last column), without whitespace.

  Returns:
    `qid Q0 docid rank score tag` lines, newline-terminated.
  """
  _check_tokens([tag], "run", "run tag", "tag")
  qids = sorted(run)
  _check_tokens(qids, "run", "query ids", "qid")
  lines = []
  for qid in qids:
    ids, scores = rank_order(run[qid], qid)
    _check_tokens(ids, "run", f"query {qid!r}", "docid")
    lines += [f"{qid} Q0 {docid} {rank} {score!r} {tag}\n"
              for rank, (docid, score) in enumerate(zip(ids, scores.tolist()), start=1)]
  return "".join(lines)


def qrels_to_text(qrels: Mapping[str, Mapping[str, int]]) -> str:
  """Qrels as TREC qrels text: `qid 0 docid rel` lines sorted by qid, then doc id."""
  qids = sorted(qrels)
  _check_tokens(qids, "qrels", "query ids", "qid")
  lines = []
  for qid in qids:
    docids = sorted(qrels[qid])
    _check_tokens(docids, "qrels", f"query {qid!r}", "docid")
    for docid in docids:
      rel = qrels[qid][docid]
      if isinstance(rel, bool) or not isinstance(rel, (int, np.integer)):
        raise input_error(f"relevance must be an int, got {rel!r}", file="qrels",
                          record=f"query {qid!r} doc {docid!r}", field="rel")
      lines.append(f"{qid} 0 {docid} {int(rel)}\n")
  return "".join(lines)


def write_run(path: str, run: Mapping[str, Mapping[str, float]], tag: str) -> None:
  """Writes `run_to_text(run, tag)` to `path` atomically."""
  files.atomic_write_text(path, run_to_text(run, tag))


def write_qrels(path: str, qrels: Mapping[str, Mapping[str, int]]) -> None:
  """Writes `qrels_to_text(qrels)` to `path` atomically."""
  files.atomic_write_text(path, qrels_to_text(qrels))


def _lines(text: str, file: str, names: tuple[str, ...]):
  """Yields (line number, fields) of each non-blank line, checking the field count."""
  for number, line in enumerate(text.splitlines(), start=1):
    fields = line.split()
    if not fields:
      continue
    if len(fields) != len(names):
      raise input_error(f"expected {len(names)} whitespace-separated fields "
                        f"({' '.join(names)}), got {len(fields)}", file=file,
                        record=f"line {number}")
    yield number, fields


def _first_time(first_line: dict[tuple[str, str], int], qid: str, docid: str, number: int,
                file: str) -> None:
  """Records that (qid, docid) is on line `number`, or raises an InputError if it was seen."""
  if (qid, docid) in first_line:
    raise input_error(f"doc {docid!r} repeats for query {qid!r} (first on line "
                      f"{first_line[qid, docid]})", file=file, record=f"line {number}",
                      field="docid")
  first_line[qid, docid] = number


def parse_run(text: str, file: str) -> Run:
  """Parses TREC run text (`qid Q0 docid rank score tag`) strictly.

  The rank column must be an integer but is otherwise ignored (trec_eval re-sorts by score);
  the Q0 and tag columns are not checked. Blank lines are allowed.

  Args:
    text: the file's text.
    file: its name, for error messages.

  Returns:
    `{qid: {docid: score}}`.

  Raises:
    InputError: a line without 6 fields, a non-integer rank, a score that is not a decimal
      number or is NaN (+-inf is allowed), or a repeated (qid, docid); the message names the file,
      the line and the field.
  """
  run: Run = {}
  first_line: dict[tuple[str, str], int] = {}
  for number, (qid, _, docid, rank, score, _) in _lines(
      text, file, ("qid", "Q0", "docid", "rank", "score", "tag")):
    record = f"line {number}"
    if not _INT.fullmatch(rank):
      raise input_error(f"not an integer: {rank!r}", file=file, record=record, field="rank")
    if not _FLOAT.fullmatch(score):
      raise input_error(f"not a number: {score!r}", file=file, record=record, field="score")
    _first_time(first_line, qid, docid, number, file)
    run.setdefault(qid, {})[docid] = float(score)
  return run


def parse_qrels(text: str, file: str) -> Qrels:
  """Parses TREC qrels text (`qid iter docid rel`) strictly.

  The iter column is not checked; rel must be an integer (negative values, used by some TREC
  tracks for unjudged/spam, are kept and count as not relevant). Blank lines are allowed.

  Args:
    text: the file's text.
    file: its name, for error messages.

  Returns:
    `{qid: {docid: rel}}`.

  Raises:
    InputError: a line without 4 fields, a non-integer rel, or a repeated (qid, docid); the
      message names the file, the line and the field.
  """
  qrels: Qrels = {}
  first_line: dict[tuple[str, str], int] = {}
  for number, (qid, _, docid, rel) in _lines(text, file, ("qid", "iter", "docid", "rel")):
    record = f"line {number}"
    if not _INT.fullmatch(rel):
      raise input_error(f"not an integer: {rel!r}", file=file, record=record, field="rel")
    _first_time(first_line, qid, docid, number, file)
    qrels.setdefault(qid, {})[docid] = int(rel)
  return qrels


def _read_text(path: str) -> str:
  """The UTF-8 text of `path`, or an InputError naming it."""
  try:
    with open(path, "rb") as f:
      data = f.read()
  except OSError as e:
    raise input_error(f"cannot read ({e.strerror})", file=path) from e
  return files.decode_utf8(data, path)


def read_run(path: str) -> Run:
  """Reads a TREC run file (see `parse_run`)."""
  return parse_run(_read_text(path), path)


def read_qrels(path: str) -> Qrels:
  """Reads a TREC qrels file (see `parse_qrels`)."""
  return parse_qrels(_read_text(path), path)
