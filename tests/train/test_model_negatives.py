"""Negatives from the model: the exact corpus softmax ("corpus") and mined hard negatives ("mined").

The corpus loss and its gradient are checked against a float64 numpy twin; the mined pool against a
brute-force twin (and never holds a judged doc); both options train through `train_and_evaluate`.
"""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bilinear_ir import scorers
from bilinear_ir.config import blocks
from bilinear_ir.data import pipeline
from bilinear_ir.data.batches import TrainSet
from bilinear_ir.errors import InputError
from bilinear_ir.experiment import spec as spec_lib
from bilinear_ir.experiment import training
from bilinear_ir.experiment import validation
from bilinear_ir.retrieval import ranking
from bilinear_ir.train import losses
from bilinear_ir.train import trainer

from conftest import perturbed_params, random_prepared, write_beir

N, DIM, T = 50, 8, 0.7


def _data(seed=0):
  """Docs [N + 2, DIM] (rows N, N + 1: positives outside the corpus, as ICT's cut spans), queries
  [6, DIM], a bilinear W, and a TrainSet whose queries share positives: doc 3 is relevant to
  queries 0 and 1 (the positive of both), query 2 has docs 5 and 7, query 5's positive is row N."""
  rng = np.random.default_rng(seed)
  docs = rng.normal(size=(N + 2, DIM))
  W = np.eye(DIM) + 0.3 * rng.normal(size=(DIM, DIM))
  pairs = np.array([[0, 3], [1, 3], [1, 9], [2, 5], [2, 7], [3, 11], [3, 3], [4, 20], [5, N]])
  excluded = np.array([[5, 40]])  # the doc query 5's span was cut from: never its negative
  # Each query near its judged docs, so that leaving them out of the negatives matters.
  qs = 0.5 * rng.normal(size=(6, DIM))
  for q, d in np.concatenate([pairs, excluded]):
    qs[q] += 0.5 * docs[d]
  ts = TrainSet(pairs, 6, N, None, excluded)
  q_rows = np.arange(6)
  pos_rows = np.array([3, 3, 5, 11, 20, N])  # one positive pair per query in the batch
  return docs, qs, W, ts, q_rows, pos_rows


def _twin(docs, qs, W, ts, pos_rows):
  """float64 loss and its gradients (d/dqs [6, DIM], d/dW [DIM, DIM]) of the corpus softmax:
  softmax over {positive} + every corpus doc judged neither relevant to nor excluded for the
  query. Scores s(q, d) = q^T W d."""
  B = len(qs)
  S = qs @ W @ docs[:N].T / T  # [B, N]
  pos = np.einsum("bi,ij,bj->b", qs, W, docs[pos_rows]) / T
  judged = np.zeros((B, N), bool)
  for q, d in ts.masked_pairs:
    if d < N:
      judged[q, d] = True
  logits = np.where(judged, -np.inf, S)
  full = np.concatenate([pos[:, None], logits], axis=1)  # [B, 1 + N]
  mx = full.max(axis=1, keepdims=True)
  lse = np.log(np.exp(full - mx).sum(axis=1)) + mx[:, 0]
  loss = np.mean(lse - pos)
  p = np.exp(full - lse[:, None])  # masked columns: 0
  g_pos = (p[:, 0] - 1.0) / (T * B)  # [B]
  g_s = p[:, 1:] / (T * B)  # [B, N]
  d_qs = g_s @ docs[:N] @ W.T + g_pos[:, None] * (docs[pos_rows] @ W.T)
  d_W = qs.T @ g_s @ docs[:N] + (qs * g_pos[:, None]).T @ docs[pos_rows]
  return loss, d_qs, d_W


@pytest.mark.parametrize("chunk", [1, 7, 50, 64])
def test_corpus_softmax_loss_and_gradient_equal_the_float64_twin(chunk):
  docs, qs, W, ts, q_rows, pos_rows = _data()
  want, want_dq, want_dw = _twin(docs, qs, W, ts, pos_rows)
  excluded = jnp.asarray(ts.relevant_rows(q_rows))
  corpus = jnp.asarray(docs[:N], jnp.float32)

  def loss(q, w):
    positive = jnp.sum(q * (jnp.asarray(docs[pos_rows], jnp.float32) @ w.T), axis=-1)
    return losses.corpus_softmax_cross_entropy(
        positive, lambda block: q @ (block @ w.T).T, corpus, excluded, T, chunk)

  with jax.default_matmul_precision("float32"):
    got, (dq, dw) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(
        jnp.asarray(qs, jnp.float32), jnp.asarray(W, jnp.float32))
  np.testing.assert_allclose(float(got), want, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(dq), want_dq, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(np.asarray(dw), want_dw, rtol=1e-4, atol=1e-6)
  # The mask matters here: unmasked, query 1's other positive (doc 9) would be a negative.
  unmasked = losses.corpus_softmax_cross_entropy(
      jnp.sum(jnp.asarray(qs, jnp.float32) * (jnp.asarray(docs[pos_rows] @ W.T, jnp.float32)),
              -1),
      lambda block: jnp.asarray(qs, jnp.float32) @ (block @ jnp.asarray(W, jnp.float32).T).T,
      corpus, jnp.full_like(excluded, -1), T, chunk)
  assert abs(float(unmasked) - want) > 1e-2


def test_corpus_softmax_gradient_never_holds_a_query_by_corpus_block():
  """Compiled (not run): the loss + gradient's scratch memory stays far below one [B, N] float32
  block (the chunk scores are recomputed in the backward pass, and the docs are not copied)."""
  B, n_docs, w, chunk = 64, 100_000, 16, 2048

  def loss(q, W, docs, excluded):
    positive = jnp.sum(q * (docs[:B] @ W.T), axis=-1)
    return losses.corpus_softmax_cross_entropy(positive, lambda block: q @ (block @ W.T).T, docs,
                                               excluded, T, chunk)

  shapes = [jax.ShapeDtypeStruct(s, d) for s, d in [((B, w), jnp.float32), ((w, w), jnp.float32),
                                                    ((n_docs, w), jnp.float32), ((B, 3), jnp.int32)]]
  compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(*shapes).compile()
  scratch = compiled.memory_analysis().temp_size_in_bytes
  assert scratch < B * n_docs * 4 / 8, scratch


def _corpus_step(batch_size: int) -> trainer.StepConfig:
  """The step of a corpus softmax over the first N doc rows, chunks of 16 (50 = 3 * 16 + 2)."""
  return trainer.StepConfig(loss="softmax", temperature=T, margin=1.0, batch_size=batch_size,
                            negatives=0, l2_to_init=0.0, lr=1e-3, warmup_steps=1, total_steps=2,
                            end_lr_fraction=0.1, weight_decay=0.0, clip_norm=1.0,
                            corpus_docs=N, corpus_chunk=16)


def test_trainer_corpus_loss_and_gradient_equal_the_twin():
  """The step's corpus loss and its gradient (bilinear scorer, relevant rows from the TrainSet,
  a positive outside the corpus) equal the float64 twin."""
  docs, qs, W, ts, q_rows, pos_rows = _data(1)
  module = scorers.build("bilinear", dim=DIM)
  params = {"W": jnp.asarray(W, jnp.float32)}
  hp = _corpus_step(6)
  args = (jnp.asarray(qs, jnp.float32), jnp.asarray(docs, jnp.float32), q_rows, pos_rows,
          None, None, jnp.asarray(ts.relevant_rows(q_rows)))
  step_loss = lambda p: trainer._loss(module, hp, None, p, p, *args)  # pylint: disable=protected-access
  with jax.default_matmul_precision("float32"):
    got, grad = jax.value_and_grad(step_loss)(params)
  want, _, want_dw = _twin(docs, qs, W, ts, pos_rows)
  np.testing.assert_allclose(float(got), want, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(grad["W"]), want_dw, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name,kw", [("dot", {}), ("wdp", {}), ("bilinear", {}),
                                     ("lowrank", {"rank": 3, "residual": "identity"}),
                                     ("lowrank", {"rank": 3, "residual": "none"}),
                                     ("adapter", {"hidden": 5})])
def test_every_table_scorer_trains_on_the_masked_softmax_over_the_corpus(name, kw):
  """The step's corpus loss of each table scorer equals its masked softmax over all N docs as
  candidates (`score_all`; every judged doc of the query out, its positive in)."""
  docs, qs, _, ts, q_rows, pos_rows = _data(2)
  inside = pos_rows < N
  module = scorers.build(name, dim=DIM, **kw)
  params = perturbed_params(module, 3)
  hp = _corpus_step(5)
  q, d = jnp.asarray(qs, jnp.float32), jnp.asarray(docs, jnp.float32)
  rows = q_rows[inside]
  with jax.default_matmul_precision("float32"):
    got = trainer._loss(module, hp, None, params, params, q, d, rows, pos_rows[inside], None,  # pylint: disable=protected-access
                        None, jnp.asarray(ts.relevant_rows(rows)))
    scores = module.apply({"params": params}, q[rows], d[:N], method=module.score_all)
  mask = ~ts.positive_mask(rows, np.arange(N))
  mask[np.arange(len(rows)), pos_rows[inside]] = True
  want = losses.softmax_cross_entropy(scores, jnp.asarray(pos_rows[inside]), jnp.asarray(mask), T)
  np.testing.assert_allclose(float(got), float(want), rtol=1e-5)


def _random_trainset(rng, num_queries=30, num_docs=60):
  pairs = np.stack([rng.integers(0, num_queries, 90), rng.integers(0, num_docs, 90)], axis=1)
  pairs = np.concatenate([np.stack([np.arange(num_queries)] * 2, 1) % num_docs, pairs])
  excluded = np.stack([rng.integers(0, num_queries, 10), rng.integers(0, num_docs, 10)], axis=1)
  return TrainSet(pairs, num_queries, num_docs, None, excluded)


@pytest.mark.parametrize("seed", range(4))
def test_mined_pool_is_the_models_top_depth_and_never_gold(seed):
  rng = np.random.default_rng(seed)
  ts = _random_trainset(rng)
  qs = rng.normal(size=(ts.num_queries, DIM)).astype(np.float32)
  docs = rng.normal(size=(ts.num_docs, DIM)).astype(np.float32)
  module = scorers.build("bilinear", dim=DIM)
  params = {"W": jnp.asarray(np.eye(DIM) + rng.normal(size=(DIM, DIM)), jnp.float32)}
  depth = int(rng.integers(3, 20))
  mine = lambda p, k: ranking.score_topk(module, p, qs, docs, k)[0]
  pool = trainer.mined_pool(mine, params, ts, depth)
  assert pool.shape == (ts.num_queries, depth)
  gold = {(int(q), int(d)) for q, d in ts.masked_pairs}
  assert not any((q, int(d)) in gold for q in range(ts.num_queries) for d in pool[q] if d >= 0)
  scores = qs.astype(np.float64) @ np.asarray(params["W"], np.float64) @ docs.T.astype(np.float64)
  for q in range(ts.num_queries):
    order = [int(d) for d in np.argsort(-scores[q], kind="stable") if (q, int(d)) not in gold]
    assert list(pool[q]) == order[:depth]


def test_mined_pool_is_refreshed_with_the_current_params_and_resumed(tmp_path):
  """fit mines at steps 0, r, 2r, ... with the params of that step; a run killed between two
  refreshes resumes with the pool it sampled from and ends where the uninterrupted run ends."""
  rng = np.random.default_rng(5)
  ts = _random_trainset(rng)
  qs = rng.normal(size=(ts.num_queries, DIM)).astype(np.float32)
  docs = rng.normal(size=(ts.num_docs, DIM)).astype(np.float32)
  module = scorers.build("bilinear", dim=DIM)
  params = scorers.init_params(module, jax.random.key(0))
  cfg = blocks.train_config()
  cfg.negatives_from, cfg.refresh_every, cfg.hard_depth, cfg.hard_negatives = "mined", 3, 5, 2
  cfg.steps, cfg.batch_size, cfg.lr, cfg.eval_every, cfg.checkpoint_every = 10, 16, 3e-2, 100, 2
  calls = []

  def mine(p, k):
    calls.append(np.asarray(p["W"]).copy())
    return ranking.score_topk(module, p, qs, docs, k)[0]

  whole = trainer.fit(module, params, qs, docs, ts, cfg, 0, progress=False, mine=mine)
  assert len(calls) == 4  # steps 0, 3, 6, 9
  np.testing.assert_array_equal(calls[0], np.asarray(params["W"]))
  assert all(np.abs(a - b).max() > 0 for a, b in zip(calls, calls[1:]))
  assert ts.hard_negatives is None  # the caller's TrainSet is left alone
  calls.clear()
  trainer.fit(module, params, qs, docs, ts, cfg, 0, progress=False, mine=mine,
              checkpoint_dir=str(tmp_path), stop_after=4)
  resumed = trainer.fit(module, params, qs, docs, ts, cfg, 0, progress=False, mine=mine,
                        checkpoint_dir=str(tmp_path))
  assert len(calls) == 4  # 0, 3 before the kill; 6, 9 after (none at the resumed step 4)
  np.testing.assert_allclose(np.asarray(resumed.last_params["W"]),
                             np.asarray(whole.last_params["W"]), rtol=1e-6, atol=1e-7)


@pytest.fixture(scope="module")
def beir_prepared(tmp_path_factory):
  c = blocks.table_recipe(ml_collections.ConfigDict())
  c.seed = 0
  c.data.format, c.data.dev_fraction = "beir", 0.0
  c.data.path = write_beir(str(tmp_path_factory.mktemp("beir")), num_docs=60, num_queries=40)
  return c, random_prepared(c.data, c.bm25, DIM)


@pytest.mark.parametrize("negatives_from", ["corpus", "mined"])
def test_train_and_evaluate_with_model_negatives_lowers_the_train_loss(beir_prepared,
                                                                       negatives_from):
  c, prepared = beir_prepared
  c = ml_collections.ConfigDict(c.to_dict())
  c.model.scorer = "bilinear"
  c.train.negatives_from = negatives_from
  c.train.steps, c.train.eval_every, c.train.batch_size, c.train.lr = 30, 1, 64, 5e-2
  c.train.hard_depth, c.train.refresh_every, c.train.corpus_chunk = 10, 10, 16
  c.eval.depth = 20
  validation.check_train(c.train)
  splitset = pipeline.splits(prepared.collection, c.data, c.seed)[0]
  out = training.train_and_evaluate(spec_lib.Row.of(c), prepared, splitset, progress=False)
  assert out["negatives_from"] == negatives_from
  loss = [h["loss"] for h in out["history"]]
  assert len(loss) == 30 and np.all(np.isfinite(loss))
  assert np.mean(loss[-5:]) < 0.8 * np.mean(loss[:5]), loss


def test_corpus_negatives_refuse_a_scorer_without_tables_and_other_losses():
  rng = np.random.default_rng(0)
  ts = _random_trainset(rng, 8, 20)
  qs = rng.normal(size=(8, DIM)).astype(np.float32)
  docs = rng.normal(size=(20, DIM)).astype(np.float32)
  cfg = blocks.train_config()
  cfg.negatives_from, cfg.steps = "corpus", 2
  module = scorers.build("mol", dim=DIM)
  with pytest.raises(InputError, match="train.negatives_from"):
    trainer.fit(module, scorers.init_params(module, jax.random.key(0)), qs, docs, ts, cfg, 0,
                progress=False)
  cfg.loss = "margin"
  with pytest.raises(InputError, match="train.loss"):
    validation.check_train(cfg)
  cfg.loss, cfg.corpus_chunk = "softmax", 0
  with pytest.raises(InputError, match="train.corpus_chunk"):
    validation.check_train(cfg)
  cfg.negatives_from, cfg.refresh_every = "mined", 0
  with pytest.raises(InputError, match="train.refresh_every"):
    validation.check_train(cfg)
  cfg.negatives_from = "nearest"
  with pytest.raises(InputError, match="train.negatives_from"):
    validation.check_train(cfg)
