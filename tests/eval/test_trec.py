"""TREC run/qrels files, trec_eval's ranking order and the top-k arrays -> run bridge."""
from __future__ import annotations

import os

import numpy as np
import pytest
import pytrec_eval

from bilinear_ir.errors import InputError
from bilinear_ir.eval import trec


def test_rank_order_is_trec_evals():
  docs = {"10": 1.0, "9": 1.0, "B": 1.0, "a": 1.0, "b": 1.0, "z": 2.0, "y": 1.0 + 1e-12}
  ids, scores = trec.rank_order(docs)
  assert ids == ["z", "y", "b", "a", "B", "9", "10"]  # y ties at 1.0 in float32
  assert scores.tolist() == [docs[d] for d in ids]
  run = {"q": docs}
  for position, doc in enumerate(ids, start=1):  # pytrec_eval puts each doc where we do
    ref = pytrec_eval.RelevanceEvaluator({"q": {doc: 1}}, {"recip_rank"}).evaluate(run)
    assert ref["q"]["recip_rank"] == 1.0 / position


def test_rank_order_rejects_nan():
  with pytest.raises(InputError, match="'q7'.*field 'score'"):
    trec.rank_order({"a": 1.0, "b": float("nan")}, "q7")


def test_run_text_ranks_in_trec_order():
  text = trec.run_to_text({"q2": {"x": 0.5}, "q1": {"10": 1.0, "9": 1.0, "a": 2.0}}, "mine")
  assert text == ("q1 Q0 a 1 2.0 mine\n"
                  "q1 Q0 9 2 1.0 mine\n"
                  "q1 Q0 10 3 1.0 mine\n"
                  "q2 Q0 x 1 0.5 mine\n")


def test_run_round_trip(tmp_path):
  rng = np.random.default_rng(0)
  run = {}
  for q in range(5):
    n = int(rng.integers(1, 40))
    scores = np.concatenate([rng.normal(size=n).astype(np.float32).astype(np.float64),
                             rng.integers(0, 3, n), [-np.inf, np.inf, 1e-300, -0.0]])
    run[f"q{q}"] = {f"d{i}": float(s) for i, s in enumerate(scores)}
  path = str(tmp_path / "run.trec")
  trec.write_run(path, run, "tag")
  assert trec.read_run(path) == run
  with open(path, encoding="utf-8") as f:
    assert pytrec_eval.parse_run(f) == run  # the reference reader agrees
  with open(path, encoding="utf-8") as f:
    lines = [line.split() for line in f]
  for qid, docs in run.items():
    mine = [fields for fields in lines if fields[0] == qid]
    assert [int(fields[3]) for fields in mine] == list(range(1, len(docs) + 1))
    assert [fields[2] for fields in mine] == trec.rank_order(docs)[0]


def test_qrels_round_trip(tmp_path):
  qrels = {"q1": {"d1": 1, "d2": 0, "d10": 2}, "q2": {"x": -1, "y": 3}}
  path = str(tmp_path / "qrels.txt")
  trec.write_qrels(path, qrels)
  assert trec.read_qrels(path) == qrels
  with open(path, encoding="utf-8") as f:
    assert pytrec_eval.parse_qrel(f) == qrels


def test_blank_lines_and_tabs_are_read(tmp_path):
  path = tmp_path / "qrels.tsv"
  path.write_text("q1\t0\td1\t1\n\n   \nq1 0 d2 0\n", encoding="utf-8")
  assert trec.read_qrels(str(path)) == {"q1": {"d1": 1, "d2": 0}}


GOOD_RUN = "q1 Q0 d1 1 2.5 t\nq1 Q0 d2 2 1.5 t\n"
GOOD_QRELS = "q1 0 d1 1\nq1 0 d2 0\n"


@pytest.mark.parametrize("bad_line,line,where", [
    ("q1 Q0 d3 3 1.0", 3, "expected 6"),
    ("q1 Q0 d3 3 1.0 t extra", 3, "expected 6"),
    ("q1 Q0 d3 3 high t", 3, "field 'score'"),
    ("q1 Q0 d3 3 nan t", 3, "field 'score'"),
    ("q1 Q0 d3 3 1_0 t", 3, "field 'score'"),
    ("q1 Q0 d3 3.0 1.0 t", 3, "field 'rank'"),
    ("q1 Q0 d1 3 1.0 t", 3, "field 'docid'"),  # (q1, d1) repeats line 1
])
def test_malformed_run(tmp_path, bad_line, line, where):
  path = str(tmp_path / "bad.run")
  with open(path, "w", encoding="utf-8") as f:
    f.write(GOOD_RUN + bad_line + "\n")
  with pytest.raises(InputError) as e:
    trec.read_run(path)
  message = str(e.value)
  assert path in message and f"line {line}" in message and where in message


@pytest.mark.parametrize("bad_line,line,where", [
    ("q1 0 d3", 3, "expected 4"),
    ("q1 0 d3 1 x", 3, "expected 4"),
    ("q1 0 d3 1.0", 3, "field 'rel'"),
    ("q1 0 d3 yes", 3, "field 'rel'"),
    ("q1 0 d2 1", 3, "field 'docid'"),  # (q1, d2) repeats line 2
])
def test_malformed_qrels(tmp_path, bad_line, line, where):
  path = str(tmp_path / "bad.qrels")
  with open(path, "w", encoding="utf-8") as f:
    f.write(GOOD_QRELS + bad_line + "\n")
  with pytest.raises(InputError) as e:
    trec.read_qrels(path)
  message = str(e.value)
  assert path in message and f"line {line}" in message and where in message


def test_unreadable_files(tmp_path):
  path = str(tmp_path / "latin1.qrels")
  with open(path, "wb") as f:
    f.write("q1 0 caf\xe9 1\n".encode("latin-1"))
  with pytest.raises(InputError, match="latin1.qrels.*UTF-8"):
    trec.read_qrels(path)
  with pytest.raises(InputError, match="missing.run"):
    trec.read_run(str(tmp_path / "missing.run"))


def test_writers_refuse_unwritable_values(tmp_path):
  path = str(tmp_path / "run.trec")
  trec.write_run(path, {"q": {"a": 1.0}}, "old")
  for run, tag, field in [({"q": {"a b": 1.0}}, "t", "docid"), ({"q 1": {"a": 1.0}}, "t", "qid"),
                          ({"q": {"a": 1.0}}, "my run", "tag"),
                          ({"q": {"a": float("nan")}}, "t", "score")]:
    with pytest.raises(InputError, match=f"field '{field}'"):
      trec.write_run(path, run, tag)
  assert trec.read_run(path) == {"q": {"a": 1.0}}  # the failed writes left the file alone
  assert os.listdir(tmp_path) == ["run.trec"]  # and no temp files
  with pytest.raises(InputError, match="field 'rel'"):
    trec.qrels_to_text({"q": {"a": 1.0}})


def test_rank_arrays_to_run():
  rng = np.random.default_rng(0)
  scores = np.round(rng.normal(size=(4, 30)), 1).astype(np.float32)  # float32, with ties
  top_idx = np.argsort(-scores, axis=1)[:, :7]
  top_scores = np.take_along_axis(scores, top_idx, axis=1)
  query_ids = ["q0", "q1", "q2", "q3"]
  doc_ids = [f"d{i}" for i in range(30)]
  run = trec.rank_arrays_to_run(query_ids, doc_ids, top_idx, top_scores)
  assert list(run) == query_ids
  for r, qid in enumerate(query_ids):
    assert run[qid] == {doc_ids[j]: float(scores[r, j]) for j in top_idx[r]}
    assert all(type(s) is float for s in run[qid].values())


def test_rank_arrays_to_run_errors():
  doc_ids = ["a", "b", "c"]
  ok_idx, ok_scores = np.array([[0, 1]]), np.array([[1.0, 0.5]])
  for query_ids, idx, scores, field in [
      (["q"], np.array([[0, 0]]), ok_scores, "top_idx"),          # a doc repeats in a row
      (["q"], np.array([[0, 3]]), ok_scores, "top_idx"),          # out of range
      (["q"], np.array([[-1, 0]]), ok_scores, "top_idx"),
      (["q"], ok_idx, np.array([[1.0, 0.5, 0.1]]), "top_idx"),    # shapes disagree
      (["q", "r"], ok_idx, ok_scores, "top_idx"),                 # Q disagrees
      (["q"], ok_idx.astype(float), ok_scores, "top_idx"),
  ]:
    with pytest.raises(InputError, match=f"field '{field}'"):
      trec.rank_arrays_to_run(query_ids, doc_ids, idx, scores)
  with pytest.raises(InputError, match="field 'query_ids'"):
    trec.rank_arrays_to_run(["q", "q"], doc_ids, np.array([[0], [1]]), np.array([[1.0], [1.0]]))
