"""The late_interaction job's report: what a reader sees of its results (markdown, findings,
figures).

The job (`bilinear_ir/jobs/late_interaction.py`) runs and hands its results here.
"""
from __future__ import annotations

import functools
from typing import Any
from bilinear_ir.experiment import rows as rows_lib
from bilinear_ir.report import text
from bilinear_ir.studies.late_interaction import models


PAPER_A4 = {"colbert": 0.112, "lite": 0.188}  # frozen encoders, MS MARCO dev MRR@10


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


def markdown(results: dict[str, Any], config) -> str:
  """The results table (the largest n), the curve over n (with `sizes`), the storage table and
  what the numbers show."""
  measures = list(config.eval.measures)
  cand = results["candidates"]
  tok = results["tokens"]
  alpha = config.stats.alpha
  tuned = any(r.get("encoder") == "fine-tuned" for r in results["rows"])
  out = [f"# Late interaction on {results['collection']}: frozen encoder"
         f"{' (and rows fine-tuned with it)' if tuned else ''}, re-ranking "
         f"(LITE paper A.4 setting)\n\n",
         text.prose("late_interaction", "intro", test_queries=results["test_queries"],
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
        "yes, kept ColBERT" if r.get("kept_colbert") else
        f"fine-tuned, step {r['best_step']}" if r.get("encoder") == "fine-tuned" else "yes")
    table.append([r["row"] + (f" ({r['model']})" if r["row"] == "table" else ""), trained,
                  r.get("loss") or "-"]
                 + [r["metrics"][m] for m in measures + pool]
                 + [text.fmt_paired(r.get(k), alpha, ci=False) for k in ("vs_colbert", "vs_dot")]
                 + [f"{r['bytes_per_doc']:,}", f"{r['ms_1q_100d']:.2f}"])
  for name, t in results["teachers"].items():
    table.append([f"{name} (reference{', teacher' if name == results['teacher'] else ''})",
                  "yes" if name != "bm25" else "no", "-"]
                 + [t["metrics"].get(m) for m in measures + pool] + ["-"] * 4)
  out.append(f"n = {top} training queries; {results['measure']} vs ColBERT / dot: paired over "
             f"the test queries, Holm p ({results['holm']}).\n\n")
  out.append(text.markdown_table(
      table, ["row", "trained", "loss"] + measures + pool + ["vs ColBERT", "vs dot", "bytes/doc",
                                                            "ms 1q x 100d"], digits=4))
  if any(r["row"] == models.DE_FT for r in results["rows"]):
    out.append(_bought(results, config))
  if len(results["sizes"]) > 1:
    out.append(f"\n## {results['measure']} against n (vs ColBERT, Holm p)\n\n")
    names = list(dict.fromkeys(r["row"] for r in results["rows"]))
    at = {(r["row"], r["n_train"]): r for r in results["rows"]}
    out.append(text.markdown_table(
        [[name] + [text.fmt(at[name, n]["metrics"][results["measure"]], 4) + (
            f" ({text.fmt_paired(at[name, n].get('vs_colbert'), alpha, ci=False)})"
            if at[name, n].get("vs_colbert") else "") if (name, n) in at else "-"
                   for n in results["sizes"]] for name in names],
        ["row"] + [f"n = {n}" for n in results["sizes"]]))
  out.append(f"\n## Bytes per stored document (P = {tok['dim']}, L2 = {tok['doc_len']})\n\n")
  out.append(text.markdown_table(
      [[s["dtype"], s["doc_tokens"], s["token_dim"], f"{s['bytes_per_doc']:,}",
        f"{s['x_de']:.0f}x"] for s in results["storage"]],
      ["dtype", "doc tokens L2'", "token dim P'", "bytes/doc", "vs DE"]))
  out.append("\n" + findings(results, config))
  return "".join(out)


def _index(row: dict[str, Any], by_name: dict[str, dict[str, Any]]) -> str:
  """Whether a row changes the dot row's index: "re-encoded" (a two-tower fine-tune: the corpus
  encoded again by the tuned weights), "unchanged" (it stores what dot stores and reads it as it
  is: the table similarity, a query-tower fine-tune), "another store" (token vectors, BM25's
  sparse ones); a hybrid: its dense row's, "+ BM25"."""
  if row.get("dense") in by_name:
    return _index(by_name[row["dense"]], by_name) + " + BM25"
  if row.get("finetune", {}).get("mode") == "two_tower":
    return "re-encoded"
  return "unchanged" if row["stored"] == by_name["dot"]["stored"] else "another store"


def _bought(results: dict[str, Any], config) -> str:
  """What judged queries buy, in one protocol (these candidates): every row of the largest n
  against dot on all test queries and on the unseen-answer ones (paired, Holm), the fraction
  of the fine-tuned DE's (two-tower) gain it recovers, its training seconds and what it does to
  the index, with the re-encode seconds, bytes per doc and latency."""
  measure, alpha, top = results["measure"], config.stats.alpha, max(results["sizes"])
  rows = [r for r in results["rows"] if r["n_train"] == top]
  by_name = {r["row"]: r for r in rows}
  dot = by_name["dot"]
  table = []
  for r in rows:
    ft, unseen = r.get("finetune"), r["unseen"]
    seconds = ft["seconds"] if ft else r.get("train_seconds")
    reencode = ft["reindex_seconds"] if ft and ft["mode"] == "two_tower" else None
    table.append([r["row"], f"fine-tuned ({ft['mode']})" if ft else "frozen",
                  r["metrics"][measure], text.fmt_paired(r.get("vs_dot"), alpha),
                  unseen["mean"], text.fmt_paired(unseen.get("vs_dot"), alpha, ci=False),
                  text.fmt(r["recovered"]["all"], 2), text.fmt(r["recovered"]["unseen"], 2),
                  text.fmt(seconds, 1), _index(r, by_name), text.fmt(reencode, 1),
                  f"{r['bytes_per_doc']:,}", f"{r['ms_1q_100d']:.2f}"])
  return (f"\n## What judged queries buy, on these candidates (n = {top})\n\n"
          f"{measure} on all {results['test_queries']} test queries and on the "
          f"{dot['unseen']['n_queries']} unseen-answer ones (no gold doc judged for a training "
          f"query), each against dot (paired, Holm); recovered: (row - dot) / ({models.DE_FT} - "
          "dot), undefined (-) where the two-tower fine-tune did not gain. Re-encode: seconds "
          "to encode the candidates' docs again with the chosen weights.\n\n"
          + text.markdown_table(table, ["row", "encoder", measure, "vs dot", "unseen-answer",
                                        "unseen vs dot", "recovered", "recovered unseen",
                                        "training s", "index", "re-encode s", "bytes/doc",
                                        "ms 1q x 100d"], digits=4))


def findings(results: dict[str, Any], config) -> str:
  """What the numbers show, computed from them (the sentences: `templates/late_interaction.md`)."""
  m = "mrr@10" if "mrr@10" in config.eval.measures else config.eval.measures[0]
  sel = config.train.select_metric
  top = [r for r in results["rows"] if r["n_train"] == max(results["sizes"])]
  rows = {r["row"]: r for r in top}
  say = functools.partial(text.prose, "late_interaction", m=m)
  lines = ["## What the numbers show\n\n"]
  if "dot" in rows:
    dot = rows["dot"]
    better = [n for n, r in rows.items() if n != "dot" and r["metrics"][m] > dot["metrics"][m]]
    lines.append(say("beaten", dot=dot["metrics"][m], n=len(better), others=len(rows) - 1,
                      names=f" ({', '.join(better)})" if better else ""))
  col = next((r for r in top if r["scorer"] == "colbert" and not r["trained"]), None)
  lite = rows.get("lite")
  if col is not None and lite is not None:  # the trained LITE model itself, kept or not
    c, t = col["metrics"][m], lite.get("model_metrics", lite["metrics"])[m]
    lines.append(say("frozen", colbert=c, lite=t, ahead="LITE ahead" if t > c else "ColBERT ahead",
                      paper_colbert=PAPER_A4["colbert"], paper_lite=PAPER_A4["lite"]))
  for r in (r for r in top if r.get("teacher")):
    base = rows.get(r["row"].split(" (")[0])
    if base is not None:
      lines.append(say("distilled", row=r["row"], value=r["metrics"][m],
                        diff=r["metrics"][m] - base["metrics"][m]))
  if results["teacher"]:
    scores = ", ".join(f"{k} {v['dev'][sel]:.4f}" for k, v in results["teachers"].items())
    lines.append(say("teacher", teacher=results["teacher"], sel=sel, scores=scores,
                      value=results["teachers"][results["teacher"]]["metrics"][m]))
  hyb = next((r for r in top if r["scorer"] == "hybrid"), None)
  if hyb is not None:
    lines.append(say("hybrid", dense=hyb["dense"], lam=hyb["lambda"], hybrid=hyb["metrics"][m],
                      alone=rows[hyb["dense"]]["metrics"][m],
                      bm25=results["teachers"]["bm25"]["metrics"][m]))
  if "table" in rows:
    tab, tokens = rows["table"], [r for r in top if r["scorer"] in models.TOKEN_SCORERS]
    best = rows_lib.best_on_dev(tokens, lambda r: r["dev"].get(sel))
    measure = results["measure"]
    lines.append(say("moonshot", table=tab["model"], candidates=", ".join(tab["table_dev"]),
                      measure=measure, table_value=tab["metrics"][measure], row=best["row"],
                      value=best["metrics"][measure],
                      paired=text.fmt_paired(best.get("vs_table"), config.stats.alpha),
                      ratio=best["ms_1q_100d"] / tab["ms_1q_100d"]))
  tuned, measure = [r for r in top if r.get("encoder") == "fine-tuned"], results["measure"]
  for r in tuned:  # in the paired tests' measure
    f = r["finetune"]
    lines.append(say("finetuned", row=r["row"], value=r["metrics"][measure], measure=measure,
                     best=r["best_step"],
                     steps=f["steps"], seconds=f["seconds"], device=f["device"],
                     reindex=f["reindex_seconds"], docs=r["reindex_docs"],
                     paired=text.fmt_paired(r.get("vs_dot"), config.stats.alpha)))
  if "lite_ft" in rows and "colbert_ft" in rows:  # paper 004's claim in its own setting
    lines.append(say("joint", lite=rows["lite_ft"]["metrics"][measure], measure=measure,
                     colbert=rows["colbert_ft"]["metrics"][measure],
                     paired=text.fmt_paired(rows["lite_ft"].get("vs_colbert_ft"),
                                            config.stats.alpha)))
  if models.DE_FT in rows:  # the finetune job's "recovered" column, on these candidates
    de = rows[models.DE_FT]  # its own fraction is None where it did not gain (compare.recovered)
    shares = ", ".join(f"{r['row']} {text.fmt(r['recovered']['all'], 2)} / "
                       f"{text.fmt(r['recovered']['unseen'], 2)}" for r in top
                       if r["row"] not in ("dot", models.DE_FT))
    lines.append(say("recovered", measure=measure,
                     gain=de["metrics"][measure] - rows["dot"]["metrics"][measure],
                     shares=shares if de["recovered"]["all"] is not None else
                     "undefined (the fine-tuned DE did not gain over dot)"))
  trained = [r for r in top if r.get("best_step") is not None and r["row"] != "table"
             and r.get("encoder") != "fine-tuned"]
  last = [r["row"] for r in trained if r["best_step"] == config.train.steps]
  kept = [r["row"] for r in trained if r.get("kept_colbert")]
  if trained:
    lines.append(say("last_step", steps=config.train.steps, n=len(last), trained=len(trained),
                      names=f" ({', '.join(last)}): they may gain from more steps" if last
                      else ""))
    lines.append(say("kept", n=len(kept), trained=len(trained), sel=sel,
                      names=f" ({', '.join(kept)}): they report ColBERT's numbers, "
                      "`model_metrics` holds each trained model's own" if kept else ""))
  if "dot" in rows:
    de_ms, de_b = rows["dot"]["ms_1q_100d"], rows["dot"]["bytes_per_doc"]
    lines.append("- Cost vs DE (latency x, storage x): " + ", ".join(
        f"{n} {r['ms_1q_100d'] / de_ms:.1f}x / {r['bytes_per_doc'] / de_b:.0f}x"
        for n, r in rows.items() if n != "dot") + ".\n")
  return "".join(lines)
