"""The setting every row of a late-interaction table is evaluated on, and a row's scores in it.

`build_setting` loads the collection, the pooled and token embeddings, BM25, the splits, the
candidates of each dev and test query and the test queries' own pools; `Setting.score` re-ranks
the dev and test candidates with one scorer (`Scored`); `curve_settings` gives one setting per
training-set size of the learning curve (`studies.curve_subsets`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import ml_collections
import numpy as np

from bilinear_ir.data import embeddings as embeddings_lib
from bilinear_ir.data import pipeline
from bilinear_ir.errors import require
from bilinear_ir.experiment import evaluate
from bilinear_ir.retrieval import candidates as candidates_lib
from bilinear_ir.retrieval import ranking
from bilinear_ir.scorers import token_interaction
from bilinear_ir.studies import curve_subsets

SPLITS = ("dev", "test")


@dataclasses.dataclass
class Scored:
  """A dense system's re-ranking of the dev and test candidates.

  Attributes:
    run: {"dev", "test"} -> (idx [Q_s, K], scores [Q_s, K]) sorted.
    dev: dev metrics; test: test metrics {"mean", "per_query"}.
    latency_fn: the timed call of 1 query x `latency.docs` stored docs.
    stored: (vectors, width) stored per doc.
    pool: [Q_test, M] scores of each test query's own pool (`Setting.pools`, pool order), or
      None without pools.
  """
  run: dict[str, tuple[np.ndarray, np.ndarray]]
  dev: dict[str, float]
  test: dict[str, Any]
  latency_fn: Callable[[], Any] | None = None
  stored: tuple[int, int] | None = None
  pool: np.ndarray | None = None

@dataclasses.dataclass
class Setting:
  """What every row of the table is evaluated on.

  Attributes:
    prepared: collection, pooled embeddings, BM25 rankings and model.
    splitset: train / dev / test.
    tokens: token-level embeddings (queries [Q, Tq, n], docs [N, Td, n], float16 + masks);
      the docs and their mask are one device array each (`build_setting`), which training and
      every re-ranking read without copying them again.
    rows: {"dev", "test"} -> [Q_s] query rows (of `prepared.embeddings.query_ids`).
    cands: {"dev", "test"} -> [Q_s, K] candidates (`candidates.rerank_candidates`).
    bm25: {"dev", "test"} -> [Q_s, K] exact BM25 scores of the candidates.
    measures: reported measures.
    pools: [Q_test, M] each test query's own pool (`evaluate.candidate_pools`: its gold docs
      and the negatives the collection lists for it), or None when the collection lists none.
    seed: the seed of the candidates' random docs (`config.seed`).
  """
  prepared: pipeline.Prepared
  splitset: pipeline.SplitSet
  tokens: embeddings_lib.TokenEmbeddings
  rows: dict[str, np.ndarray]
  cands: dict[str, np.ndarray]
  bm25: dict[str, np.ndarray]
  measures: tuple[str, ...]
  pools: np.ndarray | None = None
  seed: int = 0

  def split(self, name: str) -> pipeline.Split:
    return getattr(self.splitset, name)

  def token_queries(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """([Q, Tq, n], [Q, Tq]) query tokens of query rows."""
    return self.tokens.queries[rows], self.tokens.query_mask[rows]

  @property
  def token_docs(self) -> tuple[np.ndarray, np.ndarray]:
    """([N, Td, n], [N, Td]) doc tokens."""
    return self.tokens.docs, self.tokens.doc_mask

  def pooled_queries(self, rows: np.ndarray) -> np.ndarray:
    """[Q, n] pooled query embeddings of query rows."""
    return self.prepared.embeddings.queries[rows]

  def evaluate(self, split: str, idx: np.ndarray, scores: np.ndarray,
               measures: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Metrics {"mean", "per_query"} of a sorted run [Q_s, K] of `split`."""
    s = self.split(split)
    return evaluate.evaluate_run(s.query_ids, self.prepared.collection.doc_ids, idx, scores,
                                 s.qrels, measures or self.measures)[0]

  def eval_module(self, module):
    """The scorer for re-ranking: late-interaction scorers score all K candidates of a query in
    one chunk (`doc_chunk = K`; [1, K, Tq, L2'] intermediates), training keeps the module's own."""
    if isinstance(module, token_interaction.LateInteraction):
      return module.clone(doc_chunk=int(self.cands["test"].shape[1]))
    return module

  def rerank(self, split: str, module, params, feats: Callable[[np.ndarray], Any], d_feats: Any,
             measures: tuple[str, ...] | None = None, doc_rows: np.ndarray | None = None
             ) -> tuple[tuple, dict[str, Any]]:
    """((idx, scores) [Q_s, K] sorted, metrics) of `split`'s candidates re-ranked by
    (module, params); `feats`: query rows [Q] -> query features, `d_feats`: [N, ...], or with
    `doc_rows` (ascending doc rows [U] holding every candidate) the features of those docs only,
    [U, ...] (e.g. re-encoded by a fine-tuned encoder): the same ranking as from all N."""
    idx, scores = _rerank_rows(module, params, feats(self.rows[split]), d_feats,
                               self.cands[split], doc_rows)
    return (idx, scores), self.evaluate(split, idx, scores, measures)

  def score(self, module, params, feats: Callable[[np.ndarray], Any], d_feats: Any,
            latency_fn: Callable[[], Any] | None = None,
            stored: tuple[int, int] | None = None, doc_rows: np.ndarray | None = None) -> Scored:
    """Re-ranks the dev and test candidates with (module, params) and evaluates them
    (`latency_fn`, `stored`: kept in the result, see `Scored`; `doc_rows`: as `rerank`, holding
    every candidate and pool doc, `candidate_rows`); with `pools`, also each test query's own
    pool (`pool_scores`), its P@1 as the test metric "p_at_1_pool"."""
    run, metrics = {}, {}
    for split in SPLITS:
      run[split], metrics[split] = self.rerank(split, module, params, feats, d_feats,
                                               doc_rows=doc_rows)
    pool = None
    if self.pools is not None:
      pool = self.pool_scores(module, params, feats, d_feats, doc_rows)
      metrics["test"]["mean"]["p_at_1_pool"] = evaluate.PoolEvaluator(
          self.prepared, self.split("test"), self.pools)(1.0, pool_scores=pool)["mean"]
    return Scored(run, metrics["dev"]["mean"], metrics["test"], latency_fn, stored, pool)

  def pool_scores(self, module, params, feats: Callable[[np.ndarray], Any], d_feats: Any,
                  doc_rows: np.ndarray | None = None) -> np.ndarray:
    """[Q_test, M] scores of each test query's own pool (`pools`, -inf on padding), in pool
    order: re-ranked by the code that re-ranks the candidates (`retrieval.ranking.rerank`), then
    put back in the pool's ascending doc-row order (`doc_rows`: as `rerank`)."""
    idx, scores = _rerank_rows(module, params, feats(self.rows["test"]), d_feats, self.pools,
                               doc_rows)
    order = np.argsort(np.where(idx < 0, np.iinfo(np.int64).max, idx), axis=1, kind="stable")
    return np.take_along_axis(scores, order, 1)

  def candidate_rows(self, splits: tuple[str, ...] = SPLITS) -> np.ndarray:
    """[U] ascending doc rows of every candidate of `splits` (and, with "test", of every test
    pool): the docs a re-ranking of those splits reads."""
    parts = [self.cands[s].ravel() for s in splits]
    if "test" in splits and self.pools is not None:
      parts.append(self.pools.ravel())
    rows = np.unique(np.concatenate(parts))
    return rows[rows >= 0]

  def describe(self, rerank_cfg, query_len: int, doc_len: int) -> dict[str, Any]:
    """The setting as results state it: {"candidates": how they were drawn and the share of
    each split's judged positives among them (`candidates.candidate_recall`), whether any
    judged positive is a candidate the draw did not give (`candidates.injected_positives`
    against `candidates.rerank_candidates` redrawn), "tokens": Tq, Td,
    the pooled embeddings' max length, n, the share of docs filling all Td slots (cut)}."""
    doc_ids = self.prepared.collection.doc_ids
    return {
        "candidates": {"bm25_depth": int(rerank_cfg.bm25_depth),
                       "random_docs": int(rerank_cfg.random_docs),
                       "positives_injected": any(candidates_lib.injected_positives(
                           self.cands[s], candidates_lib.rerank_candidates(
                               self.prepared.bm25_idx, self.rows[s], len(doc_ids),
                               rerank_cfg.bm25_depth, rerank_cfg.random_docs, self.seed),
                           self.split(s).query_ids, doc_ids, self.split(s).qrels)
                                             for s in SPLITS),
                       "recall": {s: candidates_lib.candidate_recall(
                           self.cands[s], self.split(s).query_ids, doc_ids, self.split(s).qrels)
                                  for s in SPLITS}},
        "tokens": {"query_len": query_len, "doc_len": doc_len,
                   "pooled_max_length": self.prepared.embeddings.manifest["settings"]["max_length"],
                   "dim": int(self.tokens.docs.shape[-1]),
                   "doc_tokens_truncated": float(np.mean(self.tokens.doc_mask[:, -1]))}}

def _rerank_rows(module, params, q_feats: Any, d_feats: Any, cands: np.ndarray,
                 doc_rows: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
  """`retrieval.ranking.rerank` of candidates [Q, K] (doc rows, -1 = none) whose features are
  `d_feats` [N, ...], or [U, ...] of the ascending `doc_rows` [U] only: the candidates are looked
  up there and the sorted idx [Q, K] mapped back to doc rows (ties still break by doc row: the
  lookup keeps the order)."""
  if doc_rows is None:
    return ranking.rerank(module, params, q_feats, d_feats, cands)
  pos = np.searchsorted(doc_rows, np.maximum(cands, 0))
  require(bool(np.all((cands < 0) | (doc_rows[np.minimum(pos, len(doc_rows) - 1)] == cands))),
          "a candidate is not among the re-encoded docs", field="doc_rows")
  idx, scores = ranking.rerank(module, params, q_feats, d_feats, np.where(cands < 0, -1, pos))
  return np.where(idx < 0, -1, doc_rows[np.maximum(idx, 0)]), scores

def build_setting(config: ml_collections.ConfigDict,
                  data: ml_collections.ConfigDict | None = None) -> Setting:
  """Loads the collection, pooled + token embeddings, BM25, splits, candidates and the test
  queries' own pools (`data` (default `config.data`), `encoder`, `bm25`, `rerank`, `seed` and
  `eval.measures` of `config`)."""
  data = config.data if data is None else data
  prepared = pipeline.prepare(ml_collections.ConfigDict(
      {"data": data, "encoder": config.encoder, "bm25": config.bm25}))
  splitset = pipeline.splits(prepared.collection, data, config.seed)[0]
  enc = config.encoder
  tokens = embeddings_lib.embed_collection_tokens(
      prepared.collection, enc, query_max_length=int(enc.query_max_length),
      doc_max_length=int(enc.doc_max_length) or None)
  assert tokens.query_ids == prepared.embeddings.query_ids
  # The doc tokens go to the device once (InsuranceQA: 2.7 GB): `fit`'s `device_put` and
  # `ranking.rerank`'s `jnp.asarray` of an array already there copy nothing, where each used to
  # make its own copy of the host array.
  tokens = dataclasses.replace(tokens, docs=jax.device_put(tokens.docs),
                               doc_mask=jax.device_put(tokens.doc_mask))
  rows, cands, bm25 = {}, {}, {}
  for name in SPLITS:
    r = prepared.query_row_index(getattr(splitset, name).query_ids)
    c = candidates_lib.rerank_candidates(prepared.bm25_idx, r, prepared.collection.num_docs,
                                         config.rerank.bm25_depth, config.rerank.random_docs,
                                         config.seed)
    safe = np.where(c < 0, 0, c)
    b = prepared.bm25_pair_scores(np.repeat(r, c.shape[1]), safe.reshape(-1)).reshape(c.shape)
    rows[name], cands[name], bm25[name] = r, c, np.where(c < 0, 0.0, b)
  return Setting(prepared, splitset, tokens, rows, cands, bm25, tuple(config.eval.measures),
                 evaluate.candidate_pools(prepared, splitset.test), int(config.seed))

def curve_settings(setting: Setting, sizes, seed: int) -> dict[int, Setting]:
  """{n: `setting` training on n queries}: the learning curve's nested subsets of the training
  split (`curve_subsets.nested_subsets` by `seed`, `curve_subsets.subset_splitset`: dev and test
  whole); empty
  `sizes` = the whole training split only."""
  train = setting.splitset.train.query_ids
  subsets = curve_subsets.nested_subsets(train, sizes or (len(train),), seed)
  return {n: dataclasses.replace(setting,
                                 splitset=curve_subsets.subset_splitset(setting.splitset, q, n))
          for n, q in subsets.items()}

def per_query(test: dict[str, Any], measure: str) -> dict[str, float]:
  """{qid: `measure`} of test metrics {"mean", "per_query"}."""
  return {q: float(v[measure]) for q, v in test["per_query"].items()}
