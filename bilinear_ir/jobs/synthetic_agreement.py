"""The `synthetic_agreement` job: Theorem 2 of paper 000 and its synthetic experiment, checked.

Rows (all evaluated on the same `num_test` random (q, I0) test instances, Wilson 95% intervals):

* constructed models, which are handed the instance's I0: the paper's rank-2 `W_I0` (through the
  `bilinear` scorer; also on all 2^n * n(n-1)/2 instances), the rank-1 `e_i1 e_i1^T` (through
  `lowrank`) and the closed-form WDP `v = 1 on I0, 0 elsewhere` (through `wdp`);
* one universal model trained across all I0: WDP with the four ranking pairs, WDP under the
  public code's (q, q, -q) protocol, learned low-rank and full bilinear models;
* one model per fixed I0 (WDP with two inits, low-rank, full), on its own I0 and on the others;

plus the exact LP answer to "does one v / one W solve every I0?" for each n in `lp_dims`, and a
figure of the agreeing vs disagreeing score distributions.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bilinear_ir import scorers
from bilinear_ir.errors import require
from bilinear_ir.jobs import report
from bilinear_ir.jobs.report import Report, markdown_table
from bilinear_ir.studies import agreement_table as table_lib
from bilinear_ir.synthetic import feasibility

JOB = "synthetic_agreement"
WDP_INITS = ("ones", "uniform")
PAPER = {  # what section 4 reports, for the table
    "bilinear_rank2_constructed": "100.0% [99.6, 100.0]",
    "wdp_trained_50k_5ep": "0.0% [0.0, 0.4]",
    "wdp_trained_50k_15ep": "no improvement over 0.0%",
    "wdp_trained_100k_5ep": "no improvement over 0.0%",
}
def _runs(config: ml_collections.ConfigDict, field: str, batch_size: int) -> None:
  for run in config[field]:
    require(len(run) == 2, f"each run is (instances, epochs), got {run!r}", field=field)
    require(int(run[0]) >= batch_size, f"instances must be >= train.batch_size "
            f"({batch_size}), got {run[0]}", field=field)
    require(int(run[1]) >= 1, f"epochs must be >= 1, got {run[1]}", field=field)


def validate(config: ml_collections.ConfigDict) -> None:
  """Raises `InputError` (exit 2 in main) for any config value the job cannot run with."""
  n = config.n
  require(isinstance(n, int) and 3 <= n <= 12, f"must be an int in [3, 12], got {n!r}",
          field="n")
  require(config.num_test >= 1, f"must be >= 1, got {config.num_test}", field="num_test")
  t = config.train
  require(t.batch_size >= 1, f"must be >= 1, got {t.batch_size}", field="train.batch_size")
  require(t.learning_rate > 0, f"must be > 0, got {t.learning_rate}", field="train.learning_rate")
  require(t.weight_decay >= 0, f"must be >= 0, got {t.weight_decay}", field="train.weight_decay")
  require(t.margin > 0, f"must be > 0, got {t.margin}", field="train.margin")
  for field in table_lib.RUN_FIELDS:
    _runs(config, field, t.batch_size)
  require(config.public_init > 0, f"must be > 0, got {config.public_init}", field="public_init")
  for pair in config.fixed_pairs:
    require(len(pair) == 2 and 0 <= pair[0] < pair[1] < n,
            f"each pair is (i1, i2) with 0 <= i1 < i2 < n = {n}, got {pair!r}", field="fixed_pairs")
  for init in config.fixed_inits:
    require(init in WDP_INITS, f"each init is one of {WDP_INITS}, got {init!r}",
            field="fixed_inits")
  for r in config.lowrank_ranks:
    require(1 <= r <= n, f"each rank must be in [1, n = {n}], got {r}", field="lowrank_ranks")
  for m in config.lp_dims:
    require(2 <= m <= 10, f"each dimension must be in [2, 10], got {m}", field="lp_dims")


def _figure(samples: dict[str, np.ndarray]):
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
  return report.prose(JOB, "theorem", n=n, lp_bilinear=answer("bilinear"), lp_wdp=answer("wdp"),
                      universal=universal_text or "none run", bound=bound_text,
                      overlap=overlap_text, fixed=fixed_text)


def run(config: ml_collections.ConfigDict,
        workdir: str) -> Report:  # pylint: disable=unused-argument
  """Runs every row, the LP and the figure; returns the Report (main writes it to workdir)."""
  validate(config)
  ex = table_lib.Table(config)
  n = ex.n
  ex.constructed()

  wdp = scorers.build("wdp", n)
  ones = scorers.init_params(wdp, table_lib.key_for(ex.root, "wdp_init"))
  for num, epochs in config.wdp_runs:
    ex.universal(f"wdp_trained_{table_lib.size_name(num)}_{epochs}ep", wdp, ones, (num, epochs),
                 model="wdp (v = 1 at init)")
  for num, epochs in config.public_runs:
    name = f"wdp_public_protocol_{table_lib.size_name(num)}_{epochs}ep"
    uniform = table_lib.wdp_uniform(table_lib.key_for(ex.root, name + "/init"), (n,),
                                    config.public_init)
    ex.universal(name, wdp, uniform, (num, epochs), protocol="public",
                 model=f"wdp (v ~ U(-{config.public_init}, {config.public_init}))")
  k = len(config.fixed_pairs)
  for num, epochs in config.fixed_runs:
    for init in config.fixed_inits:
      key = table_lib.key_for(ex.root, f"wdp_fixed_init/{num}/{epochs}")
      params = ({"v": jnp.ones((k, n), jnp.float32)} if init == "ones"
                else table_lib.wdp_uniform(key, (k, n), config.public_init))
      ex.fixed(f"wdp_fixed_{init}", wdp, params, (num, epochs),
               model=f"wdp (init {init})")

  bilinear_models = [(f"lowrank_r{r}", scorers.build("lowrank", n, rank=r), f"lowrank r={r}")
                     for r in config.lowrank_ranks]
  if config.full_bilinear:
    bilinear_models.append(("bilinear_full", scorers.build("bilinear", n),
                            "bilinear (W = I at init)"))
  for prefix, module, label in bilinear_models:
    for num, epochs in config.bilinear_runs:
      params = scorers.init_params(module, table_lib.key_for(ex.root, f"{prefix}/init"))
      ex.universal(f"{prefix}_trained_{table_lib.size_name(num)}_{epochs}ep", module, params,
                   (num, epochs), model=label)
    for num, epochs in config.bilinear_fixed_runs if k else ():
      inits = [scorers.init_params(module, table_lib.key_for(ex.root, f"{prefix}/fixed_init/{j}"))
               for j in range(k)]
      params = jax.tree.map(lambda *leaves: jnp.stack(leaves), *inits)
      ex.fixed(f"{prefix}_fixed", module, params, (num, epochs), model=label)

  lp = {family: {} for family in feasibility.FAMILIES}
  witnesses = {family: {} for family in feasibility.FAMILIES}
  for family in feasibility.FAMILIES:
    for m in config.lp_dims:
      theta = feasibility.universal_solution(int(m), family)
      lp[family][str(m)] = theta is not None
      if theta is not None:
        witnesses[family][str(m)] = np.round(theta, 6).tolist()

  results = {
      "n": n,
      "num_test": config.num_test,
      "num_instances": int(ex.q_all.shape[0]),
      "rows": ex.rows,
      "lp_feasibility": lp,
      "lp_witnesses": witnesses,
      "paper": PAPER,
  }
  return Report(results=results, markdown=markdown(config, ex.rows, lp),
                figures={"score_distributions": _figure(ex.samples)})


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
  table = markdown_table(main_rows, ["row", "model", "trained on", "success [95% CI]", "n",
                                     "mean agreeing", "mean disagreeing", "all instances",
                                     "test in train", "paper"], digits=2)
  for name, r in rows.items():
    if r.get("evaluated_on") != "own I0":
      continue
    other = rows[name[:-len("_own")] + "_other"]
    fixed_rows.append([f"`{name[:-len('_own')]}`", r.get("model", ""), r["trained_on"], _success(r),
                       _success(other)])
  fixed = markdown_table(fixed_rows, ["model", "scorer", "trained on", "own I0 [95% CI]",
                                      "other I0s [95% CI]"])
  lp_rows = [[m, "yes" if lp["wdp"][m] else "no", "yes" if lp["bilinear"][m] else "no"]
             for m in lp["wdp"]]
  lp_table = markdown_table(lp_rows, ["n", "one v solves every I0", "one full W solves every I0"])
  return (head + "## Models\n\n" + table + "\n## One model per fixed I0\n\n"
          + report.prose(JOB, "fixed") + "\n" + fixed
          + "\n## Exact LP: is there a universal solution?\n\n" + lp_table + "\n"
          + _theorem_text(n, lp, rows))
