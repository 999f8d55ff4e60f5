"""The fine-tune row of a table: one `train.finetune` run of an embedding's encoder on a split
set's training queries, selected on dev and evaluated on test over the full corpus.

    setting = Setting.of(recipe, prepared, splitset)   # the encoder, its settings, the texts
    out = run(setting, cfg, seed, measures, depth, select_metric, checkpoint_dir)  # one seed
    row, params = finetune_row([setting] * len(config.seeds), recipe,
                               mode_config(config.finetune, mode), config.seeds, ...)
    rows = curve_rows(config, table, workdir)  # a learning curve's fine-tunes at every n
    rows, models = table_rows(config, table, workdir)  # the table runner's rows + fine-tunes

Both sides rank by the dot product of pooled vectors (the encoder's pooling and normalisation,
as the frozen embeddings were made). Dev and test rank every doc of the corpus: in query_tower
the frozen cached doc embeddings (`prepared.embeddings.docs`, never re-encoded), in two_tower the
corpus encoded again by the doc side of the params (`finetune.encode_side`, cached by the
weights' hash). Step 0 (the frozen encoder) is a candidate of the dev selection; the test split
is read once, with the chosen params.
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Sequence

import jax
import ml_collections
import numpy as np

from bilinear_ir.data import embeddings
from bilinear_ir.data import pipeline
from bilinear_ir.encoders.base import Encoder
from bilinear_ir.encoders.names import load_encoder
from bilinear_ir.errors import require
from bilinear_ir.experiment import costs
from bilinear_ir.experiment import evaluate
from bilinear_ir.experiment import rows as rows_lib
from bilinear_ir.experiment import training
from bilinear_ir.experiment import validation
from bilinear_ir.scorers import registry
from bilinear_ir.train import finetune
from bilinear_ir.train import trainer

REFERENCE = "two_tower"  # the fine-tune whose gain over dot the other rows recover a fraction of


@dataclasses.dataclass
class Setting:
  """What every fine-tune of one embedding shares.

  Attributes:
    encoder: the frozen encoder (`names.load_encoder` of the `encoder` block's model).
    encoder_cfg: the `encoder` block the frozen embeddings were made with.
    settings: their resolved settings (`Embeddings.manifest["settings"]`: pooling, normalize,
      max_length, query_prompt, doc_prompt).
    prepared: the collection, its frozen embeddings (docs [N, n]) and BM25.
    splitset: the train / dev / test splits.
    hard_depth, negatives_from: the hard-negative pool (`pipeline.trainset`): the recipe's
      `train` block's; where its rows mine their negatives with the model (`negatives_from`
      "mined" or "corpus", `trainer.MODEL_NEGATIVES`: the learning curve's default on
      InsuranceQA), the negatives the collection lists ("dataset") if it lists any, else
      BM25's: a fine-tune does not re-encode the corpus to mine.
  """
  encoder: Encoder
  encoder_cfg: ml_collections.ConfigDict
  settings: dict[str, Any]
  prepared: pipeline.Prepared
  splitset: pipeline.SplitSet
  hard_depth: int
  negatives_from: str

  @classmethod
  def of(cls, recipe, prepared: pipeline.Prepared, splitset: pipeline.SplitSet) -> Setting:
    """The setting of a table recipe (`experiment.spec.Recipe`: its encoder and train blocks)."""
    enc = recipe.encoder
    require(enc.kind == "flax", "a fine-tune needs the encoder itself, not precomputed "
            "embeddings", field="embeddings")
    encoder = load_encoder(str(enc.model), embeddings.resolve_cache_dir(str(enc.cache_dir)))
    negatives_from = str(recipe.train.negatives_from)
    if negatives_from in trainer.MODEL_NEGATIVES:
      negatives_from = "dataset" if prepared.collection.negatives else "bm25"
    return cls(encoder, enc, dict(prepared.embeddings.manifest["settings"]), prepared,
               splitset, int(recipe.train.hard_depth), negatives_from)


def tokens(encoder: Encoder, texts: Sequence[str], max_length: int, prefix: str
           ) -> tuple[np.ndarray, np.ndarray]:
  """(ids [N, L], mask [N, L]) int32 of `texts` after `prefix`, truncated to `max_length`
  tokens and padded to the longest (L <= max_length): the tokens `embeddings.encode` runs."""
  ids = encoder.tokenize(list(texts), max_length, prefix)
  return embeddings.pad_tokens(ids, max(len(t) for t in ids), encoder.pad_id)


def finetune_data(setting: Setting, cfg: ml_collections.ConfigDict) -> finetune.FinetuneData:
  """The `FinetuneData` of the training split: its queries' tokens, its judged pairs and each
  query's hard-negative pool, the frozen doc vectors [N, n] (query_tower) or every doc's tokens
  (two_tower)."""
  s, coll = setting.settings, setting.prepared.collection
  length = int(s["max_length"])
  require(cfg.max_length in (0, length), f"must be 0 or the embeddings' max_length {length} "
          "(set encoder.max_length to change both)", field="finetune.max_length")
  train = setting.splitset.train
  trainset, _ = pipeline.trainset(setting.prepared, train,
                                  setting.hard_depth if cfg.hard_negatives else 0,
                                  setting.negatives_from)
  data = finetune.FinetuneData(
      queries=tokens(setting.encoder, [coll.queries[q] for q in train.query_ids], length,
                     s["query_prompt"]),
      trainset=trainset, pooling=s["pooling"], normalize=bool(s["normalize"]))
  if cfg.mode == "query_tower":
    data.doc_vectors = setting.prepared.embeddings.docs
  else:
    data.docs = tokens(setting.encoder, coll.doc_strings(), length, s["doc_prompt"])
  return data


def ranker(setting: Setting, split: pipeline.Split, mode: str, measures: Sequence[str],
           depth: int) -> Callable[[dict[str, Any]], tuple[dict[str, Any], float]]:
  """params (a fine-tune's, `finetune.init_params`' keys) -> (metrics {"mean", "per_query"} of
  `split`'s queries ranked over the whole corpus by the dot product, seconds spent encoding
  the corpus: 0 in query_tower, whose docs are the frozen embeddings [N, n])."""
  s, coll, enc = setting.settings, setting.prepared.collection, setting.encoder_cfg
  texts = [coll.queries[q] for q in split.query_ids]
  evaluator = evaluate.RankingEvaluator(split.query_ids, coll.doc_ids, split.qrels,
                                        tuple(measures), "full", depth)
  module = registry.build("dot", setting.prepared.dim)
  scorer_params = registry.init_params(module, jax.random.key(0))

  def rank(params: dict[str, Any]) -> tuple[dict[str, Any], float]:
    q = finetune.encode_side(texts, enc, setting.encoder, params, "query", s["query_prompt"])
    started = time.perf_counter()
    if mode == "query_tower":
      docs = setting.prepared.embeddings.docs
    else:
      docs = finetune.encode_side(coll.doc_strings(), enc, setting.encoder, params, "doc",
                                  s["doc_prompt"])
    seconds = 0.0 if mode == "query_tower" else time.perf_counter() - started
    return evaluator(module, scorer_params, q, docs)[0], seconds

  return rank


def run(setting: Setting, cfg: ml_collections.ConfigDict, seed: int, measures: Sequence[str],
        depth: int, select_metric: str, checkpoint_dir: str | None) -> dict[str, Any]:
  """One fine-tune, selected on dev (`select_metric` of the dev queries over the corpus, step 0
  a candidate) and evaluated on test with the chosen params.

  Returns:
    {"metrics": {measure: mean}, "per_query": {qid: {measure: v}} (test), "dev": {select_metric:
    the chosen step's}, "best_step", "history" (`FinetuneResult.history`), "seconds" (training),
    "steps", "reindex_seconds" (the longest corpus encode of this run; 0 in query_tower),
    "params" (the chosen ones)}.
  """
  dev = ranker(setting, setting.splitset.dev, cfg.mode, (select_metric,), depth)
  encodes = [0.0]

  def dev_metric(params: dict[str, Any]) -> float:
    metrics, seconds = dev(params)
    encodes.append(seconds)
    return metrics["mean"][select_metric]

  result = finetune.fit(setting.encoder, finetune_data(setting, cfg), cfg, seed,
                        evaluate=dev_metric, checkpoint_dir=checkpoint_dir)
  metrics, seconds = ranker(setting, setting.splitset.test, cfg.mode, measures,
                            depth)(result.params)
  chosen = [h["dev"] for h in result.history if h["step"] == result.best_step]
  return {"metrics": metrics["mean"], "per_query": metrics["per_query"],
          "dev": {select_metric: chosen[0]}, "best_step": result.best_step,
          "history": result.history, "seconds": result.seconds, "steps": result.steps,
          "reindex_seconds": max(encodes + [seconds]), "params": result.params}


def mode_config(cfg: ml_collections.ConfigDict, mode: str) -> ml_collections.ConfigDict:
  """A copy of the `finetune` block with its `mode` set (the finetune job runs one per mode; the
  block may be locked, as `main` locks the config)."""
  out = cfg.copy_and_resolve_references()
  with out.unlocked():
    out.mode = mode
  return out


def finetune_row(settings: Sequence[Setting], recipe, cfg: ml_collections.ConfigDict,
                 seeds: Sequence[int], measures: Sequence[str], depth: int, select_metric: str,
                 workdir: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
  """The fine-tune row over `seeds` (one `run` each, `settings[i]` at `seeds[i]`: the same
  setting for every seed in a table, the seed's own training subset on a learning curve;
  checkpointing in `training.run_dir`: `<embedding>-<mode>-<loss>-seed<seed>-<key>`, the key
  covering the split set, so a rerun resumes) and the first seed's chosen params.

  Returns:
    ({"model": cfg.mode ("query_tower", "two_tower"), "metrics", "per_query" {qid: first
    measure} (seed means), "dev", "best_steps", "history" (step 0's loss null), "finetune":
    {"mode", "steps", "seconds", "device", "reindex_seconds", "negatives_from" (the hard
    pool's source, `Setting`), "train_queries" (per seed)}},
    params).
  """
  outs = [run(setting, cfg, seed, measures, depth, select_metric, training.run_dir(
              workdir, {"finetune": cfg.to_dict(), "encoder": recipe.encoder.to_dict(),
                        "train": recipe.train.to_dict(), "seed": seed},
              setting.prepared, setting.splitset,
              f"{recipe.name}-{cfg.mode}-{cfg.loss}-seed{seed}"))
          for setting, seed in zip(settings, seeds, strict=True)]
  m0 = measures[0]
  row = {"model": cfg.mode,
         "metrics": rows_lib.query_means([o["per_query"] for o in outs], measures),
         "per_query": rows_lib.seed_mean([o["per_query"] for o in outs], m0),
         "dev": {select_metric: rows_lib.dev_mean(outs, select_metric)},
         "best_steps": [int(o["best_step"]) for o in outs],
         "history": [[{**h, "loss": None if math.isnan(h["loss"]) else h["loss"]}
                      for h in o["history"]] for o in outs],  # step 0 has no loss: null
         "finetune": {"mode": cfg.mode, "steps": int(cfg.steps),
                      "seconds": round(sum(o["seconds"] for o in outs), 3),
                      "device": device(),
                      "reindex_seconds": round(max(o["reindex_seconds"] for o in outs), 3),
                      "negatives_from": settings[0].negatives_from,
                      "train_queries": [len(st.splitset.train.query_ids) for st in settings]}}
  return row, outs[0]["params"]


def check_modes(config, required: bool) -> None:
  """Refuses a bad `config.modes` (each fine-tune mode once; at least one where `required`), a
  bad `finetune` block for any of them (`finetune.check_config`) and precomputed embeddings (a
  fine-tune trains the encoder). Exit code 2, naming the field."""
  modes = config.modes
  require(isinstance(modes, (tuple, list)) and len(set(modes)) == len(modes)
          and (len(modes) > 0 or not required),
          f"must name each mode once{' (at least one)' if required else ''}, got {modes!r}",
          field="modes")
  for mode in modes:
    validation.one_of(mode, finetune.MODES, "modes")
    finetune.check_config(mode_config(config.finetune, mode))
  if modes:
    for name in config.embeddings:
      require(not name.startswith("precomputed:"), "a fine-tune trains the encoder: name one "
              f"(mean, cls, ...), not {name!r}", field="embeddings")


def curve_config(config, mode: str, n: int) -> ml_collections.ConfigDict:
  """The `finetune` block of a learning curve's fine-tune at n training queries: `mode`,
  `config.finetune_epochs` epochs of the n queries (steps = ceil(epochs n / batch_size), at
  least 1), `config.finetune_evals` dev evaluations besides step 0 (every
  steps // finetune_evals steps, at least 1, and at the last), warm-up over 10% of the steps
  (at most 100), as the finetune job's."""
  cfg = mode_config(config.finetune, mode)
  steps = max(1, math.ceil(float(config.finetune_epochs) * n / int(cfg.batch_size)))
  with cfg.unlocked():
    cfg.steps = steps
    cfg.eval_every = max(1, steps // int(config.finetune_evals))
    cfg.warmup_steps = min(100, steps // 10)
  return cfg


def curve_rows(config, table, workdir: str | None) -> list[dict[str, Any]]:
  """A learning curve's fine-tune rows: per cell of `table` (one embedding at one n) and entry
  of `config.modes`, one `finetune_row` over the seeds, each seed's run trained on that seed's
  subset of n training queries (`Cell.trained_on`; dev and test as the curve's other rows) at
  `curve_config`'s length. Returns the rows, the cell's fields ("n_train", ...) first."""
  measures, sel = list(config.eval.measures), config.train.select_metric
  rows, frozen = [], {}
  for cell in table.cells if config.modes else ():
    name = cell.recipe.name
    if name not in frozen:  # the encoder, loaded once per embedding
      frozen[name] = Setting.of(cell.recipe, cell.prepared, cell.splitsets[0])
    settings = [dataclasses.replace(frozen[name], prepared=cell.prepared,
                                    splitset=cell.trained_on(seed)[0]) for seed in config.seeds]
    for mode in config.modes:
      row, _ = finetune_row(settings, cell.recipe,
                            curve_config(config, mode, int(cell.fields["n_train"])),
                            config.seeds, measures, int(config.eval.depth), sel, workdir)
      rows.append({**cell.fields, **row})
  return rows


def device() -> str:
  """The devices a fine-tune ran on, e.g. "8 x cpu" or "1 x NVIDIA H200"."""
  devices = jax.devices()
  return f"{len(devices)} x {devices[0].device_kind}"


def table_rows(config, table, workdir: str | None
               ) -> tuple[list[dict[str, Any]], dict[str, tuple[Setting, dict[str, Any]]]]:
  """The finetune job's rows: per cell of `table` (`experiment.table.run`'s result, one cell per
  embedding), the table runner's rows, then one fine-tune row per entry of `config.modes`
  (`finetune_row`), each row with its "cost" (`costs.table_costs`); a hybrid's "seconds" are
  its dense partner's training seconds (lam's dev grid is not timed).

  Returns:
    (rows, {"<embedding>-<mode>": (the cell's `Setting`, the first seed's chosen params)}).
  """
  measures, sel = list(config.eval.measures), config.train.select_metric
  shown = [s for s in config.rows if not s.get("hidden")]
  rows, models = [], {}
  for i, (cell, runs) in enumerate(zip(table.cells, table.runs)):
    setting = Setting.of(cell.recipe, cell.prepared, cell.splitsets[0])
    tuned = {}
    for mode in config.modes:
      tuned[mode], params = finetune_row([setting] * len(config.seeds), cell.recipe,
                                         mode_config(config.finetune, mode), config.seeds,
                                         measures, int(config.eval.depth), sel, workdir)
      models[f"{cell.recipe.name}-{mode}"] = (setting, params)
    cost = costs.table_costs(config, cell, runs, tuned)
    mine = dict(zip([s["name"] for s in shown], table.rows[i * len(shown):(i + 1) * len(shown)]))
    for spec in shown:
      mine[spec["name"]]["cost"] = cost[spec["name"]]
      if spec["type"] == "hybrid" and spec["partner"] in mine:
        mine[spec["name"]]["seconds"] = mine[spec["partner"]].get("seconds", 0.0)
    rows += list(mine.values())
    rows += [{**cell.fields, **row, "cost": cost[mode]} for mode, row in tuned.items()]
  return rows, models
