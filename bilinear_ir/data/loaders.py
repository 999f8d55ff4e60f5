r"""Collection loaders with strict validation, and the `collection_stats` job.

`load(config.data)` builds a `Collection` from one of four layouts (`config.data.format`):

* "scifact": the SciFact CSV zip (`corpus_train.csv`, `claims_train.csv`,
  `claims_validation.csv` at the zip's root); `path` "" is the copy embedded in the package.
  Abstracts are numpy reprs of sentence lists, read with `tokenize` + `ast.literal_eval` and
  joined with spaces (as BEIR does); qrels are the claims' `cited_doc_ids` (relevance 1); claim
  rows repeat per evidence entry and are deduplicated on `id`. Splits: "train" from
  `claims_train.csv`, "test" from `claims_validation.csv` (the unlabelled `claims_test.csv` is
  not a split).
* "beir": a BEIR folder: `corpus.jsonl` (`_id`, `text`, optional `title`), `queries.jsonl`
  (`_id`, `text`), `qrels/<split>.tsv` with the header `query-id corpus-id score`; every split
  file present is loaded.
* "msmarco": MS MARCO passage files as distributed: `collection.tsv` (pid, passage),
  `qrels.<split>.tsv` (qid 0 pid rel) and `queries.<split>.tsv` (qid, query) for each qrels
  file. Optional: `top1000.<name>.tsv` (qid pid query passage) becomes
  `Collection.candidates[name]` ({qid: [pid, ...]} in file order, for re-ranking);
  `triples.train.small.tsv` (query, positive, negative texts) is only recorded as
  `Collection.triples_path` and streamed by `msmarco_triples` (for `data.tfds_builder`).
* "trec": TREC Robust04 / CAR style files in one folder. Documents: `docs/` holding TREC SGML
  files (`<DOC><DOCNO>id</DOCNO><TEXT>...</TEXT></DOC>`, title from the first of `<HEAD>`,
  `<HEADLINE>`, `<TITLE>` present; inner tags dropped, whitespace collapsed; read in sorted
  file-name order, uncompressed UTF-8) or `paragraphs.tsv` (CAR: paragraph id, text), not both.
  Splits: each `qrels.<split>.txt` (TREC qrels: qid iteration docno relevance) with its queries
  in `topics.<split>.txt` (TREC topics; the query is the `<title>` field) or
  `queries.<split>.tsv` (CAR: qid, text).

Every problem is an `InputError` naming the file, the line (or zip member) and the field:
duplicate doc or query ids, qrels naming unknown docs or queries, a doc with neither title nor
text, broken JSON lines, non-integer relevance, bytes that are not UTF-8, missing files or
columns. Nothing is skipped silently. Text files are read as UTF-8 (a BOM is allowed).
"""
from __future__ import annotations

import ast
import csv
import io
import json
import os
import re
import tokenize
from typing import Callable, Iterator

from bilinear_ir import files
from bilinear_ir.data.collection import Collection
from bilinear_ir.errors import input_error
from bilinear_ir.eval import report as report_lib

FORMATS = ("scifact", "beir", "msmarco", "trec")
SCIFACT_SPLITS = {"train": "claims_train.csv", "test": "claims_validation.csv"}
SCIFACT_CORPUS = "corpus_train.csv"

# `field_at(data, offset)`: the name of the field that holds byte `offset` of `data`.
FieldAt = Callable[[bytes, int], str]


def embedded_scifact_path() -> str:
  """The SciFact zip shipped inside the package (`bilinear_ir/data/embedded/scifact.zip`)."""
  return os.path.join(os.path.dirname(os.path.abspath(__file__)), "embedded", "scifact.zip")


def load(data_config) -> Collection:
  """Loads and validates the collection named by a `data` config block.

  Args:
    data_config: `config.data` (see `data.config.data_config`): `format` and `path`.

  Returns:
    The `Collection`.

  Raises:
    InputError: unknown format, missing path, or any malformed file or record.
  """
  fmt, path = data_config.format, data_config.path
  if fmt not in FORMATS:
    raise input_error(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}", file="config",
                      field="data.format")
  if not path:
    if fmt != "scifact":
      raise input_error(f"format {fmt!r} needs a path (only scifact has an embedded copy)",
                        file="config", field="data.path")
    path = embedded_scifact_path()
  if not os.path.exists(path):
    raise input_error("no such file or folder", file=path, field="data.path")
  return {"scifact": load_scifact, "beir": load_beir, "msmarco": load_msmarco,
          "trec": load_trec}[fmt](path)


# ---------------------------------------------------------------------------------------------
# Shared readers and checks.


def _decode(data: bytes, file: str, field_at: FieldAt, first_line: int = 1) -> str:
  """Decodes UTF-8 (BOM dropped); else an `InputError` with the line and field of the bad byte."""
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    line = first_line + data.count(b"\n", 0, e.start)
    column = e.start - data.rfind(b"\n", 0, e.start)
    raise input_error(f"undecodable bytes at byte {column} of the line (not UTF-8)", file=file,
                      record=f"line {line}", field=field_at(data, e.start)) from e
  return text[1:] if first_line == 1 and text.startswith("\ufeff") else text


def _tsv_field_at(columns: tuple[str, ...]) -> FieldAt:
  """`field_at` for tab-separated lines: the column the offset falls in."""
  def field_at(data: bytes, offset: int) -> str:
    start = data.rfind(b"\n", 0, offset) + 1
    k = data.count(b"\t", start, offset)
    return columns[k] if k < len(columns) else f"column {k + 1}"
  return field_at


def _json_field_at(data: bytes, offset: int) -> str:
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


def _sgml_field_at(data: bytes, offset: int) -> str:
  """`field_at` for TREC SGML: the last tag opened before the offset."""
  tags = re.findall(rb"<([A-Za-z][A-Za-z0-9]*)[^>]*>", data[max(0, offset - 100_000):offset])
  return tags[-1].decode("ascii").upper() if tags else "text"


def _require_file(path: str) -> str:
  if not os.path.isfile(path):
    raise input_error("required file not found", file=path)
  return path


def _lines(path: str, field_at: FieldAt) -> Iterator[tuple[int, str]]:
  """Yields (line number from 1, decoded line without its newline), streaming the file."""
  with open(_require_file(path), "rb") as f:
    for n, raw in enumerate(f, 1):
      yield n, _decode(raw, path, field_at, first_line=n).rstrip("\r\n")


def _tsv(path: str, columns: tuple[str, ...],
         sep: str | None = "\t") -> Iterator[tuple[int, list[str]]]:
  """Yields (line, cells) of a headerless table with exactly `len(columns)` cells per line.

  `sep=None` splits on runs of whitespace (TREC qrels). Blank lines are refused.
  """
  for n, line in _lines(path, _tsv_field_at(columns)):
    cells = line.split(sep)
    if len(cells) != len(columns):
      field = columns[len(cells)] if len(cells) < len(columns) else f"column {len(columns) + 1}"
      raise input_error(f"expected {len(columns)} columns ({', '.join(columns)}), got "
                        f"{len(cells)}", file=path, record=f"line {n}", field=field)
    yield n, cells


def _relevance(text: str, file: str, line: int, field: str) -> int:
  try:
    return int(text)
  except ValueError as e:
    raise input_error(f"relevance must be an integer, got {text!r}", file=file,
                      record=f"line {line}", field=field) from e


def _clean(text: str) -> str:
  """Collapses runs of whitespace to one space."""
  return " ".join(text.split())


class _Builder:
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
                      triples_path=triples_path)


def _folder_name(path: str) -> str:
  return os.path.basename(os.path.normpath(path))


def _split_files(folder: str, prefix: str, suffix: str) -> dict[str, str]:
  """{split: path} for the files `prefix<split>suffix` in `folder` (sorted by split)."""
  out = {}
  for name in sorted(os.listdir(folder)):
    if name.startswith(prefix) and name.endswith(suffix) and len(name) > len(prefix + suffix):
      out[name[len(prefix):-len(suffix)]] = os.path.join(folder, name)
  return out


def _require_folder(path: str) -> None:
  if not os.path.isdir(path):
    raise input_error("expected a folder", file=path, field="data.path")


# ---------------------------------------------------------------------------------------------
# SciFact.


def _csv_rows(data: bytes, file: str,
              required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
  """Yields (first line of the record, {column: cell}) of a CSV file with a header."""
  def field_at(raw: bytes, offset: int) -> str:
    # Re-read leniently and name the column of the first cell holding an undecodable byte.
    reader = csv.reader(io.StringIO(raw.decode("utf-8", "surrogateescape"), newline=""))
    header = next(reader, [])
    for row in reader:
      for k, cell in enumerate(row):
        if any("\udc80" <= ch <= "\udcff" for ch in cell):
          return header[k] if k < len(header) else f"column {k + 1}"
    return "header"

  reader = csv.reader(io.StringIO(_decode(data, file, field_at), newline=""))
  header = next(reader, None) or []
  for column in required:
    if column not in header:
      raise input_error(f"missing column; header is {header}", file=file, record="line 1",
                        field=column)
  start = reader.line_num + 1
  for row in reader:
    if len(row) != len(header):
      raise input_error(f"expected {len(header)} cells, got {len(row)}", file=file,
                        record=f"line {start}", field=header[min(len(row), len(header) - 1)])
    yield start, dict(zip(header, row))
    start = reader.line_num + 1


def parse_sentence_list(text: str, file: str, record: str, field: str) -> list[str]:
  """Parses a numpy repr of a string array, e.g. `"['One.'\\n 'Two.']"`, into its strings."""
  sentences = []
  try:
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
      if tok.type == tokenize.STRING:
        value = ast.literal_eval(tok.string)
        if not isinstance(value, str):
          raise ValueError(f"{tok.string[:20]!r} is not a text literal")
        sentences.append(value)
      elif not (tok.type in (tokenize.NL, tokenize.NEWLINE, tokenize.ENDMARKER)
                or (tok.type == tokenize.OP and tok.string in "[]")):
        raise ValueError(f"unexpected {tok.string!r}")
  except (tokenize.TokenError, SyntaxError, ValueError, IndentationError) as e:
    raise input_error(f"not a list of string literals ({e})", file=file, record=record,
                      field=field) from e
  return sentences


def _id_list(text: str, file: str, record: str, field: str) -> list[str]:
  """Parses `[1 2 3]` (numpy repr of ids) into ['1', '2', '3']."""
  inner = text.strip()
  if not (inner.startswith("[") and inner.endswith("]")):
    raise input_error(f"expected '[id id ...]', got {text!r}", file=file, record=record,
                      field=field)
  return inner[1:-1].split()


def load_scifact(path: str) -> Collection:
  """Loads the SciFact CSV zip (see the module docstring). 5,183 docs; 809/300 queries."""
  members = files.read_zip_members(_require_file(path))
  def member(name: str) -> tuple[bytes, str]:
    if name not in members:
      raise input_error(f"required member missing; the zip has {sorted(members)}", file=path,
                        record=f"member {name!r}")
    return members[name], f"{path}/{name}"

  out = _Builder("scifact", path)
  data, file = member(SCIFACT_CORPUS)
  for line, row in _csv_rows(data, file, ("doc_id", "title", "abstract")):
    record = f"line {line}"
    sentences = parse_sentence_list(row["abstract"], file, record, "abstract")
    out.add_doc(row["doc_id"].strip(), row["title"].strip(), " ".join(sentences), file, record,
                "doc_id", "abstract")
  for split, name in SCIFACT_SPLITS.items():
    data, file = member(name)
    cited_by: dict[str, list[str]] = {}
    for line, row in _csv_rows(data, file, ("id", "claim", "cited_doc_ids")):
      record, qid = f"line {line}", row["id"].strip()
      cited = _id_list(row["cited_doc_ids"], file, record, "cited_doc_ids")
      if qid in cited_by:  # Claims repeat once per evidence entry: the rows must agree.
        if out.queries[qid] != row["claim"].strip() or cited_by[qid] != cited:
          raise input_error(f"claim {qid!r} repeats with a different claim or cited_doc_ids",
                            file=file, record=record, field="id")
        continue
      out.add_query(qid, row["claim"].strip(), file, record, "id", "claim")
      cited_by[qid] = cited
      for doc_id in cited:
        out.add_qrel(split, qid, doc_id, 1, file, record, "id", "cited_doc_ids")
  return out.collection()


# ---------------------------------------------------------------------------------------------
# BEIR.


def _jsonl(path: str) -> Iterator[tuple[int, dict]]:
  """Yields (line, object) for each line of a JSON-lines file; blank lines are refused."""
  for n, line in _lines(path, _json_field_at):
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
  _require_folder(path)
  out = _Builder(_folder_name(path), path)
  corpus = os.path.join(path, "corpus.jsonl")
  for n, rec in _jsonl(corpus):
    out.add_doc(_string(rec, "_id", corpus, n), _string(rec, "title", corpus, n, required=False),
                _string(rec, "text", corpus, n), corpus, f"line {n}", "_id", "text")
  queries = os.path.join(path, "queries.jsonl")
  for n, rec in _jsonl(queries):
    out.add_query(_string(rec, "_id", queries, n), _string(rec, "text", queries, n), queries,
                  f"line {n}", "_id", "text")
  qrels_dir = os.path.join(path, "qrels")
  splits = _split_files(qrels_dir, "", ".tsv") if os.path.isdir(qrels_dir) else {}
  if not splits:
    raise input_error("required qrels/<split>.tsv files not found", file=qrels_dir)
  columns = ("query-id", "corpus-id", "score")
  for split, file in splits.items():
    for n, cells in _tsv(file, columns):
      if n == 1:
        if tuple(c.strip() for c in cells) != columns:
          raise input_error(f"expected the header {' '.join(columns)!r}, got {cells}", file=file,
                            record="line 1", field=columns[0])
        continue
      out.add_qrel(split, cells[0], cells[1], _relevance(cells[2], file, n, "score"), file,
                   f"line {n}", "query-id", "corpus-id")
    if split not in out.qrels:
      raise input_error("no judgements", file=file, record="line 2", field="query-id")
  return out.collection()


# ---------------------------------------------------------------------------------------------
# MS MARCO passage.


def _read_qrels(out: _Builder, split: str, file: str) -> None:
  """Reads a TREC-style qrels file (qid iteration doc relevance; tabs or spaces)."""
  columns = ("qid", "iteration", "docno", "relevance")
  for n, (qid, _, doc_id, rel) in _tsv(file, columns, sep=None):
    out.add_qrel(split, qid, doc_id, _relevance(rel, file, n, "relevance"), file, f"line {n}",
                 "qid", "docno")
  if split not in out.qrels:
    raise input_error("no judgements", file=file, record="line 1", field="qid")


def _read_query_tsv(out: _Builder, file: str) -> None:
  for n, (qid, text) in _tsv(file, ("qid", "query")):
    out.add_query(qid, text, file, f"line {n}", "qid", "query")


def load_msmarco(path: str) -> Collection:
  """Loads MS MARCO passage files (see the module docstring)."""
  _require_folder(path)
  out = _Builder(_folder_name(path), path)
  corpus = os.path.join(path, "collection.tsv")
  for n, (pid, passage) in _tsv(corpus, ("pid", "passage")):
    out.add_doc(pid, "", passage, corpus, f"line {n}", "pid", "passage")
  qrels = _split_files(path, "qrels.", ".tsv")
  if not qrels:
    raise input_error("required qrels.<split>.tsv files not found", file=path)
  for split in qrels:
    _read_query_tsv(out, os.path.join(path, f"queries.{split}.tsv"))
  for split, file in qrels.items():
    _read_qrels(out, split, file)
  for name, file in _split_files(path, "top1000.", ".tsv").items():
    lists: dict[str, list[str]] = {}
    for n, (qid, pid, _, _) in _tsv(file, ("qid", "pid", "query", "passage")):
      if qid not in out.queries:
        raise input_error(f"unknown query id {qid!r}", file=file, record=f"line {n}", field="qid")
      if pid not in out.doc_row:
        raise input_error(f"unknown doc id {pid!r}", file=file, record=f"line {n}", field="pid")
      lists.setdefault(qid, []).append(pid)
    out.candidates[name] = lists
  triples = os.path.join(path, "triples.train.small.tsv")
  return out.collection(triples_path=triples if os.path.isfile(triples) else "")


def _ids_by_text(ids: list[str], texts: list[str]) -> dict[str, list[str]]:
  by_text: dict[str, list[str]] = {}
  for i, t in zip(ids, texts):
    by_text.setdefault(t, []).append(i)
  return by_text


def msmarco_triples(collection: Collection,
                    split: str = "train") -> Iterator[tuple[int, str, str, str]]:
  """Streams `collection.triples_path`, resolving each line's texts to ids.

  The file holds texts only (query, positive passage, negative passage). The query is the query
  of `split` with that text, the positive the passage with that text judged relevant (> 0) to it
  in `qrels[split]`, the negative the first passage (corpus order) with that text, which must not
  be judged relevant. Texts match exactly; anything else is an `InputError` naming the line.

  Yields:
    (line number, qid, positive doc id, negative doc id).
  """
  file = collection.triples_path
  if not file:
    raise input_error("the collection has no triples.train.small.tsv", file=collection.source)
  judged = collection.qrels.get(split)
  if judged is None:
    raise input_error(f"no qrels split {split!r} to check triples against", file=file)
  qids = sorted(judged)
  query_ids = _ids_by_text(qids, [collection.queries[q] for q in qids])
  doc_ids = _ids_by_text(collection.doc_ids, collection.texts)
  for n, (query, positive, negative) in _tsv(file, ("query", "positive", "negative")):
    record = f"line {n}"
    for field, text, index in (("query", query, query_ids), ("positive", positive, doc_ids),
                               ("negative", negative, doc_ids)):
      if text not in index:
        raise input_error(f"text not found in the {split} queries / the collection", file=file,
                          record=record, field=field)
    pairs = [(q, d) for q in query_ids[query] for d in doc_ids[positive] if judged[q].get(d, 0) > 0]
    if not pairs:
      raise input_error(f"passage is not judged relevant to the query in qrels {split!r}",
                        file=file, record=record, field="positive")
    qid, pos = pairs[0]
    neg = doc_ids[negative][0]
    if judged[qid].get(neg, 0) > 0:
      raise input_error(f"negative {neg!r} is judged relevant to query {qid!r}", file=file,
                        record=record, field="negative")
    yield n, qid, pos, neg


# ---------------------------------------------------------------------------------------------
# TREC (Robust04 SGML documents and topics, CAR paragraphs).

_DOC = re.compile(r"<DOC>(.*?)</DOC>", re.S | re.I)
_TAG = re.compile(r"<[^>]*>")
_TITLE_TAGS = ("HEAD", "HEADLINE", "TITLE")


def _elements(body: str, tag: str) -> list[str]:
  return re.findall(rf"<{tag}(?:\s[^>]*)?>(.*?)</{tag}>", body, re.S | re.I)


def _read_sgml(out: _Builder, file: str) -> None:
  """Reads one TREC SGML file of `<DOC>` records; any other non-blank text is refused."""
  with open(file, "rb") as f:
    text = _decode(f.read(), file, _sgml_field_at)
  end, line = 0, 1
  for m in _DOC.finditer(text):
    line += text.count("\n", end, m.start())
    if text[end:m.start()].strip():
      raise input_error("text outside <DOC>...</DOC>", file=file, record=f"line {line}",
                        field="DOC")
    record = f"line {line}"
    docno = [_clean(x) for x in _elements(m.group(1), "DOCNO")]
    if len(docno) != 1:
      raise input_error(f"expected one <DOCNO>, found {len(docno)}", file=file, record=record,
                        field="DOCNO")
    title = next((" ".join(_clean(_TAG.sub(" ", x)) for x in found) for found in
                  (_elements(m.group(1), t) for t in _TITLE_TAGS) if found), "")
    body = _clean(" ".join(_TAG.sub(" ", x) for x in _elements(m.group(1), "TEXT")))
    out.add_doc(docno[0], title, body, file, record, "DOCNO", "TEXT")
    line += text.count("\n", m.start(), m.end())
    end = m.end()
  if text[end:].strip():
    line += text.count("\n", end, len(text) - len(text[end:].lstrip()))
    raise input_error("text outside <DOC>...</DOC> (unclosed <DOC>?)", file=file,
                      record=f"line {line}", field="DOC")


def _read_topics(out: _Builder, file: str) -> None:
  """Reads a TREC topic file: `<top> <num> Number: 301 <title> text ... </top>` blocks."""
  with open(_require_file(file), "rb") as f:
    text = _decode(f.read(), file, _sgml_field_at)
  end, line, count = 0, 1, 0
  for m in re.finditer(r"<top>(.*?)</top>", text, re.S | re.I):
    line += text.count("\n", end, m.start())
    record = f"line {line}"
    fields = {k.lower(): v for k, v in re.findall(r"<(\w+)>([^<]*)", m.group(1))}
    for key in ("num", "title"):
      if not fields.get(key, "").strip():
        raise input_error("missing or empty", file=file, record=record, field=key)
    num = re.sub(r"^\s*Number:", "", fields["num"]).strip()
    title = re.sub(r"^\s*Topic:", "", fields["title"])
    out.add_query(num, _clean(title), file, record, "num", "title")
    line += text.count("\n", m.start(), m.end())
    end, count = m.end(), count + 1
  if count == 0 or text[end:].strip():
    raise input_error("expected <top>...</top> topics", file=file, record=f"line {line}",
                      field="top")


def load_trec(path: str) -> Collection:
  """Loads a TREC Robust04 / CAR folder (see the module docstring)."""
  _require_folder(path)
  out = _Builder(_folder_name(path), path)
  docs_dir, paragraphs = os.path.join(path, "docs"), os.path.join(path, "paragraphs.tsv")
  if os.path.isdir(docs_dir) == os.path.isfile(paragraphs):
    raise input_error("expected exactly one of docs/ (TREC SGML) or paragraphs.tsv (CAR)",
                      file=path)
  if os.path.isfile(paragraphs):
    for n, (pid, text) in _tsv(paragraphs, ("paragraph_id", "text")):
      out.add_doc(pid, "", text, paragraphs, f"line {n}", "paragraph_id", "text")
  else:
    for name in sorted(os.listdir(docs_dir)):
      _read_sgml(out, _require_file(os.path.join(docs_dir, name)))
  qrels = _split_files(path, "qrels.", ".txt")
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
      _read_query_tsv(out, queries)
  for split, file in qrels.items():
    _read_qrels(out, split, file)
  return out.collection()


# ---------------------------------------------------------------------------------------------
# The `collection_stats` job.


def _mean_words(texts: list[str]) -> float:
  return sum(len(t.split()) for t in texts) / len(texts) if texts else 0.0


def stats_job(config, workdir: str) -> report_lib.Report:  # pylint: disable=unused-argument
  """Loads `config.data` and reports docs, queries and qrels per split and mean lengths in words."""
  c = load(config.data)
  splits = {}
  for split in sorted(c.qrels):
    qids = c.split_query_ids(split)
    judged = c.qrels[split]
    splits[split] = {
        "queries": len(qids),
        "qrels": sum(len(d) for d in judged.values()),
        "relevant": sum(r > 0 for d in judged.values() for r in d.values()),
        "avg_query_words": _mean_words([c.queries[q] for q in qids]),
    }
  results = {
      "collection": c.name,
      "source": c.source,
      "docs": c.num_docs,
      "queries": len(c.queries),
      "avg_doc_words": _mean_words(c.doc_strings()),
      "avg_query_words": _mean_words(list(c.queries.values())),
      "splits": splits,
      "candidates": {k: {"queries": len(v), "pairs": sum(len(x) for x in v.values())}
                     for k, v in sorted(c.candidates.items())},
      "triples": c.triples_path,
  }
  rows = [[s, v["queries"], v["qrels"], v["relevant"], v["avg_query_words"]]
          for s, v in splits.items()]
  markdown = (f"# Collection {c.name}\n\n{c.num_docs} docs, mean {results['avg_doc_words']:.1f} "
              f"words (title + text); {len(c.queries)} queries, mean "
              f"{results['avg_query_words']:.1f} words.\n\n"
              + report_lib.markdown_table(rows, ["split", "queries", "qrels", "relevant",
                                                 "avg query words"], digits=1))
  return report_lib.Report(results=results, markdown=markdown)
