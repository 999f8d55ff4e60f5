r"""The one entry point: `python -m bilinear_ir.main --config=configs/NAME.py[:ARGS] --workdir=DIR`.

`config.job` names what runs; every knob can be overridden with `--config.x=y`. Outputs
(`config.json`, `results.json`, `results.md`, PNG plots) are written to `--workdir` only when the
job finished. Bad input or a bad config value exits with code 2 and one line on stderr.
"""
from __future__ import annotations

import importlib
import os
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from bilinear_ir import allocator
from bilinear_ir.errors import InputError

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Path to a config file, e.g. configs/x.py:arg.",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for outputs (results, checkpoints, caches).")

# config.job -> "module:function". Each function takes (config, workdir) and returns an
# `eval.report.Report`.
JOBS = {
    "synthetic_agreement": "bilinear_ir.synthetic.agreement:run",
    "collection_stats": "bilinear_ir.data.loaders:stats_job",
    "train_eval": "bilinear_ir.train.trainer:run",
    "reproduce_table": "bilinear_ir.eval.table:run",
    "lowrank_analysis": "bilinear_ir.eval.lowrank_analysis:run",
    "retrieve": "bilinear_ir.retrieval.job:run",
    "mol": "bilinear_ir.eval.mol_table:run",
    "late_interaction": "bilinear_ir.eval.late_interaction:run",
    "fidelity_bm25": "bilinear_ir.fidelity.experiments:run",
}


def fail(message: str) -> None:
  """One line on stderr, exit code 2."""
  print(f"error: {' '.join(str(message).split())}", file=sys.stderr)
  sys.exit(2)


def job_function(name: str):
  """Resolves `config.job` to its function."""
  if name not in JOBS:
    raise InputError(f"config: field 'job': unknown job {name!r}; known: {', '.join(sorted(JOBS))}")
  module, function = JOBS[name].split(":")
  return getattr(importlib.import_module(module), function)


def run(config, workdir: str):
  """Runs `config.job` and writes its report into `workdir` (process 0 only)."""
  import jax  # pylint: disable=g-import-not-at-top
  from bilinear_ir.eval import report as report_lib  # pylint: disable=g-import-not-at-top

  if config.get("distributed", False):
    jax.distributed.initialize()
  job = job_function(config.job)
  report = job(config, workdir)
  if jax.process_index() == 0:
    report_lib.write(workdir, report_lib.config_to_json(config), report)
    print(report.markdown)
  return report


def main(argv):
  if len(argv) > 1:
    fail(f"unexpected arguments: {argv[1:]}")
  if FLAGS.config is None or FLAGS.workdir is None:
    fail("both --config and --workdir are required")
  logging.set_verbosity(logging.WARNING)
  allocator.keep_freed_memory()
  try:
    run(FLAGS.config, os.path.abspath(FLAGS.workdir))
  except InputError as e:
    fail(str(e))


def parse_flags(argv):
  """absl flag parsing whose errors (bad override, missing config file) exit 2 in one line."""
  try:
    return FLAGS(argv)
  except (flags.Error, InputError, FileNotFoundError, AttributeError, KeyError, ValueError,
          TypeError) as e:
    fail(f"config: {e}")


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
