"""MPNet as a Flax Linen module (all-mpnet-base-v2).

The forward pass of HuggingFace's PyTorch `MPNetModel` without the pooler, in inference mode:
  * embeddings: word + position, LayerNorm; no token types. Position ids count the real tokens
    from `padding_idx + 1` (RoBERTa style: the first token is at row 2), padding sits at row
    `padding_idx`; HuggingFace derives them from `ids != padding_idx`, this module from the mask
    (the same whenever padding uses the pad id and texts do not contain it).
  * a relative position bias: `relative_position_bucket` maps each (query, key) offset to one of
    32 T5-style buckets (bidirectional: 16 for keys before, 16 after; offsets below 8 exact,
    then log-spaced up to 128), each bucket has one learned scalar per head
    (`relative_attention_bias`, [buckets, h]). It depends only on offsets in the padded row, is
    computed once and added to the attention scores of every layer.
  * `num_layers` post-LN Transformer layers (`layers.TransformerLayer`).
"""
from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bilinear_ir.encoders import layers
from bilinear_ir.errors import input_error

# HuggingFace's MPNet fixes these: `padding_idx` is 1 whatever `pad_token_id` says, and the
# buckets are always 32 (`relative_attention_num_buckets` only sizes the bias table).
PADDING_IDX = 1
NUM_BUCKETS = 32
MAX_DISTANCE = 128


def relative_position_bucket(relative: np.ndarray, num_buckets: int = NUM_BUCKETS,
                             max_distance: int = MAX_DISTANCE) -> np.ndarray:
  """T5/MPNet buckets of relative positions (key - query), as HuggingFace computes them.

  Args:
    relative: int array of offsets `key_position - query_position`, any shape.
    num_buckets: total buckets (half for each direction).
    max_distance: offsets from here on share the last bucket of their direction.

  Returns:
    int32 array of bucket ids in [0, num_buckets), the shape of `relative`.
  """
  n = -np.asarray(relative, np.int64)
  half = num_buckets // 2
  ret = (n < 0).astype(np.int64) * half
  n = np.abs(n)
  exact = half // 2
  # float32 arithmetic as in PyTorch (it decides the rounding at bucket edges).
  scaled = (np.log(np.maximum(n, 1).astype(np.float32) / np.float32(exact))
            / np.float32(math.log(max_distance / exact)) * np.float32(half - exact))
  large = np.minimum(exact + scaled.astype(np.int64), half - 1)
  return (ret + np.where(n < exact, n, large)).astype(np.int32)


class MPNetEncoder(nn.Module):
  """MPNet: token ids -> last hidden states.

  Params: `word_embeddings`, `position_embeddings` (each `{"embedding": [rows, n]}`),
  `embeddings_norm`, `relative_attention_bias` (`{"embedding": [num_buckets, h]}`),
  `layer_0` ... `layer_{N-1}` (`layers.TransformerLayer`).

  Attributes:
    vocab_size: rows of the word embedding table.
    hidden_size: n.
    num_layers: N.
    num_heads: attention heads h (divides n).
    intermediate_size: feed-forward width.
    max_positions: rows of the position table (`max_position_embeddings`; the longest input is
      `max_positions - PADDING_IDX - 1`).
    num_buckets: rows of the relative position bias table (>= NUM_BUCKETS; the bucketing
      itself always uses NUM_BUCKETS, as HuggingFace does).
    act: HuggingFace activation name.
    eps: LayerNorm epsilon.
    precision: matmul precision (None: jax's default).
    remat: recompute each layer's activations in the backward pass (`layers.transformer_layer`;
      fine-tuning's gradient checkpointing); the outputs are the same.
  """
  vocab_size: int
  hidden_size: int
  num_layers: int
  num_heads: int
  intermediate_size: int
  max_positions: int = 514
  num_buckets: int = NUM_BUCKETS
  act: str = "gelu"
  eps: float = 1e-5
  precision: jax.lax.Precision | str | None = None
  remat: bool = False

  @nn.compact
  def __call__(self, ids: jnp.ndarray, mask: jnp.ndarray,
               packed: layers.Packing | None = None) -> jnp.ndarray:
    """Encodes a batch of padded token id rows.

    Args:
      ids: [B, L] int32 token ids, L <= max_positions - PADDING_IDX - 1.
      mask: [B, L] int32, 1 on real tokens (a prefix of each row), 0 on padding.
      packed: padding-free layers (`layers.Packing` of `mask`): the Transformer layers run on
        the real tokens only; the output is the same, zeros on padding.

    Returns:
      [B, L, n] float32: the last layer's hidden states (mask out padding rows).
    """
    n, length = self.hidden_size, ids.shape[1]
    words = nn.Embed(self.vocab_size, n, name="word_embeddings")(ids)  # [B, L, n]
    real = (mask != 0).astype(jnp.int32)
    positions = jnp.cumsum(real, axis=1) * real + PADDING_IDX  # [B, L]
    x = words + nn.Embed(self.max_positions, n, name="position_embeddings")(positions)
    x = layers.layer_norm(self.eps, "embeddings_norm")(x)
    offsets = np.arange(length)[None, :] - np.arange(length)[:, None]  # [L, L] key - query
    buckets = relative_position_bucket(offsets)  # [L, L] in [0, NUM_BUCKETS)
    table = nn.Embed(self.num_buckets, self.num_heads, name="relative_attention_bias")
    position_bias = jnp.transpose(table(jnp.asarray(buckets)), (2, 0, 1))[None]  # [1, h, L, L]
    bias = layers.padding_bias(mask, x.dtype)
    if packed is not None:
      x = layers.pack(x, packed)  # [T, n]
    for i in range(self.num_layers):
      layer = layers.transformer_layer(self.remat)
      x = layer(self.num_heads, self.intermediate_size, self.act, self.eps, self.precision,
                name=f"layer_{i}")(x, bias, position_bias, packed)
    return x if packed is None else layers.unpack(x, packed)


def from_config(config: dict, file: str = "config.json") -> MPNetEncoder:
  """The `MPNetEncoder` of a HuggingFace MPNet `config.json` (parsed).

  Raises:
    InputError: naming `file` and the field when a field is missing or invalid.
  """
  get = lambda key, kind=int, default=None: layers.config_value(config, key, file, kind, default)
  n, heads = get("hidden_size"), get("num_attention_heads")
  if n % heads:
    raise input_error(f"hidden_size {n} is not a multiple of num_attention_heads {heads}",
                      file=file, field="num_attention_heads")
  rows = get("max_position_embeddings")
  if rows < PADDING_IDX + 3:
    raise input_error(f"must be >= {PADDING_IDX + 3}, got {rows}", file=file,
                      field="max_position_embeddings")
  buckets = get("relative_attention_num_buckets", int, NUM_BUCKETS)
  if buckets < NUM_BUCKETS:
    raise input_error(f"must be >= {NUM_BUCKETS} (the buckets HuggingFace's MPNet uses), got "
                      f"{buckets}", file=file, field="relative_attention_num_buckets")
  act = get("hidden_act", str, "gelu")
  layers.activation(act, file)
  return MPNetEncoder(vocab_size=get("vocab_size"), hidden_size=n,
                      num_layers=get("num_hidden_layers"), num_heads=heads,
                      intermediate_size=get("intermediate_size"), max_positions=rows,
                      num_buckets=buckets, act=act,
                      eps=get("layer_norm_eps", float, 1e-5))


def usable_positions(module: MPNetEncoder) -> int:
  """The longest input (special tokens included): rows 0..PADDING_IDX are never a position."""
  return module.max_positions - PADDING_IDX - 1


def recipes(module: MPNetEncoder) -> dict[tuple[str, ...], layers.Recipe]:
  """{param path: recipe} from HuggingFace `MPNetModel` weight names (no `mpnet.` prefix)."""
  n = module.hidden_size
  tables = {
      ("word_embeddings", "embedding"): layers.copy_recipe(
          "embeddings.word_embeddings.weight", (module.vocab_size, n)),
      ("position_embeddings", "embedding"): layers.copy_recipe(
          "embeddings.position_embeddings.weight", (module.max_positions, n)),
      ("relative_attention_bias", "embedding"): layers.copy_recipe(
          "encoder.relative_attention_bias.weight", (module.num_buckets, module.num_heads)),
  }

  def names(i: int) -> dict[str, str]:
    pre = f"encoder.layer.{i}"
    return {"q": f"{pre}.attention.attn.q", "k": f"{pre}.attention.attn.k",
            "v": f"{pre}.attention.attn.v", "o": f"{pre}.attention.attn.o",
            "attention_norm": f"{pre}.attention.LayerNorm",
            "intermediate": f"{pre}.intermediate.dense", "output": f"{pre}.output.dense",
            "output_norm": f"{pre}.output.LayerNorm"}

  return layers.encoder_recipes(module, tables, names)
