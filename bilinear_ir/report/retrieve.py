"""The retrieve job's report: what was ranked, through which index, and the metrics."""
from __future__ import annotations

from typing import Any, Sequence

from bilinear_ir.report import text


def markdown(results: dict[str, Any], measures: Sequence[str]) -> str:
  """results.md of the `retrieve` job from its results.json (`results`)."""
  m, split, queries = results["index"], results["split"], results["queries"]
  md = (f"# retrieve: {results['scorer']} on {results['collection']} ({split or 'all queries'}, "
        f"exact top-{results['k']})\n\n"
        f"Index `{m['path']}` ({m['dtype']}, {m['num_docs']} docs x {m['width']}, "
        f"{'reused' if m['reused'] else 'built'}).\n\n")
  if "metrics" in results:
    return md + text.markdown_table([[split, queries] + [results["metrics"][x] for x in measures]],
                                    ["split", "queries"] + measures, digits=4)
  return md + f"{queries} queries ranked; no qrels, so no metrics.\n"
