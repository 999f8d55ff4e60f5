"""The bilinear paper's real-world table (paper 000, section 4) reproduced on one collection.

For each frozen embedding (e.g. all-MiniLM-L6-v2 "mean" = mean-pooled + normalised, aligned with
the dot product; "cls" = CLS-pooled, unnormalised, misaligned) and each seed: the untrained dot
product, WDP, low-rank `P Q^T` at every rank (pure, as in the paper, and residual `I + P Q^T`),
full bilinear, BM25, and a hybrid of the best learned similarity (picked on dev) with BM25, all
selected on dev (the collection's own dev split, else carved out of train), test only evaluated;
P@1 over each test question's own pool (`p_at_1_pool`) where the collection lists negatives.
"""
from __future__ import annotations

import functools
from typing import Any

from bilinear_ir import progress
from bilinear_ir.config import embedding_specs
from bilinear_ir.errors import require
from bilinear_ir.eval import stats
from bilinear_ir.eval import trec
from bilinear_ir.experiment import compare
from bilinear_ir.experiment import evaluate
from bilinear_ir.experiment import rows as rows_lib
from bilinear_ir.experiment import spec as spec_lib
from bilinear_ir.experiment import validation
from bilinear_ir.export import saved_model
from bilinear_ir.jobs import report

JOB = "reproduce_table"


def validate(config) -> None:
  """Refuses a bad config before any work (`experiment.validation`)."""
  if config.collection:
    validation.check_collection(config.collection, path=config.data.path)
  validation.check_table(config)
  validation.integers(config.ranks, "ranks", low=1)
  for residual in config.residuals:
    validation.one_of(residual, ("none", "identity", "diag"), "residuals")
  for source in config.sources:
    validation.one_of(source, ("ict", "both"), "sources")
  slugs = {spec_lib.row_slug(spec) for spec in spec_lib.table_grid(config)
           if spec["source"] == "qrels"}
  for name in config.source_rows if config.sources else ():
    validation.one_of(name, sorted(slugs), "source_rows")
  if config.sources:
    require(config.encoder.kind == "flax", "ICT pairs are new texts: sources need "
            "encoder.kind 'flax'", field="sources")
  for s in spec_lib.table_grid(config):
    validation.check_model(spec_lib.model_block(config.model, s))
  validation.check_train(spec_lib.Recipe.of(config, "").row(
      {"scorer": "mol"}, 0, config.mol_train).train, "mol_train")


def run(config, workdir: str) -> report.Report:
  """The `reproduce_table` job (configs/reproduce_table.py)."""
  grid = spec_lib.table_grid(config)
  measures = list(config.eval.measures)
  m0, sel = measures[0], config.train.select_metric
  rows, per_query, models, unseen_counts = [], [], {}, {}
  bar = progress.bar(len(config.embeddings) * len(grid) * len(config.seeds), "models",
                     unit="model")
  data = (spec_lib.collection_block(config.data, config.collection) if config.collection
          else config.data)
  for recipe, prepared, (splitset, *_) in spec_lib.embeddings_of(config, data):
    emb_name, test = recipe.name, splitset.test
    base = {"embedding": emb_name, "mode": config.eval.mode, "rank": None, "residual": None}
    unseen = rows_lib.unseen_doc_queries([splitset])
    unseen_counts[emb_name] = len(unseen)
    dot, bm25, bm25_run = rows_lib.baselines(recipe, prepared, [splitset], measures)
    pools = evaluate.candidate_pools(prepared, test)  # None: no answer-selection view
    pool = lambda runs: rows_lib.pool_p_at_1(prepared, test, pools, runs,  # noqa: E731
                                             config.hybrid.normalize)
    for row, out, runs in zip(rows_lib.baseline_rows(dot, bm25, unseen, measures), (dot, bm25),
                              ([(1.0, dot["module"], dot["params"])], [(0.0, None, None)])):
      row["metrics"] = {**row["metrics"], **pool(runs)}
      rows.append({**base, **row})
      per_query.append(rows_lib.seed_mean([out["per_query"]], m0))
    trained = []
    for s in grid:
      outs = rows_lib.seed_runs(recipe, s, config.seeds, prepared, splitset,
                                train=config.mol_train if s["scorer"] == "mol" else None,
                                each=lambda *_: bar.update(1), workdir=workdir)
      row = {**base, **s, **rows_lib.summary(outs, measures, sel, unseen)}
      row["metrics"].update(pool([(1.0, o["module"], o["params"]) for o in outs]))
      rows.append(row)
      per_query.append(rows_lib.seed_mean([o["per_query"] for o in outs], m0))
      for seed, o in zip(config.seeds, outs):
        models[f"{emb_name}/{spec_lib.row_slug(s)}/seed{seed}"] = (
            o["module"], o["params"], prepared.embeddings.manifest["settings"],
            {"collection": prepared.collection.name, "seed": int(seed),
             "row": spec_lib.row_label(s)})
      trained.append((s, outs, row["dev"][sel]))
      bar.write(f"{emb_name:>4} {spec_lib.row_label(s):<28} test {m0} "
                f"{row['metrics'][m0]:.4f} +- "
                f"{row['std'][m0]:.4f} (dev {sel} {report.fmt(row['dev'][sel], 4)})")
    # The hybrid's dense partner: the row best on the judged dev split (ICT rows select on
    # held-out ICT pairs, whose metric is not comparable).
    best, best_outs, _ = rows_lib.best_on_dev([t for t in trained if t[0]["source"] != "ict"],
                                              lambda t: t[2])
    hybrid = evaluate.HybridEvaluator(splitset.dev, prepared.collection.doc_ids, config.hybrid,
                                      measures)
    hyb = []
    for o in best_outs:
      lam, res = hybrid(evaluate.full_corpus(o["module"], o["params"], prepared,
                                             config.hybrid.depth), {"test": splitset.test})
      hyb.append((res["test"][0], lam))
    mean, std = rows_lib.aggregate([h[0]["mean"] for h in hyb], measures)
    mean.update(pool([(h[1], o["module"], o["params"]) for h, o in zip(hyb, best_outs)]))
    rows.append({**base, "scorer": "hybrid", "rank": best["rank"], "residual": best["residual"],
                 "dense": spec_lib.row_label(best), "lambda": [h[1] for h in hyb],
                 "metrics": mean,
                 "std": std, "seeds": len(hyb),
                 "unseen_docs": rows_lib.unseen_mean([h[0] for h in hyb], unseen, m0)})
    per_query.append(rows_lib.seed_mean([h[0]["per_query"] for h in hyb], m0))
  bar.close()
  compare.against_baselines(rows, per_query, ("embedding",), config)
  coll = prepared.collection.name
  results = {"rows": rows, "collection": coll, "test_queries": len(test.query_ids),
             "seeds": list(config.seeds), "std": "sample std (ddof = 1) over the seeds",
             "paired": f"{m0} per query (mean over seeds) against dot and against BM25: "
                       "randomization test, Holm-adjusted over each family (eval.stats)",
             "unseen_doc_queries": unseen_counts}
  if "p_at_1_pool" in rows[0]["metrics"]:
    results["p_at_1_pool"] = report.prose(JOB, "pool").strip()
  return report.Report(results=results, markdown=markdown(rows, config, unseen_counts, coll),
                       figures={"metric_vs_rank": plot(rows, config)},
                       extra_files={"run_bm25.trec": trec.run_to_text(bm25_run, "bm25")},
                       folders={"models": functools.partial(saved_model.save_many,
                                                            models=models)})


def _row_name(row: dict[str, Any]) -> str:
  if row["scorer"] == "hybrid":
    return f"hybrid ({row['dense']} + BM25)"
  if row["scorer"] in ("dot", "bm25"):
    return {"dot": "dot (untrained)", "bm25": "BM25"}[row["scorer"]]
  return spec_lib.row_label(row)


def markdown(rows: list[dict[str, Any]], config, unseen_counts: dict[str, int],
             collection: str = "SciFact") -> str:
  """The results table per embedding (mean +- std over seeds) and what it says."""
  measures = list(config.eval.measures)
  m0 = measures[0]
  out = ["# Learned similarities over frozen embeddings (paper 000, section 4)\n"]
  for emb in config.embeddings:
    table = []
    for r in rows:
      if r["embedding"] != emb:
        continue
      cells = [_row_name(r)]
      for m in measures:
        cells.append(f"{r['metrics'][m]:.4f}" + (f" ± {r['std'][m]:.4f}" if r["seeds"] > 1
                                                  else ""))
      if "p_at_1_pool" in r["metrics"]:
        cells.append(f"{r['metrics']['p_at_1_pool']:.4f}")
      cells.append(f"{r['unseen_docs'][m0]:.4f}")
      cells += [report.fmt_paired(r.get("vs_dot"), config.stats.alpha, ci=False),
                report.fmt_paired(r.get("vs_bm25"), config.stats.alpha, ci=False)]
      table.append(cells)
    n = len(config.seeds)
    what = embedding_specs.describe_embedding(emb, config.encoder.model)
    out.append(f"\n## {emb}: {what} ({n} seed{'s' * (n > 1)})\n\n")
    out.append(report.markdown_table(
        table, ["model"] + measures + ["P@1 own pool"] * ("p_at_1_pool" in rows[0]["metrics"])
        + [f"{m0} unseen docs ({unseen_counts[emb]} q)",
                                       f"{m0} vs dot", f"{m0} vs BM25"]))
  out.append("\n" + report.prose(JOB, "units", seeds=len(config.seeds), m0=m0,
                                 alpha=config.stats.alpha))
  pool = "p_at_1_pool" in rows[0]["metrics"]
  out.append("\n" + report.prose(JOB, "unseen", m0=m0, pool=report.prose(
      JOB, "pool").rstrip("\n") if pool else ""))
  out.append("\n" + findings(rows, config, collection))
  return "".join(out)


def findings(rows: list[dict[str, Any]], config, collection: str = "SciFact") -> str:
  """Where the numbers agree and disagree with the paper, computed from the rows: every "above"
  is a Holm-adjusted paired test against dot, and the best learned similarity is the one best
  on dev."""
  m = config.eval.measures[0]
  alpha, sel = config.stats.alpha, config.train.select_metric

  def versus(r: dict[str, Any]) -> str:
    mark = stats.mark(r["vs_dot"], alpha)
    word = {stats.GAIN: "significantly above", stats.LOSS: "significantly below"}.get(
        mark, "not significantly different from")
    return f"{word} dot, p = {r['vs_dot'].get('p_holm', r['vs_dot']['p_perm']):.2g}"

  val = lambda r: r["metrics"][m]
  listed = lambda rs: ", ".join(f"r={r}: {val(x):.4f}" for r, x in rs)
  sig = lambda rs: sum(stats.mark(x["vs_dot"], alpha) == stats.GAIN for _, x in rs)
  lines = ["## What the numbers say\n"]
  for emb in config.embeddings:
    every = [r for r in rows if r["embedding"] == emb]
    mine = [r for r in every if r.get("source", "qrels") == "qrels"]
    by = {(r["scorer"], r["rank"], r["residual"]): r for r in mine}
    dot, bm25 = by[("dot", None, None)], by[("bm25", None, None)]
    pure = [(r, by[("lowrank", r, "none")]) for r in config.ranks if ("lowrank", r, "none") in by]
    resid = [(r, by[("lowrank", r, "identity")]) for r in config.ranks
             if ("lowrank", r, "identity") in by]
    rising = all(val(b) >= val(a) - 1e-9 for (_, a), (_, b) in zip(pure, pure[1:]))
    learned = rows_lib.best_on_dev([r for r in mine if r["scorer"] in ("wdp", "lowrank",
                                                                       "bilinear")],
                                   lambda r: r["dev"][sel])
    lines.append(report.prose(
        JOB, "bullet", emb=emb, dot=val(dot), wdp=val(by[("wdp", None, None)]),
        wdp_vs=versus(by[("wdp", None, None)]), full=val(by[("bilinear", None, None)]),
        full_vs=versus(by[("bilinear", None, None)]),
        pure=(report.prose(JOB, "pure", sig=sig(pure), n=len(pure), values=listed(pure),
                           rising="rises monotonically" if rising
                           else "does not rise monotonically").rstrip("\n") if pure else ""),
        learned=_row_name(learned), learned_val=val(learned),
        resid=(report.prose(JOB, "resid", sig=sig(resid), n=len(resid),
                            values=listed(resid)).rstrip("\n") if resid else ""),
        learned_vs=versus(learned), bm25=val(bm25),
        learned_vs_bm25=report.fmt_paired(learned["vs_bm25"], alpha, ci=False),
        hybrid=val(next(r for r in mine if r["scorer"] == "hybrid")),
        dot_unseen=dot["unseen_docs"][m], learned_unseen=learned["unseen_docs"][m],
        bm25_unseen=bm25["unseen_docs"][m]))
    others = [r for r in every if r.get("source", "qrels") != "qrels"]
    if others:
      lines.append(report.prose(JOB, "others", rows="; ".join(
          f"{_row_name(r)} {val(r):.4f} ({versus(r)}), unseen-doc {r['unseen_docs'][m]:.4f}"
          for r in others), dot_unseen=dot["unseen_docs"][m]))
  lines.append("\n" + report.prose(JOB, "paper", m=m, collection=collection))
  return "".join(lines)


def plot(rows: list[dict[str, Any]], config):
  """Test metric against rank per embedding, with the untrained/full/WDP/BM25 levels."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  m = config.eval.measures[0]
  embs = list(config.embeddings)
  fig, axes = plt.subplots(1, len(embs), figsize=(5.5 * len(embs), 4), squeeze=False)
  for ax, emb in zip(axes[0], embs):
    mine = [r for r in rows if r["embedding"] == emb and r.get("source", "qrels") == "qrels"]
    for residual, style in (("none", "o-"), ("identity", "s--"), ("diag", "^:")):
      pts = [r for r in mine if r["scorer"] == "lowrank" and r["residual"] == residual]
      if pts:
        ax.errorbar([r["rank"] for r in pts], [r["metrics"][m] for r in pts],
                    yerr=[r["std"][m] for r in pts], fmt=style, capsize=3,
                    label="P Q^T" if residual == "none" else f"{residual} + P Q^T")
    for scorer, color in (("dot", "black"), ("wdp", "tab:green"), ("bilinear", "tab:red"),
                          ("bm25", "tab:gray"), ("hybrid", "tab:purple")):
      for r in mine:
        if r["scorer"] == scorer:
          ax.axhline(r["metrics"][m], color=color, ls=":", lw=1.2, label=_row_name(r))
    ax.set_xscale("log", base=2)
    ax.set_xlabel("rank r")
    ax.set_ylabel(f"test {m}")
    ax.set_title(emb)
    ax.legend(fontsize=7)
  fig.tight_layout()
  return fig
