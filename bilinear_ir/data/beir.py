"""A BEIR-layout collection, a folder or a zip of one: `corpus.jsonl` (`_id`, `text`, optional
`title`), `queries.jsonl` (`_id`, `text`), `qrels/<split>.tsv` with the header
`query-id corpus-id score`; every split file present is loaded. A zip holds them at its root or in
one top folder (as BEIR's downloads do); its members are checked against path traversal and
streamed, never inflated whole.
"""
from __future__ import annotations

import functools
import json
import os
from typing import Iterator

from bilinear_ir import files
from bilinear_ir.data import readers
from bilinear_ir.data.collection import Collection
from bilinear_ir.errors import input_error

def _jsonl(path: str, opener: readers.Opener | None = None) -> Iterator[tuple[int, dict]]:
  """Yields (line, object) for each line of a JSON-lines file (or the stream of `opener`); blank
  lines are refused."""
  for n, line in readers.lines(path, readers.json_field_at, opener):
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


class _Folder:
  """The files of a BEIR folder: `read(rel)` -> (path for messages, None: open the path)."""

  def __init__(self, path: str):
    readers.require_folder(path)
    self.path, self.name = path, readers.folder_name(path)

  def read(self, rel: str) -> tuple[str, readers.Opener | None]:
    return readers.require_file(os.path.join(self.path, rel)), None

  def qrels(self) -> dict[str, str]:
    folder = os.path.join(self.path, "qrels")
    return readers.split_files(folder, "", ".tsv") if os.path.isdir(folder) else {}


class _Zip:
  """The members of a BEIR zip, at its root or inside one top folder (as BEIR's own zips),
  streamed as they are read."""

  def __init__(self, path: str):
    self.path = path
    self.name = os.path.splitext(os.path.basename(path))[0]
    self.members = files.zip_names(path)
    roots = [m[:-len("corpus.jsonl")] for m in self.members
             if m == "corpus.jsonl" or (m.endswith("/corpus.jsonl") and m.count("/") == 1)]
    if len(roots) != 1:
      raise input_error("expected one corpus.jsonl at the zip's root or in one top folder, found "
                        f"{len(roots)}", file=path)
    self.root = roots[0]

  def read(self, rel: str) -> tuple[str, readers.Opener | None]:
    name = self.root + rel
    if name not in self.members:
      raise input_error("required member missing", file=self.path, record=f"member {name!r}")
    return f"{self.path}/{name}", functools.partial(files.open_zip_member, self.path, name)

  def qrels(self) -> dict[str, str]:
    prefix = self.root + "qrels/"
    return {m[len(prefix):-len(".tsv")]: m[len(self.root):] for m in sorted(self.members)
            if m.startswith(prefix) and m.endswith(".tsv") and "/" not in m[len(prefix):]
            and len(m) > len(prefix) + len(".tsv")}


def load_beir(path: str) -> Collection:
  """Loads a BEIR-layout folder or zip (see the module docstring)."""
  source = _Zip(path) if os.path.isfile(path) and path.lower().endswith(".zip") else _Folder(path)
  out = readers.CollectionBuilder(source.name, path)
  corpus, opener = source.read("corpus.jsonl")
  for n, rec in _jsonl(corpus, opener):
    out.add_doc(_string(rec, "_id", corpus, n), _string(rec, "title", corpus, n, required=False),
                _string(rec, "text", corpus, n), corpus, f"line {n}", "_id", "text")
  queries, opener = source.read("queries.jsonl")
  for n, rec in _jsonl(queries, opener):
    out.add_query(_string(rec, "_id", queries, n), _string(rec, "text", queries, n), queries,
                  f"line {n}", "_id", "text")
  splits = source.qrels()
  if not splits:
    raise input_error("required qrels/<split>.tsv files not found", file=path)
  columns = ("query-id", "corpus-id", "score")
  for split, rel in splits.items():
    file, opener = (rel, None) if isinstance(source, _Folder) else source.read(rel)
    for n, cells in readers.tsv(file, columns, opener=opener):
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
