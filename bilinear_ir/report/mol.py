"""The mol job's report: what a reader sees of its results (markdown, findings, figures).

The job (`bilinear_ir/jobs/mol.py`) runs and hands its results here.
"""
from __future__ import annotations

from typing import Any
import numpy as np
from bilinear_ir.config import embedding_specs
from bilinear_ir.experiment import rows as rows_lib
from bilinear_ir.report import text


JOB = "mol"  # the job; its fixed prose is templates/<JOB>.md
def label(spec: dict[str, Any]) -> str:
  """A row's name in the tables."""
  if spec["scorer"] == "mol":
    return f"MoL {spec['p_q']}x{spec['p_x']}, d_P={spec['d_p']}, alpha={spec['mi_weight']:g}"
  return {"dot": "dot (untrained)", "bm25": "BM25", "wdp": "WDP"}.get(spec["scorer"],
                                                                        spec["scorer"])


def _cells(r: dict[str, Any], measures) -> list[str]:
  return [f"{r['metrics'][m]:.4f}" + (f" ± {r['std'][m]:.4f}" if r["seeds"] > 1 else "")
          for m in measures]


def markdown(rows: list[dict[str, Any]], retrieval: list[dict[str, Any]],
             unseen_counts: dict[str, int], config) -> str:
  """The quality table per embedding, the retrieval-cost table, and what they say."""
  measures = list(config.eval.measures)
  m0 = measures[0]
  out = ["# Mixture-of-Logits vs dot / WDP / bilinear over frozen embeddings (paper 003)\n"]
  for emb in config.embeddings:
    mine = [r for r in rows if r["embedding"] == emb]
    body = [[label(r)] + _cells(r, measures) + [f"{r['unseen_docs'][m0]:.4f}"]
            + ([f"{r['gate_entropy']:.3f} / {r['gate_cond_entropy']:.3f}"]
               if r["scorer"] == "mol" else ["-"]) for r in mine]
    what = embedding_specs.describe_embedding(emb, config.encoder.model)
    out.append(f"\n## {emb}: {what} ({len(config.seeds)} "
               f"seed{'s' if len(config.seeds) > 1 else ''}, test split)\n\n")
    out.append(text.markdown_table(
        body, ["model"] + measures + [f"{m0} unseen docs ({unseen_counts[emb]} q)",
                                      "H(p) / H(p\\|q,x)"]))
  out.append("\n" + text.prose(JOB, "unseen", m0=m0))
  out.append("\n" + text.prose(JOB, "gates", docs=config.gate_sample_docs))
  out.append("\n" + text.prose(JOB, "retrieval", k=config.retrieval.k) + "\n")
  models = {r["embedding"]: r["model"] for r in retrieval}
  out.append("Models: " + "; ".join(f"{e}: {mdl}" for e, mdl in models.items()) + ".\n\n")
  body = [[r["embedding"], r["name"], r["rescored"], r["hit_rate"], r["true_gap"], r["gap_bound"],
           r["gap_bound_retrieved"], r["bound_holds"], r["fallback"], r["time_vs_brute_force"]]
          for r in retrieval]
  out.append(text.markdown_table(
      body, ["embedding", "algorithm", "MoL re-scored (max)", "hit rate", "true gap",
             "gap bound", "bound (retrieved only)", "bound held", "fallback", "time / brute"],
      digits=3))
  out.append("\n" + text.prose(JOB, "retrieval_units"))
  out.append("\n" + findings(rows, retrieval, config))
  return "".join(out)


def findings(rows: list[dict[str, Any]], retrieval: list[dict[str, Any]], config) -> str:
  """What the numbers show, computed from the rows."""
  m = config.eval.measures[0]
  lines = ["## What the numbers show\n"]
  for emb in config.embeddings:
    mine = [r for r in rows if r["embedding"] == emb]
    dot = next(r for r in mine if r["scorer"] == "dot")
    learned = [r for r in mine if r["scorer"] not in ("dot", "bm25", "mol")]
    mols = [r for r in mine if r["scorer"] == "mol"]
    sel = config.train.select_metric
    best = rows_lib.best_on_dev(mols, lambda r: r["dev"][sel])
    cmp = lambda a, b: "above" if a > b else "below"
    line = (f"- **{emb}** ({m}): dot {dot['metrics'][m]:.4f}; the MoL row best on dev "
            f"({label(best)}) {best['metrics'][m]:.4f}, "
            f"{cmp(best['metrics'][m], dot['metrics'][m])} dot")
    if learned:
      bl = rows_lib.best_on_dev(learned, lambda r: r["dev"][sel])
      line += (f" and {cmp(best['metrics'][m], bl['metrics'][m])} the table's learned row best "
               f"on dev ({label(bl)} {bl['metrics'][m]:.4f})")
    line += (f". On the unseen-doc test queries: dot {dot['unseen_docs'][m]:.4f}, that MoL "
             f"{best['unseen_docs'][m]:.4f}"
             + "".join(f", {label(r)} {r['unseen_docs'][m]:.4f}" for r in learned))
    log_p = float(np.log(best["p_q"] * best["p_x"]))
    line += (f". Its gates: H(p|q,x) = {best['gate_cond_entropy']:.3f} nats "
             f"({best['gate_cond_entropy'] / log_p:.0%} of the uniform gate's log P = "
             f"{log_p:.3f})")
    for a in mols:
      b = next((r for r in mols if r["mi_weight"] == 0 and (r["p_q"], r["p_x"]) ==
                (a["p_q"], a["p_x"])), None)
      if a["mi_weight"] > 0 and b is not None:
        line += (f". L_MI at alpha = {a['mi_weight']:g} vs 0 ({a['p_q']}x{a['p_x']}): {m} "
                 f"{a['metrics'][m] - b['metrics'][m]:+.4f}, H(p) "
                 f"{a['gate_entropy'] - b['gate_entropy']:+.2g}, H(p|q,x) "
                 f"{a['gate_cond_entropy'] - b['gate_cond_entropy']:+.2g} nats")
    ret = [r for r in retrieval if r["embedding"] == emb]
    approx = [r for r in ret if r["algorithm"] not in ("brute_force", "exact_two_pass")]
    good = [r for r in approx if r["hit_rate"] >= 0.99]
    exact = next((r for r in ret if r["algorithm"] == "exact_two_pass"), None)
    if approx:
      if good:
        cheapest = min(good, key=lambda r: r["rescored"])
        line += (f". Retrieval with the best-by-dev MoL: the approximate setting that re-scores "
                 f"the fewest docs with hit rate >= 0.99 is {cheapest['name']} "
                 f"({cheapest['hit_rate']:.3f}, at most {cheapest['rescored']} of "
                 f"{cheapest['docs']} docs)")
      else:
        top = max(approx, key=lambda r: r["hit_rate"])
        line += (f". Retrieval with the best-by-dev MoL: no approximate setting reaches hit rate "
                 f"0.99 (best {top['name']} {top['hit_rate']:.3f})")
      line += (f"; the Theorem 2/3 gap bound held for "
               f"{min(r['bound_holds'] for r in approx):.1%} of queries or more")
    if exact is not None:
      line += (f"; the exact two-pass algorithm matched brute force on {exact['hit_rate']:.1%} "
               f"of the top-K ({exact['fallback']:.1%} of queries fell back to brute force) "
               f"and took {exact['time_vs_brute_force']:.1f}x brute force's time")
    lines.append(line + ".\n")
  lines.append("\n" + text.prose(JOB, "paper"))
  return "".join(lines)
