"""ME-BERT (scores, tables, retrieval through rows) and doc-token storage reduction."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bilinear_ir.errors import InputError
from bilinear_ir.retrieval import exact
from bilinear_ir.scorers import multivector, registry
from conftest import jit_apply, perturbed_params

N_DIM, TQ, TD, B, N = 8, 5, 7, 3, 9


def _inputs(seed):
  """Random token inputs, ragged masks (some docs shorter than m), padding full of garbage."""
  rng = np.random.default_rng(seed)
  q = rng.normal(size=(B, TQ, N_DIM)).astype(np.float32)
  d = rng.normal(size=(N, TD, N_DIM)).astype(np.float32)
  q_len = np.array([TQ, 2, 1])
  d_len = np.array([TD, 1, 2, 3, 7, 5, 2, 6, 4])
  qm = np.arange(TQ)[None] < q_len[:, None]
  dm = np.arange(TD)[None] < d_len[:, None]
  # Padding: large vectors aligned with every query's real tokens; they would win a max.
  junk_q = np.where(rng.random(q.shape) < 0.2, np.nan, 1e6).astype(np.float32)
  junk_d = np.broadcast_to(1e6 * np.sign(q[:, 0].sum(0)), d.shape).astype(np.float32)
  return np.where(qm[..., None], q, junk_q), qm, np.where(dm[..., None], d, junk_d), dm


def _ln(x, scale, bias):
  mu = x.mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-6) * scale + bias


def _mebert_np(params, q, qm, d, dm, m, pool):
  """Direct twin: query vector (CLS or mean of real tokens), max over the doc's real first m."""
  def proj(x):
    if not params:
      return x.astype(np.float64)
    p = {k: np.asarray(v, np.float64) for k, v in params["proj"].items()}
    return _ln(x @ p["kernel"] + p["bias"], np.asarray(params["norm"]["scale"]),
               np.asarray(params["norm"]["bias"]))

  out = np.zeros((len(q), len(d)))
  for b in range(len(q)):
    qv = q[b, 0] if pool == "cls" else q[b][qm[b]].mean(axis=0)
    qv = proj(qv.astype(np.float64))
    for n in range(len(d)):
      rows = [proj(d[n, j].astype(np.float64)) for j in range(min(m, TD)) if dm[n, j]]
      out[b, n] = max(float(qv @ r) for r in rows)
  return out


@pytest.mark.parametrize("kw", [{"num_vectors": 3}, {"num_vectors": 4, "proj_dim": 5},
                                {"num_vectors": 8, "query_pool": "mean", "proj_dim": 6}])
def test_mebert_matches_numpy(kw):
  module = registry.build("mebert", dim=N_DIM, query_len=TQ, doc_len=TD, **kw)
  params = perturbed_params(module)
  q, qm, d, dm = _inputs(0)
  want = _mebert_np(params, q, qm, d, dm, kw["num_vectors"], kw.get("query_pool", "cls"))
  got = np.asarray(jit_apply(module, module.score_all, params, q, qm, d, dm))
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  pairs = np.asarray(jit_apply(module, module.score_pairs, params, q, qm, d[:B], dm[:B]))
  np.testing.assert_allclose(pairs, np.diag(want[:, :B]), rtol=1e-4, atol=1e-4)


def test_mebert_appended_padding_never_changes_a_score():
  module = registry.build("mebert", dim=N_DIM, num_vectors=4, query_pool="mean")
  q, qm, d, dm = _inputs(1)
  base = np.asarray(jit_apply(module, module.score_all, {}, q, qm, d, dm))
  q2 = np.concatenate([q, np.full((B, 3, N_DIM), 1e6, np.float32)], axis=1)
  qm2 = np.concatenate([qm, np.zeros((B, 3), bool)], axis=1)
  d2 = np.concatenate([d, np.full((N, 3, N_DIM), 1e6, np.float32)], axis=1)
  dm2 = np.concatenate([dm, np.zeros((N, 3), bool)], axis=1)
  got = np.asarray(jit_apply(module, module.score_all, {}, q2, qm2, d2, dm2))
  np.testing.assert_allclose(got, base, rtol=1e-6)


def test_mebert_retrieval_through_row_tables_equals_brute_force():
  module = registry.build("mebert", dim=N_DIM, num_vectors=4, proj_dim=6)
  params = perturbed_params(module, seed=3)
  q, qm, d, dm = _inputs(2)
  rows, row_doc, row_valid = jit_apply(module, module.doc_table, params, d, dm)
  assert rows.shape == (N * 4, 6) and row_doc.shape == (N * 4,) and row_valid.shape == (N * 4,)
  np.testing.assert_array_equal(np.asarray(row_valid).reshape(N, 4), dm[:, :4])
  qt = np.asarray(jit_apply(module, module.query_table, params, q, qm), np.float64)
  # A MIPS engine over the valid rows, then the max over each doc's rows.
  keep = np.asarray(row_valid)
  row_scores = qt @ np.asarray(rows, np.float64)[keep].T  # [B, valid rows]
  per_doc = np.full((B, N), -np.inf)
  for b in range(B):
    np.maximum.at(per_doc[b], np.asarray(row_doc)[keep], row_scores[b])
  brute = np.asarray(jit_apply(module, module.score_all, params, q, qm, d, dm))
  np.testing.assert_allclose(per_doc, brute, rtol=1e-5, atol=1e-5)
  # The best rows name the best docs: top-3 by rows (deduplicated) == top-3 by score_all.
  for b in range(B):
    docs_by_row = list(dict.fromkeys(np.asarray(row_doc)[keep][np.argsort(-row_scores[b])]))
    np.testing.assert_array_equal(docs_by_row[:3], np.argsort(-brute[b])[:3])
  # The retrieval engine's multi-vector top-k over the same tables.
  res = exact.multi_vector_topk(qt.astype(np.float32), rows, row_doc, k=4, row_valid=row_valid)
  np.testing.assert_array_equal(np.asarray(res.ids), np.argsort(-brute, axis=1)[:, :4])
  np.testing.assert_allclose(np.asarray(res.scores), -np.sort(-brute, axis=1)[:, :4], rtol=1e-5,
                             atol=1e-5)


def _reduce(kw, d, dm, params=None):
  module = multivector.TokenReduction(dim=N_DIM, doc_len=TD, **kw)
  if params is None:
    params = jax.jit(lambda k: module.init(k, d, dm, method=module.docs))(
        jax.random.key(0)).get("params", {})
  out, mask = jit_apply(module, module.docs, params, d, dm)
  return np.asarray(out), np.asarray(mask), params


def test_pooling_matrix_windows():
  np.testing.assert_array_equal(multivector.pooling_matrix(7, 3).argmax(axis=1),
                                [0, 0, 1, 1, 2, 2, 2])
  np.testing.assert_array_equal(multivector.pooling_matrix(200, 50).sum(axis=0), np.full(50, 4))
  with pytest.raises(InputError, match="model.doc_tokens"):
    multivector.pooling_matrix(4, 5)


def test_token_reduction_first_avgpool_linear():
  _, _, d, dm = _inputs(4)
  clean = np.where(dm[..., None], d, 0.0)
  out, mask, _ = _reduce({"doc_tokens": 3, "method": "first"}, d, dm)
  np.testing.assert_allclose(out, clean[:, :3])
  np.testing.assert_array_equal(mask, dm[:, :3])

  out, mask, _ = _reduce({"doc_tokens": 3, "method": "avgpool"}, d, dm)
  for n in range(N):
    for k, window in enumerate([(0, 1), (2, 3), (4, 5, 6)]):
      real = [t for t in window if dm[n, t]]
      assert mask[n, k] == bool(real)
      want = d[n, real].mean(axis=0) if real else np.zeros(N_DIM)
      np.testing.assert_allclose(out[n, k], want, rtol=1e-5, atol=1e-6)

  out, mask, params = _reduce({"doc_tokens": 3, "method": "linear"}, d, dm)
  a = np.asarray(params["token_map"])
  np.testing.assert_allclose(a, multivector.pooling_matrix(TD, 3) / [2, 2, 3])  # avg-pool init
  a = np.random.default_rng(5).normal(size=a.shape).astype(np.float32)
  out, mask, _ = _reduce({"doc_tokens": 3, "method": "linear"}, d, dm, {"token_map": a})
  np.testing.assert_allclose(out, np.einsum("ntp,tk->nkp", clean, a), rtol=1e-5, atol=1e-5)
  assert mask.all()


def test_token_dim_projection_is_shared_and_unbiased_at_init():
  _, _, d, dm = _inputs(6)
  out, mask, params = _reduce({"token_dim": 3}, d, dm)
  g = np.asarray(params["dim_map"])
  assert g.shape == (N_DIM, 3)
  np.testing.assert_allclose(out, np.where(dm[..., None], d, 0.0) @ g, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(mask, dm)
  # N(0, 1/P') init: E[G G^T] = I, so projected dot products are unbiased (JL).
  big = multivector.TokenReduction(dim=16, doc_len=1, token_dim=64)
  init = jax.vmap(lambda k: big.init(k, jnp.zeros((1, 1, 16)), jnp.ones((1, 1), bool),
                                     method=big.docs)["params"]["dim_map"])
  gs = np.asarray(jax.jit(init)(jax.random.split(jax.random.key(0), 30)))
  np.testing.assert_allclose(np.mean(gs @ gs.transpose(0, 2, 1), axis=0), np.eye(16), atol=0.1)


def test_bytes_per_doc_and_storage_table():
  assert multivector.bytes_per_doc(180, 384, "float32") == 180 * 384 * 4
  assert multivector.bytes_per_doc(50, 384, "bfloat16") == 50 * 384 * 2
  assert multivector.bytes_per_doc(8, 64, "int8") == 512
  rows = multivector.storage_table(dim=768, doc_len=200, doc_tokens=[50], token_dims=[128],
                                   dtypes=["float32"])
  by_setting = {(r["doc_tokens"], r["token_dim"]): r for r in rows}
  assert set(by_setting) == {(200, 768), (200, 128), (50, 768), (50, 128)}
  assert by_setting[(200, 768)]["x_de"] == 200  # the LITE paper's "200x" for ColBERT / LITE
  assert by_setting[(50, 768)]["x_de"] == 50    # small separable LITE's "50x"
  assert by_setting[(50, 128)]["bytes_per_doc"] == 50 * 128 * 4
