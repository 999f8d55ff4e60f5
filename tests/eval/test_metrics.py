"""IR measures against pytrec_eval (trec_eval) to 1e-9 on randomized runs with forced ties."""
from __future__ import annotations

import numpy as np
import pytest
import pytrec_eval

from bilinear_ir.errors import InputError
from bilinear_ir.eval.metrics import evaluate

CUTOFFS = (1, 3, 5, 10, 100, 1000)
OURS_TO_TREC = {"map": "map", "ndcg": "ndcg"}
for _k in CUTOFFS:
  OURS_TO_TREC.update({f"map@{_k}": f"map_cut_{_k}", f"ndcg@{_k}": f"ndcg_cut_{_k}",
                       f"recall@{_k}": f"recall_{_k}", f"precision@{_k}": f"P_{_k}",
                       f"hr@{_k}": f"success_{_k}"})
MRR = [f"mrr@{k}" for k in CUTOFFS]
_CUTS = ",".join(map(str, CUTOFFS))
TREC_MEASURES = {"recip_rank", "map", "ndcg", f"map_cut.{_CUTS}", f"ndcg_cut.{_CUTS}",
                 f"recall.{_CUTS}", f"P.{_CUTS}", f"success.{_CUTS}"}


def _scores(rng: np.random.Generator, n: int) -> np.ndarray:
  """[n] scores with many ties: few distinct values, or ties visible only in float32."""
  mode = rng.integers(4)
  if mode == 0:
    return rng.integers(0, 4, n).astype(np.float64)
  if mode == 1:
    return np.round(rng.normal(size=n), 1)
  if mode == 2:  # distinct as float64, tied as float32 (trec_eval keeps float sims)
    return rng.integers(0, 5, n) + rng.integers(0, 3, n) * 1e-12
  return rng.normal(size=n)


def _random_case(seed: int):
  """Random qrels (grades 0/1/2, some queries without a relevant doc) and a run covering them."""
  rng = np.random.default_rng(seed)
  pool = ([str(i) for i in range(600)] + [f"d{i}" for i in range(500)]
          + [f"D{i}" for i in range(400)])
  qrels, run = {}, {}
  for q in range(12):
    qid = f"q{q}"
    judged = rng.choice(pool, rng.integers(1, 25), replace=False)
    grades = rng.choice([0, 1, 2], len(judged), p=[0.5, 0.3, 0.2])
    if q % 5 == 4:
      grades[:] = 0  # a query without a relevant doc
    qrels[qid] = {str(d): int(g) for d, g in zip(judged, grades)}
    n = int(rng.choice([0, 1, 7, 60, 1200]))
    docs = set(rng.choice(pool, n, replace=False).tolist())
    docs |= set(rng.choice(judged, min(n, len(judged)), replace=False).tolist())
    docs = sorted(docs)
    run[qid] = dict(zip(docs, _scores(rng, len(docs)).tolist()))
  run["unjudged_query"] = {"d1": 1.0, "d2": 0.5}  # not in the qrels: ignored by both
  return qrels, run


@pytest.mark.parametrize("seed", range(20))
def test_equals_pytrec_eval_with_ties(seed):
  qrels, run = _random_case(seed)
  names = list(OURS_TO_TREC) + MRR
  ours = evaluate(qrels, run, names)
  ref = pytrec_eval.RelevanceEvaluator(qrels, TREC_MEASURES).evaluate(run)
  evaluated = sorted(q for q, j in qrels.items() if max(j.values()) >= 1)
  assert list(ours["per_query"]) == evaluated
  for qid in evaluated:
    got, want = ours["per_query"][qid], ref[qid]
    for name, trec_name in OURS_TO_TREC.items():
      assert got[name] == pytest.approx(want[trec_name], abs=1e-9), (qid, name)
    rr = want["recip_rank"]  # 1/rank of the first relevant doc: cut at k keeps it iff rank <= k
    for k in CUTOFFS:
      expected = rr if rr > 0 and round(1 / rr) <= k else 0.0
      assert got[f"mrr@{k}"] == pytest.approx(expected, abs=1e-9), (qid, k)
  for name, trec_name in OURS_TO_TREC.items():
    mean = np.mean([ref[q][trec_name] for q in evaluated])
    assert ours["mean"][name] == pytest.approx(mean, abs=1e-9), name


@pytest.mark.parametrize("seed", range(5))
def test_hit_rate_brute_force(seed):
  qrels, run = _random_case(100 + seed)
  ours = evaluate(qrels, run, [f"hr@{k}" for k in CUTOFFS])
  for qid, values in ours["per_query"].items():
    ranked = sorted(run[qid], key=lambda d: (np.float32(run[qid][d]), d), reverse=True)
    for k in CUTOFFS:
      hit = any(qrels[qid].get(d, 0) >= 1 for d in ranked[:k])
      assert values[f"hr@{k}"] == float(hit)


def test_ties_break_by_doc_id_descending():
  # All tied: trec_eval ranks "b" > "a" > "B" and "9" > "10" (reversed byte order).
  run = {"q": {"10": 1.0, "9": 1.0, "B": 1.0, "a": 1.0, "b": 1.0}}
  for position, doc in enumerate(["b", "a", "B", "9", "10"], start=1):
    qrels = {"q": {doc: 1}}
    assert evaluate(qrels, run, ["mrr@10"])["mean"]["mrr@10"] == 1.0 / position
    ref = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(run)
    assert ref["q"]["recip_rank"] == 1.0 / position


def test_scores_compared_as_float32():
  qrels = {"q": {"a": 1}}
  for docs, rr in [({"a": 1.0 + 1e-12, "b": 1.0}, 0.5),  # tie in float32: "b" first
                   ({"a": 1.0 + 1e-6, "b": 1.0}, 1.0),
                   ({"a": 1e39, "b": 1e40}, 0.5)]:        # both overflow to +inf
    run = {"q": docs}
    assert evaluate(qrels, run, ["mrr@10"])["mean"]["mrr@10"] == rr
    assert pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(run)["q"][
        "recip_rank"] == rr


def test_missing_query_scores_zero():
  qrels = {"q1": {"a": 1, "b": 2}, "q2": {"c": 1}, "q3": {"d": 1}, "q4": {"e": 0}}
  run = {"q1": {"a": 2.0, "x": 1.0}, "q2": {"y": 3.0, "c": 1.0}, "q4": {"e": 1.0},
         "q5": {"a": 1.0}}
  names = ["mrr@10", "map", "ndcg@10", "recall@10", "precision@1", "hr@1"]
  ours = evaluate(qrels, run, names)
  assert list(ours["per_query"]) == ["q1", "q2", "q3"]  # q4 has no relevant doc, q5 no qrels
  assert ours["per_query"]["q3"] == {n: 0.0 for n in names}
  ref = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(run)
  assert set(ref) == {"q1", "q2", "q4"}  # pytrec_eval: only run queries, q3 left out
  # Hand values: q1 ranks a(1) x -> rr 1, q2 ranks y c(1) -> rr 1/2, q3 absent -> 0.
  assert ours["mean"]["mrr@10"] == pytest.approx((1.0 + 0.5 + 0.0) / 3, abs=1e-12)
  assert ours["mean"]["hr@1"] == pytest.approx(1 / 3, abs=1e-12)
  # Same as pytrec_eval once the missing query is given an empty ranking.
  covered = {"q1": run["q1"], "q2": run["q2"], "q3": {}}
  full = pytrec_eval.RelevanceEvaluator(qrels, {"map", "ndcg_cut.10"}).evaluate(covered)
  assert ours["mean"]["map"] == pytest.approx(np.mean([full[q]["map"] for q in covered]),
                                              abs=1e-12)
  assert ours["mean"]["ndcg@10"] == pytest.approx(
      np.mean([full[q]["ndcg_cut_10"] for q in covered]), abs=1e-12)


def test_unjudged_run_queries_are_ignored():
  qrels, run = _random_case(7)
  names = ["map", "ndcg@10", "mrr@10"]
  without = dict(run)
  del without["unjudged_query"]
  assert evaluate(qrels, run, names) == evaluate(qrels, without, names)


@pytest.mark.parametrize("name", ["mrr", "recall", "precision", "hr", "ndcg@0", "map@-1",
                                  "MAP", "p@5", "ndcg@10x", "ndcg @10", "mrr@1.5", "success@1"])
def test_bad_measure_names(name):
  with pytest.raises(InputError, match="eval.measures"):
    evaluate({"q": {"a": 1}}, {"q": {"a": 1.0}}, ["map", name])


def test_measures_must_be_a_list():
  with pytest.raises(InputError, match="eval.measures"):
    evaluate({"q": {"a": 1}}, {"q": {"a": 1.0}}, "map")


def test_bad_inputs():
  with pytest.raises(InputError, match="no query has a relevant doc"):
    evaluate({"q": {"a": 0}}, {"q": {"a": 1.0}}, ["map"])
  with pytest.raises(InputError, match="field 'rel'"):
    evaluate({"q": {"a": 1.5}}, {"q": {"a": 1.0}}, ["map"])
  with pytest.raises(InputError, match="field 'score'"):
    evaluate({"q": {"a": 1}}, {"q": {"a": float("nan"), "b": 1.0}}, ["map"])


# ---------------------------------------------------------------------------------------------
# `evaluate_topk`: the same numbers from top-k arrays, without building the run.


def _as_arrays(run, rng: np.random.Generator, extra_docs: list[str]):
  """The run as (query ids, doc ids, idx [Q, k], scores [Q, k]): columns shuffled, rows padded
  with -1, doc ids including docs no query retrieved."""
  query_ids = list(run)
  doc_ids = sorted({d for docs in run.values() for d in docs} | set(extra_docs))
  row = {d: j for j, d in enumerate(doc_ids)}
  k = max([len(docs) for docs in run.values()] + [0]) + int(rng.integers(0, 3))
  idx = np.full((len(run), k), -1, np.int64)
  scores = np.full((len(run), k), np.nan)  # padding scores are never read
  for i, docs in enumerate(run.values()):
    cols = rng.permutation(k)[:len(docs)]
    idx[i, cols] = [row[d] for d in docs]
    scores[i, cols] = list(docs.values())
  return query_ids, doc_ids, idx, scores


@pytest.mark.parametrize("seed", range(10))
def test_evaluate_topk_equals_evaluate(seed):
  """Exactly equal (not approximately) to `evaluate` of the same run, on runs with ties, ties
  visible only in float32, queries absent from the run and run queries absent from the qrels."""
  from bilinear_ir.eval.metrics import evaluate_topk  # pylint: disable=g-import-not-at-top
  qrels, run = _random_case(200 + seed)
  rng = np.random.default_rng(seed)
  del run[sorted(qrels)[seed % len(qrels)]]  # a judged query the run lacks
  names = list(OURS_TO_TREC) + MRR
  for measures in (names, ["ndcg@10", "mrr@10"], ["map"]):
    want = evaluate(qrels, run, measures)
    got = evaluate_topk(qrels, *_as_arrays(run, rng, ["zz", "0"]), measures)
    assert got == want


def test_evaluate_topk_edges():
  from bilinear_ir.eval.metrics import evaluate_topk  # pylint: disable=g-import-not-at-top
  qrels = {"q": {"a": 1, "b": 2}}
  docs = ["a", "b", "c"]
  # +0.0 and -0.0 tie (then "b" > "a"); the -1 column is no doc.
  idx, scores = np.array([[0, 1, -1]]), np.array([[0.0, -0.0, 5.0]], np.float32)
  run = {"q": {"a": 0.0, "b": -0.0}}
  assert evaluate_topk(qrels, ["q"], docs, idx, scores, ["mrr@1", "ndcg"]) == evaluate(
      qrels, run, ["mrr@1", "ndcg"])
  assert evaluate_topk(qrels, ["q"], docs, idx, scores, ["mrr@1"])["mean"]["mrr@1"] == 1.0
  empty = evaluate_topk(qrels, [], docs, np.zeros((0, 4), int), np.zeros((0, 4)), ["map"])
  assert empty == {"mean": {"map": 0.0}, "per_query": {"q": {"map": 0.0}}}
  with pytest.raises(InputError, match="a doc row repeats"):
    evaluate_topk(qrels, ["q"], docs, np.array([[1, 1]]), np.array([[1.0, 0.5]]), ["map"])
  with pytest.raises(InputError, match="field 'score'"):
    evaluate_topk(qrels, ["q"], docs, np.array([[1, 0]]), np.array([[np.nan, 0.5]]), ["map"])
  with pytest.raises(InputError, match="query ids repeat"):
    evaluate_topk(qrels, ["q", "q"], docs, np.array([[1], [0]]), np.ones((2, 1)), ["map"])
  with pytest.raises(InputError, match=r"doc rows must lie in \[0, 3\)"):
    evaluate_topk(qrels, ["q"], docs, np.array([[3]]), np.ones((1, 1)), ["map"])
