"""Exports of trained table similarities: sentence-transformers (loaded back with
`SentenceTransformer`), the head alone, and the FAISS index, each scoring as the project does."""
import json
import os

import ml_collections
import numpy as np
import pytest

from bilinear_ir import scorers
from bilinear_ir.config import blocks
from bilinear_ir.data import pipeline
from bilinear_ir.experiment import spec as spec_lib
from bilinear_ir.experiment import training
from bilinear_ir.export import saved_model
from bilinear_ir.jobs import export as export_job
from conftest import write_beir
from conftest import write_model


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  root = tmp_path_factory.mktemp("export")
  config = ml_config(write_beir(str(root / "beir"), num_docs=30, num_queries=16, seed=4),
                     write_model(str(root / "bert"), "bert", seed=3), str(root / "cache"))
  prepared = pipeline.prepare(config)
  split = pipeline.splits(prepared.collection, config.data, config.seed)[0]
  return root, config, prepared, split


def ml_config(beir, model, cache):
  c = blocks.table_recipe(ml_collections.ConfigDict())
  c.seed = 0
  c.data.format, c.data.path = "beir", beir
  c.encoder.model, c.encoder.cache_dir, c.encoder.max_length = model, cache, 24
  c.encoder.pooling, c.encoder.normalize = "mean", True
  c.train.steps, c.train.eval_every, c.train.batch_size = 8, 4, 4
  return c


def _train(setup, spec):
  root, config, prepared, split = setup
  c = spec_lib.Recipe.of(config, "").row(spec, 0)
  out = training.train_and_evaluate(c, prepared, split, progress=False)
  module = scorers.from_config(c.model, prepared.dim)
  path = str(root / f"model_{spec['scorer']}")
  saved_model.save_model(path, module, out["params"], prepared.embeddings.manifest["settings"])
  return path, module, out["params"]


def _export(path, fmt, out, config=None):
  c = ml_collections.ConfigDict({"model_dir": path, "format": fmt, "encoder": {"cache_dir": ""},
                                 "data": config.data if config else blocks.data_config()})
  export_job.validate(c)
  rep = export_job.run(c, out)
  rep.folders["export"](out)
  return rep


@pytest.mark.parametrize("spec", [{"scorer": "lowrank", "rank": 3, "residual": "identity"},
                                  {"scorer": "bilinear"}, {"scorer": "wdp"}],
                         ids=["lowrank", "bilinear", "wdp"])
def test_sentence_transformers_export_scores_as_the_project(setup, spec):
  from sentence_transformers import SentenceTransformer  # pylint: disable=g-import-not-at-top
  root, _, prepared, _ = setup
  path, module, params = _train(setup, spec)
  out = str(root / f"st_{spec['scorer']}")
  _export(path, "sentence-transformers", out)
  model = SentenceTransformer(out, device="cpu")
  coll = prepared.collection
  queries = [coll.queries[q] for q in prepared.embeddings.query_ids]
  got = model.encode_query(queries) @ model.encode_document(coll.doc_strings()).T
  want = np.asarray(module.apply({"params": params}, prepared.embeddings.queries,
                                 prepared.embeddings.docs, method=module.score_all))
  assert got.shape == want.shape
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
  assert model.similarity_fn_name == "dot"
  info = json.load(open(os.path.join(out, "bilinear_ir.json"), encoding="utf-8"))
  assert info["scorer"] == spec["scorer"] and info["embedding"]["pooling"] == "mean"


def test_head_export_is_the_two_tables(setup):
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  root, _, prepared, _ = setup
  path, module, params = _train(setup, {"scorer": "lowrank", "rank": 3, "residual": "identity"})
  out = str(root / "head")
  _export(path, "head", out)
  w = load_file(os.path.join(out, "head.safetensors"))
  q, d = prepared.embeddings.queries, prepared.embeddings.docs
  got = (q @ w["query.linear.weight"].T) @ (d @ w["document.linear.weight"].T).T
  want = np.asarray(module.apply({"params": params}, q, d, method=module.score_all))
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
  assert "score(q, d) = (q @ A) . (d @ B)" in open(os.path.join(out, "README.md")).read()


def test_faiss_export_searches_like_the_project(setup):
  import faiss  # pylint: disable=g-import-not-at-top
  root, config, prepared, _ = setup
  path, module, params = _train(setup, {"scorer": "bilinear"})
  out = str(root / "faiss")
  _export(path, "faiss", out, config)
  index = faiss.read_index(os.path.join(out, "index.faiss"))
  head = np.load(os.path.join(out, "query_head.npy"))
  scores, ids = index.search(np.ascontiguousarray(prepared.embeddings.queries @ head), 5)
  want = np.asarray(module.apply({"params": params}, prepared.embeddings.queries,
                                 prepared.embeddings.docs, method=module.score_all))
  np.testing.assert_allclose(scores, np.sort(want, axis=1)[:, ::-1][:, :5], atol=1e-5)
  doc_ids = open(os.path.join(out, "doc_ids.txt"), encoding="utf-8").read().split()
  assert doc_ids == list(prepared.collection.doc_ids) and ids.max() < len(doc_ids)


def test_cls_unnormalised_prompted_residual_export_scores_as_the_project(tmp_path):
  # The other corner of the settings: CLS pooling left unnormalised, query and doc prompts, the
  # residual I + P Q^T form with P Q^T far from 0 (perturbed params). Exporting with mean
  # pooling, a Normalize module, no prompts or without the identity each moves the scores.
  from sentence_transformers import SentenceTransformer  # pylint: disable=g-import-not-at-top
  from conftest import perturbed_params  # pylint: disable=g-import-not-at-top
  config = ml_config(write_beir(str(tmp_path / "beir"), num_docs=20, num_queries=8, seed=6),
                     write_model(str(tmp_path / "bert"), "bert", seed=5), str(tmp_path / "cache"))
  config.encoder.pooling, config.encoder.normalize = "cls", False
  config.encoder.query_prompt, config.encoder.doc_prompt = "query: ", "passage: "
  prepared = pipeline.prepare(config)
  settings = prepared.embeddings.manifest["settings"]
  assert (settings["pooling"], settings["normalize"]) == ("cls", False)
  assert (settings["query_prompt"], settings["doc_prompt"]) == ("query: ", "passage: ")
  norms = np.linalg.norm(prepared.embeddings.docs, axis=1)
  assert np.ptp(norms) > 1e-2 * norms.mean()  # unnormalised indeed
  c = spec_lib.Recipe.of(config, "").row(
      {"scorer": "lowrank", "rank": 3, "residual": "identity"}, 0)
  module = scorers.from_config(c.model, prepared.dim)
  params = perturbed_params(module, seed=1)
  q, d = prepared.embeddings.queries, prepared.embeddings.docs
  want = np.asarray(module.apply({"params": params}, q, d, method=module.score_all))
  low = want - q @ d.T
  assert np.abs(low).max() > 0.1 * np.abs(want).max()  # P Q^T matters as much as I
  path = str(tmp_path / "model")
  saved_model.save_model(path, module, params, settings)
  out = str(tmp_path / "st")
  _export(path, "sentence-transformers", out)
  model = SentenceTransformer(out, device="cpu")
  coll = prepared.collection
  queries = [coll.queries[qid] for qid in prepared.embeddings.query_ids]
  got = model.encode_query(queries) @ model.encode_document(coll.doc_strings()).T
  assert got.shape == want.shape
  np.testing.assert_allclose(got, want, atol=1e-5 * np.abs(want).max(), rtol=0)
  info = json.load(open(os.path.join(out, "bilinear_ir.json"), encoding="utf-8"))
  assert info["embedding"]["pooling"] == "cls" and info["embedding"]["normalize"] is False
