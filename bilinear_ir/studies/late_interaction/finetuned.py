"""The fine-tuned rows of a late-interaction table: a row's scorer trained jointly with the encoder.

A model of `config.models` with a "finetune" entry (`models.is_finetuned`) is one: DE (scorer
"dot": the pooled vectors' dot product, paper 002's fine-tuned dual encoder), ME-BERT (m = 8,
paper 002), ColBERT with a trained projection and separable LITE (paper 004's main setting).
The encoder (both sides, two_tower; or, for DE, the query side only, query_tower: the
index never changes) and the scorer's params train together (`train.finetune.fit`
with the row's block, `models.row_finetune`: the head "dot" or the row's scorer) on the training
split's pairs and hard negatives, by the mnrl softmax. Every `eval_every` steps the dev
candidates are re-ranked (step 0, the frozen encoder with the scorer's initial params, a
candidate) and the params best on dev re-rank the dev and test candidates (and the test pools) as
every other row of the table does (`Setting.score`), so the row enters `rows.compare_rows` like
any other.

Only the candidates' docs are encoded again with the tuned weights (`Setting.candidate_rows`),
not the corpus; the frozen encoder's features are the setting's cached ones (the same function
of the same weights: `data.embeddings.run_model`). Lengths as the frozen rows: token heads Tq
query and Td doc tokens (`encoder.query_max_length`, `models.doc_len`), DE the pooled
embeddings' max_length.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np

from bilinear_ir import files
from bilinear_ir import timing
from bilinear_ir.data import embeddings
from bilinear_ir.data import pipeline
from bilinear_ir.encoders.base import Encoder
from bilinear_ir.encoders.names import load_encoder
from bilinear_ir.experiment import evaluate
from bilinear_ir.experiment import finetuning
from bilinear_ir.experiment import training
from bilinear_ir.studies.late_interaction import latency
from bilinear_ir.studies.late_interaction import models
from bilinear_ir.studies.late_interaction.setting import Scored
from bilinear_ir.studies.late_interaction.setting import Setting
from bilinear_ir.train import finetune


@dataclasses.dataclass
class Features:
  """How a row's texts become the features its scorer reads.

  Attributes:
    encoder: the frozen encoder (a fine-tune's params replace its own).
    settings: the pooled embeddings' resolved settings (pooling, normalize, max_length, prompts).
    tokens: token states (a token head) or pooled vectors (DE).
    lengths: (query, doc) tokens per text.
    prompts: (query, doc) prefixes, as the frozen features were made with.
    batch_size: texts per encoder call.
  """
  encoder: Encoder
  settings: dict[str, Any]
  tokens: bool
  lengths: tuple[int, int]
  prompts: tuple[str, str]
  batch_size: int

  def encode(self, params: Any, texts: Sequence[str], side: int) -> Any:
    """`texts` encoded by encoder params `params` (one side's), as the setting's frozen features
    are (`data.embeddings.run_model`, no disk cache): (token states [N, L, n] float16, zero at
    padding, mask [N, L] bool) or pooled vectors [N, n] float32; `side` 0 query, 1 doc."""
    length, prefix = self.lengths[side], self.prompts[side]
    ids = self.encoder.tokenize(list(texts), length, prefix)
    out = embeddings.run_model(dataclasses.replace(self.encoder, params=params), ids,
                               normalize=bool(self.settings["normalize"]), tokens=self.tokens,
                               max_length=length, batch_size=self.batch_size,
                               devices=jax.local_devices(), desc=None)
    if self.tokens:
      return out, np.arange(length)[None, :] < np.array([len(t) for t in ids])[:, None]
    return embeddings.pooled({"mean": out[:, 0], "cls": out[:, 1]}, self.settings)


def features_of(setting: Setting, config, tokens: bool, encoder: Encoder) -> Features:
  """The `Features` of a row of `setting` (token states or pooled vectors)."""
  s, enc = dict(setting.prepared.embeddings.manifest["settings"]), config.encoder
  if tokens:
    return Features(encoder, s, True, (int(enc.query_max_length), models.doc_len(config)),
                    (str(enc.query_prompt), str(enc.doc_prompt)), int(enc.batch_size))
  return Features(encoder, s, False, (int(s["max_length"]),) * 2,
                  (str(s["query_prompt"]), str(s["doc_prompt"])), int(enc.batch_size))


def finetune_data(setting: Setting, config, feats: Features, cfg) -> finetune.FinetuneData:
  """The training split's query tokens, pairs and hard-negative pool (`config.train`'s
  `hard_depth` and `negatives_from`), and every doc's tokens (two_tower) or the frozen pooled
  doc vectors [N, n] (query_tower: the setting's cached ones)."""
  coll, train = setting.prepared.collection, setting.splitset.train
  trainset, _ = pipeline.trainset(setting.prepared, train,
                                  int(config.train.hard_depth) if cfg.hard_negatives else 0,
                                  str(config.train.negatives_from))
  (lq, ld), (pq, pd) = feats.lengths, feats.prompts
  return finetune.FinetuneData(
      queries=finetuning.tokens(feats.encoder, [coll.queries[q] for q in train.query_ids], lq,
                                pq),
      trainset=trainset, pooling=str(feats.settings["pooling"]),
      normalize=bool(feats.settings["normalize"]),
      doc_vectors=setting.prepared.embeddings.docs if cfg.mode == "query_tower" else None,
      docs=None if cfg.mode == "query_tower" else finetuning.tokens(
          feats.encoder, coll.doc_strings(), ld, pd))


def ranker(setting: Setting, feats: Features, head_params: Callable[[dict], Any]
           ) -> Callable[..., tuple[Any, ...]]:
  """`get(params, doc_rows, known=None)` -> (query features of query rows (a function), doc
  features, doc rows or None, seconds spent encoding docs, scorer params, the doc side's weights
  hash). Each side of `params` (a fine-tune's) that is the frozen encoder's reads the setting's
  frozen features (all N docs: step 0, and the doc side of a query_tower fine-tune: no doc is
  encoded again); a tuned query side encodes the queries, a tuned doc side the `doc_rows` [U]
  docs ([U, ...]). `known`: (weights hash, rows [V], features [V, ...]) of docs already encoded:
  with the same hash, only the docs of `doc_rows` not among them are encoded."""
  frozen = files.tree_sha256(feats.encoder.params)
  coll, query_ids = setting.prepared.collection, setting.prepared.embeddings.query_ids
  docs = coll.doc_strings()

  def get(params: dict, doc_rows: np.ndarray, known: tuple | None = None) -> tuple[Any, ...]:
    sides = [finetune.side_params(params, side, feats.encoder) for side in finetune.SIDES]
    keys = [files.tree_sha256(p) for p in sides]
    if keys[0] == frozen:
      q_feats = setting.token_queries if feats.tokens else setting.pooled_queries
    else:
      q_feats = lambda rows: feats.encode(sides[0], [coll.queries[query_ids[r]] for r in rows],
                                          0)
    if keys[1] == frozen:
      d_feats = setting.token_docs if feats.tokens else setting.prepared.embeddings.docs
      return q_feats, d_feats, None, 0.0, head_params(params), frozen
    reuse = known is not None and known[0] == keys[1] and known[2] is not None
    new = np.setdiff1d(doc_rows, known[1]) if reuse else doc_rows
    started = time.perf_counter()
    d_feats = feats.encode(sides[1], [docs[r] for r in new], 1)
    seconds = time.perf_counter() - started
    if reuse:  # the known docs' features and the new ones, in the order of `doc_rows`
      rows = np.concatenate([known[1], new])
      order = np.argsort(rows, kind="stable")
      keep = np.isin(rows[order], doc_rows)
      merge = lambda a, b: np.concatenate([a, b])[order][keep]
      d_feats = (tuple(map(merge, known[2], d_feats)) if feats.tokens
                 else merge(known[2], d_feats))
    return q_feats, d_feats, doc_rows, seconds, head_params(params), keys[1]

  return get


def finetune_row(setting: Setting, config, name: str, lat: tuple, dtype, n_train: int,
                 workdir: str | None = None) -> tuple[Scored, dict[str, Any]]:
  """The fine-tuned row `name` (`config.models[name]` with a "finetune" entry) on the training
  split of `setting`, checkpointed under `workdir` (`training.run_dir`: a rerun resumes).

  Returns:
    (its Scored over the dev and test candidates (and pools), {"scorer", "trained", "best_step",
     "history", "params" (the head's count), "train_seconds", "reindex_docs", "finetune":
     {"mode", "steps", "seconds", "device", "reindex_seconds"}}): "seconds" the training steps
     (dev evaluations excluded), "reindex_seconds" encoding the "reindex_docs" candidate docs
     (every dev and test candidate and pool doc) with the chosen weights (the dev ones at their
     dev evaluation, the rest after training; 0 docs and 0 s when dev chose the frozen
     encoder, or in query_tower, where the cached doc features serve).
  """
  prepared = setting.prepared
  cfg = models.row_finetune(config, name)
  module, scorer = models.row_model(config, name, int(setting.tokens.docs.shape[-1]))
  head = None if scorer == "dot" else module
  enc = config.encoder
  encoder = load_encoder(str(enc.model), embeddings.resolve_cache_dir(str(enc.cache_dir)))
  feats = features_of(setting, config, head is not None, encoder)
  eval_module = setting.eval_module(module)
  features = ranker(setting, feats, lambda p: p["head"] if head is not None else {})
  sel = config.train.select_metric
  dev_rows = setting.candidate_rows(("dev",))
  # The best step's dev docs, as `fit` selects: their features and encoding seconds.
  best = {"value": None, "known": None, "seconds": 0.0}

  def on_dev(params: dict) -> float:
    q, d, rows, seconds, hp, key = features(params, dev_rows)
    value = setting.rerank("dev", eval_module, hp, q, d, evaluate.dev_measures(sel),
                           doc_rows=rows)[1]["mean"][sel]
    if best["value"] is None or value > best["value"]:
      best.update(value=value, known=None if rows is None else (key, dev_rows, d),
                  seconds=seconds)
    return value

  identity = {"model": config.models[name].to_dict(), "finetune": cfg.to_dict(),
              "train": config.train.to_dict(), "encoder": enc.to_dict(),
              "rerank": config.rerank.to_dict(), "seed": int(config.seed)}
  folder = training.run_dir(workdir, identity, prepared, setting.splitset, f"{name}-n{n_train}")
  result = finetune.fit(encoder, finetune_data(setting, config, feats, cfg), cfg,
                        int(config.seed), evaluate=on_dev if setting.split("dev").query_ids
                        else None, checkpoint_dir=folder, head=head)
  all_rows = setting.candidate_rows()
  q, d, rows, seconds, hp, key = features(result.params, all_rows, best["known"])
  if best["known"] is not None and best["known"][0] == key:  # the dev docs came from there
    seconds += best["seconds"]
  lq, lqm, ld, ldm, lrows = lat
  if head is None:
    fn, n_vec, width = timing.de_case(lq, lqm, prepared.embeddings.docs[lrows], dtype)
  else:
    fn, n_vec, width = latency.token_call(module, scorer, hp, lat, dtype)
  scored = setting.score(eval_module, hp, q, d, fn, (n_vec, width), doc_rows=rows)
  # What jax compiled for this row (its train step at every batch shape, its re-ranking) serves
  # no later row: each has its own head. Kept, it stays resident for the rest of the process:
  # InsuranceQA's ten-row table reached 21 GB and failed to compile its eighth row on a 23 GB
  # host. Whatever a later call needs compiles again (the latency call before its warm-up).
  jax.clear_caches()
  history = [{**h, "loss": None if np.isnan(h["loss"]) else h["loss"]} for h in result.history]
  return scored, {
      "scorer": scorer, "trained": True, "best_step": result.best_step, "history": history,
      "params": int(sum(np.size(x) for x in jax.tree.leaves(hp))),
      "train_seconds": round(result.seconds, 1), "reindex_docs": 0 if rows is None else len(rows),
      "finetune": {"mode": cfg.mode, "steps": int(result.steps),
                   "seconds": round(result.seconds, 3), "device": finetuning.device(),
                   "reindex_seconds": round(seconds, 3)}}
