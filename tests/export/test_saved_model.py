"""The portable model format (config.json + model.safetensors) for every scorer of the registry."""
import json
import os

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file
from safetensors.numpy import save_file

from bilinear_ir import scorers
from bilinear_ir.errors import InputError
from bilinear_ir.export import saved_model

TOKEN_SCORERS = ("colbert", "lite", "lite_flat", "knrm", "mebert")
OPTIONS = {"lowrank": {"rank": 3, "residual": "identity"}, "mol": {"p_q": 2, "p_x": 3, "d_p": 4,
                                                                     "hidden": 8},
           "lite": {"m1": 4, "m2": 6}, "lite_flat": {"width": 8}, "mebert": {"num_vectors": 2},
           "colbert": {"token_dim": 4}}
EMBEDDING = {"kind": "flax", "model": "", "pooling": "mean", "normalize": True, "max_length": 32,
             "query_prompt": "", "doc_prompt": ""}


def perturbed_params(module, seed: int = 0):
  """Init params moved by 0.5 N(0, 1) noise (numpy; no compile)."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda x: np.asarray(x) + rng.normal(0, 0.5, np.shape(x)).astype(
      np.asarray(x).dtype), scorers.init_params(module, jax.random.key(seed)))


def _build(name):
  kw = dict(OPTIONS.get(name, {}))
  if name in TOKEN_SCORERS:
    kw.update(query_len=5, doc_len=7)
  return scorers.build(name, dim=6, **kw)


@pytest.mark.parametrize("name", sorted(scorers.names()))
def test_round_trip_gives_the_same_params_and_scores(name, tmp_path):
  module = _build(name)
  params = perturbed_params(module)
  path = str(tmp_path / "m")
  saved_model.save_model(path, module, params, EMBEDDING, extra={"collection": "x"})
  got_module, got, config = saved_model.load_model(path)
  assert got_module == module
  assert config["scorer"] == name and config["embedding"] == EMBEDDING
  assert config["collection"] == "x" and config["params_sha256"]
  for (pa, a), (pb, b) in zip(jax.tree_util.tree_flatten_with_path(params)[0],
                              jax.tree_util.tree_flatten_with_path(got)[0]):
    assert pa == pb
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  inputs = module.example_inputs()
  want = module.apply({"params": params}, *inputs, method=module.score_pairs)
  have = got_module.apply({"params": got}, *inputs, method=got_module.score_pairs)
  np.testing.assert_array_equal(np.asarray(want), np.asarray(have))
  # Names mirror the Flax tree.
  names = set(load_file(os.path.join(path, "model.safetensors"))) if config["params"] else set()
  assert names == set(saved_model.flatten(params)) == set(config["params"])


@pytest.fixture
def saved(tmp_path):
  module = scorers.build("lowrank", dim=6, rank=3, residual="none")
  params = perturbed_params(module)
  path = str(tmp_path / "m")
  saved_model.save_model(path, module, params, EMBEDDING)
  return path


def test_a_changed_weight_is_refused(saved):
  weights = load_file(os.path.join(saved, "model.safetensors"))
  weights["P"] = weights["P"] + 1.0
  save_file(weights, os.path.join(saved, "model.safetensors"))
  with pytest.raises(InputError, match="model.safetensors: the weights' SHA-256"):
    saved_model.load_model(saved)


@pytest.mark.parametrize("change,match", [
    (lambda w: w.pop("Q"), "missing parameter 'Q'"),
    (lambda w: w.update(extra=np.zeros(2, np.float32)), "unexpected parameter 'extra'"),
    (lambda w: w.update(P=np.zeros((6, 4), np.float32)), r"parameter 'P' is float32\[6, 4\]"),
    (lambda w: w.update(P=w["P"].astype(np.float16)), "parameter 'P' is float16"),
])
def test_weights_that_do_not_fit_the_scorer_are_refused(saved, change, match):
  weights = load_file(os.path.join(saved, "model.safetensors"))
  change(weights)
  save_file(weights, os.path.join(saved, "model.safetensors"))
  with pytest.raises(InputError, match=match):
    saved_model.load_model(saved)


def test_a_bad_config_is_refused(saved, tmp_path):
  path = os.path.join(saved, "config.json")
  config = json.load(open(path, encoding="utf-8"))
  json.dump({**config, "options": {"rank": 3, "nope": 1}}, open(path, "w", encoding="utf-8"))
  with pytest.raises(InputError, match="nope"):
    saved_model.load_model(saved)
  json.dump({**config, "format": "other"}, open(path, "w", encoding="utf-8"))
  with pytest.raises(InputError, match="config.json: field 'format'"):
    saved_model.load_model(saved)
  open(path, "w", encoding="utf-8").write("{not json")
  with pytest.raises(InputError, match="config.json: not valid JSON"):
    saved_model.load_model(saved)
  with pytest.raises(InputError, match="no such model folder"):
    saved_model.load_model(str(tmp_path / "nowhere"))


def test_save_many_writes_every_model_under_one_folder(tmp_path):
  module = scorers.build("wdp", dim=4)
  params = perturbed_params(module)
  saved_model.save_many(str(tmp_path / "models"),
                        {"mean/wdp/seed0": (module, params, EMBEDDING, {}),
                         "mean/wdp/seed1": (module, params, EMBEDDING, {})})
  for seed in (0, 1):
    _, got, _ = saved_model.load_model(str(tmp_path / "models" / "mean" / "wdp" / f"seed{seed}"))
    np.testing.assert_array_equal(np.asarray(got["v"]), np.asarray(params["v"]))
  assert sorted(os.listdir(tmp_path)) == ["models"]  # no temporary folder left
