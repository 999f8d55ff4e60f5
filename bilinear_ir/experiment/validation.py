"""Checks of the config blocks, run by every job's `validate(config)` before any work.

A bad value is an `InputError` naming the field (`config: field 'train.batch_size': must be an
integer >= 1, got 0`), which `main` turns into exit code 2 and one line on stderr with nothing
written. Each `check_<block>(c, prefix)` checks one block of `config.blocks`; `prefix` is
where the block sits in the config (`"train"`, `"teacher.train"`).
"""
from __future__ import annotations

import importlib.util
import math
import numbers
import os
from typing import Any, Sequence

import jax

from bilinear_ir import scorers
from bilinear_ir.config import embedding_specs
from bilinear_ir.config import tables
from bilinear_ir.data import bm25
from bilinear_ir.data import embeddings
from bilinear_ir.data import ict
from bilinear_ir.data import loaders
from bilinear_ir.data import pipeline
from bilinear_ir.data import readers
from bilinear_ir.errors import InputError
from bilinear_ir.errors import input_error
from bilinear_ir.errors import missing_extra
from bilinear_ir.errors import require
from bilinear_ir.eval import metrics
from bilinear_ir.experiment import evaluate
from bilinear_ir.experiment import spec as spec_lib
from bilinear_ir.experiment import table as table_lib
from bilinear_ir.retrieval import hybrid
from bilinear_ir.scorers.base import TableScorer
from bilinear_ir.train import trainer


def _is_int(x: Any) -> bool:
  return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def integer(value: Any, field: str, low: int | None = None, high: int | None = None) -> None:
  """`value` is an int in [low, high] (either bound may be None)."""
  bounds = (f" >= {low}" if high is None else f" in [{low}, {high}]") if low is not None else (
      f" <= {high}" if high is not None else "")
  ok = _is_int(value) and (low is None or value >= low) and (high is None or value <= high)
  require(ok, f"must be an integer{bounds}, got {value!r}", field=field)


def real(value: Any, field: str, low: float | None = None, high: float | None = None,
         low_open: bool = False) -> None:
  """`value` is a finite number in [low, high] ((low, high] with `low_open`)."""
  ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
  if ok and low is not None:
    ok = value > low if low_open else value >= low
  if ok and high is not None:
    ok = value <= high
  lo = "" if low is None else (f" > {low}" if low_open else f" >= {low}")
  hi = "" if high is None else f" <= {high}"
  require(ok, f"must be a finite number{lo}{' and' if lo and hi else ''}{hi}, got {value!r}",
          field=field)


def one_of(value: Any, choices: Sequence[Any], field: str) -> None:
  """`value` is one of `choices`."""
  require(value in tuple(choices), f"must be one of {', '.join(map(str, choices))}; got "
          f"{value!r}", field=field)


def integers(values: Any, field: str, low: int | None = None, nonempty: bool = True) -> None:
  """`values` is a tuple of ints >= low (non-empty unless `nonempty` is False)."""
  require(isinstance(values, (tuple, list)), f"must be a list of integers, got {values!r}",
          field=field)
  require(len(values) > 0 or not nonempty, "must not be empty", field=field)
  for v in values:
    integer(v, field, low)


def measure(name: Any, field: str) -> None:
  """`name` is a measure of `eval.metrics` (e.g. "ndcg@10")."""
  try:
    metrics.parse_measure(name)
  except Exception as e:  # pylint: disable=broad-except
    raise input_error(f"unknown measure {name!r}; known forms: {metrics.MEASURE_FORMS}",
                      file="config", field=field) from e


def seeds(values: Any, field: str = "seeds") -> None:
  """A non-empty list of seeds >= 0."""
  integers(values, field, low=0)


def embedding_names(names: Any, field: str = "embeddings") -> None:
  """Embedding names (`embedding_specs.embedding_spec`: "mean", "cls", "mpnet-mean", ...,
  "precomputed:DIR" with an existing DIR)."""
  require(isinstance(names, (tuple, list)) and len(names) > 0,
          f"must be a non-empty list, got {names!r}", field=field)
  for name in names:
    spec = embedding_specs.embedding_spec(name)
    if spec["kind"] == "precomputed":
      require(os.path.isdir(spec["path"]), f"no such folder of precomputed embeddings: "
              f"{spec['path']!r}", field=field)


def check_collection(entry: Any, field: str = "collection", path: str = "") -> None:
  """A collection entry (`experiment.spec.collection_block`): an embedded name, an installed
  one (its package present, else the pip line; not needed when `path`, the job's `data.path`,
  names a copy of its files, such as `launch/pack_device_inputs.py` writes: `check_data` checks
  that path) or an existing BEIR folder or zip."""
  require(isinstance(entry, str) and entry, f"must name a collection, got {entry!r}",
          field=field)
  if entry in loaders.INSTALLED:
    if not path:
      loaders.DEFAULT_PATHS[entry]()  # its package missing: refused before any work
  elif entry not in loaders.EMBEDDED:
    require(os.path.exists(entry), f"{entry!r} is neither an embedded collection "
            f"({', '.join(loaders.EMBEDDED)}), an installed one "
            f"({', '.join(loaders.INSTALLED)}) nor a BEIR folder or zip", field=field)


def check_data(c, prefix: str = "data") -> None:
  """The `data` block: format, an existing path, splits, dev fraction, folds."""
  one_of(c.format, loaders.FORMATS, f"{prefix}.format")
  require(isinstance(c.path, str), "must be a string", field=f"{prefix}.path")
  if c.path:
    require(os.path.exists(c.path), f"no such file or folder: {c.path!r}", field=f"{prefix}.path")
  elif c.format not in loaders.DEFAULT_PATHS:
    raise input_error(f"format {c.format!r} needs a path (only "
                      f"{', '.join(loaders.DEFAULT_PATHS)} read a copy of their own)",
                      file="config", field=f"{prefix}.path")
  else:
    loaders.DEFAULT_PATHS[c.format]()  # an installed data package missing: refused now
  for key in ("train_split", "split"):
    require(isinstance(c[key], str) and c[key] != "", "must be a split name",
            field=f"{prefix}.{key}")
  require(isinstance(c.get("dev_split", "auto"), str), "must be a split name, \"auto\" or \"\"",
          field=f"{prefix}.dev_split")
  real(c.dev_fraction, f"{prefix}.dev_fraction", 0.0, 0.9)
  integer(c.folds, f"{prefix}.folds", 0)
  require(c.folds != 1, "must be 0 (no folds) or >= 2", field=f"{prefix}.folds")
  integer(c.get("max_record_mib", readers.MAX_RECORD_MIB), f"{prefix}.max_record_mib", 1)


def check_bm25(c, prefix: str = "bm25") -> None:
  """The `bm25` block."""
  real(c.k1, f"{prefix}.k1", 0.0)
  real(c.b, f"{prefix}.b", 0.0, 1.0)
  one_of(c.variant, bm25.BM25_VARIANTS, f"{prefix}.variant")
  integer(c.depth, f"{prefix}.depth", 1)


def check_model(c, prefix: str = "model") -> None:
  """The `model` block: builds and initialises the scorer at a small width, so an unknown scorer
  or option, or a bad rank, is refused before data is loaded."""
  try:
    scorers.init_params(scorers.from_config(c, 8), jax.random.key(0))
  except InputError:
    raise
  except (TypeError, ValueError) as e:
    raise input_error(f"the scorer cannot be built: {e}", file="config", field=prefix) from e


def check_train(c, prefix: str = "train") -> None:
  """The `train` block (see `config.blocks.train_config` for each field)."""
  f = lambda key: f"{prefix}.{key}"
  one_of(c.get("source", "qrels"), ("qrels", "ict", "both"), f("source"))
  if "ict" in c:
    i = c.ict
    one_of(i.query, ict.QUERY_KINDS, f("ict.query"))
    integer(i.min_words, f("ict.min_words"), 1)
    integer(i.max_words, f("ict.max_words"), i.min_words if _is_int(i.min_words) else 1)
    real(i.remove_prob, f("ict.remove_prob"), 0.0, 1.0)
    integer(i.pairs_per_doc, f("ict.pairs_per_doc"), 1)
    integer(i.dev_docs, f("ict.dev_docs"), 0)
    integer(i.epochs, f("ict.epochs"), 1)
    real(i.ratio, f("ict.ratio"), 0.0)
    integer(i.seed, f("ict.seed"), 0)
    one_of(i.get("guard", "none"), ("bm25", "none"), f("ict.guard"))
    if i.get("guard", "none") == "bm25":
      integer(i.guard_depth, f("ict.guard_depth"), 1)
      require(len(i.guard_grid) > 0 and all(isinstance(x, (int, float)) and 0 <= x <= 1
                                             for x in i.guard_grid),
              f"needs lam values in [0, 1], got {i.guard_grid!r}", field=f("ict.guard_grid"))
  one_of(c.loss, trainer.LOSSES, f("loss"))
  real(c.temperature, f("temperature"), 0.0, low_open=True)
  real(c.teacher_temperature, f("teacher_temperature"), 0.0, low_open=True)
  real(c.margin, f("margin"), 0.0)
  integer(c.batch_size, f("batch_size"), 1)
  integer(c.hard_negatives, f("hard_negatives"), 0)
  integer(c.hard_depth, f("hard_depth"), 1)
  negatives_from = c.get("negatives_from", "bm25")
  one_of(negatives_from, pipeline.NEGATIVE_SOURCES + trainer.MODEL_NEGATIVES, f("negatives_from"))
  if negatives_from == "mined":
    integer(c.refresh_every, f("refresh_every"), 1)
    integer(c.hard_negatives, f("hard_negatives"), 1)
  if negatives_from == "corpus":
    integer(c.corpus_chunk, f("corpus_chunk"), 1)
    require(c.loss == "softmax", f"negatives_from 'corpus' needs loss 'softmax', got {c.loss!r}",
            field=f("loss"))
  integer(c.random_negatives, f("random_negatives"), 0)
  integer(c.steps, f("steps"), 0)
  integer(c.epochs, f("epochs"), 0)
  require(c.steps > 0 or c.epochs > 0, "train.steps and train.epochs are both 0: no training",
          field=f("epochs"))
  real(c.lr, f("lr"), 0.0, low_open=True)
  integer(c.warmup_steps, f("warmup_steps"), 0)
  real(c.end_lr_fraction, f("end_lr_fraction"), 0.0, 1.0)
  real(c.weight_decay, f("weight_decay"), 0.0)
  real(c.l2_to_init, f("l2_to_init"), 0.0)
  real(c.clip_norm, f("clip_norm"), 0.0, low_open=True)
  integer(c.eval_every, f("eval_every"), 1)
  measure(c.select_metric, f("select_metric"))
  integer(c.checkpoint_every, f("checkpoint_every"), 1)
  integer(c.keep_checkpoints, f("keep_checkpoints"), 1)
  integer(c.steps_per_call, f("steps_per_call"), 1)
  if c.get("tensorboard", False) and importlib.util.find_spec("tensorboardX") is None:
    raise missing_extra("tensorboardX", "tb", f"{prefix}.tensorboard")
  one_of(c.get("matmul_precision", "default"), trainer.MATMUL_PRECISIONS, f("matmul_precision"))


def check_source(config) -> None:
  """Pairs the corpus makes itself (`train.source` "ict" / "both") are new texts: they need the
  encoder, not precomputed embeddings."""
  if config.train.get("source", "qrels") != "qrels":
    require(config.encoder.kind == "flax", "train.source 'ict' / 'both' embeds new texts (the "
            "spans), which needs encoder.kind 'flax'", field="train.source")


def check_eval(c, prefix: str = "eval") -> None:
  """The `eval` block: mode, depths, measures."""
  one_of(c.mode, evaluate.MODES, f"{prefix}.mode")
  integer(c.depth, f"{prefix}.depth", 1)
  integer(c.rerank_depth, f"{prefix}.rerank_depth", 1)
  require(isinstance(c.measures, (tuple, list)) and len(c.measures) > 0,
          "must be a non-empty list of measures", field=f"{prefix}.measures")
  for m in c.measures:
    measure(m, f"{prefix}.measures")


def check_hybrid(c, prefix: str = "hybrid") -> None:
  """The `hybrid` block: depth, normalisation, lam grid in [0, 1], dev measure."""
  integer(c.depth, f"{prefix}.depth", 1)
  one_of(c.normalize, hybrid.NORMALIZATIONS, f"{prefix}.normalize")
  require(isinstance(c.grid, (tuple, list)) and len(c.grid) > 0, "must be a non-empty list",
          field=f"{prefix}.grid")
  for lam in c.grid:
    real(lam, f"{prefix}.grid", 0.0, 1.0)
  measure(c.measure, f"{prefix}.measure")


def check_stats(c, prefix: str = "stats") -> None:
  """The `stats` block: resamples of the paired tests, significance level."""
  integer(c.resamples, f"{prefix}.resamples", 100)
  real(c.alpha, f"{prefix}.alpha", 0.0, 0.5, low_open=True)


def check_table(config, *, hybrid_block: bool = True) -> None:
  """What the table-style jobs share: seeds, embeddings, and the recipe blocks of
  `config.blocks.table_recipe` (data, encoder, bm25, model, train and its per-embedding overrides,
  eval, hybrid)."""
  seeds(config.seeds)
  embedding_names(config.embeddings)
  integer(config.seed, "seed", 0)
  check_data(config.data)
  embeddings.check_encoder(config.encoder)
  check_bm25(config.bm25)
  check_train(config.train)
  check_source(config)
  for name, changes in config.train_overrides.items():
    embedding_specs.embedding_spec(name)  # a known embedding name
    with_overrides = config.train.copy_and_resolve_references()
    for key, value in dict(changes).items():
      require(key in with_overrides, f"train has no field {key!r}",
              field=f"train_overrides.{name}")
      try:
        with_overrides[key] = value
      except TypeError as e:
        raise input_error(str(e), file="config", field=f"train_overrides.{name}.{key}") from e
    check_train(with_overrides, f"train_overrides.{name}")
  check_eval(config.eval)
  if hybrid_block:
    check_hybrid(config.hybrid)
  if "stats" in config:
    check_stats(config.stats)


def check_rows(config, allowed: Sequence[str] | None = None) -> None:
  """A table's `rows` (`config.tables`) and `runner` block: known types, unique names, trained
  rows whose model builds (`check_model`; its scorer one of `allowed` when given) and whose train
  changes are valid, dev_best and hybrid rows naming earlier rows; `allowed`: the trained rows'
  scorers the job takes (None: any)."""
  require(len(config.rows) > 0, "a table needs at least one row", field="rows")
  one_of(config.runner.summary, ("seeds", "queries"), "runner.summary")
  if "fit" in config.runner.get("fields", ()):
    integer(config.runner.get("fit_queries"), "runner.fit_queries", 1)
  names: list[str] = []
  for i, spec in enumerate(config.rows):
    f = lambda key, i=i: f"rows[{i}].{key}"
    one_of(spec.get("type"), tables.TYPES, f("type"))
    require(spec.get("name") and spec["name"] not in names,
            f"needs a name no earlier row has, got {spec.get('name')!r}", field=f("name"))
    if spec["type"] == "trained":
      model = table_lib.model_of(config, spec)
      if allowed is not None:
        one_of(model.get("scorer"), tuple(allowed), f("model.scorer"))
      check_model(spec_lib.model_block(config.model, model), f("model"))
      one_of(spec.get("split", "folds"), ("folds", "ict"), f("split"))
      for point in table_lib.grid_points(config, spec):
        for key in point:
          require(key in config.train, f"train has no field {key!r}", field=f("grid"))
        row = spec_lib.Recipe.of(config, "").row(model, 0,
                                                 {**table_lib.train_of(config, spec), **point})
        check_train(row.train, f("grid") if point else f("train"))
      if row.train.get("negatives_from") in trainer.MODEL_NEGATIVES:
        require(isinstance(scorers.from_config(row.model, 8), TableScorer),
                f"negatives from the model ({row.train.negatives_from!r}) need a scorer with "
                "query / doc tables (dot, wdp, bilinear, lowrank, adapter)",
                field=f("train.negatives_from"))
      if row.train.get("source", "qrels") != "qrels":
        require(config.encoder.kind == "flax", "ICT pairs are new texts: a row trained on them "
                "needs encoder.kind 'flax'", field=f("model.source"))
    elif spec["type"] == "dev_best":
      one_of(spec.get("per"), ("run", "row"), f("per"))
      require(len(spec.get("over", ())) > 0, "must name the rows it selects among", field=f("over"))
      for name in spec["over"]:
        one_of(name, names, f("over"))
    elif spec["type"] == "hybrid":
      one_of(spec.get("partner"), names, f("partner"))
    names.append(spec["name"])
