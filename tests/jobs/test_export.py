"""Exports of trained table similarities: sentence-transformers (loaded back with
`SentenceTransformer`), the head alone, the FAISS index and the query-side model (the linear
scorers and the residual adapter, served by FAISS and LanceDB indexes of the raw doc embeddings),
each scoring / searching as the project does."""
import json
import os

import ml_collections
import numpy as np
import pytest

from bilinear_ir import scorers
from bilinear_ir.config import blocks
from bilinear_ir.data import pipeline
from bilinear_ir.errors import InputError
from bilinear_ir.experiment import spec as spec_lib
from bilinear_ir.experiment import training
from bilinear_ir.export import saved_model
from bilinear_ir.export import serving
from bilinear_ir.jobs import export as export_job
from bilinear_ir.retrieval import exact
from conftest import perturbed_params
from conftest import write_beir
from conftest import write_model

QUERY_SIDE_SPECS = {"wdp": {"scorer": "wdp"}, "bilinear": {"scorer": "bilinear"},
                    "lowrank": {"scorer": "lowrank", "rank": 3, "residual": "identity"},
                    "adapter": {"scorer": "adapter", "hidden": 8}}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  root = tmp_path_factory.mktemp("export")
  config = ml_config(write_beir(str(root / "beir"), num_docs=300, num_queries=24, seed=4),
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


def _export(path, fmt, out, config=None, check="", check_queries=0, seed=0):
  c = ml_collections.ConfigDict({"model_dir": path, "format": fmt,
                                 "encoder": {"cache_dir": config.encoder.cache_dir if config
                                             else ""},
                                 "data": config.data if config else blocks.data_config(),
                                 "check": check, "check_queries": check_queries, "seed": seed})
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


@pytest.fixture(scope="module")
def query_side(setup):
  """{name: (module, params, SentenceTransformer, bilinear_ir.json)}: each QUERY_SIDE_SPECS scorer
  with params far from its init (`perturbed_params`), saved and exported as format=query_side."""
  from sentence_transformers import SentenceTransformer  # pylint: disable=g-import-not-at-top
  root, config, prepared, _ = setup
  out = {}
  for name, spec in QUERY_SIDE_SPECS.items():
    c = spec_lib.Recipe.of(config, "").row(spec, 0)
    module = scorers.from_config(c.model, prepared.dim)
    params = perturbed_params(module, seed=2)
    path, folder = str(root / f"qs_model_{name}"), str(root / f"qs_{name}")
    saved_model.save_model(path, module, params, prepared.embeddings.manifest["settings"])
    _export(path, "query_side", folder)
    info = json.load(open(os.path.join(folder, "bilinear_ir.json"), encoding="utf-8"))
    stack = json.load(open(os.path.join(folder, "modules.json"), encoding="utf-8"))
    assert all(m["type"].startswith("sentence_transformers.") for m in stack)  # built-ins only
    weights = [f for _, _, fs in os.walk(folder) for f in fs
               if f.endswith((".safetensors", ".bin", ".pt", ".pth", ".pkl"))]
    assert weights and all(f.endswith(".safetensors") for f in weights)  # nothing pickled
    out[name] = module, params, SentenceTransformer(folder, device="cpu",
                                                    trust_remote_code=False), info
  return out


def test_adapter_exports_only_query_side(setup, query_side, tmp_path):
  # Its query side is no matrix: the table formats are refused before anything is written.
  root, _, _, _ = setup
  for fmt in ("sentence-transformers", "head"):
    with pytest.raises(InputError, match="format=query_side"):
      _export(str(root / "qs_model_adapter"), fmt, str(tmp_path / fmt))
    assert not os.path.exists(tmp_path / fmt)


def _queries(prepared):
  coll = prepared.collection
  return [coll.queries[q] for q in prepared.embeddings.query_ids]


@pytest.mark.parametrize("name", list(QUERY_SIDE_SPECS))
def test_query_side_export_scores_as_the_project_over_raw_docs(setup, query_side, name):
  _, _, prepared, _ = setup
  module, params, model, info = query_side[name]
  q, d = prepared.embeddings.queries, prepared.embeddings.docs
  docs = model.encode_document(prepared.collection.doc_strings())
  np.testing.assert_allclose(docs, d, atol=1e-5, rtol=0)  # the document path is raw
  want = np.asarray(module.apply({"params": params}, q, d, method=module.score_all))
  assert np.abs(want - q @ d.T).max() > 0.1 * np.abs(want).max()  # far from the dot product
  got = model.encode_query(_queries(prepared)) @ d.T
  diff = np.abs(got - want).max()
  print(f"query_side {name}: max |encode_query . raw docs - score_all| = {diff:.2e} "
        f"(scores up to {np.abs(want).max():.2f})")
  assert got.shape == want.shape and diff <= 1e-5 * np.abs(want).max()
  assert info["doc_side"] == "raw" and info["format"] == "query_side"
  assert info["scorer"] == QUERY_SIDE_SPECS[name]["scorer"]


@pytest.mark.parametrize("name", list(QUERY_SIDE_SPECS))
def test_query_side_export_is_served_by_an_index_of_raw_docs(setup, query_side, tmp_path, name):
  # The export job's serving check: indexes built over the export's raw doc embeddings (what a
  # user already has), searched with its query embeddings (FAISS IndexFlatIP; LanceDB, embedded,
  # exact flat search with the dot distance 1 - q.d), each return the project's exact top-10 for
  # every test query without near-ties, and most queries have none.
  root, config, prepared, _ = setup
  rep = _export(str(root / f"qs_model_{name}"), "query_side", str(tmp_path / "qs"), config,
                check="faiss+lancedb")
  check = rep.results["serving_check"]
  queries = len(prepared.collection.split_query_ids(config.data.split))
  assert check["queries"] == queries > 0 and check["k"] == 10
  assert check["max_doc_diff"] <= 1e-5 and check["max_score_diff"] <= check["tol"]
  for backend in ("faiss", "lancedb"):
    got = check[backend]
    print(f"{backend} {name}: the project's exact top-10 on {got['same_ids']} of "
          f"{got['clear']} queries without near-ties (of {got['queries']})")
    assert got["queries"] == queries and got["clear"] >= 0.75 * queries
    assert got["same_ids"] == got["clear"] and got["max_score_diff"] <= check["tol"]


def test_serving_check_samples_the_test_queries_by_seed(setup, query_side, tmp_path):
  root, config, prepared, _ = setup
  runs = [_export(str(root / "qs_model_bilinear"), "query_side", str(tmp_path / f"qs{i}"),
                  config, check="faiss", check_queries=5, seed=seed).results["serving_check"]
          for i, seed in enumerate((0, 0, 1))]
  assert [r["queries"] for r in runs] == [5, 5, 5] and runs[0] == runs[1]
  assert runs[2]["query_ids_sha256"] != runs[0]["query_ids_sha256"]
  assert runs[0]["faiss"]["same_ids"] == runs[0]["faiss"]["clear"] >= 3


def test_compare_topk_counts_a_wrong_id_and_leaves_ties_aside():
  rng = np.random.default_rng(0)
  scores = rng.normal(size=(6, 50)).astype(np.float32)
  scores[5, 7] = scores[5, np.argmax(scores[5])]  # query 5: a tie at the top
  want = exact.topk(scores, np.eye(50, dtype=np.float32), 10)
  ids, want_scores = np.asarray(want.ids).copy(), np.asarray(want.scores)
  assert serving.compare_topk(ids, scores, want_scores, ids, 1e-6)["same_ids"] == 5
  ids[2, [3, 4]] = ids[2, [4, 3]]  # query 2 returns two results out of order
  ids[3, 9] = np.argsort(-scores[3])[10]  # query 3 returns the 11th doc instead of the 10th
  got = serving.compare_topk(ids, scores, want_scores, np.asarray(want.ids), 1e-6)
  assert (got["queries"], got["clear"], got["same_ids"]) == (6, 5, 3)
  assert got["max_score_diff"] > 1e-3
