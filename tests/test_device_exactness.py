"""The exactness claims, rerun on the default device against float64 numpy twins.

Runs on whatever `jax.devices()[0]` is: on CPU (the test suite) it runs like any test; on a GPU or
TPU (`launch/accelerator_check.sh`, which leaves the default backend alone) it is the accelerator
check of exactness. Inputs are random floats (not integers), so TF32 (GPU default, 2^-11) or
bf16-pass (TPU default, 2^-8) arithmetic shows: every returned score must lie within the float32
worst-case rounding bound of its float64 value, `gamma_w |q| |d|` (Higham, gamma_m = m u /
(1 - m u), u = 2^-24), and the returned ids must be the float64 top-k wherever the float64 gap at
the k-th place exceeds twice that bound (no near-tie that float32 rounding may flip).
"""
import jax
import jax.numpy as jnp
import numpy as np

from bilinear_ir import lowrank, scorers
from bilinear_ir.retrieval import certified, exact, mol_topk, sharded

U32 = 2.0 ** -24
DEVICE = jax.devices()[0]


def gamma(m: int) -> float:
  return m * U32 / (1.0 - m * U32)


def twin64(q, d, k):
  """float64 scores [B, N], top-k ids by (score desc, id asc) [B, k], and the k-th gaps [B]."""
  s = np.asarray(q, np.float64) @ np.asarray(d, np.float64).T
  order = np.lexsort((np.broadcast_to(np.arange(s.shape[1]), s.shape), -s), axis=1)
  top = order[:, :k]
  vals = np.take_along_axis(s, order[:, :k + 1], axis=1)
  return s, top, vals[:, k - 1] - vals[:, k]


def check_against_twin(res, q, d, k, width=None):
  """res.ids are the float64 top-k (where not near-tied) and res.scores are float32-accurate."""
  q64, d64 = np.asarray(q, np.float64), np.asarray(d, np.float64)
  s, top, gap = twin64(q64, d64, k)
  ids, scores = np.asarray(res.ids), np.asarray(res.scores, np.float64)
  w = q64.shape[1] if width is None else width
  scale = np.linalg.norm(q64, axis=1)[:, None] * np.linalg.norm(d64, axis=1)[None, :]
  bound = gamma(w) * scale                                   # [B, N]
  got = np.take_along_axis(s, ids, axis=1)
  err = np.abs(scores - got)
  assert np.all(err <= np.take_along_axis(bound, ids, axis=1)), (
      f"scores off their float64 values by up to {err.max():.3g} (float32 bound "
      f"{np.take_along_axis(bound, ids, axis=1).max():.3g}): not float32 arithmetic on {DEVICE}")
  clear = gap > 2 * bound.max(axis=1)
  assert clear.mean() > 0.9  # the data leave almost no near-ties
  np.testing.assert_array_equal(np.sort(ids[clear], axis=1), np.sort(top[clear], axis=1))


def _data(seed, b=16, n=6000, w=96):
  rng = np.random.default_rng(seed)
  q = rng.normal(size=(b, w)).astype(np.float32)
  d = (rng.normal(size=(n, w)) * rng.uniform(0.5, 2.0, size=(n, 1))).astype(np.float32)
  return q, d


def test_default_device_is_reported():
  assert jax.devices()[0] == DEVICE
  print(f"device: {DEVICE.platform} {DEVICE.device_kind} ({jax.device_count()} devices)")


def test_exact_topk_and_stream_on_device():
  q, d = _data(0)
  res = exact.topk(jax.device_put(q, DEVICE), jax.device_put(d, DEVICE), 10)
  check_against_twin(res, q, d, 10)
  stream = exact.topk_stream(q, [d[:2500], d[2500:]], 10)
  np.testing.assert_array_equal(np.asarray(stream.ids), np.asarray(res.ids))
  np.testing.assert_array_equal(np.asarray(exact.brute_force(q, d, 10).ids), np.asarray(res.ids))


def test_sharded_topk_over_the_default_backend_devices():
  q, d = _data(1)
  mesh = sharded.doc_mesh(devices=jax.devices())
  res = sharded.sharded_topk(q, d, 10, mesh=mesh)
  check_against_twin(res, q, d, 10)
  np.testing.assert_array_equal(np.asarray(res.ids), np.asarray(exact.topk(q, d, 10).ids))


def test_bf16_candidates_give_the_float32_top_k_on_device():
  q, d = _data(2)
  res = certified.bf16_topk(q, d, 10)
  check_against_twin(res, q, d, 10)
  np.testing.assert_array_equal(np.asarray(res.ids), np.asarray(exact.topk(q, d, 10).ids))


def test_certified_low_rank_on_device():
  rng = np.random.default_rng(3)
  n = 48
  u, _ = np.linalg.qr(rng.normal(size=(n, n)))
  v, _ = np.linalg.qr(rng.normal(size=(n, n)))
  W = ((u * 0.6 ** np.arange(n)) @ v.T).astype(np.float32)
  q, d = _data(4, n=4000, w=n)
  index = certified.build_certified(W, d, 8)
  res = certified.certified_topk(index, q, 10)
  qw = np.asarray(q, np.float64) @ np.asarray(W, np.float64)  # s = (q W) . d
  # The float32 score (q W) . d: the q W product and the dot product each round (2n terms).
  check_against_twin(res, qw, d, 10, width=2 * n)


def test_mol_exact_two_pass_equals_brute_force_on_device():
  p, d_p, items = 4, 32, 3000
  module = scorers.build("mol", dim=d_p, p_q=p, p_x=p, d_p=d_p, gate_hidden=32,
                         temperature=0.05)
  params = scorers.init_params(module, jax.random.key(0))
  rng = np.random.default_rng(5)
  unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
  qc = unit(rng.normal(size=(8, p, d_p))).astype(np.float32)
  ic = unit(rng.normal(size=(items, p, d_p))).astype(np.float32)
  src = mol_topk.MolSource(jnp.asarray(qc), mol_topk.index_from_components(jnp.asarray(ic), p),
                           params, module)
  bf = mol_topk.brute_force(src, k=10, chunk=512)
  ex = mol_topk.exact_two_pass(src, k=10, max_range=2048, chunk=512)
  np.testing.assert_array_equal(np.asarray(ex.ids), np.asarray(bf.ids))
  np.testing.assert_allclose(np.asarray(ex.scores), np.asarray(bf.scores), rtol=1e-6, atol=1e-6)
  # The component logits of the returned items are float32-accurate (float64 twin): the
  # per-component scan (`component_topk`, run at float32 inside exact_two_pass) must return
  # them; check its values directly, traced at float32 as exact_two_pass traces it.
  with jax.default_matmul_precision(mol_topk.FLOAT32):
    vals, ids = jax.jit(lambda s: s.component_topk(10))(src)
  ids = np.asarray(ids)
  ref = np.einsum("bad,nxd->bnax", qc.astype(np.float64), ic.astype(np.float64))
  ref = ref.reshape(8, items, p * p) / 0.05
  want = np.take_along_axis(np.swapaxes(ref, 1, 2), ids, axis=2)
  tol = gamma(d_p) / 0.05 + 1e-6  # unit components: |f| |g| = 1
  assert np.max(np.abs(np.asarray(vals, np.float64) - want)) <= tol


def test_lowrank_pointwise_error_on_device():
  rng = np.random.default_rng(6)
  n, r = 64, 8
  W = rng.normal(size=(n, n)).astype(np.float32)
  q = rng.normal(size=(32, n)).astype(np.float32)
  d = rng.normal(size=(32, n)).astype(np.float32)
  W_r = lowrank.truncated(jnp.asarray(W), r)
  err = np.asarray(lowrank.pointwise_error(jnp.asarray(W), W_r, jnp.asarray(q), jnp.asarray(d)))
  D = np.asarray(W, np.float64) - np.asarray(W_r, np.float64)
  ref = np.abs(np.einsum("bi,ij,bj->b", q.astype(np.float64), D, d.astype(np.float64)))
  scale = (np.linalg.norm(q, axis=1) * np.linalg.norm(d, axis=1)
           * np.linalg.norm(np.abs(D), 2))  # || |W - W_r| ||_2 bounds the term magnitudes
  assert np.all(np.abs(err - ref) <= gamma(2 * n + 1) * scale + 1e-6)
  # Theorem 3 (float64 numpy) on the device's factors.
  S = np.asarray(lowrank.spectrum(jnp.asarray(W)))
  P, Q = lowrank.truncate(jnp.asarray(W), r)
  out = lowrank.check_theorem3(W, S, {"P": np.asarray(P), "Q": np.asarray(Q)}, r, q, d,
                               np.zeros(32, bool), tolerance=1e-4)
  assert out["violations"] == 0
