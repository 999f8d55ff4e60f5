"""`ranking.rerank`: chunks of queries against their own candidates, gathered on the device."""
import jax
import numpy as np
import pytest

from bilinear_ir import scorers
from bilinear_ir.retrieval import ranking


def _pair_twin(module, params, q_feats, d_feats, cands):
  """[Q, K] scores, one (query, doc) pair per `score_all` call (-inf where the candidate is -1)."""
  out = np.full(cands.shape, -np.inf, np.float32)
  for i, row in enumerate(cands):
    for j, doc in enumerate(row):
      if doc >= 0:
        out[i, j] = np.asarray(module.apply(
            {"params": params}, *(x[i:i + 1] for x in q_feats), *(x[doc:doc + 1] for x in d_feats),
            method=module.score_all))[0, 0]
  return out


@pytest.mark.parametrize("name,kw,chunk", [("colbert", {}, 4), ("lite", {"m1": 6, "m2": 10}, 3),
                                           ("knrm", {}, 64), ("dot", {}, 2)])
def test_rerank_scores_every_candidate_as_its_pair_and_sorts(name, kw, chunk):
  """7 queries in chunks of `chunk` (the last one padded), 5 candidates each with a missing one
  (-1) and a repeated doc: each score equals its pair scored alone, each row is sorted by score
  (ties by doc row), missing last with -inf."""
  rng = np.random.default_rng(0)
  n_docs, q_len, d_len, dim = 11, 4, 6, 8
  if name == "dot":
    module = scorers.build("dot", dim=dim)
    q_feats = (rng.normal(size=(7, dim)).astype(np.float32),)
    d_feats = (rng.normal(size=(n_docs, dim)).astype(np.float32),)
  else:
    module = scorers.build(name, dim=dim, query_len=q_len, doc_len=d_len, **kw)
    q_feats = (rng.normal(size=(7, q_len, dim)).astype(np.float32), rng.random((7, q_len)) < 0.8)
    d_feats = (rng.normal(size=(n_docs, d_len, dim)).astype(np.float32),
               rng.random((n_docs, d_len)) < 0.8)
    q_feats[1][:, 0] = d_feats[1][:, 0] = True
  params = scorers.init_params(module, jax.random.key(1))
  cands = rng.integers(0, n_docs, size=(7, 5))
  cands[:, 3] = -1
  cands[2, 4] = cands[2, 0]
  idx, scores = ranking.rerank(module, params, q_feats if name != "dot" else q_feats[0],
                               d_feats if name != "dot" else d_feats[0], cands, query_chunk=chunk)
  twin = _pair_twin(module, params, q_feats, d_feats, cands)
  for i in range(7):
    got = dict(zip(idx[i][idx[i] >= 0].tolist(), scores[i][idx[i] >= 0].tolist()))
    assert sorted(got) == sorted(set(cands[i][cands[i] >= 0].tolist()))
    for j, doc in enumerate(cands[i]):
      if doc >= 0:
        np.testing.assert_allclose(got[doc], twin[i, j], rtol=1e-5, atol=1e-5)
    assert idx[i, -1] == -1 and scores[i, -1] == -np.inf
    s = scores[i][:-1]
    assert np.all(s[:-1] >= s[1:])
