"""The project's one exception type for bad input (files, records, config values).

`main` turns an `InputError` into exit code 2 and one line on stderr, with no results written.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator


class InputError(ValueError):
  """Bad input: a malformed file or record, or an invalid config value.

  Build messages with `where(...)` so they name the file, record and field.
  """


class WriteError(InputError):
  """The machine refused a write: a full disk, a read-only folder, a quota, a permission.

  Not a bug of the project: `main` prints it as one line (exit code 2), e.g. "no space left on
  device writing runs/x/checkpoints/40", and a rerun after the cause is removed resumes.

  Attributes:
    errno: the OS error number (`errno.ENOSPC`, ...).
    path: the file or folder that was being written.
  """

  def __init__(self, errno: int, path: str):
    text = os.strerror(errno)
    super().__init__(f"{text[:1].lower()}{text[1:]} writing {path}")
    self.errno, self.path = errno, path


def where(file: str | None = None, record: object = None, field: str | None = None) -> str:
  """Formats a location prefix such as `corpus.jsonl: line 12: field 'text'`.

  Args:
    file: the file (or config) the problem is in.
    record: a line number, record id or other locator inside the file.
    field: the field of the record.

  Returns:
    `'file: record: field'` with the missing parts left out.
  """
  parts = []
  if file is not None:
    parts.append(str(file))
  if record is not None:
    parts.append(record if isinstance(record, str) else f"record {record}")
  if field is not None:
    parts.append(f"field {field!r}")
  return ": ".join(parts)


def input_error(message: str, file: str | None = None, record: object = None,
                field: str | None = None) -> InputError:
  """Returns an `InputError` whose text is `where(file, record, field): message`."""
  prefix = where(file, record, field)
  return InputError(f"{prefix}: {message}" if prefix else message)


def missing_extra(package: str, extra: str, what: str = "") -> InputError:
  """The one-line error of an optional feature whose package is not installed.

  Args:
    package: the missing distribution (e.g. "faiss-cpu").
    extra: the project extra that installs it (e.g. "faiss").
    what: the feature that needs it, for the message.
  """
  need = f"{what} needs {package}" if what else f"{package} is not installed"
  return InputError(f"{need}; install it with `pip install \"bilinear_ir[{extra}]\"` (in a "
                    f"checkout: `pip install -e \".[{extra}]\"`)")


def require(condition: bool, message: str, *, file: str | None = "config",
            field: str | None = None) -> None:
  """Raises `InputError` (located at `file`/`field`) unless `condition` holds.

  Used to validate config values, e.g. `require(rank > 0, 'must be > 0', field='model.rank')`.
  """
  if not condition:
    raise input_error(message, file=file, field=field)


@contextlib.contextmanager
def doing(what: str) -> Iterator[None]:
  """A `MemoryError` raised in the block is labelled with `what` ("reading corpus.jsonl"),
  unless a block inside labelled it first: `main` names it in its one line (exit code 2)."""
  try:
    yield
  except MemoryError as e:
    if not getattr(e, "doing", None):
      e.doing = what
    raise
