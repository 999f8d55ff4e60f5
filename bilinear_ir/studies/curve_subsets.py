"""A learning curve's protocol: nested training subsets, their split sets, unseen-answer queries.

A learning curve trains the same rows on growing subsets of the training queries. For each seed
the training queries are put in one random order (`nested_subsets`), and the subset of size n is
the first n of that order: every larger subset holds every smaller one, and a seed draws its own
order. The dev and test splits stay whole (`subset_splitset`). The unseen-answer view of size n
(`unseen_answer_queries`) keeps the test queries none of whose relevant docs is relevant to a
training query of the subset of size n, under every seed. Each run trains `schedule`'s steps:
the recipe's epochs over the subset's judged pairs, at most `config.max_steps`.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from bilinear_ir.data import pipeline

# Mixed into the seed of the subset order, so it differs from the init / batch streams of a seed.
_SUBSET_STREAM = 23


def sizes_of(sizes: Sequence[int], available: int) -> list[int]:
  """The curve's subset sizes: each of `sizes` capped at `available` (a size larger than the
  split means all of it), duplicates dropped, ascending."""
  return sorted({min(int(n), int(available)) for n in sizes})


def nested_subsets(query_ids: Sequence[str], sizes: Sequence[int], seed: int
                   ) -> dict[int, list[str]]:
  """Nested random subsets of `query_ids`: {n: the first n queries of one seeded order, sorted}.

  Args:
    query_ids: [Q] the training queries (any order: they are sorted first, so the subsets depend
      on the set and the seed only).
    sizes: subset sizes (`sizes_of` caps them at Q).
    seed: draws the order (`np.random.default_rng([seed, _SUBSET_STREAM])`).

  Returns:
    {n: [n] sorted query ids} for each n of `sizes_of(sizes, Q)`; subsets of larger n contain
    those of smaller n.
  """
  ordered = sorted(query_ids)
  order = np.random.default_rng([int(seed), _SUBSET_STREAM]).permutation(len(ordered))
  return {n: sorted(ordered[i] for i in order[:n]) for n in sizes_of(sizes, len(ordered))}


def subset_split(split: pipeline.Split, query_ids: Sequence[str]) -> pipeline.Split:
  """`split` restricted to `query_ids` (which must be among its queries)."""
  wanted = set(query_ids)
  qids = [q for q in split.query_ids if q in wanted]
  return pipeline.Split(split.name, qids, {q: split.qrels[q] for q in qids})


def subset_splitset(splitset: pipeline.SplitSet, train_ids: Sequence[str], n: int
                    ) -> pipeline.SplitSet:
  """`splitset` with its training split cut to `train_ids` (dev and test whole), named
  `<name>-n<n>`."""
  return pipeline.SplitSet(f"{splitset.name}-n{n}", subset_split(splitset.train, train_ids),
                           splitset.dev, splitset.test)


def unseen_answer_queries(train: pipeline.Split, subsets: Sequence[Sequence[str]],
                          test: pipeline.Split) -> list[str]:
  """Sorted test queries none of whose relevant docs is relevant to a query of any of `subsets`.

  Args:
    train: the training split (its qrels judge the subsets' queries).
    subsets: one list of training query ids per seed (the subsets of one size n).
    test: the test split.
  """
  seen = {d for subset in subsets for q in subset for d, rel in train.qrels[q].items() if rel > 0}
  return sorted(q for q in test.query_ids
                if not any(rel > 0 and d in seen for d, rel in test.qrels[q].items()))


def positive_pairs(split: pipeline.Split) -> int:
  """Judged (query, relevant doc) pairs of `split`: the training examples of one epoch."""
  return sum(rel > 0 for q in split.query_ids for rel in split.qrels[q].values())


def schedule(config, train, pairs: int) -> dict[str, Any]:
  """The `train` changes of one run on `pairs` judged pairs: `train.epochs` epochs of
  `train.batch_size` pairs, at most `config.max_steps` steps, `config.evals` dev evaluations
  (plus step 0). A row's own changes (MoL's `config.mol_train`) come after these."""
  steps = min(int(train.epochs) * math.ceil(pairs / int(train.batch_size)),
              int(config.max_steps))
  return {"steps": steps, "eval_every": max(1, steps // int(config.evals))}
