"""A fine-tuned encoder as a sentence-transformers folder (`export.encoder_folder`).

The oracle is sentence-transformers itself (PyTorch): the folder, loaded by
`SentenceTransformer(path)` with nothing else, must encode texts as the project does
(`data.embeddings.run_model` + `pooled`) with the same params, within 1e-5; and the project's
own reader (`hf_folder.load_folder`) must give the params back bit for bit. The params are the
encoder's moved by seeded noise (as a fine-tune moves them), so a folder holding the source
weights, or a weight written in the wrong layout, is caught.
"""
from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np
import pytest

from bilinear_ir import files
from bilinear_ir.data import embeddings
from bilinear_ir.encoders import hf_folder
from bilinear_ir.encoders import names
from bilinear_ir.errors import InputError
from bilinear_ir.export import encoder_folder
from conftest import WORDS
from conftest import write_model

TEXTS = ["What does my homeowners insurance cover?", "mice",
         "Increased risk of cancer in patients with a high gene expression level; a drug dose "
         "trial (phase 2) in human blood found the virus infection reduced by the treatment.",
         "Is life insurance taxable when it is paid out to the beneficiary?"]
# Mean + Normalize (all-MiniLM-L6-v2's own), and the other corner: CLS, unnormalised, prompts.
SETTINGS = [{"pooling": "mean", "normalize": True, "max_length": 24},
            {"pooling": "cls", "normalize": False, "max_length": 64, "query_prompt": "query: ",
             "doc_prompt": "passage: "}]


def perturbed(params, seed: int, scale: float = 0.05):
  """Every leaf + scale * its std * N(0, 1) (seeded): a fine-tune's kind of change."""
  leaves, tree = jax.tree.flatten(params)
  rng = np.random.default_rng(seed)  # numpy: no compile per leaf shape
  return jax.tree.unflatten(tree, [
      np.asarray(x + scale * np.std(x) * rng.standard_normal(x.shape), np.float32)
      for x in leaves])


def project_encode(encoder, params, texts, settings, prefix=""):
  """[N, n] the project's sentence vectors of `texts` under `params` (one device)."""
  encoder = dataclasses.replace(encoder, params=params)
  length = settings["max_length"]
  out = embeddings.run_model(encoder, encoder.tokenize(texts, length, prefix),
                             normalize=settings["normalize"], tokens=False, max_length=length,
                             batch_size=8, devices=jax.local_devices()[:1], desc=None)
  return embeddings.pooled({"mean": out[:, 0], "cls": out[:, 1]}, settings)


def assert_same_params(got, want):
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def check_folder(path, encoder, params, settings, texts):
  """Loads `path` in sentence-transformers and the project; returns the max abs differences
  (documents, queries) of their encodings."""
  from sentence_transformers import SentenceTransformer  # pylint: disable=g-import-not-at-top
  back = hf_folder.load_folder(path)
  assert_same_params(back.params, params)
  assert back.hashes["weights_sha256"] == files.tree_sha256(params)
  for key in ("config_sha256", "tokenizer_sha256"):
    assert back.hashes[key] == encoder.hashes[key], key
  assert back.defaults == {k: settings[k] for k in ("pooling", "normalize", "max_length")}
  model = SentenceTransformer(path, device="cpu")
  assert model.max_seq_length == settings["max_length"]
  assert model.similarity_fn_name == "dot"
  prompts = {"query": settings.get("query_prompt", ""),
             "document": settings.get("doc_prompt", "")}
  assert {k: model.prompts.get(k, "") for k in prompts} == prompts
  got = (model.encode(texts, convert_to_numpy=True),
         model.encode_query(texts, convert_to_numpy=True))
  want = (project_encode(encoder, params, texts, settings),
          project_encode(encoder, params, texts, settings, prompts["query"]))
  return [float(np.abs(g - w).max()) for g, w in zip(got, want)]


@pytest.fixture(scope="module")
def minilm():
  """(all-MiniLM-L6-v2, its params perturbed with seed 0)."""
  encoder = names.load_encoder("")
  return encoder, perturbed(encoder.params, seed=0)


def test_fine_tuned_minilm_encodes_in_sentence_transformers_as_in_the_project(minilm, tmp_path):
  # MiniLM's own settings; the other corner (CLS, unnormalised, prompts) is the tiny models'.
  encoder, params = minilm
  settings = SETTINGS[0]
  path = str(tmp_path / "model")
  encoder_folder.save(path, encoder, params, settings)
  diffs = check_folder(path, encoder, params, settings, TEXTS)
  print(f"MiniLM {settings['pooling']}: max |sentence-transformers - project| = "
        f"{diffs[0]:.2e} (texts), {diffs[1]:.2e} (queries with the prompt)")
  assert max(diffs) <= 1e-5
  # The perturbation matters: the frozen encoder's vectors are far from these.
  frozen = project_encode(encoder, encoder.params, TEXTS, settings)
  assert np.abs(frozen - project_encode(encoder, params, TEXTS, settings)).max() > 1e-2


@pytest.mark.parametrize("kind", ["mpnet", "bert"])
def test_tiny_models_round_trip_and_load_in_sentence_transformers(kind, tmp_path):
  source = write_model(str(tmp_path / "source"), kind, seed=3)
  encoder = hf_folder.load_folder(source)
  params = perturbed(encoder.params, seed=1, scale=0.5)
  path = str(tmp_path / "model")
  encoder_folder.save(path, encoder, params, SETTINGS[1])
  texts = TEXTS[1:] + [" ".join(WORDS * 3)]  # the last one truncated at 64 tokens
  diffs = check_folder(path, encoder, params, SETTINGS[1], texts)
  print(f"tiny {kind}: max |sentence-transformers - project| = {max(diffs):.2e}")
  assert max(diffs) <= 1e-5


def test_refuses_bad_paths_settings_and_params(tmp_path):
  encoder = hf_folder.load_folder(write_model(str(tmp_path / "source"), "bert"))
  settings = SETTINGS[0]
  taken = tmp_path / "taken"
  taken.mkdir()
  (taken / "keep.txt").write_text("mine")
  with pytest.raises(InputError, match=f"{taken}: exists and is not an empty folder"):
    encoder_folder.save(str(taken), encoder, encoder.params, settings)
  assert os.listdir(taken) == ["keep.txt"]
  (tmp_path / "empty").mkdir()  # an empty folder is filled
  encoder_folder.save(str(tmp_path / "empty"), encoder, encoder.params, settings)
  assert os.path.isfile(tmp_path / "empty" / "model.safetensors")

  out = str(tmp_path / "out")
  bad_settings = [({**settings, "pooling": "max"}, "field 'pooling'"),
                  ({**settings, "max_length": encoder.max_positions + 1}, "field 'max_length'"),
                  ({k: v for k, v in settings.items() if k != "normalize"}, "field 'normalize'")]
  for bad, field in bad_settings:
    with pytest.raises(InputError, match=f"settings: {field}"):
      encoder_folder.save(out, encoder, encoder.params, bad)
  params = jax.tree.map(np.asarray, encoder.params)
  missing = {k: v for k, v in params.items() if k != "layer_1"}
  wide = {**params, "embeddings_norm": {**params["embeddings_norm"],
                                        "scale": np.ones(33, np.float32)}}
  half = jax.tree.map(lambda x: x.astype(np.float16), params)
  for bad, what in ((missing, "layer_1.attention.out.bias: missing"),
                    (wide, "embeddings_norm.scale: gives 'embeddings.LayerNorm.weight' the "
                           "shape \\[33\\]"),
                    (half, "dtype float16")):
    with pytest.raises(InputError, match=what):
      encoder_folder.save(out, encoder, bad, settings)
  assert sorted(os.listdir(tmp_path)) == ["empty", "source", "taken"]  # nothing half-written
