"""The references (BM25's own order of the candidates, the table scorer) and the distillation
teachers of a late-interaction table."""
from __future__ import annotations

from typing import Any, Callable

import ml_collections
import numpy as np

from bilinear_ir.experiment import evaluate
from bilinear_ir.experiment import rows as rows_lib
from bilinear_ir.experiment import spec as spec_lib
from bilinear_ir.experiment import training
from bilinear_ir.retrieval import ranking
from bilinear_ir.studies.late_interaction.setting import SPLITS
from bilinear_ir.studies.late_interaction.setting import Scored
from bilinear_ir.studies.late_interaction.setting import Setting
from bilinear_ir.train import teachers as teachers_lib


def teachers(setting: Setting, config: ml_collections.ConfigDict, bm25: Scored,
             workdir: str | None = None
             ) -> tuple[dict[str, dict[str, Any]], dict[str, teachers_lib.Teacher], str | None]:
  """The references and distillation teachers: BM25's own order of the candidates (`bm25`, its
  `bm25_scored`, which the table's "bm25" row reports too), and, when
  `config.distill` distils, the table scorer `config.teacher` (model, train) trained on the
  pooled embeddings (`training.scorer_teacher`; it checkpoints in its own folder under
  `workdir`, `training.run_dir`).

  Returns:
    ({name: {"metrics", "dev"[, "model"]}} of each reference, {name: its teacher
     (`train.teachers`), scoring rows of `prepared.embeddings`},
     the teacher used: `distill.teacher`, or for "best" the one best on dev; None without
     distillation).
  """
  prepared = setting.prepared
  refs = {"bm25": {"metrics": bm25.test["mean"], "dev": bm25.dev}}
  out = {}
  distill = config.distill
  if distill.scorers and distill.losses:
    if distill.teacher in ("bilinear", "best"):
      row = spec_lib.Row(config.teacher.model, config.teacher.train, config.eval,
                         config.encoder, config.seed)
      teacher, module, params = training.scorer_teacher(
          row, prepared, setting.splitset,
          training.run_dir(workdir, row, prepared, setting.splitset, "teacher-bilinear"))
      out["bilinear"] = teacher
      scored = setting.score(module, params, setting.pooled_queries, prepared.embeddings.docs)
      refs["bilinear"] = {"metrics": scored.test["mean"], "dev": scored.dev,
                          "model": config.teacher.model.scorer}
    if distill.teacher in ("bm25", "best"):
      out["bm25"] = teachers_lib.bm25_teacher(prepared)
  name = None
  if out:
    sel = config.train.select_metric
    name = (distill.teacher if distill.teacher != "best" else
            rows_lib.best_on_dev(list(out), lambda t: refs[t]["dev"].get(sel)))
  return refs, out, name


def bm25_scored(setting: Setting, docs: np.ndarray | None = None) -> Scored:
  """BM25's own order of the dev and test candidates (their exact scores, `Setting.bm25`), as a
  row's `Scored`: with pools, the test metric "p_at_1_pool" is BM25 alone over each test query's
  own pool (`PoolEvaluator` at lam = 0); with `docs` [K] (doc rows, `latency.latency_inputs`),
  its timed call (`bm25_call`). `stored` is None: BM25 keeps a sparse vector per doc
  (`bm25_bytes_per_doc`)."""
  run, metrics = {}, {}
  for split in SPLITS:
    run[split] = ranking.sort_candidates(setting.cands[split], setting.bm25[split])
    metrics[split] = setting.evaluate(split, *run[split])
  if setting.pools is not None:
    metrics["test"]["mean"]["p_at_1_pool"] = evaluate.PoolEvaluator(
        setting.prepared, setting.split("test"), setting.pools)(0.0)["mean"]
  return Scored(run, metrics["dev"]["mean"], metrics["test"],
                None if docs is None else bm25_call(setting, docs))


def bm25_call(setting: Setting, docs: np.ndarray) -> Callable[[], np.ndarray]:
  """BM25's latency call: the first test query's exact scores of the stored `docs` [K] -> [K]
  (its sparse vector against theirs, `Prepared.bm25_pair_scores`)."""
  q_rows = np.repeat(setting.rows["test"][:1], len(docs))
  return lambda: setting.prepared.bm25_pair_scores(q_rows, docs)


def bm25_bytes_per_doc(prepared) -> int:
  """Bytes BM25 stores per doc: its sparse vector's nonzeros (an int32 term id and a float32
  weight each), averaged over the corpus."""
  return int(round(prepared.bm25.doc_vectors.nnz / prepared.collection.num_docs * 8))
