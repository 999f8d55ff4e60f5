"""InsuranceQA V2: the loader on a tiny fake package tree (round trip, every malformed file
refused with file, record and field, in-process and through `main`), the package missing or
partial, the real installed package's counts, official dev splits (`data.dev_split`, InsuranceQA
and BEIR `qrels/dev.tsv`), and the dataset's listed negatives as a hard-negative source that
never draws a gold answer."""
from __future__ import annotations

import gzip
import importlib.machinery
import importlib.util
import json
import os
import re

import numpy as np
import pytest

from bilinear_ir.data import batches
from bilinear_ir.data import collection as collection_lib
from bilinear_ir.data import embeddings as embeddings_lib
from bilinear_ir.data import insuranceqa
from bilinear_ir.data import loaders
from bilinear_ir.data import pipeline
from bilinear_ir.config.blocks import data_config
from bilinear_ir.config.blocks import train_config
from bilinear_ir.errors import InputError
from bilinear_ir.experiment import spec as spec_lib
from bilinear_ir.experiment import validation
from conftest import expect_located, get_config

ANSWERS = {str(i): {"en": f"  Answer\tnumber  {i}.\n", "zh": "答"} for i in range(1, 11)}
QUESTIONS = {
    "train": {"0": {"en": "What  is  term\nlife?", "zh": "问", "domain": "life-insurance",
                    "answers": ["1"], "negatives": ["2", "3", "4"]},
              "1": {"en": "Is auto  insurance required?", "zh": "问", "domain": "auto-insurance",
                    "answers": ["2", "5"], "negatives": ["6", "1"]},
              "2": {"en": "Do annuities pay?", "zh": "问", "domain": "annuities",
                    "answers": ["3"], "negatives": []}},
    "valid": {"0": {"en": "Does  Medicare pay?", "zh": "问", "domain": "medicare-insurance",
                    "answers": ["8"], "negatives": ["9", "10"]}},
    "test": {"0": {"en": "What is  renters insurance?", "zh": "问", "domain": "renters-insurance",
                   "answers": ["1", "7"], "negatives": ["4"]},
             "1": {"en": "Who needs disability cover?", "zh": "问",
                   "domain": "disability-insurance", "answers": ["9"], "negatives": ["3"]}},
}


def _gz(path, data: bytes) -> None:
  with gzip.open(path, "wb") as f:
    f.write(data)


def _fake(folder, answers=None, questions=None, raw: dict[str, bytes] | None = None) -> str:
  """A folder holding the package's four files: `answers`/`questions` as JSON, or the bytes of
  `raw[file name]` (gzipped) instead."""
  os.makedirs(folder, exist_ok=True)
  content = {"answers.json.gz": ANSWERS if answers is None else answers}
  content.update({f"{s}.json.gz": q for s, q in (questions or QUESTIONS).items()})
  for name, obj in content.items():
    _gz(os.path.join(folder, name), json.dumps(obj, ensure_ascii=False).encode("utf-8"))
  for name, data in (raw or {}).items():
    _gz(os.path.join(folder, name), data)
  return str(folder)


def _config(path: str):
  c = data_config()
  c.format, c.path = "insuranceqa", path
  return c


def test_round_trip(tmp_path):
  c = loaders.load(_config(_fake(tmp_path / "iqa")))
  assert c.name == "insuranceqa"
  assert c.doc_ids == [str(i) for i in range(1, 11)]
  assert c.doc_strings()[0] == "Answer number 1."  # whitespace collapsed, no title
  assert c.queries == {"train-0": "What is term life?", "train-1": "Is auto insurance required?",
                       "train-2": "Do annuities pay?", "dev-0": "Does Medicare pay?",
                       "test-0": "What is renters insurance?",
                       "test-1": "Who needs disability cover?"}
  assert c.qrels == {"train": {"train-0": {"1": 1}, "train-1": {"2": 1, "5": 1},
                               "train-2": {"3": 1}},
                     "dev": {"dev-0": {"8": 1}},
                     "test": {"test-0": {"1": 1, "7": 1}, "test-1": {"9": 1}}}
  assert c.query_meta["train-1"] == {"domain": "auto-insurance"}
  assert c.query_meta["test-1"] == {"domain": "disability-insurance"}
  assert len(c.query_meta) == 6
  assert c.negatives == {"train-0": ["2", "3", "4"], "train-1": ["6", "1"], "train-2": [],
                         "dev-0": ["9", "10"], "test-0": ["4"], "test-1": ["3"]}


def _question(**fields):
  q = dict(QUESTIONS["train"]["0"])
  q.update(fields)
  return q


def _with_train(question) -> dict:
  return {**QUESTIONS, "train": {**QUESTIONS["train"], "7": question}}


# (id, {"answers": obj} / {"questions": obj} / {"raw": {file: bytes}} / {"drop": file},
#  file named, record named, field named).
MALFORMED = [
    ("missing_file", {"drop": "test.json.gz"}, "test.json.gz", "", ""),
    ("not_gzip", {"plain": ("valid.json.gz", b"{}")}, "valid.json.gz", "", "gzip"),
    ("truncated_gzip", {"truncate": "train.json.gz"}, "train.json.gz", "", "gzip"),
    ("not_utf8", {"raw": {"answers.json.gz": b'{"1": {"en": "caf\xe9"}}'}}, "answers.json.gz",
     "line 1", "json"),
    ("broken_json", {"raw": {"test.json.gz": b'{"0": {"en": "x",}'}}, "test.json.gz",
     "line 1 column", "json"),
    ("not_an_object", {"raw": {"valid.json.gz": b'[1, 2]'}}, "valid.json.gz", "", "json"),
    ("duplicate_answer_id", {"raw": {"answers.json.gz":
                                     b'{"1": {"en": "a"}, "2": {"en": "b"}, "1": {"en": "c"}}'}},
     "answers.json.gz", "'1'", "id"),
    ("duplicate_question_id", {"raw": {"valid.json.gz": json.dumps(
        {"0": QUESTIONS["valid"]["0"]}).encode()[:-1] + b', "0": {}}'}},
     "valid.json.gz", "'0'", "id"),
    ("duplicate_field", {"raw": {"answers.json.gz": b'{"1": {"en": "a", "en": "b"}}'}},
     "answers.json.gz", "answer '1'", "en"),
    ("answer_not_object", {"answers": {**ANSWERS, "3": "text"}}, "answers.json.gz",
     "answer '3'", "json"),
    ("answer_missing_en", {"answers": {**ANSWERS, "3": {"zh": "x"}}}, "answers.json.gz",
     "answer '3'", "en"),
    ("answer_empty_en", {"answers": {**ANSWERS, "4": {"en": " \n\t"}}}, "answers.json.gz",
     "answer '4'", "en"),
    ("answer_en_not_string", {"answers": {**ANSWERS, "4": {"en": 4}}}, "answers.json.gz",
     "answer '4'", "en"),
    ("question_missing_en", {"questions": _with_train({"domain": "x", "answers": ["1"],
                                                       "negatives": []})},
     "train.json.gz", "question '7'", "en"),
    ("question_missing_answers", {"questions": _with_train({"en": "q", "domain": "x",
                                                            "negatives": []})},
     "train.json.gz", "question '7'", "answers"),
    ("question_missing_negatives", {"questions": _with_train({"en": "q", "domain": "x",
                                                              "answers": ["1"]})},
     "train.json.gz", "question '7'", "negatives"),
    ("question_missing_domain", {"questions": _with_train({"en": "q", "answers": ["1"],
                                                           "negatives": []})},
     "train.json.gz", "question '7'", "domain"),
    ("domain_not_string", {"questions": _with_train(_question(domain=["life"]))},
     "train.json.gz", "question '7'", "domain"),
    ("answers_not_list", {"questions": _with_train(_question(answers="1"))},
     "train.json.gz", "question '7'", "answers"),
    ("answers_empty", {"questions": _with_train(_question(answers=[]))},
     "train.json.gz", "question '7'", "answers"),
    ("answer_id_not_string", {"questions": _with_train(_question(answers=[1]))},
     "train.json.gz", "question '7'", "answers[0]"),
    ("unknown_gold_id", {"questions": _with_train(_question(answers=["1", "99"]))},
     "train.json.gz", "question '7'", "answers[1]"),
    ("unknown_negative_id", {"questions": _with_train(_question(negatives=["2", "0"]))},
     "train.json.gz", "question '7'", "negatives[1]"),
    ("negative_listed_twice", {"questions": _with_train(_question(negatives=["2", "3", "2"]))},
     "train.json.gz", "question '7'", "negatives[2]"),
    ("gold_also_negative", {"questions": _with_train(_question(negatives=["2", "1"]))},
     "train.json.gz", "question '7'", "negatives[1]"),
    ("question_not_object", {"questions": _with_train(["q"])},
     "train.json.gz", "question '7'", "json"),
    ("no_questions", {"questions": {**QUESTIONS, "test": {}}}, "test.json.gz", "", "id"),
]


def _make(folder, spec: dict) -> str:
  path = _fake(folder, answers=spec.get("answers"), questions=spec.get("questions"),
               raw=spec.get("raw"))
  if "drop" in spec:
    os.remove(os.path.join(path, spec["drop"]))
  if "plain" in spec:
    name, data = spec["plain"]
    with open(os.path.join(path, name), "wb") as f:
      f.write(data)
  if "truncate" in spec:
    file = os.path.join(path, spec["truncate"])
    with open(file, "rb") as f:
      data = f.read()
    with open(file, "wb") as f:
      f.write(data[:len(data) // 2])
  return path


@pytest.mark.parametrize("case", MALFORMED, ids=[c[0] for c in MALFORMED])
def test_malformed_file_raises_located_error(tmp_path, case):
  _, spec, file, record, field = case
  with pytest.raises(InputError) as e:
    loaders.load(_config(_make(tmp_path / "bad", spec)))
  expect_located(str(e.value), file, record, field)


STATS = ("configs/collection_stats.py", "--config.data.format=insuranceqa")


THROUGH_MAIN = [c for c in MALFORMED if c[0] in ("truncated_gzip", "broken_json",
                                                 "unknown_negative_id", "duplicate_answer_id")]


@pytest.mark.parametrize("case", THROUGH_MAIN, ids=[c[0] for c in THROUGH_MAIN])
def test_main_exits_2_on_malformed_file(tmp_path, run_main, case):
  _, spec, file, record, field = case
  workdir = tmp_path / "w"
  run = run_main(STATS[0], workdir, STATS[1],
                 f"--config.data.path={_make(tmp_path / 'bad', spec)}")
  expect_located(run.one_error_line(), file, record, field)


def test_main_reads_a_fake_tree(tmp_path, run_main):
  results = run_main.in_process(STATS[0], tmp_path / "w", STATS[1],
                                f"--config.data.path={_fake(tmp_path / 'iqa')}")
  assert results["docs"] == 10
  assert {s: v["qrels"] for s, v in results["splits"].items()} == {"train": 4, "dev": 1,
                                                                    "test": 3}


# ---------------------------------------------------------------------------------------------
# The package: missing (one line naming the pip command), partial (the missing file named).


def _spec_at(folder):
  spec = importlib.machinery.ModuleSpec(insuranceqa.PACKAGE, None, is_package=True)
  spec.submodule_search_locations = [str(folder)]
  return spec


def _patch_find_spec(monkeypatch, result):
  real = importlib.util.find_spec
  monkeypatch.setattr(insuranceqa.importlib.util, "find_spec",
                      lambda name, *a: result if name == insuranceqa.PACKAGE else real(name, *a))


def test_missing_package_names_the_pip_command(monkeypatch):
  _patch_find_spec(monkeypatch, None)
  for load in (lambda: loaders.load(_config("")), lambda: validation.check_data(_config(""))):
    with pytest.raises(InputError) as e:
      load()
    assert insuranceqa.PIP_COMMAND in str(e.value)
    assert "\n" not in str(e.value)


def test_partial_package_names_the_missing_file(tmp_path, monkeypatch):
  folder = _fake(tmp_path / insuranceqa.PACKAGE)
  os.remove(os.path.join(folder, "valid.json.gz"))
  _patch_find_spec(monkeypatch, _spec_at(folder))
  with pytest.raises(InputError, match=r"valid\.json\.gz.*incomplete"):
    loaders.load(_config(""))
  os.remove(os.path.join(folder, "answers.json.gz"))
  with pytest.raises(InputError, match=r"answers\.json\.gz.*incomplete"):
    loaders.load(_config(""))


def test_installed_package_path_is_read(tmp_path, monkeypatch):
  """`data.path` "" reads the folder the package's spec points at (a fake one here)."""
  _patch_find_spec(monkeypatch, _spec_at(_fake(tmp_path / insuranceqa.PACKAGE)))
  assert loaders.load(_config("")).num_docs == 10
  validation.check_data(_config(""))  # accepted: the package is there


@pytest.mark.parametrize("job,arg", [("late_interaction", "collection=insuranceqa"),
                                     ("learning_curve", "collection=insuranceqa"),
                                     ("reproduce_table", "collection=insuranceqa")])
def test_a_copy_in_data_path_needs_no_package(tmp_path, monkeypatch, job, arg):
  """A job on `collection=insuranceqa` with `data.path` naming a copy of the four files (what
  launch/pack_device_inputs.py writes for a machine without the package) validates and loads
  with the package absent; without `data.path` it is refused with the pip line, and a
  `data.path` that is no folder is refused naming the field."""
  import importlib as _importlib  # pylint: disable=g-import-not-at-top
  module = _importlib.import_module(f"bilinear_ir.jobs.{job}")
  _patch_find_spec(monkeypatch, None)
  c = get_config(job, arg)
  c.data.path = _fake(tmp_path / "copy")
  module.validate(c)
  assert loaders.load(spec_lib.collection_block(c.data, "insuranceqa")).num_docs == 10
  c.data.path = ""
  with pytest.raises(InputError, match=re.escape(insuranceqa.PIP_COMMAND)):
    module.validate(c)
  c.data.path = str(tmp_path / "absent")
  with pytest.raises(InputError, match=r"data\.path"):
    module.validate(c)


def test_main_exits_2_when_the_package_is_missing(tmp_path, run_main):
  runner = tmp_path / "runner.py"
  runner.write_text(
      "import importlib.util, runpy\n"
      "real = importlib.util.find_spec\n"
      "importlib.util.find_spec = lambda name, *a: (None if name == 'insuranceqa_data'\n"
      "                                             else real(name, *a))\n"
      "runpy.run_module('bilinear_ir.main', run_name='__main__', alter_sys=True)\n")
  workdir = tmp_path / "w"
  line = run_main(STATS[0], workdir, STATS[1], entry=(str(runner),)).one_error_line()
  assert insuranceqa.PIP_COMMAND in line


def test_study_names_insuranceqa():
  assert "insuranceqa" in loaders.INSTALLED
  c = spec_lib.collection_block(data_config(), "insuranceqa")
  assert (c.format, c.path) == ("insuranceqa", "")


def test_real_installed_package():
  """The data of insuranceqa-data 1.2 as the issue documents it. Skipped only when the package
  is absent; installed but incomplete (a stub version, a file missing) fails."""
  if importlib.util.find_spec(insuranceqa.PACKAGE) is None:
    pytest.skip(f"insuranceqa-data is not installed (`{insuranceqa.PIP_COMMAND}`)")
  c = loaders.load(_config(""))
  assert c.num_docs == 27_413
  assert {s: len(q) for s, q in c.qrels.items()} == {"train": 12_889, "dev": 2_000,
                                                    "test": 2_000}
  assert {s: sum(map(len, q.values())) for s, q in c.qrels.items()} == {
      "train": 21_325, "dev": 3_354, "test": 3_308}
  assert len(c.queries) == 16_889 and set(c.query_meta) == set(c.queries)
  assert {len(n) for n in c.negatives.values()} == {200}
  assert all(not set(c.negatives[q]) & set(j) for s in c.qrels.values() for q, j in s.items())
  train_gold = {d for j in c.qrels["train"].values() for d in j}
  assert sum(bool(set(j) & train_gold) for j in c.qrels["test"].values()) == 70
  domains = {m["domain"] for m in c.query_meta.values()}
  assert len(domains) == 12 and "life-insurance" in domains
  splits = pipeline.splits(c, _config(""), seed=0)[0]
  assert (len(splits.train.query_ids), len(splits.dev.query_ids),
          len(splits.test.query_ids)) == (12_889, 2_000, 2_000)


# ---------------------------------------------------------------------------------------------
# Official dev splits (`data.dev_split`).


def _beir(folder, qrels: dict[str, list[tuple[str, str]]]) -> str:
  os.makedirs(folder / "qrels", exist_ok=True)
  (folder / "corpus.jsonl").write_text("".join(
      json.dumps({"_id": f"d{i}", "text": f"text {i}"}) + "\n" for i in range(6)))
  (folder / "queries.jsonl").write_text("".join(
      json.dumps({"_id": f"q{i}", "text": f"query {i}"}) + "\n" for i in range(12)))
  for split, rows in qrels.items():
    (folder / "qrels" / f"{split}.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t1\n" for q, d in rows))
  return str(folder)


BEIR_QRELS = {"train": [(f"q{i}", f"d{i % 6}") for i in range(6)],
              "dev": [("q6", "d0"), ("q7", "d1")],
              "test": [(f"q{i}", f"d{i % 6}") for i in range(8, 12)]}
BEIR_QRELS_TRAIN = [f"q{i}" for i in range(6)]


def _beir_config(path: str, **fields):
  c = data_config()
  c.format, c.path = "beir", path
  for k, v in fields.items():
    c[k] = v
  return c


def test_beir_dev_split_is_used_when_present(tmp_path):
  path = _beir(tmp_path / "b", BEIR_QRELS)
  coll = loaders.load(_beir_config(path))
  s = pipeline.splits(coll, _beir_config(path), seed=0)[0]
  assert s.dev.query_ids == ["q6", "q7"]
  assert s.dev.qrels == {"q6": {"d0": 1}, "q7": {"d1": 1}}
  assert s.train.query_ids == [f"q{i}" for i in range(6)]  # nothing carved out of train
  assert s.test.query_ids == sorted(f"q{i}" for i in range(8, 12))
  # "" carves dev out of train as before, whatever the collection has.
  carved = pipeline.splits(coll, _beir_config(path, dev_split="", dev_fraction=0.34), seed=0)[0]
  assert len(carved.dev.query_ids) == 2 and set(carved.dev.query_ids) < set(BEIR_QRELS_TRAIN)
  assert sorted(carved.dev.query_ids + carved.train.query_ids) == BEIR_QRELS_TRAIN
  # Named explicitly: the same as "auto".
  named = pipeline.splits(coll, _beir_config(path, dev_split="dev"), seed=0)[0]
  assert named.dev == s.dev and named.train == s.train


def test_beir_without_dev_split_carves_as_before(tmp_path):
  qrels = {k: v for k, v in BEIR_QRELS.items() if k != "dev"}
  path = _beir(tmp_path / "b", qrels)
  coll = loaders.load(_beir_config(path))
  s = pipeline.splits(coll, _beir_config(path, dev_fraction=0.34), seed=3)[0]
  train, dev = collection_lib.split_dev(BEIR_QRELS_TRAIN, 0.34, 3)
  assert (s.train.query_ids, s.dev.query_ids) == (train, dev)
  with pytest.raises(InputError, match="field 'data.dev_split'.*no split 'dev'"):
    pipeline.splits(coll, _beir_config(path, dev_split="dev"), seed=0)


def test_dev_split_refusals(tmp_path):
  path = _beir(tmp_path / "b", BEIR_QRELS)
  coll = loaders.load(_beir_config(path))
  with pytest.raises(InputError, match="field 'data.dev_split'.*also the train or test"):
    pipeline.splits(coll, _beir_config(path, dev_split="test"), seed=0)
  with pytest.raises(InputError, match="field 'data.dev_split'"):
    pipeline.splits(coll, _beir_config(path, dev_split="dev", folds=3, split="test"), seed=0)
  # A dev query also judged in train: selection would see a training query.
  leaky = dict(BEIR_QRELS, dev=[("q6", "d0"), ("q2", "d2")])
  coll = loaders.load(_beir_config(_beir(tmp_path / "leaky", leaky)))
  with pytest.raises(InputError, match="query 'q2' is judged in both the dev split"):
    pipeline.splits(coll, _beir_config(path), seed=0)
  # "auto" does not select on the split that is evaluated.
  s = pipeline.splits(coll, _beir_config(path, split="dev", dev_fraction=0.34), seed=0)[0]
  assert s.test.query_ids == ["q2", "q6"] and set(s.dev.query_ids) < set(BEIR_QRELS_TRAIN)


def test_insuranceqa_selects_on_its_dev_split(tmp_path):
  coll = loaders.load(_config(_fake(tmp_path / "iqa")))
  s = pipeline.splits(coll, _config(""), seed=0)[0]
  assert s.train.query_ids == ["train-0", "train-1", "train-2"]
  assert s.dev.query_ids == ["dev-0"] and s.dev.qrels == {"dev-0": {"8": 1}}
  assert s.test.query_ids == ["test-0", "test-1"]


# ---------------------------------------------------------------------------------------------
# The dataset's negatives as the hard-negative pool (`train.negatives_from = "dataset"`).


def _prepared(coll: collection_lib.Collection, dim: int = 4) -> pipeline.Prepared:
  rng = np.random.default_rng(0)
  qids = sorted(coll.queries)
  emb = embeddings_lib.Embeddings(
      doc_ids=list(coll.doc_ids), docs=rng.normal(size=(coll.num_docs, dim)).astype(np.float32),
      query_ids=qids, queries=rng.normal(size=(len(qids), dim)).astype(np.float32), manifest={})
  bm25 = np.tile(np.arange(coll.num_docs), (len(qids), 1))  # a stand-in BM25 ranking
  return pipeline.Prepared(coll, emb, bm25, np.zeros(bm25.shape, np.float32))


def test_dataset_negatives_pool(tmp_path):
  prepared = _prepared(loaders.load(_config(_fake(tmp_path / "iqa"))))
  split = pipeline.splits(prepared.collection, _config(""), seed=0)[0].train
  listed = pipeline.listed_negatives(prepared.collection, split.query_ids)
  row = prepared.collection.doc_index()
  np.testing.assert_array_equal(listed, [[row["2"], row["3"], row["4"]],
                                         [row["6"], row["1"], -1], [-1, -1, -1]])
  ts, _ = pipeline.trainset(prepared, split, hard_depth=2, negatives_from="dataset")
  np.testing.assert_array_equal(ts.hard_negatives, [[row["2"], row["3"]],
                                                    [row["6"], row["1"]], [-1, -1]])
  bm25, _ = pipeline.trainset(prepared, split, hard_depth=2, negatives_from="bm25")
  np.testing.assert_array_equal(bm25.hard_negatives[0], [1, 2])  # BM25 stand-in minus doc 0
  with pytest.raises(InputError, match="field 'train.negatives_from'"):
    pipeline.trainset(prepared, split, hard_depth=2, negatives_from="listed")
  prepared.collection.negatives.pop("train-1")
  with pytest.raises(InputError, match="lists none for query 'train-1'"):
    pipeline.trainset(prepared, split, hard_depth=2, negatives_from="dataset")
  c = train_config()
  c.negatives_from = "dataset"
  validation.check_train(c)
  c.negatives_from = "bm"
  with pytest.raises(InputError, match="train.negatives_from"):
    validation.check_train(c)


def test_dataset_negatives_never_draw_a_gold_answer():
  """A collection whose listed negatives include gold answers (the loader refuses that in the
  files; here the collection is built directly): over many seeds and steps, no hard negative
  drawn for a query is one of its gold answers, and each listed non-gold one is drawn."""
  rng = np.random.default_rng(7)
  n_docs, n_queries = 40, 30
  doc_ids = [f"a{i}" for i in range(n_docs)]
  qrels, negatives = {}, {}
  for q in range(n_queries):
    gold = rng.choice(n_docs, int(rng.integers(1, 4)), replace=False)
    others = rng.choice(np.setdiff1d(np.arange(n_docs), gold), int(rng.integers(0, 6)),
                        replace=False)
    listed = rng.permutation(np.concatenate([gold, others]))  # gold mixed into the list
    qrels[f"q{q}"] = {doc_ids[d]: 1 for d in gold}
    negatives[f"q{q}"] = [doc_ids[d] for d in listed]
  coll = collection_lib.Collection(
      name="fake", doc_ids=doc_ids, titles=[""] * n_docs, texts=["t"] * n_docs,
      queries={q: q for q in qrels}, qrels={"train": qrels}, negatives=negatives)
  prepared = _prepared(coll)
  split = pipeline.Split("train", sorted(qrels), qrels)
  ts, _ = pipeline.trainset(prepared, split, hard_depth=10, negatives_from="dataset")
  gold_rows = {i: {coll.doc_index()[d] for d in qrels[q]} for i, q in enumerate(split.query_ids)}
  for i, pool in enumerate(ts.hard_negatives):
    assert not set(pool.tolist()) & gold_rows[i]
  listed_rows = {i: {coll.doc_index()[d] for d in negatives[q]} - gold_rows[i]
                 for i, q in enumerate(split.query_ids)}
  drawn = {i: set() for i in gold_rows}
  hard = 3
  for seed in range(20):
    sampler = batches.BatchSampler(ts, 8, hard=hard, random=0, in_batch=True, seed=seed)
    for step in range(15):
      b = sampler.batch(step)
      B = len(b.q_rows)
      for i, q in enumerate(b.q_rows):
        cols = b.cand_rows[B + i * hard:B + (i + 1) * hard]
        valid = b.mask[i, B + i * hard:B + (i + 1) * hard]
        picked = set(cols[valid].tolist())
        assert not picked & gold_rows[int(q)], (seed, step, int(q))
        assert picked <= listed_rows[int(q)]
        drawn[int(q)] |= picked
  assert drawn == listed_rows  # every listed non-gold answer is reachable


# ---------------------------------------------------------------------------------------------
# The InsuranceQA table: reproduce_table with collection=insuranceqa on a fake package tree.


def _random_tree(folder, seed: int = 0) -> str:
  """A fake package tree large enough to train on: 60 answers; 24 / 6 / 8 train / dev / test
  questions with 1-2 gold answers and 6 listed negatives each."""
  rng = np.random.default_rng(seed)
  words = "term life auto renters policy claim premium annuity cover pay cash value".split()
  answers = {str(i): {"en": " ".join(rng.choice(words, size=12)), "zh": "答"}
             for i in range(1, 61)}

  def questions(n):
    out = {}
    for i in range(n):
      picked = [str(a) for a in rng.choice(np.arange(1, 61), size=8, replace=False)]
      gold = int(rng.integers(1, 3))
      out[str(i)] = {"en": " ".join(rng.choice(words, size=5)), "zh": "问", "domain": "life",
                     "answers": picked[:gold], "negatives": picked[gold:gold + 6]}
    return out
  return _fake(folder, answers, {"train": questions(24), "valid": questions(6),
                                 "test": questions(8)})


def test_insuranceqa_table_adds_pool_p_at_1(tmp_path, monkeypatch):
  from bilinear_ir.experiment import evaluate  # pylint: disable=g-import-not-at-top
  from bilinear_ir.experiment import rows as rows_lib  # pylint: disable=g-import-not-at-top
  from bilinear_ir.jobs import reproduce_table  # pylint: disable=g-import-not-at-top
  _patch_find_spec(monkeypatch, _spec_at(_random_tree(tmp_path / insuranceqa.PACKAGE)))
  c = get_config("reproduce_table", "collection=insuranceqa,seeds=0,ranks=4,embeddings=mean,"
                 "max_steps=6,models=none,negatives=none")
  trained = [r["label"] for r in c.rows if r["type"] == "trained"]
  assert c.train.negatives_from == "dataset" and "mol" in [r["scorer"] for r in trained]
  assert {r["residual"] for r in trained if r["scorer"] == "lowrank"} == {"identity"}
  c.train.batch_size = 8
  c.encoder.max_length, c.encoder.cache_dir = 32, str(tmp_path / "cache")
  c.stats.resamples, c.hybrid.depth = 200, 10
  reproduce_table.validate(c)
  res = reproduce_table.run(c, str(tmp_path / "w")).results
  names = [r["scorer"] for r in res["rows"]]
  assert names == ["dot", "bm25", "wdp", "lowrank", "bilinear", "mol", "hybrid"]
  assert res["test_queries"] == 8 and "p_at_1_pool" in res
  for r in res["rows"]:
    assert 0.0 <= r["metrics"]["p_at_1_pool"] <= 1.0
  # The dot row's pool P@1 is its own ranking of each test question's pool.
  from bilinear_ir.experiment import spec as spec_lib2  # pylint: disable=g-import-not-at-top
  recipe, prepared, (splitset, *_) = next(spec_lib2.embeddings_of(
      c, spec_lib2.collection_block(c.data, "insuranceqa")))
  pools = evaluate.candidate_pools(prepared, splitset.test)
  emb = prepared.embeddings
  rows = prepared.query_row_index(splitset.test.query_ids)
  hits = []
  for i, q in enumerate(splitset.test.query_ids):
    docs = pools[i][pools[i] >= 0]
    s = emb.docs[docs] @ emb.queries[rows[i]]
    best = docs[np.flatnonzero(s == s.max())[0]]
    hits.append(splitset.test.qrels[q].get(prepared.collection.doc_ids[best], 0) > 0)
  assert res["rows"][0]["metrics"]["p_at_1_pool"] == pytest.approx(np.mean(hits))
  assert rows_lib.pool_p_at_1(prepared, splitset.test, None, [], "minmax") == {}
