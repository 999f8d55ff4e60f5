"""BERT as a Flax Linen module (all-MiniLM-L6-v2, bge-small, bert-base, e5 ...).

The forward pass of HuggingFace's PyTorch `BertModel` without the pooler, in inference mode:
embeddings (word + absolute position + token type 0, LayerNorm), then `num_layers` post-LN
Transformer layers (`layers.TransformerLayer`). Token type ids are always 0 (single texts).
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bilinear_ir.encoders import layers
from bilinear_ir.errors import input_error


class BertEncoder(nn.Module):
  """BERT: token ids -> last hidden states.

  Params: `word_embeddings`, `position_embeddings`, `token_type_embeddings` (each
  `{"embedding": [rows, n]}`), `embeddings_norm`, `layer_0` ... `layer_{N-1}`
  (`layers.TransformerLayer`).

  Attributes:
    vocab_size: rows of the word embedding table.
    hidden_size: n.
    num_layers: N.
    num_heads: attention heads (divides n).
    intermediate_size: feed-forward width.
    max_positions: rows of the position table (the longest input).
    type_vocab_size: rows of the token type table.
    act: HuggingFace activation name ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu").
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
  max_positions: int = 512
  type_vocab_size: int = 2
  act: str = "gelu"
  eps: float = 1e-12
  precision: jax.lax.Precision | str | None = None
  remat: bool = False

  @nn.compact
  def __call__(self, ids: jnp.ndarray, mask: jnp.ndarray,
               packed: layers.Packing | None = None) -> jnp.ndarray:
    """Encodes a batch of padded token id rows.

    Args:
      ids: [B, L] int32 token ids, L <= max_positions.
      mask: [B, L] int32, 1 on real tokens, 0 on padding.
      packed: padding-free layers (`layers.Packing` of `mask`): the Transformer layers run on
        the real tokens only; the output is the same, zeros on padding.

    Returns:
      [B, L] + [n] float32: the last layer's hidden states, [B, L, n] (padding rows hold
      values too; mask them out).
    """
    n = self.hidden_size
    embed = lambda rows, name: nn.Embed(rows, n, name=name)
    words = embed(self.vocab_size, "word_embeddings")(ids)  # [B, L, n]
    positions = embed(self.max_positions, "position_embeddings").embedding[:ids.shape[1]]
    token_type = embed(self.type_vocab_size, "token_type_embeddings").embedding[0]
    x = words + (positions + token_type)[None]
    x = layers.layer_norm(self.eps, "embeddings_norm")(x)
    bias = layers.padding_bias(mask, x.dtype)
    if packed is not None:
      x = layers.pack(x, packed)  # [T, n]
    for i in range(self.num_layers):
      layer = layers.transformer_layer(self.remat)
      x = layer(self.num_heads, self.intermediate_size, self.act, self.eps, self.precision,
                name=f"layer_{i}")(x, bias, None, packed)
    return x if packed is None else layers.unpack(x, packed)


def from_config(config: dict, file: str = "config.json") -> BertEncoder:
  """The `BertEncoder` of a HuggingFace BERT `config.json` (parsed).

  Raises:
    InputError: naming `file` and the field when a field is missing or invalid, or describes
      a variant this module does not implement (relative position embeddings).
  """
  get = lambda key, kind=int, default=None: layers.config_value(config, key, file, kind, default)
  n, heads = get("hidden_size"), get("num_attention_heads")
  if n % heads:
    raise input_error(f"hidden_size {n} is not a multiple of num_attention_heads {heads}",
                      file=file, field="num_attention_heads")
  kind = config.get("position_embedding_type", "absolute")
  if kind != "absolute":
    raise input_error(f"only 'absolute' position embeddings are supported, got {kind!r}",
                      file=file, field="position_embedding_type")
  act = get("hidden_act", str, "gelu")
  layers.activation(act, file)
  return BertEncoder(vocab_size=get("vocab_size"), hidden_size=n,
                     num_layers=get("num_hidden_layers"), num_heads=heads,
                     intermediate_size=get("intermediate_size"),
                     max_positions=get("max_position_embeddings"),
                     type_vocab_size=get("type_vocab_size", int, 2), act=act,
                     eps=get("layer_norm_eps", float, 1e-12))


def usable_positions(module: BertEncoder) -> int:
  """The longest input (special tokens included): every position row is usable."""
  return module.max_positions


def recipes(module: BertEncoder) -> dict[tuple[str, ...], layers.Recipe]:
  """{param path: recipe} from HuggingFace `BertModel` weight names (no `bert.` prefix)."""
  n = module.hidden_size
  tables = {
      ("word_embeddings", "embedding"): layers.copy_recipe(
          "embeddings.word_embeddings.weight", (module.vocab_size, n)),
      ("position_embeddings", "embedding"): layers.copy_recipe(
          "embeddings.position_embeddings.weight", (module.max_positions, n)),
      ("token_type_embeddings", "embedding"): layers.copy_recipe(
          "embeddings.token_type_embeddings.weight", (module.type_vocab_size, n)),
  }

  def names(i: int) -> dict[str, str]:
    pre = f"encoder.layer.{i}"
    return {"q": f"{pre}.attention.self.query", "k": f"{pre}.attention.self.key",
            "v": f"{pre}.attention.self.value", "o": f"{pre}.attention.output.dense",
            "attention_norm": f"{pre}.attention.output.LayerNorm",
            "intermediate": f"{pre}.intermediate.dense", "output": f"{pre}.output.dense",
            "output_norm": f"{pre}.output.LayerNorm"}

  return layers.encoder_recipes(module, tables, names)
