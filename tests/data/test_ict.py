"""Training pairs the corpus makes itself (inverse cloze): the sampler, training without qrels,
selection on held-out ICT pairs, and the command line on a test-only collection."""
import copy
import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bilinear_ir.config import blocks
from bilinear_ir.data import ict
from bilinear_ir.data import pipeline
from bilinear_ir.experiment import spec as spec_lib
from bilinear_ir.experiment import training
from conftest import REPO
from conftest import write_beir
from conftest import write_model

DOCS = [" ".join(f"w{d}_{i}" for i in range(n)) for d, n in enumerate([3, 8, 30, 60, 12, 25])]


def _cfg(**changes):
  c = blocks.ict_config()
  for k, v in changes.items():
    c[k] = v
  return c


def test_spans_have_the_asked_lengths_and_come_from_their_doc():
  pairs = ict.sample(DOCS, _cfg(min_words=5, max_words=10, pairs_per_doc=20, remove_prob=0.5,
                                dev_docs=1), seed=0)
  assert pairs.skipped == 1  # the 3-word doc cannot give a 5-word span
  assert 0 not in set(pairs.sources.tolist())
  lengths = np.array([len(q.split()) for q in pairs.queries])
  assert lengths.min() >= 5 and lengths.max() <= 10
  assert len(set(lengths.tolist())) > 3  # lengths are drawn, not fixed
  for q, src, pos, cut in zip(pairs.queries, pairs.sources, pairs.positives, pairs.removed):
    doc = DOCS[src].split()
    assert q in DOCS[src]  # a run of consecutive words of its doc
    if cut:
      assert pos.split() == [w for w in doc if w not in q.split()]  # the span removed
      assert q not in pos
    else:
      assert pos is None  # the positive is the source doc itself
  # remove_prob 0.5 over 100 pairs: between 30 and 70 cut (binomial, ~4 sd).
  assert 30 <= pairs.removed.sum() <= 70
  assert set(pairs.sources[pairs.dev].tolist()) == {int(pairs.sources[pairs.dev][0])}


def test_sampling_is_deterministic_by_seed_and_remove_prob_is_respected():
  a = ict.sample(DOCS, _cfg(pairs_per_doc=3), seed=1)
  b = ict.sample(DOCS, _cfg(pairs_per_doc=3), seed=1)
  c = ict.sample(DOCS, _cfg(pairs_per_doc=3), seed=2)
  assert a.queries == b.queries and (a.removed == b.removed).all() and (a.dev == b.dev).all()
  assert a.queries != c.queries
  assert not ict.sample(DOCS, _cfg(remove_prob=0.0), seed=0).removed.any()
  assert ict.sample(DOCS, _cfg(remove_prob=1.0), seed=0).removed.all()
  sentences = ["One two three four five six. Seven eight nine ten eleven. Short one."]
  pairs = ict.sample(sentences, _cfg(query="sentence", min_words=5, pairs_per_doc=10), seed=0)
  assert set(pairs.queries) <= {"One two three four five six.", "Seven eight nine ten eleven."}


class _NoQrels:
  """Judgements that fail the test on any use: reading, iterating, sizing, testing, copying.

  Not a dict (an empty dict's fast paths, `dict(x)`, `{**x}`, json, would see nothing)."""

  def _fail(self, *args, **kwargs):
    raise AssertionError("qrels used under train.source=ict")

  __getitem__ = __iter__ = __len__ = __contains__ = __bool__ = __eq__ = __reversed__ = _fail

  def __getattr__(self, name):  # keys, values, items, get, copy, setdefault, ...
    raise AssertionError(f"qrels used under train.source=ict: .{name}")

  __hash__ = object.__hash__


def test_no_qrels_traps_every_use():
  trapped = [lambda q: q["q1"], lambda q: list(q), lambda q: len(q), lambda q: "q1" in q,
             lambda q: bool(q), lambda q: q.keys(), lambda q: q.values(), lambda q: q.items(),
             lambda q: q.get("q1"), lambda q: dict(q), lambda q: {**q}, lambda q: q == {},
             lambda q: sorted(q), lambda q: q.copy()]
  for use in trapped:
    with pytest.raises(AssertionError, match="qrels used"):
      use(_NoQrels())


@pytest.fixture(scope="module")
def test_only(tmp_path_factory):
  root = tmp_path_factory.mktemp("ict")
  beir = write_beir(str(root / "beir"), num_docs=40, num_queries=14, seed=5, splits=("test",))
  bert = write_model(str(root / "bert"), "bert", seed=2)
  c = blocks.table_recipe(__import__("ml_collections").ConfigDict())
  c.seed = 0
  c.data.format, c.data.path = "beir", beir
  c.encoder.model, c.encoder.cache_dir, c.encoder.max_length = bert, str(root / "cache"), 24
  c.encoder.pooling, c.encoder.normalize = "cls", False
  c.model.scorer = "bilinear"
  c.train.source = "ict"
  c.train.steps, c.train.eval_every, c.train.batch_size = 12, 4, 8
  c.train.ict.dev_docs, c.train.ict.min_words, c.train.ict.max_words = 8, 3, 6
  return root, c, beir, bert


def _guarded(prepared, splitset):
  """`prepared` and `splitset` whose judgements, but those of the test split, are `_NoQrels`:
  the collection's, the train and dev splits'."""
  no = lambda split: dataclasses.replace(split, qrels=_NoQrels())
  coll = dataclasses.replace(prepared.collection, qrels=_NoQrels())
  return (dataclasses.replace(prepared, collection=coll),
          dataclasses.replace(splitset, train=no(splitset.train), dev=no(splitset.dev)))


def test_ict_training_never_reads_qrels_and_selects_on_ict_pairs(test_only):
  _, c, _, _ = test_only
  prepared = pipeline.prepare(c)
  splitset = pipeline.test_only(prepared.collection, c.data)[0]
  guarded, guarded_split = _guarded(prepared, splitset)
  data = training.training_data(spec_lib.Row.of(c), guarded, guarded_split)
  assert data.source == "ict" and data.ict_pairs == len(data.trainset.pairs) == 40 - 8
  assert len(data.dev) == 1  # one pair per doc: one round
  q_dev, d_dev, dev_ids, dev_qrels = data.dev[0]
  assert len(dev_ids) == 8 and all(len(v) == 1 for v in dev_qrels.values())
  # The held-out docs appear in the dev corpus as their positives (the span cut when drawn so).
  assert d_dev.shape == prepared.embeddings.docs.shape
  changed = np.flatnonzero(np.any(d_dev != prepared.embeddings.docs, axis=1))
  pairs = pipeline.ict_set(prepared, c.encoder, c.train.ict, 100).pairs
  cut = set(pairs.sources[pairs.dev & pairs.removed].tolist())
  assert set(changed) <= cut and len(changed) >= len(cut) - 2  # (a cut past max_length changes
  # nothing the encoder sees)
  # The doc a span was cut from is never a negative of it.
  excluded = {(int(q), int(d)) for q, d in data.trainset.excluded}
  pool = data.trainset.hard_negatives
  assert all(d not in pool[q] for q, d in excluded)
  # The whole of training and selection runs with the judgements trapped (only the test split's
  # are there, for the final evaluation).
  out = training.train_and_evaluate(spec_lib.Row.of(c), guarded, guarded_split, progress=False)
  assert out["train_source"] == "ict" and out["ict_pairs"] == 32
  assert [h["step"] for h in out["history"]] == [0, 4, 8, 12]
  assert set(out["dev"]) >= {"ndcg@10", "mrr@10"}  # selected on the ICT dev pairs
  assert len(out["per_query"]) == 14  # every test query evaluated


def test_dev_pairs_of_one_doc_each_meet_their_own_positive(test_only):
  # pairs_per_doc > 1 with cut spans: the dev pairs of one doc have different positives (each
  # its own cut version). In the doc table each dev query is ranked over, the row of its judged
  # doc must be its own positive, not another pair's cut of the same doc.
  _, c, _, _ = test_only
  c = copy.deepcopy(c)
  c.train.ict.pairs_per_doc, c.train.ict.remove_prob, c.train.ict.dev_docs = 3, 0.7, 8
  prepared = pipeline.prepare(c)
  splitset = pipeline.test_only(prepared.collection, c.data)[0]
  data = training.training_data(spec_lib.Row.of(c), prepared, splitset)
  ict_data = pipeline.ict_set(prepared, c.encoder, c.train.ict, 1)
  table = np.concatenate([prepared.embeddings.docs, ict_data.extra_docs])
  doc_row = {d: i for i, d in enumerate(prepared.collection.doc_ids)}
  dev_idx = np.flatnonzero(ict_data.pairs.dev)
  sources = ict_data.pairs.sources[dev_idx]
  shared = [s for s in set(sources.tolist())
            if len({int(ict_data.positive_rows[i]) for i in dev_idx[sources == s]}) > 1]
  assert shared, "the fixture must give a doc dev pairs with different positives"
  seen = []
  for q_dev, d_dev, qids, qrels in data.dev:
    assert d_dev.shape == prepared.embeddings.docs.shape
    for row, qid in enumerate(qids):
      i = int(qid[len("ict"):])
      (doc,) = qrels[qid]
      assert doc_row[doc] == ict_data.pairs.sources[i]
      np.testing.assert_array_equal(d_dev[doc_row[doc]], table[ict_data.positive_rows[i]])
      np.testing.assert_array_equal(q_dev[row], ict_data.queries[i])
      seen.append(i)
  assert sorted(seen) == sorted(dev_idx.tolist())  # every dev pair, once


def test_command_line_on_a_test_only_collection(test_only, tmp_path):
  _, _, beir, bert = test_only
  common_args = ["--config.data.format=beir", f"--config.data.path={beir}",
                 f"--config.encoder.model={bert}", f"--config.encoder.cache_dir={tmp_path / 'c'}",
                 "--config.encoder.max_length=24"]
  procs = {
      "ict": subprocess.Popen(
          [sys.executable, "-m", "bilinear_ir.main",
           "--config=configs/train_eval.py:scorer=bilinear,pooling=cls",
           "--config.train.source=ict", "--config.train.steps=8", "--config.train.eval_every=4",
           "--config.train.batch_size=8", "--config.train.ict.dev_docs=6", *common_args,
           f"--workdir={tmp_path / 'ict'}"], cwd=REPO, stdout=subprocess.PIPE,
          stderr=subprocess.PIPE, text=True),
      "dot": subprocess.Popen(
          [sys.executable, "-m", "bilinear_ir.main", "--config=configs/train_eval.py:scorer=dot",
           *common_args, f"--workdir={tmp_path / 'dot'}"], cwd=REPO, stdout=subprocess.PIPE,
          stderr=subprocess.PIPE, text=True)}
  for name, proc in procs.items():
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-2000:]
    res = json.loads((tmp_path / name / "results.json").read_text())
    assert res["queries"] == 14  # all of the test-only collection, no folds
  ict = json.loads((tmp_path / "ict" / "results.json").read_text())
  assert 0.0 <= ict["ict_guard"]["lam"] <= 1.0  # the guard is on by default
  assert "ict_guard" not in json.loads((tmp_path / "dot" / "results.json").read_text())
  ict_res = json.loads((tmp_path / "ict" / "results.json").read_text())
  assert ict_res["train_source"] == "ict" and ict_res["ict_pairs"] == 40 - 6
  assert json.loads((tmp_path / "dot" / "results.json").read_text())["train_source"] == "qrels"
