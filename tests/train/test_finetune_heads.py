"""Token heads trained jointly with the encoder (`finetune.head`, `train.finetune`) on a tiny
random BERT (2 layers, n 32): a ColBERT head's loss against a numpy twin; the "dot" head is the
pooled dual encoder's loss; one step of a token head on 8 host devices against one device; the
head refused outside two_tower.
"""
from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from bilinear_ir import scorers
from bilinear_ir.config import blocks
from bilinear_ir.data import embeddings
from bilinear_ir.data.batches import BatchSampler, TrainSet
from bilinear_ir.encoders import hf_folder
from bilinear_ir.encoders.base import pool
from bilinear_ir.errors import InputError
from bilinear_ir.train import finetune
from bilinear_ir.train import losses
from conftest import WORDS
from conftest import write_model

Q, N, LQ, LD, P = 8, 24, 8, 12, 8
PAIRS = [(0, 0), (1, 0)] + [(i, i) for i in range(2, Q)]  # queries 0 and 1 share doc 0


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  """(encoder, two_tower FinetuneData with queries of <= LQ and docs of <= LD tokens)."""
  encoder = hf_folder.load_folder(write_model(str(tmp_path_factory.mktemp("heads") / "bert"),
                                              "bert", seed=11))
  rng = np.random.default_rng(0)
  texts = lambda k, most: [" ".join(rng.choice(WORDS, size=rng.integers(1, most)))
                           for _ in range(k)]
  tokens = lambda t, length: embeddings.pad_tokens(encoder.tokenize(t, length), length,
                                                   encoder.pad_id)
  pool_rows = rng.permutation(np.arange(Q, N))
  trainset = TrainSet(np.array(PAIRS), Q, N, hard_negatives=np.stack(
      [np.roll(pool_rows, i)[:5] for i in range(Q)]))
  data = finetune.FinetuneData(queries=tokens(texts(Q, 6), LQ), trainset=trainset,
                               pooling="mean", normalize=True, docs=tokens(texts(N, 14), LD))
  return encoder, data


def ft_cfg(**overrides):
  c = blocks.finetune_config()
  c.update(dict(mode="two_tower", batch_size=8, hard_negatives=1, steps=4, warmup_steps=0,
                lr=1e-3, temperature=0.5))
  c.update(overrides)
  return c


def colbert_head(normalize=True):
  return scorers.build("colbert", dim=32, token_dim=P, normalize=normalize, query_len=LQ,
                       doc_len=LD)


def first_batch(spec, data, cfg):
  b = BatchSampler(data.trainset, cfg.batch_size, cfg.hard_negatives, 0, True, seed=0).batch(0)
  return b, finetune.batch_arrays(spec, data, b)


def np_tokens(encoder, params, ids, mask):
  """The twin's token states: [B, L, n] float64, zero at padding, each L2-normalised."""
  hidden = np.asarray(jax.jit(encoder.module.apply)({"params": params}, ids, mask), np.float64)
  hidden = hidden * mask[..., None]
  norms = np.linalg.norm(hidden, axis=-1, keepdims=True)
  return np.where(norms > 0, hidden / np.where(norms > 0, norms, 1.0), 0.0)


def test_colbert_head_loss_matches_numpy_twin(setup):
  encoder, data = setup
  cfg = ft_cfg(head="colbert_ft")
  # ColBERT's projection P' without its normalisation: the scores see the token states' own
  # L2 normalisation (a normalised projection would hide it).
  head = colbert_head(normalize=False)
  spec = finetune.make_spec(cfg, encoder, "mean", True, head)
  params = finetune.init_params(encoder, cfg, head, seed=3)
  assert set(params) == {"shared", "head"}
  proj = np.asarray(params["head"]["reduction"]["dim_map"], np.float64)  # [n, P']
  b, batch = first_batch(spec, data, cfg)
  got = float(jax.jit(lambda p, x: finetune.loss(spec, p, x))(params, batch))

  qt = np_tokens(encoder, encoder.params, batch["q_ids"], batch["q_mask"]) @ proj
  dt = np_tokens(encoder, encoder.params, batch["d_ids"], batch["d_mask"]) @ proj
  qm, dm = batch["q_mask"].astype(bool), batch["d_mask"].astype(bool)
  relevant, rows = set(PAIRS), []
  for i, qr in enumerate(b.q_rows):
    scores = []
    for c, dr in enumerate(b.cand_rows):
      if c != i and (int(qr), int(dr)) in relevant:
        continue  # a doc judged relevant to the query is not its negative
      s = qt[i][qm[i]] @ dt[c][dm[c]].T  # [real query tokens, real doc tokens]
      value = s.max(axis=1).sum() / 0.5
      scores.insert(0, value) if c == i else scores.append(value)
    rows.append(scores)
  want = np.mean([np.log(np.sum(np.exp(np.array(r) - max(r)))) + max(r) - r[0] for r in rows])
  assert len(b.cand_rows) == 16 and sum(len(r) for r in rows) < 8 * 16  # some masked
  np.testing.assert_allclose(got, want, rtol=1e-5)


def test_dot_head_is_the_pooled_dual_encoder_loss(setup):
  encoder, data = setup
  cfg = ft_cfg()
  assert cfg.head == "dot"
  spec = finetune.make_spec(cfg, encoder, "mean", True)
  params = finetune.init_params(encoder, cfg, None, seed=3)
  assert set(params) == {"shared"}
  _, batch = first_batch(spec, data, cfg)
  got = jax.jit(lambda p, x: finetune.loss(spec, p, x))(params, batch)
  # The mnrl loss of pooled vectors, written out: pool every side's hidden states, all pairs
  # q . d, the masked softmax cross-entropy with each query's own positive on the diagonal.
  forward = lambda ids, mask: pool(encoder.module.apply({"params": params["shared"]}, ids, mask)
                                   .astype(jnp.float32), mask, "mean", True)

  @jax.jit
  def written_out(x):
    q, d = forward(x["q_ids"], x["q_mask"]), forward(x["d_ids"], x["d_mask"])
    return losses.softmax_cross_entropy(q @ d.T, jnp.arange(q.shape[0]), x["mask"], 0.5)

  np.testing.assert_array_equal(np.asarray(got), np.asarray(written_out(batch)))


def test_token_head_step_on_eight_devices_equals_one_device(setup):
  encoder, data = setup
  assert jax.device_count() == 8
  cfg = ft_cfg(head="colbert_ft", head_lr=1e-2)
  head = colbert_head()
  spec = finetune.make_spec(cfg, encoder, "mean", True, head)
  _, batch = first_batch(spec, data, cfg)
  out = {}
  for name, devices in (("one", jax.devices()[:1]), ("eight", jax.devices())):
    mesh = jax.sharding.Mesh(np.array(devices), ("data",),
                             axis_types=(jax.sharding.AxisType.Auto,))
    state = finetune.init_state(finetune.init_params(encoder, cfg, head, seed=3), spec, mesh)
    before = jax.tree.map(np.array, state["params"])
    after, metrics = finetune.make_train_step(spec, mesh)(state, batch)
    out[name] = (jax.tree.map(np.array, after["params"]), jax.tree.map(float, metrics))
  (one, m1), (eight, m8) = out["one"], out["eight"]
  np.testing.assert_allclose(m8["loss"], m1["loss"], rtol=1e-5)
  np.testing.assert_allclose(m8["grad_norm"], m1["grad_norm"], rtol=1e-4)
  # AdamW's first step moves each param by about lr * sign(g) (the head at head_lr): the two
  # meshes agree to 1e-2 lr wherever g is not float32 noise around 0. The attention key bias's
  # gradient is such noise (softmax ignores a constant shift of a row, test_finetune.py): its
  # sign may flip, 2 lr apart at most.
  for part, lr in (("shared", cfg.lr), ("head", cfg.head_lr)):
    moved = []
    for path, a in jax.tree_util.tree_leaves_with_path(one[part]):
      b, start = eight[part], before[part]
      for k in path:
        b, start = b[k.key], start[k.key]
      diff = np.abs(a - b)
      assert diff.max() <= 2 * lr + 1e-7, path
      if path[-2:] == (jax.tree_util.DictKey("qkv"), jax.tree_util.DictKey("bias")):
        diff = diff[[0, 2]]  # query and value biases
      assert diff.max() <= 1e-2 * lr, (part, path, diff.max())
      moved.append(np.abs(a - start).ravel())
    assert np.mean(np.concatenate(moved) > 0.9 * lr) > 0.5, part  # moved, at its own lr


def test_fit_trains_the_head_and_refuses_it_outside_two_tower(setup):
  encoder, data = setup
  head = colbert_head()
  cfg = ft_cfg(head="colbert_ft", head_lr=1e-2)  # the step compiled above
  result = finetune.fit(encoder, data, cfg, seed=3, head=head, stop_after=1)
  start = finetune.init_params(encoder, cfg, head, seed=3)["head"]
  assert not np.allclose(result.params["head"]["reduction"]["dim_map"],
                         start["reduction"]["dim_map"])
  with pytest.raises(InputError, match="finetune.head"):
    finetune.check_config(ft_cfg(mode="query_tower", head="colbert_ft"))
  with pytest.raises(InputError, match="finetune.head"):
    finetune.make_spec(ft_cfg(head="colbert_ft"), encoder, "mean", True)  # no module given
  with pytest.raises(InputError, match="finetune.head"):
    finetune.make_spec(ft_cfg(), encoder, "mean", True, head)  # "dot" with a module
  with pytest.raises(InputError, match="finetune.head_lr"):
    finetune.check_config(ft_cfg(head_lr=-1.0))
