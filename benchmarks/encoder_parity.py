"""Frozen encoder: the project's Flax path vs `transformers.BertModel` (PyTorch), same folder.

    python benchmarks/encoder_parity.py                          # parity on 24 docs + 24 claims
    python benchmarks/encoder_parity.py --speed 256              # + throughput on 256 docs
    python benchmarks/encoder_parity.py --texts 8 --speed 16 --max_length 64   # smoke run

torch is not a dependency of the project; this script alone needs it (`pip install torch==2.13.0`,
the CPU wheel) and exits with a message when it is missing.

Texts: the first `--texts` SciFact docs (`title + " " + abstract`, most longer than 256 tokens,
so truncation is exercised) and the first `--texts` claims (short), from the SciFact copy
embedded in the package (`data.loaders`).

Parity (printed as max |difference|):
  * pooled: `embeddings.encode` (length buckets, sharded jit, mean pooling + L2 normalisation as
    in the config) vs PyTorch `BertModel` run per text-set padded to the longest text, masked mean
    (clamped at 1e-9) and `F.normalize`: the sentence-transformers recipe of all-MiniLM-L6-v2.
  * tokens f32: the project's jitted forward in float32 (token outputs before the float16 cast)
    vs PyTorch `last_hidden_state`, on real tokens only.
  * tokens f16: `embeddings.encode_tokens` (float16 storage, per-token L2 normalisation when the
    config normalises) vs the same (normalised likewise); this difference is the float16
    rounding (~5e-4 relative), not a model difference.

Speed (`--speed N`, on the first N docs, wall clock and process CPU time, tokenization included;
compile time excluded by a warm-up of one batch per padded length the variant will use):
  * flax bucketed: the project's default (multiples of 32 up to max_length).
  * flax padded: every batch padded to max_length (`embeddings.BUCKET_STEP = max_length`).
  * torch: texts sorted by length, each batch padded to its longest text (dynamic shapes),
    `torch.set_num_threads(os.cpu_count())`, `torch.inference_mode()`, after one warm-up batch.
  Ratios are printed against torch. On a shared machine, compare the CPU-s columns: wall time
  inflates with other processes' load, CPU time much less.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from bilinear_ir.data import embeddings
from bilinear_ir.data import loaders
from bilinear_ir.data.config import data_config
from bilinear_ir.data.config import encoder_config
from bilinear_ir.eval import latency


def hardware() -> str:
  """The machine (eval.latency.hardware) and torch's version and threads."""
  import torch  # pylint: disable=g-import-not-at-top
  return f"{latency.hardware()}; torch {torch.__version__} ({torch.get_num_threads()} threads)"


def torch_hidden(model, tokenizer, texts: list[str], max_length: int, batch: int):
  """PyTorch last_hidden_state per text: [N] arrays [len_i, n] (real tokens only), f32."""
  import torch  # pylint: disable=g-import-not-at-top
  out = [None] * len(texts)
  order = np.argsort([-len(t) for t in texts], kind="stable")
  with torch.inference_mode():
    for s in range(0, len(texts), batch):
      rows = order[s:s + batch]
      enc = tokenizer([texts[i] for i in rows], padding=True, truncation=True,
                      max_length=max_length, return_tensors="pt")
      hidden = model(**enc).last_hidden_state.numpy()
      lengths = enc["attention_mask"].sum(1).numpy()
      for r, i in enumerate(rows):
        out[i] = hidden[r, :lengths[r]]
  return out


def torch_pooled(hidden: list[np.ndarray]) -> np.ndarray:
  """[N, n] masked mean (clamp 1e-9), then L2 normalisation (clamp 1e-12): sentence-transformers."""
  import torch  # pylint: disable=g-import-not-at-top
  mean = torch.stack([torch.from_numpy(h).sum(0) / max(len(h), 1e-9) for h in hidden])
  return torch.nn.functional.normalize(mean, p=2, dim=1).numpy()


def flax_tokens_f32(encoder, texts: list[str], max_length: int) -> list[np.ndarray]:
  """The project's forward pass (same model call) in float32: [N] arrays [len_i, n]."""
  ids = encoder.tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]
  fn = jax.jit(lambda p, i, m: encoder.model(i, attention_mask=m, token_type_ids=jnp.zeros_like(i),
                                             params=p, train=False).last_hidden_state)
  out = []
  for t in ids:  # one at a time, unpadded: parity does not depend on padding either
    a = np.asarray([t], np.int32)
    out.append(np.asarray(fn(encoder.params, a, np.ones_like(a)))[0])
  return out


def timed(fn):
  """(result, wall seconds, process CPU seconds) of fn()."""
  w, c = time.perf_counter(), time.process_time()
  result = fn()
  return result, time.perf_counter() - w, time.process_time() - c


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--model", default="", help='BERT folder or hub name; "" = all-MiniLM-L6-v2')
  parser.add_argument("--texts", type=int, default=24, help="SciFact docs and claims for parity")
  parser.add_argument("--max_length", type=int, default=256)
  parser.add_argument("--batch_size", type=int, default=64)
  parser.add_argument("--speed", type=int, default=0, help="also time N docs (0: parity only)")
  parser.add_argument("--speed_batch_sizes", default="16,64", help="comma-separated")
  args = parser.parse_args()
  try:
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
  except ImportError:
    sys.exit("this benchmark needs torch: pip install torch==2.13.0 (the CPU wheel)")
  torch.set_num_threads(os.cpu_count())

  collection = loaders.load(data_config())
  qids = sorted(collection.queries)
  docs = collection.doc_strings()
  texts = docs[:args.texts] + [collection.queries[q] for q in qids[:args.texts]]
  encoder = embeddings.load_encoder(args.model)
  path = args.model or embeddings.default_model_dir()
  pt_model = transformers.BertModel.from_pretrained(path).eval()
  print(f"hardware: {hardware()}")
  print(f"model: {encoder.name}; {len(texts)} texts ({args.texts} SciFact docs + {args.texts} "
        f"claims); max_length {args.max_length}")

  with tempfile.TemporaryDirectory() as cache:
    cfg = encoder_config()
    cfg.model, cfg.cache_dir = args.model, cache
    cfg.max_length, cfg.batch_size = args.max_length, args.batch_size
    pooled = embeddings.encode(texts, cfg, desc="flax pooled")
    tok16, mask = embeddings.encode_tokens(texts, cfg, desc="flax tokens")
  ref = torch_hidden(pt_model, encoder.tokenizer, texts, args.max_length, args.batch_size)
  ours32 = flax_tokens_f32(encoder, texts, args.max_length)
  assert all(len(r) == m.sum() == len(o) for r, m, o in zip(ref, mask, ours32))
  d_pooled = np.abs(pooled - torch_pooled(ref)).max()
  d_tok32 = max(np.abs(o - r).max() for o, r in zip(ours32, ref))
  unit = lambda h: h / np.maximum(np.linalg.norm(h, axis=-1, keepdims=True), 1e-12)
  ref16 = [unit(r) for r in ref] if cfg.normalize else ref  # encode_tokens normalises per token
  d_tok16 = max(np.abs(tok16[i, :len(r)].astype(np.float32) - r).max()
                for i, r in enumerate(ref16))
  scale = max(np.abs(r).max() for r in ref)
  print(f"max |pooled flax - torch|         = {d_pooled:.2e}  (unit vectors)")
  print(f"max |tokens f32 flax - torch|     = {d_tok32:.2e}  (token states up to |{scale:.1f}|)")
  print(f"max |tokens f16 stored - torch|   = {d_tok16:.2e}  (float16 storage rounding; "
        f"{'unit' if cfg.normalize else 'raw'} token vectors)")

  if not args.speed:
    return
  speed_texts = docs[:args.speed]
  lengths = [len(t) for t in encoder.tokenizer(speed_texts, truncation=True,
                                               max_length=args.max_length)["input_ids"]]
  print(f"\nspeed: {len(speed_texts)} SciFact docs, token lengths median {np.median(lengths):.0f}, "
        f"{np.mean(np.array(lengths) == args.max_length):.0%} truncated at {args.max_length}")
  print(f"{'variant':<22} {'batch':>5} {'texts/s':>8} {'texts/CPU-s':>12} {'vs torch (CPU)':>15}")
  default_step = embeddings.BUCKET_STEP
  torch_hidden(pt_model, encoder.tokenizer, speed_texts[:8], args.max_length, 8)  # warm-up
  for batch in [int(b) for b in args.speed_batch_sizes.split(",")]:
    _, tw, tc = timed(lambda: torch_hidden(pt_model, encoder.tokenizer, speed_texts,
                                           args.max_length, batch))
    print(f"{'torch (dynamic pad)':<22} {batch:>5} {len(speed_texts) / tw:>8.1f} "
          f"{len(speed_texts) / tc:>12.1f} {1.0:>15.2f}")
    for name, step in (("flax bucketed", default_step), ("flax padded to max", args.max_length)):
      embeddings.BUCKET_STEP = step
      run_model = embeddings._run_model  # pylint: disable=protected-access

      def run(texts, label):
        ids = encoder.tokenizer(texts, truncation=True, max_length=args.max_length)["input_ids"]
        return run_model(encoder, ids, pooling="mean", normalize=True, tokens=False,
                         max_length=args.max_length, batch_size=batch,
                         devices=jax.local_devices(), desc=label)

      # Warm-up: one full batch per padded length this variant will use (compiles each shape).
      buckets = embeddings.bucket_lengths(args.max_length)
      leaders = sorted(lengths, reverse=True)[::batch]
      used = sorted({min(b for b in buckets if b >= n) for n in leaders})
      by_length = {min(b for b in buckets if b >= n): t for n, t in zip(lengths, speed_texts)}
      run([by_length[b] for b in used for _ in range(batch)], f"{name} warm-up")
      _, w, c = timed(lambda: run(speed_texts, name))  # pylint: disable=cell-var-from-loop
      print(f"{name:<22} {batch:>5} {len(speed_texts) / w:>8.1f} {len(speed_texts) / c:>12.1f} "
            f"{tc / c:>15.2f}")
    embeddings.BUCKET_STEP = default_step


if __name__ == "__main__":
  main()
