"""Scorer registry: pick a similarity by name (as scenic's `model_lib` does).

`build(name, dim=n, **kwargs)` returns an (unbound) Flax module, `from_config(config.model, n)`
the one a `model` config block names; `init_params(module, key)` returns its initial parameters.
Unknown names and unknown keyword arguments are `InputError`s, so a misspelt config value exits
with code 2.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax.linen as nn
import jax

from bilinear_ir.errors import input_error

_REGISTRY: dict[str, type[nn.Module]] = {}


def register(name: str) -> Callable[[type[nn.Module]], type[nn.Module]]:
  """Class decorator adding a scorer under `name`."""

  def wrap(cls: type[nn.Module]) -> type[nn.Module]:
    if name in _REGISTRY:
      raise ValueError(f"scorer {name!r} registered twice")
    _REGISTRY[name] = cls
    cls.registry_name = name
    return cls

  return wrap


def names() -> list[str]:
  """Registered scorer names, sorted."""
  return sorted(_REGISTRY)


def options(name: str) -> list[str]:
  """The options scorer `name` takes besides `dim`, sorted (an unknown name: `InputError`)."""
  if name not in _REGISTRY:
    raise input_error(f"unknown scorer {name!r}; known: {', '.join(names())}", file="config",
                      field="model.scorer")
  return sorted({f.name for f in dataclasses.fields(_REGISTRY[name])} - {"parent", "name", "dim"})


def from_config(model_cfg: Any, dim: int) -> nn.Module:
  """The scorer of a `model` config block (`defaults.model_config()`) for width `dim`.

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
  return _REGISTRY[name](dim=dim, **kwargs)


def init_params(module: nn.Module, key: jax.Array) -> Any:
  """Initial parameters of `module` (a pytree; `{}` for parameter-free scorers).

  Args:
    module: a module from `build`.
    key: a `jax.random` key (from `config.seed`).
  """
  variables = module.init(key, *module.example_inputs(), method=module.score_pairs)
  return variables.get("params", {})
