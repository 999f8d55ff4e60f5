"""The `collection_stats` job: load and validate a collection, count what it holds.

The cheapest job that reads data (it validates the whole collection on the way): docs, queries
and qrels per split, mean lengths in words, candidate lists and triples where the format has them.
"""
from __future__ import annotations

from bilinear_ir.data import loaders
from bilinear_ir.report import outputs
from bilinear_ir.report import text
from bilinear_ir.experiment import validation


def validate(config) -> None:
  """Refuses a bad config before any work (`experiment.validation`)."""
  validation.check_data(config.data)


def _mean_words(texts: list[str]) -> float:
  return sum(len(t.split()) for t in texts) / len(texts) if texts else 0.0


def run(config, workdir: str) -> outputs.Report:  # pylint: disable=unused-argument
  """Loads `config.data` and reports docs, queries and qrels per split and mean lengths in words."""
  c = loaders.load(config.data)
  splits = {}
  for split in sorted(c.qrels):
    qids = c.split_query_ids(split)
    judged = c.qrels[split]
    splits[split] = {
        "queries": len(qids),
        "qrels": sum(len(d) for d in judged.values()),
        "relevant": sum(r > 0 for d in judged.values() for r in d.values()),
        "avg_query_words": _mean_words([c.queries[q] for q in qids]),
    }
  results = {
      "collection": c.name,
      "source": c.source,
      "docs": c.num_docs,
      "queries": len(c.queries),
      "avg_doc_words": _mean_words(c.doc_strings()),
      "avg_query_words": _mean_words(list(c.queries.values())),
      "splits": splits,
      "candidates": {k: {"queries": len(v), "pairs": sum(len(x) for x in v.values())}
                     for k, v in sorted(c.candidates.items())},
      "triples": c.triples_path,
  }
  rows = [[s, v["queries"], v["qrels"], v["relevant"], v["avg_query_words"]]
          for s, v in splits.items()]
  markdown = (f"# Collection {c.name}\n\n{c.num_docs} docs, mean {results['avg_doc_words']:.1f} "
              f"words (title + text); {len(c.queries)} queries, mean "
              f"{results['avg_query_words']:.1f} words.\n\n"
              + text.markdown_table(rows, ["split", "queries", "qrels", "relevant",
                                                 "avg query words"], digits=1))
  return outputs.Report(results=results, markdown=markdown)
