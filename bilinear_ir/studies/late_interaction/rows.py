"""The rows of a late-interaction table on one training split.

A token row is built (`models`), trained with the protocol (`experiment.training.
train_token_model`) and scored by `token_row`; a trained row is then selected on dev against the
untrained ColBERT (`select_over_colbert`); `table_row` trains the table similarities on the
pooled embeddings and re-ranks with the one best on dev (the token rows' like-for-like rival).
`table_rows` runs a table's rows on one training split; `compare_rows` adds the paired tests
against ColBERT and dot, and the fraction of the fine-tuned DE's gain each row recovers.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import numpy as np

from bilinear_ir import scorers
from bilinear_ir import timing
from bilinear_ir.experiment import compare
from bilinear_ir.experiment import evaluate
from bilinear_ir.experiment import rows as rows_lib
from bilinear_ir.experiment import spec as spec_lib
from bilinear_ir.experiment import training
from bilinear_ir.scorers import multivector
from bilinear_ir.studies.late_interaction import finetuned
from bilinear_ir.studies.late_interaction import hybrid as li_hybrid
from bilinear_ir.studies.late_interaction import latency
from bilinear_ir.studies.late_interaction import models
from bilinear_ir.studies.late_interaction import teachers as li_teachers
from bilinear_ir.studies.late_interaction.setting import SPLITS
from bilinear_ir.studies.late_interaction.setting import Scored
from bilinear_ir.studies.late_interaction.setting import Setting
from bilinear_ir.studies.late_interaction.setting import per_query
from bilinear_ir.train import teachers as teachers_lib


def token_row(setting: Setting, module, scorer: str, tcfg, seed: int, lat: tuple, dtype,
              teacher: teachers_lib.Teacher | None = None,
              checkpoint_dir: str | None = None) -> tuple[Scored, dict[str, Any]]:
  """Initialises (by `seed`), trains if it has params (`training.train_token_model` with the
  `train` block `tcfg`, checkpointing in `checkpoint_dir`) and scores one token row; its
  latency call scores `lat` (`latency_inputs`) in `dtype`.

  Returns:
    (Scored, {"trained", "best_step", "history"[, "temperature", "skipped_steps", "params",
     "train_seconds"]}).
  """
  params = jax.jit(lambda key: scorers.init_params(module, key))(jax.random.key(seed))
  info = {"trained": bool(jax.tree.leaves(params)), "best_step": None, "history": []}
  if info["trained"]:
    fit = training.train_token_model(setting, module, params, tcfg, seed, teacher,
                                     checkpoint_dir)
    params = fit.params
    info.update(best_step=fit.best_step, history=fit.history, temperature=fit.temperature,
                skipped_steps=fit.skipped_steps,
                params=int(sum(np.size(x) for x in jax.tree.leaves(params))),
                train_seconds=round(fit.seconds, 1))
  fn, n_vec, width = latency.token_call(module, scorer, params, lat, dtype)
  scored = setting.score(setting.eval_module(module), params, setting.token_queries,
                         setting.token_docs, fn, (n_vec, width))
  return scored, info

def table_row(setting: Setting, config, lat: tuple, dtype, n_train: int,
              workdir: str | None = None) -> tuple[Scored, dict[str, Any]]:
  """The "table" row: the table similarity (`config.table.models`: full W, low rank, ...) best
  on dev, each trained on the pooled embeddings of the training split by the table recipe
  (`training.train_and_evaluate` with `config.table.train`, its dev selection over the full
  corpus as the learning curve's; checkpointed under `workdir`), re-ranking the same candidates
  as every token row. The docs are stored as for dot (pooled vectors); the table is applied at
  query time (`timing.de_case` with the module).

  Returns:
    (its Scored, {"scorer", "trained", "best_step", "model": the chosen label, "train_seconds",
     "table_dev": {label: its dev `select_metric` in this setting}}).
  """
  prepared, sel = setting.prepared, config.train.select_metric
  q, qm, _, _, docs = lat
  runs = []
  for label, model in config.table.models.items():
    row = spec_lib.Row(model, config.table.train, config.eval, config.encoder, config.seed)
    out = training.train_and_evaluate(
        row, prepared, setting.splitset, progress=False,
        workdir=training.run_dir(workdir, row, prepared, setting.splitset,
                                 f"table-{label}-n{n_train}"))
    module = scorers.from_config(model, prepared.dim)
    fn, n_vec, width = timing.de_case(q, qm, prepared.embeddings.docs[docs], dtype, module,
                                      out["params"])
    scored = setting.score(module, out["params"], setting.pooled_queries,
                           prepared.embeddings.docs, fn, (n_vec, width))
    runs.append((label, scored, {"scorer": model.scorer, "trained": True,
                                 "best_step": out["best_step"],
                                 "train_seconds": round(out["train_seconds"], 1)}))
  label, scored, info = rows_lib.best_on_dev(runs, lambda r: r[1].dev.get(sel))
  return scored, {**info, "model": label,
                  "table_dev": {lab: s.dev.get(sel) for lab, s, _ in runs}}

def row_line(row: dict[str, Any], measure: str, sel: str) -> str:
  """The line a row's result prints: its test `measure` and dev `sel`; for a trained row also its
  best step, training seconds and any updates skipped for a non-finite gradient, and where dev
  kept ColBERT its own model's values (so a run stopped before its results file still shows
  them)."""
  line = (f"{row['row']:<28} n={row['n_train']} test {measure} {row['metrics'][measure]:.4f} "
          f"(dev {sel} {row['dev'].get(sel, float('nan')):.4f})")
  if row.get("best_step") is not None:
    line += f", best step {row['best_step']}, train {row.get('train_seconds', 0.0):.1f} s"
  if row.get("skipped_steps"):
    line += f", {row['skipped_steps']} updates skipped (non-finite gradient)"
  if row.get("kept_colbert"):
    line += (f"; kept ColBERT, own model: test {row['model_metrics'][measure]:.4f} "
             f"(dev {row['model_dev'].get(sel, float('nan')):.4f})")
  return line

def select_over_colbert(trained: Scored, colbert: Scored, sel: str) -> tuple[Scored, bool]:
  """The protocol's choice for a trained token row: the untrained ColBERT is a candidate of its
  dev selection. The trained model (its best step on dev) is kept only if its dev `sel` beats
  ColBERT's; a tie, or no dev split, keeps ColBERT (`rows.best_on_dev`, ColBERT first).

  Returns:
    (the chosen `Scored`, True when it is ColBERT's).
  """
  chosen = rows_lib.best_on_dev([colbert, trained], lambda s: s.dev.get(sel))
  return chosen, chosen is colbert

def table_rows(setting: Setting, config, lat: tuple, dtype, n_train: int, bar,
               workdir: str | None = None
               ) -> tuple[list[dict[str, Any]], dict[str, Callable[[], Any]], dict[str, Any]]:
  """The rows of a late-interaction table (`config.rows`, then the distillation rows of
  `config.distill`, then the hybrid) on the training split of `setting`.

  Every row re-ranks the same candidates; a trained token row is selected on dev against the
  untrained ColBERT (`select_over_colbert`): when ColBERT is kept, the row's metrics, dev and
  per-query values are ColBERT's ("kept_colbert": true) and its own model's are in
  "model_metrics" / "model_dev"; "bytes_per_doc" and its timed call are always its own model's.

  Args:
    lat: `latency_inputs`; dtype: the storage dtype; n_train: training queries (in the rows);
    bar: a progress bar (`progress.bar`), one update per row.
    workdir: each trained row (and the bilinear teacher) checkpoints in its own folder under
      it (`training.run_dir`), so a killed job's rerun resumes; None: no checkpoints.

  Returns:
    (rows, {row label: its timed call}, {"teachers": references, "teacher": the teacher used}
     (`teachers`)).
  """
  prepared, measures = setting.prepared, setting.measures
  sel = config.train.select_metric
  dim = int(setting.tokens.docs.shape[-1])
  rows: list[dict[str, Any]] = []
  dense: dict[str, Scored] = {}
  base = {"mode": "rerank", "encoder": "frozen", "collection": prepared.collection.name,
          "n_train": int(n_train)}

  def add(label: str, scorer: str, scored: Scored, bytes_per_doc: int | None = None,
          **extra) -> None:
    stored = None if scored.stored is None else list(scored.stored)
    if bytes_per_doc is None:
      bytes_per_doc = multivector.bytes_per_doc(*stored, dtype)
    rows.append({"row": label, "scorer": scorer, **base, "metrics": scored.test["mean"],
                 "dev": scored.dev, "per_query": per_query(scored.test, measures[0]),
                 "bytes_per_doc": bytes_per_doc, "stored": stored, **extra})
    dense[label] = scored
    bar.write(row_line(rows[-1], measures[0], sel))
    bar.update(1)

  def one(name: str, tcfg, teacher=None, label=None) -> tuple[Scored, dict[str, Any]]:
    module, scorer = models.row_model(config, name, dim)
    identity = {"model": config.models[name].to_dict(), "train": tcfg.to_dict(),
                "encoder": config.encoder.to_dict(), "rerank": config.rerank.to_dict(),
                "seed": int(config.seed),
                "teacher": None if teacher is None else [teacher_name, config.teacher.to_dict()]}
    folder = training.run_dir(workdir, identity, prepared, setting.splitset,
                              f"{label or name}-n{n_train}")
    scored, info = token_row(setting, module, scorer, tcfg, config.seed, lat, dtype, teacher,
                             folder)
    if info["trained"]:
      chosen, kept = select_over_colbert(scored, colbert, sel)
      info.update(kept_colbert=kept, model_metrics=scored.test["mean"], model_dev=scored.dev)
      scored = dataclasses.replace(chosen, latency_fn=scored.latency_fn, stored=scored.stored)
    return scored, {"scorer": scorer, **info}

  # untrained (validate)
  colbert, colbert_info = one("colbert", models.row_train(config, "colbert"))
  bm25 = li_teachers.bm25_scored(setting, lat[4])  # the reference and the "bm25" row
  refs, teacher_by_name, teacher_name = li_teachers.teachers(setting, config, bm25, workdir)
  for name in (r for r in config.rows if r != "hybrid"):
    if name == "dot":
      dot = scorers.build("dot", dim=prepared.embeddings.docs.shape[1])
      q, qm, _, _, docs = lat
      fn, n_vec, width = timing.de_case(q, qm, prepared.embeddings.docs[docs], dtype)
      add("dot", "dot", setting.score(dot, {}, setting.pooled_queries, prepared.embeddings.docs,
                                      fn, (n_vec, width)), trained=False, loss=None, teacher=None)
    elif name == "bm25":
      add("bm25", "bm25", bm25, bytes_per_doc=li_teachers.bm25_bytes_per_doc(prepared), trained=False, loss=None,
          teacher=None)
    elif models.is_finetuned(config, name):
      scored, info = finetuned.finetune_row(setting, config, name, lat, dtype, n_train, workdir)
      add(name, info.pop("scorer"), scored, encoder="fine-tuned",
          loss=models.row_finetune(config, name).loss,
          teacher=None, **info)
    elif name == "table":
      scored, info = table_row(setting, config, lat, dtype, n_train, workdir)
      add("table", info.pop("scorer"), scored, loss=config.table.train.loss, teacher=None,
          **info)
    else:
      scored, info = ((colbert, dict(colbert_info)) if name == "colbert" else
                      one(name, models.row_train(config, name)))
      add(name, info.pop("scorer"), scored, loss=config.train.loss if info["trained"] else None,
          teacher=None, **info)
  if teacher_name is not None:  # the teacher and its temperature are the same for every row
    t = teacher_by_name[teacher_name]
    teacher_temperature = float(config.distill.teacher_temperature) * teachers_lib.teacher_scale(
        t, prepared.bm25_idx, config.rerank.bm25_depth, prepared.collection.num_docs)
  for name in config.distill.scorers:
    for loss in config.distill.losses:
      tcfg = models.row_train(config, name)
      tcfg.loss = loss
      tcfg.teacher_temperature = teacher_temperature
      scored, info = one(name, tcfg, teacher=t, label=f"{name}-{loss}-{teacher_name}")
      add(f"{name} ({loss}, {teacher_name})", info.pop("scorer"), scored, loss=loss,
          teacher=teacher_name, **info)
  calls = {label: scored.latency_fn for label, scored in dense.items()}
  if "hybrid" in config.rows and rows:
    row, calls[row["row"]] = _hybrid_row(setting, config, rows, dense, lat)
    rows.append(row)
  return rows, calls, {"teachers": refs, "teacher": teacher_name}

def _hybrid_row(setting: Setting, config, rows: list[dict[str, Any]],
                dense: dict[str, Scored], lat) -> tuple[dict[str, Any], Callable[[], Any]]:
  """The hybrid of the dense row best on dev with BM25 over the same candidates, lam tuned on dev
  (`evaluate.HybridEvaluator`; with `pools`, the test mean holds "p_at_1_pool": the same fusion
  over each test query's own pool): (the row, its timed call: `hybrid.timed_call`)."""
  sel, cfg, prepared = config.train.select_metric, config.hybrid, setting.prepared
  best = rows_lib.best_on_dev([r for r in rows if r["scorer"] != "bm25"],
                              lambda r: r["dev"].get(sel))
  scored = dense[best["row"]]
  lam, res = evaluate.HybridEvaluator(setting.split("dev"), prepared.collection.doc_ids, cfg,
                                      setting.measures)(
      li_hybrid.candidates_of(setting, scored), {s: setting.split(s) for s in SPLITS})
  test = res["test"][0]
  if scored.pool is not None:
    test["mean"]["p_at_1_pool"] = evaluate.PoolEvaluator(
        prepared, setting.split("test"), setting.pools)(
            lam, cfg.normalize, pool_scores=scored.pool)["mean"]
  bm25_bytes = li_teachers.bm25_bytes_per_doc(prepared)
  return {"row": f"hybrid ({best['row']} + BM25)", "scorer": "hybrid", "mode": "rerank",
          "encoder": "frozen", "collection": best["collection"], "n_train": best["n_train"],
          "metrics": test["mean"], "dev": res["dev"][0]["mean"],
          "per_query": per_query(test, setting.measures[0]),
          "dense": best["row"], "lambda": lam,
          "bytes_per_doc": int(best["bytes_per_doc"]) + bm25_bytes,
          "bm25_bytes_per_doc": bm25_bytes, "trained": best.get("trained"),
          "loss": best.get("loss"), "teacher": best.get("teacher")}, li_hybrid.timed_call(
              setting, scored, lam, cfg.normalize, lat[4])


def compare_rows(rows: list[dict[str, Any]], config, unseen: dict[int, list[str]]) -> None:
  """`row["vs_colbert"]` and `row["vs_dot"]`: each row against the untrained ColBERT row and
  the dot row of the same n, `row["vs_table"]` against the "table" row where the table has
  one, and `row["vs_<name>"]` against each fine-tuned row (`models.is_finetuned`: so the
  fine-tuned rows are compared with each other too), paired over the test queries
  (`row["per_query"]`, `eval.stats.paired`); each baseline's comparisons, over every row and n
  of the table, are one Holm family (`experiment.compare.against_baselines`). `row["unseen"]`:
  the row over the test queries `unseen[n_train]` (the unseen-answer ones), against dot
  (`compare.subset_view`). With a "de_ft" row (the two-tower fine-tune of paper 002's DE),
  `row["recovered"]` = {"all", "unseen": the fraction of its gain over dot, in the first of
  `eval.measures`, that the row recovers at the same n} (`compare.recovered`: the finetune
  job's column, here on the re-ranked candidates)."""
  names = list(dict.fromkeys(r["row"] for r in rows))
  table = ("table",) if "table" in names else ()
  tuned = tuple(n for n in names if models.is_finetuned(config, n))
  compare.against_baselines(rows, [r["per_query"] for r in rows], ("n_train",), config,
                            name="row", baselines=("colbert", "dot") + table + tuned)
  compare.subset_view(rows, [unseen[r["n_train"]] for r in rows], "unseen", ("n_train",), config,
                      name="row")
  if models.DE_FT in names:
    compare.recovered(rows, models.DE_FT, config.eval.measures[0], ("n_train",), name="row")
