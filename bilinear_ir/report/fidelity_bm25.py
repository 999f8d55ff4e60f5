"""The fidelity_bm25 job's report: what a reader sees of its results (markdown, findings, figures).

The job (`bilinear_ir/jobs/fidelity_bm25.py`) runs and hands its results here.
"""
from __future__ import annotations

from typing import Any
import numpy as np
from bilinear_ir.report import text
from bilinear_ir.studies import fidelity_tasks


def plot_fig2(fig2: dict[str, Any], beta: float):
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  fig = Figure(figsize=(5.5, 4.2))
  ax = fig.subplots()
  pts = [(x, k) for x, k in zip(fig2["x_mean"], fig2["min_k"]) if k is not None]
  xmax = fig2["bins"][-1][1]
  xs = np.linspace(0, xmax, 100)
  if pts:
    ax.scatter(*zip(*pts), color="tab:blue", zorder=3, label="empirical min k (95% pairwise acc.)")
  ax.plot(xs, fig2["bound_slope"] * xs, color="tab:red",
          label=f"eq. (2): {fig2['bound_slope']:.2f} x (beta={beta})")
  if fig2["slope"]:
    ax.plot(xs, fig2["slope"] * xs, color="tab:blue", ls="--",
            label=f"fit: {fig2['slope']:.2f} x")
  ax.set_xlabel("(eps^2/2 - eps^3/3)^-1")
  ax.set_ylabel("minimum k")
  ax.set_title("Fig. 2: Rademacher projections vs BM25 pairwise rankings", fontsize=9)
  ax.legend(fontsize=8)
  fig.tight_layout()
  return fig


def plot_fig3a(fig3a: dict[str, Any]):
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  fig = Figure(figsize=(10, 4))
  axes = fig.subplots(1, 2)
  for ax, (name, title) in zip(axes, (("claims", "claims, docs binned by length (tokens)"),
                                      ("containing_passage", "containing passage, max length l"))):
    panel = fig3a[name]
    pos = np.arange(len(panel["bins"]))
    for j, r in enumerate(fig3a["ranks"]):
      qs = panel["margins"][str(r)]
      ok = [i for i, q in enumerate(qs) if q["n"]]
      if not ok:
        continue
      med = np.array([max(qs[i]["median"], fidelity_tasks.TIE) for i in ok])
      lo = med - np.array([max(qs[i]["q25"], fidelity_tasks.TIE) for i in ok])
      hi = np.array([max(qs[i]["q75"], fidelity_tasks.TIE) for i in ok]) - med
      ax.errorbar(pos[ok] + 0.1 * (j - 1), med, yerr=[lo, hi], fmt="o", capsize=3,
                  label=f"{r}th smallest")
    ax.set_yscale("log")
    ax.set_xticks(pos, panel["bins"], fontsize=8)
    ax.set_ylabel("normalized margin (median, quartiles)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
  fig.suptitle("Fig. 3a: normalized margins of the best BM25 doc per bin", fontsize=10)
  fig.tight_layout()
  return fig


def plot_fig3b(fig3b: dict[str, Any]):
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  fig = Figure(figsize=(10, 4))
  axes = fig.subplots(1, 2)
  for ax, name in zip(axes, ("claims", "containing_passage")):
    panel = fig3b[name]
    pos = np.arange(len(panel["bins"]))
    ks = [k if k is not None else np.nan for k in panel["min_k"]]
    ax.plot(pos, ks, "o-")
    ax.set_xticks(pos, panel["bins"], fontsize=8)
    ax.set_ylabel(f"minimum k for recall@{fig3b['recall_at']} >= {fig3b['target']}")
    ax.set_title(name.replace("_", " "), fontsize=9)
  fig.suptitle("Fig. 3b: projection dimension needed per document-length bin", fontsize=10)
  fig.tight_layout()
  return fig


def _g(x: Any, digits: int = 3) -> str:
  return text.fmt(x, digits, "g")


def markdown(res: dict[str, Any], config) -> str:
  c, f2, lc = res["collection"], res["fig2"], res["lemma1_check"]
  grid = res["k_grid"]
  out = ["# Random-projection fidelity to BM25 (paper 002, section 2)\n",
         f"Collection `{c['name']}`: {c['queries']} queries ({config.data.split}), "
         f"{c['docs']} docs, vocabulary {c['vocab']} ({config.tokenizer.kind} tokens, BM25 "
         f"{config.bm25.variant} k1={config.bm25.k1} b={config.bm25.b}). {res['projection']} "
         f"projections, {res['trials']['fig2']} trials (Fig. 2), {res['trials']['fig3b']} "
         f"(Fig. 3b), k grid {grid[0]}..{grid[-1]} ({len(grid)} values).\n",
         "## Minimum normalized margin\n",
         text.markdown_table([["BM25", _g(res["min_margin"]["bm25"]), "6.8e-06"],
                         ["boolean", _g(res["min_margin"]["boolean"]), "0.0169"]],
                        ["model", "this collection", "paper (TREC-CAR)"]),
         "## Fig. 2: minimum k for pairwise accuracy >= "
         f"{1 - config.beta:.2f} vs (eps^2/2 - eps^3/3)^-1\n"]
  rows = []
  for b, xm, n, k, bk in zip(f2["bins"], f2["x_mean"], f2["triples"], f2["min_k"], f2["bound_k"]):
    rows.append([f"{b[0]:.0f}-{b[1]:.0f}", _g(xm, 4), n, _g(k), _g(bk, 4),
                 _g(bk / k if (k and bk) else None)])
  out.append(text.markdown_table(rows, ["x bin", "mean x", "triples", "min k", "eq. (2) k",
                                   "eq. (2) / min k"]))
  tight = (f"Least-squares slope of min k vs x (through 0): **{_g(f2['slope'], 4)}**; eq. (2)'s "
           f"slope 2 ln(4/beta) = {f2['bound_slope']:.2f}, so the bound is tight up to a factor "
           f"of **{_g(f2['tightness'], 3)}** on this collection (the paper: tight up to a "
           "constant factor, min k growing linearly in (eps^2/2 - eps^3/3)^-1). Bins whose triples "
           f"need more than k = {grid[-1]} show '-'; min k cannot go below the grid's "
           f"{grid[0]}.\n")
  out.append(tight)
  out.append("## Lemma 1 check\n")
  out.append(text.markdown_table(
      [[f"largest grid k = {lc['k']}", lc["triples"], _g(lc["empirical_error"]),
        _g(lc["upper95"])],
       ["each triple's eq. (2) k", lc["triples"], _g(lc["own_k_error"]),
        _g(lc["own_k_upper95"])]],
      ["evaluated at", "triples", f"error rate (beta = {lc['beta']})", "95% upper bound"]))
  out.append(f"Worst single triple at its own eq. (2) k: error rate "
             f"{_g(lc['own_k_max_triple_error'])} over {lc['trials']} trials.\n")
  for name in ("claims", "containing_passage"):
    a, b = res["fig3a"][name], res["fig3b"][name]
    out.append(f"## Fig. 3a / 3b: {name.replace('_', ' ')}\n")
    header = ["bin", "docs"] + [f"{r}th smallest margin (median)" for r in res["fig3a"]["ranks"]]
    header += ["queries", f"min k recall@{res['fig3b']['recall_at']} >= {res['fig3b']['target']}"]
    rows = []
    for i, label in enumerate(a["bins"]):
      rows.append([label, a["docs"][i]]
                  + [_g(a["margins"][str(r)][i]["median"]) for r in res["fig3a"]["ranks"]]
                  + [b["queries"][i], _g(b["min_k"][i])])
    out.append(text.markdown_table(rows, header))
    if name == "containing_passage" and a["bins"]:
      out.append("Exact BM25 MRR@10 of the source passage: " + ", ".join(
          f"{l}: {_g(m)}" for l, m in zip(a["bins"], a["bm25_mrr10"])) + "\n")
  return "\n".join(out)
