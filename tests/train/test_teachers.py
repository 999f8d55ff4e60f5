"""The distillation teachers score blocks of pairs: each block equals the dense matrix's entries."""
import types

import jax
import numpy as np
import pytest

from bilinear_ir import scorers
from bilinear_ir.data import bm25
from bilinear_ir.train import teachers

DOCS = ["the cat sat on the mat", "dogs chase cats in the park", "a bird sings at dawn",
        "the insurance policy covers fire damage", "life insurance pays a death benefit",
        "cats and dogs are pets", "the park opens at dawn"]
QUERIES = {"q0": "cat on a mat", "q1": "does life insurance cover fire", "q2": "dawn in the park",
           "q3": "pets"}


def _prepared():
  model = bm25.BM25().fit(DOCS)
  qids = list(QUERIES)
  return types.SimpleNamespace(
      embeddings=types.SimpleNamespace(query_ids=qids),
      collection=types.SimpleNamespace(queries=QUERIES, num_docs=len(DOCS)),
      bm25=model), model.score([QUERIES[q] for q in qids])  # [Q, N] float64


def test_bm25_teacher_blocks_equal_the_dense_scores():
  prepared, dense = _prepared()
  teacher = teachers.bm25_teacher(prepared)
  assert np.any(dense > 0)
  rng = np.random.default_rng(0)
  for _ in range(5):
    q_rows = rng.integers(0, dense.shape[0], 3)
    d_rows = rng.integers(0, dense.shape[1], 6)  # repeats included, as batches have
    got = teacher(q_rows, d_rows)
    assert got.dtype == np.float32 and got.shape == (3, 6)
    np.testing.assert_allclose(got, dense[q_rows][:, d_rows], rtol=1e-6, atol=1e-7)


def test_scorer_teacher_blocks_equal_score_all():
  rng = np.random.default_rng(1)
  queries = rng.normal(size=(9, 6)).astype(np.float32)
  docs = rng.normal(size=(11, 6)).astype(np.float32)
  module = scorers.build("bilinear", dim=6)
  params = scorers.init_params(module, jax.random.key(3))
  params = jax.tree.map(lambda w: w + rng.normal(size=w.shape).astype(np.float32), params)
  dense = np.asarray(module.apply({"params": params}, queries, docs, method=module.score_all))
  teacher = teachers.scorer_teacher(module, params, queries, docs)
  q_rows, d_rows = np.array([4, 0, 8]), np.array([10, 2, 2, 7])
  np.testing.assert_allclose(teacher(q_rows, d_rows), dense[q_rows][:, d_rows], rtol=1e-5,
                             atol=1e-5)


@pytest.mark.parametrize("chunk", [1, 2, 256])
def test_teacher_scale_is_the_mean_std_over_each_bm25_top_list(chunk):
  rng = np.random.default_rng(2)
  dense = rng.normal(size=(5, 12)).astype(np.float32) * np.arange(1, 6, dtype=np.float32)[:, None]
  idx = np.stack([rng.permutation(12) for _ in range(5)])
  idx[1, 3:] = -1  # a short list: -1 reads as doc 0, as the candidates do
  teacher = lambda q, d: dense[np.asarray(q)][:, np.asarray(d)]
  want = np.mean([np.std(dense[i, np.where(idx[i, :4] < 0, 0, idx[i, :4])]) for i in range(5)])
  got = teachers.teacher_scale(teacher, idx, 4, 12, chunk=chunk)
  assert got == pytest.approx(want, rel=1e-6)
