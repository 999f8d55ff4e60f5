"""SVD truncation of a trained full bilinear W, evaluated at every rank (paper 000, section 5).

`analyze` takes one trained W [n, n] and measures its spectrum, the best rank-r approximation
`W_r = P Q^T` (`lowrank.truncate`, scored by the `lowrank` scorer with full-corpus exact
retrieval) on dev and test at every rank, and Theorem 3 on real (query, doc) pairs and at the
tightness witness; `summarize` turns the seeds' analyses into one embedding's results (means over
seeds, parameter counts, the ranks the spectrum suggests against the ranks best on dev and test).
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import jax.numpy as jnp
import numpy as np

from bilinear_ir import lowrank
from bilinear_ir import scorers
from bilinear_ir.config import embedding_specs
from bilinear_ir.data import pipeline
from bilinear_ir.experiment import evaluate as evaluate_lib
from bilinear_ir.experiment import rows as rows_lib
from bilinear_ir.experiment import spec as spec_lib
from bilinear_ir.retrieval import ranking

FULL_W = {"scorer": "bilinear", "rank": None, "residual": None}  # the row that is truncated


def evaluated_ranks(ranks: Sequence[int], n: int, extra: Sequence[int] = ()) -> list[int]:
  """Sorted distinct ranks in [1, n] from `ranks` and `extra`, always with r = n (W_r = W)."""
  return sorted({int(r) for r in (*ranks, *extra) if 1 <= int(r) <= n} | {n})


def select_ranks(S: np.ndarray, cfg) -> list[dict[str, Any]]:
  """The ranks the spectrum S [n] suggests: [{"criterion", "target", "rank"}] (rank >= 1)."""
  out = []
  for criterion in ("energy", "bound"):
    for target in cfg[criterion]:
      r = lowrank.select_rank(S, float(target), criterion)
      out.append({"criterion": criterion, "target": float(target), "rank": max(int(r), 1)})
  return out


def analyze(W: np.ndarray, prepared: pipeline.Prepared, splitset: pipeline.SplitSet, config,
            ranks: Sequence[int], seed: int) -> dict[str, Any]:
  """Everything this job measures on one trained W [n, n].

  Args:
    W: the trained full bilinear matrix.
    prepared, splitset: the data (dev and test are evaluated, test pairs are checked).
    config: the job config (`eval`, `pointwise`).
    ranks: the ranks r evaluated (each in [1, n]).
    seed: draws the random docs of the pointwise pairs.

  Returns:
    {"spectrum": [n], "full": {"dev", "test"}: {measure}, "by_rank": {r: {"dev", "test",
     "pointwise", "witness"}}, "pairs": M}.
  """
  emb = prepared.embeddings
  W = np.asarray(W, np.float32)
  n = W.shape[0]
  measures = tuple(config.eval.measures)
  doc_ids = prepared.collection.doc_ids
  splits = {"dev": splitset.dev, "test": splitset.test}

  def evaluate(module, params, split):
    rows = prepared.query_row_index(split.query_ids)
    metrics, _ = evaluate_lib.RankingEvaluator(split.query_ids, doc_ids, split.qrels, measures,
                                               "full", config.eval.depth)(
        module, params, emb.queries[rows], emb.docs)
    return metrics["mean"]

  full_module, full_params = scorers.build("bilinear", dim=n), {"W": jnp.asarray(W)}
  full = {name: evaluate(full_module, full_params, split) for name, split in splits.items()}

  q_test = np.asarray(emb.queries[prepared.query_row_index(splitset.test.query_ids)])
  top_idx = np.zeros((q_test.shape[0], 0), np.int64)
  if config.pointwise.top_docs:
    top_idx, _ = ranking.score_topk(full_module, full_params, q_test, emb.docs,
                                    config.pointwise.top_docs)
  q_pos, d_rows, is_top = lowrank.pointwise_pairs(top_idx, emb.docs.shape[0],
                                                  config.pointwise.random_docs,
                                                  np.random.default_rng([seed, 3]))
  q, d = q_test[q_pos], np.asarray(emb.docs)[d_rows]

  decomposition = lowrank.svd(jnp.asarray(W))
  S = np.asarray(decomposition.S)
  by_rank = {}
  for r in ranks:
    factors = dict(zip(("P", "Q"), lowrank.truncate(jnp.asarray(W), r, decomposition)))
    module = scorers.build("lowrank", dim=n, rank=r, residual="none")
    by_rank[r] = {name: evaluate(module, factors, split) for name, split in splits.items()}
    by_rank[r]["pointwise"] = lowrank.check_theorem3(W, S, factors, r, q, d, is_top,
                                                     config.pointwise.tolerance)
    by_rank[r]["witness"] = lowrank.witness_ratio(W, decomposition, factors, r)
  return {"spectrum": S.astype(np.float64), "full": full, "by_rank": by_rank,
          "pairs": int(q_pos.size)}


def mean(values: Sequence[float]) -> float:
  """float(np.mean(values))."""
  return float(np.mean(values))


def summarize(per_seed: list[dict[str, Any]], ranks: Sequence[int],
              selections: list[dict[str, Any]], config) -> dict[str, Any]:
  """One embedding's results from its seeds' `analyze` outputs (metrics: means over seeds)."""
  measures = list(config.eval.measures)
  m0 = measures[0]
  n = len(per_seed[0]["spectrum"])
  spectrum = np.mean([a["spectrum"] for a in per_seed], axis=0)
  energy = np.concatenate([[0.0], np.cumsum(spectrum ** 2)]) / np.sum(spectrum ** 2)
  full = {s: {m: mean([a["full"][s][m] for a in per_seed]) for m in measures}
          for s in ("dev", "test")}
  rows, checks = [], {}
  for r in ranks:
    test = {m: mean([a["by_rank"][r]["test"][m] for a in per_seed]) for m in measures}
    dev = {m: mean([a["by_rank"][r]["dev"][m] for a in per_seed]) for m in measures}
    pw = [a["by_rank"][r]["pointwise"] for a in per_seed]
    total = {k: sum(p[k] for p in pw) for k in ("checks", "violations", "ratio_sum",
                                                 "ratio_count", "ratio_sum_top",
                                                 "ratio_count_top")}
    total["ratio_max"] = max(p["ratio_max"] for p in pw)
    total["max_excess"] = max(p["max_excess"] for p in pw)
    checks[r] = total
    witnesses = [a["by_rank"][r]["witness"] for a in per_seed]
    sigma = float(spectrum[r]) if r < n else 0.0
    row = {"rank": r, "sigma_next": sigma, "sigma_next_over_sigma1": sigma / float(spectrum[0]),
           "energy": float(energy[r]), "params_paper": n * r, "params_stored": 2 * n * r,
           "compression_paper": n / r, "compression_stored": n / (2 * r),
           **test, "dev": dev,
           "share_of_full": test[m0] / full["test"][m0] if full["test"][m0] else None,
           "share_of_full_dev": dev[m0] / full["dev"][m0] if full["dev"][m0] else None,
           "share_of_full_by_measure": {m: test[m] / full["test"][m] if full["test"][m] else None
                                        for m in measures},
           "pointwise": {"checks": total["checks"], "violations": total["violations"],
                         "error_over_bound_mean": (total["ratio_sum"] / total["ratio_count"]
                                                   if total["ratio_count"] else None),
                         "error_over_bound_max": (total["ratio_max"] if total["ratio_count"]
                                                  else None),
                         "witness_error_over_bound": (None if witnesses[0] is None
                                                      else max(witnesses))}}
    if len(per_seed) > 1:
      row["std"] = {m: float(np.std([a["by_rank"][r]["test"][m] for a in per_seed]))
                    for m in measures}
    rows.append(row)
  by = {row["rank"]: row for row in rows}

  def pick(rank: int, **extra) -> dict[str, Any]:
    return {**extra, "rank": rank, "dev": by[rank]["dev"][m0], "test": by[rank][m0],
            "share_of_full": by[rank]["share_of_full"],
            "share_of_full_dev": by[rank]["share_of_full_dev"]}

  best_dev = max(ranks, key=lambda r: (by[r]["dev"][m0], -r))
  best_test = max(ranks, key=lambda r: (by[r][m0], -r))
  share = float(config.rank_selection.share)
  reaching = [r for r in ranks if by[r]["dev"][m0] >= share * full["dev"][m0]]
  witness = [w for a in per_seed for r in ranks
             if (w := a["by_rank"][r]["witness"]) is not None]
  ratio_count = sum(c["ratio_count"] for c in checks.values())
  ratio_count_top = sum(c["ratio_count_top"] for c in checks.values())
  ratio_sum = sum(c["ratio_sum"] for c in checks.values())
  ratio_sum_top = sum(c["ratio_sum_top"] for c in checks.values())
  return {
      "pointwise_checks": sum(c["checks"] for c in checks.values()),
      "pointwise_violations": sum(c["violations"] for c in checks.values()),
      "max_error_over_bound": max(c["ratio_max"] for c in checks.values()),
      "mean_error_over_bound": ratio_sum / ratio_count if ratio_count else None,
      "error_over_bound_count": ratio_count,
      "mean_error_over_bound_top": ratio_sum_top / ratio_count_top if ratio_count_top else None,
      "mean_error_over_bound_random": ((ratio_sum - ratio_sum_top)
                                       / (ratio_count - ratio_count_top)
                                       if ratio_count > ratio_count_top else None),
      "max_excess_over_sigma1": max(c["max_excess"] for c in checks.values()),
      "witness_error_over_bound_range": [min(witness), max(witness)] if witness else None,
      "pointwise_pairs": per_seed[0]["pairs"],
      "by_rank": rows,
      "dim": n,
      "full": {**full, "params": n * n},
      "spectrum": [float(s) for s in spectrum],
      "spectrum_decay_orders": (math.log10(spectrum[0] / spectrum[-1]) if spectrum[-1] > 0
                                else None),
      "rank_selection": {
          "spectrum": [pick(s["rank"], criterion=s["criterion"], target=s["target"])
                       for s in selections],
          "best_dev": pick(best_dev),
          "best_test": pick(best_test),
          "smallest_reaching_share_dev": pick(min(reaching), share=share) if reaching else None,
      },
  }


def trained_and_truncated(recipe: spec_lib.Recipe, prepared: pipeline.Prepared,
                          splitset: pipeline.SplitSet, config, each=None,
                          workdir: str | None = None) -> dict[str, Any]:
  """One embedding's analysis: the full W (`FULL_W`, the recipe's training, selected on dev)
  trained at every seed of `config.seeds`, each truncated and analysed (`analyze`) at the ranks of
  `config.ranks` and those the mean spectrum selects, summarized (`summarize`) with the
  embedding's pooling and normalisation, the seeds, their best steps and the mean
  ‖W − I‖_F / √n. `each`: called after each seed's training; `workdir`: where each seed's
  run checkpoints (`rows.seed_runs`)."""
  outs = rows_lib.seed_runs(recipe, FULL_W, config.seeds, prepared, splitset, each=each,
                            workdir=workdir)
  trained = [(seed, np.asarray(o["params"]["W"], np.float32), o["best_step"])
             for seed, o in zip(config.seeds, outs)]
  spectra = [np.asarray(lowrank.spectrum(jnp.asarray(W)), np.float64) for _, W, _ in trained]
  selections = select_ranks(np.mean(spectra, axis=0), config.rank_selection)
  ranks = evaluated_ranks(config.ranks, prepared.dim, [s["rank"] for s in selections])
  per_seed = [analyze(W, prepared, splitset, config, ranks, seed) for seed, W, _ in trained]
  res = summarize(per_seed, ranks, selections, config)
  spec = embedding_specs.embedding_spec(recipe.name)
  res.update(pooling=spec.get("pooling"), normalize=spec["normalize"], seeds=list(config.seeds),
             best_steps=[b for _, _, b in trained],
             distance_from_identity=mean([
                 float(np.linalg.norm(W - np.eye(W.shape[0])) / np.sqrt(W.shape[0]))
                 for _, W, _ in trained]))
  return res


def pointwise_totals(embs: Sequence[dict[str, Any]]) -> dict[str, Any]:
  """The Theorem 3 checks of several embeddings' results together: counts, violations, the max
  and the (check-weighted) mean err/bound."""
  ratio_count = sum(e["error_over_bound_count"] for e in embs)
  return {
      "pointwise_checks": sum(e["pointwise_checks"] for e in embs),
      "pointwise_violations": sum(e["pointwise_violations"] for e in embs),
      "max_error_over_bound": max(e["max_error_over_bound"] for e in embs),
      "mean_error_over_bound": (sum(e["mean_error_over_bound"] * e["error_over_bound_count"]
                                    for e in embs if e["error_over_bound_count"]) / ratio_count
                                if ratio_count else None),
  }


def share_at(e: dict[str, Any], rank: int, measure: str) -> float | None:
  """W_r's share of the full W's `measure` at `rank` in one embedding's results (None: not
  evaluated)."""
  row = next((r for r in e["by_rank"] if r["rank"] == rank), None)
  return None if row is None else row["share_of_full_by_measure"][measure]


def gain(e: dict[str, Any], a: int, b: int, measure: str) -> float | None:
  """Relative gain in `measure` from rank a to rank b (None: either not evaluated or a's is 0)."""
  by = {r["rank"]: r[measure] for r in e["by_rank"]}
  if a not in by or b not in by or not by[a]:
    return None
  return by[b] / by[a] - 1.0
