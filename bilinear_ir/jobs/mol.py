"""The Mixture-of-Logits job (paper 003) on one collection: MoL next to the bilinear table's rows.

For each frozen embedding of the bilinear table (`embedding_specs.EMBEDDINGS`: "mean" normalised,
"cls" unnormalised), on the same collection, train / dev / test split and measures:

  * comparison rows trained with the table's recipe (`config.train` + `config.train_overrides`):
    dot (untrained), WDP, full bilinear (the `baselines` argument), and BM25;
  * MoL (`scorers.mol`, "vector" inputs: a two-layer MLP per side makes the P_q / P_x components)
    for every P_q = P_x of `components` and every L_MI weight alpha of `mi_weights`
    (paper: 0.001; 0 = no load balancing), trained with the same trainer, plus the MoL changes of
    `config.mol_train`. L_MI enters the loss through the trainer's `aux_loss` hook
    (`train.losses.MiLoss`).

Every learned row runs every seed of `config.seeds` and is reported as mean +- std over seeds;
every model is selected on the dev split carved out of train, test is only evaluated.

The rows are `config.rows` (`config.tables.mol_table`), run by the table runner
(`experiment.table`). Then, for the best MoL configuration of each embedding (by dev; the first MoL configuration when
`data.dev_fraction` is 0 and there is no dev split), what retrieving with the learned
similarity costs (`retrieval.mol_topk` on the whole corpus, the test queries, K = `retrieval.k`):
for exact_two_pass, TopKPerEmbd(N), TopKAvg(N) and CombTopK(N1, N2), the hit rate relative to
brute force (|top-K ∩ brute-force top-K| / K), the true gap (brute-force K-th score minus the
retrieved K-th), the mean Theorem 2/3 gap bound and the looser retrieved-only bound, how often the
bound held, the most items each re-scores with MoL, and its time relative to brute force.
"""
from __future__ import annotations

import numpy as np

from bilinear_ir.errors import require
from bilinear_ir.experiment import rows as rows_lib
from bilinear_ir.experiment import spec as spec_lib
from bilinear_ir.experiment import table as table_lib
from bilinear_ir.experiment import validation
from bilinear_ir.studies import approximate_topk as approximate
from bilinear_ir.report import mol as report
from bilinear_ir.report import outputs

SCORERS = ("wdp", "bilinear", "mol")  # the trained rows' scorers


def validate(config) -> None:
  """Refuses a bad config before any work (`experiment.validation`)."""
  validation.check_table(config, hybrid_block=False)
  validation.check_rows(config, SCORERS)
  require(any(r["type"] == "trained" and table_lib.model_of(config, r)["scorer"] == "mol"
              for r in config.rows), "needs at least one MoL row", field="rows")
  validation.integer(config.gate_sample_docs, "gate_sample_docs", 1)
  r = config.retrieval
  validation.integer(r.k, "retrieval.k", 1)
  validation.integer(r.max_range, "retrieval.max_range", 1)
  for key in ("per_embedding", "avg", "comb_n1", "comb_n2"):
    validation.integers(r[key], f"retrieval.{key}", low=1, nonempty=False)
  require(len(r.comb_n1) == len(r.comb_n2),
          "comb_n1 and comb_n2 pair up and need the same length", field="retrieval.comb_n1")
  validation.integer(r.chunk, "retrieval.chunk", 1)
  validation.integer(r.query_batch, "retrieval.query_batch", 1)


def run(config, workdir: str) -> outputs.Report:
  """The `mol` job (configs/mol.py): the table runner's rows, the gates' entropies of each MoL
  row, then the MoL top-k algorithms for the MoL row best on dev."""
  sel = config.train.select_metric
  table = table_lib.run(config, (table_lib.Cell(recipe, prepared, splitsets[:1], {
      "embedding": recipe.name, "mode": config.eval.mode}) for recipe, prepared, splitsets
                                  in spec_lib.embeddings_of(config)), workdir)
  cells = table.cells
  rows, retrieval, unseen_counts = table.rows, [], {}
  by_name = {(r["embedding"], s["name"]): r for r, s in zip(
      rows, [s for _ in cells for s in config.rows if not s.get("hidden")])}
  for cell, runs, unseen in zip(cells, table.runs, table.unseen):
    emb_name, test = cell.recipe.name, cell.splitsets[0].test
    unseen_counts[emb_name] = len(unseen)
    test_q = cell.prepared.embeddings.queries[cell.prepared.query_row_index(test.query_ids)]
    docs = cell.prepared.embeddings.docs
    for r in runs.values():
      if r.spec["type"] == "trained" and r.spec["label"]["scorer"] == "mol":
        h_p, h_cond = np.mean([approximate.gate_sample(o["module"], o["params"], test_q, docs,
                                                       int(config.gate_sample_docs), seed)
                               for seed, o in zip(config.seeds, r.outs)], axis=0)
        by_name[emb_name, r.spec["name"]].update(
            gate_entropy=float(h_p), gate_cond_entropy=float(h_cond), l_mi=float(h_cond - h_p),
            temperature=[o["temperature"] for o in r.outs])
    best = runs["best"]
    best_row = by_name[emb_name, best.chosen[0]]
    per_seed = [approximate.mol_costs(o["module"], o["params"], test_q, docs, config.retrieval)
                for o in best.outs]
    for i, first in enumerate(per_seed[0]):
      entry = {"embedding": emb_name, "model": report.label(best_row), "k": int(config.retrieval.k),
               "queries": len(test_q), "docs": cell.prepared.collection.num_docs,
               "algorithm": first["algorithm"], "name": first["name"],
               "rescored": first["rescored"]}
      for key in ("hit_rate", "true_gap", "gap_bound", "gap_bound_retrieved", "bound_holds",
                  "fallback", "seconds", "time_vs_brute_force"):
        vals = [s[i][key] for s in per_seed]
        entry[key] = None if any(v is None for v in vals) else float(np.mean(vals))
      retrieval.append(entry)
  best = rows_lib.best_on_dev([r for r in rows if r["scorer"] == "mol"], lambda r: r["dev"][sel])
  results = {"metrics": best["metrics"], "std": best["std"], "mode": best["mode"],
             "dev": best["dev"], "best": {k: best[k] for k in ("embedding", "p_q", "p_x", "d_p",
                                                               "mi_weight")},
             "best_steps": best["best_steps"], "scorer": "mol",
             "collection": cells[-1].prepared.collection.name,
             "test_queries": len(cells[-1].splitsets[0].test.query_ids),
             "seeds": list(config.seeds), "unseen_doc_queries": unseen_counts, "rows": rows,
             "retrieval": retrieval}
  return outputs.Report(results=results,
                        markdown=report.markdown(rows, retrieval, unseen_counts, config))
