"""The one module that talks to orbax: save every N steps, keep M, resume from the latest.

A checkpoint holds a pytree (train state, best params) and a small JSON record (step, best dev
metric, history), so a killed run resumes where it stopped and ends with the same numbers.

Faults: a save the machine refuses (full disk, read-only folder, quota) raises `WriteError`
naming the step folder, with orbax's temporary folder (`<step>.orbax-checkpoint-tmp*`) removed
and the earlier checkpoints intact; orbax's own reports of it (printed by its writer threads)
are dropped, the error says it. SIGINT and SIGTERM that arrive during a save are handled once the
save is complete, so an interrupted run keeps its last complete checkpoint. Temporary folders a
killed run left behind are removed when the next run opens the folder.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import glob
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from typing import Any, Iterator

import jax
import orbax.checkpoint as ocp

from bilinear_ir import files

_TMP = ".orbax-checkpoint-tmp"


class Checkpoints:
  """Orbax `CheckpointManager` over `directory`.

  Args:
    directory: where step folders are written (created if missing).
    every: save when `step % every == 0` (and whenever `save(..., force=True)`).
    keep: how many recent checkpoints to keep.
  """

  def __init__(self, directory: str, every: int, keep: int):
    self.every = max(int(every), 1)
    self.directory = os.path.abspath(directory)
    try:
      self._manager = ocp.CheckpointManager(
          self.directory,
          options=ocp.CheckpointManagerOptions(max_to_keep=max(int(keep), 1), create=True,
                                               enable_async_checkpointing=False,
                                               cleanup_tmp_directories=True))
    except Exception as e:  # pylint: disable=broad-except  # re-raised unless a refused write
      refused = files.write_error(self.directory, e)
      if refused is None:
        raise
      raise refused from None

  def latest_step(self) -> int | None:
    """The newest saved step, or None."""
    return self._manager.latest_step()

  def maybe_save(self, step: int, tree: Any, record: dict[str, Any], force: bool = False) -> bool:
    """Saves `tree` (pytree of arrays) and `record` (JSON) at `step` when due; returns if saved.

    Raises:
      WriteError: the machine refused the write (nothing of the step is left on disk).
    """
    if not force and step % self.every:
      return False
    if self._manager.latest_step() == step:
      return False
    items = {"tree": ocp.args.StandardSave(tree), "record": ocp.args.JsonSave(record)}
    if os.environ.get("BILINEAR_IR_FAULT"):  # test hook: a write inside orbax's temporary folder
      items["fault"] = _FaultSave()
    with _signals_deferred(), _stderr_held() as stderr:
      try:
        self._manager.save(step, args=ocp.args.Composite(**items), force=True)
        self._manager.wait_until_finished()
      except BaseException as e:
        _settle(stderr["held"])  # orbax's threads may still write into the temporary folder
        for tmp in glob.glob(os.path.join(glob.escape(self.directory), f"{step}{_TMP}*")):
          shutil.rmtree(tmp, ignore_errors=True)
        refused = files.write_error(os.path.join(self.directory, str(step)), e)
        if refused is None:
          raise
        # orbax's reports of the same refusal are dropped (the error says it), also those of its
        # abandoned asyncio tasks, which asyncio logs when they are collected ("Task exception
        # was never retrieved"): now, or at exit.
        gc.collect()
        logging.getLogger("asyncio").disabled = True
        stderr["drop"] = True
        raise refused from None
    return True

  def restore(self, template: Any, step: int | None = None) -> tuple[Any, dict[str, Any]] | None:
    """Restores `(tree, record)` at `step` (default: latest) shaped like `template`, or None."""
    step = self.latest_step() if step is None else step
    if step is None:
      return None
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
    out = self._manager.restore(step, args=ocp.args.Composite(
        tree=ocp.args.StandardRestore(abstract), record=ocp.args.JsonRestore()))
    return out.tree, out.record

  def close(self) -> None:
    self._manager.close()


class _FaultHandler(ocp.CheckpointHandler):
  """Test hook (`files.injected_fault`): the item's save writes nothing but is refused as a write
  under the fault's folder would be, once orbax has made its temporary folder, so that a refused
  save is cleaned up as on a full disk."""

  def save(self, directory, args):  # pylint: disable=unused-argument
    files.injected_fault(os.path.join(os.fspath(directory), "fault"))

  def restore(self, directory, args=None):  # pylint: disable=unused-argument
    return None


@ocp.args.register_with_handler(_FaultHandler, for_save=True, for_restore=True)
@dataclasses.dataclass
class _FaultSave(ocp.args.CheckpointArgs):
  """The args of `_FaultHandler` (none)."""


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
  """SIGINT/SIGTERM arriving in the block are raised again when it ends (main thread only)."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  got = []
  old = {s: signal.signal(s, lambda signum, frame: got.append(signum))
         for s in (signal.SIGINT, signal.SIGTERM)}
  try:
    yield
  finally:
    for s, handler in old.items():
      signal.signal(s, signal.SIG_DFL if handler is None else handler)
    if got:
      signal.raise_signal(got[0])


@contextlib.contextmanager
def _stderr_held() -> Iterator[dict]:
  """Holds what is written to file descriptor 2 in the block: orbax's logs, its threads' errors
  and what tensorstore's callbacks print from C. Written out at the end unless the block set the
  yielded dict's "drop" (a refused write, whose error says it all)."""
  sys.stderr.flush()
  saved = os.dup(2)
  held = tempfile.TemporaryFile()
  state = {"drop": False, "held": held}
  os.dup2(held.fileno(), 2)
  try:
    yield state
  finally:
    sys.stderr.flush()
    os.dup2(saved, 2)
    os.close(saved)
    if not state["drop"]:
      held.seek(0)
      sys.stderr.buffer.write(held.read())
      sys.stderr.flush()
    held.close()


def _settle(held, quiet_s: float = 0.5, limit_s: float = 5.0) -> None:
  """Waits until the file `held` has not grown for `quiet_s` seconds (at most `limit_s`): after a
  failed save, orbax's writer threads and tensorstore's callbacks go on for a while."""
  start = last = time.monotonic()
  seen = os.fstat(held.fileno()).st_size
  while time.monotonic() - last < quiet_s and time.monotonic() - start < limit_s:
    time.sleep(0.05)
    size = os.fstat(held.fileno()).st_size
    if size != seen:
      seen, last = size, time.monotonic()
