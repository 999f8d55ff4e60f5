"""The hybrid of a late-interaction table: the dense row best on dev fused with BM25 over the same
candidates, lam tuned on dev."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from bilinear_ir.experiment import evaluate
from bilinear_ir.experiment import rows as rows_lib
from bilinear_ir.retrieval import hybrid as hybrid_lib
from bilinear_ir.studies.late_interaction.setting import SPLITS
from bilinear_ir.studies.late_interaction.setting import Scored
from bilinear_ir.studies.late_interaction.setting import Setting
from bilinear_ir.studies.late_interaction.setting import per_query


def hybrid(setting: Setting, scored: Scored, cfg, docs: np.ndarray
           ) -> tuple[float, dict[str, dict[str, Any]], Callable[[], Any]]:
  """The dev-chosen hybrid of a dense row with BM25 over the same candidates.

  Args:
    scored: the dense row's re-ranking.
    cfg: `config.blocks.hybrid_config()`.
    docs: [K] doc rows of the latency call (`latency_inputs`).

  Returns:
    (lam, {"dev": mean metrics, "test": {"mean", "per_query"}} (with `pools`, the test mean
    holds "p_at_1_pool": the same fusion over each test query's own pool), its timed call: the
    dense call, BM25 scores of the same docs, the fusion).
  """
  prepared = setting.prepared

  def candidates(split):
    idx, scores = scored.run[split]
    bm25_fn = lambda qi, di: prepared.bm25_pair_scores(setting.rows[split][qi], di)
    missing = lambda qi, di: np.full(len(qi), np.nan)  # never called: both lists are complete
    return hybrid_lib.union_candidates(idx, scores, setting.cands[split], setting.bm25[split],
                                       missing, bm25_fn)

  cands = {split: candidates(split) for split in SPLITS}
  lam, ranked = evaluate.tune_on_dev(cands["dev"], setting.split("dev"),
                                     [cands[s] for s in SPLITS], prepared.collection.doc_ids, cfg)
  metrics = {s: setting.evaluate(s, *r) for s, r in zip(SPLITS, ranked)}
  metrics["dev"] = metrics["dev"]["mean"]
  if scored.pool is not None:
    metrics["test"]["mean"]["p_at_1_pool"] = evaluate.pool_p_at_1(
        prepared, setting.split("test"), setting.pools, lam, cfg.normalize,
        pool_scores=scored.pool)["mean"]
  q_row = setting.rows["test"][:1]

  def call():
    d = np.asarray(scored.latency_fn())[0][:len(docs)]
    b = prepared.bm25_pair_scores(np.repeat(q_row, len(docs)), docs)
    c = hybrid_lib.Candidates(np.sort(docs)[None], d[np.argsort(docs)][None].astype(np.float64),
                              b[np.argsort(docs)][None])
    return hybrid_lib.rank_candidates(c, lam, cfg.normalize)

  return lam, metrics, call

def hybrid_row(setting: Setting, config, rows: list[dict[str, Any]],
               dense: dict[str, Scored], lat) -> tuple[dict[str, Any], Callable[[], Any]]:
  """The hybrid of the dense row best on dev with BM25 over the same candidates
  (`hybrid`): (the row, its timed call)."""
  sel = config.train.select_metric
  best = rows_lib.best_on_dev(rows, lambda r: r["dev"].get(sel))
  lam, metrics, call = hybrid(setting, dense[best["row"]], config.hybrid, lat[4])
  prepared = setting.prepared
  bm25_bytes = int(round(prepared.bm25.doc_vectors.nnz / prepared.collection.num_docs * 8))
  return {"row": f"hybrid ({best['row']} + BM25)", "scorer": "hybrid", "mode": "rerank",
          "encoder": "frozen", "collection": best["collection"], "n_train": best["n_train"],
          "metrics": metrics["test"]["mean"], "dev": metrics["dev"],
          "per_query": per_query(metrics["test"], setting.measures[0]),
          "dense": best["row"], "lambda": lam,
          "bytes_per_doc": int(best["bytes_per_doc"]) + bm25_bytes,
          "bm25_bytes_per_doc": bm25_bytes, "trained": best.get("trained"),
          "loss": best.get("loss"), "teacher": best.get("teacher")}, call
