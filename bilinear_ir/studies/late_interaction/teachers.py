"""The references (BM25's own order of the candidates, the table scorer) and the distillation
teachers of a late-interaction table."""
from __future__ import annotations

from typing import Any

import ml_collections

from bilinear_ir.experiment import evaluate
from bilinear_ir.experiment import rows as rows_lib
from bilinear_ir.experiment import spec as spec_lib
from bilinear_ir.experiment import training
from bilinear_ir.retrieval import ranking
from bilinear_ir.studies.late_interaction.setting import SPLITS
from bilinear_ir.studies.late_interaction.setting import Setting
from bilinear_ir.train import teachers as teachers_lib


def teachers(setting: Setting, config: ml_collections.ConfigDict, workdir: str | None = None
             ) -> tuple[dict[str, dict[str, Any]], dict[str, teachers_lib.Teacher], str | None]:
  """The references and distillation teachers: BM25's own order of the candidates, and, when
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
  refs = {"bm25": {"metrics": {}, "dev": {}}}
  for split in SPLITS:
    idx, scores = ranking.sort_candidates(setting.cands[split], setting.bm25[split])
    refs["bm25"]["metrics" if split == "test" else "dev"] = setting.evaluate(split, idx,
                                                                             scores)["mean"]
  if setting.pools is not None:  # BM25 alone over each test query's own pool (lam = 0)
    refs["bm25"]["metrics"]["p_at_1_pool"] = evaluate.PoolEvaluator(
        prepared, setting.split("test"), setting.pools)(0.0)["mean"]
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
