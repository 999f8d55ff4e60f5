"""The late-interaction table (LITE paper 004, sections 3-4, appendix A.4) on one collection.

Every scorer sees the same frozen encoder (all-MiniLM-L6-v2): its token outputs for the
late-interaction scorers, its pooled mean embeddings for the dual-encoder baseline. This is the
paper's frozen-encoder ablation (A.4: on MS MARCO, ColBERT 0.112 vs separable LITE 0.188 MRR@10);
only the scorers' own parameters are trained.

Protocol (re-ranking, as the LITE paper's MS MARCO / NQ evaluation): each dev and test query gets
`rerank.bm25_depth` BM25 candidates plus `rerank.random_docs` docs drawn uniformly (from the
config seed) among the rest of the corpus. Unlike the paper, judged positives are NOT added: a
positive is a candidate only if BM25 or the random draw put it there, so the candidate set does
not depend on the judgements (`retrieval.candidates.rerank_candidates` never sees them) and the
metrics are those of a real two-stage system.

Rows (`config.rows`, each a name of `config.models` or "dot" / "hybrid"):
  dot        DE: dot product of the pooled mean embeddings (untrained).
  colbert    sum-max over token similarities; untrained when it has no parameters (no projection),
             trained with a token projection P -> P' otherwise.
  mebert     ME-BERT, m = 8 doc vectors, trained shared projection + LayerNorm.
  lite, lite_flat, knrm   trained on the frozen token similarities.
  hybrid     `lam * dense + (1 - lam) * BM25` (retrieval/hybrid.py) over the same candidates, for
             the dense row best on dev; lam tuned on dev.
Trained rows use cross entropy over 1 positive + BM25 hard + random + in-batch negatives
(`config.train`); the rows of `config.distill.scorers` are also trained with the distillation
losses of appendix A.2 ("kl", "margin_mse") against a teacher: BM25 (exact scores) or a bilinear
similarity trained on the pooled embeddings (the bilinear table's recipe), whichever is better on
dev (or the one `config.distill.teacher` names). Model selection uses the dev split only.

Per row: metrics, bytes per stored document (in `config.storage.dtype`) and the latency of
scoring 1 query x `config.latency.docs` stored docs (`timing`, as benchmarks/
late_interaction_latency.py), measured in the same run.
"""
from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from bilinear_ir import progress
from bilinear_ir import scorers
from bilinear_ir import timing
from bilinear_ir.data import embeddings
from bilinear_ir.errors import require
from bilinear_ir.experiment import rerank
from bilinear_ir.experiment import validation
from bilinear_ir.jobs import report
from bilinear_ir.scorers import multivector
from bilinear_ir.train import teachers as teacher_lib

PAPER_A4 = {"colbert": 0.112, "lite": 0.188}  # frozen encoders, MS MARCO dev MRR@10


def validate(config) -> None:
  """Refuses a bad config before any work (`experiment.validation`)."""
  validation.integer(config.seed, "seed", 0)
  validation.check_data(config.data)
  validation.one_of(config.data.folds, (0,), "data.folds")
  embeddings.check_encoder(config.encoder)
  validation.one_of(config.encoder.kind, ("flax",), "encoder.kind")  # token outputs are needed
  require(rerank.doc_len(config) >= 2, "set encoder.doc_max_length (Td, the doc tokens kept)",
          field="encoder.doc_max_length")
  validation.check_bm25(config.bm25)
  rerank.check_blocks(config)
  validation.check_train(config.train)
  for name in config.train_overrides:
    require(name in config.models, f"unknown row {name!r}", field="train_overrides")
    validation.check_train(rerank.row_train(config, name), f"train_overrides.{name}")
  validation.check_hybrid(config.hybrid)
  validation.check_eval(config.eval)
  validation.one_of(config.storage.dtype, ("float32", "float16", "bfloat16"), "storage.dtype")
  for name in config.rows:
    require(name in ("dot", "hybrid") or name in config.models,
            f"unknown row {name!r}: not 'dot', 'hybrid' or a name of config.models",
            field="rows")
  for name in config.models:  # traces each scorer's setup (its checks) without computing
    module = rerank.row_model(config, name, 8)[0]
    jax.eval_shape(functools.partial(scorers.init_params, module), jax.random.key(0))


def run(config, workdir: str) -> report.Report:  # pylint: disable=unused-argument
  """The `late_interaction` job (configs/late_interaction.py)."""
  setting = rerank.build_setting(config)
  prepared = setting.prepared
  emb = prepared.embeddings
  dtype = jnp.dtype(config.storage.dtype)
  lat = rerank.latency_inputs(setting, int(config.latency.docs))
  measures = setting.measures
  sel = config.train.select_metric
  rows: list[dict[str, Any]] = []
  dense: dict[str, rerank.Scored] = {}

  def add(label: str, scorer: str, scored: rerank.Scored, **extra) -> None:
    n_vec, width = scored.stored
    rows.append({"row": label, "scorer": scorer, "mode": "rerank", "encoder": "frozen",
                 "metrics": scored.test["mean"], "dev": scored.dev,
                 "bytes_per_doc": multivector.bytes_per_doc(n_vec, width, dtype),
                 "stored": [n_vec, width], **extra})
    dense[label] = scored
    bar.write(f"{label:<28} test {measures[0]} {scored.test['mean'][measures[0]]:.4f} "
              f"(dev {sel} {scored.dev.get(sel, float('nan')):.4f})")

  def token_row(name: str, tcfg, teacher=None) -> tuple[rerank.Scored, dict[str, Any]]:
    module, scorer = rerank.row_model(config, name, setting.tokens.docs.shape[-1])
    scored, info = rerank.token_row(setting, module, scorer, tcfg, config.seed, lat, dtype,
                                    teacher)
    return scored, {"scorer": scorer, **info}

  teachers, teacher_scores, teacher_name = rerank.teachers(setting, config)
  work = [r for r in config.rows if r != "hybrid"]
  total = len(work) + len(config.distill.scorers) * len(config.distill.losses)
  bar = progress.bar(total, "rows", unit="row")
  for name in work:
    if name == "dot":
      dot = scorers.build("dot", dim=emb.docs.shape[1])
      q, qm, _, _, docs = lat
      fn, n_vec, width = timing.de_case(q, qm, emb.docs[docs], dtype)
      add("dot", "dot", setting.score(dot, {}, setting.pooled_queries, emb.docs, fn,
                                      (n_vec, width)),
          trained=False, loss=None, teacher=None)
    else:
      scored, info = token_row(name, rerank.row_train(config, name))
      add(name, info.pop("scorer"), scored, loss=config.train.loss if info["trained"] else None,
          teacher=None, **info)
    bar.update(1)
  if teacher_name is not None:  # the teacher and its temperature are the same for every row
    t = teacher_scores[teacher_name]
    teacher_temperature = float(config.distill.teacher_temperature) * teacher_lib.teacher_scale(
        t, prepared.bm25_idx, config.rerank.bm25_depth)
  for name in config.distill.scorers:
    for loss in config.distill.losses:
      tcfg = rerank.row_train(config, name)
      tcfg.loss = loss
      tcfg.teacher_temperature = teacher_temperature
      scored, info = token_row(name, tcfg, teacher=t)
      add(f"{name} ({loss}, {teacher_name})", info.pop("scorer"), scored, loss=loss,
          teacher=teacher_name, **info)
      bar.update(1)
  bar.close()

  calls = {label: scored.latency_fn for label, scored in dense.items()}
  if "hybrid" in config.rows and rows:
    row, calls[row["row"]] = rerank.hybrid_row(setting, config, rows, dense, lat)
    rows.append(row)
  ms = rerank.time_in_turn(calls, config.latency.rounds, config.latency.repeats)
  for row in rows:
    row["ms_1q_100d"] = ms[row["row"]]

  dim, doc_len = int(setting.tokens.docs.shape[-1]), rerank.doc_len(config)
  storage = multivector.storage_table(
      dim, doc_len, [t for t in config.storage.doc_tokens if t <= doc_len],
      [p for p in config.storage.token_dims if p <= dim], config.storage.dtypes)
  results = {
      "rows": rows, "teachers": teachers, "teacher": teacher_name,
      "collection": prepared.collection.name,
      "test_queries": len(setting.splitset.test.query_ids),
      **setting.describe(config.rerank, int(config.encoder.query_max_length), doc_len),
      "storage": storage, "storage_dtype": str(dtype.name), "hardware": timing.hardware(),
  }
  return report.Report(results=results, markdown=markdown(results, config))


# ----------------------------------------------------------------------------------------------
# Report.


def markdown(results: dict[str, Any], config) -> str:
  """The results table, the storage table and what the numbers show."""
  measures = list(config.eval.measures)
  cand = results["candidates"]
  tok = results["tokens"]
  out = [f"# Late interaction on {results['collection']}: frozen encoder, re-ranking "
         f"(LITE paper A.4 setting)\n\n",
         report.prose("late_interaction", "intro", test_queries=results["test_queries"],
                      bm25_depth=cand["bm25_depth"], random_docs=cand["random_docs"],
                      seed=config.seed, recall=cand["recall"]["test"],
                      query_len=tok["query_len"], doc_len=tok["doc_len"],
                      truncated=tok["doc_tokens_truncated"], dim=tok["dim"],
                      pooled=tok["pooled_max_length"], dtype=results["storage_dtype"],
                      docs=config.latency.docs, hardware=results["hardware"]) + "\n"]
  table = []
  for r in results["rows"]:
    table.append([r["row"], "yes" if r.get("trained") else "no", r.get("loss") or "-"]
                 + [r["metrics"][m] for m in measures]
                 + [f"{r['bytes_per_doc']:,}", f"{r['ms_1q_100d']:.2f}"])
  for name, t in results["teachers"].items():
    table.append([f"{name} (reference{', teacher' if name == results['teacher'] else ''})",
                  "yes" if name != "bm25" else "no", "-"]
                 + [t["metrics"][m] for m in measures] + ["-", "-"])
  out.append(report.markdown_table(
      table, ["row", "trained", "loss"] + measures + ["bytes/doc", "ms 1q x 100d"], digits=4))
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
  rows = {r["row"]: r for r in results["rows"]}
  text = functools.partial(report.prose, "late_interaction", m=m)
  lines = ["## What the numbers show\n\n"]
  if "dot" in rows:
    dot = rows["dot"]
    better = [n for n, r in rows.items() if n != "dot" and r["metrics"][m] > dot["metrics"][m]]
    lines.append(text("beaten", dot=dot["metrics"][m], n=len(better), others=len(rows) - 1,
                      names=f" ({', '.join(better)})" if better else ""))
  col = next((r for r in results["rows"] if r["scorer"] == "colbert" and not r["trained"]), None)
  lite = rows.get("lite")
  if col is not None and lite is not None:
    c, t = col["metrics"][m], lite["metrics"][m]
    lines.append(text("frozen", colbert=c, lite=t, ahead="LITE ahead" if t > c else "ColBERT ahead",
                      paper_colbert=PAPER_A4["colbert"], paper_lite=PAPER_A4["lite"]))
  for r in (r for r in results["rows"] if r.get("teacher")):
    base = rows.get(r["row"].split(" (")[0])
    if base is not None:
      lines.append(text("distilled", row=r["row"], value=r["metrics"][m],
                        diff=r["metrics"][m] - base["metrics"][m]))
  if results["teacher"]:
    scores = ", ".join(f"{k} {v['dev'][sel]:.4f}" for k, v in results["teachers"].items())
    lines.append(text("teacher", teacher=results["teacher"], sel=sel, scores=scores,
                      value=results["teachers"][results["teacher"]]["metrics"][m]))
  hyb = next((r for r in results["rows"] if r["scorer"] == "hybrid"), None)
  if hyb is not None:
    lines.append(text("hybrid", dense=hyb["dense"], lam=hyb["lambda"], hybrid=hyb["metrics"][m],
                      alone=rows[hyb["dense"]]["metrics"][m],
                      bm25=results["teachers"]["bm25"]["metrics"][m]))
  trained = [r for r in results["rows"] if r.get("best_step") is not None]
  last = [r["row"] for r in trained if r["best_step"] == config.train.steps]
  if trained:
    lines.append(text("last_step", steps=config.train.steps, n=len(last), trained=len(trained),
                      names=f" ({', '.join(last)}): they may gain from more steps" if last
                      else ""))
  if "dot" in rows:
    de_ms, de_b = rows["dot"]["ms_1q_100d"], rows["dot"]["bytes_per_doc"]
    lines.append("- Cost vs DE (latency x, storage x): " + ", ".join(
        f"{n} {r['ms_1q_100d'] / de_ms:.1f}x / {r['bytes_per_doc'] / de_b:.0f}x"
        for n, r in rows.items() if n != "dot") + ".\n")
  return "".join(lines)
