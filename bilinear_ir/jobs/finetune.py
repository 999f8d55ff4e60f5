"""What judged queries buy: the encoder fine-tuned against the learned similarities over the
frozen embeddings, per embedding, with what each costs.

Per embedding (one cell of the table runner, `experiment.table`): the rows of `config.rows`
(dot, BM25, the trained rows over the frozen embeddings, "learned": the one best on dev, and its
hybrid with BM25), then one fine-tune row per entry of `config.modes` (`experiment.finetuning`:
`config.finetune`, one run per seed, selected on dev with step 0 a candidate). Every row is
compared per query with dot over all test queries and over the unseen-answer ones
(`studies.curve_subsets.unseen_answer_queries`: no gold answer judged for a training query),
Holm over the table per view (`experiment.compare`); each row's fraction of the two-tower gain
over dot (`compare.recovered`) and its cost (`experiment.costs.table_costs`).
"""
from __future__ import annotations

import os
from typing import Any

from bilinear_ir import files
from bilinear_ir import timing
from bilinear_ir.errors import require
from bilinear_ir.experiment import compare
from bilinear_ir.experiment import finetuning
from bilinear_ir.experiment import spec as spec_lib
from bilinear_ir.experiment import table as table_lib
from bilinear_ir.experiment import validation
from bilinear_ir.export import encoder_folder
from bilinear_ir.studies import curve_subsets as curve
from bilinear_ir.report import finetune as report
from bilinear_ir.report import outputs
from bilinear_ir.train import finetune

MODELS = ("wdp", "lowrank", "bilinear", "adapter")  # the trained rows' scorers


def validate(config) -> None:
  """Refuses a bad config before any work (`experiment.validation`, `finetune.check_config`)."""
  validation.check_collection(config.collection, path=config.data.path)
  validation.check_table(config)
  validation.integer(config.max_steps, "max_steps", 1)
  validation.integer(config.evals, "evals", 1)
  validation.check_rows(config, MODELS)
  require(any(s["type"] == "dot" and s["name"] == "dot" for s in config.rows),
          "the table compares every row with a row named 'dot' of type dot", field="rows")
  validation.integer(config.latency.batch, "latency.batch", 1)
  validation.integer(config.latency.repeats, "latency.repeats", 1)
  finetuning.check_modes(config, required=True)


def run(config, workdir: str) -> outputs.Report:
  """The `finetune` job (configs/finetune.py): per embedding, the table runner's rows, then the
  fine-tunes, each training run checkpointing under `workdir/runs` (`training.run_dir`: a rerun
  resumes it); the chosen encoder of each mode's first seed written to
  `workdir/model/<embedding>-<mode>`."""
  m0, cfg = config.eval.measures[0], config.finetune
  unseen = {}

  def cells():
    for recipe, prepared, (splitset, *_) in spec_lib.embeddings_of(
        config, spec_lib.collection_block(config.data, config.collection)):
      train = splitset.train
      require(len(train.query_ids) > 0, f"{prepared.collection.name} has no training queries",
              field="collection")
      unseen[recipe.name] = curve.unseen_answer_queries(train, [train.query_ids], splitset.test)
      yield table_lib.Cell(
          recipe, prepared, [splitset], {"collection": prepared.collection.name,
                                         "embedding": recipe.name,
                                         "n_train": len(train.query_ids)},
          schedule=lambda spec, cut, train=recipe.train: curve.schedule(
              config, train, curve.positive_pairs(cut.train)))

  table = table_lib.run(config, cells(), workdir)
  rows, models = finetuning.table_rows(config, table, workdir)
  compare.against_baselines(rows, [r["per_query"] for r in rows], ("embedding",), config,
                            name="model", baselines=("dot",))
  compare.subset_view(rows, [unseen[r["embedding"]] for r in rows], "unseen", ("embedding",),
                      config)
  compare.recovered(rows, finetuning.REFERENCE, m0, ("embedding",))
  results = {"rows": rows, "collection": rows[0]["collection"], "measure": m0,
             "seeds": list(config.seeds), "modes": list(config.modes), "loss": cfg.loss,
             "reference": finetuning.REFERENCE if finetuning.REFERENCE in config.modes else None,
             "negatives": {"from": config.train.negatives_from,
                           "hard_depth": int(config.train.hard_depth)},
             "unseen_queries": unseen,
             "model": {name: f"model/{name}" for name in models},
             "device": finetuning.device(), "hardware": timing.hardware(),
             "latency": {"batch": int(config.latency.batch), "k": 10,
                         "repeats": int(config.latency.repeats)},
             "selection": f"dev {config.train.select_metric}: the trained rows {config.evals} "
                          f"times per run, the fine-tunes every {cfg.eval_every} steps; step 0 "
                          "(dot, the frozen encoder) a candidate",
             "holm": "over the table, one family per view (all test queries; unseen-answer "
                     "queries)"}
  return outputs.Report(results=results, markdown=report.markdown(results, config),
                        folders={"model": lambda path: write_models(path, models)})


def write_models(path: str, models: dict[str, Any]) -> None:
  """`path/<embedding>-<mode>`: each chosen encoder as a sentence-transformers folder, the query
  side's params (query_tower: the query tower, the doc side being the source model; two towers
  apart: the doc tower in `path/<embedding>-<mode>-doc`); the whole folder replaced at once (a
  rerun rewrites it)."""
  with files.atomic_dir(path) as tmp:
    for key, (setting, params) in models.items():
      for side, name in (("query", key), ("doc", f"{key}-doc")):
        if side == "query" or "doc" in params:
          encoder_folder.save(os.path.join(tmp, name), setting.encoder,
                              finetune.side_params(params, side, setting.encoder),
                              setting.settings)
