"""Teachers of the distillation losses ("kl", "margin_mse" of `train.trainer.fit`).

A teacher scores blocks of (query row, doc row) pairs on the host:
`teacher(q_rows [B], d_rows [C]) -> [B, C] float32`. `fit` calls it on each batch's queries and
candidates, so no [Q, N] matrix of every pair is ever held: on InsuranceQA one would be
16,889 x 27,413 floats (1.85 GB) per teacher, and at MS MARCO scale (500k x 8.8M) it could not
exist at all. `teacher_scale` measures the spread the teacher's temperature is expressed in.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np

from bilinear_ir.data import pipeline

# (q_rows [B] int, d_rows [C] int) -> [B, C] float32 scores of every (query, doc) of the block.
Teacher = Callable[[np.ndarray, np.ndarray], np.ndarray]


def bm25_teacher(prepared: pipeline.Prepared) -> Teacher:
  """Exact BM25 of blocks of (query row, doc row), rows of `prepared.embeddings`: a sparse
  product of the queries' and docs' BM25 vectors, in float64, returned as float32."""
  qids = prepared.embeddings.query_ids
  qv = prepared.bm25.query_vectors([prepared.collection.queries[q] for q in qids])  # [Q_all, V]
  dv = prepared.bm25.doc_vectors.tocsr()  # [N, V]

  def score(q_rows: np.ndarray, d_rows: np.ndarray) -> np.ndarray:
    return np.asarray((qv[np.asarray(q_rows)] @ dv[np.asarray(d_rows)].T).toarray(), np.float32)

  return score


def scorer_teacher(module, params: Any, queries: np.ndarray, docs: np.ndarray) -> Teacher:
  """A trained scorer's `score_all` on blocks of rows of queries [Q, ...] and docs [N, ...]
  (jitted; compiled once per block shape)."""
  fn = jax.jit(lambda p, q, d: module.apply({"params": p}, q, d, method=module.score_all))

  def score(q_rows: np.ndarray, d_rows: np.ndarray) -> np.ndarray:
    return np.asarray(fn(params, queries[np.asarray(q_rows)], docs[np.asarray(d_rows)]),
                      np.float32)

  return score


def teacher_scale(teacher: Teacher, bm25_idx: np.ndarray, depth: int, num_docs: int,
                  chunk: int = 256) -> float:
  """Mean over queries of the std of the teacher's scores of its BM25 top-`depth`.

  Args:
    teacher: scores of rows of the queries of `bm25_idx`.
    bm25_idx: [Q, >= depth] each query's BM25 doc rows, best first (-1: none; read as doc 0).
    depth: how many of each list count.
    num_docs: N; each block of `chunk` queries is scored against every doc (one block shape).

  Returns:
    The scale (at least 1e-6).
  """
  top = bm25_idx[:, :depth]
  top = np.where(top < 0, 0, top)
  docs = np.arange(num_docs)
  stds = []
  for start in range(0, top.shape[0], chunk):
    rows = np.arange(start, min(start + chunk, top.shape[0]))
    vals = np.take_along_axis(teacher(rows, docs), top[rows], 1)  # [b, depth]
    stds.append(np.std(vals, axis=1))
  return max(float(np.mean(np.concatenate(stds))), 1e-6)
