"""One-hot cross entropy, KL distillation and margin-MSE (LITE paper A.2) against numpy."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bilinear_ir.train import losses


def _scores(seed, b=4, c=6):
  rng = np.random.default_rng(seed)
  return (rng.normal(size=(b, c)).astype(np.float32) * 3,
          rng.normal(size=(b, c)).astype(np.float32) * 3)


def _log_softmax(x):
  x = x - x.max(axis=-1, keepdims=True)
  return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def test_one_hot_cross_entropy_is_softmax_cross_entropy_with_positive_first():
  student, _ = _scores(0)
  s = student.astype(np.float64)
  want = np.mean([-(s[i, 0] - np.log(np.exp(s[i]).sum())) for i in range(len(s))])
  got = losses.softmax_cross_entropy(jnp.asarray(student), jnp.zeros(len(s), jnp.int32))
  np.testing.assert_allclose(float(got), want, rtol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 2.5])
def test_kl_distillation_matches_numpy(temperature):
  student, teacher = _scores(1)
  pt = np.exp(_log_softmax(teacher.astype(np.float64) / temperature))
  ps = np.exp(_log_softmax(student.astype(np.float64) / temperature))
  want = np.mean(np.sum(pt * np.log(pt / ps), axis=-1))
  got = losses.kl_distillation_loss(jnp.asarray(student), jnp.asarray(teacher),
                                    temperature=temperature)
  np.testing.assert_allclose(float(got), want, rtol=1e-5)


def test_kl_triplet_form_and_zero_at_teacher():
  # Triplet (A.2): p = softmax over (d+, d-) of teacher and student, KL(p_t || p_s).
  t, s = np.array([[2.0, -1.0]]), np.array([[0.5, 0.0]])
  pt = np.exp(t) / np.exp(t).sum()
  ps = np.exp(s) / np.exp(s).sum()
  want = float(np.sum(pt * np.log(pt / ps)))
  np.testing.assert_allclose(float(losses.kl_distillation_loss(jnp.asarray(s), jnp.asarray(t))),
                             want, rtol=1e-5)
  np.testing.assert_allclose(float(losses.kl_distillation_loss(jnp.asarray(t), jnp.asarray(t))),
                             0.0, atol=1e-7)
  # Shift invariance: adding a constant per query to the student changes nothing.
  np.testing.assert_allclose(
      float(losses.kl_distillation_loss(jnp.asarray(t + 7.0), jnp.asarray(t))), 0.0, atol=1e-6)


def test_kl_mask_drops_candidates_from_both_distributions():
  student, teacher = _scores(2)
  mask = np.ones_like(student, bool)
  mask[0, 3:] = False
  mask[2, 1] = False
  want = []
  for i in range(len(student)):
    s, t = student[i][mask[i]].astype(np.float64), teacher[i][mask[i]].astype(np.float64)
    pt, ps = np.exp(_log_softmax(t)), np.exp(_log_softmax(s))
    want.append(np.sum(pt * np.log(pt / ps)))
  got = losses.kl_distillation_loss(jnp.asarray(student), jnp.asarray(teacher), jnp.asarray(mask))
  np.testing.assert_allclose(float(got), np.mean(want), rtol=1e-5)
  grads = jax.grad(lambda s: losses.kl_distillation_loss(s, jnp.asarray(teacher),
                                                         jnp.asarray(mask)))(jnp.asarray(student))
  assert np.all(np.isfinite(grads)) and np.all(np.asarray(grads)[~mask] == 0)


def test_margin_mse_triplet():
  # ((t+ - t-) - (s+ - s-))^2 = ((3 - 1) - (0.5 - 1.5))^2 = 9; second query: ((0 - 2) - (1 - 0))^2.
  student = jnp.array([[0.5, 1.5], [1.0, 0.0]])
  teacher = jnp.array([[3.0, 1.0], [0.0, 2.0]])
  got = losses.margin_mse_loss(student, teacher, jnp.zeros(2, jnp.int32))
  np.testing.assert_allclose(float(got), (9.0 + 9.0) / 2, rtol=1e-6)


def test_margin_mse_multi_negative_matches_numpy():
  student, teacher = _scores(3)
  positive = np.array([0, 2, 5, 1])
  mask = np.ones_like(student, bool)
  mask[1, 4] = False
  want = []
  for i, p in enumerate(positive):
    s, t = student[i].astype(np.float64), teacher[i].astype(np.float64)
    want.append(sum(((t[p] - t[j]) - (s[p] - s[j])) ** 2
                    for j in range(s.shape[0]) if j != p and mask[i, j]))
  got = losses.margin_mse_loss(jnp.asarray(student), jnp.asarray(teacher), jnp.asarray(positive),
                               jnp.asarray(mask))
  np.testing.assert_allclose(float(got), np.mean(want), rtol=1e-5)
  # Zero when the student equals the teacher up to a per-query shift.
  shifted = teacher + np.arange(4, dtype=np.float32)[:, None]
  np.testing.assert_allclose(float(losses.margin_mse_loss(
      jnp.asarray(shifted), jnp.asarray(teacher), jnp.asarray(positive))), 0.0, atol=1e-9)
