"""Fine-tuning the encoder on the judged queries, against the frozen dot product.

Per embedding: the dot product of the frozen encoder's embeddings (`experiment.training`'s dot
row) and the fine-tune (`experiment.finetuning`: `config.finetune`, one run per seed, selected
on dev with step 0 a candidate, evaluated on every test query over the full corpus). The
fine-tune row is compared per query with dot (`experiment.compare.curve`, one n: the whole
training split) over all test queries and over the unseen-answer ones
(`studies.curve_subsets.unseen_answer_queries`: no gold answer judged for a training query).
"""
from __future__ import annotations

import os
from typing import Any

from bilinear_ir import files
from bilinear_ir.errors import require
from bilinear_ir.experiment import compare
from bilinear_ir.experiment import finetuning
from bilinear_ir.experiment import spec as spec_lib
from bilinear_ir.experiment import validation
from bilinear_ir.export import encoder_folder
from bilinear_ir.studies import curve_subsets as curve
from bilinear_ir.report import finetune as report
from bilinear_ir.report import outputs
from bilinear_ir.train import finetune


def validate(config) -> None:
  """Refuses a bad config before any work (`experiment.validation`, `finetune.check_config`)."""
  validation.check_collection(config.collection, path=config.data.path)
  validation.check_table(config, hybrid_block=False)
  finetune.check_config(config.finetune)
  for name in config.embeddings:
    require(not name.startswith("precomputed:"), "a fine-tune trains the encoder: name one "
            f"(mean, cls, ...), not {name!r}", field="embeddings")


def run(config, workdir: str) -> outputs.Report:
  """The `finetune` job (configs/finetune.py): per embedding, the dot row, then the fine-tune at
  every seed, each checkpointing in `workdir/runs/<embedding>-<mode>-<loss>-seed<seed>-<key>`
  (`training.run_dir`: a rerun resumes it); the chosen encoder of the first seed written to
  `workdir/model/<embedding>`."""
  cfg, measures, m0 = config.finetune, list(config.eval.measures), config.eval.measures[0]
  sel = config.train.select_metric
  rows, unseen, models = [], {}, {}
  for recipe, prepared, (splitset, *_) in spec_lib.embeddings_of(
      config, spec_lib.collection_block(config.data, config.collection)):
    train = splitset.train
    require(len(train.query_ids) > 0, f"{prepared.collection.name} has no training queries",
            field="collection")
    n = len(train.query_ids)
    unseen[n] = curve.unseen_answer_queries(train, [train.query_ids], splitset.test)
    fields = {"collection": prepared.collection.name, "embedding": recipe.name, "n_train": n}
    setting = finetuning.Setting.of(recipe, prepared, splitset)
    tuned, params = finetuning.finetune_row(setting, recipe, cfg, config.seeds, measures,
                                            int(config.eval.depth), sel, workdir)
    rows += [{**fields, **finetuning.dot_row(recipe, prepared, splitset, m0, sel)},
             {**fields, **tuned}]
    models[recipe.name] = (setting, params)
  compare.curve(rows, unseen, config)
  results = {"rows": rows, "collection": rows[0]["collection"], "measure": m0,
             "seeds": list(config.seeds), "mode": cfg.mode, "loss": cfg.loss,
             "negatives": {"from": config.train.negatives_from,
                           "hard_depth": int(config.train.hard_depth)},
             "unseen_queries": {str(k): v for k, v in unseen.items()},
             "model": {emb: f"model/{emb}" for emb in models},
             "selection": f"dev {sel} every {cfg.eval_every} steps, step 0 (the frozen encoder) "
                          "a candidate",
             "holm": "one comparison per view (all test queries; unseen-answer queries)"}
  return outputs.Report(results=results, markdown=report.markdown(results, config),
                        folders={"model": lambda path: write_models(path, models)})


def write_models(path: str, models: dict[str, Any]) -> None:
  """`path/<embedding>`: each embedding's chosen encoder as a sentence-transformers folder, the
  query side's params (query_tower: the query tower, the doc side being the source model; two
  towers apart: the doc tower in `path/<embedding>-doc`); the whole folder replaced at once (a
  rerun rewrites it)."""
  with files.atomic_dir(path) as tmp:
    for emb, (setting, params) in models.items():
      for side, name in (("query", emb), ("doc", f"{emb}-doc")):
        if side == "query" or "doc" in params:
          encoder_folder.save(os.path.join(tmp, name), setting.encoder,
                              finetune.side_params(params, side, setting.encoder),
                              setting.settings)
