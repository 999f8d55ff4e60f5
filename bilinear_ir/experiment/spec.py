"""What one row of a table is: the config narrowed at the job boundary into typed specs.

A job's config holds every block; a row reads only five of them. `Recipe` is the table's recipe
for one embedding (its encoder and its `train_overrides` applied, one copy of each of those two
blocks); `Recipe.row(spec, seed)` is one row of it: a frozen `Row` holding its own model and
train blocks (one copy each) and the recipe's eval and encoder blocks. `embeddings_of` walks the
embeddings of a table, loading the collection and BM25 once.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any, Iterator, Mapping, Sequence

import ml_collections

from bilinear_ir.config import embedding_specs
from bilinear_ir.data import loaders
from bilinear_ir.data import pipeline

# Keys of a row spec that are not model options: the row's name and its training source.
_NOT_MODEL = ("name", "source")


@dataclasses.dataclass(frozen=True)
class Row:
  """One trained (or untrained) row: everything `experiment.training.train_and_evaluate` reads.

  Attributes:
    model: the `model` block (scorer and its options; `config.blocks.model_config`).
    train: the `train` block (`config.blocks.train_config`), with the row's overrides.
    eval: the `eval` block (mode, depth, measures).
    encoder: the `encoder` block (read for pairs the corpus makes itself, `train.source`).
    seed: the row's seed (init, batches).
  """
  model: ml_collections.ConfigDict
  train: ml_collections.ConfigDict
  eval: ml_collections.ConfigDict
  encoder: ml_collections.ConfigDict
  seed: int

  @classmethod
  def of(cls, config: ml_collections.ConfigDict) -> Row:
    """The row a train_eval-style config describes (its blocks, not copied)."""
    return cls(config.model, config.train, config.eval, config.encoder, config.seed)


@dataclasses.dataclass(frozen=True)
class Recipe:
  """A table's recipe for one embedding.

  Attributes:
    name: the embedding's name (`embedding_specs.embedding_spec`), "" for the config's own encoder.
    model, train, eval, encoder, data: the blocks rows start from (train with the embedding's
      `train_overrides`, encoder with its `embedding_spec`).
    seed: the config seed (splits, the untrained baseline).
  """
  name: str
  model: ml_collections.ConfigDict
  train: ml_collections.ConfigDict
  eval: ml_collections.ConfigDict
  encoder: ml_collections.ConfigDict
  data: ml_collections.ConfigDict
  seed: int

  @classmethod
  def of(cls, config: ml_collections.ConfigDict, name: str,
         data: ml_collections.ConfigDict | None = None) -> Recipe:
    """The recipe of embedding `name`: the encoder of `embedding_specs.embedding_spec(name)` and the
    `config.train_overrides[name]` ("": the config's own encoder and train blocks), on `data`
    (default `config.data`)."""
    encoder = _changed(config.encoder, embedding_specs.embedding_spec(name) if name else {})
    train = _changed(config.train, config.train_overrides.get(name, {}) if name else {})
    return cls(name, config.model, train, config.eval, encoder,
               config.data if data is None else data, config.seed)

  def row(self, spec: Mapping[str, Any], seed: int,
          train: Mapping[str, Any] | None = None) -> Row:
    """Row `spec` at `seed`: the spec's model options (e.g. {"scorer": "lowrank", "rank": 32,
    "residual": "identity"}; None values and "name" left out), its `source` as `train.source`,
    and the `train` changes."""
    model = model_block(self.model, spec)
    changes = dict(train or {})
    if "source" in spec:
      changes["source"] = spec["source"]
    return Row(model, _changed(self.train, changes), self.eval, self.encoder, seed)


def model_block(model: ml_collections.ConfigDict, spec: Mapping[str, Any]
                ) -> ml_collections.ConfigDict:
  """A copy of the `model` block with the model options of row `spec` (see `Recipe.row`)."""
  return _changed(model, {k: v for k, v in spec.items() if k not in _NOT_MODEL and v is not None})


def _changed(block: ml_collections.ConfigDict, changes: Mapping[str, Any]
             ) -> ml_collections.ConfigDict:
  """A copy of a config block with `changes` set."""
  c = copy.deepcopy(block)
  with c.unlocked():
    for key, value in changes.items():
      c[key] = value
  return c


def collection_block(data: ml_collections.ConfigDict, entry: str) -> ml_collections.ConfigDict:
  """A copy of the `data` block reading collection `entry`: an embedded name (scifact, cacm,
  med, lisa), an installed one (insuranceqa: from `data.path` when it names a folder of the
  package's files, e.g. the copy `launch/pack_device_inputs.py` makes, else from the installed
  package) or a BEIR folder or zip."""
  if entry in loaders.EMBEDDED:
    fmt, path = loaders.embedded(entry)
    return _changed(data, {"format": fmt, "path": "" if entry == "scifact" else path})
  if entry in loaders.INSTALLED:  # read from its installed package
    return _changed(data, {"format": entry, "path": data.get("path", "")})
  return _changed(data, {"format": "beir", "path": entry})


def splitsets(prepared: pipeline.Prepared, data: ml_collections.ConfigDict, seed: int,
              folds: int = 0) -> list[pipeline.SplitSet]:
  """The collection's train / dev / test split sets (`pipeline.splits`); with `folds`, a
  collection without `data.train_split` (test-only) is cross-validated in that many folds."""
  if folds and data.train_split not in prepared.collection.qrels:
    data = _changed(data, {"folds": folds})
  return pipeline.splits(prepared.collection, data, seed)


def embeddings_of(config: ml_collections.ConfigDict,
                  data: ml_collections.ConfigDict | None = None, folds: int = 0
                  ) -> Iterator[tuple[Recipe, pipeline.Prepared, list[pipeline.SplitSet]]]:
  """(recipe, its `pipeline.Prepared`, split sets) for each of `config.embeddings`, lazily.

  The collection and BM25 do not depend on the encoder: they are loaded once
  (`pipeline.prepare`) and only the embeddings are redone (`pipeline.reembed`).
  """
  prepared = None
  for name in config.embeddings:
    recipe = Recipe.of(config, name, data)
    if prepared is None:
      prepared = pipeline.prepare(ml_collections.ConfigDict(
          {"data": recipe.data, "encoder": recipe.encoder, "bm25": config.bm25}))
    else:
      prepared = pipeline.reembed(prepared, recipe.encoder)
    yield recipe, prepared, splitsets(prepared, recipe.data, config.seed, folds)
