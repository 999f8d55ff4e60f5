"""The config blocks the late-interaction setting reads besides the shared ones
(`experiment.validation`): candidates, latency, distillation, the teacher and the table row."""
from __future__ import annotations

import ml_collections

from bilinear_ir.errors import require
from bilinear_ir.experiment import validation
from bilinear_ir.train import trainer

TEACHERS = ("bm25", "bilinear", "best")  # distill.teacher


def check_blocks(config: ml_collections.ConfigDict) -> None:
  """The blocks this setting reads besides the shared ones (`experiment.validation`): `rerank`
  (candidates), `latency` (timed calls), `distill` and, when it distils from a trained table
  scorer, `teacher`. Raises `InputError` naming the field."""
  validation.integer(config.rerank.bm25_depth, "rerank.bm25_depth", 1)
  validation.integer(config.rerank.random_docs, "rerank.random_docs", 0)
  validation.integer(config.latency.docs, "latency.docs", 1)
  validation.integer(config.latency.repeats, "latency.repeats", 1)
  validation.integer(config.latency.rounds, "latency.rounds", 1)
  validation.one_of(config.distill.teacher, TEACHERS, "distill.teacher")
  for loss in config.distill.losses:
    validation.one_of(loss, trainer.DISTILLATION_LOSSES, "distill.losses")
  validation.real(config.distill.teacher_temperature, "distill.teacher_temperature", 0.0,
                  low_open=True)
  for name in config.distill.scorers:
    require(name in config.models, f"unknown model {name!r}", field="distill.scorers")
  if config.distill.scorers and config.distill.teacher in ("bilinear", "best"):
    validation.check_model(config.teacher.model, "teacher.model")
    validation.check_train(config.teacher.train, "teacher.train")
  if "table" in config.rows:
    require(len(config.table.models) > 0, "must name at least one table similarity",
            field="table.models")
    for label, model in config.table.models.items():
      validation.check_model(model, f"table.models.{label}")
    validation.check_train(config.table.train, "table.train")
