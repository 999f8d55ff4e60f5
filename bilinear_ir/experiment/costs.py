"""What a row costs at query time: what its index holds and the exact top-K search it runs.

    facts, doc_side = index_facts(module, params, docs)     # docs [N, n]: the raw embeddings
    project, served = search_fns(module, params, facts, doc_side, jnp.asarray(docs))
    ids = project(q)                                        # q [B, n] -> [B, K] doc rows

`index_facts` reads the index off the arrays the scorer builds: "raw" when the row is served
from the raw doc embeddings (the query-side form, `export.sentence_transformers.query_side_layers`:
dot, wdp, bilinear, residual low-rank, the adapter), "doc table" when its own doc table is
narrower than the raw embedding (pure P Q^T), "MoL tables" (`mol_topk.MolIndex`). `search_fns`
gives the project's exact search (`retrieval.ranking.score_topk`'s path: the jitted query table
then `exact.topk` over the precomputed doc table; MoL: `mol_topk.brute_force` over its index)
and, where the row is served raw and its project table differs from the raw docs, the query-side
search over them. benchmarks/row_costs.py times them on random embeddings; `measure` times them
for the trained params of a table over the real embeddings, BM25 beside them, and `table_costs`
gives every row of a finetune table its cost (index, re-encode, bytes per doc, latency).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from bilinear_ir import timing
from bilinear_ir.errors import InputError
from bilinear_ir.export import sentence_transformers
from bilinear_ir.retrieval import exact
from bilinear_ir.retrieval import mol_topk
from bilinear_ir.scorers.adapter import QueryAdapter
from bilinear_ir.scorers.base import TableScorer

K = 10  # the top-K every search returns


def query_side_fn(module, params) -> Callable | None:
  """q [B, n] -> [B, n] of the row's query-side form over the raw docs, or None where there is
  none (`sentence_transformers.query_side_layers`: the adapter, or a linear table scorer)."""
  if isinstance(module, QueryAdapter):
    return jax.jit(lambda q: module.apply({"params": params}, q, method=module.query_table))
  try:
    (layer,) = sentence_transformers.query_side_layers(module, params)
  except InputError:
    return None
  m = jnp.asarray(layer.weight)
  return jax.jit(lambda q: q @ m)


def index_facts(module, params, docs: np.ndarray) -> tuple[dict[str, Any], Any]:
  """What the index of a row holds, from the arrays the scorer builds over `docs` [N, n]:
  ({index, doc_arrays {name: shape}, extra_bytes_per_doc, raw_bytes_per_doc, query_side},
  the searched doc side: a [N, w] doc table or a `mol_topk.MolIndex`).

  `extra_bytes_per_doc`: 0 for "raw", else the nbytes of the doc-side arrays the scorer builds
  (its doc table, or the MolIndex's item components and TopKAvg table; a residual MoL's raw docs
  are the index already there) divided by N; `raw_bytes_per_doc`: the raw embedding's n x 4."""
  n_docs, dim = docs.shape
  raw = {"raw_bytes_per_doc": dim * docs.dtype.itemsize}
  if isinstance(module, TableScorer):
    table = jax.block_until_ready(jax.jit(lambda d: module.apply(
        {"params": params}, d, method=module.doc_table))(docs))
    fold = query_side_fn(module, params) is not None
    if isinstance(module, QueryAdapter) and not np.array_equal(np.asarray(table), docs):
      raise AssertionError("the adapter's doc table is not the raw docs")
    served_raw = fold and table.shape[1] >= dim
    return {"index": "raw" if served_raw else "doc table",
            "doc_arrays": {"doc_table": list(table.shape)},
            "extra_bytes_per_doc": 0.0 if served_raw else table.nbytes / n_docs,
            "query_side": fold, **raw}, table
  index = jax.block_until_ready(mol_topk.build_index(module, params, docs))
  new = {"items": index.items, "avg": index.avg}  # index.docs: the raw docs, already indexed
  return {"index": "MoL tables", "doc_arrays": {k: list(v.shape) for k, v in new.items()},
          "extra_bytes_per_doc": sum(v.nbytes for v in new.values()) / n_docs,
          "query_side": False, **raw}, index


def search_fns(module, params, facts: dict[str, Any], doc_side, docs: jnp.ndarray
               ) -> tuple[Callable, Callable | None]:
  """(the project's exact top-K search of q [B, n] -> ids [B, K], the query-side search over
  the raw docs [N, n] where the row is served from them (`index_facts`) and its project table
  differs from them, else None)."""
  v = {"params": params}
  if isinstance(module, TableScorer):
    qt = jax.jit(lambda q: module.apply(v, q, method=module.query_table))
    project = lambda q: exact.topk(qt(q), doc_side, K).ids
    if facts["index"] != "raw" or (
        doc_side.shape == docs.shape and bool(jnp.array_equal(doc_side, docs))):
      return project, None
    fold = query_side_fn(module, params)
    return project, lambda q: exact.topk(fold(q), docs, K).ids
  qc = jax.jit(lambda q: module.apply(v, q, method=module.query_components))
  residual = module.residual == "dot"
  return (lambda q: mol_topk.brute_force(mol_topk.MolSource(
      qc(q), doc_side, params, module, q if residual else None), K).ids), None


def sparse_bytes_per_doc(model) -> float:
  """Bytes per doc of a fitted sparse model's doc vectors (`data.bm25.SparseModel.doc_vectors`,
  CSR [N, V]: its values, column indices and row pointers), as an inverted index holds them."""
  m = model.doc_vectors
  return (m.data.nbytes + m.indices.nbytes + m.indptr.nbytes) / m.shape[0]


def measure(dense: Mapping[str, tuple[Any, Any]], docs: np.ndarray, queries: np.ndarray,
            bm25=None, texts: Sequence[str] = (), repeats: int = 10) -> dict[str, dict[str, Any]]:
  """Each dense row's index facts and search latency, and BM25's, timed in the same rounds.

  Args:
    dense: {row name: (scorer module, params)}.
    docs: [N, n] the raw doc embeddings; queries: [B, n] the timed batch.
    bm25: a fitted `data.bm25.SparseModel` (None: no BM25 entry); texts: the [B] query texts
      it searches (its time includes their tokenization).
    repeats: interleaved rounds (`timing.timed_interleaved`; the median is kept).

  Returns:
    {row name: `index_facts`' facts + "ms_per_query" (the project's search: the call / B),
    "served_ms_per_query" (the query-side search over the raw docs where it differs, else the
    same)}; with `bm25`, "bm25": {"index": "bm25", "extra_bytes_per_doc" (its sparse doc
    vectors), "raw_bytes_per_doc", "query_side": False, "ms_per_query", "served_ms_per_query"}.
  """
  out, fns = {}, {}
  on_device = jnp.asarray(docs)
  for name, (module, params) in dense.items():
    facts, doc_side = index_facts(module, params, docs)
    project, served = search_fns(module, params, facts, doc_side, on_device)
    out[name], fns[name] = facts, project
    if served is not None:
      fns[f"{name}@served"] = served
  q = jnp.asarray(queries)
  calls = {name: (lambda f=f: f(q)) for name, f in fns.items()}
  if bm25 is not None:
    calls["bm25"] = lambda: bm25.topk(list(texts), K)
    out["bm25"] = {"index": "bm25", "extra_bytes_per_doc": sparse_bytes_per_doc(bm25),
                   "raw_bytes_per_doc": docs.shape[1] * docs.dtype.itemsize,
                   "query_side": False}
  ms = timing.timed_interleaved(calls, repeats, warmup=1, rewarm=1)
  for name, facts in out.items():
    facts["ms_per_query"] = ms[name] / len(queries)
    facts["served_ms_per_query"] = ms.get(f"{name}@served", ms[name]) / len(queries)
  return out


def table_costs(config, cell, runs: Mapping[str, Any], finetunes: Mapping[str, dict[str, Any]]
                ) -> dict[str, dict[str, Any]]:
  """{row name: cost} of a finetune table's rows in one cell (`experiment.table.Cell` and its
  {row name: `Runs`}) and of its fine-tune rows ({mode: row}, `finetuning.finetune_row`).

  A cost: {"index" ("raw": the unchanged index of the frozen doc embeddings, served through the
  query-side form where the row transforms the query; "doc table" / "MoL tables": the row's own
  doc arrays; "new": a new index of re-encoded docs; "bm25": the sparse index; "raw + bm25"),
  "index_changes", "query_side", "extra_bytes_per_doc" (beyond the raw index; "new": the n x 4
  bytes of its replacement), "raw_bytes_per_doc", "reencode_seconds" (the corpus encode a new
  index needs; 0 where the index stays), "ms_per_query", "served_ms_per_query"}, from `measure`
  over the first `config.latency.batch` test queries: the scorer of the first seed's fit (the
  dev-best row: its first seed's choice); a hybrid: its dense partner's plus BM25's (indexes and
  searches; the fusion of their two candidate lists not timed); a fine-tune: the dot product's
  search (the query tower's docs are the frozen ones; the two towers' a new table of the same
  shape).
  """
  prepared, test = cell.prepared, cell.splitsets[0].test
  qids = list(test.query_ids)[:int(config.latency.batch)]
  dense = {name: (r.outs[0]["module"], r.outs[0]["params"]) for name, r in runs.items()
           if r.spec["type"] in ("dot", "trained", "dev_best")}
  sparse = any(r.spec["type"] in ("bm25", "hybrid") for r in runs.values())
  got = measure(dense, prepared.embeddings.docs,
                prepared.embeddings.queries[prepared.query_row_index(qids)],
                prepared.bm25 if sparse else None,
                [prepared.collection.queries[q] for q in qids], int(config.latency.repeats))
  out = {}
  for name, r in runs.items():
    kind = r.spec["type"]
    if kind == "hybrid":
      dense_cost, bm25 = got[r.spec["partner"]], got["bm25"]
      cost = {**dense_cost, "index": f"{dense_cost['index']} + bm25", "query_side": False,
              **{k: dense_cost[k] + bm25[k] for k in ("extra_bytes_per_doc", "ms_per_query",
                                                       "served_ms_per_query")}}
    else:
      cost = dict(got["bm25" if kind == "bm25" else name])
    cost.pop("doc_arrays", None)
    if kind == "dot":
      cost["query_side"] = False  # the identity: nothing to fold
    out[name] = {**cost, "index_changes": cost["index"] != "raw", "reencode_seconds": 0.0}
  dot = next(out[name] for name, r in runs.items() if r.spec["type"] == "dot")
  for mode, row in finetunes.items():
    if mode == "query_tower":
      out[mode] = dict(dot)
    else:
      out[mode] = {**dot, "index": "new", "index_changes": True,
                   "extra_bytes_per_doc": float(dot["raw_bytes_per_doc"]),
                   "reencode_seconds": row["finetune"]["reindex_seconds"]}
  return out
