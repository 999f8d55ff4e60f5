"""A frozen encoder from a HuggingFace-layout folder: its weights converted to the Flax modules.

A folder holds `config.json` (the architecture is picked by `model_type`: "bert" or "mpnet"),
`model.safetensors` (read with the `safetensors` numpy loader: no torch, no pickle), and
`tokenizer.json` (read with the `tokenizers` package). Sentence-transformers files, when present,
give the model's defaults: `modules.json` (a `Normalize` module -> normalize), the pooling
module's `config.json` (mean or CLS pooling), `sentence_bert_config.json` (`max_seq_length`).

Weights: every param of the module comes from one or more HuggingFace weights (`recipes` of
`bert.py` / `mpnet.py`; names with or without the `bert.` / `mpnet.` prefix, LayerNorm
`gamma`/`beta` accepted), each of the declared shape, cast to float32. Other weights (pooler,
LM head, position id buffers) are ignored. `layers.split_params` is the way back (params ->
weights), through the same recipes.
"""
from __future__ import annotations

import json
import os
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open
import tokenizers

from bilinear_ir import files
from bilinear_ir.encoders import bert
from bilinear_ir.encoders import mpnet
from bilinear_ir.encoders.base import Encoder
from bilinear_ir.errors import InputError
from bilinear_ir.errors import input_error

ARCHITECTURES = {"bert": bert, "mpnet": mpnet}
# config.json fields that do not change the numbers (left out of its hash).
VOLATILE_CONFIG = ("_name_or_path", "transformers_version", "architectures", "torch_dtype",
                   "dtype")


def _read_config(folder: str) -> dict[str, Any]:
  path = os.path.join(folder, "config.json")
  if not os.path.isfile(path):
    raise input_error("missing: a HuggingFace model folder needs config.json", file=path)
  config = files.read_json(path)
  if not isinstance(config, dict):
    raise input_error(f"expected a JSON object, got {type(config).__name__}", file=path)
  return config


def _pooling_mode(path: str) -> str:
  """"mean" or "cls" from a sentence-transformers Pooling `config.json`."""
  cfg = files.read_json(path)
  if not isinstance(cfg, dict):
    raise input_error("expected a JSON object", file=path)
  if isinstance(cfg.get("pooling_mode"), str):
    modes = [cfg["pooling_mode"]]
    field = "pooling_mode"
  else:
    modes = [k[len("pooling_mode_"):] for k, v in cfg.items()
             if k.startswith("pooling_mode_") and v is True]
    field = "pooling_mode_*"
  named = {"mean_tokens": "mean", "cls_token": "cls", "mean": "mean", "cls": "cls"}
  if len(modes) != 1 or modes[0] not in named:
    raise input_error(f"exactly one of mean or CLS pooling is supported, got {modes}",
                      file=path, field=field)
  return named[modes[0]]


def _defaults(folder: str, max_positions: int) -> dict[str, Any]:
  """{"pooling", "normalize", "max_length"} from the sentence-transformers files, if any."""
  pooling, normalize, max_length = "mean", False, max_positions
  pooling_dir = "1_Pooling"
  modules_path = os.path.join(folder, "modules.json")
  if os.path.isfile(modules_path):
    modules = files.read_json(modules_path)
    if not isinstance(modules, list):
      raise input_error("expected a JSON list of modules", file=modules_path)
    for i, m in enumerate(modules):
      kind = m.get("type") if isinstance(m, dict) else None
      if not isinstance(kind, str):
        raise input_error("missing module type", file=modules_path, record=i, field="type")
      kind = kind.rsplit(".", 1)[-1]
      if kind == "Pooling":
        pooling_dir = m.get("path")
        if not isinstance(pooling_dir, str):
          raise input_error("missing module path", file=modules_path, record=i, field="path")
        files.safe_member_name(modules_path, pooling_dir)
      elif kind == "Normalize":
        normalize = True
      elif kind != "Transformer":
        raise input_error(f"unsupported sentence-transformers module {m['type']!r} (supported: "
                          "Transformer, Pooling, Normalize)", file=modules_path, record=i,
                          field="type")
  pooling_path = os.path.join(folder, pooling_dir, "config.json")
  if os.path.isfile(pooling_path):
    pooling = _pooling_mode(pooling_path)
  st_path = os.path.join(folder, "sentence_bert_config.json")
  if os.path.isfile(st_path):
    st = files.read_json(st_path)
    length = st.get("max_seq_length") if isinstance(st, dict) else None
    if length is not None:
      if not isinstance(length, int) or isinstance(length, bool) or length < 2:
        raise input_error(f"must be an int >= 2, got {length!r}", file=st_path,
                          field="max_seq_length")
      max_length = min(length, max_positions)
  return {"pooling": pooling, "normalize": normalize, "max_length": max_length}


def _weight_file(folder: str) -> str:
  path = os.path.join(folder, "model.safetensors")
  if os.path.isfile(path):
    return path
  for other, why in (("pytorch_model.bin", "a pickled PyTorch file, which is never loaded"),
                     ("model.safetensors.index.json", "sharded weights, not supported"),
                     ("flax_model.msgpack", "Flax weights of transformers < 5, not supported")):
    if os.path.isfile(os.path.join(folder, other)):
      raise input_error(f"missing; the folder has only {other} ({why}); convert it to "
                        "model.safetensors (e.g. `safetensors.torch.save_file(torch.load(...))` "
                        "on a trusted copy) or use a folder that has one", file=path)
  raise input_error("missing: the weights must be in model.safetensors", file=path)


def _load_params(folder: str, arch: Any, module: nn.Module, model_type: str) -> dict[str, Any]:
  """The module's params (nested dict of float32 numpy arrays) from model.safetensors.

  Raises:
    InputError: naming the file and the weight when a weight is missing, has another shape or
      cannot be read.
  """
  path = _weight_file(folder)
  shapes = jax.eval_shape(module.init, jax.random.key(0), jnp.zeros((1, 2), jnp.int32),
                          jnp.ones((1, 2), jnp.int32))["params"]
  recipes = arch.recipes(module)
  params: dict[str, Any] = {}
  try:
    with safe_open(path, framework="np") as f:
      available = set(f.keys())

      def find(name: str) -> str | None:
        alts = [name]
        if name.endswith("LayerNorm.weight"):
          alts.append(name[:-len("weight")] + "gamma")
        elif name.endswith("LayerNorm.bias"):
          alts.append(name[:-len("bias")] + "beta")
        for alt in alts:
          for key in (alt, f"{model_type}.{alt}"):
            if key in available:
              return key
        return None

      for leaf_path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]:
        param_path = tuple(k.key for k in leaf_path)
        recipe = recipes[param_path]
        arrays = []
        for name, shape in recipe.sources:
          key = find(name)
          if key is None:
            raise input_error(f"missing weight (looked for {name!r} and {model_type}.{name})",
                              file=path, record=f"weight {name!r}")
          got = tuple(f.get_slice(key).get_shape())
          if got != tuple(shape):
            raise input_error(f"shape {list(got)}, but config.json implies {list(shape)}",
                              file=path, record=f"weight {key!r}")
          try:
            arrays.append(np.asarray(f.get_tensor(key), np.float32))
          except (TypeError, ValueError) as e:
            raise input_error(f"cannot read as float32 ({e})", file=path,
                              record=f"weight {key!r}") from e
        value = np.ascontiguousarray(recipe.combine(*arrays), np.float32)
        assert value.shape == leaf.shape, (param_path, value.shape, leaf.shape)
        node = params
        for k in param_path[:-1]:
          node = node.setdefault(k, {})
        node[param_path[-1]] = value
  except InputError:
    raise
  except Exception as e:  # pylint: disable=broad-except  (SafetensorError is a bare Exception)
    raise input_error(f"not a readable safetensors file ({e})", file=path) from e
  return params


def _load_tokenizer(folder: str):
  """(`tokenizers.Tokenizer` with padding and truncation off, pad id from its padding or None)."""
  path = os.path.join(folder, "tokenizer.json")
  if not os.path.isfile(path):
    raise input_error("missing: the fast tokenizer file is needed (vocab.txt alone is not read)",
                      file=path)
  try:
    tokenizer = tokenizers.Tokenizer.from_file(path)
  except Exception as e:  # pylint: disable=broad-except  (the Rust side raises plain Exception)
    raise input_error(f"not a valid tokenizers file ({e})", file=path) from e
  pad_id = (tokenizer.padding or {}).get("pad_id")
  tokenizer.no_padding()
  tokenizer.no_truncation()
  return tokenizer, pad_id


def load_folder(folder: str, name: str | None = None) -> Encoder:
  """Loads the encoder in a HuggingFace-layout folder (not cached; see `names.load_encoder`).

  Args:
    folder: holds config.json, model.safetensors, tokenizer.json (+ sentence-transformers files).
    name: the name to report (default: the folder).

  Returns:
    The `Encoder`.

  Raises:
    InputError: naming the file and field of anything missing or malformed.
  """
  config = _read_config(folder)
  config_path = os.path.join(folder, "config.json")
  model_type = config.get("model_type")
  if model_type not in ARCHITECTURES:
    raise input_error(f"unsupported model_type {model_type!r}; supported: "
                      f"{', '.join(ARCHITECTURES)}", file=config_path, field="model_type")
  arch = ARCHITECTURES[model_type]
  module = arch.from_config(config, config_path)
  tokenizer, pad_id = _load_tokenizer(folder)
  vocab = tokenizer.get_vocab_size(with_added_tokens=True)
  if vocab > module.vocab_size:
    raise input_error(f"the tokenizer has {vocab} tokens but the model only {module.vocab_size} "
                      "embeddings", file=os.path.join(folder, "tokenizer.json"))
  params = _load_params(folder, arch, module, model_type)
  if pad_id is None:
    pad_id = config.get("pad_token_id")
  if not isinstance(pad_id, int) or not 0 <= pad_id < module.vocab_size:
    pad_id = 0
  max_positions = arch.usable_positions(module)
  kept = {k: v for k, v in config.items() if k not in VOLATILE_CONFIG}
  hashes = {
      "weights_sha256": files.tree_sha256(params),
      "config_sha256": files.sha256_bytes(json.dumps(kept, sort_keys=True).encode()),
      "tokenizer_sha256": files.sha256_bytes(tokenizer.to_str().encode()),
  }
  return Encoder(name=folder if name is None else name, path=folder, module=module,
                 params=jax.tree.map(jnp.asarray, params), tokenizer=tokenizer,
                 hidden_size=module.hidden_size, max_positions=max_positions, pad_id=pad_id,
                 defaults=_defaults(folder, max_positions), hashes=hashes)
