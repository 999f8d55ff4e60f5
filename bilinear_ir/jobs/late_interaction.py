"""The late-interaction table (LITE paper 004, sections 3-4, appendix A.4) on one collection.

Every scorer sees the same frozen encoder (all-MiniLM-L6-v2): its token outputs for the
late-interaction scorers, its pooled mean embeddings for the dual-encoder baseline. This is the
paper's frozen-encoder ablation (A.4: on MS MARCO, ColBERT 0.112 vs separable LITE 0.188 MRR@10);
only the scorers' own parameters are trained.

Collection (`config.collection`, read as the learning_curve job reads it): scifact, insuranceqa
or a BEIR folder / zip with a train split; its official dev split selects where it has one, else
a dev part carved out of train. With `config.sizes`, the table is run once per n on the learning
curve's nested subsets of the training queries (`studies.curve_subsets`, drawn by the seed); dev and
test stay whole.

Protocol (re-ranking, as the LITE paper's MS MARCO / NQ evaluation): each dev and test query gets
`rerank.bm25_depth` BM25 candidates plus `rerank.random_docs` docs drawn uniformly (from the
config seed) among the rest of the corpus. Unlike the paper, judged positives are NOT added: a
positive is a candidate only if BM25 or the random draw put it there, so the candidate set does
not depend on the judgements (`retrieval.candidates.rerank_candidates` never sees them) and the
metrics are those of a real two-stage system. Where the collection lists negatives per query
(InsuranceQA), each test question is also re-ranked over its own pool (gold + listed negatives):
P@1 as `p_at_1_pool`.

Rows (`config.rows`, each a name of `config.models` or "dot" / "table" / "hybrid"):
  dot        DE: dot product of the pooled mean embeddings (untrained).
  table      the table similarity best on dev among `config.table.models` (full W, I + P Q^T),
             trained on the pooled embeddings by the learning curve's recipe: the token rows'
             like-for-like rival (`studies.late_interaction.rows.table_row`); every row is also compared with it
             ("vs_table").
  colbert    sum-max over the raw token similarities: untrained (the protocol's candidate);
             colbert_proj adds a trained token projection P -> P'.
  mebert     ME-BERT, m = 8 doc vectors, trained shared projection + LayerNorm.
  lite, lite_flat, knrm   trained on the frozen token similarities.
  hybrid     `lam * dense + (1 - lam) * BM25` (retrieval/hybrid.py) over the same candidates, for
             the dense row best on dev; lam tuned on dev.
Trained rows use cross entropy over 1 positive + BM25 (InsuranceQA: listed) hard + random +
in-batch negatives (`config.train`); the rows of `config.distill.scorers` are also trained with
the distillation losses of appendix A.2 ("kl", "margin_mse") against a teacher: BM25 (exact
scores) or a bilinear similarity trained on the pooled embeddings (the bilinear table's recipe),
whichever is better on dev (or the one `config.distill.teacher` names). Model selection uses the
dev split only, with the untrained ColBERT as a candidate of every trained row
(`studies.late_interaction.rows.select_over_colbert`: "kept_colbert"). Every row is compared per test query
with colbert and dot ("vs_colbert", "vs_dot"; Holm per baseline over all rows and n).

Per row: metrics, per-query nDCG@10, bytes per stored document (in `config.storage.dtype`) and
the latency of scoring 1 query x `config.latency.docs` stored docs (`timing`, as benchmarks/
late_interaction_latency.py), measured in the same run.
"""
from __future__ import annotations

import functools
import time
from typing import Any

import jax
import jax.numpy as jnp

from bilinear_ir import progress
from bilinear_ir import scorers
from bilinear_ir import timing
from bilinear_ir.data import embeddings
from bilinear_ir.errors import require
from bilinear_ir.experiment import rows as rows_lib
from bilinear_ir.experiment import spec as spec_lib
from bilinear_ir.experiment import validation
from bilinear_ir.jobs import report
from bilinear_ir.scorers import multivector
from bilinear_ir.studies.late_interaction import checks
from bilinear_ir.studies.late_interaction import latency
from bilinear_ir.studies.late_interaction import models
from bilinear_ir.studies.late_interaction import rows as li_rows
from bilinear_ir.studies.late_interaction import setting as setting_lib

PAPER_A4 = {"colbert": 0.112, "lite": 0.188}  # frozen encoders, MS MARCO dev MRR@10


def validate(config) -> None:
  """Refuses a bad config before any work (`experiment.validation`)."""
  validation.integer(config.seed, "seed", 0)
  validation.check_collection(config.collection, path=config.data.path)
  validation.integers(config.sizes, "sizes", low=1, nonempty=False)
  validation.check_data(spec_lib.collection_block(config.data, config.collection))
  validation.one_of(config.data.folds, (0,), "data.folds")
  embeddings.check_encoder(config.encoder)
  validation.one_of(config.encoder.kind, ("flax",), "encoder.kind")  # token outputs are needed
  require(models.doc_len(config) >= 2, "set encoder.doc_max_length (Td, the doc tokens kept)",
          field="encoder.doc_max_length")
  validation.check_bm25(config.bm25)
  checks.check_blocks(config)
  validation.check_train(config.train)
  for name in config.train_overrides:
    require(name in config.models, f"unknown row {name!r}", field="train_overrides")
    validation.check_train(models.row_train(config, name), f"train_overrides.{name}")
  validation.check_hybrid(config.hybrid)
  validation.check_eval(config.eval)
  validation.check_stats(config.stats)
  validation.one_of(config.storage.dtype, ("float32", "float16", "bfloat16"), "storage.dtype")
  for name in config.rows:
    require(name in ("dot", "table", "hybrid") or name in config.models,
            f"unknown row {name!r}: not 'dot', 'table', 'hybrid' or a name of config.models",
            field="rows")
  require("dot" in config.rows and "colbert" in config.rows, "must hold 'dot' and 'colbert': "
          "the baselines of the paired tests", field="rows")
  used = {n for n in (*config.rows, *config.distill.scorers) if n in config.models}
  for name in sorted(used):  # traces each used scorer's setup (its checks) without computing
    module = models.row_model(config, name, 8)[0]
    params = jax.eval_shape(functools.partial(scorers.init_params, module), jax.random.key(0))
    require(name != "colbert" or not jax.tree.leaves(params), "must be the untrained ColBERT "
            "(no projection or reduction): every trained row is selected against it",
            field="models.colbert")


def run(config, workdir: str) -> report.Report:
  """The `late_interaction` job (configs/late_interaction.py). Every trained row checkpoints in
  its own folder under `workdir/runs` (`training.run_dir`): a killed job's rerun resumes."""
  setting = setting_lib.build_setting(config, spec_lib.collection_block(config.data,
                                                                   config.collection))
  collection = setting.prepared.collection.name
  require(len(setting.splitset.train.query_ids) > 0, f"{collection} has no training queries",
          field="collection")
  dtype = jnp.dtype(config.storage.dtype)
  lat = latency.latency_inputs(setting, int(config.latency.docs))
  settings = setting_lib.curve_settings(setting, config.sizes, config.seed)
  per_n = len([r for r in config.rows if r != "hybrid"]) + len(config.distill.scorers) * len(
      config.distill.losses)
  bar = progress.bar(per_n * len(settings), "rows", unit="row")
  rows, by_n = [], {}
  for n, cut in settings.items():
    started = time.perf_counter()
    mine, calls, by_n[str(n)] = li_rows.table_rows(cut, config, lat, dtype, n, bar, workdir)
    by_n[str(n)]["seconds"] = round(time.perf_counter() - started, 1)
    ms = latency.time_in_turn(calls, config.latency.rounds, config.latency.repeats)
    for row in mine:
      row["ms_1q_100d"] = ms[row["row"]]
    rows += mine
  bar.close()
  li_rows.compare_rows(rows, config)
  dim, doc_len = int(setting.tokens.docs.shape[-1]), models.doc_len(config)
  storage = multivector.storage_table(
      dim, doc_len, [t for t in config.storage.doc_tokens if t <= doc_len],
      [p for p in config.storage.token_dims if p <= dim], config.storage.dtypes)
  top = by_n[str(max(settings))]
  results = {
      "rows": rows, "teachers": top["teachers"], "teacher": top["teacher"], "by_n": by_n,
      "collection": collection, "sizes": sorted(settings),
      "test_queries": len(setting.splitset.test.query_ids), "measure": setting.measures[0],
      "holm": "one family per baseline (vs_colbert, vs_dot): every other row at every n",
      "selection": "every trained token row on dev, with the untrained ColBERT as a candidate "
                   "(kept_colbert: ColBERT's numbers reported; model_metrics: the model's own)",
      **setting.describe(config.rerank, int(config.encoder.query_max_length), doc_len),
      "storage": storage, "storage_dtype": str(dtype.name), "hardware": timing.hardware(),
  }
  figures = {"late_interaction_curve": plot(results)} if len(settings) > 1 else {}
  return report.Report(results=results, markdown=markdown(results, config), figures=figures)


def plot(results: dict[str, Any]):
  """Test `results["measure"]` against n (log axis), one line per row but the hybrid: a trained
  row's own model at its dev-best step (`model_metrics`, also where dev kept ColBERT and the row
  reports ColBERT's numbers), the untrained rows (dot, ColBERT) dashed."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  measure, sizes = results["measure"], results["sizes"]
  at = {(r["row"], r["n_train"]): r for r in results["rows"]}
  fig, ax = plt.subplots(figsize=(7, 4.2))
  for name in dict.fromkeys(r["row"] for r in results["rows"] if r["scorer"] != "hybrid"):
    pts = [at[name, n] for n in sizes if (name, n) in at]
    ax.plot([r["n_train"] for r in pts],
            [r.get("model_metrics", r["metrics"])[measure] for r in pts],
            "o-" if pts[0].get("trained") else "--", label=name)
  ax.set_xscale("log")
  ax.set_xlabel("training queries n")
  ax.set_ylabel(f"test {measure} (each trained row's own model)")
  ax.set_title(f"Late interaction on {results['collection']}, frozen token embeddings")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  return fig


# ----------------------------------------------------------------------------------------------
# Report.


def markdown(results: dict[str, Any], config) -> str:
  """The results table (the largest n), the curve over n (with `sizes`), the storage table and
  what the numbers show."""
  measures = list(config.eval.measures)
  cand = results["candidates"]
  tok = results["tokens"]
  alpha = config.stats.alpha
  out = [f"# Late interaction on {results['collection']}: frozen encoder, re-ranking "
         f"(LITE paper A.4 setting)\n\n",
         report.prose("late_interaction", "intro", test_queries=results["test_queries"],
                      bm25_depth=cand["bm25_depth"], random_docs=cand["random_docs"],
                      seed=config.seed, recall=cand["recall"]["test"],
                      query_len=tok["query_len"], doc_len=tok["doc_len"],
                      truncated=tok["doc_tokens_truncated"], dim=tok["dim"],
                      pooled=tok["pooled_max_length"], dtype=results["storage_dtype"],
                      docs=config.latency.docs, hardware=results["hardware"]) + "\n"]
  top = max(results["sizes"])
  pool = ["p_at_1_pool"] if "p_at_1_pool" in results["rows"][0]["metrics"] else []
  table = []
  for r in (r for r in results["rows"] if r["n_train"] == top):
    trained = "no" if not r.get("trained") else (
        "yes, kept ColBERT" if r.get("kept_colbert") else "yes")
    table.append([r["row"] + (f" ({r['model']})" if r["row"] == "table" else ""), trained,
                  r.get("loss") or "-"]
                 + [r["metrics"][m] for m in measures + pool]
                 + [report.fmt_paired(r.get(k), alpha, ci=False) for k in ("vs_colbert", "vs_dot")]
                 + [f"{r['bytes_per_doc']:,}", f"{r['ms_1q_100d']:.2f}"])
  for name, t in results["teachers"].items():
    table.append([f"{name} (reference{', teacher' if name == results['teacher'] else ''})",
                  "yes" if name != "bm25" else "no", "-"]
                 + [t["metrics"].get(m) for m in measures + pool] + ["-"] * 4)
  out.append(f"n = {top} training queries; {results['measure']} vs ColBERT / dot: paired over "
             f"the test queries, Holm p ({results['holm']}).\n\n")
  out.append(report.markdown_table(
      table, ["row", "trained", "loss"] + measures + pool + ["vs ColBERT", "vs dot", "bytes/doc",
                                                            "ms 1q x 100d"], digits=4))
  if len(results["sizes"]) > 1:
    out.append(f"\n## {results['measure']} against n (vs ColBERT, Holm p)\n\n")
    names = list(dict.fromkeys(r["row"] for r in results["rows"]))
    at = {(r["row"], r["n_train"]): r for r in results["rows"]}
    out.append(report.markdown_table(
        [[name] + [report.fmt(at[name, n]["metrics"][results["measure"]], 4) + (
            f" ({report.fmt_paired(at[name, n].get('vs_colbert'), alpha, ci=False)})"
            if at[name, n].get("vs_colbert") else "") if (name, n) in at else "-"
                   for n in results["sizes"]] for name in names],
        ["row"] + [f"n = {n}" for n in results["sizes"]]))
  out.append(f"\n## Bytes per stored document (P = {tok['dim']}, L2 = {tok['doc_len']})\n\n")
  out.append(report.markdown_table(
      [[s["dtype"], s["doc_tokens"], s["token_dim"], f"{s['bytes_per_doc']:,}",
        f"{s['x_de']:.0f}x"] for s in results["storage"]],
      ["dtype", "doc tokens L2'", "token dim P'", "bytes/doc", "vs DE"]))
  out.append("\n" + findings(results, config))
  return "".join(out)


def findings(results: dict[str, Any], config) -> str:
  """What the numbers show, computed from them (the sentences: `templates/late_interaction.md`)."""
  m = "mrr@10" if "mrr@10" in config.eval.measures else config.eval.measures[0]
  sel = config.train.select_metric
  top = [r for r in results["rows"] if r["n_train"] == max(results["sizes"])]
  rows = {r["row"]: r for r in top}
  text = functools.partial(report.prose, "late_interaction", m=m)
  lines = ["## What the numbers show\n\n"]
  if "dot" in rows:
    dot = rows["dot"]
    better = [n for n, r in rows.items() if n != "dot" and r["metrics"][m] > dot["metrics"][m]]
    lines.append(text("beaten", dot=dot["metrics"][m], n=len(better), others=len(rows) - 1,
                      names=f" ({', '.join(better)})" if better else ""))
  col = next((r for r in top if r["scorer"] == "colbert" and not r["trained"]), None)
  lite = rows.get("lite")
  if col is not None and lite is not None:  # the trained LITE model itself, kept or not
    c, t = col["metrics"][m], lite.get("model_metrics", lite["metrics"])[m]
    lines.append(text("frozen", colbert=c, lite=t, ahead="LITE ahead" if t > c else "ColBERT ahead",
                      paper_colbert=PAPER_A4["colbert"], paper_lite=PAPER_A4["lite"]))
  for r in (r for r in top if r.get("teacher")):
    base = rows.get(r["row"].split(" (")[0])
    if base is not None:
      lines.append(text("distilled", row=r["row"], value=r["metrics"][m],
                        diff=r["metrics"][m] - base["metrics"][m]))
  if results["teacher"]:
    scores = ", ".join(f"{k} {v['dev'][sel]:.4f}" for k, v in results["teachers"].items())
    lines.append(text("teacher", teacher=results["teacher"], sel=sel, scores=scores,
                      value=results["teachers"][results["teacher"]]["metrics"][m]))
  hyb = next((r for r in top if r["scorer"] == "hybrid"), None)
  if hyb is not None:
    lines.append(text("hybrid", dense=hyb["dense"], lam=hyb["lambda"], hybrid=hyb["metrics"][m],
                      alone=rows[hyb["dense"]]["metrics"][m],
                      bm25=results["teachers"]["bm25"]["metrics"][m]))
  if "table" in rows:
    tab, tokens = rows["table"], [r for r in top if r["scorer"] in models.TOKEN_SCORERS]
    best = rows_lib.best_on_dev(tokens, lambda r: r["dev"].get(sel))
    measure = results["measure"]
    lines.append(text("moonshot", table=tab["model"], candidates=", ".join(tab["table_dev"]),
                      measure=measure, table_value=tab["metrics"][measure], row=best["row"],
                      value=best["metrics"][measure],
                      paired=report.fmt_paired(best.get("vs_table"), config.stats.alpha),
                      ratio=best["ms_1q_100d"] / tab["ms_1q_100d"]))
  trained = [r for r in top if r.get("best_step") is not None and r["row"] != "table"]
  last = [r["row"] for r in trained if r["best_step"] == config.train.steps]
  kept = [r["row"] for r in trained if r.get("kept_colbert")]
  if trained:
    lines.append(text("last_step", steps=config.train.steps, n=len(last), trained=len(trained),
                      names=f" ({', '.join(last)}): they may gain from more steps" if last
                      else ""))
    lines.append(text("kept", n=len(kept), trained=len(trained), sel=sel,
                      names=f" ({', '.join(kept)}): they report ColBERT's numbers, "
                      "`model_metrics` holds each trained model's own" if kept else ""))
  if "dot" in rows:
    de_ms, de_b = rows["dot"]["ms_1q_100d"], rows["dot"]["bytes_per_doc"]
    lines.append("- Cost vs DE (latency x, storage x): " + ", ".join(
        f"{n} {r['ms_1q_100d'] / de_ms:.1f}x / {r['bytes_per_doc'] / de_b:.0f}x"
        for n, r in rows.items() if n != "dot") + ".\n")
  return "".join(lines)
