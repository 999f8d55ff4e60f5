"""Progress reporting: a tqdm bar on a terminal, one line per finished stage otherwise.

Logs of batch jobs (CI, a cluster scheduler, `> log 2>&1`) should not fill with carriage-return
redraws, so when stderr is not a terminal a stage prints one line when it ends:
`train: 600/600 step in 12.3 s`. Only process 0 of a multi-host job reports.
"""
from __future__ import annotations

import sys
import time

import jax
from tqdm.auto import tqdm


def is_terminal() -> bool:
  """Whether stderr is an interactive terminal."""
  return bool(getattr(sys.stderr, "isatty", lambda: False)())


class _Lines:
  """The non-terminal stand-in for a tqdm bar: counts, and prints one line when closed."""

  def __init__(self, total: int, desc: str, unit: str, initial: int):
    self.total, self.desc, self.unit = total, desc, unit
    self.n = initial
    self._start = time.perf_counter()
    self._closed = False

  def update(self, n: int = 1) -> None:
    self.n += n

  def write(self, message: str) -> None:
    print(message, file=sys.stderr, flush=True)

  def close(self) -> None:
    if not self._closed:
      self._closed = True
      seconds = time.perf_counter() - self._start
      print(f"{self.desc}: {self.n}/{self.total} {self.unit} in {seconds:.1f} s",
            file=sys.stderr, flush=True)

  def __enter__(self):
    return self

  def __exit__(self, *exc) -> None:
    self.close()


class _Silent(_Lines):
  """Reports nothing (processes other than 0)."""

  def write(self, message: str) -> None:
    pass

  def close(self) -> None:
    pass


def write(message: str) -> None:
  """One line on stderr outside any bar (process 0 only)."""
  if jax.process_index() == 0:
    print(message, file=sys.stderr, flush=True)


def bar(total: int, desc: str, unit: str = "it", initial: int = 0, leave: bool = True,
        enabled: bool = True):
  """A progress bar over `total` units.

  Args:
    total: units of work in the stage.
    desc: the stage's name, e.g. "train" or "scifact docs".
    unit: what one unit is ("step", "text", "model").
    initial: units already done (a resumed run).
    leave: keep the finished bar on the terminal.
    enabled: False reports nothing (the same object, silent).

  Returns:
    An object with `update(n)`, `write(message)` and `close()` (also a context manager).
  """
  if not enabled or jax.process_index() != 0:
    return _Silent(total, desc, unit, initial)
  if is_terminal():
    return tqdm(total=total, initial=initial, desc=desc, unit=unit, leave=leave)
  return _Lines(total, desc, unit, initial)
