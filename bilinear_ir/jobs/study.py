"""The `study` job: where does a learned similarity beat the dot product? Collections x
embeddings x models, with paired statistics over queries and every choice made on dev.

For each collection (the embedded SciFact with its own train / test split, or a test-only
collection such as CACM, MED, LISA or any BEIR folder / zip, cross-validated over its queries
with a dev part carved out of each training fold) and each embedding
(`config.embedding_specs.embedding_spec`), the rows of `config.rows`
(`config.tables.study_table`), run by the table runner (`experiment.table`):

  dot       the untrained dot product of the frozen embeddings (the baseline of every test);
  bm25      BM25 (one fit per collection);
  wdp, bilinear, lowrank_r{r} (residual I + P Q^T)
            trained with the table's recipe and selected on dev, step 0 (the dot product itself:
            every one of them starts there) included, so selection can keep the dot product;
  learned   per fold and seed, the one of those the dev metric picks (the "dev-selected learned
            similarity");
  hybrid    `lam * learned + (1 - lam) * BM25`, lam tuned on dev;
  <row>_ict the rows of the `ict_rows` argument trained on pairs the corpus makes itself (inverse
            cloze, `data.ict`; no judgement read, selected on held-out ICT pairs, then blended
            with dot by the label-free guard `train.ict.guard`, its weight per seed in
            `ict_lam`), evaluated on every query of the test split without folds.

Every query is scored once per seed, by the split (fold) that held it out; per-query metrics are
averaged over seeds. Each model is compared with dot and with BM25 by a paired randomization
test, a paired t-test, a 95% bootstrap CI of the mean difference and an effect size
(`eval.stats.paired`); p-values are Holm-corrected over all comparisons with dot of the study
(and separately over those with BM25). "Unseen-doc" queries are those none of whose relevant docs
is relevant to a query the model trained or selected on (the training split, or the other folds);
their differences are tested per collection and pooled over collections.
"""
from __future__ import annotations

from typing import Iterator

import ml_collections

from bilinear_ir.data import pipeline
from bilinear_ir.errors import require
from bilinear_ir.experiment import compare
from bilinear_ir.experiment import spec as spec_lib
from bilinear_ir.experiment import table as table_lib
from bilinear_ir.experiment import validation
from bilinear_ir.report import study as report
from bilinear_ir.report import outputs

BASELINES = ("dot", "bm25")


def validate(config: ml_collections.ConfigDict) -> None:
  """Refuses a bad config before any work (`experiment.validation`)."""
  require(isinstance(config.collections, (tuple, list)) and len(config.collections) > 0,
          "must name at least one collection", field="collections")
  for entry in config.collections:
    validation.check_collection(entry, "collections")
  validation.check_table(config)
  validation.integer(config.folds, "folds", 2)
  validation.check_rows(config, ("wdp", "bilinear", "lowrank", "adapter"))


def cells(config, entry: str) -> Iterator[table_lib.Cell]:
  """The cells of one collection (`entry`): one per embedding, over its split sets (the
  collection's own split, or `config.folds` folds of a test-only one) and, for the rows trained on
  pairs the corpus makes itself, every query of its test split without folds."""
  for recipe, prepared, splitsets in spec_lib.embeddings_of(
      config, spec_lib.collection_block(config.data, entry), int(config.folds)):
    ict_split = (splitsets[0] if len(splitsets) == 1
                 else pipeline.test_only(prepared.collection, recipe.data)[0])
    yield table_lib.Cell(recipe, prepared, splitsets,
                         {"collection": prepared.collection.name, "embedding": recipe.name,
                          "folds": len(splitsets) if len(splitsets) > 1 else 0},
                         ict_split=ict_split)


def run(config: ml_collections.ConfigDict, workdir: str) -> outputs.Report:
  """The `study` job (configs/study.py): the table runner's rows in every cell, then the
  unseen-doc views."""
  names = []

  def every_cell():
    for entry in config.collections:
      for cell in cells(config, entry):
        if cell.recipe.name == config.embeddings[0]:
          name = cell.fields["collection"]
          require(name not in names, f"two collections are named {name!r}", field="collections")
          names.append(name)
        yield cell

  table = table_lib.run(config, every_cell(), workdir)
  unseen = {c.fields["collection"]: u for c, u in zip(table.cells, table.unseen)}
  rows = table.rows
  compare.subset_view(rows, [unseen[r["collection"]] for r in rows], "unseen_doc",
                      ("collection", "embedding"), config)
  pooled = compare.pooled(rows, unseen, config)
  summary = compare.tally(rows, config.stats.alpha)
  results = {"rows": rows, "unseen_doc": unseen, "pooled_unseen_doc": pooled,
             "summary": summary, "measure": config.eval.measures[0],
             "seeds": list(config.seeds), "folds": int(config.folds),
             "holm": "over every comparison with dot of the study (vs_dot), separately over "
                     "those with BM25 (vs_bm25), the per-collection and the pooled unseen-doc "
                     "comparisons"}
  return outputs.Report(results=results, markdown=report.markdown(results, config),
                        figures={"forest": report.forest_plot(rows, config)})
