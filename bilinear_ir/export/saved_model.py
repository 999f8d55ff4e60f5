"""A trained similarity on disk, portable: `config.json` + `model.safetensors`.

    save_model(path, module, params, embedding)   # any scorer of the registry
    module, params, meta = load_model(path)
    module, params, meta = load_table_scorer(path)      # a scorer with query / doc tables
    encoder = resolve_encoder(config.encoder, meta)    # the encoder it was trained with

`config.json` holds what rebuilds the scorer and checks its weights: the format and project
version, the scorer's registry name and fields (`dim` and its options), the embedding it compares
(the resolved encoder settings: model, pooling, normalisation, max_length, prompts, or the
precomputed folder), every parameter's name, shape and dtype, and the SHA-256 of the params
(`files.tree_sha256`). `model.safetensors` holds the params, one tensor per leaf, named by its
path in the Flax tree joined with "." (`component_mlp.Dense_0.kernel`). Nothing is unpickled;
a file that does not match (names, shapes, dtypes, hash) is an `InputError` naming it.
Training checkpoints (resume) stay with orbax (`train.checkpoints`).
"""
from __future__ import annotations

import os
from typing import Any

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from safetensors.numpy import load_file
from safetensors.numpy import save_file

import bilinear_ir
from bilinear_ir import files
from bilinear_ir import scorers
from bilinear_ir.config import blocks
from bilinear_ir.errors import input_error
from bilinear_ir.errors import require
from bilinear_ir.scorers.base import TableScorer

FORMAT = "bilinear_ir.model"
FORMAT_VERSION = 1
CONFIG = "config.json"
WEIGHTS = "model.safetensors"


def flatten(params: Any) -> dict[str, np.ndarray]:
  """{"a.b.c": array} of a params pytree (names mirror the Flax tree)."""
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    out[".".join(str(k.key) for k in path)] = np.asarray(leaf)
  return out


def unflatten(flat: dict[str, np.ndarray], template: Any) -> Any:
  """The pytree shaped like `template` whose leaves are `flat`'s arrays (names as `flatten`)."""
  leaves = []
  for path, _ in jax.tree_util.tree_flatten_with_path(template)[0]:
    leaves.append(flat[".".join(str(k.key) for k in path)])
  return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(template), leaves)


def scorer_fields(module: nn.Module) -> dict[str, Any]:
  """The registry name's options of `module` with their values (JSON-able)."""
  return {name: files.to_jsonable(getattr(module, name))
          for name in scorers.options(module.registry_name)}


def save_model(path: str, module: nn.Module, params: Any, embedding: dict[str, Any],
               extra: dict[str, Any] | None = None) -> None:
  """Writes the folder `path` (atomically: a temporary folder renamed into place).

  Args:
    path: the model folder (replaced if it exists).
    module: a scorer built by the registry (`scorers.build` / `scorers.from_config`).
    params: its params.
    embedding: the embedding it compares: the resolved encoder settings (`Embeddings.manifest
      ["settings"]`) or, for precomputed embeddings, {"kind": "precomputed", "path", ...}.
    extra: more JSON-able fields for config.json (e.g. the collection it was trained on).
  """
  flat = flatten(params)
  config = {
      "format": FORMAT, "format_version": FORMAT_VERSION, "version": bilinear_ir.__version__,
      "scorer": module.registry_name, "dim": int(module.dim), "options": scorer_fields(module),
      "embedding": files.to_jsonable(embedding),
      "params": {name: {"shape": list(a.shape), "dtype": a.dtype.name}
                 for name, a in sorted(flat.items())},
      "params_sha256": files.tree_sha256(params), **(extra or {}),
  }
  with files.atomic_dir(path) as tmp:
    save_file({k: np.ascontiguousarray(v) for k, v in flat.items()},
              os.path.join(tmp, WEIGHTS), metadata={"format": FORMAT})
    files.atomic_write_json(os.path.join(tmp, CONFIG), config)


def save_many(path: str, models: dict[str, tuple[nn.Module, Any, dict[str, Any],
                                                 dict[str, Any]]]) -> None:
  """Writes every model into `path/<name>` (`save_model`); the folder `path` appears whole.

  Args:
    path: the folder of models (replaced if it exists).
    models: {relative folder name: (module, params, embedding, extra)}.
  """
  with files.atomic_dir(path) as tmp:
    for name, (module, params, embedding, extra) in models.items():
      save_model(os.path.join(tmp, name), module, params, embedding, extra)


def load_model(path: str) -> tuple[nn.Module, Any, dict[str, Any]]:
  """(module, params, config) of a folder written by `save_model`.

  The params are checked against a fresh `init_params` of the scorer (names, shapes, dtypes)
  and against the recorded SHA-256, then placed on this process's devices (so every process of
  a multi-host job holds its own copy).

  Raises:
    InputError: not a model folder, an unknown scorer or option, or weights that do not match,
      naming the file and the field.
  """
  if not os.path.isdir(path):
    raise input_error("no such model folder (train_eval writes one to WORKDIR/model)",
                      file=path, field="model_dir")
  cfg_path, weights_path = os.path.join(path, CONFIG), os.path.join(path, WEIGHTS)
  config = files.read_json(cfg_path)
  require(isinstance(config, dict) and config.get("format") == FORMAT,
          f"not a {FORMAT} config (train_eval writes one to WORKDIR/model)", file=cfg_path,
          field="format")
  require(config.get("format_version") == FORMAT_VERSION,
          f"format_version {config.get('format_version')!r}; this version reads "
          f"{FORMAT_VERSION}", file=cfg_path, field="format_version")
  for key, kind in (("scorer", str), ("dim", int), ("options", dict), ("embedding", dict),
                    ("params_sha256", str)):
    require(isinstance(config.get(key), kind), f"missing or not a {kind.__name__}",
            file=cfg_path, field=key)
  try:
    module = scorers.build(config["scorer"], dim=config["dim"],
                           **{k: tuple(v) if isinstance(v, list) else v
                              for k, v in config["options"].items()})
    template = scorers.init_params(module, jax.random.key(0))
  except (TypeError, ValueError) as e:
    raise input_error(f"the scorer does not build ({e})", file=cfg_path, field="options") from e
  want = flatten(template)
  if not want:
    params = template
  else:
    if not os.path.isfile(weights_path):
      raise input_error("missing", file=weights_path)
    try:
      flat = load_file(weights_path)
    except Exception as e:  # pylint: disable=broad-except  (SafetensorError is a bare Exception)
      raise input_error(f"not a readable safetensors file ({e})", file=weights_path) from e
    for name in sorted(set(want) | set(flat)):
      if name not in flat:
        raise input_error(f"missing parameter {name!r}", file=weights_path)
      if name not in want:
        raise input_error(f"unexpected parameter {name!r} for {config['scorer']!r}",
                          file=weights_path)
      if flat[name].shape != want[name].shape or flat[name].dtype != want[name].dtype:
        raise input_error(f"parameter {name!r} is {flat[name].dtype}{list(flat[name].shape)}, "
                          f"the scorer needs {want[name].dtype}{list(want[name].shape)}",
                          file=weights_path)
    params = unflatten(flat, template)
  if files.tree_sha256(params) != config["params_sha256"]:
    raise input_error("the weights' SHA-256 differs from config.json's params_sha256",
                      file=weights_path)
  return module, jax.device_put(params), config


def resolve_encoder(encoder_cfg: ml_collections.ConfigDict, meta: dict[str, Any] | None,
                    where: str = "config.json") -> ml_collections.ConfigDict:
  """The encoder block to embed with: the model's embedding, checked against the config.

  Args:
    encoder_cfg: `config.encoder`; a field of blocks.ENCODER_FIELDS that is None takes the model's
      value (the `encoder_config()` default without a model); a set value must equal it.
    meta: the saved model's config (`load_model`: its "embedding" holds the settings it was
      trained on), or None for the untrained dot product.
    where: the model's config file, for messages.

  Returns:
    A complete encoder block (its other fields, e.g. batch_size and cache_dir, from
    `encoder_cfg`).
  """
  out = blocks.encoder_config()
  trained = None
  if meta is not None:
    trained = meta.get("embedding")
    if not isinstance(trained, dict) or trained.get("kind") not in ("flax", "precomputed"):
      raise input_error("missing, or without a kind (flax | precomputed)", file=where,
                        field="embedding")
    trained = {f: trained.get(f, out[f]) for f in blocks.ENCODER_FIELDS}
  for field in blocks.ENCODER_FIELDS:
    value = encoder_cfg.get(field)
    if trained is not None:
      if value is not None and value != trained[field]:
        raise input_error(f"{value!r} differs from {trained[field]!r}, the encoder the model "
                          f"was trained with ({where}); leave it unset", file="config",
                          field=f"encoder.{field}")
      value = trained[field]
    if value is not None:
      out[field] = value
  out.update({f: v for f, v in encoder_cfg.items() if f not in blocks.ENCODER_FIELDS})
  return out


def load_table_scorer(model_dir: str):
  """(module, params, meta) of a table scorer saved by `save_model` (the retrieve job's)."""
  module, params, meta = load_model(model_dir)
  if not isinstance(module, TableScorer):
    raise input_error(f"scorer {meta['scorer']!r} has no query/doc tables; the retrieve job "
                      "serves table scorers (dot, wdp, bilinear, lowrank)",
                      file=os.path.join(model_dir, CONFIG), field="scorer")
  return module, params, meta
