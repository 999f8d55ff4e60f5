"""The tasks of the fidelity experiments (paper 002): BM25 over the collection's tokens, the
claims task (queries of `data.split` against every document: margins, Fig. 2 triples, Fig. 3
length bins) and the containing-passage task (section 5). `fidelity_experiments` projects them."""
from __future__ import annotations


import dataclasses
from typing import Any

import numpy as np
import scipy.sparse as sp

from bilinear_ir.data import bm25 as bm25_lib
from bilinear_ir.data.collection import Collection
from bilinear_ir.errors import input_error
from bilinear_ir.fidelity import projections
from bilinear_ir.fidelity import theory

def _blocked(config, rows: sp.csr_matrix) -> projections.BlockedSparse:
  return projections.prepare(rows, int(config.k_grid[-1]), int(config.projection.block_size))


TIE = 1e-12  # normalized margins at or below this are ties


# ---------------------------------------------------------------------------------------------
# Exact (unprojected) side.


def tokenizer_of(config) -> bm25_lib.Tokenizer:
  t = config.tokenizer
  return bm25_lib.Tokenizer(kind=t.kind, stemmer=t.stemmer, model_dir=t.model_dir)


def bm25_of(config, tokenizer) -> bm25_lib.BM25:
  b = config.bm25
  return bm25_lib.BM25(k1=b.k1, b=b.b, variant=b.variant, epsilon=b.epsilon, tokenizer=tokenizer)


def first_argmax(scores: np.ndarray) -> np.ndarray:
  """[m, N] -> [m] column of the top score, lowest column on ties (np.argmax's rule)."""
  return np.argmax(scores, axis=1)


def min_positive(margins: np.ndarray) -> float | None:
  pos = margins[np.isfinite(margins) & (margins > TIE)]
  return float(pos.min()) if pos.size else None


@dataclasses.dataclass
class Bin:
  """Fig. 3 data of one document bin: its docs, the queries with a best doc in it."""
  label: str
  docs: np.ndarray  # [n] doc rows of the task
  queries: np.ndarray  # [m] query rows (those of the Fig. 3b subset with a positive best score)
  targets: np.ndarray  # [m] position of d1 inside `docs`
  margins: dict[int, list[float]]  # rank r -> r-th smallest margin, one per query (Fig. 3a)
  hits: np.ndarray | None = None  # [m, G] summed over trials


def make_bin(label: str, docs: np.ndarray, qv, dv, scores: np.ndarray, fig3_queries: np.ndarray,
         ranks) -> Bin:
  """Margins of each query's best doc in `docs` over the others (Fig. 3a), Fig. 3b queries."""
  sub = scores[:, docs]  # [Q, n]
  valid = np.flatnonzero(sub.max(axis=1) > 0)
  targets = first_argmax(sub)
  margins: dict[int, list[float]] = {int(r): [] for r in ranks}
  if valid.size:
    m = theory.normalized_margins(qv[valid], dv[docs], targets[valid], scores=sub[valid])
    for row in m:
      vals = np.sort(row[np.isfinite(row)])
      for r in margins:
        if vals.size >= r:
          margins[r].append(float(vals[r - 1]))
  chosen = np.intersect1d(valid, fig3_queries)
  return Bin(label, docs, chosen, targets[chosen], margins)


@dataclasses.dataclass
class Task:
  """Sparse rows projected together in each of `trials` trials (queries first, then docs).

  Either Fig. 2 triples (`pairs`: rows of q, d1, d2) or Fig. 3 bins (`bins`, whose query and
  doc indices are rows of the task's queries and docs).
  """
  name: str
  blocked: projections.BlockedSparse
  num_queries: int
  trials: int
  bins: list[Bin] = dataclasses.field(default_factory=list)
  pairs: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None


def claims_task(config, collection: Collection, tokenizer, rng
            ) -> tuple[list[Task], dict[str, Any]]:
  """The claims tasks (Fig. 2 triples, Fig. 3 bins) and exact margins, min margins."""
  tokens = tokenizer(collection.doc_strings())
  bm25 = bm25_of(config, tokenizer).fit_tokens(tokens)
  qids = collection.split_query_ids(config.data.split)
  texts = [collection.queries[q] for q in qids]
  qv = bm25.query_vectors(texts)
  dv = bm25.doc_vectors
  scores = np.asarray((qv @ dv.T).todense())
  keep = np.flatnonzero(scores.max(axis=1) > 0)
  if keep.size == 0:
    raise input_error(f"no query of split {config.data.split!r} shares a term with the documents",
                      file=collection.source, field="queries")
  qv, scores = qv[keep], scores[keep]
  d1 = first_argmax(scores)
  margins = theory.normalized_margins(qv, dv, d1, scores=scores)  # [Q, N]

  boolean = bm25_lib.Boolean(tokenizer).fit_tokens(tokens)
  bq = boolean.query_vectors(texts)
  bscores = np.asarray((bq @ boolean.doc_vectors.T).todense())
  bkeep = np.flatnonzero(bscores.max(axis=1) > 0)
  bmargins = theory.normalized_margins(bq[bkeep], boolean.doc_vectors,
                                       first_argmax(bscores[bkeep]), scores=bscores[bkeep])

  # Fig. 2 triples, sampled per x bin; projected rows: their queries, then their docs.
  pos = np.isfinite(margins) & (margins > TIE)
  qi, d2 = np.nonzero(pos)
  eps = margins[qi, d2]
  x = theory.inverse_margin_term(eps)
  edges = np.linspace(0.0, config.fig2.x_max, config.fig2.num_bins + 1)
  which = np.digitize(x, edges[1:-1], right=True)
  inside = x <= config.fig2.x_max
  chosen = []
  for b in range(config.fig2.num_bins):
    cand = np.flatnonzero(inside & (which == b))
    take = min(config.fig2.triples_per_bin, cand.size)
    chosen.append(np.sort(rng.choice(cand, size=take, replace=False)))
  chosen = np.concatenate(chosen).astype(np.int64)
  triples = {"q": qi[chosen], "d1": d1[qi[chosen]], "d2": d2[chosen], "eps": eps[chosen],
             "x": x[chosen], "bin": which[chosen], "edges": edges,
             "candidates": int(pos.sum()), "candidates_in_range": int(inside.sum())}
  uq = np.unique(triples["q"])
  ud = np.unique(np.concatenate([triples["d1"], triples["d2"]]))
  pairs = (np.searchsorted(uq, triples["q"]), len(uq) + np.searchsorted(ud, triples["d1"]),
           len(uq) + np.searchsorted(ud, triples["d2"]))
  pair_task = Task("claims_pairs", _blocked(config, sp.vstack([qv[uq], dv[ud]]).tocsr()),
                    len(uq), int(config.trials), pairs=pairs)

  # Fig. 3 bins by document length (equal counts, shorter docs first); rows: the Fig. 3b
  # queries, then every doc.
  order = np.argsort(bm25.doc_lengths, kind="stable")
  fig3_queries = np.sort(rng.permutation(len(keep))[:config.fig3.queries])
  bins = []
  for part in np.array_split(order, config.fig3.doc_bins):
    if part.size == 0:
      continue
    lengths = bm25.doc_lengths[part]
    b = make_bin(f"{int(lengths.min())}-{int(lengths.max())}", np.sort(part), qv, dv, scores,
             fig3_queries, config.fig3.ranks)
    b.queries = np.searchsorted(fig3_queries, b.queries)
    bins.append(b)
  bin_task = Task("claims_bins", _blocked(config, sp.vstack([qv[fig3_queries], dv]).tocsr()),
                   len(fig3_queries), int(config.fig3.trials), bins=bins)
  info = {"queries": int(len(keep)), "docs": int(dv.shape[0]), "vocab": bm25.vocab_size,
          "min_margin": {"bm25": min_positive(margins), "boolean": min_positive(bmargins)},
          "triples": triples}
  return [pair_task, bin_task], info


def passage_task(config, collection: Collection, tokenizer, length: int, doc_sample: np.ndarray,
                  rng) -> tuple[Task, dict[str, Any]]:
  """The containing-passage collection D_l and its sub-sequence queries."""
  p = config.passages
  texts = collection.doc_strings()
  passages = []
  for i in doc_sample:
    words = texts[i].split()
    passages.extend(words[s:s + length] for s in range(0, len(words), length))
  bm25 = bm25_of(config, tokenizer).fit([" ".join(w) for w in passages])
  long_enough = np.flatnonzero([len(w) >= p.min_words for w in passages])
  if long_enough.size == 0:
    raise input_error(f"no passage of {p.min_words}+ words", file=collection.source,
                      field="passages.min_words")
  sources = rng.choice(long_enough, size=p.queries, replace=True)
  queries = []
  for s in sources:
    words = passages[s]
    n = int(rng.integers(p.min_words, min(p.max_words, len(words)) + 1))
    start = int(rng.integers(0, len(words) - n + 1))
    queries.append(" ".join(words[start:start + n]))
  qv = bm25.query_vectors(queries)
  scores = np.asarray((qv @ bm25.doc_vectors.T).todense())
  keep = np.flatnonzero(scores.max(axis=1) > 0)
  qv, scores, sources = qv[keep], scores[keep], sources[keep]
  src = scores[np.arange(len(keep)), sources][:, None]
  idx = np.arange(scores.shape[1])[None, :]
  rank = np.sum((scores > src) | ((scores == src) & (idx < sources[:, None])), axis=1)
  mrr10 = float(np.mean(np.where(rank < 10, 1.0 / (rank + 1), 0.0))) if len(keep) else None
  docs = np.arange(bm25.num_docs)
  bins = [make_bin(f"l={length}", docs, qv, bm25.doc_vectors, scores, np.arange(len(keep)),
               config.fig3.ranks)] if len(keep) else []
  rows = sp.vstack([qv, bm25.doc_vectors]).tocsr()
  info = {"l": int(length), "passages": int(bm25.num_docs), "queries": int(len(keep)),
          "vocab": bm25.vocab_size, "bm25_mrr10": mrr10}
  return Task(f"passages_l{length}", _blocked(config, rows), qv.shape[0],
               int(config.fig3.trials), bins=bins), info
