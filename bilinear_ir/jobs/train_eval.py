"""The `train_eval` job: one scorer trained on one collection and evaluated on its test split.

Train on the train split minus a dev part (model selection), evaluate on the test split; with
`data.folds = K`, K-fold cross-validation over the queries of `data.split`, every query scored
once by the fold that held it out.
"""
from __future__ import annotations

import functools
import os

import jax
import ml_collections
import numpy as np

from bilinear_ir import scorers
from bilinear_ir.data import embeddings
from bilinear_ir.data import pipeline
from bilinear_ir.eval import trec
from bilinear_ir.experiment import spec
from bilinear_ir.experiment import training
from bilinear_ir.experiment import validation
from bilinear_ir.export import saved_model
from bilinear_ir.report import outputs
from bilinear_ir.report import text


def validate(config: ml_collections.ConfigDict) -> None:
  """Refuses a bad config before any work (`experiment.validation`)."""
  validation.integer(config.seed, "seed", 0)
  validation.check_data(config.data)
  embeddings.check_encoder(config.encoder)
  validation.check_bm25(config.bm25)
  validation.check_model(config.model)
  validation.check_train(config.train)
  validation.check_source(config)
  validation.check_eval(config.eval)


def run(config: ml_collections.ConfigDict, workdir: str):
  """The `train_eval` job (see configs/train_eval.py). Writes the selected model to
  `WORKDIR/model` (`WORKDIR/foldK/model` with folds), loadable with
  `export.saved_model.load_model`."""
  prepared = pipeline.prepare(config)
  coll = prepared.collection
  trains_on_qrels = config.train.source != "ict" and bool(jax.tree.leaves(scorers.init_params(
      scorers.from_config(config.model, 8), jax.random.key(0))))
  if config.data.folds or trains_on_qrels or config.data.train_split in coll.qrels:
    sets = pipeline.splits(coll, config.data, config.seed)
  else:  # nothing to train on judgements (ICT, or dot): evaluate every query of data.split
    sets = pipeline.test_only(coll, config.data)
  module = scorers.from_config(config.model, prepared.dim)
  embedding = prepared.embeddings.manifest["settings"]
  outs, models = [], {}
  for s in sets:
    sub = s.name if len(sets) > 1 else ""
    outs.append(training.train_and_evaluate(spec.Row.of(config), prepared, s,
                                            os.path.join(workdir, sub)))
    models[os.path.join(sub, "model")] = functools.partial(
        saved_model.save_model, module=module, params=outs[-1]["params"], embedding=embedding,
        extra={"collection": prepared.collection.name, "seed": int(config.seed)})
  measures = list(config.eval.measures)
  header = ["split", "queries"] + measures
  rows = []
  if len(sets) == 1:
    out = outs[0]
    results = {"metrics": out["metrics"], "mode": out["mode"], "dev": out["dev"],
               "best_step": out["best_step"], "history": out["history"],
               "queries": len(sets[0].test.query_ids)}
    rows.append([sets[0].test.name, len(sets[0].test.query_ids)]
                + [out["metrics"][m] for m in measures])
    run_dict = out["run"]
  else:
    folds = [{"fold": s.name, "queries": len(s.test.query_ids), "metrics": o["metrics"],
              "dev": o["dev"], "best_step": o["best_step"]} for s, o in zip(sets, outs)]
    mean = {m: float(np.mean([o["metrics"][m] for o in outs])) for m in measures}
    std = {m: float(np.std([o["metrics"][m] for o in outs], ddof=1)) for m in measures}
    results = {"metrics": mean, "std": std, "mode": outs[0]["mode"], "folds": folds}
    rows += [[f["fold"], f["queries"]] + [f["metrics"][m] for m in measures] for f in folds]
    rows.append(["mean", sum(f["queries"] for f in folds)] + [mean[m] for m in measures])
    rows.append(["std (ddof 1)", ""] + [std[m] for m in measures])
    run_dict = {q: docs for o in outs for q, docs in o["run"].items()}
  results.update(scorer=config.model.scorer, collection=prepared.collection.name,
                 train_source=config.train.source, ict_pairs=int(outs[0]["ict_pairs"]))
  if config.train.source == "ict":  # the label-free guard's blend with dot (train.ict.guard)
    results["ict_guard"] = outs[0]["ict_guard"]
  md = (f"# train_eval: {config.model.scorer} on {prepared.collection.name} "
        f"({results['mode']} ranking)\n\n" + text.markdown_table(rows, header, digits=4))
  return outputs.Report(results=results, markdown=md,
                        extra_files={"run.trec": trec.run_to_text(run_dict, config.model.scorer)},
                        folders=models)
