"""The learning_curve job's report: what a reader sees of its results (markdown, findings, figures).

The job (`bilinear_ir/jobs/learning_curve.py`) runs and hands its results here.
"""
from __future__ import annotations

from typing import Any

from bilinear_ir.experiment import finetuning
from bilinear_ir.report import text


JOB = "learning_curve"  # the job; its fixed prose is templates/<JOB>.md
Y_LINEAR = 0.05  # the plot's y axis: linear within +-0.05 nDCG of dot, logarithmic beyond


Y_TICKS = (-0.4, -0.2, -0.1, -0.05, -0.02, 0.0, 0.02, 0.05, 0.1, 0.2, 0.4)


def markdown(results: dict[str, Any], config) -> str:
  """Per embedding: the curve of every model (metric, difference against dot) on all test
  queries and on the unseen-answer ones; the crossover per embedding."""
  m0, alpha = results["measure"], config.stats.alpha
  rows = results["rows"]
  out = [text.prose(JOB, "intro", collection=results["collection"], m0=m0,
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
          cells.append(text.fmt(value, 4) + ("" if m == "dot" else " (" + text.fmt_paired(
              test, alpha, ci=False) + ")"))
        table.append(cells)
      out.append(f"{m0}, {title}:\n\n")
      out.append(text.markdown_table(table, ["n", "queries"] + models) + "\n")
    learned = [r for r in mine if r["model"] == "learned"]
    out.append("Chosen on dev (`learned`, per seed): " + "; ".join(
        f"n={r['n_train']}: {'+'.join(r['chosen'])}" for r in learned) + ".\n")
    out.append(_fit_table(mine, results["sizes"], config))
    out.append(_recovered_table(mine, results["sizes"], m0))
  for emb, h in results["hybrid_dot_bm25"].items():
    out.append(text.prose(JOB, "hybrid", emb=emb, m0=m0, value=h["metrics"][m0],
                            lam=h["lambda"], n=h["learned_vs_hybrid"]["n_train"],
                            versus=text.fmt_paired(h["learned_vs_hybrid"], alpha)))
  out.append("\n" + text.prose(JOB, "crossover", m0=m0, crossover="; ".join(
      f"{e}: {'n = ' + str(n) if n is not None else 'none'}"
      for e, n in results["crossover"].items())))
  return "".join(out)


def _fit_table(rows: list[dict[str, Any]], sizes: list[int], config) -> str:
  """The rows' fit to their own training questions against their gain on dev, per n (rows with
  "fit", `experiment.rows.training_fit`); "" when none has it."""
  sel = config.train.select_metric
  fitted = list(dict.fromkeys(r["model"] for r in rows if "fit" in r))
  if not fitted:
    return ""
  table = []
  for n in sizes:
    at = {r["model"]: r for r in rows if r["n_train"] == n}
    dot_dev = at["dot"]["dev"][sel]
    table.append([n] + [
        f"{text.fmt_diff(at[m]['fit']['selected'] - at[m]['fit']['step0'])} / "
        f"{text.fmt_diff(at[m]['dev'][sel] - dot_dev)}" if m in at and "fit" in at[m] else "-"
        for m in fitted])
  return (text.prose(JOB, "fit", sel=sel, k=config.runner.fit_queries) + "\n"
          + text.markdown_table(table, ["n"] + fitted) + "\n")


def _recovered_table(rows: list[dict[str, Any]], sizes: list[int], m0: str) -> str:
  """Per n, the fraction of the two-tower fine-tune's gain over dot that each row recovers,
  all test queries / unseen-answer ones (rows with "recovered", `compare.recovered`: a curve
  with finetunes=...+two_tower); "" when the rows have none."""
  if not any("recovered" in r for r in rows):
    return ""
  models = [m for m in dict.fromkeys(r["model"] for r in rows)
            if m not in ("dot", finetuning.REFERENCE)]
  table = []
  for n in sizes:
    at = {r["model"]: r["recovered"] for r in rows if r["n_train"] == n}
    table.append([n] + [f"{text.fmt(at[m]['all'], 2)} / {text.fmt(at[m].get('unseen'), 2)}"
                        for m in models])
  return (text.prose(JOB, "recovered", m0=m0) + "\n"
          + text.markdown_table(table, ["n"] + models) + "\n")


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
