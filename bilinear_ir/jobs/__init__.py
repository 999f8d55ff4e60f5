"""The jobs: one module per `config.job`, each with `validate(config)` and
`run(config, workdir) -> report.Report`.

Jobs compose the libraries below them (data, train, retrieval, fidelity, synthetic, scorers,
eval); a job never imports another job. What several jobs share sits in modules of its own:
`common` (the training protocol and table rows), `validation` (config checks), `report` (what a
job returns and how `main` writes it).
"""
from __future__ import annotations

import importlib
from types import ModuleType

from bilinear_ir.errors import input_error

NAMES = ("train_eval", "reproduce_table", "lowrank_analysis", "mol", "late_interaction",
         "retrieve", "fidelity_bm25", "synthetic_agreement", "collection_stats", "embed",
         "study", "export")


def get(name: str) -> ModuleType:
  """The module of job `name` (`bilinear_ir.jobs.<name>`); an unknown name is an `InputError`."""
  if name not in NAMES:
    raise input_error(f"unknown job {name!r}; known: {', '.join(sorted(NAMES))}", file="config",
                      field="job")
  return importlib.import_module(f"{__name__}.{name}")
