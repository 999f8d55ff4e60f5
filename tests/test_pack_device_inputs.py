"""launch/pack_device_inputs.py: the packed InsuranceQA loads as the original (train negatives cut
to the first N, dev and test lists whole) and the float16 model folder loads within rounding."""
import gzip
import importlib.util
import json
import os

import jax
import numpy as np

from bilinear_ir.config.blocks import data_config
from bilinear_ir.data import loaders
from bilinear_ir.encoders import names
from bilinear_ir.experiment import spec as spec_lib
from conftest import REPO

ANSWERS = {str(i): {"en": f"Answer  number {i}.", "zh": "答"} for i in range(1, 13)}
QUESTIONS = {
    "train": {"0": {"en": "What is term life?", "zh": "问", "domain": "life-insurance",
                    "answers": ["1"], "negatives": ["2", "3", "4", "5", "6"]},
              "1": {"en": "Is auto insurance required?", "zh": "问", "domain": "auto-insurance",
                    "answers": ["2", "5"], "negatives": ["6", "1"]}},
    "valid": {"0": {"en": "Does Medicare pay?", "zh": "问", "domain": "medicare-insurance",
                    "answers": ["8"], "negatives": ["9", "10", "11", "12"]}},
    "test": {"0": {"en": "What is renters insurance?", "zh": "问", "domain": "renters-insurance",
                   "answers": ["1", "7"], "negatives": ["4", "5", "6", "2"]}},
}


def _pack_module():
  spec = importlib.util.spec_from_file_location(
      "pack_device_inputs", os.path.join(REPO, "launch", "pack_device_inputs.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _collection(path):
  data = data_config()
  data.path = path
  return loaders.load(spec_lib.collection_block(data, "insuranceqa"))


def test_packed_insuranceqa_loads_as_the_original_with_train_negatives_cut(tmp_path):
  src = tmp_path / "src"
  src.mkdir()
  content = {"answers.json.gz": ANSWERS, **{f"{s}.json.gz": q for s, q in QUESTIONS.items()}}
  for name, obj in content.items():
    with gzip.open(src / name, "wb") as f:
      f.write(json.dumps(obj, ensure_ascii=False).encode("utf-8"))
  _pack_module().pack_insuranceqa(str(src), str(tmp_path / "out"), 3)
  a, b = _collection(str(src)), _collection(str(tmp_path / "out"))
  assert a.doc_ids == b.doc_ids and a.doc_strings() == b.doc_strings()
  assert a.queries == b.queries and a.qrels == b.qrels and a.query_meta == b.query_meta
  assert b.negatives["train-0"] == a.negatives["train-0"][:3] == ["2", "3", "4"]
  assert b.negatives["train-1"] == a.negatives["train-1"]
  assert b.negatives["dev-0"] == a.negatives["dev-0"] and len(b.negatives["dev-0"]) == 4
  assert b.negatives["test-0"] == a.negatives["test-0"]
  with gzip.open(tmp_path / "out" / "answers.json.gz", "rt", encoding="utf-8") as f:
    assert set(json.load(f)["1"]) == {"en"}  # the Chinese text the loader never reads is gone


def test_float16_model_folder_loads_within_rounding(tiny_bert_dir, tmp_path):
  out = str(tmp_path / "fp16")
  _pack_module().pack_model(tiny_bert_dir, out)
  a, b = names.load_encoder(tiny_bert_dir), names.load_encoder(out)
  pairs = list(zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)))
  assert pairs and all(x.shape == y.shape for x, y in pairs)
  for x, y in pairs:
    x, y = np.asarray(x), np.asarray(y)
    np.testing.assert_array_equal(y, x.astype(np.float16).astype(np.float32))
  assert any(not np.array_equal(np.asarray(x), np.asarray(y)) for x, y in pairs)
  assert os.path.getsize(os.path.join(out, "model.safetensors")) < os.path.getsize(
      os.path.join(tiny_bert_dir, "model.safetensors"))
