"""The Mixture-of-Logits job (paper 003) on one collection: MoL next to the bilinear table's rows.

For each frozen embedding of the bilinear table (`embedding_specs.EMBEDDINGS`: "mean" normalised,
"cls" unnormalised), on the same collection, train / dev / test split and measures:

  * comparison rows trained with the table's recipe (`config.train` + `config.train_overrides`):
    dot (untrained), WDP, full bilinear (`config.baselines`), and BM25;
  * MoL (`scorers.mol`, "vector" inputs: a two-layer MLP per side makes the P_q / P_x components)
    for every P_q = P_x in `config.components` and every L_MI weight alpha in `config.mi_weights`
    (paper: 0.001; 0 = no load balancing), trained with the same trainer, plus the MoL changes of
    `config.mol_train`. L_MI enters the loss through the trainer's `aux_loss` hook
    (`train.losses.MiLoss`).

Every learned row runs every seed of `config.seeds` and is reported as mean +- std over seeds;
every model is selected on the dev split carved out of train, test is only evaluated.

Then, for the best MoL configuration of each embedding (by dev; the first MoL configuration when
`data.dev_fraction` is 0 and there is no dev split), what retrieving with the learned
similarity costs (`retrieval.mol_topk` on the whole corpus, the test queries, K = `retrieval.k`):
for exact_two_pass, TopKPerEmbd(N), TopKAvg(N) and CombTopK(N1, N2), the hit rate relative to
brute force (|top-K ∩ brute-force top-K| / K), the true gap (brute-force K-th score minus the
retrieved K-th), the mean Theorem 2/3 gap bound and the looser retrieved-only bound, how often the
bound held, the most items each re-scores with MoL, and its time relative to brute force.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from bilinear_ir import progress
from bilinear_ir.errors import require
from bilinear_ir.experiment import rows as rows_lib
from bilinear_ir.experiment import spec as spec_lib
from bilinear_ir.experiment import validation
from bilinear_ir.studies import approximate_topk as approximate
from bilinear_ir.report import mol as report
from bilinear_ir.report import outputs
from bilinear_ir.report import text

BASELINES = ("wdp", "bilinear")


def mol_grid(config) -> list[dict[str, Any]]:
  """The MoL rows: [{"scorer": "mol", "p_q", "p_x", "d_p", "mi_weight"}] in table order."""
  return [{"scorer": "mol", "p_q": int(p), "p_x": int(p), "d_p": int(config.model.d_p),
           "mi_weight": float(a)} for p in config.components for a in config.mi_weights]


def _specs(config) -> list[dict[str, Any]]:
  return [{"scorer": b} for b in config.baselines] + mol_grid(config)


def validate(config) -> None:
  """Refuses a bad config before any work (`experiment.validation`)."""
  validation.check_table(config, hybrid_block=False)
  for name in config.baselines:
    validation.one_of(name, BASELINES, "baselines")
  validation.integers(config.components, "components", low=1)
  require(len(config.mi_weights) >= 1, "needs at least one MoL configuration",
          field="mi_weights")
  for alpha in config.mi_weights:
    validation.real(alpha, "mi_weights", 0.0)
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
  for s in _specs(config):
    validation.check_model(spec_lib.model_block(config.model, s))
  validation.check_train(spec_lib.Recipe.of(config, "").row(
      mol_grid(config)[0], 0, config.mol_train).train, "mol_train")


def run(config, workdir: str) -> outputs.Report:
  """The `mol` job (configs/mol.py)."""
  specs = _specs(config)
  measures = list(config.eval.measures)
  m0, sel = measures[0], config.train.select_metric
  rows, retrieval, unseen_counts = [], [], {}
  bar = progress.bar(len(config.embeddings) * len(specs) * len(config.seeds), "models",
                     unit="model")
  blank = {"p_q": None, "p_x": None, "d_p": None, "mi_weight": None}
  for recipe, prepared, (splitset, *_) in spec_lib.embeddings_of(config):
    emb_name, test = recipe.name, splitset.test
    base = {"embedding": emb_name, "mode": config.eval.mode, **blank}
    unseen = rows_lib.unseen_doc_queries([splitset])
    unseen_counts[emb_name] = len(unseen)
    dot, bm25, _ = rows_lib.baselines(recipe, prepared, [splitset], measures)
    rows += [{**base, **r} for r in rows_lib.baseline_rows(dot, bm25, unseen, measures)]
    rows[-2]["dev"] = {sel: rows_lib.dev_mean([dot], sel)}
    test_q = prepared.embeddings.queries[prepared.query_row_index(test.query_ids)]
    docs = prepared.embeddings.docs
    mol_runs = []
    for s in specs:
      entropies = []

      def each(seed, out, s=s, entropies=entropies):
        # aux_loss="auto" (the default) adds MoL's L_MI (`train.losses.mi_loss`).
        if s["scorer"] == "mol":
          entropies.append(approximate.gate_sample(out["module"], out["params"], test_q, docs,
                                                   int(config.gate_sample_docs), seed))
        bar.update(1)

      outs = rows_lib.seed_runs(recipe, s, config.seeds, prepared, splitset, each=each,
                                train=config.mol_train if s["scorer"] == "mol" else None,
                                workdir=workdir)
      row = {**base, **s, **rows_lib.summary(outs, measures, sel, unseen)}
      if s["scorer"] == "mol":
        h_p, h_cond = np.mean(entropies, axis=0)
        row.update(gate_entropy=float(h_p), gate_cond_entropy=float(h_cond),
                   l_mi=float(h_cond - h_p), temperature=[o["temperature"] for o in outs])
        mol_runs.append((row, outs))
      rows.append(row)
      bar.write(f"{emb_name:>4} {report.label(row):<36} test {m0} {row['metrics'][m0]:.4f} "
                f"+- {row['std'][m0]:.4f} (dev {sel} {text.fmt(row['dev'][sel], 4)})")
    best_row, best_outs = rows_lib.best_on_dev(mol_runs, lambda t: t[0]["dev"][sel])
    per_seed = [approximate.mol_costs(o["module"], o["params"], test_q, docs, config.retrieval)
                for o in best_outs]
    for i, first in enumerate(per_seed[0]):
      entry = {"embedding": emb_name, "model": report.label(best_row), "k": int(config.retrieval.k),
               "queries": len(test_q), "docs": prepared.collection.num_docs,
               "algorithm": first["algorithm"], "name": first["name"],
               "rescored": first["rescored"]}
      for key in ("hit_rate", "true_gap", "gap_bound", "gap_bound_retrieved", "bound_holds",
                  "fallback", "seconds", "time_vs_brute_force"):
        vals = [s[i][key] for s in per_seed]
        entry[key] = None if any(v is None for v in vals) else float(np.mean(vals))
      retrieval.append(entry)
  bar.close()
  best = rows_lib.best_on_dev([r for r in rows if r["scorer"] == "mol"], lambda r: r["dev"][sel])
  results = {"metrics": best["metrics"], "std": best["std"], "mode": best["mode"],
             "dev": best["dev"], "best": {k: best[k] for k in ("embedding", "p_q", "p_x", "d_p",
                                                               "mi_weight")},
             "best_steps": best["best_steps"], "scorer": "mol",
             "collection": prepared.collection.name, "test_queries": len(test.query_ids),
             "seeds": list(config.seeds), "unseen_doc_queries": unseen_counts, "rows": rows,
             "retrieval": retrieval}
  return outputs.Report(results=results,
                        markdown=report.markdown(rows, retrieval, unseen_counts, config))
