"""Random projections: blocked sparse application == dense A, second moments, sharding."""
from __future__ import annotations

import jax
import numpy as np
import pytest
import scipy.sparse as sp

from bilinear_ir.errors import InputError
from bilinear_ir.fidelity import projections


def _sparse(seed, n=20, v=300, density=0.08):
  return sp.random(n, v, density=density, format="csr", random_state=seed,
                   data_rvs=lambda m: np.random.default_rng(seed).normal(size=m))


def _zipf(seed, n=200, v=300, per_row=12):
  """[n, v] with Zipf-distributed columns (a few frequent ones, a long tail), like bag-of-words."""
  rng = np.random.default_rng(seed)
  cols = np.minimum((rng.pareto(1.0, n * per_row) * 3).astype(np.int64), v - 1)
  x = sp.csr_matrix((rng.normal(size=n * per_row), (np.repeat(np.arange(n), per_row), cols)),
                    shape=(n, v))
  x.sum_duplicates()
  return x


@pytest.mark.parametrize("kind", projections.KINDS)
def test_blocked_equals_dense_matrix(kind):
  x = _zipf(0)
  key = jax.random.key(7)
  a = projections.matrix(key, 300, 24, kind, block_size=64)  # [k, V], 5 blocks, last partial
  assert a.shape == (24, 300)
  assert not np.allclose(a[:, :64], a[:, 64:128])  # each block has its own draw
  head = projections.head_columns(x)  # >= ceil(200 / 64) = 4 nonzeros
  counts = np.bincount(x.indices, minlength=300)
  assert 0 < head.size < np.sum(counts > 0) and np.all(counts[head] >= 4)
  assert np.all(counts[np.setdiff1d(np.arange(300), head)] < 4)
  # Scatter only, head + tail (the default), dense only: the same x A^T.
  for cols in (np.array([], np.int64), head, np.flatnonzero(counts)):
    xb = projections.blocked(x, block_size=64, piece_size=16, head=cols)
    assert xb.head_x.shape == (200, cols.size) and xb.num_blocks == 5
    assert np.all(np.diff(xb.blocks) > 0)
    if cols.size == 0:
      assert len(xb.vals) > 5  # several pieces per block
    got = np.asarray(projections.project(key, xb, 24, kind, block_size=64))
    np.testing.assert_allclose(got, x @ a.T, rtol=1e-5, atol=1e-5)
  # Default pieces, unscaled output, and a vocabulary smaller than one block.
  np.testing.assert_allclose(projections.project(key, x, 24, kind, block_size=64, scale=False),
                             x @ a.T * np.sqrt(24), rtol=1e-5, atol=1e-4)
  one = projections.matrix(key, 300, 24, kind, block_size=512)
  np.testing.assert_allclose(projections.project(key, x, 24, kind, block_size=512), x @ one.T,
                             rtol=1e-5, atol=1e-5)


def test_other_key_implementations_draw_their_own_bits():
  x = _zipf(1)
  key = jax.random.key(7, impl="rbg")  # not Threefry: blocks come from jax.random.bits
  a = projections.matrix(key, 300, 40, "rademacher", block_size=64)
  np.testing.assert_allclose(np.abs(a) * np.sqrt(40), 1.0, rtol=1e-6)
  assert abs(np.mean(a > 0) - 0.5) < 0.02
  np.testing.assert_allclose(projections.project(key, x, 40, block_size=64), x @ a.T,
                             rtol=1e-5, atol=1e-5)
  assert not np.allclose(a, projections.matrix(jax.random.key(7), 300, 40, block_size=64))


def test_entries_have_the_stated_distribution():
  key = jax.random.key(1)
  r = projections.matrix(key, 2000, 64, "rademacher", block_size=512)
  assert set(np.unique(r * 8).tolist()) == {-1.0, 1.0}
  assert abs(np.mean(r > 0) - 0.5) < 4 * 0.5 / np.sqrt(r.size)
  signs = np.sign(r)
  assert abs(np.mean(signs[:-1] * signs[1:])) < 4 / np.sqrt(signs[1:].size)  # adjacent rows
  g = projections.matrix(key, 2000, 64, "gaussian", block_size=512)
  assert abs(g.var() * 64 - 1) < 4 * np.sqrt(2 / g.size)


def _moments_case():
  v = 40
  x, y = np.zeros(v), np.zeros(v)
  x[0], y[0] = 3.0, 2.5  # a heavy shared coordinate: sum x_i^2 y_i^2 separates the two kinds
  x[1:20] = np.linspace(-1, 1, 19)
  y[10:30] = np.linspace(0.5, -0.3, 20)
  return x, y


@pytest.mark.parametrize("kind", projections.KINDS)
def test_second_moments_match_closed_form(kind):
  x, y = _moments_case()
  xy, xx, yy = x @ y, x @ x, y @ y
  fourth = np.sum(x**2 * y**2)
  trials, k = 4000, 16
  keys = jax.random.split(jax.random.key(3), trials)
  out = np.asarray(projections.project_batch(keys, sp.csr_matrix(np.stack([x, y])), k, kind,
                                             block_size=32, scale=False), np.float64)
  for kk in (k, 8):  # the full projection and its 8-column prefix (nested dimensions)
    samples = np.sum(out[:, 0, :kk] * out[:, 1, :kk], axis=1) / kk  # <Ax, Ay>, [T]
    var = {"gaussian": (xx * yy + xy**2) / kk,
           "rademacher": (xx * yy + xy**2 - 2 * fourth) / kk}
    other = var["gaussian" if kind == "rademacher" else "rademacher"]
    assert abs(samples.mean() - xy) < 4 * np.sqrt(var[kind] / trials)
    assert abs(samples.var() / var[kind] - 1) < 0.12
    assert abs(other / var[kind] - 1) > 0.3  # the test tells the two kinds apart


def test_batch_equals_loop_and_keys_differ():
  x = _sparse(2)
  keys = jax.random.split(jax.random.key(4), 3)
  batch = np.asarray(projections.project_batch(keys, x, 40, "rademacher", block_size=128))
  for t in range(3):
    np.testing.assert_allclose(batch[t], projections.project(keys[t], x, 40, "rademacher",
                                                             block_size=128), rtol=1e-6)
  assert not np.allclose(batch[0], batch[1])


def test_sharded_equals_unsharded():
  devices = jax.devices()
  assert len(devices) == 8
  mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  x = _zipf(5, n=101, v=500)  # 101 rows over 8 devices: uneven shares; head and tail columns
  assert 0 < projections.head_columns(x).size < np.unique(x.indices).size
  key = jax.random.key(9)
  for kind in projections.KINDS:
    got = projections.project_sharded(key, x, 20, mesh, "data", kind, block_size=128)
    assert got.shape == (101, 20)
    np.testing.assert_allclose(got, projections.project(key, x, 20, kind, block_size=128),
                               rtol=1e-6, atol=1e-6)


def test_bad_kind_raises():
  with pytest.raises(InputError, match="projection.kind"):
    projections.project(jax.random.key(0), _sparse(0), 8, "binary")
