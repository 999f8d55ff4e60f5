"""The bilinear paper's real-world table (paper 000, section 4) reproduced on one collection.

For each frozen embedding (e.g. all-MiniLM-L6-v2 "mean" = mean-pooled + normalised, aligned with
the dot product; "cls" = CLS-pooled, unnormalised, misaligned) and each seed: the untrained dot
product, WDP, low-rank `P Q^T` at every rank (pure, as in the paper, and residual `I + P Q^T`),
full bilinear, BM25, and a hybrid of the best learned similarity (picked on dev) with BM25, all
selected on dev (the collection's own dev split, else carved out of train), test only evaluated;
P@1 over each test question's own pool (`p_at_1_pool`) where the collection lists negatives.
"""
from __future__ import annotations

import functools

from bilinear_ir import progress
from bilinear_ir.errors import require
from bilinear_ir.eval import trec
from bilinear_ir.experiment import compare
from bilinear_ir.experiment import evaluate
from bilinear_ir.experiment import rows as rows_lib
from bilinear_ir.experiment import spec as spec_lib
from bilinear_ir.experiment import validation
from bilinear_ir.export import saved_model
from bilinear_ir.report import reproduce_table as report
from bilinear_ir.report import outputs
from bilinear_ir.report import text



def validate(config) -> None:
  """Refuses a bad config before any work (`experiment.validation`)."""
  if config.collection:
    validation.check_collection(config.collection, path=config.data.path)
  validation.check_table(config)
  validation.integers(config.ranks, "ranks", low=1)
  for residual in config.residuals:
    validation.one_of(residual, ("none", "identity", "diag"), "residuals")
  for source in config.sources:
    validation.one_of(source, ("ict", "both"), "sources")
  slugs = {spec_lib.row_slug(spec) for spec in spec_lib.table_grid(config)
           if spec["source"] == "qrels"}
  for name in config.source_rows if config.sources else ():
    validation.one_of(name, sorted(slugs), "source_rows")
  if config.sources:
    require(config.encoder.kind == "flax", "ICT pairs are new texts: sources need "
            "encoder.kind 'flax'", field="sources")
  for s in spec_lib.table_grid(config):
    validation.check_model(spec_lib.model_block(config.model, s))
  validation.check_train(spec_lib.Recipe.of(config, "").row(
      {"scorer": "mol"}, 0, config.mol_train).train, "mol_train")


def run(config, workdir: str) -> outputs.Report:
  """The `reproduce_table` job (configs/reproduce_table.py)."""
  grid = spec_lib.table_grid(config)
  measures = list(config.eval.measures)
  m0, sel = measures[0], config.train.select_metric
  rows, per_query, models, unseen_counts = [], [], {}, {}
  bar = progress.bar(len(config.embeddings) * len(grid) * len(config.seeds), "models",
                     unit="model")
  data = (spec_lib.collection_block(config.data, config.collection) if config.collection
          else config.data)
  for recipe, prepared, (splitset, *_) in spec_lib.embeddings_of(config, data):
    emb_name, test = recipe.name, splitset.test
    base = {"embedding": emb_name, "mode": config.eval.mode, "rank": None, "residual": None}
    unseen = rows_lib.unseen_doc_queries([splitset])
    unseen_counts[emb_name] = len(unseen)
    dot, bm25, bm25_run = rows_lib.baselines(recipe, prepared, [splitset], measures)
    pools = evaluate.candidate_pools(prepared, test)  # None: no answer-selection view
    pool = lambda runs: rows_lib.pool_p_at_1(prepared, test, pools, runs,  # noqa: E731
                                             config.hybrid.normalize)
    for row, out, runs in zip(rows_lib.baseline_rows(dot, bm25, unseen, measures), (dot, bm25),
                              ([(1.0, dot["module"], dot["params"])], [(0.0, None, None)])):
      row["metrics"] = {**row["metrics"], **pool(runs)}
      rows.append({**base, **row})
      per_query.append(rows_lib.seed_mean([out["per_query"]], m0))
    trained = []
    for s in grid:
      outs = rows_lib.seed_runs(recipe, s, config.seeds, prepared, splitset,
                                train=config.mol_train if s["scorer"] == "mol" else None,
                                each=lambda *_: bar.update(1), workdir=workdir)
      row = {**base, **s, **rows_lib.summary(outs, measures, sel, unseen)}
      row["metrics"].update(pool([(1.0, o["module"], o["params"]) for o in outs]))
      rows.append(row)
      per_query.append(rows_lib.seed_mean([o["per_query"] for o in outs], m0))
      for seed, o in zip(config.seeds, outs):
        models[f"{emb_name}/{spec_lib.row_slug(s)}/seed{seed}"] = (
            o["module"], o["params"], prepared.embeddings.manifest["settings"],
            {"collection": prepared.collection.name, "seed": int(seed),
             "row": spec_lib.row_label(s)})
      trained.append((s, outs, row["dev"][sel]))
      bar.write(f"{emb_name:>4} {spec_lib.row_label(s):<28} test {m0} "
                f"{row['metrics'][m0]:.4f} +- "
                f"{row['std'][m0]:.4f} (dev {sel} {text.fmt(row['dev'][sel], 4)})")
    # The hybrid's dense partner: the row best on the judged dev split (ICT rows select on
    # held-out ICT pairs, whose metric is not comparable).
    best, best_outs, _ = rows_lib.best_on_dev([t for t in trained if t[0]["source"] != "ict"],
                                              lambda t: t[2])
    hybrid = evaluate.HybridEvaluator(splitset.dev, prepared.collection.doc_ids, config.hybrid,
                                      measures)
    hyb = []
    for o in best_outs:
      lam, res = hybrid(evaluate.full_corpus(o["module"], o["params"], prepared,
                                             config.hybrid.depth), {"test": splitset.test})
      hyb.append((res["test"][0], lam))
    mean, std = rows_lib.aggregate([h[0]["mean"] for h in hyb], measures)
    mean.update(pool([(h[1], o["module"], o["params"]) for h, o in zip(hyb, best_outs)]))
    rows.append({**base, "scorer": "hybrid", "rank": best["rank"], "residual": best["residual"],
                 "dense": spec_lib.row_label(best), "lambda": [h[1] for h in hyb],
                 "metrics": mean,
                 "std": std, "seeds": len(hyb),
                 "unseen_docs": rows_lib.unseen_mean([h[0] for h in hyb], unseen, m0)})
    per_query.append(rows_lib.seed_mean([h[0]["per_query"] for h in hyb], m0))
  bar.close()
  compare.against_baselines(rows, per_query, ("embedding",), config)
  coll = prepared.collection.name
  results = {"rows": rows, "collection": coll, "test_queries": len(test.query_ids),
             "seeds": list(config.seeds), "std": "sample std (ddof = 1) over the seeds",
             "paired": f"{m0} per query (mean over seeds) against dot and against BM25: "
                       "randomization test, Holm-adjusted over each family (eval.stats)",
             "unseen_doc_queries": unseen_counts}
  if "p_at_1_pool" in rows[0]["metrics"]:
    results["p_at_1_pool"] = text.prose(report.JOB, "pool").strip()
  return outputs.Report(results=results,
                        markdown=report.markdown(rows, config, unseen_counts, coll),
                        figures={"metric_vs_rank": report.plot(rows, config)},
                        extra_files={"run_bm25.trec": trec.run_to_text(bm25_run, "bm25")},
                        folders={"models": functools.partial(saved_model.save_many,
                                                             models=models)})
