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


@pytest.mark.parametrize("groups, shapes", [
    (1, [(7, 64)]),
    (2, [(4, 32), (3, 64)]),                      # the 4 shortest rows: 17 tokens fit in 32
    (4, [(2, 16), (2, 32), (2, 64), (1, 64)]),
    (9, [(1, 16), (1, 16), (1, 16), (1, 32), (1, 32), (1, 64), (1, 64)]),  # B 7: 7 parts
])
def test_attention_groups_hold_every_real_token_once_at_its_own_position(groups, shapes):
  rng = np.random.default_rng(0)
  lengths = np.array([30, 3, 0, 17, 64, 9, 40])
  mask = (np.arange(64)[None] < lengths[:, None]).astype(np.int32)
  p = layers.packing(mask, groups=groups)
  total = p.rows.size
  assert [g.shape for g in p.groups] == shapes  # each part cut to its own width
  position = {}  # packed row -> (example, position), from the groups
  examples = iter(np.argsort(lengths, kind="stable"))  # the parts: the rows, shortest first
  for group in p.groups:
    for r in range(group.shape[0]):
      b = next(examples)
      for l, row in enumerate(group[r]):
        if row != total:
          position[int(row)] = (int(b), l)
  truth = {int(p.slots[b, l]): (b, l) for b, l in zip(*np.nonzero(mask))}
  assert position == truth  # each real token once, in its example's row, at its position
  layout = np.concatenate([g.reshape(-1) for g in p.groups])
  real = p.rows < mask.size
  np.testing.assert_array_equal(layout[p.group_rows[real]], np.flatnonzero(real))
  assert np.all(p.group_rows[~real] == layout.size)
  # The groups' gather and scatter are each other's transposes (no token lost or doubled).
  x = jnp.asarray(rng.standard_normal((total, 3)).astype(np.float32)) * real[:, None]
  lay = layers.Packing(jnp.asarray(p.group_rows), jnp.asarray(layout)[None])
  np.testing.assert_array_equal(layers.pack(layers.unpack(x, lay), lay), x)
  if groups == 1:
    with pytest.raises(InputError, match="groups"):
      layers.packing(mask, groups=0)


@pytest.mark.parametrize("kind, groups", [("bert", 4), ("mpnet", 2)])
def test_packed_forward_and_gradient_equal_the_padded_ones(tmp_path, kind, groups):
  encoder = hf_folder.load_folder(write_model(str(tmp_path / "m"), kind))
  tokens = encoder.tokenize(TEXTS, 24)
  width = 24
  ids = np.full((len(tokens), width), encoder.pad_id, np.int32)
  mask = np.zeros((len(tokens), width), np.int32)
  for r, t in enumerate(tokens):
    ids[r, :len(t)], mask[r, :len(t)] = t, 1
  packed = layers.packing(mask, groups=groups)
  assert packed.rows.size < mask.size  # the test packs something away
  assert len(packed.groups) == groups and packed.groups[0].shape[1] < width  # at smaller widths
  packed = jax.tree.map(jnp.asarray, packed)

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
