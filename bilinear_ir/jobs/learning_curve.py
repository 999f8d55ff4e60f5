"""How many judged queries does a learned similarity need? Learning curves over nested subsets.

For each embedding, every model is trained on nested subsets of the training queries (n =
`config.sizes`, drawn per seed by `studies.curve_subsets.nested_subsets`), selected on the dev split
and evaluated on every test query over the full corpus. "learned" is, per seed, the candidate
best on dev among dot and the trained models. Per n and model: paired tests against dot over all
test queries and over the unseen-answer ones (`studies.curve_subsets.unseen_answer_queries`), each
Holm-adjusted over the n of the curve (one family per embedding, model and view). Beside the
curve, per embedding, the hybrid of dot with BM25 (lam chosen on dev) and the learned similarity
at the largest n compared with it on every test query.
"""
from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from bilinear_ir import progress
from bilinear_ir.errors import require
from bilinear_ir.eval import stats
from bilinear_ir.experiment import compare
from bilinear_ir.experiment import evaluate
from bilinear_ir.experiment import rows as rows_lib
from bilinear_ir.experiment import spec as spec_lib
from bilinear_ir.experiment import training
from bilinear_ir.experiment import validation
from bilinear_ir.studies import curve_subsets as curve
from bilinear_ir.report import learning_curve as report
from bilinear_ir.report import outputs

MODELS = ("wdp", "lowrank", "bilinear", "mol")


def schedule(config, train, pairs: int, mol: bool) -> dict[str, Any]:
  """The `train` changes of one run on `pairs` judged pairs: `train.epochs` epochs of
  `train.batch_size` pairs, at most `config.max_steps` steps, `config.evals` dev evaluations
  (plus step 0); MoL rows also take `config.mol_train`."""
  steps = min(int(train.epochs) * math.ceil(pairs / int(train.batch_size)),
              int(config.max_steps))
  changes = {"steps": steps, "eval_every": max(1, steps // int(config.evals))}
  return {**changes, **(dict(config.mol_train) if mol else {})}


def validate(config) -> None:
  """Refuses a bad config before any work (`experiment.validation`)."""
  validation.check_collection(config.collection, path=config.data.path)
  validation.check_table(config)
  validation.integers(config.sizes, "sizes", low=1)
  validation.integers(config.ranks, "ranks", low=1)
  validation.integer(config.max_steps, "max_steps", 1)
  validation.integer(config.evals, "evals", 1)
  require(len(config.models) > 0, "must name at least one trained model", field="models")
  for name in config.models:
    validation.one_of(name, MODELS, "models")
  for s in spec_lib.model_specs(config.models, config.ranks, config.mol):
    validation.check_model(spec_lib.model_block(config.model, s))
  validation.check_train(spec_lib.Recipe.of(config, "").row(
      {"scorer": "mol"}, 0, config.mol_train).train, "mol_train")


def run(config, workdir: str) -> outputs.Report:
  """The `learning_curve` job (configs/learning_curve.py). Each training run checkpoints in its
  own folder under `workdir/runs` (`training.run_dir`): a killed job's rerun resumes there."""
  measures = list(config.eval.measures)
  m0, sel = measures[0], config.train.select_metric
  specs = spec_lib.model_specs(config.models, config.ranks, config.mol)
  rows, unseen_queries, collection, hybrids = [], {}, None, {}
  for recipe, prepared, (splitset, *_) in spec_lib.embeddings_of(
      config, spec_lib.collection_block(config.data, config.collection)):
    collection = prepared.collection.name
    train = splitset.train
    require(len(train.query_ids) > 0, f"{collection} has no training queries",
            field="collection")
    sizes = curve.sizes_of(config.sizes, len(train.query_ids))
    subsets = {s: curve.nested_subsets(train.query_ids, sizes, s) for s in config.seeds}
    bar = progress.bar(len(sizes) * len(config.seeds) * len(specs), f"{collection} / "
                       f"{recipe.name}", unit="model")
    for n in sizes:  # known before any training: a view of < 2 queries is marked empty
      unseen_queries[n] = curve.unseen_answer_queries(
          train, [subsets[s][n] for s in config.seeds], splitset.test)
      if len(unseen_queries[n]) < 2:
        bar.write(f"n={n}: {len(unseen_queries[n])} unseen-answer test queries: view empty")
    dot = training.train_and_evaluate(recipe.row({"scorer": "dot"}, recipe.seed), prepared,
                                      splitset, progress=False)
    base = {"collection": collection, "embedding": recipe.name}
    lam, res = evaluate.HybridEvaluator(splitset.dev, prepared.collection.doc_ids, config.hybrid,
                                        measures)(
        evaluate.full_corpus(dot["module"], dot["params"], prepared, config.hybrid.depth),
        {"test": splitset.test})
    hyb = res["test"][0]
    hybrids[recipe.name] = {"metrics": hyb["mean"], "lambda": lam,
                            "per_query": {q: v[m0] for q, v in hyb["per_query"].items()}}
    for n in sizes:
      outs: dict[str, list[dict[str, Any]]] = {s["name"]: [] for s in specs}
      outs["learned"], chosen = [], []
      for seed in config.seeds:
        cut = curve.subset_splitset(splitset, subsets[seed][n], n)
        pairs = curve.positive_pairs(cut.train)
        candidates = [("dot", dot)]
        for s in specs:
          started = time.perf_counter()
          row = recipe.row(s, seed, schedule(config, recipe.train, pairs, s["scorer"] == "mol"))
          out = training.train_and_evaluate(
              row, prepared, cut, workdir=training.run_dir(
                  workdir, row, prepared, cut, f"{recipe.name}-n{n}-seed{seed}-{s['name']}"),
              progress=False)
          out["seconds"] = time.perf_counter() - started
          outs[s["name"]].append(out)
          candidates.append((s["name"], out))
          bar.update(1)
        name, out = rows_lib.best_on_dev(candidates, lambda t: t[1]["dev"].get(sel))
        # The learned row costs every candidate's training, not only the chosen one's.
        outs["learned"].append({**out, "seconds": sum(c.get("seconds", 0.0)
                                                      for _, c in candidates[1:])})
        chosen.append(name)
      rows.append(_row(base, "dot", n, [dot], measures, sel))
      for name, model_outs in outs.items():
        rows.append(_row(base, name, n, model_outs, measures, sel))
      rows[-1]["chosen"] = chosen
      bar.write(f"{recipe.name:>10} n={n:<6} dot {dot['metrics'][m0]:.4f}  " + "  ".join(
          f"{r['model']} {r['metrics'][m0]:.4f}" for r in rows[-len(outs):]))
    bar.close()
  _compare_curve(rows, unseen_queries, config)
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
             "crossover": crossover, "hybrid_dot_bm25": hybrids, "collection": collection,
             "measure": m0, "negatives": {"from": config.train.negatives_from,
                                         "hard_depth": int(config.train.hard_depth)},
             "seeds": list(config.seeds), "sizes": sorted(unseen_queries),
             "holm": "over the n of the curve: one family per embedding, model and view (all "
                     "test queries; unseen-answer queries)",
             "learned": "per seed, the candidate best on dev among dot and the trained models"}
  return outputs.Report(results=results, markdown=report.markdown(results, config),
                        figures={"learning_curve": report.plot(results, config)})


def _row(base: dict[str, Any], model: str, n: int, outs: list[dict[str, Any]], measures,
         sel: str) -> dict[str, Any]:
  """One point of the curve: test metrics averaged over seeds (per query, then over queries),
  the first measure per query (mean over seeds), the dev metric."""
  return {**base, "model": model, "n_train": n, "seeds": len(outs),
          "metrics": rows_lib.query_means([o["per_query"] for o in outs], measures),
          "per_query": rows_lib.seed_mean([o["per_query"] for o in outs], measures[0]),
          "dev": {sel: rows_lib.dev_mean(outs, sel)},
          "best_steps": [int(o["best_step"]) for o in outs],
          "seconds": round(sum(o.get("seconds", 0.0) for o in outs), 1)}


def _compare_curve(rows: list[dict[str, Any]], unseen: dict[int, list[str]], config) -> None:
  """`row["vs_dot"]` and `row["unseen"]` ({"n_queries", "mean", "vs_dot"}; "empty": True and no
  "vs_dot" with fewer than 2 unseen-answer queries) for every row but dot's, against dot at the
  same n; Holm over the curve of each (embedding, model, view)."""
  dots = {(r["embedding"], r["n_train"]): r for r in rows if r["model"] == "dot"}
  groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
  for r in rows:
    sub = unseen[r["n_train"]]
    r["unseen"] = {"n_queries": len(sub),
                   "mean": float(np.mean([r["per_query"][q] for q in sub])) if sub else None}
    if len(sub) < 2:  # the view is empty: no paired test, no crossover at this n
      r["unseen"]["empty"] = True
    if r["model"] != "dot":
      groups.setdefault((r["embedding"], r["model"]), []).append(r)
  for members in groups.values():
    base = [dots[r["embedding"], r["n_train"]] for r in members]
    k = len(members)
    paired = lambda i: i + k if i < k else None
    compare.add_paired(members + base, [r["per_query"] for r in members + base], paired,
                       "vs_dot", config)
    holders = [r["unseen"] for r in members] + [{} for _ in base]
    subsets = [{q: r["per_query"][q] for q in unseen[r["n_train"]]} for r in members + base]
    compare.add_paired(holders, subsets,
                       lambda i: paired(i) if i < k and len(subsets[i]) >= 2 else None,
                       "vs_dot", config)
