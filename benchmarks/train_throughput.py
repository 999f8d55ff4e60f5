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
  * torch (eager): one loop of warmup + steps steps, timed over its last `steps` steps. Threads:
    `--torch-threads auto` (default) times 30 steps with each of os.cpu_count() and 1 thread per
    case and keeps the faster (printed per case); OpenMP's wait policy is `--omp-wait-policy`
    (default PASSIVE, set before torch is imported): with libgomp's default spinning, a
    2-thread torch loop on a machine with any other load ran 100 steps in 1.5 to 23 s against
    0.6 s with PASSIVE (a descheduled thread stalls every parallel region), while PASSIVE costs
    little when the machine is quiet.
  * torch (compiled): the same loop with the loss (row gathers, scores, masked cross entropy) and
    its backward compiled by `torch.compile(fullgraph=True)` (TorchInductor, C++/OpenMP code built
    with the machine's gcc) and `optimizer.step` compiled too (AdamW with a tensor learning rate,
    so the schedule does not recompile); gradient clipping and the finite check stay eager. The
    dynamo cache is reset before each run (recompiles would otherwise hit its cache limit and
    fall back to eager), so every run compiles during its own warm-up steps. When compilation
    fails on a machine, `ratio_vs_torch_compiled` is null and `note` says why.
  * sampling: the host cost of `BatchSampler.batch` alone (ms per step), part of both times.
Each case runs `--rounds` rounds (default 3), each timing every side once, in an order that
rotates between rounds; times are medians over rounds, each ratio the median of the per-round
ratios (all printed). examples/s = B * steps / time; ratio = ours / torch examples/s
(`ratio_vs_torch`: eager, `ratio_vs_torch_compiled`: compiled). Our side runs with the trainer's
default `train.matmul_precision` ("default": float32 on CPU).
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

from bilinear_ir import allocator, files, scorers, timing
from bilinear_ir.config import blocks
from bilinear_ir.data.batches import BatchSampler, TrainSet
from bilinear_ir.train import trainer

CASES = {"bilinear": {}, "lowrank": {"rank": 32, "residual": "none"}}


def hardware(torch_version: str) -> str:
  """The machine (timing.hardware), torch version and its OpenMP wait policy."""
  return (f"{timing.hardware()}; torch {torch_version} (OMP_WAIT_POLICY="
          f"{os.environ.get('OMP_WAIT_POLICY', 'unset')}, threads chosen per case)")


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
  cfg = blocks.train_config()
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
               ts: TrainSet, cfg: ml_collections.ConfigDict, warmup: int, seed: int,
               compiled: bool = False, threads: int | None = None, device: str = "cpu"
               ) -> tuple[float, dict[int, float]]:
  """Trains the same model with torch for `cfg.steps` steps; seconds of the steps after `warmup`.

  Args:
    compiled: compile the loss + backward and the optimizer step (`torch.compile`, module
      docstring); eager otherwise.
    threads: torch's intra-op threads (default os.cpu_count()).
    device: "cpu" or "cuda" (embeddings, params and each batch on it; the clock is read after
      `torch.cuda.synchronize()`).

  Returns:
    (seconds of steps warmup .. cfg.steps - 1, {step: loss} logged every `cfg.eval_every` steps
    and at the last step, as `fit`'s history).
  """
  import torch.nn.functional as F  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(threads or os.cpu_count())
  sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
  qf, df = torch.from_numpy(queries).to(device), torch.from_numpy(docs).to(device)
  tensor = lambda x: torch.tensor(np.asarray(x), device=device)
  if case == "bilinear":
    w = torch.nn.Parameter(tensor(params["W"]))
    weights = [w]
    score = lambda q, d: (q @ w) @ d.T  # [B, C], the association of bilinear.score_all
  else:
    p = torch.nn.Parameter(tensor(params["P"]))
    qm = torch.nn.Parameter(tensor(params["Q"]))
    weights = [p, qm]
    score = lambda q, d: (q @ p) @ (d @ qm).T  # [B, C]
  # A tensor learning rate lets the compiled step follow the schedule without recompiling.
  opt = torch.optim.AdamW(weights, lr=torch.tensor(cfg.lr, device=device) if compiled else cfg.lr,
                          betas=(0.9, 0.999), eps=1e-8, weight_decay=cfg.weight_decay)
  lrs = learning_rates(cfg, cfg.steps)
  sampler = BatchSampler(ts, cfg.batch_size, cfg.hard_negatives, cfg.random_negatives,
                         cfg.in_batch, seed)
  labels = torch.arange(cfg.batch_size, device=device)

  def loss_fn(q_rows, cand_rows, mask):
    q, d = qf[q_rows], df[cand_rows]  # [B, n], [C, n]
    logits = (score(q, d) / cfg.temperature).masked_fill(~mask, float("-inf"))
    return F.cross_entropy(logits, labels)

  step_fn = opt.step
  if compiled:
    torch._dynamo.reset()  # pylint: disable=protected-access
    loss_fn = torch.compile(loss_fn, fullgraph=True, dynamic=False)
    step_fn = torch.compile(opt.step, dynamic=False)
  logged = {}
  start = time.perf_counter()
  for step in range(cfg.steps):
    if step == warmup:
      sync()
      start = time.perf_counter()
    batch = sampler.batch(step)
    loss = loss_fn(torch.from_numpy(batch.q_rows).long().to(device),
                   torch.from_numpy(batch.cand_rows).long().to(device),
                   torch.from_numpy(batch.mask).to(device))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(weights, cfg.clip_norm)
    if torch.isfinite(norm):
      for group in opt.param_groups:
        if compiled:
          group["lr"].fill_(float(lrs[step]))
        else:
          group["lr"] = float(lrs[step])
      step_fn()
    done = step + 1
    if done % cfg.eval_every == 0 or done == cfg.steps:
      logged[done] = float(loss.detach())
  sync()
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
  sides = ["ours"] + (["torch"] if torch is not None else [])
  note = None
  if torch is not None and args.compile:
    sides.append("compiled")
  elif torch is not None:
    note = "torch.compile peer not requested (--no-compile)"
  threads = os.cpu_count()
  device = args.torch_device
  if torch is not None and device == "cuda":
    threads = None  # the GPU loop: host threads do not matter
  elif torch is not None and args.torch_threads == "auto":
    probe = train_cfg(args.batch, args.warmup + 30, args.steps_per_call)
    probe.eval_every = args.warmup
    tried = {th: torch_loop(torch, case, params, queries, docs, ts, probe, args.warmup,
                            args.seed, threads=th)[0] for th in dict.fromkeys((threads, 1))}
    threads = min(tried, key=tried.get)
    print(f"  {case} n={n}: torch threads {threads} (30 eager steps took "
          + ", ".join(f"{v:.3f} s with {th}" for th, v in tried.items()) + ")", flush=True)
  elif torch is not None and device == "cpu":
    threads = int(args.torch_threads)
  times = {side: [] for side in sides}
  runs, losses = [], {}
  for r in range(args.rounds):
    for side in sides[r % len(sides):] + sides[:r % len(sides)]:
      if side == "ours":
        t_run, ours_s, history = time_fit(module, params, queries, docs, ts, cfg, args.seed)
        times["ours"].append(ours_s)
        runs.append(t_run - ours_s * (args.warmup + args.steps) / args.steps)
      elif side == "compiled" and "compiled" in times:
        try:
          sec, losses[side] = torch_loop(torch, case, params, queries, docs, ts, cfg,
                                         args.warmup, args.seed, compiled=True, threads=threads,
                                         device=device)
          times[side].append(sec)
        except Exception as e:  # pylint: disable=broad-except
          note = f"torch.compile failed on this machine: {type(e).__name__}: {str(e)[:300]}"
          del times[side]
      elif side == "torch":
        sec, losses[side] = torch_loop(torch, case, params, queries, docs, ts, cfg, args.warmup,
                                       args.seed, threads=threads, device=device)
        times[side].append(sec)
  ours = np.asarray(times["ours"])
  ours_s = float(np.median(ours))
  sample_ms = sampling_ms(ts, cfg, min(args.steps, 100), args.seed)
  examples = args.batch * args.steps
  row = {"name": f"{case} n={n} B={args.batch}", "examples_per_s": examples / ours_s,
         "ms_per_step": ours_s / args.steps * 1e3, "sampling_ms_per_step": sample_ms,
         "fit_first_s": runs[0], "matmul_precision": cfg.matmul_precision,
         "torch_threads": threads if torch is not None else None,
         "torch_device": device if torch is not None else None,
         "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")}
  for side, key in (("torch", "torch"), ("compiled", "torch_compiled")):
    if side in times and times[side]:
      theirs = np.asarray(times[side])
      row |= {f"{key}_examples_per_s": examples / float(np.median(theirs)),
              f"ratio_vs_{key}": float(np.median(theirs / ours)),
              f"{key}_ratio_per_round": [round(float(t / o), 3) for t, o in zip(theirs, ours)],
              f"{key}_ms_per_step": float(np.median(theirs)) / args.steps * 1e3}
    else:
      row |= {f"{key}_examples_per_s": None, f"ratio_vs_{key}": None}
  row["note"] = note if torch is not None else args.torch_note
  row["losses"] = [{"step": h["step"], "ours": h["loss"],
                    **{side: losses[side].get(h["step"]) for side in losses}}
                   for h in history if any(h["step"] in v for v in losses.values())]
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
  ap.add_argument("--torch-threads", default="auto",
                  help="torch intra-op threads: auto (the faster of cpu_count and 1) or a number")
  ap.add_argument("--omp-wait-policy", default="PASSIVE",
                  help="OMP_WAIT_POLICY for torch's OpenMP (set before torch is imported, unless "
                       "already in the environment); '' leaves it unset")
  ap.add_argument("--no-compile", dest="compile", action="store_false",
                  help="skip the torch.compile peer")
  ap.add_argument("--no-torch", action="store_true",
                  help="time ours only (e.g. on an accelerator, where the CPU torch peer is not a "
                       "like-for-like peer); ratios are null")
  ap.add_argument("--torch-device", default="auto", choices=("auto", "cpu", "cuda"),
                  help="the torch peer's device: auto (cuda where jax runs on a GPU, else cpu)")
  ap.add_argument("--json", default=None, help="write the results here")
  args = ap.parse_args(argv)
  torch = None
  args.torch_note = "torch peer not requested (--no-torch)"
  if args.torch_device == "auto":
    args.torch_device = "cuda" if jax.default_backend() == "gpu" else "cpu"
  if args.omp_wait_policy and "OMP_WAIT_POLICY" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = args.omp_wait_policy  # read when libgomp loads (with torch)
  if not args.no_torch:
    try:
      import torch  # pylint: disable=g-import-not-at-top
    except ImportError:
      sys.exit("train_throughput needs PyTorch for its peer: pip install torch==2.13.0 "
               "(the CPU wheel; torch is not a dependency of bilinear_ir), or pass --no-torch")
    if args.torch_device == "cuda" and not torch.cuda.is_available():
      args.torch_note = (f"no torch peer: torch {torch.__version__} has no CUDA device (jax runs "
                         f"on {jax.default_backend()})")
      torch = None
    elif args.torch_device == "cuda":
      # ours runs at the backend's default matmul precision (train.matmul_precision "default":
      # TF32 on NVIDIA GPUs); torch's float32 matmuls do the same with TF32 allowed.
      torch.backends.cuda.matmul.allow_tf32 = True
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
  hw = hardware(torch.__version__ if torch is not None else "not used")
  if torch is not None and args.torch_device == "cuda":
    hw += f"; torch on {torch.cuda.get_device_name(0)} (TF32 matmuls, as ours)"
  if torch is not None and args.compile and args.torch_device == "cpu":
    import torch._inductor.config as inductor_config  # pylint: disable=g-import-not-at-top
    hw += (f"; torch.compile: inductor {inductor_config.cpu_backend} backend, "
           f"cpp compiler {inductor_config.cpp.cxx[0] or 'default'}")
  print(hw)
  print(f"corpus: {args.docs} docs, {args.queries} queries/pairs; batch {args.batch} queries x "
        f"{2 * args.batch} candidates; {args.warmup} warm-up + {args.steps} timed steps")
  fmt = lambda v, spec: format(v, spec) if v is not None else format("-", spec.split(".")[0] + "s")
  header = (f"{'case':<24}{'ours ex/s':>11}{'torch ex/s':>12}{'ratio':>7}{'compiled ex/s':>15}"
            f"{'ratio':>7}{'ours ms':>9}{'sample ms':>11}{'first s':>9}")
  print(header)
  rows = []
  for case in cases:
    for n in dims:
      r = run_case(torch, case, n, args)
      rows.append(r)
      print(f"{r['name']:<24}{r['examples_per_s']:>11.0f}"
            f"{fmt(r['torch_examples_per_s'], '>12.0f')}{fmt(r['ratio_vs_torch'], '>7.2f')}"
            f"{fmt(r['torch_compiled_examples_per_s'], '>15.0f')}"
            f"{fmt(r['ratio_vs_torch_compiled'], '>7.2f')}{r['ms_per_step']:>9.2f}"
            f"{r['sampling_ms_per_step']:>11.2f}{r['fit_first_s']:>9.2f}  rounds "
            f"{r.get('torch_ratio_per_round')} / {r.get('torch_compiled_ratio_per_round')}"
            + (f"  note: {r['note']}" if r["note"] else ""), flush=True)
  if torch is not None:
    print("loss check (same batches, same init; ours vs torch eager / compiled at logged steps):")
    for r in rows:
      pairs = ", ".join(f"{x['step']}: {x['ours']:.4f}/" + "/".join(
          f"{x[s]:.4f}" for s in ("torch", "compiled") if x.get(s) is not None)
                        for x in r["losses"])
      worst = max([abs(x["ours"] - x[s]) / max(abs(x[s]), 1e-12) for x in r["losses"]
                   for s in ("torch", "compiled") if x.get(s) is not None] or [0.0])
      print(f"  {r['name']}: {pairs} (max relative difference {worst:.1e})")
  if args.json:
    files.atomic_write_json(args.json, {"hardware": hw, "cases": rows})


if __name__ == "__main__":
  main()
