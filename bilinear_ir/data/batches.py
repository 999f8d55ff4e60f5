"""Training examples and batches: positive (query, doc) pairs plus sampled negatives.

Batches are a pure function of `(seed, step)`, so a resumed run sees exactly the batches an
uninterrupted one would. They hold row indices only; features (embeddings, token vectors) stay on
device and are gathered inside the jitted step.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from bilinear_ir.errors import require


@dataclasses.dataclass
class TrainSet:
  """Positive pairs and negative pools over query rows and doc rows.

  Attributes:
    pairs: [P, 2] int (query row, doc row) of every judged-relevant pair.
    num_queries: Q, rows of the query features.
    num_docs: N, rows of the doc features.
    hard_negatives: [Q, H] int doc rows per query (e.g. BM25 top-H minus the positives),
      valid entries first and -1 after them where a query has fewer; or None.
    excluded: [E, 2] int (query row, doc row) pairs that are neither positives nor negatives
      (e.g. the doc an inverse-cloze span was cut from); or None.

  Derived: `masked_pairs` [P + E, 2] (the pairs, then the excluded ones: a query's docs that are
  never its negatives) and `max_relevant` R (the most such docs of any query row).
  """
  pairs: np.ndarray
  num_queries: int
  num_docs: int
  hard_negatives: np.ndarray | None = None
  excluded: np.ndarray | None = None

  def __post_init__(self):
    self.pairs = np.asarray(self.pairs, np.int64).reshape(-1, 2)
    require(len(self.pairs) > 0, "no training pairs (no judged queries in the training split)",
            field="data.train_split")
    masked = self.pairs if self.excluded is None else np.concatenate(
        [self.pairs, np.asarray(self.excluded, np.int64).reshape(-1, 2)])
    # Positives (and excluded docs) per query row, CSR style: docs of row q are
    # _pos_docs[_pos_start[q]:_pos_start[q+1]].
    self.masked_pairs = masked  # [P + E, 2]: a query's docs that are never its negatives
    order = np.argsort(masked[:, 0], kind="stable")
    self._pos_docs = masked[order, 1]
    self._pos_start = np.searchsorted(masked[order, 0], np.arange(self.num_queries + 1))
    self.max_relevant = int(np.diff(self._pos_start).max(initial=0))  # R

  def relevant_rows(self, q_rows: np.ndarray) -> np.ndarray:
    """[B, R] int: the doc rows judged relevant to (or excluded for) each query of `q_rows` [B],
    -1 padded (R = `max_relevant`, the most of any query row, so every batch has one shape)."""
    q_rows = np.asarray(q_rows)
    starts = self._pos_start[q_rows]
    counts = self._pos_start[q_rows + 1] - starts
    out = np.full((len(q_rows), max(self.max_relevant, 1)), -1, np.int64)
    out[np.repeat(np.arange(len(q_rows)), counts),
        _ranges(np.zeros_like(counts), counts)] = self._pos_docs[_ranges(starts, counts)]
    return out

  def positive_mask(self, q_rows: np.ndarray, cand_rows: np.ndarray) -> np.ndarray:
    """[B, C] bool: is candidate doc `cand_rows[c]` judged relevant to query `q_rows[b]` (or
    excluded for it), i.e. not a negative of it.

    Vectorised, O(C log C + positives of the batch), independent of the number of pairs.
    """
    q_rows, cand_rows = np.asarray(q_rows), np.asarray(cand_rows)
    out = np.zeros((len(q_rows), len(cand_rows)), bool)
    starts = self._pos_start[q_rows]
    counts = self._pos_start[q_rows + 1] - starts
    batch_row = np.repeat(np.arange(len(q_rows)), counts)  # one entry per positive of the batch
    docs = self._pos_docs[_ranges(starts, counts)]
    order = np.argsort(cand_rows, kind="stable")
    sorted_cands = cand_rows[order]
    lo = np.searchsorted(sorted_cands, docs, "left")
    hits = np.searchsorted(sorted_cands, docs, "right") - lo  # candidate columns per positive
    out[np.repeat(batch_row, hits), order[_ranges(lo, hits)]] = True
    return out


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
  """Concatenation of `arange(s, s + c)` for each (s, c): [sum(counts)] int."""
  total = int(np.sum(counts))
  first = np.repeat(np.asarray(starts) - np.cumsum(counts) + counts, counts)
  return first + np.arange(total)


def hard_negative_pool(trainset_pairs: np.ndarray, ranked_docs: np.ndarray, depth: int
                       ) -> np.ndarray:
  """The top-`depth` of each query's ranking with its positives removed (vectorised: no loop
  over queries).

  Args:
    trainset_pairs: [P, 2] (query row, doc row) positives.
    ranked_docs: [Q, K] doc rows per query row, best first (e.g. BM25 top-K); -1 = none.
    depth: H, how many negatives to keep per query.

  Returns:
    [Q, H] int doc rows in ranking order, valid entries first, -1 padded.
  """
  ranked = np.asarray(ranked_docs, np.int64)
  pairs = np.asarray(trainset_pairs, np.int64).reshape(-1, 2)
  # A row keeps its first `depth` entries that are neither positives nor -1: when no -1 is
  # among the first depth + (most positives of a row) columns, the later ones never matter.
  most = int(np.bincount(pairs[:, 0], minlength=1).max(initial=0)) if len(pairs) else 0
  if depth + most < ranked.shape[1] and not (ranked[:, :depth + most] < 0).any():
    ranked = ranked[:, :depth + most]
  n_rows, k = ranked.shape
  width = int(max(ranked.max(initial=-1), pairs[:, 1].max(initial=-1))) + 1
  positive_keys = np.unique(pairs[:, 0] * width + pairs[:, 1])  # sorted (query, doc) keys
  keys = np.arange(n_rows, dtype=np.int64)[:, None] * width + ranked
  at = np.minimum(np.searchsorted(positive_keys, keys), max(len(positive_keys) - 1, 0))
  is_positive = (positive_keys[at] == keys) if len(positive_keys) else np.zeros_like(keys, bool)
  drop = (ranked < 0) | is_positive  # [Q, K]
  order = np.argsort(drop, axis=1, kind="stable")[:, :depth]  # kept entries first, in order
  out = np.full((n_rows, depth), -1, np.int64)
  kept = ~np.take_along_axis(drop, order, axis=1)
  out[:, :order.shape[1]] = np.where(kept, np.take_along_axis(ranked, order, axis=1), -1)
  return out


@dataclasses.dataclass
class Batch:
  """One training batch of B queries and C = B * (1 + M) candidate docs.

  Attributes:
    q_rows: [B] query rows.
    cand_rows: [C] doc rows: the B positives first (query i's positive at column i), then each
      query's M negatives (query i's at columns B + i*M ... B + i*M + M - 1).
    mask: [B, C] bool; False where a candidate must not count as a negative for that query
      (judged relevant to it, a missing negative, or another query's doc when in-batch negatives
      are off). Column i of row i is True.
  """
  q_rows: np.ndarray
  cand_rows: np.ndarray
  mask: np.ndarray


class BatchSampler:
  """Deterministic batches: epoch permutations of the pairs from `(seed, epoch)`.

  Args:
    trainset: the pairs and negative pools.
    batch_size: B, pairs per step (drop-last within an epoch).
    hard: negatives per query drawn uniformly (with replacement) from `trainset.hard_negatives`.
    random: negatives per query drawn uniformly from all docs.
    in_batch: use the other queries' candidates as negatives too.
    seed: the config seed.
  """

  def __init__(self, trainset: TrainSet, batch_size: int, hard: int, random: int,
               in_batch: bool, seed: int):
    require(batch_size >= 1, f"must be >= 1, got {batch_size}", field="train.batch_size")
    require(hard >= 0 and random >= 0, "negative counts must be >= 0", field="train.negatives")
    require(hard == 0 or trainset.hard_negatives is not None,
            "hard negatives asked for but no pool was built", field="train.hard_negatives")
    self.trainset = trainset
    self.batch_size = min(batch_size, len(trainset.pairs))
    self.hard, self.random, self.in_batch, self.seed = hard, random, in_batch, seed
    self.steps_per_epoch = len(trainset.pairs) // self.batch_size
    self._epoch_order: tuple[int, np.ndarray | None] = (-1, None)

  @property
  def negatives_per_query(self) -> int:
    """M."""
    return self.hard + self.random

  def _order(self, epoch: int) -> np.ndarray:
    if self._epoch_order[0] != epoch:
      self._epoch_order = (epoch, np.random.default_rng([self.seed, 0, epoch]).permutation(
          len(self.trainset.pairs)))
    return self._epoch_order[1]

  def batch(self, step: int) -> Batch:
    """The batch of global step `step` (0-based)."""
    epoch, k = divmod(step, self.steps_per_epoch)
    take = self._order(epoch)[k * self.batch_size:(k + 1) * self.batch_size]
    pairs = self.trainset.pairs[take]
    q_rows, pos_rows = pairs[:, 0], pairs[:, 1]
    B, M = len(take), self.negatives_per_query
    rng = np.random.default_rng([self.seed, 1, step])
    negs = np.full((B, M), -1, np.int64)
    if self.hard:
      pool = self.trainset.hard_negatives[q_rows]  # [B, H], valid entries first, -1 after
      counts = np.sum(pool >= 0, axis=1)  # [B]
      pick = np.floor(rng.random((B, self.hard)) * counts[:, None]).astype(np.int64)
      chosen = np.take_along_axis(pool, np.minimum(pick, pool.shape[1] - 1), axis=1)
      negs[:, :self.hard] = np.where(counts[:, None] > 0, chosen, -1)  # uniform, with replacement
    if self.random:
      negs[:, self.hard:] = rng.integers(0, self.trainset.num_docs, size=(B, self.random))
    cand = np.concatenate([pos_rows, negs.reshape(-1)])
    missing = cand < 0
    cand = np.where(missing, 0, cand)
    mask = ~self.trainset.positive_mask(q_rows, cand) & ~missing[None, :]
    if not self.in_batch:
      owner = np.concatenate([np.arange(B), np.repeat(np.arange(B), M)])
      mask &= owner[None, :] == np.arange(B)[:, None]
    mask[np.arange(B), np.arange(B)] = True
    return Batch(q_rows.astype(np.int32), cand.astype(np.int32), mask)
