"""The synthetic_agreement job's report: what a reader sees of its results (markdown, findings,
figures).

The job (`bilinear_ir/jobs/synthetic_agreement.py`) runs and hands its results here.
"""
from __future__ import annotations

from typing import Any
import ml_collections
import numpy as np
from bilinear_ir.report import text


JOB = "synthetic_agreement"  # the job; its fixed prose is templates/<JOB>.md
PAPER = {  # what section 4 reports, for the table
    "bilinear_rank2_constructed": "100.0% [99.6, 100.0]",
    "wdp_trained_50k_5ep": "0.0% [0.0, 0.4]",
    "wdp_trained_50k_15ep": "no improvement over 0.0%",
    "wdp_trained_100k_5ep": "no improvement over 0.0%",
}


def figure(samples: dict[str, np.ndarray]):
  """Histograms of agreeing (d1, d2) vs disagreeing (d3, d4) test scores, one panel per model."""
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  names = list(samples)
  cols = min(3, len(names))
  rows = -(-len(names) // cols)
  fig = Figure(figsize=(4.2 * cols, 3.2 * rows))
  axes = fig.subplots(rows, cols, squeeze=False)
  for ax, name in zip(axes.ravel(), names):
    s = samples[name]
    lo, hi = float(s.min()), float(s.max())
    bins = np.linspace(lo - 0.05 - 0.01 * (hi - lo), hi + 0.05 + 0.01 * (hi - lo), 41)
    ax.hist(s[:, :2].ravel(), bins=bins, alpha=0.6, label="agreeing (d1, d2)", color="tab:green")
    ax.hist(s[:, 2:].ravel(), bins=bins, alpha=0.6, label="disagreeing (d3, d4)", color="tab:red")
    ax.set_title(name, fontsize=9)
    ax.set_xlabel("score")
  for ax in axes.ravel()[len(names):]:
    ax.set_visible(False)
  axes[0, 0].legend(fontsize=8)
  fig.suptitle("Structured Agreement Ranking Task: test score distributions")
  fig.tight_layout()
  return fig


def _success(row: dict[str, Any]) -> str:
  lo, hi = row["ci95"]
  return f"{100 * row['success']:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]"


def _fixed_summary(rows: dict[str, dict[str, Any]]) -> list[str]:
  """One line per fixed-I0 configuration: the range of own-I0 success over its pairs."""
  groups: dict[str, list[float]] = {}
  for name, r in rows.items():
    if r.get("evaluated_on") == "own I0":
      prefix, rest = name.split("_I0_", 1)
      key = f"`{prefix}` {rest.split('_', 2)[2][:-len('_own')]}"  # e.g. `wdp_fixed_ones` 10k_3ep
      groups.setdefault(key, []).append(100 * r["success"])
  return [f"{k}: {min(v):.1f}% to {max(v):.1f}%" for k, v in groups.items()]


def _theorem_text(n: int, lp: dict[str, dict[str, bool]], rows: dict[str, dict[str, Any]]) -> str:
  """What Theorem 2 claims and does not claim, with this run's LP answers and measured rows."""
  def answer(family: str) -> str:
    return ", ".join(f"n={m}: {'feasible' if ok else 'infeasible'}" for m, ok in lp[family].items())

  universal = [(k, r) for k, r in rows.items() if "exhaustive_success" in r]
  universal_text = "; ".join(f"`{k}` {100 * r['exhaustive_success']:.1f}%" for k, r in universal)
  overlap = [100 * r["test_in_train"] for _, r in universal]
  overlap_text = (f"{min(overlap):.0f}% to {max(overlap):.0f}% of the test instances also occur "
                  "in the training set (column `test in train`)" if overlap
                  else "no model was trained")
  fixed_text = "; ".join(_fixed_summary(rows)) or "none run"
  bound_text = ("For n >= 4 no universal model of either family can solve every instance (the "
                "averaging argument and the LP above), so failing on some instances is not "
                "specific to WDP." if n >= 4 else
                "At n = 3 one universal v (and W) exists, e.g. v = 1.")
  return text.prose(JOB, "theorem", n=n, lp_bilinear=answer("bilinear"), lp_wdp=answer("wdp"),
                      universal=universal_text or "none run", bound=bound_text,
                      overlap=overlap_text, fixed=fixed_text)


def markdown(config: ml_collections.ConfigDict, rows: dict[str, dict[str, Any]],
              lp: dict[str, dict[str, bool]]) -> str:
  n = config.n
  t = config.train
  head = (f"# Structured Agreement Ranking Task (n = {n})\n\n"
          f"{config.num_test} random (q, I0) test instances, success = min(s1, s2) > max(s3, s4), "
          f"Wilson 95% intervals. Training: margin ranking loss (margin {t.margin}), AdamW "
          f"lr {t.learning_rate}, weight decay {t.weight_decay}, batch {t.batch_size}, seed "
          f"{config.seed}.\n\n")
  main_rows, fixed_rows = [], []
  for name, r in rows.items():
    if "evaluated_on" in r:
      continue
    main_rows.append([f"`{name}`", r.get("model", ""), r.get("trained_on", ""), _success(r), r["n"],
                      r["mean_agreeing"], r["mean_disagreeing"],
                      (f"{100 * r['exhaustive_success']:.1f}%" if "exhaustive_success" in r
                       else None),
                      None if "test_in_train" not in r else f"{100 * r['test_in_train']:.0f}%",
                      PAPER.get(name)])
  table = text.markdown_table(main_rows, ["row", "model", "trained on", "success [95% CI]", "n",
                                     "mean agreeing", "mean disagreeing", "all instances",
                                     "test in train", "paper"], digits=2)
  for name, r in rows.items():
    if r.get("evaluated_on") != "own I0":
      continue
    other = rows[name[:-len("_own")] + "_other"]
    fixed_rows.append([f"`{name[:-len('_own')]}`", r.get("model", ""), r["trained_on"], _success(r),
                       _success(other)])
  fixed = text.markdown_table(fixed_rows, ["model", "scorer", "trained on", "own I0 [95% CI]",
                                      "other I0s [95% CI]"])
  lp_rows = [[m, "yes" if lp["wdp"][m] else "no", "yes" if lp["bilinear"][m] else "no"]
             for m in lp["wdp"]]
  lp_table = text.markdown_table(lp_rows,
                                 ["n", "one v solves every I0", "one full W solves every I0"])
  return (head + "## Models\n\n" + table + "\n## One model per fixed I0\n\n"
          + text.prose(JOB, "fixed") + "\n" + fixed
          + "\n## Exact LP: is there a universal solution?\n\n" + lp_table + "\n"
          + _theorem_text(n, lp, rows))
