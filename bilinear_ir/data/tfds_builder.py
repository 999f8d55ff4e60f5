r"""Training examples of a large collection materialised as a TFDS dataset (ArrayRecord files).

Each example is one (query, relevant doc, negatives) triple of texts with their ids:

  qid, query          the query id and text
  pos_id, positive    a doc judged relevant (> 0) to it in `qrels[split]`, as `doc_strings()`
  neg_ids, negatives  its negatives: [num_negatives] ids and doc strings

Negatives come from one of two sources:

* `negatives={qid: [doc ids, best first]}` (e.g. `collection.candidates["dev"]` from MS MARCO
  `top1000`, or BM25 hard negatives): one example per judged-relevant (qid, doc) of the split,
  whose negatives are the first `num_negatives` distinct ids of the qid's list not judged
  relevant (> 0). A query with positives but no list, an unknown id among those read, or too
  short a list is an `InputError`; queries without a positive make no example.
* `negatives=None`: the MS MARCO training triples of the collection (`triples_path`), one
  example per line, ids resolved by `msmarco.msmarco_triples`; `num_negatives` must be 1.

No TensorFlow is needed: build with `file_format="array_record"` (what `build` does) and read
with `builder.as_data_source()[split]`, or without this class with
`tfds.builder_from_directory(data_dir).as_data_source()[split]`: a random-access source of
dicts whose texts are UTF-8 `bytes`.
The examples live in `data_dir/training_examples/<config>/1.0.0/`, `<config>` being
`<collection>_<split>_neg<k>` or `<collection>_<split>_triples`; an existing build there is
reused as is (TFDS semantics): delete the folder to rebuild from changed inputs.
"""
from __future__ import annotations

import re
from typing import Iterator

try:
  from etils import epath
  import tensorflow_datasets as tfds
except ImportError:
  raise ImportError("bilinear_ir.data.tfds_builder needs tensorflow-datasets; install it with "
                    "`pip install \"bilinear_ir[tfds]\"`") from None

from bilinear_ir.data import msmarco
from bilinear_ir.data.collection import Collection
from bilinear_ir.errors import input_error, require

FEATURES = {
    "qid": tfds.features.Text(),
    "query": tfds.features.Text(),
    "pos_id": tfds.features.Text(),
    "positive": tfds.features.Text(),
    "neg_ids": tfds.features.Sequence(tfds.features.Text()),
    "negatives": tfds.features.Sequence(tfds.features.Text()),
}


def _safe(name: str) -> str:
  """A name TFDS accepts in config and split names (letters, digits, `_`)."""
  return re.sub(r"\W", "_", name)


class TrainingExamples(tfds.core.GeneratorBasedBuilder):
  """TFDS builder of (query, positive, negatives) examples from a `Collection`.

  The output split is `split` with characters other than letters, digits and `_` replaced by
  `_` ("dev.small" -> "dev_small").
  """

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "qid, query, pos_id, positive, neg_ids, negatives."}
  # tensorflow_datasets 4.9.10 locates a builder's source through the `importlib_resources`
  # backport, which it requires only on Python < 3.9; naming the file here avoids that lookup.
  code_path = epath.Path(__file__)

  def __init__(self, *, collection: Collection, split: str = "train",
               negatives: dict[str, list[str]] | None = None, num_negatives: int = 1,
               **kwargs):
    """Prepares a builder; `download_and_prepare()` writes the examples.

    Args:
      collection: the collection (docs, queries, qrels[split]).
      split: the qrels split whose relevant pairs make the examples.
      negatives: {qid: [doc ids, best first]}, or None for the collection's MS MARCO triples.
      num_negatives: negatives per example.
      **kwargs: `tfds.core.GeneratorBasedBuilder` arguments (`data_dir`, `file_format`).
    """
    require(split in collection.qrels, f"collection {collection.name!r} has no split {split!r}; "
            f"it has {sorted(collection.qrels)}", field="split")
    require(num_negatives >= 1, f"must be >= 1, got {num_negatives}", field="num_negatives")
    require(negatives is not None or num_negatives == 1,
            "MS MARCO triples give one negative per example", field="num_negatives")
    self._collection = collection
    self._split = split
    self._negatives = negatives
    self._num_negatives = num_negatives
    source = "triples" if negatives is None else f"neg{num_negatives}"
    kwargs.setdefault("config", tfds.core.BuilderConfig(
        name=_safe(f"{collection.name}_{split}_{source}"),
        description=f"{collection.name} ({collection.source}), split {split}, {source}"))
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self, description="(query, positive, negatives) training examples.",
        features=tfds.features.FeaturesDict(FEATURES))

  def _split_generators(self, dl_manager):  # pylint: disable=unused-argument
    return {_safe(self._split): self._generate_examples()}

  def _generate_examples(self) -> Iterator[tuple[object, dict]]:
    c = self._collection
    row = c.doc_index()
    doc_strings = c.doc_strings()

    def example(qid: str, pos: str, negs: list[str]) -> dict:
      return {"qid": qid, "query": c.queries[qid], "pos_id": pos,
              "positive": doc_strings[row[pos]], "neg_ids": negs,
              "negatives": [doc_strings[row[d]] for d in negs]}

    if self._negatives is None:
      for line, qid, pos, neg in msmarco.msmarco_triples(c, self._split):
        yield line, example(qid, pos, [neg])
      return
    for qid, judged in sorted(c.qrels[self._split].items()):
      positives = sorted(d for d, rel in judged.items() if rel > 0)
      if not positives:
        continue
      if qid not in self._negatives:
        raise input_error("no negative list for a query with positives", file="negatives",
                          record=f"qid {qid!r}", field="negatives")
      negs = []
      for d in self._negatives[qid]:
        if d not in row:
          raise input_error(f"unknown doc id {d!r}", file="negatives", record=f"qid {qid!r}",
                            field="negatives")
        if judged.get(d, 0) <= 0 and d not in negs:
          negs.append(d)
          if len(negs) == self._num_negatives:
            break
      if len(negs) < self._num_negatives:
        raise input_error(f"{len(negs)} usable negatives (unjudged or judged 0), need "
                          f"{self._num_negatives}", file="negatives", record=f"qid {qid!r}",
                          field="negatives")
      for pos in positives:
        yield f"{qid}\t{pos}", example(qid, pos, negs)


def build(collection: Collection, data_dir: str, *, split: str = "train",
          negatives: dict[str, list[str]] | None = None,
          num_negatives: int = 1) -> TrainingExamples:
  """Builds (or reuses) the ArrayRecord training examples under `data_dir`.

  Returns:
    The prepared builder: `build(...).as_data_source()[split]` reads the examples back.
  """
  builder = TrainingExamples(collection=collection, split=split, negatives=negatives,
                             num_negatives=num_negatives, data_dir=data_dir,
                             file_format="array_record")
  builder.download_and_prepare()
  return builder
