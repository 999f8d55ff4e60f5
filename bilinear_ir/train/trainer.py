"""The training loop: jitted, data-parallel steps over a device mesh, orbax resume, dev selection.

`fit` trains any scorer of the registry on a `TrainSet` (row indices into query/doc features held
on device) with the knobs of `config.blocks.train_config()`, and returns the params that were
best on the dev split.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import os
import time
from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from bilinear_ir import progress
from bilinear_ir.data.batches import BatchSampler, TrainSet, hard_negative_pool
from bilinear_ir.errors import missing_extra
from bilinear_ir.errors import require
from bilinear_ir.scorers.base import TableScorer
from bilinear_ir.train import losses
from bilinear_ir.train import teachers
from bilinear_ir.train.checkpoints import Checkpoints

LOSSES = ("softmax", "margin", "kl", "margin_mse")
DISTILLATION_LOSSES = ("kl", "margin_mse")
# `train.matmul_precision` values (`jax.default_matmul_precision` names; "default": JAX's own
# setting). What each backend computes is in `config.blocks.train_config`.
MATMUL_PRECISIONS = ("default", "bfloat16", "tensorfloat32", "float32", "high", "highest")
# `train.negatives_from` values the model itself provides (the others are pools read from the data,
# `data.pipeline.NEGATIVE_SOURCES`): "corpus" (the softmax over every doc) and "mined" (the
# current model's top `hard_depth`, refreshed every `refresh_every` steps).
MODEL_NEGATIVES = ("corpus", "mined")


def data_mesh() -> jax.sharding.Mesh:
  """A 1-D mesh over every device, axis "data" (Auto axis type, as jax 0.10 needs)."""
  return jax.make_mesh((jax.device_count(),), ("data",),
                       axis_types=(jax.sharding.AxisType.Auto,))


def make_optimizer(cfg, total_steps: int) -> optax.GradientTransformation:
  """Clip -> AdamW(warm-up + cosine decay), skipping any update whose gradient is not finite.

  Args:
    cfg: `config.blocks.train_config()` or a `StepConfig` (fields lr, warmup_steps, end_lr_fraction,
           weight_decay, clip_norm).
    total_steps: length of the schedule.
  """
  schedule = optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=cfg.lr, warmup_steps=min(cfg.warmup_steps, total_steps - 1),
      decay_steps=max(total_steps, 1), end_value=cfg.lr * cfg.end_lr_fraction)
  tx = optax.chain(optax.clip_by_global_norm(cfg.clip_norm),
                   optax.adamw(schedule, weight_decay=cfg.weight_decay))
  return optax.apply_if_finite(tx, max_consecutive_errors=1_000_000)


def _as_tuple(feats: Any) -> tuple:
  return feats if isinstance(feats, tuple) else (feats,)


def _gather(feats: Any, rows: jnp.ndarray) -> tuple:
  return tuple(x[rows] for x in _as_tuple(feats))


class StepConfig(NamedTuple):
  """The hyper-parameters a compiled train step depends on (hashable: a jit static argument)."""
  loss: str
  temperature: float
  margin: float
  batch_size: int
  negatives: int
  l2_to_init: float
  lr: float
  warmup_steps: int
  total_steps: int
  end_lr_fraction: float
  weight_decay: float
  clip_norm: float
  teacher_temperature: float = 1.0
  matmul_precision: str = "default"
  corpus_docs: int = 0  # N > 0: the softmax over doc rows [0, N) (`train.negatives_from` "corpus")
  corpus_chunk: int = 0  # its docs per chunk


def _loss(module: nn.Module, hp: StepConfig, aux_loss, p, params0, q_feats, d_feats, q_rows,
          cand_rows, mask, teacher=None, relevant=None) -> jnp.ndarray:
  """The training loss of one batch: q_rows [B], cand_rows [C], mask [B, C] -> scalar.

  `teacher` [B, C] (distillation losses only): the teacher's scores of the batch's (query,
  candidate) pairs. `relevant` [B, R] (the corpus softmax only, `hp.corpus_docs` > 0): each
  query's judged docs, -1 padded; the candidates are then the B positives alone and the
  negatives every other doc of rows [0, corpus_docs).
  """
  q, docs = _gather(q_feats, q_rows), _gather(d_feats, cand_rows)
  if hp.corpus_docs:
    # The scorer's own pair / all-pairs products (e.g. bilinear's (q W) d^T: n^2 B flops per
    # chunk, not n^2 N for the doc table).
    apply = lambda method, *x: module.apply({"params": p}, *x, method=method)
    positive = apply(module.score_pairs, *q, *docs)  # [B]
    loss = losses.corpus_softmax_cross_entropy(
        positive, lambda block: apply(module.score_all, *q, block),
        _as_tuple(d_feats)[0][:hp.corpus_docs], relevant, hp.temperature, hp.corpus_chunk)
  else:
    scores = module.apply({"params": p}, *q, *docs, method=module.score_all)  # [B, C]
    loss = _candidate_loss(hp, scores, mask, teacher)
  if hp.l2_to_init:
    loss += hp.l2_to_init * sum(jnp.sum((a - b) ** 2) for a, b in zip(
        jax.tree.leaves(p), jax.tree.leaves(params0)))
  if aux_loss is not None:
    loss += aux_loss(p, q, docs)
  return loss


def _candidate_loss(hp: StepConfig, scores, mask, teacher) -> jnp.ndarray:
  """The loss over a batch's candidates: scores [B, C], mask [B, C], teacher [B, C] or None
  -> scalar (`_loss`)."""
  B, M = hp.batch_size, hp.negatives
  if hp.loss == "softmax":
    loss = losses.softmax_cross_entropy(scores, jnp.arange(B), mask, hp.temperature)
  elif hp.loss in DISTILLATION_LOSSES:
    t = teacher / hp.teacher_temperature  # [B, C]
    if hp.loss == "kl":
      # kl_distillation_loss divides both sides by one temperature: pre-scale the teacher.
      loss = losses.kl_distillation_loss(scores, t * hp.temperature, mask, hp.temperature)
    else:
      loss = losses.margin_mse_loss(scores, t, jnp.arange(B), mask)
  else:
    pos = jnp.diagonal(scores[:, :B])
    rows = jnp.arange(B)[:, None]
    if M:
      cols = B + rows * M + jnp.arange(M)[None, :]
      neg, valid = scores[rows, cols], mask[rows, cols]
    else:
      neg, valid = scores, mask & (jnp.arange(scores.shape[1])[None, :] != rows)
    hinge = jax.nn.relu(hp.margin - (pos[:, None] - neg))
    loss = jnp.sum(jnp.where(valid, hinge, 0.0)) / jnp.maximum(jnp.sum(valid), 1)
  return loss


def _step(state, params0, q_feats, d_feats, q_rows, cand_rows, mask, teacher, relevant, module,
          hp, aux_loss):
  """One optimisation step on one batch (q_rows [B], cand_rows [C], mask [B, C], teacher
  [B, C] or None, relevant [B, R] or None)."""
  tx = make_optimizer(hp, hp.total_steps)
  loss, grads = jax.value_and_grad(
      lambda p: _loss(module, hp, aux_loss, p, params0, q_feats, d_feats, q_rows, cand_rows,
                      mask, teacher, relevant))(state["params"])
  updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
  new = {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state,
         "step": state["step"] + 1}
  return new, {"loss": loss, "grad_norm": optax.tree.norm(grads),
               "param_norm": optax.tree.norm(new["params"])}


@functools.partial(jax.jit, static_argnames=("module", "hp", "aux_loss"),
                   donate_argnames=("state",))
def train_steps(state, params0, q_feats, d_feats, q_rows, cand_rows, mask, teacher=None,
                relevant=None, *, module, hp, aux_loss=None):
  """L optimisation steps in one call (a `lax.scan` over L batches sampled on the host).

  Compiled once per (module, hp, aux_loss, shapes, L), so runs that differ only in seed or data
  reuse it; features are arguments, never baked-in constants. One call per L steps instead of
  one per step saves the per-call dispatch and transfers; the steps compute exactly what L calls
  of one step would.

  Args:
    state: {"params", "opt_state", "step"} (donated).
    params0: the initial params (anchor of `l2_to_init`).
    q_feats, d_feats: query [Q, ...] / doc [N, ...] features (arrays or tuples of arrays).
    q_rows [L, B], cand_rows [L, C], mask [L, B, C]: L batches, step order.
    teacher: [L, B, C] the teacher's scores of each batch's (query, candidate) pairs (the
      distillation losses), else None.
    relevant: [L, B, R] each batch query's judged doc rows, -1 padded (the corpus softmax,
      `hp.corpus_docs` > 0), else None.

  Returns:
    (new state, {"loss", "grad_norm", "param_norm"} each [L], one value per step).

  Every matmul of the step is traced at `hp.matmul_precision` (`train.matmul_precision`; a
  static part of the compiled step).
  """
  run = lambda: jax.lax.scan(
      lambda st, batch: _step(st, params0, q_feats, d_feats, *batch, module, hp, aux_loss),
      state, (q_rows, cand_rows, mask, teacher, relevant))
  if hp.matmul_precision == "default":
    return run()
  with jax.default_matmul_precision(hp.matmul_precision):
    return run()


@dataclasses.dataclass
class FitResult:
  """What `fit` returns.

  Attributes:
    params: the selected params (best dev metric; the last ones when there is no dev set).
    last_params: params after the final step.
    history: [{"step", "loss", ...dev metrics}] at each evaluation.
    best_step: step of the selected params.
    temperature: the softmax temperature used.
    skipped_steps: steps whose update the optimiser skipped for a non-finite gradient
      (`make_optimizer`); where it equals the steps run, the params never moved.
    seconds: wall time of the training steps (and checkpoints but the last), dev evaluations
      excluded, summed over every process that trained this run: the checkpoint's record keeps
      it, so a run restored finished reports the seconds of the one that trained it.
  """
  params: Any
  last_params: Any
  history: list[dict[str, float]]
  best_step: int
  temperature: float
  skipped_steps: int = 0
  seconds: float = 0.0


def _score_std(module: nn.Module, params: Any, q_feats: Any, d_feats: Any, seed: int) -> float:
  rng = np.random.default_rng([seed, 2])
  qa, da = _as_tuple(q_feats), _as_tuple(d_feats)
  qi = rng.integers(0, qa[0].shape[0], 64)
  di = rng.integers(0, da[0].shape[0], 256)
  s = module.apply({"params": params}, *_gather(q_feats, qi), *_gather(d_feats, di),
                   method=module.score_all)
  return float(jnp.std(s))


def fit(module: nn.Module, params: Any, q_feats: Any, d_feats: Any, trainset: TrainSet,
        cfg: ml_collections.ConfigDict, seed: int,
        evaluate: Callable[[Any], dict[str, float]] | None = None,
        checkpoint_dir: str | None = None, log_dir: str | None = None,
        aux_loss: Callable[[Any, tuple, tuple], jnp.ndarray] | None = None,
        progress: bool = True, stop_after: int | None = None,
        teacher: teachers.Teacher | None = None,
        mine: Callable[[Any, int], np.ndarray] | None = None) -> FitResult:
  """Trains `module` from `params` and returns the dev-selected params.

  Args:
    module: a scorer with `score_all(*q, *docs) -> [B, C]`.
    params: initial params (also the anchor of `l2_to_init`).
    q_feats: query features, an array [Q, ...] or a tuple of arrays (e.g. tokens, mask).
    d_feats: doc features [N, ...] (or a tuple), indexed by the rows of `trainset`.
    trainset: positive pairs and negative pools.
    cfg: `config.blocks.train_config()`.
    seed: the config seed (batches).
    evaluate: params -> {metric: value} on the dev split, or None (then the last params win).
    checkpoint_dir: orbax directory; an existing checkpoint there is resumed.
    log_dir: TensorBoard scalars (loss, norms, dev metrics) go here (process 0 only).
    aux_loss: optional `(params, q, docs) -> scalar` added to the loss (e.g. MoL's L_MI).
    progress: report progress (`bilinear_ir.progress.bar`).
    stop_after: stop (after checkpointing) once this step is reached, as if the run was killed
      there; for tests of resumption.
    teacher: `(q_rows [B], cand_rows [C]) -> [B, C]` float32 scores of a batch's (row of
      `q_feats`, doc row) pairs (`train.teachers`), needed by the distillation losses ("kl",
      "margin_mse") and only by them. It is called on the host for each batch as the batch is
      sampled, and only those [B, C] scores go to the device: memory does not grow with the
      number of queries or docs.
    mine: `(params, k) -> [Q, k]` int doc rows (< `trainset.num_docs`), each query row's top k
      under the scorer at `params`, best first: needed by `train.negatives_from = "mined"` and
      only by it. The hard pool is then each query's top `hard_depth` of that ranking minus its
      judged docs (never gold), mined again every `refresh_every` steps with the current params
      (and checkpointed with them, so a resumed run samples what an uninterrupted one would).

  `train.negatives_from = "corpus"` (table scorers, loss "softmax"): each query's softmax runs
  over its positive and every doc of rows [0, trainset.num_docs) not judged relevant to it
  (`losses.corpus_softmax_cross_entropy`, chunks of `train.corpus_chunk` docs); hard, random and
  in-batch negatives are not drawn.
  """
  require(cfg.loss in LOSSES, f"must be one of {LOSSES}, got {cfg.loss!r}", field="train.loss")
  require(cfg.temperature > 0, f"must be > 0, got {cfg.temperature}", field="train.temperature")
  require(cfg.steps_per_call >= 1, f"must be >= 1, got {cfg.steps_per_call}",
          field="train.steps_per_call")
  precision = str(cfg.get("matmul_precision", "default"))
  require(precision in MATMUL_PRECISIONS, f"must be one of {MATMUL_PRECISIONS}, got "
          f"{precision!r}", field="train.matmul_precision")
  distill = cfg.loss in DISTILLATION_LOSSES
  require(distill == (teacher is not None),
          f"train.loss {cfg.loss!r} {'needs' if distill else 'takes no'} teacher scores",
          field="train.loss")
  if distill:
    require(cfg.get("teacher_temperature", 1.0) > 0,
            f"must be > 0, got {cfg.get('teacher_temperature')}",
            field="train.teacher_temperature")
    require(callable(teacher), f"must be a callable (q_rows, cand_rows) -> [B, C], got "
            f"{type(teacher).__name__}", field="teacher")
  negatives_from = str(cfg.get("negatives_from", "bm25"))
  corpus, mined = negatives_from == "corpus", negatives_from == "mined"
  if corpus:
    name = getattr(module, "registry_name", module)
    require(isinstance(module, TableScorer), "'corpus' needs a scorer with query/doc tables "
            f"(dot, wdp, bilinear, lowrank, adapter), got {name!r}", field="train.negatives_from")
    require(cfg.loss == "softmax", f"train.negatives_from 'corpus' needs loss 'softmax', got "
            f"{cfg.loss!r}", field="train.loss")
    require(int(cfg.corpus_chunk) >= 1, f"must be >= 1, got {cfg.corpus_chunk}",
            field="train.corpus_chunk")
  if mined:
    require(mine is not None, "'mined' needs the current model's ranking of the training "
            "queries (fit(mine=...)), which this training path does not provide",
            field="train.negatives_from")
    require(cfg.hard_negatives >= 1, "train.negatives_from 'mined' draws hard negatives: "
            f"needs >= 1, got {cfg.hard_negatives}", field="train.hard_negatives")
    require(int(cfg.refresh_every) >= 1, f"must be >= 1, got {cfg.refresh_every}",
            field="train.refresh_every")
    trainset = copy.copy(trainset)  # its pool is replaced at each refresh
    trainset.hard_negatives = np.full((trainset.num_queries, int(cfg.hard_depth)), -1, np.int64)
  mesh = data_mesh()
  ndev = mesh.devices.size
  batch_size = max(ndev, (min(cfg.batch_size, len(trainset.pairs)) // ndev) * ndev)
  sampler = BatchSampler(trainset, batch_size, 0 if corpus else cfg.hard_negatives,
                         0 if corpus else cfg.random_negatives, cfg.in_batch and not corpus, seed)
  require(sampler.batch_size % ndev == 0,
          f"{len(trainset.pairs)} training pairs cannot fill a batch on {ndev} devices",
          field="train.batch_size")
  total = cfg.steps if cfg.steps > 0 else cfg.epochs * sampler.steps_per_epoch
  require(total >= 1, "no training steps (set train.steps or train.epochs)", field="train.steps")
  temperature = float(cfg.temperature)
  if cfg.loss in ("softmax", "kl") and cfg.auto_temperature:
    temperature *= _score_std(module, params, q_feats, d_feats, seed)

  repl = NamedSharding(mesh, P())
  q_feats = jax.device_put(q_feats, repl)
  d_feats = jax.device_put(d_feats, repl)
  params0 = jax.device_put(params, repl)
  hp = StepConfig(loss=cfg.loss, temperature=temperature, margin=float(cfg.margin),
                  batch_size=sampler.batch_size, negatives=sampler.negatives_per_query,
                  l2_to_init=float(cfg.l2_to_init), lr=float(cfg.lr),
                  warmup_steps=int(cfg.warmup_steps), total_steps=int(total),
                  end_lr_fraction=float(cfg.end_lr_fraction),
                  weight_decay=float(cfg.weight_decay), clip_norm=float(cfg.clip_norm),
                  teacher_temperature=float(cfg.get("teacher_temperature", 1.0)),
                  matmul_precision=precision,
                  corpus_docs=trainset.num_docs if corpus else 0,
                  corpus_chunk=int(cfg.corpus_chunk) if corpus else 0)
  tx = make_optimizer(hp, total)
  # Batches stacked [L, ...]: the batch axis is split over devices, candidates replicated.
  batch_sh = (NamedSharding(mesh, P(None, "data")), repl,
              NamedSharding(mesh, P(None, "data", None)))
  steps_fn = functools.partial(train_steps, module=module, hp=hp, aux_loss=aux_loss)
  # The state is donated to each step, so it must not share buffers with params0 / best.
  # Placed like the step's outputs (replicated), so the first step does not compile once more.
  state = jax.device_put({"params": jax.tree.map(jnp.copy, params0),
                          "opt_state": tx.init(params0), "step": jnp.zeros((), jnp.int32)}, repl)
  best = {"params": params0}
  record = {"step": 0, "best_step": 0, "best_metric": None, "history": [], "seconds": 0.0}
  ckpt = None
  # What a checkpoint holds: the mined pool too (the one sampled from until the next refresh).
  saved = lambda: {"state": state, "best": best, **(
      {"pool": trainset.hard_negatives.astype(np.int32)} if mined else {})}
  if checkpoint_dir:
    ckpt = Checkpoints(checkpoint_dir, cfg.checkpoint_every, cfg.keep_checkpoints)
    restored = ckpt.restore(saved())
    if restored is not None:
      tree, record = restored
      state, best = jax.device_put(tree["state"], repl), jax.device_put(tree["best"], repl)
      if mined:
        trainset.hard_negatives = np.asarray(tree["pool"], np.int64)
  writer = _writer(log_dir)
  started, eval_seconds = time.perf_counter(), 0.0

  def evaluate_now(step, loss_value):
    nonlocal eval_seconds
    entry = {"step": step, "loss": loss_value}
    if evaluate is not None:
      t = time.perf_counter()
      metrics = evaluate(state["params"])
      eval_seconds += time.perf_counter() - t
      entry.update(metrics)
      value = metrics[cfg.select_metric]
      if record["best_metric"] is None or value > record["best_metric"]:
        record["best_metric"], record["best_step"] = float(value), step
        best["params"] = jax.tree.map(jnp.copy, state["params"])
      if writer:
        for k, v in metrics.items():
          writer.add_scalar(f"dev/{k}", v, step)
    record["history"].append(entry)

  start = int(record["step"])
  seconds0 = record["seconds"] = float(record.get("seconds", 0.0))
  if start == 0 and evaluate is not None and not record["history"]:
    evaluate_now(0, float("nan"))
  bar = _progress(total, start, progress)
  step = start
  while step < total:
    if mined and step % int(cfg.refresh_every) == 0:
      trainset.hard_negatives = mined_pool(mine, state["params"], trainset, int(cfg.hard_depth))
    end = _call_end(step, total, int(cfg.steps_per_call), cfg.eval_every,
                    ckpt.every if ckpt is not None else None, stop_after,
                    int(cfg.refresh_every) if mined else None)
    batches = [sampler.batch(s) for s in range(step, end)]
    args = [jax.device_put(np.stack([getattr(b, f) for b in batches]), s)
            for f, s in zip(("q_rows", "cand_rows", "mask"), batch_sh)]
    args.append(jax.device_put(_teacher_scores(teacher, batches), batch_sh[2]) if distill
                else None)
    args.append(jax.device_put(np.stack([trainset.relevant_rows(b.q_rows) for b in batches])
                               .astype(np.int32), batch_sh[2]) if corpus else None)
    # Dispatched asynchronously: the next call's batches are sampled while this one runs.
    state, stats = steps_fn(state, params0, q_feats, d_feats, *args)
    if bar is not None:
      bar.update(end - step)
    if writer:
      host = jax.device_get(stats)
      for i, done in enumerate(range(step + 1, end + 1)):
        if done % 10 == 0 or done == total:
          for k, v in host.items():
            writer.add_scalar(f"train/{k}", float(v[i]), done)
    step = done = end
    if done % cfg.eval_every == 0 or done == total:
      evaluate_now(done, float(stats["loss"][-1]))
    if done == total or (stop_after is not None and done >= stop_after):
      jax.block_until_ready(state)  # the last call's steps counted before its checkpoint
    record["step"] = done
    record["seconds"] = seconds0 + time.perf_counter() - started - eval_seconds
    if ckpt is not None:
      ckpt.maybe_save(done, saved(), record, force=done == total)
    if stop_after is not None and done >= stop_after:
      break
  if bar is not None:
    bar.close()
  if writer:
    writer.close()
  if ckpt is not None:
    ckpt.close()
  selected = best["params"] if evaluate is not None else state["params"]
  return FitResult(params=selected, last_params=state["params"], history=record["history"],
                   best_step=int(record["best_step"]) if evaluate is not None else total,
                   temperature=temperature,
                   skipped_steps=int(state["opt_state"].total_notfinite),
                   seconds=record["seconds"])


def mined_pool(mine: Callable[[Any, int], np.ndarray], params: Any, trainset: TrainSet,
               depth: int) -> np.ndarray:
  """[Q, depth] int: each query row's top `depth` docs under the scorer at `params` that are not
  judged relevant to it (nor excluded for it), best first, -1 padded (`fit`'s `mine`).

  The ranking asked of `mine` is deep enough (`depth` + the most judged docs of any query) that
  removing a query's judged docs still leaves `depth` of them wherever the corpus has that many.
  """
  k = min(trainset.num_docs, depth + trainset.max_relevant)
  ranked = np.asarray(mine(params, k))
  require(ranked.shape == (trainset.num_queries, k) and bool(np.all(ranked < trainset.num_docs)),
          f"the miner returned shape {ranked.shape}, expected ({trainset.num_queries}, {k}) "
          f"doc rows < {trainset.num_docs}", field="train.negatives_from")
  return hard_negative_pool(trainset.masked_pairs, ranked, depth)


def _teacher_scores(teacher: teachers.Teacher, batches: list) -> np.ndarray:
  """[L, B, C] float32: the teacher's scores of each batch's (query, candidate) pairs."""
  out = []
  for b in batches:
    t = np.asarray(teacher(b.q_rows, b.cand_rows), np.float32)
    require(t.shape == b.mask.shape, f"the teacher returned shape {t.shape} for a batch of "
            f"{len(b.q_rows)} queries x {len(b.cand_rows)} candidates, expected {b.mask.shape}",
            field="teacher")
    out.append(t)
  return np.stack(out)


def _call_end(step: int, total: int, per_call: int, eval_every: int,
              checkpoint_every: int | None, stop_after: int | None,
              refresh_every: int | None = None) -> int:
  """Where the call starting at `step` stops: `per_call` steps later, or earlier at the next
  evaluation, checkpoint, mined-pool refresh, `stop_after` or the last step (`total`). Counting
  from the call's start (not from multiples of `per_call`) keeps the call lengths, each a
  compiled shape, few: per_call and the remainders before events."""
  nxt = lambda every: (step // every + 1) * every
  ends = [total, step + per_call, nxt(max(1, eval_every))]
  for every in (checkpoint_every, refresh_every):
    if every:
      ends.append(nxt(every))
  if stop_after is not None and stop_after > step:
    ends.append(stop_after)
  return min(ends)


def _writer(log_dir: str | None):
  if not log_dir or jax.process_index() != 0:
    return None
  try:
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise missing_extra("tensorboardX", "tb", "train.tensorboard") from None
  os.makedirs(log_dir, exist_ok=True)
  return SummaryWriter(log_dir)


def _progress(total: int, start: int, enabled: bool):
  return progress.bar(total, "train", unit="step", initial=start, leave=False) if enabled else None
