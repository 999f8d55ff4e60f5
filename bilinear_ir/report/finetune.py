"""The finetune job's report: the fine-tune against the frozen dot product (markdown).

The job (`bilinear_ir/jobs/finetune.py`) runs and hands its results here.
"""
from __future__ import annotations

from typing import Any

from bilinear_ir.report import text


def markdown(results: dict[str, Any], config) -> str:
  """One table per embedding: each row's measures on all test queries, its difference against
  dot (paired), the unseen-answer view, the chosen steps and the training cost."""
  m0, alpha, rows = results["measure"], config.stats.alpha, results["rows"]
  measures = list(config.eval.measures)
  out = [f"# finetune: {results['mode']} ({results['loss']}) on {results['collection']}\n\n"
         f"Selection: {results['selection']}; test: every test query over the full corpus; "
         f"seeds {results['seeds']}; hard negatives from {results['negatives']['from']} "
         f"(top {results['negatives']['hard_depth']}).\n"]
  for emb in dict.fromkeys(r["embedding"] for r in rows):
    table, mine = [], [r for r in rows if r["embedding"] == emb]
    for r in mine:
      ft, unseen = r.get("finetune"), r["unseen"]
      table.append([r["model"], *(r["metrics"][m] for m in measures),
                    text.fmt_paired(r.get("vs_dot"), alpha),
                    f"{text.fmt(unseen['mean'], 4)} (n={unseen['n_queries']})",
                    text.fmt_paired(unseen.get("vs_dot"), alpha, ci=False),
                    "+".join(map(str, r.get("best_steps", []))) or "-",
                    f"{ft['seconds']:.1f} s on {ft['device']}" if ft else "-",
                    f"{ft['reindex_seconds']:.2f} s" if ft else "-"])
    out.append(f"\n## {results['collection']} / {emb} (n_train = {mine[0]['n_train']})\n\n")
    out.append(text.markdown_table(table, ["model", *measures, f"{m0} vs dot",
                                           f"{m0} unseen-answer", "unseen vs dot",
                                           "chosen step", "training", "corpus re-encode"],
                                   digits=4))
  out.append(f"\nThe chosen encoders: {', '.join(results['model'].values())} "
             "(sentence-transformers folders).\n")
  return "".join(out)
