"""A late-interaction row's scorer and training: `config.models[name]` and
`config.train_overrides[name]` over `config.train`."""
from __future__ import annotations

import copy
from typing import Any

import ml_collections

from bilinear_ir import scorers
from bilinear_ir.errors import require

TOKEN_SCORERS = ("colbert", "mebert", "lite", "lite_flat", "knrm")


def _model_kwargs(config, name: str) -> dict[str, Any]:
  """Registry name and options of row `name` (`config.models[name]`)."""
  opts = dict(config.models[name].to_dict())
  scorer = opts.pop("scorer")
  require(scorer in TOKEN_SCORERS, f"must be one of {TOKEN_SCORERS}, got {scorer!r}",
          field=f"models.{name}.scorer")
  opts.update(query_len=int(config.encoder.query_max_length), doc_len=doc_len(config))
  return {"name": scorer, **opts}

def doc_len(config) -> int:
  """Td: `encoder.doc_max_length`, else `encoder.max_length` (validate requires one)."""
  return int(config.encoder.doc_max_length or config.encoder.max_length or 0)

def row_model(config, name: str, dim: int):
  """(module, registry name) of row `name`."""
  kw = _model_kwargs(config, name)
  scorer = kw.pop("name")
  return scorers.build(scorer, dim=dim, **kw), scorer

def row_train(config, name: str) -> ml_collections.ConfigDict:
  """`config.train` with the row's overrides (`config.train_overrides[name]`)."""
  c = copy.deepcopy(config.train)
  for key, value in config.train_overrides.get(name, {}).items():
    c[key] = value
  return c
