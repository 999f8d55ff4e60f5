"""Teacher scores for the distillation losses ("kl", "margin_mse" of `train.trainer.fit`).

A teacher is a dense [Q, N] float32 matrix of scores of every (query row, doc row); `fit` reads
the entries of each batch's (query, candidate) pairs. `teacher_scale` measures the spread the
teacher's temperature is expressed in.
"""
from __future__ import annotations

from typing import Any

import jax
import numpy as np

from bilinear_ir.data import pipeline


def bm25_teacher(prepared: pipeline.Prepared) -> np.ndarray:
  """[Q_all, N] float32 exact BM25 scores of every (query row, doc row)."""
  qids = prepared.embeddings.query_ids
  qv = prepared.bm25.query_vectors([prepared.collection.queries[q] for q in qids])
  return np.asarray((qv @ prepared.bm25.doc_vectors.T).toarray(), np.float32)


def scorer_teacher(module, params: Any, queries: np.ndarray, docs: np.ndarray) -> np.ndarray:
  """[Q, N] float32 scores of a trained scorer: `score_all` of queries [Q, ...] x docs [N, ...]."""
  scores = jax.jit(lambda p, q, d: module.apply({"params": p}, q, d, method=module.score_all))(
      params, queries, docs)
  return np.asarray(scores, np.float32)


def teacher_scale(teacher: np.ndarray, bm25_idx: np.ndarray, depth: int) -> float:
  """Mean over queries of the std of the teacher's scores of its BM25 top-`depth`: [Q, N] -> ."""
  top = bm25_idx[:, :depth]
  vals = np.take_along_axis(teacher, np.where(top < 0, 0, top), 1)
  return max(float(np.mean(np.std(vals, axis=1))), 1e-6)
