"""TREC Robust04 / CAR style files in one folder.

Documents: `docs/` holding TREC SGML files (`<DOC><DOCNO>id</DOCNO><TEXT>...</TEXT></DOC>`, title
from the first of `<HEAD>`, `<HEADLINE>`, `<TITLE>` present; inner tags dropped, whitespace
collapsed; read in sorted file-name order, uncompressed UTF-8, streamed `<DOC>` by `<DOC>` with
`data.max_record_mib` as the longest) or `paragraphs.tsv` (CAR: paragraph id, text), not both.
Splits: each `qrels.<split>.txt` (TREC qrels: qid iteration docno relevance) with its queries in
`topics.<split>.txt` (TREC topics; the query is the `<title>` field) or `queries.<split>.tsv`
(CAR: qid, text).
"""
from __future__ import annotations

import os
import re
from typing import Iterator

from bilinear_ir.data import readers
from bilinear_ir.data.collection import Collection
from bilinear_ir.errors import input_error

_DOC = re.compile(r"<DOC>(.*?)</DOC>", re.S | re.I)
_TAG = re.compile(r"<[^>]*>")
_TITLE_TAGS = ("HEAD", "HEADLINE", "TITLE")


def _elements(body: str, tag: str) -> list[str]:
  return re.findall(rf"<{tag}(?:\s[^>]*)?>(.*?)</{tag}>", body, re.S | re.I)


def _pieces(file: str, end_tag: bytes) -> Iterator[tuple[int, str]]:
  """Yields (first line, decoded text) of the runs of lines of `file` that each end with a line
  ending in `end_tag` (lower case; `</doc>`, `</top>`), the rest as a last run: the file streamed
  record by record (`readers.bounded_lines`), a run longer than the record limit refused."""
  limit = readers.max_record_bytes()
  with open(readers.require_file(file), "rb") as f:
    run: list[bytes] = []
    start = size = 0
    for n, raw in readers.bounded_lines(f, file):
      if not run:
        start, size = n, 0
      run.append(raw)
      size += len(raw)
      if size > limit:
        raise input_error(f"a record longer than {limit >> 20} MiB (data.max_record_mib)",
                          file=file, record=f"line {start}")
      if raw.rstrip().lower().endswith(end_tag):
        yield start, readers.decode(b"".join(run), file, readers.sgml_field_at, start)
        run = []
    if run:
      yield start, readers.decode(b"".join(run), file, readers.sgml_field_at, start)


def _read_sgml(out: readers.CollectionBuilder, file: str) -> None:
  """Reads one TREC SGML file of `<DOC>` records; any other non-blank text is refused."""
  for line, text in _pieces(file, b"</doc>"):
    end = 0
    for m in _DOC.finditer(text):
      line += text.count("\n", end, m.start())
      if text[end:m.start()].strip():
        raise input_error("text outside <DOC>...</DOC>", file=file, record=f"line {line}",
                          field="DOC")
      record = f"line {line}"
      docno = [readers.clean(x) for x in _elements(m.group(1), "DOCNO")]
      if len(docno) != 1:
        raise input_error(f"expected one <DOCNO>, found {len(docno)}", file=file, record=record,
                          field="DOCNO")
      title = next((" ".join(readers.clean(_TAG.sub(" ", x)) for x in found) for found in
                    (_elements(m.group(1), t) for t in _TITLE_TAGS) if found), "")
      body = readers.clean(" ".join(_TAG.sub(" ", x) for x in _elements(m.group(1), "TEXT")))
      out.add_doc(docno[0], title, body, file, record, "DOCNO", "TEXT")
      line += text.count("\n", m.start(), m.end())
      end = m.end()
    if text[end:].strip():
      line += text.count("\n", end, len(text) - len(text[end:].lstrip()))
      raise input_error("text outside <DOC>...</DOC> (unclosed <DOC>?)", file=file,
                        record=f"line {line}", field="DOC")


def _read_topics(out: readers.CollectionBuilder, file: str) -> None:
  """Reads a TREC topic file: `<top> <num> Number: 301 <title> text ... </top>` blocks."""
  count, line = 0, 1
  for line, text in _pieces(file, b"</top>"):
    end = 0
    for m in re.finditer(r"<top>(.*?)</top>", text, re.S | re.I):
      line += text.count("\n", end, m.start())
      record = f"line {line}"
      fields = {k.lower(): v for k, v in re.findall(r"<(\w+)>([^<]*)", m.group(1))}
      for key in ("num", "title"):
        if not fields.get(key, "").strip():
          raise input_error("missing or empty", file=file, record=record, field=key)
      num = re.sub(r"^\s*Number:", "", fields["num"]).strip()
      title = re.sub(r"^\s*Topic:", "", fields["title"])
      out.add_query(num, readers.clean(title), file, record, "num", "title")
      line += text.count("\n", m.start(), m.end())
      end, count = m.end(), count + 1
    if text[end:].strip():
      raise input_error("expected <top>...</top> topics", file=file, record=f"line {line}",
                        field="top")
  if count == 0:
    raise input_error("expected <top>...</top> topics", file=file, record=f"line {line}",
                      field="top")


def load_trec(path: str) -> Collection:
  """Loads a TREC Robust04 / CAR folder (see the module docstring)."""
  readers.require_folder(path)
  out = readers.CollectionBuilder(readers.folder_name(path), path)
  docs_dir, paragraphs = os.path.join(path, "docs"), os.path.join(path, "paragraphs.tsv")
  if os.path.isdir(docs_dir) == os.path.isfile(paragraphs):
    raise input_error("expected exactly one of docs/ (TREC SGML) or paragraphs.tsv (CAR)",
                      file=path)
  if os.path.isfile(paragraphs):
    for n, (pid, text) in readers.tsv(paragraphs, ("paragraph_id", "text")):
      out.add_doc(pid, "", text, paragraphs, f"line {n}", "paragraph_id", "text")
  else:
    for name in sorted(os.listdir(docs_dir)):
      _read_sgml(out, readers.require_file(os.path.join(docs_dir, name)))
  qrels = readers.split_files(path, "qrels.", ".txt")
  if not qrels:
    raise input_error("required qrels.<split>.txt files not found", file=path)
  for split in qrels:
    topics = os.path.join(path, f"topics.{split}.txt")
    queries = os.path.join(path, f"queries.{split}.tsv")
    if os.path.isfile(topics) == os.path.isfile(queries):
      raise input_error(f"expected exactly one of topics.{split}.txt or queries.{split}.tsv",
                        file=path)
    if os.path.isfile(topics):
      _read_topics(out, topics)
    else:
      readers.read_query_tsv(out, queries)
  for split, file in qrels.items():
    readers.read_qrels(out, split, file)
  return out.collection()
