"""MoL top-k step sizes per device (`mol_topk.default_chunk`, the CPU rescoring step): the chunking
changes only the speed, never the result."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bilinear_ir import scorers
from bilinear_ir.retrieval import mol_topk as mt


def test_default_chunk_per_device():
  assert mt.default_chunk("cpu") == mt.CPU_CHUNK < mt.ACCEL_CHUNK
  assert mt.default_chunk("gpu") == mt.default_chunk("tpu") == mt.ACCEL_CHUNK
  assert mt.default_chunk() == mt.default_chunk(jax.default_backend())
  assert mt.avg_block("cpu") == mt.avg_block("tpu") == 1 < mt.AVG_BLOCK == mt.avg_block("gpu")


@pytest.mark.parametrize("n", [40, 300, 3000])
def test_avg_top_n_by_blocks_is_lax_top_k(n):
  """TopKAvg's candidate set by the block selection (the GPUs' path, forced here) equals
  `lax.top_k`'s, exact ties included (duplicated items), and so does the whole TopKAvg result."""
  src, *_ = _source()
  avg = src.avg_scores(0, src.num_items)
  want = np.asarray(jax.lax.top_k(avg, n)[1])
  for block in (4, 16):
    np.testing.assert_array_equal(np.asarray(mt.avg_top_n(avg, n, block=block)), want)
  np.testing.assert_array_equal(np.asarray(mt.avg_top_n(avg, n, block=1)), want)
  plain = mt.topk_avg(src, k=20, n=n, tight_bound=True)
  mt.topk_avg.clear_cache()
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(mt, "avg_block", lambda platform=None: 16)
    blocks = mt.topk_avg(src, k=20, n=n, tight_bound=True)
  mt.topk_avg.clear_cache()
  for field in ("ids", "scores", "gap_bound", "gap_bound_retrieved"):
    np.testing.assert_array_equal(np.asarray(getattr(blocks, field)),
                                  np.asarray(getattr(plain, field)))


def _source(items=3000, batch=6, p=2, d_p=16, seed=0):
  module = scorers.build("mol", dim=d_p, p_q=p, p_x=p, d_p=d_p, gate_hidden=32,
                         temperature=0.05)
  params = scorers.init_params(module, jax.random.key(seed))
  rng = np.random.default_rng(seed)
  norm = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
  ic = norm(rng.standard_normal((items, p, d_p))).astype(np.float32)
  ic[1500:1504] = ic[7]  # duplicate items: exact MoL ties, broken by the lower id
  ic[2000:2003] = ic[1234]
  qc = norm(rng.standard_normal((batch, p, d_p))).astype(np.float32)
  qc[0], qc[1] = ic[7], ic[1234]  # queries whose top lists hold the duplicated items
  index = mt.index_from_components(jnp.asarray(ic), p)
  return mt.MolSource(jnp.asarray(qc), index, params, module), module, params, qc, ic


def _float64_twin(module, params, qc, ic, k):
  """MoL scores of every item in numpy float64 (the gate MLP's float32 output, float64 mixture),
  and the top-k ids by (score desc, id asc). The gate MLP runs at float32 (not a GPU's default
  TF32, which moved the twin's scores by up to 7e-4 relative on an H200)."""
  logits = np.einsum("bad,nxd->bnax", qc.astype(np.float64), ic.astype(np.float64))
  logits = logits.reshape(qc.shape[0], ic.shape[0], -1) / module.temperature
  with jax.default_matmul_precision("float32"):
    gates = np.asarray(module.apply({"params": params}, jnp.asarray(logits, jnp.float32),
                                    method=module.mix)[1], np.float64)
  phi = np.sum(gates * logits, axis=-1)
  order = np.lexsort((np.broadcast_to(np.arange(ic.shape[0]), phi.shape), -phi), axis=-1)
  return phi, order[:, :k]


@pytest.mark.parametrize("chunk", [None, 64, 256, 4096])
def test_brute_force_is_the_same_at_every_chunk(chunk):
  src, module, params, qc, ic = _source()
  got = mt.brute_force(src, k=20, chunk=chunk)
  ref = mt.brute_force(src, k=20, chunk=3000)  # one step over every item
  np.testing.assert_array_equal(np.asarray(got.ids), np.asarray(ref.ids))
  # the same up to float32 rounding (XLA's matmuls may round differently at other shapes)
  np.testing.assert_allclose(np.asarray(got.scores), np.asarray(ref.scores), rtol=1e-6)
  _ties_by_lower_id(got)
  phi, top = _float64_twin(module, params, qc, ic, 20)
  np.testing.assert_allclose(np.asarray(got.scores), np.take_along_axis(phi, top, 1),
                             rtol=1e-5, atol=1e-4)
  # the listed ids score within float32 rounding of the float64 top-k (near-ties may swap)
  got_phi = np.take_along_axis(phi, np.asarray(got.ids), 1)
  np.testing.assert_allclose(got_phi, np.take_along_axis(phi, top, 1), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("chunk", [64, 4096])
def test_topk_avg_rescoring_steps_give_brute_force_when_every_item_is_a_candidate(chunk):
  # n = N: every item is a candidate, so TopKAvg must return brute force's list exactly, whatever
  # the rescoring step (CPU: at most CPU_RESCORE_CHUNK candidates per step). TopKAvg rescores at
  # the backend's default precision (TF32 on GPUs, where near-ties then swap), so at float32 here.
  src, *_ = _source()
  with jax.default_matmul_precision("float32"):
    full = mt.topk_avg(src, k=20, n=3000, tight_bound=False, chunk=chunk)
  bf = mt.brute_force(src, k=20)
  np.testing.assert_array_equal(np.asarray(full.ids), np.asarray(bf.ids))
  np.testing.assert_allclose(np.asarray(full.scores), np.asarray(bf.scores), rtol=1e-6)
  _ties_by_lower_id(full)


def _ties_by_lower_id(res):
  scores, ids = np.asarray(res.scores), np.asarray(res.ids)
  tied = scores[:, 1:] == scores[:, :-1]
  assert tied[0].sum() >= 4 and tied[1].sum() >= 3  # the duplicates' exact ties are listed
  assert np.all(ids[:, 1:][tied] > ids[:, :-1][tied])
