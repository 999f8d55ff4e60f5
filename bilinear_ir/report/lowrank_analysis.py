"""The lowrank_analysis job's report: what a reader sees of its results (markdown, findings,
figures).

The job (`bilinear_ir/jobs/lowrank_analysis.py`) runs and hands its results here.
"""
from __future__ import annotations

import functools
from typing import Any
import numpy as np
from bilinear_ir import lowrank
from bilinear_ir.config import embedding_specs
from bilinear_ir.studies import truncation
from bilinear_ir.report import text


JOB = "lowrank_analysis"  # the job; its fixed prose is templates/<JOB>.md
# Paper 000, section 5 (MS MARCO, n = 768, MRR@10): share of the full W's MRR@10 per rank, and
# the spectrum of its learned W.
PAPER = {"collection": "MS MARCO", "n": 768, "measure": "mrr@10",
         "share": {32: 0.508, 64: 0.689, 96: 0.861},
         "mrr@10": {32: 0.0417, 64: 0.0565, 96: 0.0707},
         "params": {96: 73_728, "full": 589_824},
         "sigma_first": 5.467, "sigma_last": 0.0004,
         "gains": {"2->16": 1.35, "16->64": 0.75, "96->full": 0.25}}


PROCEDURE = ("SVD truncation W_r of one trained full W per embedding and seed (the paper's Fig. 1 "
             "procedure); not the reproduce_table job's low-rank rows, which train P Q^T at each "
             "rank")


def _pct(x: float | None) -> str:
  return "-" if x is None else f"{100 * x:.1f}%"


def markdown(results: dict[str, Any], config) -> str:
  """The per-rank table of each embedding, the Theorem 3 checks, rank selection, findings."""
  measures = list(config.eval.measures)
  m0 = measures[0]
  out = ["# Low-rank truncation of a trained full bilinear W (paper 000, section 5)\n\n",
         text.prose(JOB, "intro", procedure=PROCEDURE[0].upper() + PROCEDURE[1:],
                      collection=results["collection"], dev=results["dev_queries"],
                      test=results["test_queries"], n_seeds=len(results["seeds"]),
                      seeds=results["seeds"])]
  for emb, e in results["embeddings"].items():
    n = e["dim"]
    header = (["rank", "σ_{r+1}", "σ_{r+1}/σ_1", "energy kept", "params n·r",
               "stored 2n·r", "n²/(n·r)", f"dev {m0}"] + [f"test {m}" for m in measures]
              + [f"% of full (test {m0})", "mean err/bound", "max err/bound"])
    rows = [["full W", "-", "-", "100%", n * n, n * n, "1.0", f"{e['full']['dev'][m0]:.4f}"]
            + [f"{e['full']['test'][m]:.4f}" for m in measures] + ["100%", "-", "-"]]
    for r in e["by_rank"]:
      pw = r["pointwise"]
      rows.append([r["rank"], f"{r['sigma_next']:.4g}", f"{r['sigma_next_over_sigma1']:.3g}",
                   _pct(r["energy"]), r["params_paper"], r["params_stored"],
                   f"{r['compression_paper']:.1f}", f"{r['dev'][m0]:.4f}"]
                  + [f"{r[m]:.4f}" for m in measures]
                  + [_pct(r["share_of_full"]),
                     "-" if pw["error_over_bound_mean"] is None
                     else f"{pw['error_over_bound_mean']:.3g}",
                     "-" if pw["error_over_bound_max"] is None
                     else f"{pw['error_over_bound_max']:.3g}"])
    what = embedding_specs.describe_embedding(emb, config.encoder.model)
    out.append(f"\n## {emb}: {what}, n = {n}\n\n")
    out.append(text.markdown_table(rows, header))
    sel = e["rank_selection"]
    srows = [[f"spectrum: {s['criterion']} {s['target']:g}", s["rank"], f"{s['dev']:.4f}",
              f"{s['test']:.4f}", _pct(s["share_of_full"])] for s in sel["spectrum"]]
    srows.append(["best on dev", sel["best_dev"]["rank"], f"{sel['best_dev']['dev']:.4f}",
                  f"{sel['best_dev']['test']:.4f}", _pct(sel["best_dev"]["share_of_full"])])
    srows.append(["best on test", sel["best_test"]["rank"], f"{sel['best_test']['dev']:.4f}",
                  f"{sel['best_test']['test']:.4f}", _pct(sel["best_test"]["share_of_full"])])
    reach = sel["smallest_reaching_share_dev"]
    if reach is not None:
      srows.append([f"smallest r with dev >= {_pct(reach['share'])} of full", reach["rank"],
                    f"{reach['dev']:.4f}", f"{reach['test']:.4f}",
                    _pct(reach["share_of_full"])])
    out.append("\n" + text.prose(JOB, "selection") + "\n")
    out.append(text.markdown_table(srows, ["rule", "rank", f"dev {m0}", f"test {m0}",
                                             f"% of full (test {m0})"]))
  out.append("\n" + findings(results, config))
  return "".join(out)


def findings(results: dict[str, Any], config) -> str:
  """What the numbers say, computed from them, next to the paper's section 5."""
  m0 = config.eval.measures[0]
  g3 = functools.partial(text.fmt, digits=3, style="g")
  lines = ["## What the numbers say\n\n"]
  for emb, e in results["embeddings"].items():
    s = e["spectrum"]
    n = e["dim"]
    by_energy = {t: lowrank.select_rank(np.asarray(s), t, "energy") for t in (0.5, 0.9, 0.99)}
    vals = [r[m0] for r in e["by_rank"]]
    rising = all(b >= a - 1e-9 for a, b in zip(vals, vals[1:]))
    shares = ", ".join(
        f"r={r}: {_pct(truncation.share_at(e, r, m0))} of {m0}"
        + (f" / {_pct(truncation.share_at(e, r, 'mrr@10'))} of mrr@10"
           if "mrr@10" in config.eval.measures and m0 != "mrr@10" else "")
        for r in PAPER["share"] if truncation.share_at(e, r, m0) is not None)
    sel = e["rank_selection"]
    spec = ", ".join(f"{x['criterion']} {x['target']:g} -> r={x['rank']} "
                     f"({_pct(x['share_of_full'])})" for x in sel["spectrum"])
    reach = sel["smallest_reaching_share_dev"]
    gains = [(k, truncation.gain(e, a, b, "mrr@10" if "mrr@10" in config.eval.measures else m0))
             for k, (a, b) in (("2->16", (2, 16)), ("16->64", (16, 64)), ("96->n", (96, n)))]
    wr = e["witness_error_over_bound_range"]
    lines.append(text.prose(
        JOB, "bullet", emb=emb, best_steps=e["best_steps"], distance=e["distance_from_identity"],
        first=s[0], last=s[-1], orders=g3(e["spectrum_decay_orders"]),
        paper_first=PAPER["sigma_first"], paper_last=PAPER["sigma_last"],
        median=float(np.median(s)), e50=by_energy[0.5], e90=by_energy[0.9],
        e99=by_energy[0.99], n=n, shares=shares, m0=m0,
        rising="rises monotonically" if rising else "does not rise monotonically",
        gains=", ".join(f"{k}: {g:+.0%}" for k, g in gains if g is not None), spec=spec,
        best_dev=sel["best_dev"]["rank"], best_dev_share=_pct(sel["best_dev"]["share_of_full"]),
        best_test=sel["best_test"]["rank"],
        reach="" if reach is None else text.prose(
            JOB, "reach", share=_pct(reach["share"]), rank=reach["rank"],
            test_share=_pct(reach["share_of_full"]),
            compression=n / reach["rank"]).rstrip("\n"),
        checks=e["pointwise_checks"], pairs=e["pointwise_pairs"], n_ranks=len(e["by_rank"]),
        violations=e["pointwise_violations"], max_ratio=e["max_error_over_bound"],
        mean_ratio=g3(e["mean_error_over_bound"]),
        mean_top=g3(e["mean_error_over_bound_top"]),
        mean_random=g3(e["mean_error_over_bound_random"]),
        mean_pct=_pct(e["mean_error_over_bound"]),
        witness="-" if wr is None else f"{wr[0]:.7f} to {wr[1]:.7f}"))
  lines.append("\n" + text.prose(
      JOB, "total", checks=results["pointwise_checks"], violations=results["pointwise_violations"],
      tolerance=results["pointwise_tolerance"], max_ratio=results["max_error_over_bound"]))
  return "".join(lines)


def figures(results: dict[str, Any], config) -> dict[str, Any]:
  """Fig. 1a (metric vs rank), 1b (metric vs sigma_{r+1}, log x), 1c (spectrum, log y)."""
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top
  m0 = config.eval.measures[0]
  colors = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
  fig_a, fig_b, fig_c = (Figure(figsize=(5.5, 4)) for _ in range(3))
  ax_a, ax_b, ax_c = fig_a.subplots(), fig_b.subplots(), fig_c.subplots()
  for i, (emb, e) in enumerate(results["embeddings"].items()):
    c = colors[i % len(colors)]
    ranks = [r["rank"] for r in e["by_rank"]]
    ax_a.plot(ranks, [r[m0] for r in e["by_rank"]], "o-", color=c, label=f"{emb}: W_r test")
    ax_a.plot(ranks, [r["dev"][m0] for r in e["by_rank"]], "s--", color=c, alpha=0.6,
              label=f"{emb}: W_r dev")
    ax_a.axhline(e["full"]["test"][m0], color=c, ls=":", label=f"{emb}: full W test")
    pts = [r for r in e["by_rank"] if r["sigma_next"] > 0]
    ax_b.plot([r["sigma_next"] for r in pts], [r[m0] for r in pts], "o-", color=c, label=emb)
    for r in pts:
      ax_b.annotate(str(r["rank"]), (r["sigma_next"], r[m0]), fontsize=6,
                    textcoords="offset points", xytext=(3, 3))
    s = np.asarray(e["spectrum"])
    ax_c.semilogy(np.arange(1, s.size + 1), np.maximum(s, 1e-30), "-", color=c, label=emb)
  ax_a.set_xscale("log", base=2)
  ax_a.set_xlabel("rank r")
  ax_a.set_ylabel(m0)
  ax_a.set_title("Fig. 1a: truncated W_r vs rank")
  ax_b.set_xscale("log")
  ax_b.xaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
  ax_b.xaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
  ax_b.xaxis.set_minor_formatter(ticker.NullFormatter())
  ax_b.set_xlabel(r"$\sigma_{r+1}$")
  ax_b.set_ylabel(f"test {m0}")
  ax_b.set_title("Fig. 1b: metric vs next singular value")
  ax_c.set_xlabel("index i")
  ax_c.set_ylabel(r"$\sigma_i$")
  ax_c.set_title("Fig. 1c: singular values of the trained W")
  for fig, ax in ((fig_a, ax_a), (fig_b, ax_b), (fig_c, ax_c)):
    ax.legend(fontsize=7)
    fig.tight_layout()
  return {"fig1a_metric_vs_rank": fig_a, "fig1b_metric_vs_sigma_next": fig_b,
          "fig1c_spectrum": fig_c}
