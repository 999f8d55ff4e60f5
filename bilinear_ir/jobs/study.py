"""The `study` job: where does a learned similarity beat the dot product? Collections x
embeddings x models, with paired statistics over queries and every choice made on dev.

For each collection (the embedded SciFact with its own train / test split, or a test-only
collection such as CACM, MED, LISA or any BEIR folder / zip, cross-validated over its queries
with a dev part carved out of each training fold) and each embedding
(`config.embedding_specs.embedding_spec`):

  dot       the untrained dot product of the frozen embeddings (the baseline of every test);
  bm25      BM25 (one fit per collection);
  wdp, bilinear, lowrank_r{r} (residual I + P Q^T)
            trained with the table's recipe and selected on dev, step 0 (the dot product itself:
            every one of them starts there) included, so selection can keep the dot product;
  learned   per fold and seed, the one of those the dev metric picks (the "dev-selected learned
            similarity");
  hybrid    `lam * learned + (1 - lam) * BM25`, lam tuned on dev;
  <row>_ict the rows of `config.ict_rows` trained on pairs the corpus makes itself (inverse
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

from typing import Any

import ml_collections
import numpy as np

from bilinear_ir import progress
from bilinear_ir.data import pipeline
from bilinear_ir.errors import require
from bilinear_ir.experiment import compare
from bilinear_ir.experiment import evaluate
from bilinear_ir.experiment import rows as rows_lib
from bilinear_ir.experiment import spec as spec_lib
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
  validation.integers(config.ranks, "ranks", low=1)
  require(len(config.models) > 0, "must name at least one trained model", field="models")
  for name in config.models:
    validation.one_of(name, ("wdp", "bilinear", "lowrank"), "models")
  for sp in spec_lib.model_specs(config.models, config.ranks):
    validation.check_model(spec_lib.model_block(config.model, sp))
  names = [sp["name"] for sp in spec_lib.model_specs(config.models, config.ranks)]
  for name in config.ict_rows:
    validation.one_of(name, names, "ict_rows")
  if config.ict_rows:
    require(config.encoder.kind == "flax", "ICT pairs are new texts: ict_rows need "
            "encoder.kind 'flax'", field="ict_rows")


def run_collection(config, entry: str, workdir: str | None = None
                   ) -> tuple[list[dict[str, Any]], list[str], str]:
  """Every row of one collection: (rows, unseen-doc query ids, collection name); with a
  `workdir`, each training run checkpoints in its own folder (`rows.seed_runs`)."""
  measures = list(config.eval.measures)
  m0, sel = measures[0], config.train.select_metric
  specs = spec_lib.model_specs(config.models, config.ranks)
  ict_specs = [sp for sp in specs if sp["name"] in config.ict_rows]
  rows, unseen = [], None
  for recipe, prepared, splitsets in spec_lib.embeddings_of(
      config, spec_lib.collection_block(config.data, entry), int(config.folds)):
    coll = prepared.collection
    if unseen is None:
      unseen = rows_lib.unseen_doc_queries(splitsets)
    bar = progress.bar(len(config.seeds) * (len(splitsets) * len(specs) + len(ict_specs)),
                       f"{coll.name} / {recipe.name}", unit="model")
    # per model name -> per seed -> {qid: {measure: v}} over every split's test queries
    dot, bm25, _ = rows_lib.baselines(recipe, prepared, splitsets, measures)
    per_query: dict[str, list[dict]] = {"dot": [dot["per_query"]], "bm25": [bm25["per_query"]]}
    for name in [sp["name"] for sp in specs] + ["learned", "hybrid"]:
      per_query.setdefault(name, [])
    chosen, ict_lam = [], {}
    # Rows trained on pairs the corpus makes itself: no query is trained on, so no folds are
    # needed; every query of the test split (all of a test-only collection) is evaluated.
    ict_split = (splitsets[0] if len(splitsets) == 1
                 else pipeline.test_only(coll, recipe.data)[0])
    for sp in ict_specs:
      outs = rows_lib.seed_runs(recipe, {**sp, "source": "ict"}, config.seeds, prepared,
                                ict_split, each=lambda *_: bar.update(1), workdir=workdir)
      per_query[f"{sp['name']}_ict"] = [o["per_query"] for o in outs]
      ict_lam[f"{sp['name']}_ict"] = [(o.get("ict_guard") or {}).get("lam") for o in outs]
    for seed in config.seeds:
      seed_q = {sp["name"]: {} for sp in specs}
      learned_q, hybrid_q = {}, {}
      for s in splitsets:
        fold = []
        for sp in specs:
          out = rows_lib.seed_runs(recipe, sp, [seed], prepared, s, workdir=workdir)[0]
          seed_q[sp["name"]].update(out["per_query"])
          fold.append((sp, out))
          bar.update(1)
        sp, out = rows_lib.best_on_dev(fold, lambda t: t[1]["dev"].get(sel))
        chosen.append(sp["name"] if out["best_step"] else f"{sp['name']}@step0")
        learned_q.update(out["per_query"])
        _, res = evaluate.HybridEvaluator(s.dev, prepared.collection.doc_ids, config.hybrid,
                                          measures)(
            evaluate.full_corpus(out["module"], out["params"], prepared, config.hybrid.depth),
            {"test": s.test})
        hybrid_q.update(res["test"][0]["per_query"])
      for name, q in seed_q.items():
        per_query[name].append(q)
      per_query["learned"].append(learned_q)
      per_query["hybrid"].append(hybrid_q)
    bar.close()

    for name, outs in per_query.items():
      row = {"collection": coll.name, "embedding": recipe.name, "model": name,
             "metrics": rows_lib.query_means(outs, measures), "n_queries": len(outs[0]),
             "seeds": len(outs), "per_query": rows_lib.seed_mean(outs, m0),
             "folds": len(splitsets) if len(splitsets) > 1 else 0}
      if name == "learned":
        row["chosen"] = chosen
      if name in ict_lam:
        row["ict_lam"] = ict_lam[name]
      rows.append(row)
  return rows, unseen, prepared.collection.name


def _compare_cells(rows: list[dict[str, Any]], unseen: dict[str, list[str]], config) -> None:
  """Adds `vs_dot` / `vs_bm25` and `unseen_doc` (its mean and `vs_dot`) paired statistics to
  every row; each kind of comparison is one Holm family over the study."""
  cell = ("collection", "embedding")
  compare.against_baselines(rows, [r["per_query"] for r in rows], cell, config, name="model")
  subsets = [{q: r["per_query"][q] for q in unseen[r["collection"]]} for r in rows]
  holders = [{"n_queries": len(sub), "mean": float(np.mean(list(sub.values()))) if sub else None}
             for sub in subsets]
  compare.add_paired(holders, subsets, compare.against(rows, "dot", cell, "model",
                                                       lambda i: len(subsets[i]) >= 2),
                     "vs_dot", config)
  for r, h in zip(rows, holders):
    r["unseen_doc"] = h


def run(config: ml_collections.ConfigDict, workdir: str) -> outputs.Report:
  """The `study` job (configs/study.py)."""
  rows, unseen, names = [], {}, []
  for entry in config.collections:
    coll_rows, coll_unseen, name = run_collection(config, entry, workdir)
    require(name not in names, f"two collections are named {name!r}", field="collections")
    names.append(name)
    rows += coll_rows
    unseen[name] = coll_unseen
  _compare_cells(rows, unseen, config)
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
