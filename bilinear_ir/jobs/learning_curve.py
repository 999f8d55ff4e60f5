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
from bilinear_ir.jobs import report

JOB = "learning_curve"
MODELS = ("wdp", "lowrank", "bilinear", "mol")
Y_LINEAR = 0.05  # the plot's y axis: linear within +-0.05 nDCG of dot, logarithmic beyond
Y_TICKS = (-0.4, -0.2, -0.1, -0.05, -0.02, 0.0, 0.02, 0.05, 0.1, 0.2, 0.4)


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


def run(config, workdir: str) -> report.Report:
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
      unseen_queries[n] = curve.unseen_answer_queries(
          train, [subsets[s][n] for s in config.seeds], splitset.test)
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
             and stats.mark(r["unseen"]["vs_dot"], config.stats.alpha) == stats.GAIN]
    crossover[emb] = min(gains) if gains else None
  results = {"rows": rows, "unseen_queries": {str(n): q for n, q in unseen_queries.items()},
             "crossover": crossover, "hybrid_dot_bm25": hybrids, "collection": collection,
             "measure": m0,
             "seeds": list(config.seeds), "sizes": sorted(unseen_queries),
             "holm": "over the n of the curve: one family per embedding, model and view (all "
                     "test queries; unseen-answer queries)",
             "learned": "per seed, the candidate best on dev among dot and the trained models"}
  return report.Report(results=results, markdown=markdown(results, config),
                       figures={"learning_curve": plot(results, config)})


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
  """`row["vs_dot"]` and `row["unseen"]` ({"n_queries", "mean", "vs_dot"}) for every row but
  dot's, against dot at the same n; Holm over the curve of each (embedding, model, view)."""
  dots = {(r["embedding"], r["n_train"]): r for r in rows if r["model"] == "dot"}
  groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
  for r in rows:
    sub = unseen[r["n_train"]]
    r["unseen"] = {"n_queries": len(sub),
                   "mean": float(np.mean([r["per_query"][q] for q in sub])) if sub else None}
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


def markdown(results: dict[str, Any], config) -> str:
  """Per embedding: the curve of every model (metric, difference against dot) on all test
  queries and on the unseen-answer ones; the crossover per embedding."""
  m0, alpha = results["measure"], config.stats.alpha
  rows = results["rows"]
  out = [report.prose(JOB, "intro", collection=results["collection"], m0=m0,
                      seeds=len(results["seeds"]), alpha=alpha)]
  for emb in config.embeddings:
    mine = [r for r in rows if r["embedding"] == emb]
    models = list(dict.fromkeys(r["model"] for r in mine))
    out.append(f"\n## {results['collection']} / {emb}\n\n")
    for view, title in (("all", "all test queries"), ("unseen", "unseen-answer test queries")):
      table = []
      for n in results["sizes"]:
        at = {r["model"]: r for r in mine if r["n_train"] == n}
        cells = [n, at["dot"]["unseen"]["n_queries"] if view == "unseen"
                 else len(at["dot"]["per_query"])]
        for m in models:
          r = at[m]
          value = r["metrics"][m0] if view == "all" else r["unseen"]["mean"]
          test = r.get("vs_dot") if view == "all" else r["unseen"].get("vs_dot")
          cells.append(report.fmt(value, 4) + ("" if m == "dot" else " (" + report.fmt_paired(
              test, alpha, ci=False) + ")"))
        table.append(cells)
      out.append(f"{m0}, {title}:\n\n")
      out.append(report.markdown_table(table, ["n", "queries"] + models) + "\n")
    learned = [r for r in mine if r["model"] == "learned"]
    out.append("Chosen on dev (`learned`, per seed): " + "; ".join(
        f"n={r['n_train']}: {'+'.join(r['chosen'])}" for r in learned) + ".\n")
  for emb, h in results["hybrid_dot_bm25"].items():
    out.append(report.prose(JOB, "hybrid", emb=emb, m0=m0, value=h["metrics"][m0],
                            lam=h["lambda"], n=h["learned_vs_hybrid"]["n_train"],
                            versus=report.fmt_paired(h["learned_vs_hybrid"], alpha)))
  out.append("\n" + report.prose(JOB, "crossover", m0=m0, crossover="; ".join(
      f"{e}: {'n = ' + str(n) if n is not None else 'none'}"
      for e, n in results["crossover"].items())))
  return "".join(out)


def plot(results: dict[str, Any], config):
  """nDCG@10 difference against dot with its 95% CI against n (log axis): one line per model,
  one row of panels per embedding (all test queries; unseen-answer queries).

  A panel whose differences reach beyond +-`Y_LINEAR` gets a y axis linear within it and
  logarithmic beyond, so that one line far from dot (MoL from scratch, -0.4 at n = 100 on
  InsuranceQA) does not flatten the others; other panels stay linear.
  """
  import matplotlib  # pylint: disable=g-import-not-at-top
  import matplotlib.ticker  # pylint: disable=g-import-not-at-top,unused-import
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  rows, embs = results["rows"], list(config.embeddings)
  fig, axes = plt.subplots(len(embs), 2, figsize=(11, 3.6 * len(embs)), squeeze=False,
                           sharex=True)
  for axs, emb in zip(axes, embs):
    mine = [r for r in rows if r["embedding"] == emb and r["model"] != "dot"]
    for ax, view in zip(axs, ("all", "unseen")):
      for j, model in enumerate(dict.fromkeys(r["model"] for r in mine)):
        pts = [r for r in mine if r["model"] == model]
        tests = [r["vs_dot"] if view == "all" else r["unseen"].get("vs_dot") for r in pts]
        kept = [(r, t) for r, t in zip(pts, tests) if t]
        if not kept:
          continue
        pts, tests = zip(*kept)
        x = [r["n_train"] * (1.0 + 0.03 * (j - 2)) for r in pts]  # dodge the error bars
        d = [t["diff"] for t in tests]
        ax.errorbar(x, d, yerr=[[t["diff"] - t["ci95"][0] for t in tests],
                                [t["ci95"][1] - t["diff"] for t in tests]],
                    fmt="o-" if model == "learned" else ".--", capsize=2, label=model,
                    lw=2.0 if model == "learned" else 1.0)
      ax.axhline(0.0, color="black", lw=0.8)
      ax.set_xscale("log")
      lo, hi = ax.get_ylim()
      if lo < -Y_LINEAR or hi > Y_LINEAR:
        ax.set_yscale("symlog", linthresh=Y_LINEAR, linscale=0.4)
        lo, hi = ax.get_ylim()
        ax.set_yticks([t for t in Y_TICKS if lo <= t <= hi])
        ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
      ax.set_title(f"{emb}: {'all' if view == 'all' else 'unseen-answer'} test queries",
                   fontsize=10)
      ax.set_ylabel(f"{results['measure']} - dot" + (" (symlog)" if ax.get_yscale() == "symlog"
                                                     else ""))
      ax.set_xlabel("training queries n")
    axs[0].legend(fontsize=7)
  fig.tight_layout()
  return fig
