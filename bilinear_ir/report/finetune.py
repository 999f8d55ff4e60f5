"""The finetune job's report: what judged queries buy, per embedding (markdown).

The job (`bilinear_ir/jobs/finetune.py`) runs and hands its results here.
"""
from __future__ import annotations

from typing import Any

from bilinear_ir.report import text

FINETUNES = {"query_tower": "query-tower fine-tune", "two_tower": "two-tower fine-tune"}


def _title(r: dict[str, Any]) -> str:
  """A row's name for a reader: the fine-tunes spelled out, "learned" with its choices."""
  if r["model"] in FINETUNES:
    return FINETUNES[r["model"]]
  if r["model"] == "learned":
    return f"learned (dev-best: {', '.join(r.get('chosen', []))})"
  return r["model"]


def _training(r: dict[str, Any]) -> tuple[str, str]:
  """(training seconds, chosen steps) of a row; '-' where nothing trains."""
  ft = r.get("finetune")
  seconds = ft["seconds"] if ft else r.get("seconds")
  steps = "+".join(map(str, r.get("best_steps", []))) or "-"
  return (f"{seconds:.1f}" if seconds else "-"), steps


def _index(cost: dict[str, Any]) -> str:
  """Whether the index changes: "unchanged" (served from the raw index; "query-side" where the
  query is transformed) or what it becomes, with the corpus re-encode time."""
  if not cost["index_changes"]:
    return "unchanged" + (" (query-side)" if cost["query_side"] else "")
  if cost["index"] == "new":
    return f"new (re-encode {cost['reencode_seconds']:.2f} s)"
  return cost["index"]


def markdown(results: dict[str, Any], config) -> str:
  """One table per embedding: each row's measures on all test queries and on the unseen-answer
  ones, each against dot (paired, Holm), the fraction of the two-tower gain it recovers, its
  training and what it costs at query time."""
  m0, alpha, rows = results["measure"], config.stats.alpha, results["rows"]
  lat = results["latency"]
  out = [f"# What judged queries buy: {results['collection']}\n\n"
         f"Selection: {results['selection']}; test: every test query over the full corpus; "
         f"seeds {results['seeds']}; fine-tunes: {', '.join(results['modes'])} "
         f"({results['loss']}); hard negatives from {results['negatives']['from']} "
         f"(top {results['negatives']['hard_depth']}). Paired tests against dot, Holm "
         f"{results['holm']}.\n\n"
         f"Hardware: {results['hardware']}. Training seconds on {results['device']}; a "
         "hybrid's are its dense row's, \"learned\"'s all its candidates'.\n\n"
         f"Recovered: (row - dot) / (two-tower - dot) of the mean {m0}, on all test queries and "
         "on the unseen-answer ones; undefined (-) where the two-tower fine-tune did not gain "
         "over dot (its gain <= 0) or did not run.\n\n"
         "Index: \"unchanged\" = served from the index of the frozen doc embeddings (0 extra "
         "bytes per doc; \"query-side\": the learned transform folded into the query, "
         "`export` query_side); \"new\" = the corpus re-encoded into a new index of the same "
         "n x 4 bytes per doc; BM25 and the hybrid add a sparse index. Latency: ms per query of "
         f"the exact top-{lat['k']} over the corpus, batch of {lat['batch']} test queries, median "
         f"of {lat['repeats']} interleaved rounds; the scoring part only (the query encoder is "
         "the same for every dense row; BM25's includes tokenizing the query); a fine-tune "
         "searches as dot does; a hybrid's is its two searches' sum (the fusion not timed).\n"]
  for emb in dict.fromkeys(r["embedding"] for r in rows):
    mine = [r for r in rows if r["embedding"] == emb]
    dot_ms = next(r["cost"]["ms_per_query"] for r in mine if r["model"] == "dot")
    table = []
    for r in mine:
      unseen, rec, cost = r["unseen"], r["recovered"], r["cost"]
      seconds, steps = _training(r)
      table.append([_title(r), r["metrics"][m0], text.fmt_paired(r.get("vs_dot"), alpha),
                    unseen["mean"], text.fmt_paired(unseen.get("vs_dot"), alpha, ci=False),
                    text.fmt(rec["all"], 2), text.fmt(rec["unseen"], 2), seconds, steps,
                    _index(cost), f"{cost['extra_bytes_per_doc']:.0f}",
                    f"{cost['ms_per_query']:.3f} ({cost['ms_per_query'] / dot_ms:.2f}x)"])
    n_unseen = mine[0]["unseen"]["n_queries"]
    out.append(f"\n## {results['collection']} / {emb} (n_train = {mine[0]['n_train']}, "
               f"{n_unseen} unseen-answer test queries)\n\n")
    out.append(text.markdown_table(table, ["row", m0, "vs dot", f"{m0} unseen-answer",
                                           "unseen vs dot", "recovered", "recovered unseen",
                                           "training s", "chosen step", "index",
                                           "extra B/doc", "ms/query (x dot)"], digits=4))
  out.append(f"\nThe chosen encoders: {', '.join(results['model'].values())} "
             "(sentence-transformers folders).\n")
  return "".join(out)
