r"""Packs what the late-interaction job on InsuranceQA needs into a folder small enough to travel.

  python launch/pack_device_inputs.py --out .carry

A lent GPU machine receives only the working tree (64 MiB in all, tracked files included) and
reaches nothing outside. The job needs all-MiniLM-L6-v2 (90 MB of float32 weights) and
InsuranceQA (21 MB, half of it Chinese text the loader never reads). This writes, under `--out`:

  insuranceqa/   the package's four files (`answers.json.gz`, `train.json.gz`, `valid.json.gz`,
                 `test.json.gz`), each record keeping only the fields `data.insuranceqa` reads
                 ("en"; questions also "domain", "answers", "negatives"), and each training
                 question's negatives cut to the first `--train_negatives` (training reads only
                 the first `train.hard_depth`, the default; the dev and test lists, which the
                 own-pool P@1 reads, stay whole). Read it with `--config.data.path=OUT/insuranceqa`.
                 GPL-3.0 research data: a private copy for a run, never committed (`.carry/` is
                 in `.gitignore`).
  minilm_fp16/   the installed model folder with `model.safetensors` in float16 (the loader reads
                 it back as float32, so embeddings differ from the float32 weights' by rounding;
                 its cache key is the weights' hash). Use `--config.encoder.model=OUT/minilm_fp16`.

Each folder is written whole or not at all (`files.atomic_dir`). It prints each file's size and
the total.
"""
from __future__ import annotations

import gzip
import json
import os
import shutil
import sys

import numpy as np
from absl import app
from absl import flags
from safetensors import safe_open
from safetensors.numpy import save_file

from bilinear_ir import files
from bilinear_ir.config import blocks
from bilinear_ir.data import insuranceqa
from bilinear_ir.encoders import names

FLAGS = flags.FLAGS

QUESTION_FIELDS = ("en", "domain", "answers", "negatives")


def pack_insuranceqa(src: str, dest: str, train_negatives: int) -> None:
  """The four files of `src` with only the fields the loader reads, train negatives cut."""
  with files.atomic_dir(dest) as tmp:
    for name in insuranceqa.FILES:
      with gzip.open(os.path.join(src, name), "rt", encoding="utf-8") as f:
        records = json.load(f)
      if name == insuranceqa.ANSWERS:
        out = {k: {"en": v["en"]} for k, v in records.items()}
      else:
        out = {k: {f: v[f] for f in QUESTION_FIELDS if f in v} for k, v in records.items()}
        if name == insuranceqa.SPLITS["train"]:
          for v in out.values():
            v["negatives"] = v.get("negatives", [])[:train_negatives]
      with open(os.path.join(tmp, name), "wb") as f:
        f.write(gzip.compress(json.dumps(out, ensure_ascii=False, separators=(",", ":")).encode(),
                              compresslevel=9, mtime=0))


def pack_model(src: str, dest: str) -> None:
  """`src` copied with its weights in float16."""
  with files.atomic_dir(dest) as tmp:
    shutil.copytree(src, tmp, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("model.safetensors", "README.md", ".git*"))
    with safe_open(os.path.join(src, "model.safetensors"), framework="np") as f:
      tensors = {k: np.asarray(f.get_tensor(k)).astype(np.float16) for k in f.keys()}
    save_file(tensors, os.path.join(tmp, "model.safetensors"))


def main(argv):
  del argv
  data = FLAGS.data or insuranceqa.package_path()
  model = FLAGS.model or names.minilm_dir()
  pack_insuranceqa(data, os.path.join(FLAGS.out, "insuranceqa"), FLAGS.train_negatives)
  pack_model(model, os.path.join(FLAGS.out, "minilm_fp16"))
  total = 0
  for root, _, names_ in os.walk(FLAGS.out):
    for name in sorted(names_):
      size = os.path.getsize(os.path.join(root, name))
      total += size
      print(f"{size:>12,d}  {os.path.relpath(os.path.join(root, name), FLAGS.out)}")
  print(f"{total:>12,d}  in all ({total / 2**20:.1f} MiB)")
  sys.stdout.flush()


if __name__ == "__main__":  # flags defined here, so tests can import the functions
  flags.DEFINE_string("out", ".carry", "Folder to write insuranceqa/ and minilm_fp16/ into.")
  flags.DEFINE_integer("train_negatives", blocks.train_config().hard_depth,
                       "Listed negatives kept per training question (train.hard_depth).")
  flags.DEFINE_string("data", "", "Folder of the four InsuranceQA files ('': the package).")
  flags.DEFINE_string("model", "", "Model folder ('': the installed all-MiniLM-L6-v2).")
  app.run(main)
