"""A loaded frozen encoder and how its token states become sentence vectors.

    encoder = names.load_encoder("all-MiniLM-L6-v2", cache_dir)      # an `Encoder`
    ids = encoder.tokenize(texts, max_length=256)                 # [N] lists of ints
    hidden = jax.jit(encoder.hidden)(encoder.params, ids, mask)   # [B, L, n] after padding
    vectors = pool(hidden, mask, "mean", normalize=True)          # [B, n]
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import flax.linen as nn
import jax.numpy as jnp
import tokenizers

from bilinear_ir.errors import require

POOLINGS = ("mean", "cls")


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
    tokenizer = _truncating(self.tokenizer, int(max_length))
    return [e.ids for e in tokenizer.encode_batch([prefix + t for t in texts],
                                                  add_special_tokens=True)]


@functools.lru_cache(maxsize=32)
def _truncating(original: tokenizers.Tokenizer, max_length: int):
  """A copy of an encoder's tokenizer that truncates at `max_length` (no padding); keyed by the
  tokenizer object, so encoders that share it (fine-tuned copies) share the copy."""
  tokenizer = tokenizers.Tokenizer.from_str(original.to_str())
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
