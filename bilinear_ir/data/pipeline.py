"""The one path data takes into a training job: collection -> embeddings -> splits -> BM25.

`prepare(config)` loads the collection of `config.data`, its frozen-encoder embeddings
(`config.encoder`, cached on disk) and the BM25 ranking of every query (`config.bm25`); `splits`
cuts the judged queries into train / dev / test, or into K cross-validation folds. Jobs take these
plain arrays and dataclasses, never a loader's internals.
"""
from __future__ import annotations

import dataclasses
import itertools

import ml_collections
import numpy as np

from bilinear_ir.data import bm25
from bilinear_ir.data import collection as collection_lib
from bilinear_ir.data import embeddings as embeddings_lib
from bilinear_ir.data import ict
from bilinear_ir.data import loaders
from bilinear_ir.data import precomputed
from bilinear_ir.data.batches import TrainSet, hard_negative_pool
from bilinear_ir.errors import input_error
from bilinear_ir.errors import require

# `train.negatives_from`: where a query's hard-negative pool comes from (`trainset`).
NEGATIVE_SOURCES = ("bm25", "dataset")


@dataclasses.dataclass
class Split:
  """Queries of one evaluation role and their judgements.

  Attributes:
    name: "train", "dev", "test" or "fold{k}-..." names.
    query_ids: [Q_s] sorted query ids.
    qrels: {qid: {doc_id: rel}} restricted to those queries.
  """
  name: str
  query_ids: list[str]
  qrels: dict[str, dict[str, int]]


@dataclasses.dataclass
class SplitSet:
  """One train / dev / test assignment (one fold under cross-validation)."""
  name: str
  train: Split
  dev: Split
  test: Split


@dataclasses.dataclass
class Prepared:
  """Everything a training job needs about its data.

  Attributes:
    collection: the validated collection.
    embeddings: pooled embeddings (docs [N, n], queries [Q, n], all queries of the collection).
    bm25_idx: [Q, depth] BM25 doc rows per query row of `embeddings.query_ids`, best first.
    bm25_scores: [Q, depth] their BM25 scores.
    bm25: the fitted BM25 model (exact scores of any pair, for hybrids).
  """
  collection: collection_lib.Collection
  embeddings: embeddings_lib.Embeddings
  bm25_idx: np.ndarray
  bm25_scores: np.ndarray
  bm25: object = None

  @property
  def dim(self) -> int:
    return int(self.embeddings.docs.shape[1])

  def bm25_pair_scores(self, query_rows: np.ndarray, doc_rows: np.ndarray) -> np.ndarray:
    """Exact BM25 scores of K (query row, doc row) pairs: [K], [K] -> [K]."""
    unique_rows, inverse = np.unique(np.asarray(query_rows), return_inverse=True)
    qids = [self.embeddings.query_ids[i] for i in unique_rows]
    qv = self.bm25.query_vectors([self.collection.queries[q] for q in qids])[inverse.reshape(-1)]
    dv = self.bm25.doc_vectors[np.asarray(doc_rows)]
    return np.asarray(qv.multiply(dv).sum(axis=1)).reshape(-1)

  def query_row_index(self, query_ids: list[str]) -> np.ndarray:
    """[len(query_ids)] rows of those queries in `embeddings.query_ids` (unknown id: InputError)."""
    return embeddings_lib.row_index(self.embeddings.query_ids, query_ids, "query")


def bm25_ranking(collection: collection_lib.Collection, query_ids: list[str],
                 cfg: ml_collections.ConfigDict):
  """BM25 top-`depth` of each query: (idx [Q, depth], scores [Q, depth], fitted model)."""
  model = bm25.BM25(k1=cfg.k1, b=cfg.b, variant=cfg.variant,
                      tokenizer=bm25.Tokenizer(kind="bm25s", stemmer=cfg.stemmer))
  model.fit(collection.doc_strings())
  depth = min(int(cfg.depth), collection.num_docs)
  idx, scores = model.topk([collection.queries[q] for q in query_ids], depth)
  return idx, scores, model


def embed(collection: collection_lib.Collection, encoder_cfg: ml_collections.ConfigDict
          ) -> embeddings_lib.Embeddings:
  """Pooled embeddings of every doc and query of `collection` by the `encoder` block: the frozen
  encoder (`kind` "flax", cached on disk) or the files of `encoder.path` ("precomputed")."""
  if encoder_cfg.kind == "precomputed":
    return precomputed.load(encoder_cfg.path, collection, bool(encoder_cfg.normalize))
  return embeddings_lib.embed_collection(collection, encoder_cfg)


def prepare(config: ml_collections.ConfigDict) -> Prepared:
  """Loads the collection, its embeddings and the BM25 ranking of every query."""
  coll = loaders.load(config.data)
  emb = embed(coll, config.encoder)
  idx, scores, model = bm25_ranking(coll, emb.query_ids, config.bm25)
  return Prepared(coll, emb, np.asarray(idx), np.asarray(scores, np.float32), model)


def reembed(prepared: Prepared, encoder_cfg: ml_collections.ConfigDict) -> Prepared:
  """`prepared` with the embeddings of another encoder config (e.g. other pooling / normalize).

  Only the embeddings depend on the encoder: the collection, the BM25 model and its ranking
  (`bm25_idx` / `bm25_scores` [Q, depth], over the same sorted query ids) are shared, not redone.

  Args:
    prepared: the output of `prepare` (any encoder config).
    encoder_cfg: the `encoder` config block to embed with (what `prepare` reads as
      `config.encoder`).

  Returns:
    A new `Prepared` whose `embeddings` are docs [N, n] and queries [Q, n] under `encoder_cfg`
    (exactly as `prepare` would compute them); the other fields are the same objects.
  """
  emb = embed(prepared.collection, encoder_cfg)
  return dataclasses.replace(prepared, embeddings=emb)


def test_only(coll: collection_lib.Collection, data_cfg: ml_collections.ConfigDict
              ) -> list[SplitSet]:
  """Every query of `data.split` as the test split, nothing to train or select on (models that
  train on pairs the corpus makes itself, `train.source = "ict"`, or none at all)."""
  test = _split("test", coll.qrels[data_cfg.split], coll.split_query_ids(data_cfg.split))
  return [SplitSet("main", Split("train", [], {}), Split("dev", [], {}), test)]


def _split(name: str, qrels: dict[str, dict[str, int]], qids: list[str]) -> Split:
  return Split(name, sorted(qids), {q: dict(qrels[q]) for q in qids})


def dev_split_name(coll: collection_lib.Collection, data_cfg: ml_collections.ConfigDict
                   ) -> str | None:
  """The split `data.dev_split` selects on, or None to carve `dev_fraction` out of train.

  "auto": "dev" when the collection has it and it is neither `train_split` nor `split`; "": None;
  another name: that split, which must exist and differ from the train and test splits.
  """
  name = data_cfg.get("dev_split", "auto")
  if name == "auto":
    return "dev" if "dev" in coll.qrels and "dev" not in (data_cfg.train_split,
                                                          data_cfg.split) else None
  if not name:
    return None
  require(name in coll.qrels, f"collection {coll.name!r} has no split {name!r}; it has "
          f"{sorted(coll.qrels)}", field="data.dev_split")
  require(name not in (data_cfg.train_split, data_cfg.split),
          f"the dev split {name!r} is also the train or test split", field="data.dev_split")
  return name


def splits(coll: collection_lib.Collection, data_cfg: ml_collections.ConfigDict, seed: int
           ) -> list[SplitSet]:
  """The train / dev / test assignments of a job.

  Without folds: train = `data.train_split`, dev = the collection's dev split when
  `data.dev_split` names one (`dev_split_name`), else a `dev_fraction` of the training queries
  carved out by `seed`; test = `data.split`. A dev-split query also judged in the train or test
  split is an `InputError`.
  With `data.folds = K`: K-fold cross-validation over the queries of `data.split` (train on
  K - 1 folds minus a dev part, test on the held-out fold); `data.dev_split` must then be
  "auto" or "".
  """
  qrels = coll.qrels
  if data_cfg.folds and data_cfg.folds > 1:
    require(data_cfg.get("dev_split", "auto") in ("auto", ""), "with data.folds each fold "
            "carves its own dev part; set data.dev_split to \"auto\" or \"\"",
            field="data.dev_split")
    test_qids = coll.split_query_ids(data_cfg.split)
    out = []
    for k, (rest, held) in enumerate(collection_lib.kfold(test_qids, data_cfg.folds, seed)):
      train, dev = collection_lib.split_dev(rest, data_cfg.dev_fraction, seed)
      q = qrels[data_cfg.split]
      out.append(SplitSet(f"fold{k}", _split(f"fold{k}-train", q, train),
                          _split(f"fold{k}-dev", q, dev), _split(f"fold{k}-test", q, held)))
    return out
  require(data_cfg.train_split != data_cfg.split,
          "train and test splits are the same; use data.folds for a single judged split",
          field="data.split")
  train_qids = coll.split_query_ids(data_cfg.train_split)
  test_qids = coll.split_query_ids(data_cfg.split)
  q_train = qrels[data_cfg.train_split]
  dev_name = dev_split_name(coll, data_cfg)
  if dev_name is None:
    train, dev = collection_lib.split_dev(train_qids, data_cfg.dev_fraction, seed)
    dev_split = _split("dev", q_train, dev)
  else:
    train, dev = train_qids, coll.split_query_ids(dev_name)
    dev_split = _split("dev", qrels[dev_name], dev)
    for other, what in ((train, data_cfg.train_split), (test_qids, data_cfg.split)):
      shared = sorted(set(dev).intersection(other))
      require(not shared, f"query {shared[0] if shared else ''!r} is judged in both the dev "
              f"split {dev_name!r} and the split {what!r} ({len(shared)} shared)",
              field="data.dev_split")
  return [SplitSet("main", _split("train", q_train, train), dev_split,
                   _split("test", qrels[data_cfg.split], test_qids))]


@dataclasses.dataclass
class IctSet:
  """Inverse-cloze pairs of a collection (`data.ict`) with their embeddings.

  Attributes:
    pairs: the pairs (texts, source docs, which were cut, which are dev).
    queries: [M] x [n] float32 embeddings of the span queries (`encoder.query_prompt` before).
    extra_docs: [R, n] float32 embeddings of the R positives whose span was removed.
    positive_rows: [M] each pair's positive as a row of `concat(corpus docs, extra_docs)`: its
      source doc when the span was kept, N + j for the j-th cut one.
    bm25_idx: [M, depth] BM25 top docs of each span query over the corpus.
  """
  pairs: ict.Pairs
  queries: np.ndarray
  extra_docs: np.ndarray
  positive_rows: np.ndarray
  bm25_idx: np.ndarray


# (collection id, configs) -> (the collection, its pairs): holding the collection keeps its id
# from being reused by another collection while the entry lives.
_ICT_CACHE: dict[tuple, tuple[collection_lib.Collection, IctSet]] = {}


def ict_set(prepared: Prepared, encoder_cfg: ml_collections.ConfigDict,
            ict_cfg: ml_collections.ConfigDict, depth: int) -> IctSet:
  """The ICT pairs of `prepared.collection` (drawn by `ict_cfg.seed`), embedded by
  `encoder_cfg` (the encoder of the collection's embeddings; cached on disk like every text),
  with each span's BM25 top-`depth`. Kept in memory for the jobs that train several models."""
  require(encoder_cfg.kind == "flax", "ICT pairs are new texts, so they need the encoder; "
          "precomputed embeddings cannot embed them", field="encoder.kind")
  key = (id(prepared.collection), repr(sorted(encoder_cfg.items())),
         repr(sorted(ict_cfg.items())), int(depth))
  if key not in _ICT_CACHE:
    pairs = ict.sample(prepared.collection.doc_strings(), ict_cfg, int(ict_cfg.seed))
    queries = embeddings_lib.encode(pairs.queries, encoder_cfg,
                                    prefix=str(encoder_cfg.query_prompt), desc="ict queries")
    cut = np.flatnonzero(pairs.removed)
    extra = embeddings_lib.encode([pairs.positives[i] for i in cut], encoder_cfg,
                                  prefix=str(encoder_cfg.doc_prompt), desc="ict positives")
    rows = pairs.sources.copy()
    rows[cut] = prepared.collection.num_docs + np.arange(len(cut))
    idx, _ = prepared.bm25.topk(pairs.queries, min(int(depth), prepared.collection.num_docs))
    if len(_ICT_CACHE) >= 4:
      _ICT_CACHE.pop(next(iter(_ICT_CACHE)))
    _ICT_CACHE[key] = (prepared.collection,
                       IctSet(pairs, queries, extra.reshape(-1, queries.shape[1]), rows,
                              np.asarray(idx)))
  return _ICT_CACHE[key][1]


def ict_trainset(data: IctSet, keep: np.ndarray, num_docs: int, hard_depth: int,
                 query_offset: int = 0) -> TrainSet:
  """The training pairs of the ICT pairs where `keep` [M] bool, as rows `query_offset + i` of the
  kept queries; the doc a span was cut from is neither a positive nor a negative of it.

  Returns:
    A `TrainSet` over `query_offset + keep.sum()` query rows; random negatives are drawn from the
    N corpus docs only (the cut positives are rows N.. of the doc features).
  """
  idx = np.flatnonzero(keep)
  q = query_offset + np.arange(len(idx))
  pairs = np.stack([q, data.positive_rows[idx]], axis=1)
  cut = data.pairs.removed[idx]
  excluded = np.stack([q[cut], data.pairs.sources[idx][cut]], axis=1)
  pool = None
  if hard_depth:
    ranked = np.full((query_offset + len(idx), data.bm25_idx.shape[1]), -1, np.int64)
    ranked[query_offset:] = data.bm25_idx[idx]
    pool = hard_negative_pool(np.concatenate([pairs, excluded]), ranked, hard_depth)
  return TrainSet(pairs, query_offset + len(idx), num_docs, pool, excluded)


def listed_negatives(coll: collection_lib.Collection, query_ids: list[str]) -> np.ndarray:
  """The non-relevant docs the collection itself lists for each query (`Collection.negatives`),
  as doc rows in the listed order: [Q_s, K] int, -1 padded (K: the longest list, >= 1).

  Raises:
    InputError: a query without a list (the collection lists none for it), or an unknown doc id.
  """
  missing = [q for q in query_ids if q not in coll.negatives]
  require(not missing, f"train.negatives_from 'dataset' needs the negatives the collection "
          f"lists per query; {coll.name!r} lists none for query "
          f"{missing[0] if missing else ''!r} ({len(missing)} queries)",
          field="train.negatives_from")
  lists = [coll.negatives[q] for q in query_ids]
  counts = np.fromiter(map(len, lists), np.int64, len(lists))
  doc_index = coll.doc_index()
  flat = list(itertools.chain.from_iterable(lists))
  rows = np.fromiter(map(doc_index.get, flat, itertools.repeat(-1)), np.int64, len(flat))
  if np.any(rows < 0):
    bad = flat[int(np.argmax(rows < 0))]
    raise input_error(f"unknown doc id {bad!r} among the listed negatives", file=coll.source,
                      field="negatives")
  out = np.full((len(query_ids), max(1, int(counts.max(initial=0)))), -1, np.int64)
  starts = np.cumsum(counts) - counts
  out[np.repeat(np.arange(len(query_ids)), counts),
      np.arange(len(flat)) - np.repeat(starts, counts)] = rows
  return out


def trainset(prepared: Prepared, split: Split, hard_depth: int, negatives_from: str = "bm25"
             ) -> tuple[TrainSet, np.ndarray]:
  """Positive pairs of `split` over (query rows of the split, doc rows) + hard negatives.

  Args:
    prepared: the collection, embeddings and BM25 rankings.
    split: the training split.
    hard_depth: H, the hard-negative pool per query (0: none).
    negatives_from: the pool's source (`NEGATIVE_SOURCES`, `train.negatives_from`): "bm25" (the
      query's BM25 ranking) or "dataset" (the collection's listed negatives,
      `listed_negatives`); either way the query's positives are removed and the first H kept.

  Returns:
    (TrainSet over the split's queries in `split.query_ids` order, [Q_s] rows of those queries in
    `prepared.embeddings.query_ids`).
  """
  require(negatives_from in NEGATIVE_SOURCES, f"must be one of {NEGATIVE_SOURCES}, got "
          f"{negatives_from!r}", field="train.negatives_from")
  doc_index = prepared.collection.doc_index()
  pairs = [(i, doc_index[d]) for i, q in enumerate(split.query_ids)
           for d, rel in sorted(split.qrels[q].items()) if rel > 0]
  rows = prepared.query_row_index(split.query_ids)
  pairs = np.asarray(pairs, np.int64).reshape(-1, 2)
  pool = None
  if hard_depth:
    ranked = (prepared.bm25_idx[rows] if negatives_from == "bm25"
              else listed_negatives(prepared.collection, split.query_ids))
    pool = hard_negative_pool(pairs, ranked, hard_depth)
  return TrainSet(pairs, len(split.query_ids), prepared.collection.num_docs, pool), rows
