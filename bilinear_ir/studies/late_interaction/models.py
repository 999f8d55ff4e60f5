"""A late-interaction row's scorer and training: `config.models[name]` and
`config.train_overrides[name]` over `config.train`; a model with a "finetune" entry is a
fine-tuned row (`is_finetuned`): its scorer ("dot" too) is trained jointly with the encoder by
`config.finetune` with the entry's changes (`row_finetune`)."""
from __future__ import annotations

import copy
from typing import Any

import ml_collections

from bilinear_ir import scorers
from bilinear_ir.errors import require

TOKEN_SCORERS = ("colbert", "mebert", "lite", "lite_flat", "knrm")
FINETUNE_KEY = "finetune"  # a model's changes to `config.finetune`: a fine-tuned row
DE_FT = "de_ft"  # the two-tower fine-tune (paper 002's DE), whose gain the rows recover


def _model_kwargs(config, name: str) -> dict[str, Any]:
  """Registry name and options of row `name` (`config.models[name]`; "dot" only for a
  fine-tuned row, which compares pooled vectors)."""
  opts = dict(config.models[name].to_dict())
  scorer = opts.pop("scorer")
  allowed = TOKEN_SCORERS + (("dot",) if opts.pop(FINETUNE_KEY, None) is not None else ())
  require(scorer in allowed, f"must be one of {allowed}, got {scorer!r}",
          field=f"models.{name}.scorer")
  if scorer != "dot":
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

def is_finetuned(config, name: str) -> bool:
  """Whether row `name` is a model fine-tuned with the encoder (its entry has "finetune")."""
  return name in config.models and FINETUNE_KEY in config.models[name]

def row_finetune(config, name: str) -> ml_collections.ConfigDict:
  """`config.finetune` with the changes of `config.models[name].finetune`, its head "dot" for a
  dot scorer, else `name` (the row's own scorer, `row_model`)."""
  c = copy.deepcopy(config.finetune)
  for key, value in config.models[name][FINETUNE_KEY].items():
    require(key in c, f"unknown field {key!r} of the finetune block",
            field=f"models.{name}.{FINETUNE_KEY}")
    c[key] = value
  c.head = "dot" if config.models[name].scorer == "dot" else name
  return c
