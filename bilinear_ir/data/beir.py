"""A BEIR-layout collection: `corpus.jsonl` (`_id`, `text`, optional `title`), `queries.jsonl`
(`_id`, `text`), `qrels/<split>.tsv` with the header `query-id corpus-id score`; every split file
present is loaded.
"""
from __future__ import annotations

import json
import os
from typing import Iterator

from bilinear_ir.data import readers
from bilinear_ir.data.collection import Collection
from bilinear_ir.errors import input_error

def _jsonl(path: str) -> Iterator[tuple[int, dict]]:
  """Yields (line, object) for each line of a JSON-lines file; blank lines are refused."""
  for n, line in readers.lines(path, readers.json_field_at):
    try:
      record = json.loads(line)
    except json.JSONDecodeError as e:
      raise input_error(f"broken JSON ({e})", file=path, record=f"line {n}", field="json") from e
    if not isinstance(record, dict):
      raise input_error("expected a JSON object", file=path, record=f"line {n}", field="json")
    yield n, record


def _string(record: dict, key: str, file: str, line: int, required: bool = True) -> str:
  if key not in record:
    if required:
      raise input_error("missing field", file=file, record=f"line {line}", field=key)
    return ""
  value = record[key]
  if not isinstance(value, str):
    raise input_error(f"expected a string, got {type(value).__name__}", file=file,
                      record=f"line {line}", field=key)
  return value


def load_beir(path: str) -> Collection:
  """Loads a BEIR-layout folder (see the module docstring)."""
  readers.require_folder(path)
  out = readers.CollectionBuilder(readers.folder_name(path), path)
  corpus = os.path.join(path, "corpus.jsonl")
  for n, rec in _jsonl(corpus):
    out.add_doc(_string(rec, "_id", corpus, n), _string(rec, "title", corpus, n, required=False),
                _string(rec, "text", corpus, n), corpus, f"line {n}", "_id", "text")
  queries = os.path.join(path, "queries.jsonl")
  for n, rec in _jsonl(queries):
    out.add_query(_string(rec, "_id", queries, n), _string(rec, "text", queries, n), queries,
                  f"line {n}", "_id", "text")
  qrels_dir = os.path.join(path, "qrels")
  splits = readers.split_files(qrels_dir, "", ".tsv") if os.path.isdir(qrels_dir) else {}
  if not splits:
    raise input_error("required qrels/<split>.tsv files not found", file=qrels_dir)
  columns = ("query-id", "corpus-id", "score")
  for split, file in splits.items():
    for n, cells in readers.tsv(file, columns):
      if n == 1:
        if tuple(c.strip() for c in cells) != columns:
          raise input_error(f"expected the header {' '.join(columns)!r}, got {cells}", file=file,
                            record="line 1", field=columns[0])
        continue
      out.add_qrel(split, cells[0], cells[1], readers.relevance(cells[2], file, n, "score"), file,
                   f"line {n}", "query-id", "corpus-id")
    if split not in out.qrels:
      raise input_error("no judgements", file=file, record="line 2", field="query-id")
  return out.collection()
