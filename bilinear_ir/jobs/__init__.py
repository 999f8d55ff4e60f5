"""The jobs: one module per `config.job`, each with `validate(config)` and
`run(config, workdir) -> bilinear_ir.report.outputs.Report`, looked up by name in one table
(`JOBS`, keyed by the module's name, as `scorers.registry.SCORERS` is keyed by each class's
`registry_name`).

A job says *what* runs (collections x embeddings x models x seeds): validate, then the recipe;
*how* is the protocol's (`bilinear_ir.studies` for one study's own, `bilinear_ir.experiment`:
training with dev selection, rows, comparisons, evaluation, config checks) and the libraries'
below it; what a reader sees (markdown, findings, figures) is `bilinear_ir.report`'s. A job never
imports another job.
"""
from __future__ import annotations

from types import ModuleType

from bilinear_ir.errors import input_error
from bilinear_ir.jobs import collection_stats
from bilinear_ir.jobs import embed
from bilinear_ir.jobs import export
from bilinear_ir.jobs import fidelity_bm25
from bilinear_ir.jobs import finetune
from bilinear_ir.jobs import late_interaction
from bilinear_ir.jobs import learning_curve
from bilinear_ir.jobs import lowrank_analysis
from bilinear_ir.jobs import mol
from bilinear_ir.jobs import reproduce_table
from bilinear_ir.jobs import retrieve
from bilinear_ir.jobs import study
from bilinear_ir.jobs import synthetic_agreement
from bilinear_ir.jobs import train_eval

JOBS: dict[str, ModuleType] = {module.__name__.rsplit(".", 1)[-1]: module for module in (
    train_eval, reproduce_table, lowrank_analysis, mol, late_interaction, retrieve, fidelity_bm25,
    synthetic_agreement, collection_stats, embed, study, export, learning_curve, finetune)}


def get(name: str) -> ModuleType:
  """The module of job `name` (`bilinear_ir.jobs.<name>`); an unknown name is an `InputError`."""
  if name not in JOBS:
    raise input_error(f"unknown job {name!r}; known: {', '.join(sorted(JOBS))}", file="config",
                      field="job")
  return JOBS[name]
