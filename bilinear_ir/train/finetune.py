"""Fine-tuning the project's Flax encoders (BERT, MPNet): jitted, data-parallel train steps, orbax
resume and dev selection, with the knobs of `config.blocks.finetune_config()`.

Public API (a job builds on it; tokens are padded with `data.embeddings.pad_tokens`):

    data = FinetuneData(queries=(ids [Q, L], mask [Q, L]), trainset=TrainSet(...),
                        pooling="mean", normalize=True,
                        doc_vectors=[N, n] frozen embeddings,       # mode "query_tower"
                        docs=(ids [N, L], mask [N, L]))             # mode "two_tower"
    result = fit(encoder, data, cfg, seed, evaluate=lambda params: dev_ndcg(params),
                 checkpoint_dir=workdir + "/ckpt")                  # a `FinetuneResult`
    result.params  # {"query": p} (query_tower) | {"shared": p} | {"query": p, "doc": p}
    vectors = encode_side(texts, encoder_cfg, encoder, result.params, "doc", prefix)  # [N, n]

`evaluate` gets such a params dict and returns the dev metric (higher is better); it can score
queries with `encode_side(..., "query")` and, in two_tower, re-encode the corpus with
`encode_side(..., "doc")` (cached by the weights' hash: the same weights never encode twice). In
query_tower the doc side is the frozen encoder: `side_params(params, "doc", encoder)` is
`encoder.params`, and the cached doc embeddings are never changed.

The steps: `make_spec` (the static part of a step), `init_params`, `init_state`,
`make_train_step(spec, mesh) -> step(state, batch) -> (state, metrics)` (jitted with
NamedSharding: the batch split over the "data" axis, params replicated, the state donated),
`batch_arrays` (a sampled `Batch` -> the step's arrays) and `loss` (the pure loss of a batch).

The head (`finetune.head`): "dot" scores the pooled vectors by their dot product (the dual
encoder, DE); any other name is a late-interaction scorer trained jointly with the encoder (a
`scorers` module over token states, given to `make_spec` / `fit` as `head`: ColBERT, ME-BERT,
separable LITE, ...): the params gain a "head" entry (its params, initialised from the seed) and
the loss scores every query's token states against every candidate's with the head's `score_all`
(`token_states`; two_tower only).
"""
from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable, NamedTuple, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from bilinear_ir import files
from bilinear_ir.data import embeddings
from bilinear_ir.data.batches import Batch, BatchSampler, TrainSet
from bilinear_ir.encoders import layers
from bilinear_ir.encoders.base import Encoder, pool
from bilinear_ir.errors import require
from bilinear_ir.scorers import registry
from bilinear_ir.scorers.multivector import l2_normalize
from bilinear_ir.train import losses
from bilinear_ir.train.checkpoints import Checkpoints
from bilinear_ir.train.trainer import data_mesh, make_optimizer

MODES = ("query_tower", "two_tower")
LOSSES = ("mnrl", "corpus")
COMPUTE_DTYPES = ("float32", "bfloat16")
SIDES = ("query", "doc")


class Spec(NamedTuple):
  """What a compiled train step depends on (hashable). `module` is the encoder's module (with
  `remat` set as asked); the optimizer fields are `trainer.make_optimizer`'s; `head` is the
  token scorer trained with the encoder (None: the dot product of pooled vectors) and `head_lr`
  its params' peak learning rate (0: `lr`)."""
  module: nn.Module
  pooling: str
  normalize: bool
  mode: str
  loss: str
  temperature: float
  compute_dtype: str
  corpus_chunk: int
  pack: bool
  lr: float
  warmup_steps: int
  end_lr_fraction: float
  weight_decay: float
  clip_norm: float
  total_steps: int
  head: nn.Module | None = None
  head_lr: float = 0.0


@dataclasses.dataclass
class FinetuneData:
  """The token ids and rows one fine-tune trains on.

  Attributes:
    queries: (ids [Q, Lq] int32, mask [Q, Lq] int32) of every query row of `trainset`.
    trainset: positive (query row, doc row) pairs and each query's hard-negative pool.
    pooling, normalize: how token states become vectors ("mean" | "cls", L2 or not), as the
      frozen doc embeddings were made.
    doc_vectors: [N, n] float32 frozen doc embeddings (query_tower), else None.
    docs: (ids [N, Ld] int32, mask [N, Ld] int32) of every doc row (two_tower), else None.
  """
  queries: tuple[np.ndarray, np.ndarray]
  trainset: TrainSet
  pooling: str
  normalize: bool
  doc_vectors: np.ndarray | None = None
  docs: tuple[np.ndarray, np.ndarray] | None = None


@dataclasses.dataclass
class FinetuneResult:
  """What `fit` returns.

  Attributes:
    params: the params best on dev (step 0, the frozen encoder, a candidate); the last ones
      without `evaluate`. {"query"} | {"shared"} | {"query", "doc"} -> encoder params.
    best_step: the step of `params`.
    history: [{"step", "loss", "dev"}] at each evaluation ("loss": the last step's; NaN at 0).
    seconds: wall time of the training steps (and checkpoints but the last), dev evaluations
      excluded, summed over every process that trained this fine-tune: the checkpoint's record
      keeps it, so a fine-tune restored finished reports the seconds of the one that trained it.
    steps: the last step run.
  """
  params: Any
  best_step: int
  history: list[dict[str, float]]
  seconds: float
  steps: int


def check_config(cfg: ml_collections.ConfigDict) -> None:
  """The `finetune` block; raises `InputError` naming `finetune.<field>`."""
  def field(name: str, ok: bool, want: str) -> None:
    require(ok, f"must be {want}, got {cfg[name]!r}", field=f"finetune.{name}")
  field("mode", cfg.mode in MODES, f"one of {MODES}")
  field("loss", cfg.loss in LOSSES, f"one of {LOSSES}")
  field("loss", cfg.loss != "corpus" or cfg.mode == "query_tower",
        "'mnrl' in two_tower mode (the corpus softmax needs frozen doc vectors)")
  field("compute_dtype", cfg.compute_dtype in COMPUTE_DTYPES, f"one of {COMPUTE_DTYPES}")
  field("head", isinstance(cfg.head, str) and bool(cfg.head), "'dot' or a token scorer's name")
  field("head", cfg.head == "dot" or cfg.mode == "two_tower",
        "'dot' in query_tower mode (a token head scores the token states of both sides; the "
        "frozen docs are pooled vectors)")
  for name in ("shared", "remat", "pack"):
    field(name, isinstance(cfg[name], bool), "true or false")
  number = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
  for name in ("temperature", "lr"):
    field(name, number(cfg[name]) and cfg[name] > 0, "a number > 0")
  for name in ("weight_decay", "end_lr_fraction", "clip_norm", "head_lr"):
    field(name, number(cfg[name]) and cfg[name] >= 0, "a number >= 0")
  for name, low in (("batch_size", 1), ("hard_negatives", 0), ("steps", 1), ("eval_every", 1),
                    ("max_length", 0), ("warmup_steps", 0), ("corpus_chunk", 1),
                    ("checkpoint_every", 1), ("keep_checkpoints", 1)):
    field(name, isinstance(cfg[name], int) and not isinstance(cfg[name], bool)
          and cfg[name] >= low, f"an integer >= {low}")


def make_spec(cfg: ml_collections.ConfigDict, encoder: Encoder, pooling: str,
              normalize: bool, head: nn.Module | None = None) -> Spec:
  """The `Spec` of the block `cfg` (checked) for `encoder`, pooled as given; `head`: the token
  scorer `cfg.head` names (a `scorers` module over token states of width n), None for "dot"."""
  check_config(cfg)
  require((head is None) == (cfg.head == "dot"), f"{cfg.head!r} needs its scorer module (and "
          f"'dot' none); got {'none' if head is None else type(head).__name__}",
          field="finetune.head")
  return Spec(module=encoder.module.clone(remat=bool(cfg.remat)), pooling=pooling,
              normalize=bool(normalize), mode=cfg.mode, loss=cfg.loss,
              temperature=float(cfg.temperature), compute_dtype=cfg.compute_dtype,
              corpus_chunk=int(cfg.corpus_chunk), pack=bool(cfg.pack), lr=float(cfg.lr),
              warmup_steps=int(cfg.warmup_steps), end_lr_fraction=float(cfg.end_lr_fraction),
              weight_decay=float(cfg.weight_decay), clip_norm=float(cfg.clip_norm),
              total_steps=int(cfg.steps), head=head, head_lr=float(cfg.head_lr))


def init_params(encoder: Encoder, cfg: ml_collections.ConfigDict,
                head: nn.Module | None = None, seed: int = 0) -> dict[str, Any]:
  """Fresh copies of the encoder's params, one per trained tower: {"query"} (query_tower),
  {"shared"} (two_tower, shared) or {"query", "doc"} (two_tower, two copies); with a token
  `head`, also "head": its initial params (`registry.init_params`, key `seed`)."""
  towers = (("query",) if cfg.mode == "query_tower" else ("shared",) if cfg.shared
            else SIDES)
  params = {t: jax.tree.map(jnp.copy, encoder.params) for t in towers}
  if head is not None:
    params["head"] = registry.init_params(head, jax.random.key(seed))
  return params


def side_params(params: dict[str, Any], side: str, encoder: Encoder) -> Any:
  """The encoder params of one side ("query" | "doc") of a fine-tune's params; the frozen
  `encoder.params` for the doc side of a query_tower fine-tune."""
  require(side in SIDES, f"must be one of {SIDES}, got {side!r}", field="side")
  for tower in ("shared", side):
    if tower in params:
      return params[tower]
  return encoder.params


def init_state(params: dict[str, Any], spec: Spec, mesh: jax.sharding.Mesh) -> dict[str, Any]:
  """{"params", "opt_state", "step"} replicated over `mesh` (float32 params and AdamW moments).
  `params` must not share buffers with anything kept: the train step donates the state."""
  tx = optimizer(spec)
  state = {"params": params, "opt_state": tx.init(params), "step": jnp.zeros((), jnp.int32)}
  return jax.device_put(state, NamedSharding(mesh, P()))


def optimizer(spec: Spec) -> optax.GradientTransformation:
  """`trainer.make_optimizer` of the spec; with a head whose `head_lr` is set, the head's params
  ("head") get their own (the same schedule, peak `head_lr`; clipped on their own norm)."""
  tx = make_optimizer(spec, spec.total_steps)
  if spec.head is None or not spec.head_lr:
    return tx
  return optax.multi_transform(
      {"encoder": tx, "head": make_optimizer(spec._replace(lr=spec.head_lr), spec.total_steps)},
      lambda params: {k: "head" if k == "head" else "encoder" for k in params})


def _hidden(spec: Spec, params: Any, batch: dict[str, jnp.ndarray], side: str) -> jnp.ndarray:
  """One side's ("q" | "d") ids, mask [B, L] of `batch` -> [B, L, n] float32 token states; the
  forward pass in `spec.compute_dtype` (a cast of the float32 params: the gradient reaches
  them in float32), padding-free with `spec.pack` (the side's "rows" [T], "slots" [B, L]: zeros
  on padding)."""
  if spec.compute_dtype == "bfloat16":
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
  ids, mask = batch[f"{side}_ids"], batch[f"{side}_mask"]
  packed = (layers.Packing(*(batch[f"{side}_{f}"] for f in layers.Packing._fields))
            if spec.pack else None)
  return spec.module.apply({"params": params}, ids, mask, packed).astype(jnp.float32)


def _pooled(spec: Spec, params: Any, batch: dict[str, jnp.ndarray], side: str) -> jnp.ndarray:
  """One side's [B, n] float32 pooled vectors (`_hidden`, pooled as the spec says)."""
  return pool(_hidden(spec, params, batch, side), batch[f"{side}_mask"], spec.pooling,
              spec.normalize)


def token_states(spec: Spec, params: Any, batch: dict[str, jnp.ndarray], side: str
                 ) -> jnp.ndarray:
  """One side's [B, L, n] float32 token states as the token cache holds them
  (`data.embeddings.run_model` with tokens): zero at padding, each L2-normalised when
  `spec.normalize` (`l2_normalize`: a finite gradient at the zero padding vectors)."""
  mask = batch[f"{side}_mask"].astype(jnp.float32)[..., None]
  hidden = _hidden(spec, params, batch, side) * mask
  return l2_normalize(hidden) if spec.normalize else hidden


def loss(spec: Spec, params: dict[str, Any], batch: dict[str, jnp.ndarray]) -> jnp.ndarray:
  """The training loss of one batch (scalar).

  Args:
    spec: the step's `Spec`.
    params: the trained towers (`init_params`).
    batch: `batch_arrays`' dict: "q_ids", "q_mask" [B, Lq]; query_tower "docs" [C, n] frozen
      vectors, two_tower "d_ids", "d_mask" [C, Ld]; with `spec.pack` each side's `Packing`
      (`layers.Packing`'s fields: "q_rows" [Tq], "q_slots" [B, Lq], "q_groups" (a tuple of
      [Bg, Lg]), "q_group_rows" [Tq]; the same for "d" with C, Ld, Td); "mnrl": "mask"
      [B, C] (False: not a negative of that query); "corpus": "relevant" [B, R] doc rows
      (-1 padded) and "corpus" [N, n], with C = B (each query's positive).
    With a token head (two_tower, mnrl): the head's `score_all` of the queries' token states
    against the candidates' ([B, C]) in the same masked softmax cross-entropy.
  """
  if spec.head is not None:
    q = token_states(spec, side_params(params, "query", None), batch, "q")
    d = token_states(spec, side_params(params, "doc", None), batch, "d")
    q_mask, d_mask = batch["q_mask"].astype(bool), batch["d_mask"].astype(bool)
    scores = spec.head.apply({"params": params["head"]}, q, q_mask, d, d_mask,
                             method=spec.head.score_all)  # [B, C]
    return losses.softmax_cross_entropy(scores, jnp.arange(q.shape[0]), batch["mask"],
                                        spec.temperature)
  q = _pooled(spec, side_params(params, "query", None), batch, "q")
  if spec.mode == "query_tower":
    docs = batch["docs"]  # [C, n]
  else:
    docs = _pooled(spec, side_params(params, "doc", None), batch, "d")
  if spec.loss == "corpus":
    return losses.corpus_softmax_cross_entropy(
        jnp.sum(q * docs, axis=-1), lambda block: q @ block.T, batch["corpus"],
        batch["relevant"], spec.temperature, spec.corpus_chunk)
  return losses.softmax_cross_entropy(q @ docs.T, jnp.arange(q.shape[0]), batch["mask"],
                                      spec.temperature)


def batch_keys(spec: Spec) -> tuple[str, ...]:
  """The arrays a step's batch holds (`loss`)."""
  sides = ("q",) if spec.mode == "query_tower" else ("q", "d")
  tokens = [f"{s}_{k}" for s in sides
            for k in ("ids", "mask", *(layers.Packing._fields if spec.pack else ()))]
  return (*tokens, *(("docs",) if spec.mode == "query_tower" else ()),
          *(("relevant", "corpus") if spec.loss == "corpus" else ("mask",)))


def batch_arrays(spec: Spec, data: FinetuneData, b: Batch, devices: int = 1
                 ) -> dict[str, np.ndarray]:
  """The host arrays of one sampled batch (all of `batch_keys(spec)` but "corpus"): each side's
  tokens cut to `trimmed_width`, and with `spec.pack` their `layers.packing` (T a multiple of
  `devices`, the data mesh's size)."""
  def side(name: str, tokens: tuple[np.ndarray, np.ndarray], rows: np.ndarray) -> None:
    mask = tokens[1][rows]
    width = layers.trimmed_width(mask)
    out[f"{name}_ids"], out[f"{name}_mask"] = tokens[0][rows, :width], mask[:, :width]
    if spec.pack:
      real = int(np.sum(out[f"{name}_mask"] != 0))
      packed = layers.packing(out[f"{name}_mask"], layers.packed_rows(real, devices))
      out.update({f"{name}_{f}": a for f, a in zip(layers.Packing._fields, packed)})

  out = {}
  side("q", data.queries, b.q_rows)
  if spec.mode == "query_tower":
    out["docs"] = data.doc_vectors[b.cand_rows]
  else:
    side("d", data.docs, b.cand_rows)
  if spec.loss == "corpus":
    out["relevant"] = data.trainset.relevant_rows(b.q_rows).astype(np.int32)
  else:
    out["mask"] = b.mask
  return out


def make_train_step(spec: Spec, mesh: jax.sharding.Mesh | None = None
                    ) -> Callable[[dict, dict], tuple[dict, dict]]:
  """The jitted `step(state, batch) -> (state, {"loss", "grad_norm"})` over `mesh` (default
  `trainer.data_mesh()`): every batch array split on "data" along its first axis (B or C, a
  multiple of the device count) but "corpus" and the packings' attention groups (replicated:
  B / groups rows need not split); the state replicated and donated.
  One per (spec, mesh) per process, so fits that differ in seed or data compile once."""
  return _train_step(spec, data_mesh() if mesh is None else mesh)


@functools.lru_cache(maxsize=8)
def _train_step(spec: Spec, mesh: jax.sharding.Mesh):
  repl, split = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
  batch_sh = {k: repl if k == "corpus" or k.endswith("_groups") else split
              for k in batch_keys(spec)}
  tx = optimizer(spec)

  def step(state, batch):
    value, grads = jax.value_and_grad(lambda p: loss(spec, p, batch))(state["params"])
    updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
    new = {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state,
           "step": state["step"] + 1}
    return new, {"loss": value, "grad_norm": optax.tree.norm(grads)}

  return jax.jit(step, in_shardings=(repl, batch_sh), out_shardings=(repl, repl),
                 donate_argnums=0)


def fit(encoder: Encoder, data: FinetuneData, cfg: ml_collections.ConfigDict, seed: int,
        evaluate: Callable[[dict[str, Any]], float] | None = None,
        checkpoint_dir: str | None = None, stop_after: int | None = None,
        mesh: jax.sharding.Mesh | None = None, head: nn.Module | None = None) -> FinetuneResult:
  """Fine-tunes `encoder` for `cfg.steps` steps and returns the params best on dev.

  Args:
    encoder: the frozen encoder (its params are copied, never changed).
    data: the tokens and rows (`FinetuneData`; doc_vectors for query_tower, docs for two_tower).
    cfg: `config.blocks.finetune_config()`.
    seed: the config seed (batches: `BatchSampler`, a pure function of (seed, step)).
    evaluate: params -> dev metric (higher is better), called at step 0 (the frozen encoder),
      every `eval_every` steps and at the last; None: the last params are returned.
    checkpoint_dir: orbax folder; the latest checkpoint there is resumed (same numbers as an
      uninterrupted run: batches depend on the step only).
    stop_after: stop once this step is done, as if killed there (tests of resumption).
    mesh: the data mesh (default `trainer.data_mesh()`, every device).
    head: the token scorer `cfg.head` names (None for "dot"); its params ("head" of the
      returned params) start from `registry.init_params` with key `seed`.
  """
  spec = make_spec(cfg, encoder, data.pooling, data.normalize, head)
  mesh = data_mesh() if mesh is None else mesh
  ndev, corpus = mesh.devices.size, cfg.loss == "corpus"
  require(cfg.batch_size % ndev == 0, f"must be a multiple of the {ndev} devices, got "
          f"{cfg.batch_size}", field="finetune.batch_size")
  need = "doc_vectors" if cfg.mode == "query_tower" else "docs"
  require(getattr(data, need) is not None, f"mode {cfg.mode!r} needs FinetuneData.{need}",
          field="finetune.mode")
  sampler = BatchSampler(data.trainset, cfg.batch_size, 0 if corpus else cfg.hard_negatives,
                         0, not corpus, seed)
  require(sampler.batch_size == cfg.batch_size, f"{len(data.trainset.pairs)} training pairs "
          f"cannot fill a batch of {cfg.batch_size}", field="finetune.batch_size")
  step_fn = make_train_step(spec, mesh)
  repl = NamedSharding(mesh, P())
  frozen = {"corpus": jax.device_put(np.asarray(data.doc_vectors, np.float32), repl)
            } if corpus else {}
  state = init_state(init_params(encoder, cfg, head, seed), spec, mesh)
  best = {"params": jax.tree.map(jnp.copy, state["params"])}
  record = {"step": 0, "best_step": 0, "best_metric": None, "history": [], "seconds": 0.0}
  ckpt = None
  if checkpoint_dir:
    ckpt = Checkpoints(checkpoint_dir, cfg.checkpoint_every, cfg.keep_checkpoints)
    restored = ckpt.restore({"state": state, "best": best})
    if restored is not None:
      tree, record = restored
      state, best = jax.device_put(tree["state"], repl), jax.device_put(tree["best"], repl)
  started, eval_seconds = time.time(), 0.0

  def evaluate_now(step: int, loss_value: float) -> None:
    nonlocal eval_seconds
    entry = {"step": step, "loss": loss_value}
    if evaluate is not None:
      t = time.time()
      entry["dev"] = value = float(evaluate(state["params"]))
      eval_seconds += time.time() - t
      if record["best_metric"] is None or value > record["best_metric"]:
        record["best_metric"], record["best_step"] = value, step
        best["params"] = jax.tree.map(jnp.copy, state["params"])
    record["history"].append(entry)

  step = int(record["step"])
  seconds0 = float(record["seconds"])
  if step == 0 and not record["history"]:
    evaluate_now(0, float("nan"))
  while step < cfg.steps:
    batch = {**batch_arrays(spec, data, sampler.batch(step), ndev), **frozen}
    state, metrics = step_fn(state, batch)
    step += 1
    if step % cfg.eval_every == 0 or step == cfg.steps:
      evaluate_now(step, float(metrics["loss"]))
    if step == cfg.steps or (stop_after is not None and step >= stop_after):
      jax.block_until_ready(state)  # the last step counted before its checkpoint
    record["step"] = step
    record["seconds"] = seconds0 + time.time() - started - eval_seconds
    if ckpt is not None:
      ckpt.maybe_save(step, {"state": state, "best": best}, record, force=step == cfg.steps)
    if stop_after is not None and step >= stop_after:
      break
  if ckpt is not None:
    ckpt.close()
  return FinetuneResult(params=best["params"] if evaluate is not None else state["params"],
                        best_step=int(record["best_step"]) if evaluate is not None else step,
                        history=record["history"], seconds=record["seconds"], steps=step)


def tuned_encoder(encoder: Encoder, params: Any) -> Encoder:
  """`encoder` with `params` (one side's, `side_params`) in place of its own; its weights hash
  is that of `params` (`files.tree_sha256`), so the embedding cache keys on the weights."""
  return dataclasses.replace(encoder, params=params, hashes={
      **encoder.hashes, "weights_sha256": files.tree_sha256(params)})


def encode_side(texts: Sequence[str], encoder_cfg: ml_collections.ConfigDict, encoder: Encoder,
                params: dict[str, Any], side: str, prefix: str = "") -> np.ndarray:
  """Pooled vectors [N, n] float32 of `texts` (after `prefix`) by one side of a fine-tune's
  params, through `data.embeddings.encode` and its cache: the same weights never encode twice,
  other weights never hit the entry (the query_tower doc side is the frozen encoder's entry)."""
  return embeddings.encode(texts, encoder_cfg, prefix=prefix, desc=f"{side} encode",
                           encoder=tuned_encoder(encoder, side_params(params, side, encoder)))
