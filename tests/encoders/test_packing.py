"""Padding-free layers (`encoders.layers.Packing`): the Transformer layers run on a batch's real
tokens only; outputs and gradients must equal the padded forward pass's on every real token."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bilinear_ir.encoders import base
from bilinear_ir.encoders import hf_folder
from bilinear_ir.encoders import layers
from bilinear_ir.errors import InputError
from conftest import write_model

TEXTS = ["The cell study", "Increased risk of cancer in patients with a gene expression level",
         "mice", "Blood virus infection; a drug dose trial (phase 2) was reduced!", ""]


def test_packing_arrays_place_every_real_token_once():
  mask = np.array([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0]])
  rows, slots = layers.packing(mask, rows=9)
  real = np.flatnonzero(mask.reshape(-1))
  np.testing.assert_array_equal(rows[:real.size], real)       # row-major order
  assert np.all(rows[real.size:] == mask.size)                 # the rest: the zero row
  np.testing.assert_array_equal(slots.reshape(-1)[real], np.arange(real.size))
  assert np.all(slots[mask == 0] == 9)
  x = jnp.arange(4 * 4 * 2, dtype=jnp.float32).reshape(4, 4, 2) + 1
  p = layers.Packing(jnp.asarray(rows), jnp.asarray(slots))
  back = layers.unpack(layers.pack(x, p), p)
  np.testing.assert_array_equal(back, x * mask[..., None])    # zeros on padding
  with pytest.raises(InputError, match="rows"):
    layers.packing(mask, rows=real.size - 1)
  # Geometric buckets: few shapes, never below the count, at most 1/8 (or 16 rows) above it.
  for real_count in (0, 1, 15, 17, 255, 1000, 14_600, 70_001):
    total = layers.packed_rows(real_count, multiple=8)
    assert total >= real_count and total % 8 == 0
    assert total - real_count <= max(16, real_count / 8)
  assert len({layers.packed_rows(n) for n in range(14_000, 15_500)}) <= 3


@pytest.mark.parametrize("kind", ["bert", "mpnet"])
def test_packed_forward_and_gradient_equal_the_padded_ones(tmp_path, kind):
  encoder = hf_folder.load_folder(write_model(str(tmp_path / "m"), kind))
  tokens = encoder.tokenize(TEXTS, 24)
  width = 24
  ids = np.full((len(tokens), width), encoder.pad_id, np.int32)
  mask = np.zeros((len(tokens), width), np.int32)
  for r, t in enumerate(tokens):
    ids[r, :len(t)], mask[r, :len(t)] = t, 1
  rows, slots = layers.packing(mask)
  assert rows.size < mask.size  # the test packs something away
  packed = layers.Packing(jnp.asarray(rows), jnp.asarray(slots))

  def pooled(params, pack):
    hidden = encoder.module.apply({"params": params}, ids, mask, pack)
    return hidden, base.pool(hidden, mask, "mean", True)

  def loss(params, pack):
    v = pooled(params, pack)[1]
    return jnp.sum(jnp.tril(v @ v.T, -1) ** 2)

  (h_pad, v_pad), (h_pack, v_pack) = pooled(encoder.params, None), pooled(encoder.params, packed)
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(h_pack)[real], np.asarray(h_pad)[real], atol=2e-6)
  assert np.all(np.asarray(h_pack)[~real] == 0)
  np.testing.assert_allclose(v_pack, v_pad, atol=2e-6)
  g_pad = jax.grad(loss)(encoder.params, None)
  g_pack = jax.grad(loss)(encoder.params, packed)
  for a, b in zip(jax.tree.leaves(g_pad), jax.tree.leaves(g_pack)):
    np.testing.assert_allclose(b, a, atol=1e-6 * max(1.0, float(np.abs(a).max())))
