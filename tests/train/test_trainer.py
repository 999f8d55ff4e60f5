"""Trainer: learns a planted similarity, sharded == single device, resume, guards, batches."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bilinear_ir import scorers
from bilinear_ir.config import blocks
from bilinear_ir.data.batches import BatchSampler, TrainSet, hard_negative_pool
from bilinear_ir.errors import InputError
from bilinear_ir.train import trainer


def _planted(seed=0, n=16, N=300, Q=560):
  """Queries whose relevant doc is the argmax of a planted bilinear W, not of the dot product."""
  rng = np.random.default_rng(seed)
  W = np.eye(n) + rng.normal(size=(n, n))
  docs = rng.normal(size=(N, n)).astype(np.float32)
  qs = rng.normal(size=(Q, n)).astype(np.float32)
  best = np.argmax(qs @ W @ docs.T, axis=1)
  return qs, docs, best


def _accuracy(module, params, qs, docs, best):
  s = np.asarray(module.apply({"params": params}, qs, docs, method=module.score_all))
  return float(np.mean(np.argmax(s, 1) == best))


def _cfg(**kw):
  cfg = blocks.train_config()
  cfg.steps, cfg.batch_size, cfg.lr, cfg.temperature = 400, 64, 3e-2, 1.0
  cfg.hard_negatives, cfg.random_negatives, cfg.eval_every = 0, 2, 100
  cfg.select_metric = "acc"
  for k, v in kw.items():
    cfg[k] = v
  return cfg


@pytest.mark.parametrize("name,kw,loss,steps", [
    ("bilinear", {}, "softmax", 400),
    ("lowrank", {"rank": 16, "residual": "identity"}, "softmax", 1500),
    ("bilinear", {}, "margin", 1500)])
def test_learns_a_planted_bilinear_similarity(name, kw, loss, steps):
  qs, docs, best = _planted()
  train, dev = slice(0, 480), slice(480, 560)
  module = scorers.build(name, dim=16, **kw)
  params = scorers.init_params(module, jax.random.key(0))
  base = _accuracy(module, params, qs[dev], docs, best[dev])
  ts = TrainSet(np.stack([np.arange(480), best[train]], 1), 480, len(docs))
  res = trainer.fit(module, params, qs[train], docs, ts, _cfg(loss=loss, steps=steps), seed=0,
                    evaluate=lambda p: {"acc": _accuracy(module, p, qs[dev], docs, best[dev])},
                    progress=False)
  got = _accuracy(module, res.params, qs[dev], docs, best[dev])
  assert base <= 0.2 and got >= base + 0.5, (base, got)
  # The selected params are those of the best dev evaluation in the history.
  best_entry = max(res.history, key=lambda h: h["acc"])
  assert got == pytest.approx(best_entry["acc"]) and res.best_step == best_entry["step"]


def test_selection_keeps_the_dot_product_when_training_cannot_help():
  """With a dev metric that training only hurts, the step-0 (dot product) params win."""
  qs, docs, best = _planted(1)
  module = scorers.build("wdp", dim=16)
  params = scorers.init_params(module, jax.random.key(0))
  ts = TrainSet(np.stack([np.arange(100), best[:100]], 1), 100, len(docs))
  res = trainer.fit(module, params, qs[:100], docs, ts, _cfg(steps=50, eval_every=25), seed=0,
                    evaluate=lambda p: {"acc": -float(jnp.sum((p["v"] - 1.0) ** 2))},
                    progress=False)
  assert res.best_step == 0
  np.testing.assert_array_equal(np.asarray(res.params["v"]), np.ones(16))
  assert np.any(np.asarray(res.last_params["v"]) != 1.0)


def test_resume_from_checkpoint_equals_uninterrupted(tmp_path):
  qs, docs, best = _planted(2)
  module = scorers.build("lowrank", dim=16, rank=4, residual="diag")
  params = scorers.init_params(module, jax.random.key(0))
  ts = TrainSet(np.stack([np.arange(len(qs)), best], 1), len(qs), len(docs))
  ev = lambda p: {"acc": _accuracy(module, p, qs[:40], docs, best[:40])}
  full = trainer.fit(module, params, qs, docs, ts, _cfg(steps=60, eval_every=20), seed=3,
                     evaluate=ev, progress=False)
  ckpt = str(tmp_path / "ckpt")
  resume = lambda **kw: trainer.fit(
      module, params, qs, docs, ts, _cfg(steps=60, eval_every=20, checkpoint_every=20), seed=3,
      evaluate=ev, checkpoint_dir=ckpt, progress=False, **kw)
  killed = resume(stop_after=40)
  resumed = resume()
  for a, b in zip(jax.tree.leaves(full.last_params), jax.tree.leaves(resumed.last_params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
  assert [h["step"] for h in resumed.history] == [h["step"] for h in full.history]
  assert resumed.best_step == full.best_step
  # Training seconds add up over the processes; a run restored finished trains nothing more
  # (before, a resumed row reported the seconds of its restore and evaluation).
  assert 0 < killed.seconds < resumed.seconds
  assert resume().seconds == resumed.seconds


@pytest.mark.parametrize("negatives_from", ["bm25", "corpus"])
def test_steps_per_call_changes_nothing_but_the_number_of_calls(negatives_from):
  """Scans of 1, 7 or 64 steps per call: the same batches, updates, evaluations and result
  (also for the corpus softmax, whose relevant rows are stacked per call)."""
  qs, docs, best = _planted(4)
  module = scorers.build("bilinear", dim=16)
  params = scorers.init_params(module, jax.random.key(0))
  ts = TrainSet(np.stack([np.arange(len(qs)), best], 1), len(qs), len(docs))
  ev = lambda p: {"acc": _accuracy(module, p, qs[:40], docs, best[:40])}
  runs = [trainer.fit(module, params, qs, docs, ts,
                      _cfg(steps=45, eval_every=20, steps_per_call=per_call,
                           negatives_from=negatives_from, corpus_chunk=128), seed=1,
                      evaluate=ev, progress=False) for per_call in (1, 7, 64)]
  assert [h["step"] for h in runs[0].history] == [0, 20, 40, 45]
  for res in runs[1:]:
    for key in ("step", "loss", "acc"):  # the step-0 loss is NaN (no step yet)
      np.testing.assert_array_equal([h[key] for h in res.history],
                                    [h[key] for h in runs[0].history])
    assert res.best_step == runs[0].best_step
    for a, b in zip(jax.tree.leaves(res.last_params), jax.tree.leaves(runs[0].last_params)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  with pytest.raises(InputError, match="steps_per_call"):
    trainer.fit(module, params, qs, docs, ts, _cfg(steps=5, steps_per_call=0), seed=1,
                progress=False)


def test_non_finite_gradients_skip_the_update():
  qs, docs, best = _planted(3)
  qs = qs.copy()
  qs[5] = np.nan  # every batch holding query 5 has a NaN loss
  module = scorers.build("wdp", dim=16)
  params = scorers.init_params(module, jax.random.key(0))
  ts = TrainSet(np.stack([np.arange(len(qs)), best], 1), len(qs), len(docs))
  cfg = _cfg(steps=20)
  res = trainer.fit(module, params, qs, docs, ts, cfg, seed=0, progress=False)
  assert np.all(np.isfinite(np.asarray(res.last_params["v"])))
  assert np.any(np.asarray(res.last_params["v"]) != 1.0)
  # the result counts the skipped steps: those whose batch holds query 5
  sampler = BatchSampler(ts, cfg.batch_size, cfg.hard_negatives, cfg.random_negatives,
                         cfg.in_batch, 0)
  held = sum(5 in sampler.batch(s).q_rows for s in range(cfg.steps))
  assert 0 < held < cfg.steps and res.skipped_steps == held


def _pool_loop(pairs, ranked, depth):
  """The per-query loop `hard_negative_pool` replaced: its brute-force twin."""
  positives = {}
  for q, d in pairs:
    positives.setdefault(int(q), set()).add(int(d))
  out = np.full((ranked.shape[0], depth), -1, np.int64)
  for q in range(ranked.shape[0]):
    keep = [int(d) for d in ranked[q] if d >= 0 and int(d) not in positives.get(q, ())][:depth]
    out[q, :len(keep)] = keep
  return out


@pytest.mark.parametrize("seed", range(4))
def test_hard_negative_pool_equals_the_loop(seed):
  rng = np.random.default_rng(seed)
  for _ in range(50):
    n_q, n_docs, k = rng.integers(1, 20), rng.integers(2, 60), rng.integers(1, 40)
    ranked = np.stack([rng.permutation(max(n_docs, k))[:k] for _ in range(n_q)])
    ranked[rng.random(n_q) < 0.2] = -1  # rows without a ranking (ICT's judged-query rows)
    ranked[:, k - 1][rng.random(n_q) < 0.3] = -1  # a shorter ranking
    first = ranked[ranked >= 0]
    n_p = int(rng.integers(1, 40))
    docs = rng.choice(first, n_p) if len(first) and seed % 2 else rng.integers(0, n_docs, n_p)
    pairs = np.stack([rng.integers(0, n_q + 2, n_p), docs], 1)
    depth = int(rng.integers(1, 45))
    np.testing.assert_array_equal(hard_negative_pool(pairs, ranked, depth),
                                  _pool_loop(pairs, ranked, depth))


def test_batches_are_deterministic_and_masks_false_negatives():
  pairs = np.array([[0, 1], [0, 2], [1, 2], [2, 3], [3, 4], [4, 0], [5, 5], [6, 6]])
  ranked = np.array([[1, 2, 7, 8], [2, 7, 8, 9], [3, 9, 1, 0], [4, 5, 6, 7], [0, 1, 2, 3],
                     [5, 6, 7, 8], [6, 7, 8, 9]])
  pool = hard_negative_pool(pairs, ranked, depth=2)
  np.testing.assert_array_equal(pool[0], [7, 8])  # positives 1, 2 removed
  np.testing.assert_array_equal(pool[1], [7, 8])
  ts = TrainSet(pairs, 7, 10, pool)
  s1 = BatchSampler(ts, 4, hard=1, random=1, in_batch=True, seed=5)
  s2 = BatchSampler(ts, 4, hard=1, random=1, in_batch=True, seed=5)
  for step in range(5):
    a, b = s1.batch(step), s2.batch(step)
    np.testing.assert_array_equal(a.cand_rows, b.cand_rows)
    np.testing.assert_array_equal(a.mask, b.mask)
    assert a.mask[np.arange(4), np.arange(4)].all()
    for i in range(4):
      for c in range(len(a.cand_rows)):
        relevant = any((a.q_rows[i], a.cand_rows[c]) == tuple(p) for p in pairs)
        if c != i and relevant:
          assert not a.mask[i, c]
  # Every pair is seen exactly once per epoch (drop-last: 2 steps of 4 = all 8 pairs).
  seen = np.concatenate([s1.batch(s).q_rows for s in (0, 1)])
  assert sorted(seen.tolist()) == sorted(pairs[:, 0].tolist())
  no_inbatch = BatchSampler(ts, 4, hard=1, random=1, in_batch=False, seed=5).batch(0)
  assert no_inbatch.mask.sum(1).max() <= 3  # own positive + own 2 negatives


def test_positive_mask_equals_brute_force():
  rng = np.random.default_rng(0)
  pairs = np.stack([rng.integers(0, 30, 200), rng.integers(0, 50, 200)], 1)
  ts = TrainSet(pairs, 30, 50)
  relevant = {tuple(p) for p in pairs.tolist()}
  for _ in range(20):
    q_rows = rng.integers(0, 30, 8)
    cands = rng.integers(0, 50, 24)  # with repeats
    want = np.array([[(q, c) in relevant for c in cands.tolist()] for q in q_rows.tolist()])
    np.testing.assert_array_equal(ts.positive_mask(q_rows, cands), want)


def test_bad_training_config_is_an_input_error():
  qs, docs, best = _planted(4)
  module = scorers.build("wdp", dim=16)
  params = scorers.init_params(module, jax.random.key(0))
  ts = TrainSet(np.stack([np.arange(len(qs)), best], 1), len(qs), len(docs))
  with pytest.raises(InputError, match="train.loss"):
    trainer.fit(module, params, qs, docs, ts, _cfg(loss="hinge2"), seed=0, progress=False)
  with pytest.raises(InputError, match="hard negatives"):
    trainer.fit(module, params, qs, docs, ts, _cfg(hard_negatives=2), seed=0, progress=False)
