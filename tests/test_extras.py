"""Each optional feature, without its extra installed, fails with one line naming the extra."""
import importlib
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from bilinear_ir import scorers
from bilinear_ir.config import blocks
from bilinear_ir.data import bm25
from bilinear_ir.errors import InputError
from bilinear_ir.experiment import validation
from bilinear_ir.export import faiss_index
from bilinear_ir.export import saved_model
from bilinear_ir.export import sentence_transformers
from bilinear_ir.export import serving
from bilinear_ir.train import trainer
from conftest import main_env

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _hide(monkeypatch, *names):
  for name in names:  # `import name` now raises ImportError
    monkeypatch.setitem(sys.modules, name, None)


def test_faiss_export_names_the_faiss_extra(monkeypatch):
  _hide(monkeypatch, "faiss")
  module = scorers.build("dot", dim=3)
  with pytest.raises(InputError, match=r'FAISS export needs faiss-cpu.*bilinear_ir\[faiss\]'):
    faiss_index.export_faiss(module, {}, np.eye(3, dtype=np.float32))


def test_serving_check_names_the_lancedb_extra_before_any_work(monkeypatch):
  real = serving.importlib.util.find_spec
  monkeypatch.setattr(serving.importlib.util, "find_spec",
                      lambda name: None if name == "lancedb" else real(name))
  with pytest.raises(InputError, match=r"check=lancedb needs lancedb.*bilinear_ir\[lancedb\]"):
    serving.require_backend("lancedb")
  serving.require_backend("faiss")  # installed: no error
  with pytest.raises(InputError, match="must be one of"):
    serving.require_backend("qdrant")


def test_tensorboard_names_the_tb_extra(monkeypatch, tmp_path):
  _hide(monkeypatch, "tensorboardX")
  with pytest.raises(InputError, match=r"train.tensorboard needs tensorboardX.*\[tb\]"):
    trainer._writer(str(tmp_path))  # pylint: disable=protected-access
  c = blocks.train_config()
  c.tensorboard = True
  monkeypatch.setattr(validation.importlib.util, "find_spec", lambda name: None)
  with pytest.raises(InputError, match=r"\[tb\]"):
    validation.check_train(c)  # refused before any work


def test_stemmer_names_the_stem_extra(monkeypatch):
  _hide(monkeypatch, "Stemmer")
  bm25._stemmer.cache_clear()  # pylint: disable=protected-access
  with pytest.raises(InputError, match=r"stemmer needs PyStemmer.*\[stem\]"):
    bm25.Tokenizer(kind="bm25s", stemmer="english")(["cells"])
  bm25._stemmer.cache_clear()  # pylint: disable=protected-access


def test_tfds_builder_names_the_tfds_extra(monkeypatch):
  _hide(monkeypatch, "tensorflow_datasets")
  monkeypatch.delitem(sys.modules, "bilinear_ir.data.tfds_builder", raising=False)
  with pytest.raises(ImportError, match=r"\[tfds\]"):
    importlib.import_module("bilinear_ir.data.tfds_builder")


def test_sentence_transformers_export_names_the_st_extra(monkeypatch, tmp_path):
  _hide(monkeypatch, "sentence_transformers", "torch")
  with pytest.raises(InputError, match=r"sentence-transformers export needs .*\[st\]"):
    sentence_transformers.build([sentence_transformers.Layer(np.eye(2))], [], str(tmp_path),
                                {"max_length": 8, "pooling": "mean", "normalize": True})


def test_missing_extra_through_main_is_one_line(tmp_path):
  """The export job with `sentence_transformers` unimportable (a stub on PYTHONPATH)."""
  stub = tmp_path / "stub" / "sentence_transformers"
  stub.mkdir(parents=True)
  (stub / "__init__.py").write_text("raise ImportError('not installed')\n")
  module = scorers.build("wdp", dim=4)
  saved_model.save_model(str(tmp_path / "model"), module,
                         scorers.init_params(module, jax.random.key(0)),
                         {"kind": "flax", "model": "", "pooling": "mean", "normalize": True,
                          "max_length": 32, "query_prompt": "", "doc_prompt": ""})
  env = main_env(PYTHONPATH=str(tmp_path / "stub"))
  out = subprocess.run([sys.executable, "-m", "bilinear_ir.main",
                        f"--config=configs/export.py:model_dir={tmp_path / 'model'}",
                        f"--workdir={tmp_path / 'w'}"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=300)
  lines = [line for line in out.stderr.splitlines() if line.strip()]
  assert out.returncode == 2 and len(lines) == 1, out.stderr
  assert "bilinear_ir[st]" in lines[0] and "Traceback" not in out.stderr
  assert not os.path.exists(tmp_path / "w")
