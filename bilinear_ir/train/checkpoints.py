"""The one module that talks to orbax: save every N steps, keep M, resume from the latest.

A checkpoint holds a pytree (train state, best params) and a small JSON record (step, best dev
metric, history), so a killed run resumes where it stopped and ends with the same numbers.
"""
from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp


class Checkpoints:
  """Orbax `CheckpointManager` over `directory`.

  Args:
    directory: where step folders are written (created if missing).
    every: save when `step % every == 0` (and whenever `save(..., force=True)`).
    keep: how many recent checkpoints to keep.
  """

  def __init__(self, directory: str, every: int, keep: int):
    self.every = max(int(every), 1)
    self._manager = ocp.CheckpointManager(
        os.path.abspath(directory),
        options=ocp.CheckpointManagerOptions(max_to_keep=max(int(keep), 1), create=True,
                                             enable_async_checkpointing=False))

  def latest_step(self) -> int | None:
    """The newest saved step, or None."""
    return self._manager.latest_step()

  def maybe_save(self, step: int, tree: Any, record: dict[str, Any], force: bool = False) -> bool:
    """Saves `tree` (pytree of arrays) and `record` (JSON) at `step` when due; returns if saved."""
    if not force and step % self.every:
      return False
    if self._manager.latest_step() == step:
      return False
    self._manager.save(step, args=ocp.args.Composite(tree=ocp.args.StandardSave(tree),
                                                     record=ocp.args.JsonSave(record)),
                       force=True)
    self._manager.wait_until_finished()
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
