"""The jobs: one module per `config.job`, each with `validate(config)` and
`run(config, workdir) -> report.Report`.

A job says *what* runs (collections x embeddings x models x seeds) and reports it; *how* is the
experiment protocol's (`bilinear_ir.experiment`: training with dev selection, rows, comparisons,
evaluation, config checks) and the libraries' below it. A job never imports another job. What
the jobs share besides: `report` (what a job returns, how `main` writes it, and `prose`, which
fills the fixed text of `templates/<job>.md`).
"""
from __future__ import annotations

import importlib
from types import ModuleType

from bilinear_ir.errors import input_error

NAMES = ("train_eval", "reproduce_table", "lowrank_analysis", "mol", "late_interaction",
         "retrieve", "fidelity_bm25", "synthetic_agreement", "collection_stats", "embed",
         "study", "export", "learning_curve")


def get(name: str) -> ModuleType:
  """The module of job `name` (`bilinear_ir.jobs.<name>`); an unknown name is an `InputError`."""
  if name not in NAMES:
    raise input_error(f"unknown job {name!r}; known: {', '.join(sorted(NAMES))}", file="config",
                      field="job")
  return importlib.import_module(f"{__name__}.{name}")
