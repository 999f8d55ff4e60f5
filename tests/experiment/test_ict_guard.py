"""The label-free ICT guard (`experiment.training.bm25_guard`): the blend of an ICT-trained
scorer with the dot product, its weight picked by agreement with BM25 on the collection's own
query texts, never by judgements."""
import dataclasses

import jax
import ml_collections
import numpy as np
import pytest

from bilinear_ir import scorers
from bilinear_ir.config import blocks
from bilinear_ir.data import pipeline
from bilinear_ir.errors import InputError
from bilinear_ir.experiment import training
from conftest import write_beir
from conftest import write_model

GRID = tuple(round(0.1 * i, 1) for i in range(11))


def _scores(module, params, q, d):
  return np.asarray(module.apply({"params": params}, q, d, method=module.score_all))


def _top(scores, k):
  return np.argsort(-scores, axis=1, kind="stable")[:, :k]


@pytest.mark.parametrize("options", [{"scorer": "bilinear"}, {"scorer": "wdp"},
                                     {"scorer": "lowrank", "rank": 3, "residual": "identity"},
                                     {"scorer": "lowrank", "rank": 3, "residual": "diag"}])
def test_blend_scores_are_the_convex_mix_of_dot_and_the_model(options):
  n = 6
  module = scorers.build(options["scorer"], dim=n, **{k: v for k, v in options.items()
                                                       if k != "scorer"})
  params = scorers.init_params(module, jax.random.key(0))
  rng = np.random.default_rng(1)
  params = {k: np.asarray(v) + rng.normal(size=np.shape(v)).astype(np.float32)
            for k, v in params.items()}  # a trained model far from the dot product
  q = rng.normal(size=(5, n)).astype(np.float32)
  d = rng.normal(size=(7, n)).astype(np.float32)
  model = _scores(module, params, q, d)
  for lam in (0.0, 0.3, 1.0):
    np.testing.assert_allclose(_scores(module, training.blend_with_dot(module, params, lam), q, d),
                               (1 - lam) * q @ d.T + lam * model, rtol=1e-5, atol=1e-5)


def test_blend_refuses_a_scorer_that_does_not_start_at_dot():
  module = scorers.build("lowrank", dim=6, rank=2, residual="none")
  assert not training.blends_with_dot(module)
  with pytest.raises(InputError, match="train.ict.guard"):
    training.blend_with_dot(module, scorers.init_params(module, jax.random.key(0)), 0.5)


def _case(seed=0, n=8, num_docs=200, num_queries=60):
  rng = np.random.default_rng(seed)
  q = rng.normal(size=(num_queries, n)).astype(np.float32)
  d = rng.normal(size=(num_docs, n)).astype(np.float32)
  m = rng.normal(size=(n, n)).astype(np.float32)
  return q, d, m


def test_guard_keeps_dot_when_the_ict_model_destroys_bm25_agreement():
  # BM25 agrees with the dot product (its top 10 are dot's); the "ICT" W is a random matrix that
  # reorders everything: the guard must keep the dot product (lam = 0).
  q, d, m = _case()
  module = scorers.build("bilinear", dim=q.shape[1])
  pseudo = _top(q @ d.T, 10)
  lam, agreement = training.bm25_guard(module, {"W": m}, q, d, pseudo, GRID)
  assert lam == 0.0 and agreement[0.0] == pytest.approx(1.0)
  assert agreement[1.0] < 0.5
  # A model at its init (the dot product) ties everywhere: the smallest lam.
  assert training.bm25_guard(module, {"W": np.eye(q.shape[1], dtype=np.float32)}, q, d, pseudo,
                             GRID)[0] == 0.0


def test_guard_keeps_the_ict_model_where_it_repairs_and_finds_a_known_blend():
  q, d, m = _case(seed=3)
  module = scorers.build("bilinear", dim=q.shape[1])
  # BM25 ranks as the model does (the embedding was misaligned, ICT repaired it): lam = 1.
  lam, agreement = training.bm25_guard(module, {"W": m}, q, d, _top(q @ m @ d.T, 10), GRID)
  assert lam == 1.0 and agreement[1.0] == pytest.approx(1.0) and agreement[0.0] < 0.5
  # BM25 ranks as the half-way blend (I + M) / 2: exactly lam = 0.5.
  half = _top(q @ (0.5 * np.eye(q.shape[1]) + 0.5 * m) @ d.T, 10)
  lam, agreement = training.bm25_guard(module, {"W": m}, q, d, half, GRID)
  assert lam == 0.5 and agreement[0.5] == pytest.approx(1.0)
  assert max(agreement[0.4], agreement[0.6]) < 1.0
  with pytest.raises(InputError, match="guard_grid"):
    training.bm25_guard(module, {"W": m}, q, d, half, (0.5, 1.5))


class _NoQrels:
  """Judgements that fail the test on any use (as tests/data/test_ict.py's)."""

  def _fail(self, *args, **kwargs):
    raise AssertionError("qrels used by the ICT guard")

  __getitem__ = __iter__ = __len__ = __contains__ = __bool__ = __eq__ = _fail

  def __getattr__(self, name):
    raise AssertionError(f"qrels used by the ICT guard: .{name}")

  __hash__ = object.__hash__


@pytest.fixture(scope="module")
def ict_config(tmp_path_factory):
  root = tmp_path_factory.mktemp("guard")
  c = blocks.table_recipe(ml_collections.ConfigDict())
  c.seed = 0
  c.data.format = "beir"
  c.data.path = write_beir(str(root / "beir"), num_docs=40, num_queries=14, seed=5,
                           splits=("test",))
  c.encoder.model = write_model(str(root / "bert"), "bert", seed=2)
  c.encoder.cache_dir, c.encoder.max_length = str(root / "cache"), 24
  c.encoder.pooling, c.encoder.normalize = "cls", False
  c.model.scorer = "bilinear"
  c.train.source = "ict"
  c.train.steps, c.train.eval_every, c.train.batch_size = 12, 4, 8
  c.train.ict.dev_docs, c.train.ict.min_words, c.train.ict.max_words = 8, 3, 6
  return c


def test_guard_reads_no_qrels_and_test_judgements_do_not_move_it(ict_config):
  from bilinear_ir.experiment import spec as spec_lib  # pylint: disable=g-import-not-at-top
  c = ict_config
  assert c.train.ict.guard == "bm25"  # on by default
  prepared = pipeline.prepare(c)
  splitset = pipeline.test_only(prepared.collection, c.data)[0]
  # Every judgement but the test split's (read by the final evaluation only) is a trap.
  prepared = dataclasses.replace(
      prepared, collection=dataclasses.replace(prepared.collection, qrels=_NoQrels()))
  splitset = dataclasses.replace(
      splitset, train=dataclasses.replace(splitset.train, qrels=_NoQrels()),
      dev=dataclasses.replace(splitset.dev, qrels=_NoQrels()))
  row = spec_lib.Row.of(c)
  out = training.train_and_evaluate(row, prepared, splitset, progress=False)
  guard = out["ict_guard"]
  assert guard["lam"] in GRID and set(guard["agreement"]) == {str(x) for x in GRID}
  assert guard["agreement"][str(guard["lam"])] == max(guard["agreement"].values())
  # The test judgements handed to another query each: the same blend.
  qids = splitset.test.query_ids
  moved = {q: splitset.test.qrels[qids[(i + 1) % len(qids)]] for i, q in enumerate(qids)}
  shuffled = dataclasses.replace(splitset, test=dataclasses.replace(splitset.test, qrels=moved))
  again = training.train_and_evaluate(row, prepared, shuffled, progress=False)
  assert again["ict_guard"] == guard
  # "none": the ICT-selected model unblended (the guard's lam = 1 would give the same scores).
  row_off = spec_lib.Recipe.of(c, "").row({"scorer": "bilinear"}, 0,
                                          {"ict": {**c.train.ict.to_dict(), "guard": "none"}})
  off = training.train_and_evaluate(row_off, prepared, splitset, progress=False)
  assert off["ict_guard"] is None
  np.testing.assert_allclose(
      np.asarray(training.blend_with_dot(out["module"], off["params"], guard["lam"])["W"]),
      np.asarray(out["params"]["W"]), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("field,value", [("guard", "always"), ("guard_grid", (0.5, 2.0)),
                                         ("guard_grid", ()), ("guard_depth", 0)])
def test_a_bad_guard_setting_is_refused_naming_its_field(field, value):
  from bilinear_ir.experiment import validation  # pylint: disable=g-import-not-at-top
  c = blocks.train_config()
  validation.check_train(c)  # the defaults pass
  c.ict[field] = value
  with pytest.raises(InputError, match=f"train.ict.{field}"):
    validation.check_train(c)
