"""The study job's report: what a reader sees of its results (markdown, findings, figures).

The job (`bilinear_ir/jobs/study.py`) runs and hands its results here.
"""
from __future__ import annotations

from typing import Any
from bilinear_ir.eval import stats
from bilinear_ir.report import text


def markdown(results: dict[str, Any], config) -> str:
  """The study table per collection and embedding, the pooled unseen-doc view, the summary."""
  m0, alpha = results["measure"], config.stats.alpha
  out = ["# Where does a learned similarity beat the dot product?\n\n",
         text.prose("study", "intro", m0=m0, seeds=len(results["seeds"]), alpha=alpha)]
  rows = results["rows"]
  seen = []
  for r in rows:
    if (r["collection"], r["embedding"]) in seen:
      continue
    seen.append((r["collection"], r["embedding"]))
    mine = [x for x in rows if (x["collection"], x["embedding"]) == seen[-1]]
    folds = f"{mine[0]['folds']}-fold CV" if mine[0]["folds"] else "its train / test split"
    n_unseen = mine[0]["unseen_doc"]["n_queries"]
    out.append(f"\n## {r['collection']} / {r['embedding']} ({mine[0]['n_queries']} queries, "
               f"{folds}; {n_unseen} unseen-doc)\n\n")
    table = [[x["model"], f"{x['metrics'][m0]:.4f}", text.fmt_paired(x.get("vs_dot"), alpha),
              text.fmt_paired(x.get("vs_bm25"), alpha),
              text.fmt(x["unseen_doc"]["mean"], 4),
              text.fmt_paired(x["unseen_doc"].get("vs_dot"), alpha)] for x in mine]
    out.append(text.markdown_table(table, ["model", m0, "vs dot", "vs BM25", "unseen-doc",
                                             "unseen-doc vs dot"]))
  out.append("\n## Unseen-doc queries pooled over collections\n\n")
  out.append(text.markdown_table(
      [[e["embedding"], e["model"], e["n_queries"], text.fmt_paired(e.get("vs_dot"), alpha)]
       for e in results["pooled_unseen_doc"]], ["embedding", "model", "queries", "vs dot"]))
  n_cells = len(seen)
  out.append(f"\n## Summary (over {n_cells} collection x embedding cells)\n\n")
  for model, c in results["summary"].items():
    out.append(f"- **{model}**: significantly better than dot on {c['better']}, tied on "
               f"{c['tied']}, significantly worse on {c['worse']}.\n")
  return "".join(out)


def forest_plot(rows: list[dict[str, Any]], config):
  """Difference against dot with its 95% CI: one panel per model, one line per collection x
  embedding (filled marker: significant after Holm)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  models = [m for m in dict.fromkeys(r["model"] for r in rows) if m != "dot"]
  cells = list(dict.fromkeys((r["collection"], r["embedding"]) for r in rows))
  ncols = min(len(models), 5)
  nrows = -(-len(models) // ncols)
  fig, axes = plt.subplots(nrows, ncols, sharex=True, sharey=True, squeeze=False,
                           figsize=(2.6 * ncols, nrows * (0.3 * len(cells) + 1.2)))
  by = {(r["collection"], r["embedding"], r["model"]): r for r in rows}
  for ax, model in zip(axes.flat, models):
    for i, (coll, emb) in enumerate(cells):
      c = by[coll, emb, model]["vs_dot"]
      sig = stats.mark(c, config.stats.alpha) != stats.TIE
      ax.errorbar(c["diff"], i, xerr=[[c["diff"] - c["ci95"][0]], [c["ci95"][1] - c["diff"]]],
                  fmt="o", color="tab:red" if c["diff"] < 0 else "tab:blue",
                  mfc=None if sig else "white", capsize=2)
    ax.axvline(0.0, color="black", lw=0.8)
    ax.set_title(model, fontsize=9)
    ax.set_xlabel(f"{config.eval.measures[0]} - dot", fontsize=8)
    ax.xaxis.set_tick_params(labelbottom=True)
  for ax in axes.flat[len(models):]:
    ax.set_visible(False)
  axes[0][0].set_yticks(range(len(cells)))
  axes[0][0].set_yticklabels([f"{c} / {e}" for c, e in cells])
  axes[0][0].invert_yaxis()
  for ax in axes[:, 0]:
    ax.tick_params(axis="y", labelsize=8)
  fig.tight_layout()
  return fig
