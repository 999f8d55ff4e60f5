"""`Collection`: the documents, queries and judgements every job reads, plus query splits.

Loaders (`bilinear_ir.data.loaders`) build it from files and validate it; later stages take its
plain fields, not the loader's internals.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from bilinear_ir.errors import input_error, require


@dataclasses.dataclass
class Collection:
  """A retrieval collection.

  Attributes:
    name: a short name ("scifact", or the folder name).
    doc_ids: [N] unique document ids, in corpus order.
    titles: [N] titles ("" when absent).
    texts: [N] body texts ("" when absent; never both empty).
    queries: {qid: text} for the queries of every split.
    qrels: {split: {qid: {doc_id: relevance int}}}.
    source: the file or folder it was read from (for error messages and manifests).
    candidates: {name: {qid: [doc ids, best first]}} re-ranking candidate lists read from
      optional files (MS MARCO `top1000.<name>.tsv`); empty when the collection has none.
      `name` is the file's own name ("dev" for `top1000.dev.tsv`), which need not be a qrels
      split; every qid and doc id in it is a known query / doc.
    triples_path: an optional training-triples file (MS MARCO `triples.train.small.tsv`:
      query, positive passage, negative passage texts), "" when absent. It is tens of GB for
      the real data, so it is not read here: `data.msmarco.msmarco_triples` streams it (for
      `data.tfds_builder`) and validates each line as it goes.
    query_meta: {qid: {key: value}} per-query metadata kept from the files (InsuranceQA:
      {"domain": "life-insurance"}); empty when the collection has none.
    negatives: {qid: [doc ids]} the non-relevant docs the dataset itself lists per query
      (InsuranceQA: the 200 a search engine returned), in the file's order; never a doc judged
      relevant to that query; empty when the collection lists none. A hard-negative source
      (`train.negatives_from = "dataset"`).
  """
  name: str
  doc_ids: list[str]
  titles: list[str]
  texts: list[str]
  queries: dict[str, str]
  qrels: dict[str, dict[str, dict[str, int]]]
  source: str = ""
  candidates: dict[str, dict[str, list[str]]] = dataclasses.field(default_factory=dict)
  triples_path: str = ""
  query_meta: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
  negatives: dict[str, list[str]] = dataclasses.field(default_factory=dict)

  @property
  def num_docs(self) -> int:
    return len(self.doc_ids)

  def doc_strings(self) -> list[str]:
    """[N] the text each doc is encoded/indexed as: `title + " " + text`, stripped."""
    return [f"{t} {x}".strip() for t, x in zip(self.titles, self.texts)]

  def doc_index(self) -> dict[str, int]:
    """{doc_id: row} for the [N] doc order."""
    return {d: i for i, d in enumerate(self.doc_ids)}

  def split_query_ids(self, split: str) -> list[str]:
    """Sorted ids of the queries judged in `split` (those with at least one qrel)."""
    require(split in self.qrels, f"collection {self.name!r} has no split {split!r}; "
            f"it has {sorted(self.qrels)}", field="data.split")
    return sorted(self.qrels[split])


def split_dev(query_ids: list[str], fraction: float, seed: int) -> tuple[list[str], list[str]]:
  """Carves a dev set out of training queries, deterministically from `seed`.

  Args:
    query_ids: the training query ids.
    fraction: share held out as dev, in [0, 1).
    seed: the config seed.

  Returns:
    (train ids, dev ids), each sorted.
  """
  require(0.0 <= fraction < 1.0, f"must be in [0, 1), got {fraction}", field="data.dev_fraction")
  ids = sorted(query_ids)
  order = np.random.default_rng(seed).permutation(len(ids))
  n_dev = int(round(fraction * len(ids)))
  dev = sorted(ids[i] for i in order[:n_dev])
  train = sorted(ids[i] for i in order[n_dev:])
  return train, dev


def kfold(query_ids: list[str], folds: int, seed: int) -> list[tuple[list[str], list[str]]]:
  """K-fold split of queries: a list of K (train ids, held-out ids), held-out parts disjoint."""
  require(folds >= 2, f"must be >= 2, got {folds}", field="data.folds")
  ids = sorted(query_ids)
  if len(ids) < folds:
    raise input_error(f"{len(ids)} queries cannot make {folds} folds", file="config",
                      field="data.folds")
  order = np.random.default_rng(seed).permutation(len(ids))
  parts = np.array_split(order, folds)
  out = []
  for k in range(folds):
    held = sorted(ids[i] for i in parts[k])
    rest = sorted(ids[i] for j, p in enumerate(parts) if j != k for i in p)
    out.append((rest, held))
  return out
