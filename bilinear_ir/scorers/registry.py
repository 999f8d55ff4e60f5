"""Scorer registry: pick a similarity by name from one table (as scenic's `model_lib` does).

`SCORERS` maps each family class's `registry_name` to the class. `build(name, dim=n, **kwargs)`
returns an (unbound) Flax module, `from_config(config.model, n)` the one a `model` config block
names; `init_params(module, key)` returns its initial parameters. Unknown names and unknown
keyword arguments are `InputError`s, so a misspelt config value exits with code 2. (Jobs are
looked up the same way: `jobs.JOBS`.)
"""
from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax

from bilinear_ir.errors import input_error
from bilinear_ir.scorers import adapter
from bilinear_ir.scorers import bilinear
from bilinear_ir.scorers import dot
from bilinear_ir.scorers import mol
from bilinear_ir.scorers import multivector
from bilinear_ir.scorers import token_interaction

SCORERS: dict[str, type[nn.Module]] = {cls.registry_name: cls for cls in (
    dot.Dot, dot.WeightedDot, bilinear.Bilinear, bilinear.LowRank, adapter.QueryAdapter, mol.Mol,
    multivector.MEBERT, token_interaction.ColBERT, token_interaction.SeparableLITE,
    token_interaction.FlattenedLITE, token_interaction.KNRM)}


def names() -> list[str]:
  """Registered scorer names, sorted."""
  return sorted(SCORERS)


def options(name: str) -> list[str]:
  """The options scorer `name` takes besides `dim`, sorted (an unknown name: `InputError`)."""
  if name not in SCORERS:
    raise input_error(f"unknown scorer {name!r}; known: {', '.join(names())}", file="config",
                      field="model.scorer")
  return sorted({f.name for f in dataclasses.fields(SCORERS[name])} - {"parent", "name", "dim"})


def from_config(model_cfg: Any, dim: int) -> nn.Module:
  """The scorer of a `model` config block (`config.blocks.model_config()`) for width `dim`.

  Only the fields of the block that the scorer has are passed to it (the block carries every
  family's options, e.g. `rank` is ignored by `bilinear`).
  """
  name = model_cfg.scorer
  kwargs = {k: v for k, v in model_cfg.items() if k in options(name)}
  return build(name, dim=dim, **kwargs)


def build(name: str, dim: int, **kwargs: Any) -> nn.Module:
  """Builds scorer `name` for embeddings of width `dim`.

  Args:
    name: a registered name (see `names()`).
    dim: embedding width n of the (token) vectors it compares.
    **kwargs: the module's other fields (e.g. `rank=32, residual="identity"`).

  Returns:
    The unbound module; its params come from `init_params`.
  """
  known = options(name)
  unknown = set(kwargs) - set(known)
  if unknown:
    raise input_error(f"scorer {name!r} has no option(s) {sorted(unknown)}; it takes {known}",
                      file="config", field="model")
  return SCORERS[name](dim=dim, **kwargs)


def init_params(module: nn.Module, key: jax.Array) -> Any:
  """Initial parameters of `module` (a pytree; `{}` for parameter-free scorers).

  Args:
    module: a module from `build`.
    key: a `jax.random` key (from `config.seed`).
  """
  variables = module.init(key, *module.example_inputs(), method=module.score_pairs)
  return variables.get("params", {})
