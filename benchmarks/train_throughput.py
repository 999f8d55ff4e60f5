"""Training throughput: the project's jitted, sharded `fit` vs a plain PyTorch CPU loop.

    python benchmarks/train_throughput.py                       # bilinear + lowrank, n = 384, 768
    python benchmarks/train_throughput.py --steps 20 --warmup 5 --dims 64 --docs 2000 \
        --queries 500 --json runs/train.json                    # smoke run

torch is not a dependency of the project; this script alone needs it (`pip install torch==2.13.0`,
the CPU wheel) and exits with a message when it is missing.

What both sides compute, per step, on identical batches and from identical initial params:
  * batch: `BatchSampler(trainset, B, hard=0, random=1, in_batch=True, seed)` of
    bilinear_ir.data.batches — B query rows, C = 2B candidate doc rows (the B positives, then one
    uniformly random doc per query) and a [B, C] mask (False where a candidate is judged relevant
    to the query, except its own positive). Both sides call the same sampler on the host each
    step; embeddings stay in memory (on device) and are gathered by row inside the step.
  * scores [B, C]: `bilinear` q^T W d as (q W) d^T on both sides (the cheaper order when C > B;
    W [n, n] starts at the identity), `lowrank`
    (q P)(d Q)^T with P, Q [n, 32], residual "none" (the paper's form; P = Q orthonormal at init).
  * loss: softmax cross entropy of column i for row i of `scores / 0.05`, masked entries -inf
    (`losses.softmax_cross_entropy` / `F.cross_entropy`), i.e. in-batch + 1 random negative.
  * update: global-norm clipping at 1.0, AdamW (b1 0.9, b2 0.999, eps 1e-8, weight decay 0) at
    the trainer's warm-up + cosine learning rate, skipped when the gradient is not finite
    (`trainer.make_optimizer` / `clip_grad_norm_` + `torch.optim.AdamW`).
Corpus: `--docs` doc and `--queries` query embeddings ~ N(0, I/n), one positive pair per query with
a uniformly random doc. The losses both sides log every 50 steps are printed side by side: they
agree when both train the same model on the same batches.

Timing (wall clock, host batch sampling included on both sides, as in real training):
  * ours: one `trainer.fit` run of warmup + steps steps on all local devices, without
    checkpoints, logs or progress bar, `--steps-per-call` steps per jitted call (default: the
    trainer's `train.steps_per_call`; 1 gives one call per step). The first round's `fit`
    compiles the step (later rounds reuse it); every round's own first `warmup` steps are the
    warm-up, so all rounds are timed alike: `train.eval_every = warmup` and an `evaluate` hook
    that only reads the clock (returning a constant metric) marks the end of step `warmup`, and
    the timed window runs from there to fit's return. fit reads the loss
    on the host (a sync) before each evaluation and at the end, so both ends of the window are
    synchronised; the default warmup, 50, is also the trainer's default `eval_every`, the
    cadence of those syncs in any run. `first s` is the rest of the first round's run: set-up
    (device_put of the features, optimizer init), tracing and compilation, i.e. the run's time
    minus (warmup + steps) steady-state steps.
  * torch: one loop of warmup + steps steps with `torch.set_num_threads(os.cpu_count())`, timed
    over its last `steps` steps.
  * sampling: the host cost of `BatchSampler.batch` alone (ms per step), part of both times.
Each case runs `--rounds` rounds (default 3), each timing both sides once, alternating which goes
first; times are medians over rounds, the ratio the median of the per-round ratios (all printed).
examples/s = B * steps / time; ratio = ours / torch examples/s.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import jax
import ml_collections
import numpy as np
import optax

from bilinear_ir import allocator, files, scorers
from bilinear_ir.data.batches import BatchSampler, TrainSet
from bilinear_ir.train import trainer
from bilinear_ir.retrieval import latency
from bilinear_ir import defaults

CASES = {"bilinear": {}, "lowrank": {"rank": 32, "residual": "none"}}


def hardware(torch_version: str) -> str:
  """The machine (retrieval.latency.hardware), torch version and threads."""
  return f"{latency.hardware()}; torch {torch_version} ({os.cpu_count()} threads)"


def corpus(n: int, num_docs: int, num_queries: int, seed: int
           ) -> tuple[np.ndarray, np.ndarray, TrainSet]:
  """Random embeddings and pairs: queries [Q, n], docs [N, n] ~ N(0, I/n); pair (i, random doc)."""
  rng = np.random.default_rng(seed)
  queries = (rng.standard_normal((num_queries, n)) / np.sqrt(n)).astype(np.float32)
  docs = (rng.standard_normal((num_docs, n)) / np.sqrt(n)).astype(np.float32)
  pairs = np.stack([np.arange(num_queries), rng.integers(0, num_docs, num_queries)], 1)
  return queries, docs, TrainSet(pairs, num_queries, num_docs)


def train_cfg(batch: int, steps: int, per_call: int | None = None) -> ml_collections.ConfigDict:
  """The trainer's defaults with the benchmark's batch: softmax, in-batch + 1 random negative,
  and a fixed temperature (0.05) that the PyTorch loop applies the same way."""
  cfg = defaults.train_config()
  cfg.batch_size, cfg.steps = batch, steps
  if per_call is not None:
    cfg.steps_per_call = per_call
  cfg.hard_negatives, cfg.random_negatives, cfg.in_batch = 0, 1, True
  cfg.auto_temperature, cfg.temperature = False, 0.05
  return cfg


def learning_rates(cfg: ml_collections.ConfigDict, total: int) -> np.ndarray:
  """[total] learning rate of each step, the schedule of `trainer.make_optimizer`."""
  schedule = optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=cfg.lr, warmup_steps=min(cfg.warmup_steps, total - 1),
      decay_steps=max(total, 1), end_value=cfg.lr * cfg.end_lr_fraction)
  return np.asarray(schedule(np.arange(total)), np.float64)


def time_fit(module: Any, params: Any, queries: np.ndarray, docs: np.ndarray, ts: TrainSet,
             cfg: ml_collections.ConfigDict, seed: int
             ) -> tuple[float, float, list[dict[str, float]]]:
  """One `trainer.fit` run, clocked by its evaluation hook (module docstring).

  Returns:
    (seconds of the whole run, seconds of its steps after the first `cfg.eval_every`, history).
  """
  marks = []

  def clock(p: Any) -> dict[str, float]:
    jax.block_until_ready(p)
    marks.append(time.perf_counter())
    return {cfg.select_metric: 0.0}

  start = time.perf_counter()
  res = trainer.fit(module, params, queries, docs, ts, cfg, seed=seed, evaluate=clock,
                    progress=False)
  jax.block_until_ready(res.last_params)
  end = time.perf_counter()
  return end - start, end - marks[1], res.history  # marks: steps 0, eval_every, 2 eval_every..


def torch_loop(torch: Any, case: str, params: Any, queries: np.ndarray, docs: np.ndarray,
               ts: TrainSet, cfg: ml_collections.ConfigDict, warmup: int, seed: int
               ) -> tuple[float, dict[int, float]]:
  """Trains the same model with torch for `cfg.steps` steps; seconds of the steps after `warmup`.

  Returns:
    (seconds of steps warmup .. cfg.steps - 1, {step: loss} logged every `cfg.eval_every` steps
    and at the last step, as `fit`'s history).
  """
  import torch.nn.functional as F  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(os.cpu_count())
  qf, df = torch.from_numpy(queries), torch.from_numpy(docs)
  if case == "bilinear":
    w = torch.nn.Parameter(torch.tensor(np.asarray(params["W"])))
    weights = [w]
    score = lambda q, d: (q @ w) @ d.T  # [B, C], the association of bilinear.score_all
  else:
    p = torch.nn.Parameter(torch.tensor(np.asarray(params["P"])))
    qm = torch.nn.Parameter(torch.tensor(np.asarray(params["Q"])))
    weights = [p, qm]
    score = lambda q, d: (q @ p) @ (d @ qm).T  # [B, C]
  opt = torch.optim.AdamW(weights, lr=cfg.lr, betas=(0.9, 0.999), eps=1e-8,
                          weight_decay=cfg.weight_decay)
  lrs = learning_rates(cfg, cfg.steps)
  sampler = BatchSampler(ts, cfg.batch_size, cfg.hard_negatives, cfg.random_negatives,
                         cfg.in_batch, seed)
  logged = {}
  start = time.perf_counter()
  for step in range(cfg.steps):
    if step == warmup:
      start = time.perf_counter()
    batch = sampler.batch(step)
    q = qf[torch.from_numpy(batch.q_rows).long()]  # [B, n]
    d = df[torch.from_numpy(batch.cand_rows).long()]  # [C, n]
    mask = torch.from_numpy(batch.mask)  # [B, C]
    logits = (score(q, d) / cfg.temperature).masked_fill(~mask, float("-inf"))
    loss = F.cross_entropy(logits, torch.arange(len(batch.q_rows)))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(weights, cfg.clip_norm)
    if torch.isfinite(norm):
      for group in opt.param_groups:
        group["lr"] = float(lrs[step])
      opt.step()
    done = step + 1
    if done % cfg.eval_every == 0 or done == cfg.steps:
      logged[done] = float(loss.detach())
  return time.perf_counter() - start, logged


def sampling_ms(ts: TrainSet, cfg: ml_collections.ConfigDict, steps: int, seed: int) -> float:
  """Host milliseconds per `BatchSampler.batch` call over `steps` steps."""
  sampler = BatchSampler(ts, cfg.batch_size, cfg.hard_negatives, cfg.random_negatives,
                         cfg.in_batch, seed)
  start = time.perf_counter()
  for step in range(steps):
    sampler.batch(step)
  return (time.perf_counter() - start) / steps * 1e3


def run_case(torch: Any, case: str, n: int, args: argparse.Namespace) -> dict[str, Any]:
  """One (scorer, n) case: examples/s of ours and torch and the breakdown (module docstring).

  `args.rounds` rounds, each timing ours and torch once (alternating which goes first, so a
  machine whose speed drifts favours neither); times are the medians over rounds and the ratio
  is the median of the rounds' ratios.
  """
  queries, docs, ts = corpus(n, args.docs, args.queries, args.seed)
  module = scorers.build(case, dim=n, **CASES[case])
  params = scorers.init_params(module, jax.random.key(args.seed))
  cfg = train_cfg(args.batch, args.warmup + args.steps, args.steps_per_call)
  cfg.eval_every = args.warmup
  ours, theirs, runs = [], [], []
  for r in range(args.rounds):
    for side in (("ours", "torch") if r % 2 == 0 else ("torch", "ours")):
      if side == "ours":
        t_run, ours_s, history = time_fit(module, params, queries, docs, ts, cfg, args.seed)
        ours.append(ours_s)
        runs.append(t_run - ours_s * (args.warmup + args.steps) / args.steps)
      else:
        torch_s, torch_losses = torch_loop(torch, case, params, queries, docs, ts, cfg,
                                           args.warmup, args.seed)
        theirs.append(torch_s)
  ours_s, torch_s = float(np.median(ours)), float(np.median(theirs))
  sample_ms = sampling_ms(ts, cfg, min(args.steps, 100), args.seed)
  examples = args.batch * args.steps
  row = {"name": f"{case} n={n} B={args.batch}", "examples_per_s": examples / ours_s,
         "torch_examples_per_s": examples / torch_s,
         "ratio_vs_torch": float(np.median(np.asarray(theirs) / np.asarray(ours))),
         "ratio_per_round": [round(t / o, 3) for t, o in zip(theirs, ours)],
         "ms_per_step": ours_s / args.steps * 1e3, "torch_ms_per_step": torch_s / args.steps * 1e3,
         "sampling_ms_per_step": sample_ms,
         "fit_first_s": runs[0],
         "losses": [{"step": h["step"], "ours": h["loss"], "torch": torch_losses.get(h["step"])}
                    for h in history if h["step"] in torch_losses]}
  return row


def main(argv: list[str] | None = None) -> None:
  """Parses arguments, runs every case and prints (and optionally writes) the table."""
  allocator.keep_freed_memory()  # as the project's binary does (bilinear_ir.allocator)
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--cases", default="bilinear,lowrank", help="comma list of " + ",".join(CASES))
  ap.add_argument("--dims", default="384,768", help="comma list of embedding widths n")
  ap.add_argument("--batch", type=int, default=256, help="queries per step B")
  ap.add_argument("--steps", type=int, default=200, help="timed steps")
  ap.add_argument("--warmup", type=int, default=50,
                  help="untimed steps before them (compilation); also fit's eval_every")
  ap.add_argument("--rounds", type=int, default=3,
                  help="timed runs of each side per case, alternating (medians reported)")
  ap.add_argument("--steps-per-call", type=int, default=None,
                  help="fit's train.steps_per_call (default: the trainer's)")
  ap.add_argument("--docs", type=int, default=20000, help="corpus docs N")
  ap.add_argument("--queries", type=int, default=5000, help="training queries (= pairs)")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--json", default=None, help="write the results here")
  args = ap.parse_args(argv)
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    sys.exit("train_throughput needs PyTorch for its peer: pip install torch==2.13.0 "
             "(the CPU wheel; torch is not a dependency of bilinear_ir)")
  cases = [c.strip() for c in args.cases.split(",") if c.strip()]
  unknown = sorted(set(cases) - set(CASES))
  if unknown:
    sys.exit(f"unknown case(s) {unknown}; known: {sorted(CASES)}")
  dims = [int(d) for d in args.dims.split(",")]
  if min(args.steps, args.warmup, args.rounds,
         1 if args.steps_per_call is None else args.steps_per_call) < 1:
    sys.exit("--steps, --warmup, --rounds and --steps-per-call must be >= 1")
  if not 1 <= args.batch <= args.queries or args.batch % jax.device_count():
    sys.exit(f"--batch must be <= --queries and a multiple of the {jax.device_count()} devices")
  if "lowrank" in cases and min(dims) < CASES["lowrank"]["rank"]:
    sys.exit(f"lowrank needs n >= its rank {CASES['lowrank']['rank']}")
  hw = hardware(torch.__version__)
  print(hw)
  print(f"corpus: {args.docs} docs, {args.queries} queries/pairs; batch {args.batch} queries x "
        f"{2 * args.batch} candidates; {args.warmup} warm-up + {args.steps} timed steps")
  header = (f"{'case':<24}{'ours ex/s':>11}{'torch ex/s':>12}{'ratio':>7}{'ours ms':>9}"
            f"{'torch ms':>10}{'sample ms':>11}{'first s':>9}")
  print(header)
  rows = []
  for case in cases:
    for n in dims:
      r = run_case(torch, case, n, args)
      rows.append(r)
      print(f"{r['name']:<24}{r['examples_per_s']:>11.0f}{r['torch_examples_per_s']:>12.0f}"
            f"{r['ratio_vs_torch']:>7.2f}{r['ms_per_step']:>9.2f}{r['torch_ms_per_step']:>10.2f}"
            f"{r['sampling_ms_per_step']:>11.2f}{r['fit_first_s']:>9.2f}  rounds "
            f"{r['ratio_per_round']}", flush=True)
  print("loss check (same batches, same init; ours vs torch at logged steps):")
  for r in rows:
    pairs = ", ".join(f"{x['step']}: {x['ours']:.4f}/{x['torch']:.4f}" for x in r["losses"])
    worst = max(abs(x["ours"] - x["torch"]) / max(abs(x["torch"]), 1e-12) for x in r["losses"])
    print(f"  {r['name']}: {pairs} (max relative difference {worst:.1e})")
  if args.json:
    files.atomic_write_json(args.json, {"hardware": hw, "cases": rows})


if __name__ == "__main__":
  main()
