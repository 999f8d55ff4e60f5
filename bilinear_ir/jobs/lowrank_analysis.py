"""The `lowrank_analysis` job: SVD truncation of a trained full bilinear W (paper 000, section 5).

For each frozen embedding of the bilinear table (`defaults.EMBEDDINGS`) and each training seed,
the full bilinear `W` [n, n] is trained with the table's recipe (`config.train` +
`config.train_overrides`, selected on the dev split carved out of train) and then only analysed:

  * its spectrum sigma_1 >= ... >= sigma_n (Fig. 1c);
  * the best rank-r approximation `W_r = P Q^T` (`lowrank.lowrank_params(W, r)`, scored by the
    `lowrank` scorer, full-corpus exact retrieval) on dev and test at every rank of
    `config.ranks` (Fig. 1a) and against sigma_{r+1} (Fig. 1b), as a share of the full W's metric,
    with parameters counted as the paper does (n r) and as stored (P and Q: 2 n r) against n^2;
  * Theorem 3, `|s_W(q, d) - s_Wr(q, d)| <= sigma_{r+1} |q| |d|`, checked on real pairs (each
    test query with its top docs under W and random docs) at every rank, and at the tightness
    witness `(u_{r+1}, v_{r+1})`;
  * the ranks the spectrum suggests (`lowrank.select_rank` by energy and by bound) against the
    ranks best on dev and on test and the smallest rank reaching a share of the full W on dev.

This is the paper's Fig. 1 procedure: one trained full W, truncated after training. The
reproduce_table job's low-rank rows are different models (P Q^T trained at each rank).

Curves are means over the training seeds; the spectrum is the mean of the seeds' sorted spectra.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import jax.numpy as jnp
import numpy as np

from bilinear_ir import defaults
from bilinear_ir import lowrank
from bilinear_ir import scorers
from bilinear_ir import progress
from bilinear_ir.data import pipeline
from bilinear_ir.errors import require
from bilinear_ir.experiment import evaluate as evaluate_lib
from bilinear_ir.experiment import rows as rows_lib
from bilinear_ir.experiment import spec as spec_lib
from bilinear_ir.experiment import validation
from bilinear_ir.jobs import report
from bilinear_ir.retrieval import ranking

# Paper 000, section 5 (MS MARCO, n = 768, MRR@10): share of the full W's MRR@10 per rank, and
# the spectrum of its learned W.
PAPER = {"collection": "MS MARCO", "n": 768, "measure": "mrr@10",
         "share": {32: 0.508, 64: 0.689, 96: 0.861},
         "mrr@10": {32: 0.0417, 64: 0.0565, 96: 0.0707},
         "params": {96: 73_728, "full": 589_824},
         "sigma_first": 5.467, "sigma_last": 0.0004,
         "gains": {"2->16": 1.35, "16->64": 0.75, "96->full": 0.25}}
_FULL_W = {"scorer": "bilinear", "rank": None, "residual": None}
PROCEDURE = ("SVD truncation W_r of one trained full W per embedding and seed (the paper's Fig. 1 "
             "procedure); not the reproduce_table job's low-rank rows, which train P Q^T at each "
             "rank")


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
    metrics, _ = evaluate_lib.evaluate_scorer(module, params, emb.queries[rows], emb.docs,
                                              split.query_ids, doc_ids, split.qrels, mode="full",
                                              depth=config.eval.depth, measures=measures)
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


def _mean(values: Sequence[float]) -> float:
  return float(np.mean(values))


def summarize(per_seed: list[dict[str, Any]], ranks: Sequence[int],
              selections: list[dict[str, Any]], config) -> dict[str, Any]:
  """One embedding's results from its seeds' `analyze` outputs (metrics: means over seeds)."""
  measures = list(config.eval.measures)
  m0 = measures[0]
  n = len(per_seed[0]["spectrum"])
  spectrum = np.mean([a["spectrum"] for a in per_seed], axis=0)
  energy = np.concatenate([[0.0], np.cumsum(spectrum ** 2)]) / np.sum(spectrum ** 2)
  full = {s: {m: _mean([a["full"][s][m] for a in per_seed]) for m in measures}
          for s in ("dev", "test")}
  rows, checks = [], {}
  for r in ranks:
    test = {m: _mean([a["by_rank"][r]["test"][m] for a in per_seed]) for m in measures}
    dev = {m: _mean([a["by_rank"][r]["dev"][m] for a in per_seed]) for m in measures}
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


def validate(config) -> None:
  """Refuses a bad config before any work (`experiment.validation`)."""
  validation.check_table(config, hybrid_block=False)
  validation.integers(config.ranks, "ranks", low=1)
  validation.one_of(config.eval.mode, ("full",), "eval.mode")
  validation.one_of(config.data.folds, (0,), "data.folds")
  validation.real(config.data.dev_fraction, "data.dev_fraction", 0.0, 0.9, low_open=True)
  validation.integer(config.pointwise.top_docs, "pointwise.top_docs", 0)
  validation.integer(config.pointwise.random_docs, "pointwise.random_docs", 0)
  require(config.pointwise.top_docs + config.pointwise.random_docs >= 1,
          "pointwise.top_docs + pointwise.random_docs must be >= 1", field="pointwise")
  validation.real(config.pointwise.tolerance, "pointwise.tolerance", 0.0)
  for key in ("energy", "bound"):
    for x in config.rank_selection[key]:
      validation.real(x, f"rank_selection.{key}", 0.0, 1.0, low_open=True)
  validation.real(config.rank_selection.share, "rank_selection.share", 0.0, 1.0, low_open=True)
  validation.check_model(spec_lib.model_block(config.model, _FULL_W))


def run(config, workdir: str) -> report.Report:  # pylint: disable=unused-argument
  """The `lowrank_analysis` job (configs/lowrank_analysis.py)."""
  out, info = {}, {}
  bar = progress.bar(len(config.embeddings) * len(config.seeds), "full W", unit="model")
  for recipe, prepared, (splitset, *_) in spec_lib.embeddings_of(config):
    emb_name = recipe.name
    require(len(splitset.dev.query_ids) > 0, "rank selection needs a dev split; set "
            "data.dev_fraction > 0", field="data.dev_fraction")
    outs = rows_lib.seed_runs(recipe, _FULL_W, config.seeds, prepared, splitset,
                              each=lambda *_: bar.update(1))
    trained = [(seed, np.asarray(o["params"]["W"], np.float32), o["best_step"])
               for seed, o in zip(config.seeds, outs)]
    spectra = [np.asarray(lowrank.spectrum(jnp.asarray(W)), np.float64) for _, W, _ in trained]
    selections = select_ranks(np.mean(spectra, axis=0), config.rank_selection)
    ranks = evaluated_ranks(config.ranks, prepared.dim, [s["rank"] for s in selections])
    per_seed = [analyze(W, prepared, splitset, config, ranks, seed) for seed, W, _ in trained]
    res = summarize(per_seed, ranks, selections, config)
    spec = defaults.embedding_spec(emb_name)
    res.update(pooling=spec.get("pooling"), normalize=spec["normalize"], seeds=list(config.seeds),
               best_steps=[b for _, _, b in trained],
               distance_from_identity=_mean([
                   float(np.linalg.norm(W - np.eye(W.shape[0])) / np.sqrt(W.shape[0]))
                   for _, W, _ in trained]))
    out[emb_name] = res
    m0 = config.eval.measures[0]
    bar.write(f"{emb_name:>4}: full W test {m0} {res['full']['test'][m0]:.4f}; "
              + ", ".join(f"r={row['rank']}: {row[m0]:.4f}" for row in res["by_rank"]))
    info = {"collection": prepared.collection.name, "test_queries": len(splitset.test.query_ids),
            "dev_queries": len(splitset.dev.query_ids)}
  bar.close()
  first = config.embeddings[0]
  embs = list(out.values())
  count = sum(e["pointwise_checks"] for e in embs)
  ratio_count = sum(e["error_over_bound_count"] for e in embs)
  results = {
      "pointwise_checks": count,
      "pointwise_violations": sum(e["pointwise_violations"] for e in embs),
      "max_error_over_bound": max(e["max_error_over_bound"] for e in embs),
      "mean_error_over_bound": (sum(e["mean_error_over_bound"] * e["error_over_bound_count"]
                                    for e in embs if e["error_over_bound_count"]) / ratio_count
                                if ratio_count else None),
      "pointwise_tolerance": float(config.pointwise.tolerance),
      "by_rank": out[first]["by_rank"],
      "primary_embedding": first,
      "embeddings": out,
      "measure": config.eval.measures[0],
      "seeds": list(config.seeds),
      "procedure": PROCEDURE,
      "paper": PAPER,
      **info,
  }
  return report.Report(results=results, markdown=markdown(results, config),
                       figures=figures(results, config))


def _pct(x: float | None) -> str:
  return "-" if x is None else f"{100 * x:.1f}%"


def markdown(results: dict[str, Any], config) -> str:
  """The per-rank table of each embedding, the Theorem 3 checks, rank selection, findings."""
  measures = list(config.eval.measures)
  m0 = measures[0]
  out = ["# Low-rank truncation of a trained full bilinear W (paper 000, section 5)\n\n",
         f"{PROCEDURE[0].upper() + PROCEDURE[1:]}. Collection: {results['collection']} "
         f"({results['dev_queries']} dev / {results['test_queries']} test queries), full-corpus "
         f"exact retrieval, {len(results['seeds'])} training seed(s) "
         f"{results['seeds']} (curves are means over seeds).\n"]
  for emb, e in results["embeddings"].items():
    n = e["dim"]
    header = (["rank", "σ_{r+1}", "σ_{r+1}/σ_1", "energy kept", "params n·r",
               "stored 2n·r", "n²/(n·r)", f"dev {m0}"] + [f"test {m}" for m in measures]
              + [f"% of full (test {m0})", "mean err/bound", "max err/bound"])
    rows = [["full W", "-", "-", "100%", n * n, n * n, "1.0", f"{e['full']['dev'][m0]:.4f}"]
            + [f"{e['full']['test'][m]:.4f}" for m in measures] + ["100%", "-", "-"]]
    for r in e["by_rank"]:
      pw = r["pointwise"]
      rows.append([r["rank"], f"{r['sigma_next']:.4g}", f"{r['sigma_next_over_sigma1']:.3g}",
                   _pct(r["energy"]), r["params_paper"], r["params_stored"],
                   f"{r['compression_paper']:.1f}", f"{r['dev'][m0]:.4f}"]
                  + [f"{r[m]:.4f}" for m in measures]
                  + [_pct(r["share_of_full"]),
                     "-" if pw["error_over_bound_mean"] is None
                     else f"{pw['error_over_bound_mean']:.3g}",
                     "-" if pw["error_over_bound_max"] is None
                     else f"{pw['error_over_bound_max']:.3g}"])
    out.append(f"\n## {emb}: {defaults.describe_embedding(emb, config.encoder.model)}, n = {n}\n\n")
    out.append(report.markdown_table(rows, header))
    sel = e["rank_selection"]
    srows = [[f"spectrum: {s['criterion']} {s['target']:g}", s["rank"], f"{s['dev']:.4f}",
              f"{s['test']:.4f}", _pct(s["share_of_full"])] for s in sel["spectrum"]]
    srows.append(["best on dev", sel["best_dev"]["rank"], f"{sel['best_dev']['dev']:.4f}",
                  f"{sel['best_dev']['test']:.4f}", _pct(sel["best_dev"]["share_of_full"])])
    srows.append(["best on test", sel["best_test"]["rank"], f"{sel['best_test']['dev']:.4f}",
                  f"{sel['best_test']['test']:.4f}", _pct(sel["best_test"]["share_of_full"])])
    reach = sel["smallest_reaching_share_dev"]
    if reach is not None:
      srows.append([f"smallest r with dev >= {_pct(reach['share'])} of full", reach["rank"],
                    f"{reach['dev']:.4f}", f"{reach['test']:.4f}",
                    _pct(reach["share_of_full"])])
    out.append("\nRank selection (energy: share of Σσ² kept; bound: σ_{r+1}/σ_1 <= "
               "target):\n\n")
    out.append(report.markdown_table(srows, ["rule", "rank", f"dev {m0}", f"test {m0}",
                                             f"% of full (test {m0})"]))
  out.append("\n" + findings(results, config))
  return "".join(out)


def _g(x: float | None) -> str:
  return "-" if x is None else f"{x:.3g}"


def _share_at(e: dict[str, Any], rank: int, measure: str) -> float | None:
  row = next((r for r in e["by_rank"] if r["rank"] == rank), None)
  return None if row is None else row["share_of_full_by_measure"][measure]


def _gain(e: dict[str, Any], a: int, b: int, measure: str) -> float | None:
  by = {r["rank"]: r[measure] for r in e["by_rank"]}
  if a not in by or b not in by or not by[a]:
    return None
  return by[b] / by[a] - 1.0


def findings(results: dict[str, Any], config) -> str:
  """What the numbers say, computed from them, next to the paper's section 5."""
  m0 = config.eval.measures[0]
  lines = ["## What the numbers say\n\n"]
  for emb, e in results["embeddings"].items():
    s = e["spectrum"]
    n = e["dim"]
    by_energy = {t: lowrank.select_rank(np.asarray(s), t, "energy") for t in (0.5, 0.9, 0.99)}
    vals = [r[m0] for r in e["by_rank"]]
    rising = all(b >= a - 1e-9 for a, b in zip(vals, vals[1:]))
    shares = ", ".join(
        f"r={r}: {_pct(_share_at(e, r, m0))} of {m0}"
        + (f" / {_pct(_share_at(e, r, 'mrr@10'))} of mrr@10"
           if "mrr@10" in config.eval.measures and m0 != "mrr@10" else "")
        for r in PAPER["share"] if _share_at(e, r, m0) is not None)
    sel = e["rank_selection"]
    spec = ", ".join(f"{x['criterion']} {x['target']:g} -> r={x['rank']} "
                     f"({_pct(x['share_of_full'])})" for x in sel["spectrum"])
    reach = sel["smallest_reaching_share_dev"]
    gains = [(k, _gain(e, a, b, "mrr@10" if "mrr@10" in config.eval.measures else m0))
             for k, (a, b) in (("2->16", (2, 16)), ("16->64", (16, 64)), ("96->n", (96, n)))]
    wr = e["witness_error_over_bound_range"]
    witness_txt = "-" if wr is None else f"{wr[0]:.7f} to {wr[1]:.7f}"
    gains_txt = ", ".join(f"{k}: {g:+.0%}" for k, g in gains if g is not None)
    lines.append(
        f"- **{emb}** (W trained from the identity, selected at step(s) {e['best_steps']}; "
        f"‖W − I‖_F/√n = {e['distance_from_identity']:.3f}): the spectrum falls from "
        f"σ_1 = {s[0]:.4g} to σ_n = {s[-1]:.4g}, {_g(e['spectrum_decay_orders'])} orders of "
        f"magnitude (paper: {PAPER['sigma_first']} to {PAPER['sigma_last']}, over four), "
        f"median σ_i {float(np.median(s)):.3f} (the identity W starts from has every σ_i = 1, "
        f"and directions training leaves alone keep it); "
        f"50% / 90% / 99% of Σσ² lie in the top {by_energy[0.5]} / {by_energy[0.9]} / "
        f"{by_energy[0.99]} of {n} directions. Truncation keeps {shares} of the full W "
        f"(paper, MRR@10 on MS MARCO: 50.8% at r=32, 68.9% at r=64, 86.1% at r=96); test {m0} "
        f"{'rises monotonically' if rising else 'does not rise monotonically'} with rank; "
        f"relative gains in mrr@10 {gains_txt} (paper: +135% 2->16, +75% to 64, +25% beyond "
        f"96). The spectrum suggests {spec}; best on dev r={sel['best_dev']['rank']} "
        f"({_pct(sel['best_dev']['share_of_full'])} of full on test), best on test "
        f"r={sel['best_test']['rank']}"
        + (f"; the smallest rank reaching {_pct(reach['share'])} of full on dev is "
           f"r={reach['rank']} ({_pct(reach['share_of_full'])} on test, "
           f"n²/(n·r) = {n / reach['rank']:.1f}x compression)"
           if reach is not None else "")
        + f". Theorem 3: {e['pointwise_checks']:,} checks on {e['pointwise_pairs']:,} real "
        f"(test query, doc) pairs x {len(e['by_rank'])} ranks, {e['pointwise_violations']} "
        f"violations, max err/bound {e['max_error_over_bound']:.3g}, mean "
        f"{_g(e['mean_error_over_bound'])} (top docs {_g(e['mean_error_over_bound_top'])}, "
        f"random docs {_g(e['mean_error_over_bound_random'])}): on real pairs the error is "
        f"on average {_pct(e['mean_error_over_bound'])} of the bound, while at the witness "
        f"(u_(r+1), v_(r+1)) err/bound is {witness_txt}.\n")
  lines.append(
      f"\nIn all: {results['pointwise_checks']:,} pointwise checks of Theorem 3 (paper: 60,000), "
      f"{results['pointwise_violations']} violations beyond the float32 tolerance "
      f"({results['pointwise_tolerance']:g} σ_1 |q||d|), max err/bound "
      f"{results['max_error_over_bound']:.3g}. The paper counts parameters as n·r (73,728 at "
      "r = 96, n = 768); the stored factors P and Q hold 2·n·r.\n")
  return "".join(lines)


def figures(results: dict[str, Any], config) -> dict[str, Any]:
  """Fig. 1a (metric vs rank), 1b (metric vs sigma_{r+1}, log x), 1c (spectrum, log y)."""
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top
  m0 = config.eval.measures[0]
  colors = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
  fig_a, fig_b, fig_c = (Figure(figsize=(5.5, 4)) for _ in range(3))
  ax_a, ax_b, ax_c = fig_a.subplots(), fig_b.subplots(), fig_c.subplots()
  for i, (emb, e) in enumerate(results["embeddings"].items()):
    c = colors[i % len(colors)]
    ranks = [r["rank"] for r in e["by_rank"]]
    ax_a.plot(ranks, [r[m0] for r in e["by_rank"]], "o-", color=c, label=f"{emb}: W_r test")
    ax_a.plot(ranks, [r["dev"][m0] for r in e["by_rank"]], "s--", color=c, alpha=0.6,
              label=f"{emb}: W_r dev")
    ax_a.axhline(e["full"]["test"][m0], color=c, ls=":", label=f"{emb}: full W test")
    pts = [r for r in e["by_rank"] if r["sigma_next"] > 0]
    ax_b.plot([r["sigma_next"] for r in pts], [r[m0] for r in pts], "o-", color=c, label=emb)
    for r in pts:
      ax_b.annotate(str(r["rank"]), (r["sigma_next"], r[m0]), fontsize=6,
                    textcoords="offset points", xytext=(3, 3))
    s = np.asarray(e["spectrum"])
    ax_c.semilogy(np.arange(1, s.size + 1), np.maximum(s, 1e-30), "-", color=c, label=emb)
  ax_a.set_xscale("log", base=2)
  ax_a.set_xlabel("rank r")
  ax_a.set_ylabel(m0)
  ax_a.set_title("Fig. 1a: truncated W_r vs rank")
  ax_b.set_xscale("log")
  ax_b.xaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
  ax_b.xaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
  ax_b.xaxis.set_minor_formatter(ticker.NullFormatter())
  ax_b.set_xlabel(r"$\sigma_{r+1}$")
  ax_b.set_ylabel(f"test {m0}")
  ax_b.set_title("Fig. 1b: metric vs next singular value")
  ax_c.set_xlabel("index i")
  ax_c.set_ylabel(r"$\sigma_i$")
  ax_c.set_title("Fig. 1c: singular values of the trained W")
  for fig, ax in ((fig_a, ax_a), (fig_b, ax_b), (fig_c, ax_c)):
    ax.legend(fontsize=7)
    fig.tight_layout()
  return {"fig1a_metric_vs_rank": fig_a, "fig1b_metric_vs_sigma_next": fig_b,
          "fig1c_spectrum": fig_c}
