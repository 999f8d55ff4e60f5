"""The reproduce_table job's report: what a reader sees of its results (markdown, findings,
figures).

The job (`bilinear_ir/jobs/reproduce_table.py`) runs and hands its results here.
"""
from __future__ import annotations

from typing import Any
from bilinear_ir.config import embedding_specs
from bilinear_ir.config import tables
from bilinear_ir.eval import stats
from bilinear_ir.experiment import rows as rows_lib
from bilinear_ir.report import text


JOB = "reproduce_table"  # the job; its fixed prose is templates/<JOB>.md
BASELINES = ("dot", "bm25", "hybrid")  # the untrained rows and the hybrid
PAPER_SCORERS = ("wdp", "lowrank", "bilinear")  # the paper's trained rows


def _row_name(row: dict[str, Any]) -> str:
  if row["scorer"] == "hybrid":
    return f"hybrid ({row['dense']} + BM25)"
  if row["scorer"] in ("dot", "bm25"):
    return {"dot": "dot (untrained)", "bm25": "BM25"}[row["scorer"]]
  return tables.row_label(row)


def markdown(rows: list[dict[str, Any]], config, unseen_counts: dict[str, int],
             collection: str = "SciFact") -> str:
  """The results table per embedding (mean +- std over seeds) and what it says."""
  measures = list(config.eval.measures)
  m0 = measures[0]
  out = ["# Learned similarities over frozen embeddings (paper 000, section 4)\n"]
  for emb in config.embeddings:
    table = []
    for r in rows:
      if r["embedding"] != emb:
        continue
      cells = [_row_name(r)]
      for m in measures:
        cells.append(f"{r['metrics'][m]:.4f}" + (f" ± {r['std'][m]:.4f}" if r["seeds"] > 1
                                                  else ""))
      if "p_at_1_pool" in r["metrics"]:
        cells.append(f"{r['metrics']['p_at_1_pool']:.4f}")
      cells.append(f"{r['unseen_docs'][m0]:.4f}")
      cells += [text.fmt_paired(r.get("vs_dot"), config.stats.alpha, ci=False),
                text.fmt_paired(r.get("vs_bm25"), config.stats.alpha, ci=False)]
      table.append(cells)
    n = len(config.seeds)
    what = embedding_specs.describe_embedding(emb, config.encoder.model)
    out.append(f"\n## {emb}: {what} ({n} seed{'s' * (n > 1)})\n\n")
    out.append(text.markdown_table(
        table, ["model"] + measures + ["P@1 own pool"] * ("p_at_1_pool" in rows[0]["metrics"])
        + [f"{m0} unseen docs ({unseen_counts[emb]} q)",
                                       f"{m0} vs dot", f"{m0} vs BM25"]))
  out.append("\n" + text.prose(JOB, "units", seeds=len(config.seeds), m0=m0,
                                 alpha=config.stats.alpha))
  pool = "p_at_1_pool" in rows[0]["metrics"]
  out.append("\n" + text.prose(JOB, "unseen", m0=m0, pool=text.prose(
      JOB, "pool").rstrip("\n") if pool else ""))
  out.append("\n" + findings(rows, config, collection))
  return "".join(out)


def findings(rows: list[dict[str, Any]], config, collection: str = "SciFact") -> str:
  """Where the numbers agree and disagree with the paper, computed from the rows: every "above"
  is a Holm-adjusted paired test against dot, and the best learned similarity is the one best
  on dev."""
  m = config.eval.measures[0]
  alpha, sel = config.stats.alpha, config.train.select_metric

  def versus(r: dict[str, Any]) -> str:
    mark = stats.mark(r["vs_dot"], alpha)
    word = {stats.GAIN: "significantly above", stats.LOSS: "significantly below"}.get(
        mark, "not significantly different from")
    return f"{word} dot, p = {r['vs_dot'].get('p_holm', r['vs_dot']['p_perm']):.2g}"

  val = lambda r: r["metrics"][m]
  listed = lambda rs: ", ".join(f"r={r}: {val(x):.4f}" for r, x in rs)
  sig = lambda rs: sum(stats.mark(x["vs_dot"], alpha) == stats.GAIN for _, x in rs)
  lines = ["## What the numbers say\n"]
  for emb in config.embeddings:
    every = [r for r in rows if r["embedding"] == emb]
    judged = [r for r in every if r.get("source", "qrels") == "qrels"]
    # The paper's rows: judged pairs and the recipe's negatives.
    mine = [r for r in judged if not tables.other_negatives(r)]
    by = {(r["scorer"], r["rank"], r["residual"]): r for r in mine}
    dot, bm25 = by[("dot", None, None)], by[("bm25", None, None)]
    ranks = sorted({r["rank"] for r in mine if r["scorer"] == "lowrank"})
    pure = [(r, by[("lowrank", r, "none")]) for r in ranks if ("lowrank", r, "none") in by]
    resid = [(r, by[("lowrank", r, "identity")]) for r in ranks
             if ("lowrank", r, "identity") in by]
    rising = all(val(b) >= val(a) - 1e-9 for (_, a), (_, b) in zip(pure, pure[1:]))
    # As the table's dev_best row: every row trained on the judged pairs.
    learned = rows_lib.best_on_dev([r for r in judged if r["scorer"] not in BASELINES],
                                   lambda r: r["dev"][sel])
    lines.append(text.prose(
        JOB, "bullet", emb=emb, dot=val(dot), wdp=val(by[("wdp", None, None)]),
        wdp_vs=versus(by[("wdp", None, None)]), full=val(by[("bilinear", None, None)]),
        full_vs=versus(by[("bilinear", None, None)]),
        pure=(text.prose(JOB, "pure", sig=sig(pure), n=len(pure), values=listed(pure),
                           rising="rises monotonically" if rising
                           else "does not rise monotonically").rstrip("\n") if pure else ""),
        learned=_row_name(learned), learned_val=val(learned),
        resid=(text.prose(JOB, "resid", sig=sig(resid), n=len(resid),
                            values=listed(resid)).rstrip("\n") if resid else ""),
        learned_vs=versus(learned), bm25=val(bm25),
        learned_vs_bm25=text.fmt_paired(learned["vs_bm25"], alpha, ci=False),
        hybrid=val(next(r for r in mine if r["scorer"] == "hybrid")),
        dot_unseen=dot["unseen_docs"][m], learned_unseen=learned["unseen_docs"][m],
        bm25_unseen=bm25["unseen_docs"][m]))
    # Beyond the paper's: the rows that start at dot and are none of its scorers (the adapter,
    # the residual MoL) and those trained with other negatives.
    beyond = [r for r in judged if r["scorer"] not in BASELINES + PAPER_SCORERS
              or tables.other_negatives(r)]
    if beyond:
      lines.append(text.prose(JOB, "beyond", rows="; ".join(
          f"{_row_name(r)} {val(r):.4f} ({versus(r)}), unseen-doc {r['unseen_docs'][m]:.4f}"
          for r in beyond), dot_unseen=dot["unseen_docs"][m]))
    others = [r for r in every if r.get("source", "qrels") != "qrels"]
    if others:
      lines.append(text.prose(JOB, "others", rows="; ".join(
          f"{_row_name(r)} {val(r):.4f} ({versus(r)}), unseen-doc {r['unseen_docs'][m]:.4f}"
          for r in others), dot_unseen=dot["unseen_docs"][m]))
  lines.append("\n" + text.prose(JOB, "paper", m=m, collection=collection))
  return "".join(lines)


def plot(rows: list[dict[str, Any]], config):
  """Test metric against rank per embedding, with the untrained/full/WDP/BM25 levels."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  m = config.eval.measures[0]
  embs = list(config.embeddings)
  fig, axes = plt.subplots(1, len(embs), figsize=(5.5 * len(embs), 4), squeeze=False)
  for ax, emb in zip(axes[0], embs):
    mine = [r for r in rows if r["embedding"] == emb and r.get("source", "qrels") == "qrels"
            and not tables.other_negatives(r)]
    for residual, style in (("none", "o-"), ("identity", "s--"), ("diag", "^:")):
      pts = [r for r in mine if r["scorer"] == "lowrank" and r["residual"] == residual]
      if pts:
        ax.errorbar([r["rank"] for r in pts], [r["metrics"][m] for r in pts],
                    yerr=[r["std"][m] for r in pts], fmt=style, capsize=3,
                    label="P Q^T" if residual == "none" else f"{residual} + P Q^T")
    for scorer, color in (("dot", "black"), ("wdp", "tab:green"), ("bilinear", "tab:red"),
                          ("bm25", "tab:gray"), ("hybrid", "tab:purple")):
      for r in mine:
        if r["scorer"] == scorer:
          ax.axhline(r["metrics"][m], color=color, ls=":", lw=1.2, label=_row_name(r))
    ax.set_xscale("log", base=2)
    ax.set_xlabel("rank r")
    ax.set_ylabel(f"test {m}")
    ax.set_title(emb)
    ax.legend(fontsize=7)
  fig.tight_layout()
  return fig
