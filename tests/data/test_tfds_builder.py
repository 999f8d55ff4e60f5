"""TFDS training-example builder: build to ArrayRecord, read back with `as_data_source` (no
TensorFlow), compare every example with what went in."""
from __future__ import annotations

import os

import pytest
import tensorflow_datasets as tfds

from bilinear_ir.data import loaders
from bilinear_ir.data import tfds_builder
from bilinear_ir.data.collection import Collection
from bilinear_ir.config.blocks import data_config
from bilinear_ir.errors import InputError


def _tiny() -> Collection:
  return Collection(
      name="tiny", doc_ids=["a", "b", "c", "d", "e"],
      titles=["Ta", "", "Tc", "", "Té"], texts=["alpha", "beta", "gamma", "delta", "ε"],
      queries={"q1": "first query", "q2": "second", "q3": "only judged zero"},
      qrels={"train": {"q1": {"a": 1, "b": 2, "c": 0}, "q2": {"d": 1}, "q3": {"e": 0}}})


def _read(builder, split: str) -> dict[tuple[str, str], dict]:
  """Every example of the split keyed by (qid, pos_id), texts decoded."""
  out = {}
  source = builder.as_data_source()[split]
  for i in range(len(source)):
    ex = source[i]
    ex = {k: ([x.decode() for x in v] if isinstance(v, list) else v.decode())
          for k, v in ex.items()}
    assert (ex["qid"], ex["pos_id"]) not in out
    out[(ex["qid"], ex["pos_id"])] = ex
  return out


def _expected(qid, query, pos, positive, negs):
  return {"qid": qid, "query": query, "pos_id": pos, "positive": positive,
          "neg_ids": [n for n, _ in negs], "negatives": [t for _, t in negs]}


def test_negative_lists_round_trip(tmp_path):
  negatives = {"q1": ["b", "c", "c", "d", "e"], "q2": ["a", "d", "e", "b"], "q3": []}
  builder = tfds_builder.build(_tiny(), str(tmp_path), split="train", negatives=negatives,
                               num_negatives=2)
  # Positives (relevance > 0) each make one example; judged-0 and unjudged docs can be negatives,
  # each once; q3 has no positive, so no example.
  expected = {
      ("q1", "a"): _expected("q1", "first query", "a", "Ta alpha",
                             [("c", "Tc gamma"), ("d", "delta")]),
      ("q1", "b"): _expected("q1", "first query", "b", "beta", [("c", "Tc gamma"), ("d", "delta")]),
      ("q2", "d"): _expected("q2", "second", "d", "delta", [("a", "Ta alpha"), ("e", "Té ε")]),
  }
  assert _read(builder, "train") == expected
  assert builder.info.splits["train"].num_examples == 3
  # The files stand alone: read back without the builder class.
  again = tfds.builder_from_directory(builder.data_dir)
  assert _read(again, "train") == expected
  assert os.path.basename(os.path.dirname(builder.data_dir)) == "tiny_train_neg2"


@pytest.mark.parametrize("negatives, message", [
    ({"q1": ["c", "d"]}, r"qid 'q2': field 'negatives': no negative list"),
    ({"q1": ["c", "zz"], "q2": ["a", "b"]}, r"qid 'q1': field 'negatives': unknown doc id 'zz'"),
    ({"q1": ["a", "b", "c"], "q2": ["a", "b"]}, r"qid 'q1': field 'negatives': 1 usable"),
])
def test_bad_negative_lists(tmp_path, negatives, message):
  with pytest.raises(InputError, match=message):
    tfds_builder.build(_tiny(), str(tmp_path), negatives=negatives, num_negatives=2)
  assert not os.path.exists(tmp_path / "training_examples" / "tiny_train_neg2" / "1.0.0")


def test_msmarco_triples_round_trip(tmp_path):
  folder = tmp_path / "marco"
  folder.mkdir()
  files = {
      "collection.tsv": "0\tpassage zero\n1\tpassage one\n2\tpassage two\n3\tpassage zero\n",
      "queries.train.tsv": "10\tquery ten\n11\tquery eleven\n",
      "qrels.train.tsv": "10\t0\t1\t1\n11\t0\t3\t1\n",
      "triples.train.small.tsv": ("query ten\tpassage one\tpassage two\n"
                                  "query eleven\tpassage zero\tpassage one\n"
                                  "query ten\tpassage one\tpassage zero\n"),
  }
  for name, text in files.items():
    (folder / name).write_text(text, encoding="utf-8")
  config = data_config()
  config.format, config.path = "msmarco", str(folder)
  collection = loaders.load(config)
  builder = tfds_builder.build(collection, str(tmp_path / "tfds"), split="train")
  source = builder.as_data_source()["train"]
  got = sorted((source[i]["qid"].decode(), source[i]["query"].decode(),
                source[i]["pos_id"].decode(), source[i]["positive"].decode(),
                [x.decode() for x in source[i]["neg_ids"]],
                [x.decode() for x in source[i]["negatives"]]) for i in range(len(source)))
  assert got == sorted([
      ("10", "query ten", "1", "passage one", ["2"], ["passage two"]),
      ("11", "query eleven", "3", "passage zero", ["1"], ["passage one"]),
      ("10", "query ten", "1", "passage one", ["0"], ["passage zero"]),
  ])


def test_split_name_made_safe(tmp_path):
  c = _tiny()
  c.qrels = {"dev.small": c.qrels["train"]}
  builder = tfds_builder.build(c, str(tmp_path), split="dev.small",
                               negatives={"q1": ["c"], "q2": ["e"]})
  assert sorted(_read(builder, "dev_small")) == [("q1", "a"), ("q1", "b"), ("q2", "d")]


def test_unknown_split_and_triples_with_several_negatives(tmp_path):
  with pytest.raises(InputError, match="field 'split'"):
    tfds_builder.TrainingExamples(collection=_tiny(), split="dev", negatives={},
                                  data_dir=str(tmp_path), file_format="array_record")
  with pytest.raises(InputError, match="field 'num_negatives'"):
    tfds_builder.TrainingExamples(collection=_tiny(), negatives=None, num_negatives=2,
                                  data_dir=str(tmp_path), file_format="array_record")
