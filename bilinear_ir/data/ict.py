"""Training pairs a corpus makes itself: the inverse cloze task (Luan et al., paper 002, sec. 5).

For each sampled doc, a *query* is a span of it: a run of `min_words`..`max_words` consecutive
words (`query = "span"`), or one of its sentences (`"sentence"`); the *positive* is the doc with
that span removed, with probability `remove_prob` (0.9, as ICT), or the doc as it is otherwise
(so the model also learns that containing the span is evidence). Nothing here reads judgements:
`sample` needs only the docs' texts. Every draw comes from `numpy.random.default_rng([seed, ...])`,
so the same seed gives the same pairs.

Docs are split once, by seed, into training docs and `dev_docs` held-out docs whose pairs select
the model (the dev metric ranks the corpus, where each held-out doc appears as its positive:
the span removed or kept, as drawn).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from bilinear_ir.errors import require

QUERY_KINDS = ("span", "sentence")


@dataclasses.dataclass
class Pairs:
  """ICT pairs over the docs of a collection.

  Attributes:
    queries: [M] query texts (spans or sentences).
    sources: [M] int doc rows the spans come from.
    positives: [M] the source doc with the span removed, or None where the positive is the
      source doc as it is (its own row of the corpus).
    removed: [M] bool, whether the span was removed from the positive.
    dev: [M] bool, whether the pair is held out for model selection.
    skipped: docs too short to give a span (fewer than `min_words` words).
  """
  queries: list[str]
  sources: np.ndarray
  positives: list[str | None]
  removed: np.ndarray
  dev: np.ndarray
  skipped: int

  def __len__(self) -> int:
    return len(self.queries)

  def subset(self, keep: np.ndarray) -> Pairs:
    """The pairs where `keep` [M] bool is True."""
    idx = np.flatnonzero(keep)
    return Pairs([self.queries[i] for i in idx], self.sources[idx],
                 [self.positives[i] for i in idx], self.removed[idx], self.dev[idx],
                 self.skipped)


def _span(words: list[str], min_words: int, max_words: int, rng: np.random.Generator
          ) -> tuple[int, int]:
  """[start, stop) of a uniform-length (min..max, at most the doc) span at a uniform start."""
  n = int(rng.integers(min_words, min(max_words, len(words)) + 1))
  start = int(rng.integers(0, len(words) - n + 1))
  return start, start + n


def _sentence(words: list[str], min_words: int, rng: np.random.Generator) -> tuple[int, int]:
  """[start, stop) in words of a uniformly chosen sentence with at least `min_words` words, or a
  `min_words`-word span when no sentence is that long."""
  bounds, start = [], 0
  for i, w in enumerate(words):
    if w.endswith((".", "!", "?")) or i == len(words) - 1:
      if i + 1 - start >= min_words:
        bounds.append((start, i + 1))
      start = i + 1
  if not bounds:
    return _span(words, min_words, min_words, rng)
  return bounds[int(rng.integers(len(bounds)))]


def sample(doc_texts: list[str], cfg, seed: int) -> Pairs:
  """`cfg.pairs_per_doc` ICT pairs for each doc with at least `cfg.min_words` words.

  Args:
    doc_texts: [N] the docs' texts (title + text).
    cfg: the `train.ict` block (`config.blocks.ict_config()`): query, min_words, max_words,
      remove_prob, pairs_per_doc, dev_docs.
    seed: the config seed.

  Returns:
    `Pairs` in doc order (pairs of one doc together); `dev` marks the pairs of `cfg.dev_docs`
    docs drawn by seed.
  """
  require(cfg.query in QUERY_KINDS, f"must be one of {QUERY_KINDS}, got {cfg.query!r}",
          field="train.ict.query")
  require(1 <= cfg.min_words <= cfg.max_words, "need 1 <= min_words <= max_words",
          field="train.ict.min_words")
  words = [t.split() for t in doc_texts]
  usable = np.flatnonzero([len(w) >= cfg.min_words for w in words])
  require(len(usable) >= 1, f"no doc has {cfg.min_words}+ words", field="train.ict.min_words")
  n_dev = min(int(cfg.dev_docs), len(usable) - 1)  # at least one training doc
  dev_docs = set(np.random.default_rng([seed, 11]).choice(usable, size=n_dev,
                                                          replace=False).tolist())
  queries, sources, positives, removed, dev = [], [], [], [], []
  for row in usable:
    rng = np.random.default_rng([seed, 12, int(row)])
    w = words[row]
    for _ in range(int(cfg.pairs_per_doc)):
      start, stop = (_span(w, cfg.min_words, cfg.max_words, rng) if cfg.query == "span"
                     else _sentence(w, cfg.min_words, rng))
      cut = bool(rng.random() < cfg.remove_prob) and stop - start < len(w)
      queries.append(" ".join(w[start:stop]))
      positives.append(" ".join(w[:start] + w[stop:]) if cut else None)
      sources.append(int(row))
      removed.append(cut)
      dev.append(int(row) in dev_docs)
  return Pairs(queries, np.asarray(sources, np.int64), positives, np.asarray(removed, bool),
               np.asarray(dev, bool), skipped=len(doc_texts) - len(usable))
