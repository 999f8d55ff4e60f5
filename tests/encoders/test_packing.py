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
  packed = layers.packing(mask, rows=9)
  rows, slots = packed.rows, packed.slots
  real = np.flatnonzero(mask.reshape(-1))
  np.testing.assert_array_equal(rows[:real.size], real)       # row-major order
  assert np.all(rows[real.size:] == mask.size)                 # the rest: the zero row
  np.testing.assert_array_equal(slots.reshape(-1)[real], np.arange(real.size))
  assert np.all(slots[mask == 0] == 9)
  x = jnp.arange(4 * 4 * 2, dtype=jnp.float32).reshape(4, 4, 2) + 1
  p = layers.Packing(jnp.asarray(rows), jnp.asarray(slots))  # a layout: rows and slots only
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


def test_attention_halves_hold_every_real_token_once_at_its_own_position():
  rng = np.random.default_rng(0)
  lengths = np.array([30, 3, 0, 17, 64, 9, 40])  # B 7: the short half is the 3 shortest rows
  mask = (np.arange(64)[None] < lengths[:, None]).astype(np.int32)
  p = layers.packing(mask)
  total = p.rows.size
  assert p.short.shape == (3, 16) and p.long.shape == (4, 64)  # 9 tokens fit in 16
  position = {}  # packed row -> (example, position), from the halves
  for half, examples in ((p.short, np.argsort(lengths, kind="stable")[:3]),
                         (p.long, np.argsort(lengths, kind="stable")[3:])):
    for r, b in enumerate(examples):
      for l, row in enumerate(half[r]):
        if row != total:
          position[int(row)] = (int(b), l)
  truth = {int(p.slots[b, l]): (b, l) for b, l in zip(*np.nonzero(mask))}
  assert position == truth  # each real token once, in its example's row, at its position
  layout = np.concatenate([p.short.reshape(-1), p.long.reshape(-1)])
  real = p.rows < mask.size
  np.testing.assert_array_equal(layout[p.half_rows[real]], np.flatnonzero(real))
  assert np.all(p.half_rows[~real] == layout.size)
  # The halves' gather and scatter are each other's transposes (no token lost or doubled).
  x = jnp.asarray(rng.standard_normal((total, 3)).astype(np.float32)) * real[:, None]
  lay = layers.Packing(jnp.asarray(p.half_rows), jnp.asarray(layout)[None])
  np.testing.assert_array_equal(layers.pack(layers.unpack(x, lay), lay), x)


@pytest.mark.parametrize("kind", ["bert", "mpnet"])
def test_packed_forward_and_gradient_equal_the_padded_ones(tmp_path, kind):
  encoder = hf_folder.load_folder(write_model(str(tmp_path / "m"), kind))
  tokens = encoder.tokenize(TEXTS, 24)
  width = 24
  ids = np.full((len(tokens), width), encoder.pad_id, np.int32)
  mask = np.zeros((len(tokens), width), np.int32)
  for r, t in enumerate(tokens):
    ids[r, :len(t)], mask[r, :len(t)] = t, 1
  packed = layers.packing(mask)
  assert packed.rows.size < mask.size  # the test packs something away
  assert packed.short.shape[1] < width  # and attends the short half at a smaller width
  packed = layers.Packing(*map(jnp.asarray, packed))

  def pooled(params, pack):
    hidden = encoder.module.apply({"params": params}, ids, mask, pack)
    return hidden, base.pool(hidden, mask, "mean", True)

  def loss(params, pack):
    v = pooled(params, pack)[1]
    return jnp.sum(jnp.tril(v @ v.T, -1) ** 2)

  pooled, grad = jax.jit(pooled), jax.jit(jax.grad(loss))  # one compile each, not op by op
  (h_pad, v_pad), (h_pack, v_pack) = pooled(encoder.params, None), pooled(encoder.params, packed)
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(h_pack)[real], np.asarray(h_pad)[real], atol=2e-6)
  assert np.all(np.asarray(h_pack)[~real] == 0)
  np.testing.assert_allclose(v_pack, v_pad, atol=2e-6)
  g_pad, g_pack = grad(encoder.params, None), grad(encoder.params, packed)
  for a, b in zip(jax.tree.leaves(g_pad), jax.tree.leaves(g_pack)):
    np.testing.assert_allclose(b, a, atol=1e-6 * max(1.0, float(np.abs(a).max())))
