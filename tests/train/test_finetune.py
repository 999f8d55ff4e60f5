"""Encoder fine-tuning (`bilinear_ir.train.finetune`) on a tiny random BERT (2 layers, n 32).

The losses of a step against numpy twins over independently pooled vectors; one step on 8 host
devices against one device; a killed fit resumed against an uninterrupted one; the frozen side
of query_tower; bfloat16 compute with float32 master params; remat's gradients; the re-encoding
cache keyed by the weights.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from bilinear_ir.config import blocks
from bilinear_ir.data import embeddings
from bilinear_ir.data.batches import BatchSampler, TrainSet
from bilinear_ir.encoders import hf_folder
from bilinear_ir.encoders.base import pool
from bilinear_ir.errors import InputError
from bilinear_ir.train import finetune
from conftest import WORDS
from conftest import one_device
from conftest import write_model

Q, N, L = 8, 24, 16
# Query i's positive is doc i, but queries 0 and 1 share doc 0 (a duplicate positive); a batch
# of 8 holds every pair.
PAIRS = [(0, 0), (1, 0)] + [(i, i) for i in range(2, Q)]


def texts(count: int, seed: int, words: int | None = None) -> list[str]:
  """`count` random texts of WORDS, of 2-11 words each (or of `words` words each)."""
  rng = np.random.default_rng(seed)
  return [" ".join(rng.choice(WORDS, size=words or rng.integers(2, 12))) for _ in range(count)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  """(encoder, encoder block, query texts, doc texts, data of both modes)."""
  root = tmp_path_factory.mktemp("finetune")
  folder = write_model(str(root / "bert"), "bert", seed=7)
  encoder = hf_folder.load_folder(folder)
  enc_cfg = blocks.encoder_config()
  enc_cfg.model, enc_cfg.cache_dir = folder, str(root / "cache")
  enc_cfg.max_length, enc_cfg.batch_size, enc_cfg.pooling, enc_cfg.normalize = L, 8, "mean", True
  # Every batch holds the Q positives and hard negatives of the pool (rows Q..N): a pool of
  # texts of one length packs every batch to the same number of token rows, so each train step
  # compiles one shape (the positives keep their varied lengths).
  q_texts, d_texts = texts(Q, 1), texts(Q, 2) + texts(N - Q, 4, words=6)
  tokens = lambda t: embeddings.pad_tokens(encoder.tokenize(t, L), L, encoder.pad_id)
  pool_rows = np.random.default_rng(3).permutation(np.arange(Q, N))
  trainset = TrainSet(np.array(PAIRS), Q, N, hard_negatives=np.stack(
      [np.roll(pool_rows, i)[:6] for i in range(Q)]))
  doc_vectors = embeddings.encode(d_texts, enc_cfg)
  common = dict(queries=tokens(q_texts), trainset=trainset, pooling="mean", normalize=True)
  data = {"query_tower": finetune.FinetuneData(**common, doc_vectors=doc_vectors),
          "two_tower": finetune.FinetuneData(**common, docs=tokens(d_texts))}
  return encoder, enc_cfg, q_texts, d_texts, data


def ft_cfg(**overrides):
  """The tests' block: two_tower fits default to two towers (`shared=False`), the config of the
  eight-device step test, so the twins and the bfloat16 test reuse its compiled step."""
  c = blocks.finetune_config()
  c.update(dict(batch_size=8, hard_negatives=2, steps=6, eval_every=2, warmup_steps=0,
                lr=1e-3, checkpoint_every=2, corpus_chunk=5, shared=False))
  c.update(overrides)
  return c


@functools.lru_cache
def forward(module):
  return jax.jit(module.apply)


def vectors(encoder, params, ids, mask):
  """The test's own pooling of the encoder's hidden states: [B, n] float64, L2-normalised."""
  hidden = forward(encoder.module)({"params": params}, ids, mask)
  return np.asarray(pool(hidden, mask, "mean", normalize=True), np.float64)


def one_step(encoder, data, cfg, mesh=None, step=0):
  """(spec, state before (a copy), state after, metrics) of step `step`'s batch, on `mesh`
  (default `one_device()`)."""
  spec = finetune.make_spec(cfg, encoder, "mean", True)
  mesh = mesh or one_device()
  state = finetune.init_state(finetune.init_params(encoder, cfg), spec, mesh)
  before = jax.tree.map(np.array, state)
  sampler = BatchSampler(data.trainset, cfg.batch_size, 0 if cfg.loss == "corpus" else
                         cfg.hard_negatives, 0, cfg.loss != "corpus", seed=0)
  b = sampler.batch(step)
  batch = finetune.batch_arrays(spec, data, b)
  if cfg.loss == "corpus":  # placed as `fit` places it (one compiled step for both)
    batch["corpus"] = jax.device_put(np.asarray(data.doc_vectors, np.float32),
                                     jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
  after, metrics = finetune.make_train_step(spec, mesh)(state, batch)
  return spec, before, jax.tree.map(np.array, after), jax.tree.map(float, metrics), b


def log_softmax_ce(logits_rows):
  """mean over rows of logsumexp(row) - row[0] (the positive first): numpy, float64."""
  out = []
  for row in logits_rows:
    m = max(row)
    out.append(m + np.log(np.sum(np.exp(np.array(row) - m))) - row[0])
  return float(np.mean(out))


@pytest.mark.parametrize("mode", ["query_tower", "two_tower"])
def test_mnrl_loss_matches_numpy_twin(setup, mode):
  encoder, _, _, _, data = setup
  cfg = ft_cfg(mode=mode)
  _, _, _, metrics, b = one_step(encoder, data[mode], cfg)
  ids, mask = data[mode].queries
  q = vectors(encoder, encoder.params, ids[b.q_rows], mask[b.q_rows])
  if mode == "query_tower":
    d = data[mode].doc_vectors[b.cand_rows].astype(np.float64)
  else:
    d = vectors(encoder, encoder.params, *(x[b.cand_rows] for x in data[mode].docs))
  relevant = set(PAIRS)
  assert len(b.cand_rows) == 8 * 3
  rows, masked = [], 0
  for i, qr in enumerate(b.q_rows):
    keep = [c for c in range(len(b.cand_rows))
            if c != i and (int(qr), int(b.cand_rows[c])) not in relevant]
    masked += len(b.cand_rows) - 1 - len(keep)
    rows.append([q[i] @ d[i] / 0.05] + [q[i] @ d[c] / 0.05 for c in keep])
  assert masked >= 2  # queries 0 and 1: each other's positive (doc 0) is left out
  np.testing.assert_allclose(metrics["loss"], log_softmax_ce(rows), rtol=2e-5)


def test_corpus_loss_of_the_step_matches_numpy_twin(setup):
  encoder, _, _, _, data = setup
  qt = data["query_tower"]
  _, _, _, metrics, b = one_step(encoder, qt, ft_cfg(mode="query_tower", loss="corpus"))
  q = vectors(encoder, encoder.params, *(x[b.q_rows] for x in qt.queries))
  d = qt.doc_vectors.astype(np.float64)
  rows = []
  for i, qr in enumerate(b.q_rows):
    judged = {doc for query, doc in PAIRS if query == qr}
    rows.append([q[i] @ d[b.cand_rows[i]] / 0.05] +
                [q[i] @ d[j] / 0.05 for j in range(N) if j not in judged])
  np.testing.assert_allclose(metrics["loss"], log_softmax_ce(rows), rtol=2e-5)


def test_one_step_on_eight_devices_equals_one_device(setup):
  encoder, _, _, _, data = setup
  assert jax.device_count() == 8
  cfg = ft_cfg(mode="two_tower", shared=False)
  _, before, one, m1, _ = one_step(encoder, data["two_tower"], cfg)
  _, _, eight, m8, _ = one_step(encoder, data["two_tower"], cfg, finetune.data_mesh())
  # Same math, other summation orders (the batch's gradient is summed across devices): the loss
  # and the gradient norm agree to float32 rounding.
  np.testing.assert_allclose(m8["loss"], m1["loss"], rtol=1e-5)
  np.testing.assert_allclose(m8["grad_norm"], m1["grad_norm"], rtol=1e-4)
  # AdamW's first step moves each param by lr * g / (|g| + 1e-8), about lr * sign(g), which
  # magnifies the relative rounding of a small gradient. The attention key bias has a gradient
  # that is float32 noise around 0 (softmax ignores a constant shift of a row): it may move by
  # anything up to lr either way (2 lr apart; measured 2.5e-4). Every other param that moved by
  # ~lr (|g| >> 1e-8) agrees to 1e-2 lr (measured <= 1e-3 lr); an entry whose gradient is
  # within a few 1e-8 (it moved by < 0.9 lr) agrees to 5e-2 lr (measured 1.2e-2 lr: a doc-side
  # attention kernel entry with |g| ~ 3e-8).
  lr = cfg.lr
  for path, a in jax.tree_util.tree_leaves_with_path(one["params"]):
    b, start = eight["params"], before["params"]
    for k in path:
      b, start = b[k.key], start[k.key]
    diff, sign_like = np.abs(a - b), np.abs(start - a) >= 0.9 * lr
    if path[-2:] == (jax.tree_util.DictKey("qkv"), jax.tree_util.DictKey("bias")):
      assert diff[1].max() <= 2 * lr + 1e-7, path
      diff, sign_like = diff[[0, 2]], sign_like[[0, 2]]  # query and value biases
    assert diff[sign_like].max(initial=0) <= 1e-2 * lr, (path, diff.max())
    assert diff.max() <= 5e-2 * lr, (path, diff.max())
  moved = np.concatenate([np.abs(a - b).ravel() for a, b in zip(
      jax.tree.leaves(one["params"]), jax.tree.leaves(before["params"]))])
  assert np.mean(moved > 0.9 * lr) > 0.5  # the step did move the params


def dev_metric(encoder, data):
  """A dev metric of params: the mean in-batch accuracy proxy, q . d_pos - mean_j q . d_j."""
  def evaluate(params):
    q = vectors(encoder, finetune.side_params(params, "query", encoder), *data.queries)
    d = vectors(encoder, finetune.side_params(params, "doc", encoder), *data.docs)
    return float(np.mean(np.sum(q * d[:Q], -1)) - np.mean(q @ d.T))
  return evaluate


def test_killed_fit_resumes_to_the_same_numbers(setup, tmp_path):
  encoder, _, _, _, data = setup
  tt = data["two_tower"]
  cfg = ft_cfg(mode="two_tower", shared=True)
  whole = finetune.fit(encoder, tt, cfg, seed=5, evaluate=dev_metric(encoder, tt),
                       mesh=one_device())
  calls = []

  def dying(params):
    calls.append(1)
    if len(calls) == 3:  # the evaluation at step 4: the last checkpoint is step 2's
      raise KeyboardInterrupt
    return dev_metric(encoder, tt)(params)

  with pytest.raises(KeyboardInterrupt):
    finetune.fit(encoder, tt, cfg, seed=5, evaluate=dying, checkpoint_dir=str(tmp_path),
                 mesh=one_device())
  seen = []
  resumed = finetune.fit(encoder, tt, cfg, seed=5, checkpoint_dir=str(tmp_path),
                         evaluate=lambda p: seen.append(1) or dev_metric(encoder, tt)(p),
                         mesh=one_device())
  assert len(seen) == 2  # steps 4 and 6: steps 0 and 2 came from the checkpoint
  assert [h["step"] for h in whole.history] == [0, 2, 4, 6]
  np.testing.assert_equal(resumed.history, whole.history)  # NaN loss at step 0 included
  assert resumed.best_step == whole.best_step and resumed.steps == 6
  jax.tree.map(np.testing.assert_array_equal, resumed.params, whole.params)
  assert resumed.seconds > 0
  # Restored finished, it trains nothing more and reports the seconds of the runs that trained.
  again = finetune.fit(encoder, tt, cfg, seed=5, checkpoint_dir=str(tmp_path), mesh=one_device(),
                       evaluate=dev_metric(encoder, tt))
  assert again.seconds == resumed.seconds and again.steps == 6


def test_query_tower_leaves_the_doc_side_frozen(setup, monkeypatch):
  encoder, enc_cfg, q_texts, d_texts, data = setup
  qt = data["query_tower"]
  frozen_params = jax.tree.map(np.array, encoder.params)
  frozen_docs = qt.doc_vectors.copy()
  for loss in ("mnrl", "corpus"):
    result = finetune.fit(encoder, qt, ft_cfg(mode="query_tower", loss=loss), seed=1,
                          mesh=one_device())
    assert set(result.params) == {"query"}
    changed = jax.tree.map(lambda a, b: not np.array_equal(a, b), result.params["query"],
                           frozen_params)
    assert any(jax.tree.leaves(changed))
  jax.tree.map(np.testing.assert_array_equal, encoder.params, frozen_params)
  np.testing.assert_array_equal(qt.doc_vectors, frozen_docs)
  frozen_queries = embeddings.encode(q_texts, enc_cfg)
  runs = []
  real = embeddings.run_model
  monkeypatch.setattr(embeddings, "run_model", lambda *a, **k: runs.append(1) or real(*a, **k))
  docs = finetune.encode_side(d_texts, enc_cfg, encoder, result.params, "doc")
  np.testing.assert_array_equal(docs, frozen_docs)  # the frozen encoder's own cache entry
  assert not runs
  queries = finetune.encode_side(q_texts, enc_cfg, encoder, result.params, "query")
  assert len(runs) == 1 and not np.allclose(queries, frozen_queries)
  np.testing.assert_array_equal(
      finetune.encode_side(q_texts, enc_cfg, encoder, result.params, "query"), queries)
  assert len(runs) == 1  # the same weights: a cache hit
  other = {"query": jax.tree.map(lambda x: x + 1e-3, result.params["query"])}
  finetune.encode_side(q_texts, enc_cfg, encoder, other, "query")
  assert len(runs) == 2  # other weights: never the same entry


def test_two_tower_towers(setup):
  encoder, _, _, _, data = setup
  tt = data["two_tower"]
  # steps as the other tests' (the same compiled train steps)
  shared = finetune.fit(encoder, tt, ft_cfg(mode="two_tower", shared=True), seed=1,
                        mesh=one_device())
  apart = finetune.fit(encoder, tt, ft_cfg(mode="two_tower", shared=False), seed=1,
                       mesh=one_device())
  assert set(shared.params) == {"shared"} and set(apart.params) == {"query", "doc"}
  leaf = lambda p: np.asarray(p["layer_1"]["output"]["kernel"])
  base = leaf(encoder.params)
  assert not np.array_equal(leaf(apart.params["doc"]), base)
  assert not np.array_equal(leaf(apart.params["doc"]), leaf(apart.params["query"]))


def test_bfloat16_compute_keeps_float32_master_params(setup):
  encoder, _, _, _, data = setup
  _, before, f32, m32, _ = one_step(encoder, data["two_tower"], ft_cfg(mode="two_tower"))
  _, _, bf16, m16, _ = one_step(encoder, data["two_tower"],
                                ft_cfg(mode="two_tower", compute_dtype="bfloat16"))
  floats = [x for x in jax.tree.leaves((bf16["params"], bf16["opt_state"]))
            if np.issubdtype(x.dtype, np.floating)]
  assert floats and all(x.dtype == np.float32 for x in floats)
  # The forward really ran in bfloat16 (8 bits of mantissa: ~1e-2 relative), near float32's.
  assert m16["loss"] != m32["loss"]
  np.testing.assert_allclose(m16["loss"], m32["loss"], rtol=3e-2)
  moved = jax.tree.map(lambda a, b: float(np.abs(a - b).max()), bf16["params"], before["params"])
  assert max(jax.tree.leaves(moved)) > 0.5e-3


def test_remat_gives_the_same_gradients(setup):
  """On the query tower (one encoder's backward pass: half the graph of two towers'). Equal up
  to float32 reassociation (recomputing changes XLA's fusions): rtol 1e-4, and an absolute
  floor of 1e-5 of each leaf's largest magnitude for its near-zero entries (a fixed 1e-7 failed
  on one Xeon for one entry of 1,024: 1.8e-7 off at 5.5e-4)."""
  encoder, _, _, _, data = setup
  qt = data["query_tower"]
  grads = {}
  for remat in (False, True):
    spec = finetune.make_spec(ft_cfg(mode="query_tower", remat=remat), encoder, "mean", True)
    b = BatchSampler(qt.trainset, 8, 2, 0, True, seed=0).batch(0)
    batch = finetune.batch_arrays(spec, qt, b)
    params = finetune.init_params(encoder, ft_cfg(mode="query_tower"))
    fn = jax.jit(jax.grad(lambda p, b: finetune.loss(spec, p, b)))
    assert ("remat" in str(jax.make_jaxpr(fn)(params, batch))) == remat  # remat2: jax.checkpoint
    grads[remat] = fn(params, batch)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(
      a, b, rtol=1e-4, atol=1e-5 * float(np.abs(b).max())), grads[True], grads[False])


def test_bad_config_names_the_field(setup):
  encoder, _, _, _, data = setup
  finetune.check_config(blocks.finetune_config())  # the defaults are valid
  for name, value in (("temperature", 0.0), ("lr", -1.0), ("steps", 0), ("eval_every", 0),
                      ("compute_dtype", "float16"), ("mode", "both")):
    with pytest.raises(InputError, match=f"finetune.{name}"):
      finetune.check_config(ft_cfg(**{name: value}))
  with pytest.raises(InputError, match="finetune.loss"):
    finetune.fit(encoder, data["two_tower"], ft_cfg(mode="two_tower", loss="corpus"), seed=0)
  with pytest.raises(InputError, match="finetune.batch_size"):
    finetune.fit(encoder, data["two_tower"], ft_cfg(batch_size=12), seed=0)
  with pytest.raises(InputError, match="finetune.mode"):
    finetune.fit(encoder, data["two_tower"], ft_cfg(mode="query_tower"), seed=0)
