"""The project's two-tower fine-tune against sentence-transformers' own training of the same recipe.

    python benchmarks/finetune_peer.py                          # SciFact, 4 steps: a minute or two
    python benchmarks/finetune_peer.py --collection insuranceqa --steps 2000 --batch_size 64 \
        --max_length 256 --docs 0                               # a real run (the full corpus)

Needs the `peer` extra (sentence-transformers, torch, datasets, accelerate).

The work, the same on both sides: all-MiniLM-L6-v2 (`--model`), one shared encoder for queries
and docs, its pooling and normalisation; `--steps` steps of `--batch_size` (query, positive,
hard negative) triplets, the very same triplets in the same order (the project's
`data.batches.BatchSampler` draws them: the training split's judged pairs, one negative per
query from its hard pool: BM25's top `--hard_depth`, InsuranceQA's listed negatives), texts cut
at `--max_length` tokens; softmax over the batch's positives and hard negatives at scale 20
(temperature 0.05); AdamW at `--lr` (betas 0.9 / 0.999, eps 1e-8, no weight decay), linear
warm-up over `--warmup` steps, then cosine decay to 0; gradients clipped at norm 1; float32 (on an
NVIDIA GPU both sides' matmuls in TF32, jax's default there: the peer turns it on); no
dropout (the project's encoders have none: the peer's is set to 0).
  * project: `train.finetune.fit` (mode two_tower, shared, loss mnrl): one jitted step over the
    jax devices; each batch cut to its longest text (rounded up to a power of two) and, with
    `--pack` (the default), padding-free: the Transformer layers run on the batch's real tokens
    only (`encoders.layers.Packing`), attention in groups of texts of similar length, each at
    its own width; the same loss and gradients. One warm-up run first
    (it compiles the step for every batch shape of the run), then the timed run.
  * peer: `SentenceTransformerTrainer` with `MultipleNegativesRankingLoss(scale=20)` on torch
    (CUDA when present, else the CPU with `torch.get_num_threads()` threads), the triplets fed
    in order (a sequential batch sampler); its first step is not timed. It tokenizes each batch
    in its collator, padded to the batch's longest text (anchors, positives and negatives
    apart); the project's tokens are made once before training. transformers' BERT has no
    padding-free path on the CPU (its packed-sequence training needs FlashAttention on CUDA).
The output names the tokens each side's encoder computes per step ("tokens_per_step").
Known difference: the project's loss leaves out of a query's negatives every doc judged relevant
to it (another query's positive that is also its own); MultipleNegativesRankingLoss does not.

Both are evaluated by the project's evaluation (`experiment.evaluate.RankingEvaluator`, dot
product, nDCG@10 and the other measures): every test query ranked over the corpus, or, with
`--docs N`, over N docs (the test queries' judged docs and the training batches' docs first,
then the corpus in order) so that the default run encodes a few hundred docs, not 5,183.
Prints one JSON object: per jax backend, `project` and `peer` ({metrics, examples_per_s,
seconds, device, first_loss: the loss of step 1, from the same weights on the same batch; the
peer logs it rounded to 4 decimals}) and `ratio` (project / peer examples/s; project - peer
nDCG@10).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import tempfile
import time

import jax
import numpy as np

from bilinear_ir import allocator
from bilinear_ir import timing
from bilinear_ir.config import blocks
from bilinear_ir.data import batches
from bilinear_ir.data import embeddings
from bilinear_ir.data import loaders
from bilinear_ir.data import pipeline
from bilinear_ir.encoders import names
from bilinear_ir.experiment import evaluate
from bilinear_ir.experiment import finetuning
from bilinear_ir.experiment import spec as spec_lib
from bilinear_ir.scorers import registry
from bilinear_ir.train import finetune
from bilinear_ir.train import trainer

MEASURES = ("ndcg@10", "mrr@10", "recall@100")


def parse(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--collection", default="scifact",
                 help="scifact | insuranceqa | a BEIR folder or zip with a train split")
  p.add_argument("--data_path", default="",
                 help="insuranceqa: a folder of the package's files (launch/pack_device_inputs.py)")
  p.add_argument("--model", default="all-MiniLM-L6-v2",
                 help="the encoder both sides start from (a name or a model folder)")
  p.add_argument("--steps", type=int, default=4)
  p.add_argument("--batch_size", type=int, default=16)
  p.add_argument("--lr", type=float, default=5e-5)
  p.add_argument("--warmup", type=int, default=1)
  p.add_argument("--max_length", type=int, default=128)
  p.add_argument("--hard_depth", type=int, default=100)
  p.add_argument("--docs", type=int, default=400, help="docs ranked (0: the whole corpus)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--cache_dir", default="", help="embedding cache ('' = a temporary folder)")
  p.add_argument("--pack", action=argparse.BooleanOptionalAction, default=True,
                 help="the project's padding-free training (--no-pack: padded batches)")
  return p.parse_args(argv)


@dataclasses.dataclass
class Work:
  """What both sides train and evaluate on: the collection, its splits, the encoder, its
  settings, the training data (`FinetuneData`) and the triplets [steps * B] (text, text, text)."""
  coll: object
  splitset: pipeline.SplitSet
  encoder: object
  settings: dict
  data: finetune.FinetuneData
  triplets: list
  doc_rows: np.ndarray  # [N'] rows of the docs ranked at test


def prepare(args) -> Work:
  """Loads the collection and draws the triplets of every step (`BatchSampler`, one hard
  negative per query)."""
  data_cfg = blocks.data_config()
  data_cfg.path = args.data_path
  data_cfg = spec_lib.collection_block(data_cfg, args.collection)
  coll = loaders.load(data_cfg)
  splitset = pipeline.splits(coll, data_cfg, args.seed)[0]
  encoder = names.load_encoder(args.model)
  settings = {**encoder.defaults, "max_length": args.max_length, "query_prompt": "",
              "doc_prompt": ""}
  qids = sorted(coll.queries)
  idx, scores, _ = pipeline.bm25_ranking(coll, qids, blocks.bm25_config())
  none = np.zeros((0, 0), np.float32)  # pipeline.trainset reads the BM25 rankings only
  prepared = pipeline.Prepared(coll, embeddings.Embeddings(coll.doc_ids, none, qids, none, {}),
                               np.asarray(idx), np.asarray(scores))
  train = splitset.train
  trainset, _ = pipeline.trainset(prepared, train, args.hard_depth,
                                  "dataset" if args.collection == "insuranceqa" else "bm25")
  tokens = lambda texts: finetuning.tokens(encoder, texts, args.max_length, "")
  data = finetune.FinetuneData(queries=tokens([coll.queries[q] for q in train.query_ids]),
                               trainset=trainset, pooling=settings["pooling"],
                               normalize=bool(settings["normalize"]),
                               docs=tokens(coll.doc_strings()))
  sampler = batches.BatchSampler(trainset, args.batch_size, 1, 0, True, args.seed)
  docs, triplets, used = coll.doc_strings(), [], []
  for step in range(args.steps):
    b = sampler.batch(step)
    B = len(b.q_rows)
    assert np.all(b.mask[np.arange(B), B + np.arange(B)]), "a query without a hard negative"
    triplets += [(coll.queries[train.query_ids[q]], docs[p], docs[n])
                 for q, p, n in zip(b.q_rows, b.cand_rows[:B], b.cand_rows[B:])]
    used += list(b.cand_rows)
  index = coll.doc_index()
  judged = [index[d] for q in splitset.test.query_ids for d in splitset.test.qrels[q]]
  first = list(dict.fromkeys(judged + used + list(range(coll.num_docs))))
  rows = np.sort(first[:args.docs] if args.docs else first)
  return Work(coll, splitset, encoder, settings, data, triplets, rows)


def evaluate_vectors(work: Work, queries: np.ndarray, docs: np.ndarray) -> dict:
  """The project's evaluation of query vectors [Q_test, n] over doc vectors [N', n]."""
  test, coll = work.splitset.test, work.coll
  doc_ids = [coll.doc_ids[i] for i in work.doc_rows]
  ranked = set(doc_ids)
  qrels = {q: {d: r for d, r in test.qrels[q].items() if d in ranked} for q in test.query_ids}
  module = registry.build("dot", queries.shape[1])
  ev = evaluate.RankingEvaluator(test.query_ids, doc_ids, qrels, MEASURES, "full",
                                 min(100, len(doc_ids)))
  return ev(module, registry.init_params(module, jax.random.key(0)), queries, docs)[0]["mean"]


def warm_up(work: Work, cfg, seed: int) -> dict:
  """Compiles the project's step for every batch shape of the run (one untimed step from a fresh
  state per shape) and counts the tokens each side's encoder computes.

  Returns:
    {"compiled_shapes", "compile_seconds" (the warm-up steps, compilation included: outside
    the timed run), "tokens_per_step": {"project": the packed rows (or padded tokens) per
    step, "peer": queries, positives and negatives each padded to their longest}} (means).
  """
  spec = finetune.make_spec(cfg, work.encoder, work.data.pooling, work.data.normalize)
  mesh = trainer.data_mesh()
  step = finetune.make_train_step(spec, mesh)
  sampler = batches.BatchSampler(work.data.trainset, cfg.batch_size, cfg.hard_negatives, 0, True,
                                 seed)
  shapes, ours, theirs = {}, [], []
  for i in range(cfg.steps):
    b = sampler.batch(i)
    arrays = finetune.batch_arrays(spec, work.data, b, mesh.devices.size)
    shapes.setdefault(tuple(map(np.shape, jax.tree.leaves(arrays))), arrays)
    ours.append(sum(arrays[f"{s}_rows"].size if cfg.pack else arrays[f"{s}_ids"].size
                    for s in ("q", "d")))
    B = len(b.q_rows)
    lengths = lambda block, rows: int(np.max(np.sum(block[1][rows] != 0, axis=1)))
    theirs.append(B * (lengths(work.data.queries, b.q_rows)
                       + lengths(work.data.docs, b.cand_rows[:B])
                       + lengths(work.data.docs, b.cand_rows[B:])))
  t0 = time.perf_counter()
  for arrays in shapes.values():
    state = finetune.init_state(finetune.init_params(work.encoder, cfg), spec, mesh)
    jax.block_until_ready(step(state, arrays))
  return {"compiled_shapes": len(shapes), "compile_seconds": round(time.perf_counter() - t0, 1),
          "tokens_per_step": {
      "project": float(np.mean(ours)), "peer": float(np.mean(theirs))}}


def project(work: Work, args, cache_dir: str) -> dict:
  """The project's fine-tune: the warm-up (compilation), the timed run, the evaluation."""
  cfg = blocks.finetune_config()
  cfg.update(dict(mode="two_tower", shared=True, loss="mnrl", temperature=0.05, lr=args.lr,
                  warmup_steps=args.warmup, end_lr_fraction=0.0, weight_decay=0.0,
                  clip_norm=1.0, batch_size=args.batch_size, hard_negatives=1,
                  steps=args.steps, eval_every=1, max_length=args.max_length,
                  pack=args.pack))
  compiled = warm_up(work, cfg, args.seed)
  result = finetune.fit(work.encoder, work.data, cfg, args.seed)
  enc = blocks.encoder_config()
  enc.model, enc.cache_dir, enc.max_length = work.encoder.path, cache_dir, args.max_length
  test, coll = work.splitset.test, work.coll
  q = finetune.encode_side([coll.queries[i] for i in test.query_ids], enc, work.encoder,
                           result.params, "query")
  d = finetune.encode_side([coll.doc_strings()[i] for i in work.doc_rows], enc, work.encoder,
                           result.params, "doc")
  return {"metrics": evaluate_vectors(work, q, d), "seconds": round(result.seconds, 3),
          "examples_per_s": args.steps * args.batch_size / result.seconds,
          "first_loss": result.history[1]["loss"], **compiled,
          "padding_free": bool(args.pack),
          "device": f"jax {jax.default_backend()} ({jax.device_count()} x "
                    f"{jax.devices()[0].device_kind})"}


def peer(work: Work, args) -> dict:
  """sentence-transformers' `SentenceTransformerTrainer` + `MultipleNegativesRankingLoss`."""
  try:  # pylint: disable=g-import-not-at-top
    import accelerate  # noqa: F401  (the Trainer needs it)
    import datasets
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer
    from sentence_transformers import SentenceTransformerTrainer
    from sentence_transformers import SentenceTransformerTrainingArguments
    from sentence_transformers import util
  except ImportError as e:
    raise SystemExit(f"finetune_peer needs the peer extra ({e.name} is missing): "
                     "pip install -c constraints.txt -e '.[peer]'") from e
  try:  # sentence-transformers 6 moved them; 5 has them at the top
    from sentence_transformers.sentence_transformer import losses
    from sentence_transformers.sentence_transformer import modules as models
  except ImportError:
    from sentence_transformers import losses, models
  from sentence_transformers.base.sampler import DefaultBatchSampler
  device = "cuda" if torch.cuda.is_available() else "cpu"
  if device == "cuda":  # jax's float32 matmuls on an NVIDIA GPU (Ampere on) are TF32 by default
    torch.backends.cuda.matmul.allow_tf32 = True  # (the project's step); torch's are not: the
    torch.backends.cudnn.allow_tf32 = True        # same precision on both sides
  torch.manual_seed(args.seed)
  body = models.Transformer(work.encoder.path, max_seq_length=args.max_length, config_kwargs={
      "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0})
  mods = [body, models.Pooling(work.encoder.hidden_size, work.settings["pooling"])]
  if work.settings["normalize"]:
    mods.append(models.Normalize())
  # float32 on both sides (the project reads a float16 model folder, as
  # launch/pack_device_inputs.py writes, as float32; transformers would keep float16).
  model = SentenceTransformer(modules=mods, device=device).float()
  loss = losses.MultipleNegativesRankingLoss(model, scale=20.0, similarity_fct=(
      util.cos_sim if work.settings["normalize"] else util.dot_score))
  train = datasets.Dataset.from_dict(dict(zip(("anchor", "positive", "negative"),
                                              map(list, zip(*work.triplets)))))
  marks, logged = [], []

  class Clock(transformers.TrainerCallback):
    def on_step_end(self, *unused, **unused_kw):
      if device == "cuda":
        torch.cuda.synchronize()
      marks.append(time.perf_counter())

    def on_log(self, *unused, logs=None, **unused_kw):
      if logs and "loss" in logs:
        logged.append(float(logs["loss"]))

  with tempfile.TemporaryDirectory() as out:
    targs = SentenceTransformerTrainingArguments(
        output_dir=out, max_steps=args.steps, per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr, warmup_steps=args.warmup, lr_scheduler_type="cosine",
        weight_decay=0.0, max_grad_norm=1.0, seed=args.seed, report_to="none",
        save_strategy="no", logging_steps=1, dataloader_drop_last=True,
        use_cpu=device == "cpu", batch_sampler=lambda dataset, batch_size, drop_last, **_:
        DefaultBatchSampler(torch.utils.data.SequentialSampler(dataset), batch_size, drop_last))
    with contextlib.redirect_stdout(sys.stderr):  # the Trainer prints its logs: stdout is the JSON
      SentenceTransformerTrainer(model=model, args=targs, train_dataset=train, loss=loss,
                                 callbacks=[Clock()]).train()
  timed = max(len(marks) - 1, 1)
  seconds = marks[-1] - marks[0] if len(marks) > 1 else float("nan")
  test, coll = work.splitset.test, work.coll
  encode = lambda texts: model.encode(texts, batch_size=64, convert_to_numpy=True,
                                      show_progress_bar=False)
  q = encode([coll.queries[i] for i in test.query_ids])
  d = encode([coll.doc_strings()[i] for i in work.doc_rows])
  return {"metrics": evaluate_vectors(work, q, d), "seconds": round(seconds, 3),
          "examples_per_s": timed * args.batch_size / seconds, "first_loss": logged[0],
          "device": f"torch {torch.__version__} {device}" + (
              f" ({torch.get_num_threads()} threads)" if device == "cpu" else
              f" ({torch.cuda.get_device_name()}, TF32 matmuls)")}


def main(argv=None) -> dict:
  args = parse(argv)
  allocator.keep_freed_memory()  # as the project's binary does (bilinear_ir.allocator)
  work = prepare(args)
  with tempfile.TemporaryDirectory() as tmp:
    ours = project(work, args, args.cache_dir or tmp)
  theirs = peer(work, args)
  out = {"hardware": timing.hardware(), "collection": args.collection, "model": args.model,
         "steps": args.steps, "batch_size": args.batch_size, "lr": args.lr,
         "warmup_steps": args.warmup, "max_length": args.max_length, "temperature": 0.05,
         "docs_ranked": int(len(work.doc_rows)), "test_queries": len(work.splitset.test.query_ids),
         jax.default_backend(): {"project": ours, "peer": theirs, "ratio": {
             "examples_per_s": ours["examples_per_s"] / theirs["examples_per_s"],
             "ndcg@10_diff": ours["metrics"]["ndcg@10"] - theirs["metrics"]["ndcg@10"]}}}
  print(json.dumps(out, indent=1))
  return out


if __name__ == "__main__":
  os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
  main()
