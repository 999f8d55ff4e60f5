"""Parsing of config-file arguments: `configs/x.py:scorer=lowrank,rank=32,pooling=cls`.

Every config's `get_config(arg)` calls `parse(arg, defaults)`; values are coerced to the type of
their default, unknown keys are `InputError`s (exit code 2).
"""
from __future__ import annotations

from typing import Any

from bilinear_ir.errors import input_error


def _coerce(key: str, text: str, default: Any) -> Any:
  if isinstance(default, bool):
    if text.lower() in ("1", "true", "yes"):
      return True
    if text.lower() in ("0", "false", "no"):
      return False
    raise input_error(f"expected a boolean, got {text!r}", file="config", field=key)
  try:
    if isinstance(default, int):
      return int(text)
    if isinstance(default, float):
      return float(text)
  except ValueError as e:
    raise input_error(f"expected {type(default).__name__}, got {text!r}", file="config",
                      field=key) from e
  if isinstance(default, tuple):
    parts = [p for p in text.split("+") if p]
    inner = default[0] if default else ""
    return tuple(_coerce(key, p, inner) for p in parts)
  return text


def parse(arg: str | None, defaults: dict[str, Any]) -> dict[str, Any]:
  """Parses `k=v,k2=v2` over `defaults`.

  Tuples are written with `+`: `ranks=2+4+8`. A bare word without `=` is refused.

  Args:
    arg: the text after `:` in `--config=configs/x.py:ARG` (None or "" for no overrides).
    defaults: every accepted key with its default value (which fixes its type).

  Returns:
    A new dict with the overrides applied.
  """
  out = dict(defaults)
  if not arg:
    return out
  for item in arg.split(","):
    if not item:
      continue
    if "=" not in item:
      raise input_error(f"config argument {item!r} is not key=value", file="config")
    key, value = item.split("=", 1)
    key = key.strip()
    if key not in defaults:
      raise input_error(f"unknown config argument; known: {', '.join(sorted(defaults))}",
                        file="config", field=key)
    out[key] = _coerce(key, value.strip(), defaults[key])
  return out


def sibling_config(config_file: str, name: str, arg: str | None = None):
  """`get_config(arg)` of `configs/<name>.py` next to `config_file` (a config's `__file__`).

  For configs that share another's recipe, e.g. the MoL and low-rank analysis jobs reuse
  configs/reproduce_table.py's training blocks.
  """
  import importlib.util  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  path = os.path.join(os.path.dirname(os.path.abspath(config_file)), f"{name}.py")
  spec = importlib.util.spec_from_file_location(f"bilinear_ir_config_{name}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)
