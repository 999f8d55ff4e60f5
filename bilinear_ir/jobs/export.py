"""The `export` job: a trained table similarity out of the project.

    configs/export.py:model_dir=W/model,format=sentence-transformers   -> WORKDIR/export/
    configs/export.py:model_dir=W/model,format=head                    -> WORKDIR/export/
    configs/export.py:model_dir=W/model,format=faiss                   -> WORKDIR/export/
    configs/export.py:model_dir=W/model,format=query_side              -> WORKDIR/export/

`sentence-transformers`: a folder `SentenceTransformer(path)` loads (the encoder, its pooling
and normalisation, a query / document `Router` of two `Dense` layers;
`export.sentence_transformers`), so `encode_query(q) @ encode_document(d).T` gives the model's
scores. `head`: the two matrices alone (`export.head`; for models over precomputed embeddings,
which have no encoder to ship). `faiss`: an `IndexFlatIP` over the doc table of `data`'s
collection (`export.faiss_index`), its doc ids and the query head. `query_side`: a
sentence-transformers folder whose query route is one `Dense` (M = A B^T, n x n; the adapter:
two `Dense` computing q + f(q)) and whose document route is empty, so an index of the encoder's
raw doc embeddings serves it unchanged (the adapter exports only so).
Every format carries `bilinear_ir.json`, what it was exported from, with `doc_side`: "raw"
(query_side) or "table" (the doc table of width `table_width`).

`check` (query_side; backends of `export.serving` joined by "+", e.g. faiss+lancedb): the export
served as a user would serve it, on `data`'s collection: its `encode_document` gives the raw doc
embeddings an index holds, its `encode_query` the `data.split` queries (a sample of
`check_queries` of them drawn by `seed`; 0: all), each backend's exact index returns a top-10,
and `results.json` records, per backend, how many queries get the project's exact top-10
(`ranking.score_topk` over the project's own embeddings), ties aside (`serving.compare_topk`).
"""
from __future__ import annotations

import functools
import os
import tempfile

import ml_collections
import numpy as np

from bilinear_ir import files
from bilinear_ir.config import blocks
from bilinear_ir.data import embeddings as embeddings_lib
from bilinear_ir.data import loaders
from bilinear_ir.data import pipeline
from bilinear_ir.encoders import names
from bilinear_ir.errors import input_error
from bilinear_ir.errors import require
from bilinear_ir.experiment import validation
from bilinear_ir.export import faiss_index
from bilinear_ir.export import head
from bilinear_ir.export import saved_model
from bilinear_ir.export import sentence_transformers
from bilinear_ir.export import serving
from bilinear_ir.report import outputs
from bilinear_ir.retrieval import ranking
from bilinear_ir.scorers.adapter import QueryAdapter
from bilinear_ir.scorers.base import TableScorer
from bilinear_ir.scorers.base import table_matrices

FORMATS = ("sentence-transformers", "head", "faiss", "query_side")
CHECK_K = 10  # results per query compared by `check`


def validate(config: ml_collections.ConfigDict) -> None:
  """Refuses a bad config before any work (`experiment.validation`)."""
  validation.one_of(config.format, FORMATS, "format")
  require(isinstance(config.model_dir, str) and config.model_dir != "",
          "must name a saved model folder (a train_eval WORKDIR/model)", field="model_dir")
  if not os.path.isdir(config.model_dir):
    raise input_error("no such model folder (a train_eval WORKDIR/model)",
                      file=config.model_dir, field="model_dir")
  if config.format == "faiss":
    validation.check_data(config.data)
  if config.check:
    require(config.format == "query_side", "a serving check needs format=query_side (an index "
            f"of raw doc embeddings serves only it), got format {config.format!r}", field="check")
    for backend in config.check.split("+"):
      serving.require_backend(backend)
    require(int(config.check_queries) == config.check_queries and config.check_queries >= 0,
            f"must be an integer >= 0, got {config.check_queries!r}", field="check_queries")
    validation.check_data(config.data)


def _encoder_config(settings: dict, cache_dir: str) -> ml_collections.ConfigDict:
  c = blocks.encoder_config()
  for key, value in settings.items():
    if key in c:
      c[key] = value
  c.cache_dir = cache_dir
  return c


def _write_faiss(path: str, index, doc_ids: list[str], a: np.ndarray, description: dict):
  """index.faiss, doc_ids.txt, query_head.npy ([n, w]: q -> q A), bilinear_ir.json."""
  import faiss  # pylint: disable=g-import-not-at-top  (present: export_faiss built the index)
  with files.atomic_dir(path) as tmp:
    faiss.write_index(index, os.path.join(tmp, "index.faiss"))
    files.atomic_write_text(os.path.join(tmp, "doc_ids.txt"), "".join(f"{d}\n" for d in doc_ids))
    files.atomic_save_npy(os.path.join(tmp, "query_head.npy"), a)
    files.atomic_write_json(os.path.join(tmp, "bilinear_ir.json"), description)


def serving_check(config: ml_collections.ConfigDict, module, params, model,
                  settings: dict) -> dict:
  """`check`: the query-side export `model` (a SentenceTransformer) served from each backend's
  index of its raw doc embeddings, against the project's exact top-10 of `module` at `params`.

  Returns {"collection", "split", "queries", "query_ids_sha256" (of the served queries' ids),
  "k", "tol" (scores closer than this are tied: 1e-5 of the largest), "max_doc_diff" (max
  |encode_document - the project's doc embeddings|), "max_score_diff" (max |encode_query .
  encode_document - the project's score_all|), and per backend `serving.compare_topk`'s counts}.
  """
  coll = loaders.load(config.data)
  emb = pipeline.embed(coll, _encoder_config(settings, config.encoder.cache_dir))
  qids = coll.split_query_ids(config.data.split)
  if 0 < config.check_queries < len(qids):
    rng = np.random.default_rng(config.seed)
    qids = [qids[i] for i in np.sort(rng.choice(len(qids), config.check_queries, replace=False))]
  v, q = {"params": params}, emb.query_rows(qids)
  want_scores = np.asarray(module.apply(v, q, emb.docs, method=module.score_all))  # [B, N]
  want_ids, want_top = ranking.score_topk(module, params, q, emb.docs, CHECK_K)  # [B, k] each
  docs = np.asarray(model.encode_document(coll.doc_strings()), np.float32)  # [N, n]
  queries = np.asarray(model.encode_query([coll.queries[x] for x in qids]), np.float32)  # [B, n]
  tol = 1e-5 * float(np.abs(want_scores).max())
  out = {"collection": coll.name, "split": config.data.split, "queries": len(qids),
         "query_ids_sha256": files.sha256_texts(qids), "k": CHECK_K, "tol": tol,
         "max_doc_diff": float(np.abs(docs - emb.docs).max()),
         "max_score_diff": float(np.abs(queries @ docs.T - want_scores).max())}
  for backend in config.check.split("+"):
    with tempfile.TemporaryDirectory() as folder:
      ids = serving.search(backend, docs, queries, CHECK_K, folder)
    out[backend] = serving.compare_topk(ids, want_scores, want_top, want_ids, tol)
  return out


# pylint: disable-next=unused-argument
def run(config: ml_collections.ConfigDict, workdir: str) -> outputs.Report:
  """The `export` job (configs/export.py)."""
  module, params, meta = saved_model.load_model(config.model_dir)
  if not isinstance(module, TableScorer):
    raise input_error(f"scorer {meta['scorer']!r} has no query/doc tables to export (table "
                      "scorers: dot, wdp, bilinear, lowrank, adapter)",
                      file=os.path.join(config.model_dir, saved_model.CONFIG), field="scorer")
  adapter = isinstance(module, QueryAdapter)
  if adapter and config.format != "query_side":
    raise input_error("the adapter's query side q + f(q) is not a matrix; its documents are the "
                      "raw embeddings: export format=query_side", file="config", field="format")
  a, b = (None, None) if adapter else table_matrices(module, params)
  settings = meta["embedding"]
  description = {"model_dir": os.path.abspath(config.model_dir), "scorer": meta["scorer"],
                 "options": meta["options"], "dim": meta["dim"], "embedding": settings,
                 "params_sha256": meta["params_sha256"], "format": config.format,
                 "table_width": int(module.dim if adapter else a.shape[1]),
                 "doc_side": "raw" if config.format == "query_side" else "table"}
  cache_dir = embeddings_lib.resolve_cache_dir(config.encoder.cache_dir)
  if config.format in ("sentence-transformers", "query_side"):
    if settings.get("kind") != "flax":
      raise input_error("the model was trained on precomputed embeddings, so there is no "
                        "encoder to ship; export format=head", file="config", field="format")
    _, folder = names.resolve(settings["model"], cache_dir)
    if config.format == "query_side":
      query, doc = sentence_transformers.query_side_layers(module, params), []
    else:
      query, doc = [sentence_transformers.Layer(a)], [sentence_transformers.Layer(b)]
    model = sentence_transformers.build(query, doc, folder, settings)  # built now: errors first
    writer = functools.partial(sentence_transformers.save, model=model,
                               description=description)
  elif config.format == "head":
    writer = functools.partial(head.save, a=a, b=b, description=description)
  else:
    coll = loaders.load(config.data)
    emb = pipeline.embed(coll, _encoder_config(settings, config.encoder.cache_dir))
    index = faiss_index.export_faiss(module, params, emb.docs)
    writer = functools.partial(_write_faiss, index=index, doc_ids=list(emb.doc_ids), a=a,
                               description={**description, "collection": coll.name})
  md = (f"# export: {meta['scorer']} ({config.format})\n\nFrom `{config.model_dir}`: query and "
        f"doc tables of width {description['table_width']} over {meta['dim']}-d embeddings "
        f"({settings.get('model') or settings.get('path') or 'all-MiniLM-L6-v2'}); doc side "
        f"{description['doc_side']}; written to `export/`.\n")
  results = description
  if config.check:
    check = serving_check(config, module, params, model, settings)
    results = {**description, "serving_check": check}
    md += (f"\nServed from indexes of the raw doc embeddings ({check['collection']}, "
           f"{check['queries']} {check['split']} queries, top-{check['k']}; max |export - "
           f"project| {check['max_score_diff']:.2e} on scores, {check['max_doc_diff']:.2e} on doc "
           "embeddings):\n\n| index | queries without near-ties | of them, the project's exact "
           "top-10 | max score gap |\n|---|---|---|---|\n")
    md += "".join(f"| {b} | {check[b]['clear']} of {check[b]['queries']} | {check[b]['same_ids']} "
                  f"| {check[b]['max_score_diff']:.2e} |\n" for b in config.check.split("+"))
  return outputs.Report(results=results, markdown=md, folders={"export": writer})
