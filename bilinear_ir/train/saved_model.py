"""A trained model on disk: its params with what rebuilds the scorer (model block, dim, encoder).

`save_model(WORKDIR/model, config, dim, params)` is what `train_eval` writes; `load_model` gives
back `(module, params, meta)` on this process's devices, for the `retrieve` job and for users.
"""
from __future__ import annotations

import json
import os
from typing import Any

import flax.linen as nn
import jax
import ml_collections

from bilinear_ir import files
from bilinear_ir import scorers
from bilinear_ir.errors import input_error
from bilinear_ir.errors import require
from bilinear_ir.train import checkpoints


def save_model(directory: str, config: ml_collections.ConfigDict, dim: int, params: Any) -> None:
  """Saves the selected params with what rebuilds their scorer (model block, dim, encoder)."""
  meta = {"model": config.model.to_dict(), "dim": int(dim),
          "encoder": config.encoder.to_dict(), "data": config.data.to_dict()}
  checkpoints.save_params(directory, params, meta)


def load_model(directory: str) -> tuple[nn.Module, Any, dict[str, Any]]:
  """(module, params, meta) of a model written by `save_model` (e.g. `WORKDIR/model`).

  The params are restored into the shapes of a fresh `init_params` on this process's devices,
  so every process of a multi-host job loads its own full copy (orbax restores without a
  template onto the devices that saved them, which other processes cannot address).
  """
  where = os.path.join(directory, "model.json")
  if not os.path.isdir(directory):
    raise input_error("no such model folder (a train_eval WORKDIR/model)", file=directory,
                      field="model_dir")
  try:
    with open(where, "rb") as f:
      meta = json.loads(files.decode_utf8(f.read(), where))
  except (OSError, ValueError):
    meta = None
  require(isinstance(meta, dict), "missing or not JSON: not a saved model (train_eval writes "
          "one to WORKDIR/model)", file=where)
  require(isinstance(meta.get("model"), dict), "missing or not an object", file=where,
          field="model")
  require(isinstance(meta.get("dim"), int), "missing or not an int", file=where, field="dim")
  module = scorers.from_config(ml_collections.ConfigDict(meta["model"]), meta["dim"])
  template = scorers.init_params(module, jax.random.key(0))
  try:
    params, meta = checkpoints.load_params(directory, template)
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise input_error(f"params do not load as {meta['model'].get('scorer')!r} of width "
                      f"{meta['dim']} ({type(e).__name__}: {e})", file=directory,
                      field="model_dir") from e
  return module, params, meta
