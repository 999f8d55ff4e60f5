"""Shared readers and checks of the collection loaders (one module per format beside it).

Each reader streams a file (or a zip member) line by line as UTF-8 (a BOM is allowed) and turns
every problem into an `InputError` naming the file, the line and the field; a line longer than
the record limit (`record_limit`, `data.max_record_mib`: 64 MiB) is one too, found after reading
at most that many bytes of it. `CollectionBuilder` accumulates docs, queries and qrels and refuses
duplicate ids, judgements of unknown docs or queries and empty texts. Nothing is skipped silently.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
from typing import IO, Callable, ContextManager, Iterator

from bilinear_ir.data.collection import Collection
from bilinear_ir import errors
from bilinear_ir.errors import input_error

# `field_at(data, offset)`: the name of the field that holds byte `offset` of `data`.
FieldAt = Callable[[bytes, int], str]
# The longest record (a line; a SciFact CSV member) read, in MiB: `data.max_record_mib`.
MAX_RECORD_MIB = 64
_limit_mib = [MAX_RECORD_MIB]


@contextlib.contextmanager
def record_limit(mib: int) -> Iterator[None]:
  """Reads in the block refuse a record longer than `mib` MiB (`loaders.load` sets it from
  `data.max_record_mib`)."""
  _limit_mib.append(int(mib))
  try:
    yield
  finally:
    _limit_mib.pop()


def max_record_bytes() -> int:
  """The record limit in force, in bytes."""
  return _limit_mib[-1] << 20


def bounded_lines(f: IO[bytes], path: str) -> Iterator[tuple[int, bytes]]:
  """Yields (line number from 1, raw line with its newline) of a binary stream, reading at most
  the record limit (`max_record_bytes`) + 1 bytes of any line; a longer line is an `InputError`
  naming `path` and the line."""
  limit = max_record_bytes()
  for n, raw in enumerate(iter(lambda: f.readline(limit + 1), b""), 1):
    if len(raw) > limit and not raw.endswith(b"\n"):
      raise input_error(f"a line longer than {limit >> 20} MiB (data.max_record_mib)", file=path,
                        record=f"line {n}")
    yield n, raw


def decode(data: bytes, file: str, field_at: FieldAt, first_line: int = 1) -> str:
  """Decodes UTF-8 (BOM dropped); else an `InputError` with the line and field of the bad byte."""
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    line = first_line + data.count(b"\n", 0, e.start)
    column = e.start - data.rfind(b"\n", 0, e.start)
    raise input_error(f"undecodable bytes at byte {column} of the line (not UTF-8)", file=file,
                      record=f"line {line}", field=field_at(data, e.start)) from e
  return text[1:] if first_line == 1 and text.startswith("\ufeff") else text


def tsv_field_at(columns: tuple[str, ...]) -> FieldAt:
  """`field_at` for tab-separated lines: the column the offset falls in."""
  def field_at(data: bytes, offset: int) -> str:
    start = data.rfind(b"\n", 0, offset) + 1
    k = data.count(b"\t", start, offset)
    return columns[k] if k < len(columns) else f"column {k + 1}"
  return field_at


def json_field_at(data: bytes, offset: int) -> str:
  """`field_at` for JSON lines: the key whose value holds the offset (parsed leniently)."""
  start = data.rfind(b"\n", 0, offset) + 1
  end = data.find(b"\n", offset)
  try:
    record = json.loads(data[start:None if end < 0 else end].decode("utf-8", "surrogateescape"))
  except json.JSONDecodeError:
    return "json"
  if isinstance(record, dict):
    for key, value in record.items():
      if any("\udc80" <= ch <= "\udcff" for ch in str(key) + str(value)):
        return str(key)
  return "json"


def sgml_field_at(data: bytes, offset: int) -> str:
  """`field_at` for TREC SGML: the last tag opened before the offset."""
  tags = re.findall(rb"<([A-Za-z][A-Za-z0-9]*)[^>]*>", data[max(0, offset - 100_000):offset])
  return tags[-1].decode("ascii").upper() if tags else "text"


def require_file(path: str) -> str:
  if not os.path.isfile(path):
    raise input_error("required file not found", file=path)
  return path


# Opens a stream to read in place of the file: a zip member (`files.open_zip_member`).
Opener = Callable[[], ContextManager[IO[bytes]]]


def lines(path: str, field_at: FieldAt, opener: Opener | None = None
          ) -> Iterator[tuple[int, str]]:
  """Yields (line number from 1, decoded line without its newline), streaming the file, or the
  stream `opener()` gives (a zip member; `path` then only names it in errors), line by line
  (`bounded_lines`)."""
  with errors.doing(f"reading {path}"), (
      opener() if opener is not None else open(require_file(path), "rb")) as f:
    for n, raw in bounded_lines(f, path):
      yield n, decode(raw, path, field_at, first_line=n).rstrip("\r\n")


def tsv(path: str, columns: tuple[str, ...], sep: str | None = "\t",
        opener: Opener | None = None) -> Iterator[tuple[int, list[str]]]:
  """Yields (line, cells) of a headerless table with exactly `len(columns)` cells per line.

  `sep=None` splits on runs of whitespace (TREC qrels). Blank lines are refused. `opener`: a
  stream to read instead of the file (see `lines`).
  """
  for n, line in lines(path, tsv_field_at(columns), opener):
    cells = line.split(sep)
    if len(cells) != len(columns):
      field = columns[len(cells)] if len(cells) < len(columns) else f"column {len(columns) + 1}"
      raise input_error(f"expected {len(columns)} columns ({', '.join(columns)}), got "
                        f"{len(cells)}", file=path, record=f"line {n}", field=field)
    yield n, cells


def relevance(text: str, file: str, line: int, field: str) -> int:
  try:
    return int(text)
  except ValueError as e:
    raise input_error(f"relevance must be an integer, got {text!r}", file=file,
                      record=f"line {line}", field=field) from e


def clean(text: str) -> str:
  """Collapses runs of whitespace to one space."""
  return " ".join(text.split())


class CollectionBuilder:
  """Accumulates docs, queries and qrels, checking each as it is added."""

  def __init__(self, name: str, source: str):
    self.name, self.source = name, source
    self.doc_ids: list[str] = []
    self.titles: list[str] = []
    self.texts: list[str] = []
    self.doc_row: dict[str, int] = {}
    self.queries: dict[str, str] = {}
    self.query_file: dict[str, str] = {}
    self.qrels: dict[str, dict[str, dict[str, int]]] = {}
    self.candidates: dict[str, dict[str, list[str]]] = {}
    self.query_meta: dict[str, dict[str, str]] = {}
    self.negatives: dict[str, list[str]] = {}

  def add_doc(self, doc_id: str, title: str, text: str, file: str, record: str,
              id_field: str, text_field: str) -> None:
    """Adds one doc; its id must be new and non-empty, and title or text non-empty."""
    if not doc_id:
      raise input_error("empty doc id", file=file, record=record, field=id_field)
    if doc_id in self.doc_row:
      raise input_error(f"duplicate doc id {doc_id!r}", file=file, record=record, field=id_field)
    if not title.strip() and not text.strip():
      raise input_error(f"doc {doc_id!r} has neither title nor text", file=file, record=record,
                        field=text_field)
    self.doc_row[doc_id] = len(self.doc_ids)
    self.doc_ids.append(doc_id)
    self.titles.append(title)
    self.texts.append(text)

  def add_query(self, qid: str, text: str, file: str, record: str, id_field: str,
                text_field: str) -> None:
    """Adds one query. An id seen before is refused, unless it came from another file with the
    same text (MS MARCO's `queries.dev.small.tsv` repeats queries of `queries.dev.tsv`)."""
    if not qid:
      raise input_error("empty query id", file=file, record=record, field=id_field)
    if not text.strip():
      raise input_error(f"query {qid!r} has an empty text", file=file, record=record,
                        field=text_field)
    if qid in self.queries:
      first = self.query_file[qid]
      if first == file or self.queries[qid] != text:
        raise input_error(f"duplicate query id {qid!r} (first in {first})", file=file,
                          record=record, field=id_field)
      return
    self.queries[qid] = text
    self.query_file[qid] = file

  def add_qrel(self, split: str, qid: str, doc_id: str, rel: int, file: str, record: str,
               qid_field: str, doc_field: str) -> None:
    """Adds one judgement; the query and doc must be known, a repeated pair must agree."""
    if qid not in self.queries:
      raise input_error(f"unknown query id {qid!r}", file=file, record=record, field=qid_field)
    if doc_id not in self.doc_row:
      raise input_error(f"unknown doc id {doc_id!r}", file=file, record=record, field=doc_field)
    judged = self.qrels.setdefault(split, {}).setdefault(qid, {})
    if judged.get(doc_id, rel) != rel:
      raise input_error(f"({qid!r}, {doc_id!r}) judged twice with different relevance",
                        file=file, record=record, field=doc_field)
    judged[doc_id] = rel

  def collection(self, triples_path: str = "") -> Collection:
    if not self.doc_ids:
      raise input_error("the collection has no documents", file=self.source)
    return Collection(name=self.name, doc_ids=self.doc_ids, titles=self.titles,
                      texts=self.texts, queries=self.queries, qrels=self.qrels,
                      source=self.source, candidates=self.candidates,
                      triples_path=triples_path, query_meta=self.query_meta,
                      negatives=self.negatives)


def folder_name(path: str) -> str:
  return os.path.basename(os.path.normpath(path))


def split_files(folder: str, prefix: str, suffix: str) -> dict[str, str]:
  """{split: path} for the files `prefix<split>suffix` in `folder` (sorted by split)."""
  out = {}
  for name in sorted(os.listdir(folder)):
    if name.startswith(prefix) and name.endswith(suffix) and len(name) > len(prefix + suffix):
      out[name[len(prefix):-len(suffix)]] = os.path.join(folder, name)
  return out


def require_folder(path: str) -> None:
  if not os.path.isdir(path):
    raise input_error("expected a folder", file=path, field="data.path")



def read_qrels(out: CollectionBuilder, split: str, file: str) -> None:
  """Reads a TREC-style qrels file (qid iteration doc relevance; tabs or spaces)."""
  columns = ("qid", "iteration", "docno", "relevance")
  for n, (qid, _, doc_id, rel) in tsv(file, columns, sep=None):
    out.add_qrel(split, qid, doc_id, relevance(rel, file, n, "relevance"), file, f"line {n}",
                 "qid", "docno")
  if split not in out.qrels:
    raise input_error("no judgements", file=file, record="line 1", field="qid")


def read_query_tsv(out: CollectionBuilder, file: str) -> None:
  for n, (qid, text) in tsv(file, ("qid", "query")):
    out.add_query(qid, text, file, f"line {n}", "qid", "query")
