"""What the hybrid of a late-interaction table needs besides `experiment.evaluate.HybridEvaluator`:
the candidates it fuses (a dense row's re-ranking and BM25's scores of the same candidates) and its
timed call."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from bilinear_ir.retrieval import hybrid as hybrid_lib
from bilinear_ir.studies.late_interaction import teachers
from bilinear_ir.studies.late_interaction.setting import Scored
from bilinear_ir.studies.late_interaction.setting import Setting


def candidates_of(setting: Setting, scored: Scored
                  ) -> Callable[[str, Any], hybrid_lib.Candidates]:
  """The `candidates_of` of `HybridEvaluator` over a re-ranking: split name -> the dense row's
  re-ranking of that split's candidates [Q_s, K] beside BM25's exact scores of the same
  candidates (both lists complete: no score is missing)."""
  prepared = setting.prepared

  def candidates(name: str, split) -> hybrid_lib.Candidates:  # pylint: disable=unused-argument
    idx, scores = scored.run[name]
    bm25_fn = lambda qi, di: prepared.bm25_pair_scores(setting.rows[name][qi], di)
    missing = lambda qi, di: np.full(len(qi), np.nan)  # never called: both lists are complete
    return hybrid_lib.union_candidates(idx, scores, setting.cands[name], setting.bm25[name],
                                       missing, bm25_fn)

  return candidates


def timed_call(setting: Setting, scored: Scored, lam: float, normalize: str, docs: np.ndarray
               ) -> Callable[[], Any]:
  """The hybrid's latency call: the dense row's timed call, BM25 scores of the same `docs` [K]
  (doc rows of `latency.latency_inputs`) for the first test query, the fusion with `lam`."""
  bm25 = teachers.bm25_call(setting, docs)

  def call():
    d = np.asarray(scored.latency_fn())[0][:len(docs)]
    b = bm25()
    c = hybrid_lib.Candidates(np.sort(docs)[None], d[np.argsort(docs)][None].astype(np.float64),
                              b[np.argsort(docs)][None])
    return hybrid_lib.rank_candidates(c, lam, normalize)

  return call
