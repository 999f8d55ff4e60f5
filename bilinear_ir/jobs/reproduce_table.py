"""The bilinear paper's real-world table (paper 000, section 4) reproduced on one collection.

For each frozen embedding (e.g. all-MiniLM-L6-v2 "mean" = mean-pooled + normalised, aligned with
the dot product; "cls" = CLS-pooled, unnormalised, misaligned) and each seed, the rows of
`config.rows` (`config.tables.bilinear_table`): the untrained dot product, WDP, low-rank `P Q^T`
at every rank (pure, as in the paper, and residual `I + P Q^T`), full bilinear, BM25, and a
hybrid of the best learned similarity (picked on dev) with BM25, all selected on dev (the
collection's own dev split, else carved out of train), test only evaluated; P@1 over each test
question's own pool (`p_at_1_pool`) where the collection lists negatives. The table runner
(`experiment.table`) runs them.
"""
from __future__ import annotations

import functools

from bilinear_ir.eval import trec
from bilinear_ir.experiment import spec as spec_lib
from bilinear_ir.experiment import table as table_lib
from bilinear_ir.experiment import validation
from bilinear_ir.export import saved_model
from bilinear_ir.report import outputs
from bilinear_ir.report import reproduce_table as report
from bilinear_ir.report import text


def validate(config) -> None:
  """Refuses a bad config before any work (`experiment.validation`)."""
  if config.collection:
    validation.check_collection(config.collection, path=config.data.path)
  validation.check_table(config)
  validation.check_rows(config)


def run(config, workdir: str) -> outputs.Report:
  """The `reproduce_table` job (configs/reproduce_table.py)."""
  data = (spec_lib.collection_block(config.data, config.collection) if config.collection
          else config.data)
  table = table_lib.run(config, (table_lib.Cell(recipe, prepared, splitsets[:1], {
      "embedding": recipe.name, "mode": config.eval.mode}) for recipe, prepared, splitsets
                                  in spec_lib.embeddings_of(config, data)), workdir)
  cells = table.cells
  models, unseen_counts = {}, {}
  for cell, runs, unseen in zip(cells, table.runs, table.unseen):
    unseen_counts[cell.recipe.name] = len(unseen)
    for r in (r for r in runs.values() if r.spec["type"] == "trained"):
      for seed, o in zip(config.seeds, r.outs):
        models[f"{cell.recipe.name}/{r.spec['name']}/seed{seed}"] = (
            o["module"], o["params"], cell.prepared.embeddings.manifest["settings"],
            {"collection": cell.prepared.collection.name, "seed": int(seed),
             "row": r.spec["title"]})
  rows, m0 = table.rows, config.eval.measures[0]
  coll, test = cells[-1].prepared.collection.name, cells[-1].splitsets[0].test
  results = {"rows": rows, "collection": coll, "test_queries": len(test.query_ids),
             "seeds": list(config.seeds), "std": "sample std (ddof = 1) over the seeds",
             "paired": f"{m0} per query (mean over seeds) against dot and against BM25: "
                       "randomization test, Holm-adjusted over each family (eval.stats)",
             "unseen_doc_queries": unseen_counts}
  if "p_at_1_pool" in rows[0]["metrics"]:
    results["p_at_1_pool"] = text.prose(report.JOB, "pool").strip()
  bm25_run = table.runs[-1]["bm25"].fits[0][0]["run"]
  return outputs.Report(results=results,
                        markdown=report.markdown(rows, config, unseen_counts, coll),
                        figures={"metric_vs_rank": report.plot(rows, config)},
                        extra_files={"run_bm25.trec": trec.run_to_text(bm25_run, "bm25")},
                        folders={"models": functools.partial(saved_model.save_many,
                                                             models=models)})
