"""How many judged queries does a learned similarity need? Learning curves over nested subsets.

For each embedding, every model is trained on nested subsets of the training queries (n =
`config.sizes`, drawn per seed by `studies.curve_subsets.nested_subsets`), selected on the dev split
and evaluated on every test query over the full corpus. "learned" is, per seed, the candidate
best on dev among dot and the trained models. Per n and model: paired tests against dot over all
test queries and over the unseen-answer ones (`studies.curve_subsets.unseen_answer_queries`), each
Holm-adjusted over the n of the curve (one family per embedding, model and view). Beside the
curve, per embedding, the hybrid of dot with BM25 (lam chosen on dev) and the learned similarity
at the largest n compared with it on every test query. With `config.modes`, the encoder
itself fine-tuned on each seed's subset at every n, one row per mode
(`experiment.finetuning.curve_rows`), compared with dot the same way.
"""
from __future__ import annotations

from bilinear_ir import progress
from bilinear_ir.errors import require
from bilinear_ir.eval import stats
from bilinear_ir.experiment import compare
from bilinear_ir.experiment import finetuning
from bilinear_ir.experiment import spec as spec_lib
from bilinear_ir.experiment import table as table_lib
from bilinear_ir.experiment import validation
from bilinear_ir.studies import curve_subsets as curve
from bilinear_ir.report import learning_curve as report
from bilinear_ir.report import outputs

MODELS = ("wdp", "lowrank", "bilinear", "mol", "adapter")  # the trained rows' scorers


def validate(config) -> None:
  """Refuses a bad config before any work (`experiment.validation`)."""
  validation.check_collection(config.collection, path=config.data.path)
  validation.check_table(config)
  validation.integers(config.sizes, "sizes", low=1)
  validation.integer(config.max_steps, "max_steps", 1)
  validation.integer(config.evals, "evals", 1)
  validation.check_rows(config, MODELS)
  validation.real(config.finetune_epochs, "finetune_epochs", low=0.0, low_open=True)
  validation.integer(config.finetune_evals, "finetune_evals", 1)
  finetuning.check_modes(config, required=False)


def run(config, workdir: str) -> outputs.Report:
  """The `learning_curve` job (configs/learning_curve.py): per embedding, the subsets and their
  unseen-answer views (known before any training), the hybrid of dot with BM25, then the table
  runner's rows at every size. Each training run checkpoints in its own folder under
  `workdir/runs` (`training.run_dir`): a killed job's rerun resumes there."""
  m0 = config.eval.measures[0]
  unseen_queries, hybrids = {}, {}

  def cells():
    for recipe, prepared, (splitset, *_) in spec_lib.embeddings_of(
        config, spec_lib.collection_block(config.data, config.collection)):
      collection, train = prepared.collection.name, splitset.train
      require(len(train.query_ids) > 0, f"{collection} has no training queries",
              field="collection")
      sizes = curve.sizes_of(config.sizes, len(train.query_ids))
      subsets = {s: curve.nested_subsets(train.query_ids, sizes, s) for s in config.seeds}
      for n in sizes:  # known before any training: a view of < 2 queries is marked empty
        unseen_queries[n] = curve.unseen_answer_queries(
            train, [subsets[s][n] for s in config.seeds], splitset.test)
        if len(unseen_queries[n]) < 2:
          progress.write(f"n={n}: {len(unseen_queries[n])} unseen-answer test queries: view empty")
      for n in sizes:
        yield table_lib.Cell(
            recipe, prepared, [splitset], {"collection": collection, "embedding": recipe.name,
                                           "n_train": n}, tag=f"n{n}",
            trained_on=lambda seed, n=n: [curve.subset_splitset(splitset, subsets[seed][n], n)],
            schedule=lambda spec, cut, train=recipe.train: curve.schedule(
                config, train, curve.positive_pairs(cut.train)))

  table = table_lib.run(config, cells(), workdir)
  rows = table.rows + finetuning.curve_rows(config, table, workdir)
  for cell, runs in zip(table.cells, table.runs):  # the dot product's hybrid with BM25
    if cell.recipe.name not in hybrids:
      h = table_lib.hybrid(config, cell, {"type": "hybrid"}, runs["dot"]).fits[0][0]
      hybrids[cell.recipe.name] = {"metrics": h["metrics"], "lambda": h["lam"],
                                   "per_query": {q: v[m0] for q, v in h["per_query"].items()}}
  compare.curve(rows, unseen_queries, config)
  if finetuning.REFERENCE in config.modes:  # the finetune job's "recovered" column, at each n
    compare.recovered(rows, finetuning.REFERENCE, m0, ("embedding", "n_train"))
  for emb, h in hybrids.items():  # the learned similarity at the largest n against the hybrid
    top = [r for r in rows if r["embedding"] == emb and r["model"] == "learned"][-1]
    h["learned_vs_hybrid"] = {"n_train": top["n_train"], **stats.paired(
        top["per_query"], h["per_query"], seed=config.seed, resamples=config.stats.resamples,
        bootstrap=config.stats.resamples, alpha=config.stats.alpha)}
  crossover = {}
  for emb in config.embeddings:
    gains = [r["n_train"] for r in rows if r["embedding"] == emb and r["model"] == "learned"
             and r["unseen"].get("vs_dot")  # none with fewer than 2 unseen-answer queries
             and stats.mark(r["unseen"]["vs_dot"], config.stats.alpha) == stats.GAIN]
    crossover[emb] = min(gains) if gains else None
  results = {"rows": rows, "unseen_queries": {str(n): q for n, q in unseen_queries.items()},
             "crossover": crossover, "hybrid_dot_bm25": hybrids,
             "collection": table.cells[-1].fields["collection"],
             "measure": m0, "negatives": {"from": config.train.negatives_from,
                                         "hard_depth": int(config.train.hard_depth),
                                         **({"refresh_every": int(config.train.refresh_every)}
                                            if config.train.negatives_from == "mined" else {})},
             "seeds": list(config.seeds), "sizes": sorted(unseen_queries),
             "holm": "over the n of the curve: one family per embedding, model and view (all "
                     "test queries; unseen-answer queries)",
             "learned": "per seed, the candidate best on dev among dot and the trained models",
             "finetunes": {"modes": list(config.modes), "epochs": float(config.finetune_epochs),
                           "evals": int(config.finetune_evals), "loss": config.finetune.loss}}
  return outputs.Report(results=results, markdown=report.markdown(results, config),
                        figures={"learning_curve": report.plot(results, config)})
