"""Config arguments: the `k=v,...` after `:` in `--config=configs/x.py:scorer=lowrank,rank=32`.

Imports nothing of the project but `errors` (no jax), as every module that `configs/*.py` imports.
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
  except ValueError:
    raise input_error(f"expected {type(default).__name__}, got {text!r}", file="config",
                      field=key) from None
  if isinstance(default, tuple):
    parts = [p for p in text.split("+") if p]
    inner = default[0] if default else ""
    return tuple(_coerce(key, p, inner) for p in parts)
  return text


def parse_args(arg: str | None, defaults: dict[str, Any]) -> dict[str, Any]:
  """Parses a config's `k=v,k2=v2` argument over `defaults`.

  Values are coerced to the type of their default; tuples are written with `+` (`ranks=2+4+8`).
  A bare word without `=` and an unknown key are `InputError`s (exit code 2).

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


def optional_bool(text: str, key: str, default: bool) -> bool:
  """A config argument that may be left empty: "" gives `default`, else a boolean word."""
  return default if text == "" else _coerce(key, text, False)


def optional_ints(text: str, key: str) -> tuple[int, ...]:
  """A list of integers that may be left empty: "" gives (), "300+1000" gives (300, 1000); a part
  that is not an integer is an `InputError` naming `key`."""
  return _coerce(key, text, (0,)) if text else ()


def choices(values: tuple[str, ...], key: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
  """`values` without "none" (the word for an empty list), each one of `allowed`; another is an
  `InputError` naming `key`."""
  for v in values:
    if v != "none" and v not in allowed:
      raise input_error(f"unknown entry {v!r}; known: {', '.join(allowed)} (or none)",
                        file="config", field=key)
  return tuple(v for v in values if v != "none")
