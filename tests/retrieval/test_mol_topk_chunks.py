"""MoL top-k step sizes per device (`mol_topk.default_chunk`, the CPU rescoring step): the chunking
changes only the speed, never the result."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bilinear_ir import errors, scorers
from bilinear_ir.retrieval import mol_topk as mt


def test_default_chunk_per_device():
  assert mt.default_chunk("cpu") == mt.CPU_CHUNK < mt.ACCEL_CHUNK
  assert mt.default_chunk("gpu") == mt.default_chunk("tpu") == mt.ACCEL_CHUNK
  assert mt.default_chunk() == mt.default_chunk(jax.default_backend())
  assert (mt.avg_method("cpu"), mt.avg_method("gpu"), mt.avg_method("tpu")) == (
      "pruned", "blocks", "top_k")
  # "pruned" at the largest block that keeps the n best blocks a quarter of the row, lax.top_k
  # below PRUNE_MIN_BLOCK; "blocks" at AVG_BLOCK unless capped
  assert mt.avg_plan(4000, 1_000_000, method="pruned") == ("pruned", 32)
  assert mt.avg_plan(4000, 200_000, method="pruned") == ("pruned", mt.PRUNE_MIN_BLOCK) == (
      "pruned", 8)
  assert mt.avg_plan(4000, 100_000, method="pruned") == ("top_k", 1)
  assert mt.avg_plan(4000, 1_000_000, method="blocks") == ("blocks", mt.AVG_BLOCK)
  assert mt.avg_plan(4000, 100_000, block=16, method="blocks") == ("blocks", 4)
  assert mt.avg_plan(10, 10, method="blocks") == mt.avg_plan(5, 9, method="top_k") == ("top_k", 1)


def _np_top_n(x, n):
  """numpy twin of `lax.top_k`'s ids: per row, by (value desc, index asc)."""
  idx = np.broadcast_to(np.arange(x.shape[1]), x.shape)
  return np.lexsort((idx, -x), axis=-1)[:, :n]


LAYOUTS = ["normal", "ties", "near_ties", "ascending", "descending", "constant"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_pruned_top_n_is_lax_top_k(layout):
  """`pruned_top_n` returns `lax.top_k`'s values and ids (ties to the lower index) on rows with
  exact ties across and inside blocks, sorted rows (every block maximum tied or ordered against
  the pruning), a row length that is no multiple of the block (the short last block), and
  n * block from small up to N."""
  rng = np.random.default_rng(LAYOUTS.index(layout))
  for num, n, block in [(1000, 10, 16), (1003, 62, 16), (997, 31, 32), (640, 40, 16),
                        (257, 1, 4), (64, 16, 4), (500, 125, 2)]:
    x = rng.standard_normal((3, num)).astype(np.float32)
    if layout == "ties":
      x = np.round(x * 2) / 2  # a handful of distinct values: long runs of exact ties
    elif layout == "near_ties":  # 0.5 plus 0 to 3 ulps: the block maxima differ by one ulp
      x = np.float32(0.5) + rng.integers(0, 4, x.shape).astype(np.float32) * np.spacing(
          np.float32(0.5))
    elif layout == "ascending":
      x = np.sort(np.round(x * 4) / 4, axis=1)
    elif layout == "descending":
      x = -np.sort(np.round(x * 4) / 4, axis=1)
    elif layout == "constant":
      x[:] = 0.5
    vals, ids = mt.pruned_top_n(jnp.asarray(x), n, block)
    want_vals, want_ids = jax.lax.top_k(jnp.asarray(x), n)
    np.testing.assert_array_equal(np.asarray(ids), np.asarray(want_ids))
    np.testing.assert_array_equal(np.asarray(vals), np.asarray(want_vals))
    np.testing.assert_array_equal(np.asarray(ids), _np_top_n(x, n))


@pytest.mark.parametrize("n", [40, 300, 3000])
def test_avg_top_n_methods_are_lax_top_k(n):
  """TopKAvg's candidate set by every method ("top_k", "blocks": the GPUs' path, "pruned": the
  CPU's) equals `lax.top_k`'s, exact ties included (duplicated items), and so does the whole
  TopKAvg result; n = N (3,000) takes `lax.top_k` whatever the method."""
  src, *_ = _source()
  avg = src.avg_scores(0, src.num_items)
  want = np.asarray(jax.lax.top_k(avg, n)[1])
  np.testing.assert_array_equal(want, _np_top_n(np.asarray(avg), n))
  for method in mt.AVG_METHODS:
    for block in (None, 4, 16):
      np.testing.assert_array_equal(np.asarray(mt.avg_top_n(avg, n, block, method=method)), want)
  np.testing.assert_array_equal(np.asarray(mt.avg_top_n(avg, n, block=1, method="pruned")), want)
  plain = mt.topk_avg(src, k=20, n=n, tight_bound=True)
  mt.topk_avg.clear_cache()
  for method in mt.AVG_METHODS:
    with pytest.MonkeyPatch.context() as mp:
      mp.setattr(mt, "avg_method", lambda platform=None, method=method: method)
      other = mt.topk_avg(src, k=20, n=n, tight_bound=True)
    mt.topk_avg.clear_cache()
    for field in ("ids", "scores", "gap_bound", "gap_bound_retrieved"):
      np.testing.assert_array_equal(np.asarray(getattr(other, field)),
                                    np.asarray(getattr(plain, field)))


def test_avg_top_n_rejects_an_unknown_method():
  with pytest.raises(errors.InputError, match="method"):
    mt.avg_top_n(jnp.ones((2, 20)), 3, method="sort")


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
