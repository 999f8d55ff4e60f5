"""Rank a collection's queries with a trained scorer: the whole corpus or given candidates.

`score_topk` ranks the whole corpus (exact top-k through the scorer's tables when it has them;
for MoL, the jitted exact scan over its precomputed item components, `mol_topk.brute_force`;
chunked brute force through `score_all` otherwise); `pair_scores` scores given (query, doc)
pairs; `rerank` re-scores given candidates per query (e.g. BM25's top 1,000, as the bilinear
paper's public code does). Evaluating a ranking is the experiment protocol's
(`bilinear_ir.experiment.evaluate`).
"""
from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bilinear_ir.retrieval import exact
from bilinear_ir.retrieval import mol_topk
from bilinear_ir.scorers.base import TableScorer
from bilinear_ir.scorers.mol import Mol


def _as_tuple(feats: Any) -> tuple:
  return feats if isinstance(feats, tuple) else (feats,)


def _rows(feats: Any, start: int, stop: int) -> tuple:
  return tuple(x[start:stop] for x in _as_tuple(feats))


def _num_rows(feats: Any) -> int:
  return _as_tuple(feats)[0].shape[0]


MOL_QUERY_CHUNK = 128  # queries per `mol_topk.brute_force` call in `score_topk`
RERANK_QUERY_CHUNK = 64  # queries per compiled call of `rerank`
BLOCK_BYTES = 1 << 28  # scratch memory of one score_all block of a table-less scorer (256 MiB)
_PROBE = (8, 256)  # (queries, docs) of the block compiled to measure a scorer's bytes per pair
_bytes_per_pair_cache: dict[tuple, float] = {}


@functools.partial(jax.jit, static_argnames=("module",))
def _score_block(params: Any, q: tuple, d: tuple, *, module: nn.Module) -> jnp.ndarray:
  """score_all of one block: q ([B, ...],) and d ([C, ...],) feature tuples -> [B, C].

  Module-level and keyed on the (hashable) module, so repeated evaluations of one model (dev
  evaluation during training, several seeds) reuse the compiled block.
  """
  return module.apply({"params": params}, *q, *d, method=module.score_all)


@functools.partial(jax.jit, static_argnames=("module",))
def _score_pairs(params: Any, q: tuple, d: tuple, *, module: nn.Module) -> jnp.ndarray:
  """score_pairs: q ([B, ...],) and d ([B, ...],) feature tuples -> [B]; compiled once per
  module and shape (params are an argument)."""
  return module.apply({"params": params}, *q, *d, method=module.score_pairs)


def pair_scores(module: nn.Module, params: Any, q_feats: Any, d_feats: Any) -> np.ndarray:
  """Scores of paired rows: q_feats [B, ...] and d_feats [B, ...] -> [B] (row i with row i)."""
  return np.asarray(_score_pairs(params, _as_tuple(q_feats), _as_tuple(d_feats), module=module))


def _spec(feats: Any, rows: int) -> tuple:
  return tuple(jax.ShapeDtypeStruct((rows,) + tuple(x.shape[1:]), x.dtype)
               for x in _as_tuple(feats))


def bytes_per_pair(module: nn.Module, params: Any, q_feats: Any, d_feats: Any) -> float:
  """Scratch bytes XLA allocates per (query, doc) pair in `score_all` (e.g. MoL's [B, N, P]
  logits and [B, N, gate_hidden] gate activations), from the compiled memory analysis of one
  `_PROBE` block; cached per module and feature shapes. 0 when the backend reports none."""
  key = (module, _spec(q_feats, 0), _spec(d_feats, 0))
  if key not in _bytes_per_pair_cache:
    nq, nd = _PROBE
    p_spec = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
    compiled = _score_block.lower(p_spec, _spec(q_feats, nq), _spec(d_feats, nd),
                                  module=module).compile()
    try:
      analysis = compiled.memory_analysis()
    except NotImplementedError:  # a backend without memory analysis: keep the asked chunks
      analysis = None
    temp = getattr(analysis, "temp_size_in_bytes", 0) if analysis is not None else 0
    _bytes_per_pair_cache[key] = float(temp) / (nq * nd)
  return _bytes_per_pair_cache[key]


def block_chunks(module: nn.Module, params: Any, q_feats: Any, d_feats: Any, query_chunk: int,
                 doc_chunk: int, block_bytes: int = BLOCK_BYTES) -> tuple[int, int]:
  """(query_chunk, doc_chunk) no larger than asked, with one block within `block_bytes`.

  The doc chunk is kept as long as possible (fewer top-k merges) and the query chunk shrinks
  first; a doc chunk alone over budget shrinks too (never below one row).
  """
  n_q, n_d = max(_num_rows(q_feats), 1), max(_num_rows(d_feats), 1)
  query_chunk, doc_chunk = min(query_chunk, n_q), min(doc_chunk, n_d)
  per_pair = bytes_per_pair(module, params, q_feats, d_feats)
  if per_pair <= 0:
    return query_chunk, doc_chunk
  pairs = max(int(block_bytes // per_pair), 1)
  doc_chunk = min(doc_chunk, pairs)
  return min(query_chunk, max(pairs // doc_chunk, 1)), doc_chunk


def score_topk(module: nn.Module, params: Any, q_feats: Any, d_feats: Any, k: int,
               doc_chunk: int = 8192, query_chunk: int = 1024,
               block_bytes: int = BLOCK_BYTES) -> tuple[np.ndarray, np.ndarray]:
  """Exact top-k of every query over the whole corpus.

  Args:
    module, params: a scorer and its params.
    q_feats: [Q, ...] query features (an array or a tuple such as (tokens, mask)).
    d_feats: [N, ...] doc features.
    k: how many docs per query (clipped to N).
    doc_chunk, query_chunk: the largest blocks scored at once.
    block_bytes: table-less scorers only: the chunks shrink until one [query_chunk, doc_chunk]
      block of `score_all` needs at most this much scratch memory (`block_chunks`).

  Returns:
    (idx [Q, k] int doc rows, scores [Q, k] float32), best first, ties to the lower doc row.
  """
  variables = {"params": params}
  n_docs = _num_rows(d_feats)
  k = min(k, n_docs)
  if isinstance(module, TableScorer):
    dt = jnp.concatenate([module.apply(variables, *_rows(d_feats, s, s + doc_chunk),
                                       method=module.doc_table)
                          for s in range(0, n_docs, doc_chunk)])
    qt = module.apply(variables, *_as_tuple(q_feats), method=module.query_table)
    res = exact.topk(qt, dt, k)
    return np.asarray(res.ids), np.asarray(res.scores)
  if isinstance(module, Mol):
    # Item components once; each query batch then runs the jitted exact scan of mol_topk.
    index = mol_topk.build_index(module, params, *_as_tuple(d_feats), chunk=doc_chunk)
    qc = module.apply(variables, *_as_tuple(q_feats), method=module.query_components)
    raw = _as_tuple(q_feats)[0] if module.residual == "dot" else None  # the residual's dot logit
    outs = [mol_topk.brute_force(mol_topk.MolSource(
        qc[s:s + MOL_QUERY_CHUNK], index, params, module,
        None if raw is None else jnp.asarray(raw[s:s + MOL_QUERY_CHUNK], jnp.float32)), k)
            for s in range(0, qc.shape[0], MOL_QUERY_CHUNK)]
    if not outs:
      return np.zeros((0, k), np.int64), np.zeros((0, k), np.float32)
    return (np.concatenate([np.asarray(o.ids) for o in outs]),
            np.concatenate([np.asarray(o.scores) for o in outs]))
  # No tables (late interaction): score doc chunks and keep a running top-k, so memory is
  # bounded by one [query_chunk, doc_chunk] block, sized to `block_bytes`.
  query_chunk, doc_chunk = block_chunks(module, params, q_feats, d_feats, query_chunk,
                                        doc_chunk, block_bytes)
  out_idx, out_scores = [], []
  for qs in range(0, _num_rows(q_feats), query_chunk):
    q = _rows(q_feats, qs, qs + query_chunk)
    best = None
    for s in range(0, n_docs, doc_chunk):
      scores = _score_block(params, q, _rows(d_feats, s, s + doc_chunk), module=module)
      ids = jnp.broadcast_to(jnp.arange(s, s + scores.shape[1], dtype=jnp.int32), scores.shape)
      if best is not None:
        scores = jnp.concatenate([best.scores, scores], axis=1)
        ids = jnp.concatenate([best.ids, ids], axis=1)
      best = exact.merge(scores, ids, k)
    out_idx.append(np.asarray(best.ids))
    out_scores.append(np.asarray(best.scores))
  return np.concatenate(out_idx), np.concatenate(out_scores)


@functools.partial(jax.jit, static_argnames=("module",))
def _rerank_chunk(params: Any, q: tuple, d: tuple, cands: jnp.ndarray, *, module: nn.Module
                  ) -> jnp.ndarray:
  """Each of Qc queries against its own K candidates, gathered on the device: q ([Qc, ...],),
  d ([N, ...],), cands [Qc, K] doc rows (>= 0) -> [Qc, K].

  One query at a time (`lax.map`): memory is that of one [1, K] `score_all` block, and a chunk
  of queries is one compiled call, not one dispatch (and two gathers) per query.
  """

  def one(args):
    qi, ci = args
    return module.apply({"params": params}, *(x[None] for x in qi), *(x[ci] for x in d),
                        method=module.score_all)[0]

  return jax.lax.map(one, (q, cands))


def rerank(module: nn.Module, params: Any, q_feats: Any, d_feats: Any, candidates: np.ndarray,
           query_chunk: int = RERANK_QUERY_CHUNK) -> tuple[np.ndarray, np.ndarray]:
  """Re-scores each query's candidates and sorts them.

  Args:
    q_feats: query features [Q, ...] (or a tuple); d_feats: doc features [N, ...] (or a tuple).
    candidates: [Q, K] doc rows per query (-1 = none).
    query_chunk: queries per compiled call (`_rerank_chunk`; the last chunk is padded).

  Returns:
    (idx [Q, K], scores [Q, K]) best first; missing candidates last with score -inf.
  """
  candidates = np.asarray(candidates)
  safe = np.where(candidates < 0, 0, candidates).astype(np.int32)
  n = candidates.shape[0]
  if n and candidates.shape[1]:
    # The docs go to the device once; each chunk's candidates are gathered there and its
    # [Qc, K] scores stay on the device (no sync per chunk) until they all come back at the end.
    # One chunk size per call (compiled once per model and size: params are an argument).
    chunk = max(1, min(int(query_chunk), n))
    d_dev = tuple(jnp.asarray(x) for x in _as_tuple(d_feats))
    outs = []
    for s in range(0, n, chunk):
      rows = np.minimum(np.arange(s, s + chunk), n - 1)  # the last chunk repeats its last query
      q = tuple(x[rows] for x in _as_tuple(q_feats))
      outs.append(_rerank_chunk(params, q, d_dev, jnp.asarray(safe[rows]), module=module))
    scores = np.concatenate(jax.device_get(outs))[:n]
  else:
    scores = np.zeros(candidates.shape, np.float32)
  return sort_candidates(candidates, scores)


def sort_candidates(cands: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Each row by descending score, ties by doc row, -1 last with score -inf.

  Args:
    cands: [Q, K] doc rows per query (-1 = none).
    scores: [Q, K] their scores.

  Returns:
    (idx [Q, K], scores [Q, K] float32), sorted per row.
  """
  cands = np.asarray(cands)
  scores = np.where(cands < 0, -np.inf, scores).astype(np.float32)
  order = np.lexsort((cands, -scores), axis=1) if scores.size else np.zeros_like(cands)
  return np.take_along_axis(cands, order, 1), np.take_along_axis(scores, order, 1)
