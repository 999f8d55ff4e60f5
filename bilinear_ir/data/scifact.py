"""SciFact as its CSV zip: `corpus_train.csv`, `claims_train.csv`, `claims_validation.csv`.

Abstracts are numpy reprs of sentence lists, read with `tokenize` + `ast.literal_eval` and joined
with spaces (as BEIR does); qrels are the claims' `cited_doc_ids` (relevance 1); claim rows repeat
per evidence entry and are deduplicated on `id`. Splits: "train" from `claims_train.csv`, "test"
from `claims_validation.csv` (the unlabelled `claims_test.csv` is not a split). The copy embedded
in the package is `embedded_scifact_path()`.
"""
from __future__ import annotations

import ast
import csv
import io
import os
import tokenize
from typing import Iterator

from bilinear_ir import files
from bilinear_ir.data import readers
from bilinear_ir.data.collection import Collection
from bilinear_ir.errors import input_error

SCIFACT_SPLITS = {"train": "claims_train.csv", "test": "claims_validation.csv"}
SCIFACT_CORPUS = "corpus_train.csv"


def embedded_scifact_path() -> str:
  """The SciFact zip shipped inside the package (`bilinear_ir/data/embedded/scifact.zip`)."""
  return os.path.join(os.path.dirname(os.path.abspath(__file__)), "embedded", "scifact.zip")

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

  reader = csv.reader(io.StringIO(readers.decode(data, file, field_at), newline=""))
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
  members = files.zip_names(readers.require_file(path))
  def member(name: str) -> tuple[bytes, str]:
    # A CSV record may span lines: each member is read whole, up to the record limit.
    if name not in members:
      raise input_error(f"required member missing; the zip has {sorted(members)}", file=path,
                        record=f"member {name!r}")
    return files.read_zip_member(path, name, readers.max_record_bytes()), f"{path}/{name}"

  out = readers.CollectionBuilder("scifact", path)
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
