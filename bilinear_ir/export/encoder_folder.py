"""A (fine-tuned) encoder as a sentence-transformers model folder in the HuggingFace layout.

    save(path, encoder, params, settings)   # the Encoder it was loaded as, its new params
    SentenceTransformer(path)                # loads it as is (no trust_remote_code)
    hf_folder.load_folder(path)              # gives `params` back, bit for bit

The folder is the source model's (`encoder.path`) with the weights replaced:
  * `config.json`: the source's, with `architectures` the base model (`BertModel` / `MPNetModel`:
    the weights carry no `bert.` / `mpnet.` prefix and no task head), `dtype` float32 (the
    weights' dtype; transformers 5 loads in the config's dtype) and no `_name_or_path`;
  * `model.safetensors`: `params` turned back into HuggingFace weights by the recipes that read
    them (`layers.split_params`); float32, metadata `format: pt` (as transformers requires).
    The source's pooler (`pooler.*`), which the project does not have and sentence-transformers
    does not use, is copied unchanged, so transformers loads every weight of the model;
  * the tokenizer files of the source, copied unchanged;
  * the sentence-transformers modules the project encodes with: Transformer, Pooling (mean or
    CLS), Normalize when normalised, `max_seq_length` = the settings' max_length, the query and
    document prompts, and `similarity_fn_name` "dot" (the project ranks by dot products).
    Written in the layout every sentence-transformers version reads (module types
    `sentence_transformers.models.*`, the `pooling_mode_*` flags), as the published
    all-MiniLM-L6-v2 is, and as `hf_folder` reads it back.

The folder is written to a temporary folder and renamed into place; an existing non-empty path
is refused. Needs no torch: sentence-transformers only reads the folder.
"""
from __future__ import annotations

import os
import shutil
from typing import Any

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from bilinear_ir import files
from bilinear_ir.encoders import hf_folder
from bilinear_ir.encoders import layers
from bilinear_ir.encoders.base import POOLINGS
from bilinear_ir.encoders.base import Encoder
from bilinear_ir.errors import input_error
from bilinear_ir.errors import require

# model_type -> the transformers class of the bare encoder (the weights' names).
BASE_MODELS = {"bert": "BertModel", "mpnet": "MPNetModel"}
# The tokenizer files a HuggingFace folder may hold (WordPiece, BPE, SentencePiece); those the
# source has are copied. `tokenizer.json` is always there (`hf_folder` reads only it).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "vocab.txt", "vocab.json", "merges.txt",
                   "sentencepiece.bpe.model", "spiece.model")
# Config fields that no longer hold for the written folder (it is not the source checkpoint).
DROPPED_CONFIG = ("_name_or_path", "torch_dtype")
POOLING_DIR = "1_Pooling"
NORMALIZE_DIR = "2_Normalize"
ST_MODULE = "sentence_transformers.models."


def checked_settings(settings: dict[str, Any], encoder: Encoder) -> dict[str, Any]:
  """The settings the folder encodes with, checked against the encoder.

  Args:
    settings: the resolved embedding settings (`Embeddings.manifest["settings"]`): "pooling"
      (mean | cls), "normalize" (bool), "max_length" (int in [2, encoder.max_positions]), and
      optionally "query_prompt", "doc_prompt" (strings; missing: "").
    encoder: the encoder exported.

  Returns:
    {"pooling", "normalize", "max_length", "query_prompt", "doc_prompt"}.

  Raises:
    InputError: naming the field that is missing or invalid.
  """
  def field(key, default=None):
    require(key in settings or default is not None, "missing", file="settings", field=key)
    return settings.get(key, default)

  out = {"pooling": field("pooling"), "normalize": field("normalize"),
         "max_length": field("max_length"), "query_prompt": field("query_prompt", ""),
         "doc_prompt": field("doc_prompt", "")}
  require(out["pooling"] in POOLINGS, f"must be one of {POOLINGS}, got {out['pooling']!r}",
          file="settings", field="pooling")
  require(isinstance(out["normalize"], bool), f"must be a bool, got {out['normalize']!r}",
          file="settings", field="normalize")
  length = out["max_length"]
  require(isinstance(length, int) and not isinstance(length, bool)
          and 2 <= length <= encoder.max_positions,
          f"must be an int in [2, {encoder.max_positions}] for {encoder.name}, got {length!r}",
          file="settings", field="max_length")
  for key in ("query_prompt", "doc_prompt"):
    require(isinstance(out[key], str), f"must be a string, got {out[key]!r}", file="settings",
            field=key)
  return out


def sentence_transformers_files(settings: dict[str, Any], hidden_size: int
                                ) -> dict[str, Any]:
  """{relative path: JSON value} of the sentence-transformers files (see the module docstring).

  Args:
    settings: `checked_settings(...)`.
    hidden_size: n, the width of the sentence vectors.
  """
  stack = [("Transformer", ""), ("Pooling", POOLING_DIR)]
  out = {}
  if settings["normalize"]:
    stack.append(("Normalize", NORMALIZE_DIR))
    out[f"{NORMALIZE_DIR}/config.json"] = {}
  out["modules.json"] = [{"idx": i, "name": str(i), "path": path, "type": ST_MODULE + kind}
                         for i, (kind, path) in enumerate(stack)]
  pooling = settings["pooling"]
  out[f"{POOLING_DIR}/config.json"] = {
      "word_embedding_dimension": int(hidden_size),
      "pooling_mode_cls_token": pooling == "cls", "pooling_mode_mean_tokens": pooling == "mean",
      "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}
  out["sentence_bert_config.json"] = {"max_seq_length": int(settings["max_length"]),
                                      "do_lower_case": False}
  prompts = {"query": settings["query_prompt"], "document": settings["doc_prompt"]}
  out["config_sentence_transformers.json"] = {
      "prompts": {k: v for k, v in prompts.items() if v}, "default_prompt_name": None,
      "similarity_fn_name": "dot"}
  return out


def source_pooler(encoder: Encoder, model_type: str) -> dict[str, np.ndarray]:
  """{name: float32 array} of the source's `pooler.*` weights (any `bert.`/`mpnet.` prefix
  dropped); {} if it has none."""
  out = {}
  with safe_open(os.path.join(encoder.path, "model.safetensors"), framework="np") as f:
    for key in f.keys():
      name = key.removeprefix(f"{model_type}.")
      if name.startswith("pooler."):
        out[name] = np.ascontiguousarray(f.get_tensor(key), np.float32)
  return out


def save(path: str, encoder: Encoder, params: Any, settings: dict[str, Any]) -> None:
  """Writes the encoder with `params` as a sentence-transformers folder (module docstring).

  Args:
    path: the folder to write; it must not exist or be an empty folder.
    encoder: the encoder `params` belong to (`names.load_encoder` / `hf_folder.load_folder`):
      its module and its source folder (config and tokenizer files).
    params: its params after fine-tuning (float32, the tree of `encoder.params`).
    settings: the embedding settings (`checked_settings`).

  Raises:
    InputError: `path` exists and is not an empty folder, bad settings, or params that do not
      fit the encoder (naming the param).
    WriteError: the machine refused the write (nothing is left at `path`).
  """
  if os.path.lexists(path) and not (os.path.isdir(path) and not os.listdir(path)):
    raise input_error("exists and is not an empty folder; the encoder is written to a new "
                      "folder only", file=path)
  settings = checked_settings(settings, encoder)
  source_config = files.read_json(os.path.join(encoder.path, "config.json"))
  model_type = source_config["model_type"]
  weights = layers.split_params(hf_folder.ARCHITECTURES[model_type].recipes(encoder.module),
                                params)
  weights.update(source_pooler(encoder, model_type))
  config = {k: v for k, v in source_config.items() if k not in DROPPED_CONFIG}
  config.update(architectures=[BASE_MODELS[model_type]], dtype="float32")
  written = {"config.json": config,
             **sentence_transformers_files(settings, encoder.hidden_size)}
  with files.atomic_dir(path) as tmp:
    save_file(weights, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    for name in TOKENIZER_FILES:
      if os.path.isfile(os.path.join(encoder.path, name)):
        shutil.copyfile(os.path.join(encoder.path, name), os.path.join(tmp, name))
    for name, value in written.items():
      files.atomic_write_json(os.path.join(tmp, name), value)
