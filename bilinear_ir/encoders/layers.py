"""The Transformer layer BERT and MPNet share: self-attention and a feed-forward block, each
followed by a residual add and a LayerNorm (post-LN), as in HuggingFace's PyTorch models.

Params are float32 and the matmuls run at jax's default precision (`precision=None`, so
`jax.default_matmul_precision` decides; float32 on CPU). Padding is masked by an additive
`finfo.min` bias on the attention scores, as HuggingFace does, so padded positions never change
the real tokens' outputs; a row whose keys are all padding (an empty batch row) stays finite.

Padding-free layers: given a `Packing` of the batch, a layer's input is the batch's T real tokens
[T, n] instead of [B, L, n]; every token-wise part (the QKV and output projections, the feed-
forward block, the LayerNorms) runs on those T rows only, and attention alone unpacks them, in
groups of rows of similar length (`packing`'s `groups`: the rows sorted by length and cut into
equal parts), each group at its own width. The outputs of the real tokens are those of the padded
layer; the work drops from B * L to T tokens (half of it on InsuranceQA's answers, padded to 256
but 114 tokens long on average).
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bilinear_ir.errors import input_error

# HuggingFace `hidden_act` names -> functions ("gelu" is the exact erf form).
ACTIVATIONS: dict[str, Callable[[jnp.ndarray], jnp.ndarray]] = {
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "gelu_new": functools.partial(jax.nn.gelu, approximate=True),
    "gelu_pytorch_tanh": functools.partial(jax.nn.gelu, approximate=True),
    "relu": jax.nn.relu,
}


def activation(name: str, file: str = "config.json") -> Callable[[jnp.ndarray], jnp.ndarray]:
  """The function for a HuggingFace `hidden_act` name; an unknown name raises `InputError`."""
  if name not in ACTIVATIONS:
    raise input_error(f"unsupported activation {name!r}; supported: {', '.join(ACTIVATIONS)}",
                      file=file, field="hidden_act")
  return ACTIVATIONS[name]


def config_value(config: dict, key: str, file: str, kind: type = int, default=None):
  """`config[key]` checked to be a `kind` (an int > 0, a float > 0 or a str).

  Args:
    config: the parsed `config.json`.
    key: the field.
    file: the file named in errors.
    kind: int, float or str.
    default: the value when the field is absent (None: the field is required).

  Raises:
    InputError: naming `file` and `key` when the field is missing or invalid.
  """
  if key not in config:
    if default is None:
      raise input_error("missing field", file=file, field=key)
    return default
  value = config[key]
  if kind is str:
    ok = isinstance(value, str)
  elif kind is float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
  else:
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
  if not ok:
    expected = "a string" if kind is str else f"a positive {kind.__name__}"
    raise input_error(f"must be {expected}, got {value!r}", file=file, field=key)
  return kind(value)


def layer_norm(eps: float, name: str) -> nn.LayerNorm:
  """A LayerNorm over the last axis with the two-pass variance `E[(x - mean)^2]` (as PyTorch;
  flax's default `E[x^2] - mean^2` loses digits when the mean is large against the spread)."""
  return nn.LayerNorm(epsilon=eps, use_fast_variance=False, name=name)


def padding_bias(mask: jnp.ndarray, dtype=jnp.float32) -> jnp.ndarray:
  """Additive attention bias for a padding mask.

  Args:
    mask: [B, L] int or bool, nonzero on real tokens.
    dtype: the scores' dtype.

  Returns:
    [B, 1, 1, L]: 0 on real keys, `finfo(dtype).min` on padding.
  """
  return jnp.where(mask[:, None, None, :] != 0, 0.0, jnp.finfo(dtype).min).astype(dtype)


class Packing(NamedTuple):
  """Where the real tokens of a padded batch [B, L] sit among T packed rows (`packing`).

  Attributes:
    rows: [T] int32: the flat position b * L + l of each packed row; the rows after the real
      tokens point at B * L (a row of zeros: `pack` appends one).
    slots: [B, L] int32: the packed row of each position; T on padding (`unpack` appends a row
      of zeros there).
    groups: attention's groups, a tuple of [Bg, Lg] int32: the slots of the g-th part of the
      rows sorted by length (shortest first; the parts' sizes sum to B), cut to the part's own
      width Lg (`trimmed_width`).
    group_rows: [T] int32: each packed row's position in the groups' flat concatenation
      (S = sum of Bg * Lg positions); S after the real tokens.
    (`pack` and `unpack` read `rows` and `slots` only: a Packing without groups is a layout.)
  """
  rows: jnp.ndarray
  slots: jnp.ndarray
  groups: tuple[jnp.ndarray, ...] | None = None
  group_rows: jnp.ndarray | None = None


def packed_rows(real: int, multiple: int = 1) -> int:
  """T for `real` real tokens: rounded up on a geometric grid (steps of 1/8 of the power of two
  below it, at least 16), a multiple of `multiple` (devices), so that batches of varying length
  share a few compiled shapes at most 12.5% above their real tokens."""
  step = 16
  while step * 16 <= real:
    step *= 2
  step = int(np.lcm(step, max(1, multiple)))
  return max(step, -(-real // step) * step)


def trimmed_width(mask: np.ndarray) -> int:
  """The width a batch's tokens [B, L] are cut to: its longest row rounded up to a power of two
  (at least 16, at most L), as a per-batch padding would, in a few compiled shapes."""
  longest, width = int(np.max(np.sum(mask != 0, axis=1), initial=1)), 16
  while width < longest:
    width *= 2
  return min(width, mask.shape[1])


ATTENTION_GROUPS = 4


def packing(mask: np.ndarray, rows: int | None = None, groups: int = ATTENTION_GROUPS
            ) -> Packing:
  """The `Packing` of a padded batch, as host arrays.

  Attention runs in `groups` parts of the rows sorted by length, each at its own width (a power
  of two): the parts' sizes depend on B only, so a run compiles a few width combinations. On
  InsuranceQA's answers (median 93 tokens, a batch's longest 256) attention's work drops to
  about 5/8 of the padded batch's with 2 groups and below 1/2 with 4.

  Args:
    mask: [B, L] int, 1 on real tokens (a prefix of each row).
    rows: T >= the real tokens (default `packed_rows` of their count).
    groups: parts (at least 1; at most B of them hold rows).

  Returns:
    `Packing` of numpy int32 arrays (rows [T], slots [B, L], groups, group_rows).
  """
  mask = np.asarray(mask) != 0
  flat = np.flatnonzero(mask.reshape(-1)).astype(np.int32)
  total = packed_rows(flat.size) if rows is None else rows
  if total < flat.size:
    raise input_error(f"must be >= the {flat.size} real tokens, got {total}", field="rows")
  out = np.full(total, mask.size, np.int32)
  out[:flat.size] = flat
  slots = np.full(mask.size, total, np.int32)
  slots[flat] = np.arange(flat.size, dtype=np.int32)
  slots = slots.reshape(mask.shape)
  if groups < 1:
    raise input_error(f"must be at least 1, got {groups}", field="groups")
  order = np.argsort(mask.sum(axis=1), kind="stable")
  parts = tuple(slots[part, :trimmed_width(mask[part])]
                for part in np.array_split(order, groups) if part.size)
  layout = np.concatenate([part.reshape(-1) for part in parts])
  group_rows = np.full(total, layout.size, np.int32)
  group_rows[layout[layout < total]] = np.flatnonzero(layout < total).astype(np.int32)
  return Packing(out, slots, parts, group_rows)


def _pack(x: jnp.ndarray, p: Packing) -> jnp.ndarray:
  flat = x.reshape(-1, *x.shape[2:])
  flat = jnp.concatenate([flat, jnp.zeros((1, *flat.shape[1:]), flat.dtype)])
  return flat[p.rows]


def _unpack(x: jnp.ndarray, p: Packing) -> jnp.ndarray:
  return jnp.concatenate([x, jnp.zeros((1, *x.shape[1:]), x.dtype)])[p.slots]


# `pack` and `unpack` are each other's transposes (every real token sits in one row and one
# position; the zero rows take no gradient), so each one's gradient is the other one: a gather,
# where autodiff would scatter-add (slow on the CPU).
@jax.custom_vjp
def pack(x: jnp.ndarray, p: Packing) -> jnp.ndarray:
  """x [B, L, ...] -> [T, ...]: the real tokens' rows (zeros after them)."""
  return _pack(x, p)


@jax.custom_vjp
def unpack(x: jnp.ndarray, p: Packing) -> jnp.ndarray:
  """x [T, ...] -> [B, L, ...]: each real token back at its position, zeros on padding."""
  return _unpack(x, p)


pack.defvjp(lambda x, p: (_pack(x, p), p), lambda p, g: (_unpack(g, p), None))
unpack.defvjp(lambda x, p: (_unpack(x, p), p), lambda p, g: (_pack(g, p), None))


def attention_chunk(batch: int, heads: int, length: int,
                    target_bytes: int = 1 << 22) -> int:
  """Examples per attention step: the largest divisor of `batch` whose float32 scores
  [chunk, heads, length, length] fit in `target_bytes` (at least 1)."""
  per_example = heads * length * length * 4
  best = 1
  for c in range(1, batch + 1):
    if batch % c == 0 and c * per_example <= target_bytes:
      best = c
  return best


def attend(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, bias: jnp.ndarray,
           extra_bias: jnp.ndarray | None = None, precision=None,
           chunk: int | None = None) -> jnp.ndarray:
  """Softmax attention, on CPU a few examples at a time.

  The scores of the whole batch, [B, h, L, L], would be written to and read back from memory
  four times (dot, max, exp-sum, normalise); done `chunk` examples at a time (`lax.map`) they
  stay in the CPU caches, several times faster on a 2-core CPU at B 32, h 12, L 256. Step j
  takes the examples j, j + B/chunk, j + 2B/chunk, ..., so on a batch sharded over devices
  every chunk spans all shards. The result equals one batched computation.

  Args:
    q, k, v: [B, h, L, d] queries (already scaled by 1/sqrt(d)), keys and values.
    bias: [B, 1, 1, L] additive padding bias.
    extra_bias: optional [1, h, L, L] additive score bias.
    precision: matmul precision.
    chunk: examples per step (a divisor of B); default `attention_chunk(B, h, L)` on the CPU
      backend, B (one step) on accelerators, whose fused kernels need no chunks.

  Returns:
    [B, h, L, d] the attention context.
  """
  b, h, length, _ = q.shape
  if chunk is None:
    chunk = attention_chunk(b, h, length) if jax.default_backend() == "cpu" else b

  def one(args):
    q, k, v, bias = args
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k, precision=precision) + bias
    if extra_bias is not None:
      scores = scores + extra_bias
    probs = jax.nn.softmax(scores, axis=-1)
    return jnp.einsum("bhqk,bhkd->bhqd", probs, v, precision=precision)

  if chunk >= b:
    return one((q, k, v, bias))
  steps = b // chunk
  split = lambda x: jnp.swapaxes(x.reshape(chunk, steps, *x.shape[1:]), 0, 1)
  out = jax.lax.map(one, (split(q), split(k), split(v), split(bias)))  # [steps, chunk, ...]
  return jnp.swapaxes(out, 0, 1).reshape(b, *out.shape[2:])


class SelfAttention(nn.Module):
  """Multi-head self-attention with one fused QKV projection and an output projection.

  Params: `qkv` (kernel [n, 3, h, d], bias [3, h, d]: query, key, value in that order) and
  `out` (kernel [h, d, n], bias [n]), with n = h * d.

  Attributes:
    num_heads: h.
    precision: matmul precision (None: jax's default).
  """
  num_heads: int
  precision: jax.lax.Precision | str | None = None

  @nn.compact
  def __call__(self, x: jnp.ndarray, bias: jnp.ndarray,
               extra_bias: jnp.ndarray | None = None,
               packed: Packing | None = None) -> jnp.ndarray:
    """Attends every position to every unmasked one.

    Args:
      x: [B, L, n] inputs; [T, n] the real tokens with `packed`.
      bias: [B, 1, 1, L] additive padding bias (`padding_bias`).
      extra_bias: optional [1, h, L, L] additive score bias (MPNet's relative positions).
      packed: the batch's `Packing` from `packing` (padding-free: the projections run on the
        T rows, attention in its groups).

    Returns:
      [B, L, n] the output projection of the attention context ([T, n] with `packed`).
    """
    n = x.shape[-1]
    h = self.num_heads
    d = n // h
    qkv = nn.DenseGeneral((3, h, d), axis=-1, precision=self.precision, name="qkv")(x)
    if packed is None:
      context = self._attend(qkv, bias, extra_bias, None)  # [B, L, h, d]
    else:
      context = self._attend_groups(qkv, packed, extra_bias)  # [T, h, d]
    return nn.DenseGeneral(n, axis=(-2, -1), precision=self.precision, name="out")(context)

  def _attend(self, qkv: jnp.ndarray, bias: jnp.ndarray, extra_bias: jnp.ndarray | None,
              chunk: int | None) -> jnp.ndarray:
    """qkv [B, L, 3, h, d], bias [B, 1, 1, L], extra_bias [1, h, >= L, >= L] or None ->
    the context [B, L, h, d] (`attend`, `chunk` examples a step)."""
    q, k, v = jnp.transpose(qkv, (2, 0, 3, 1, 4))  # [B, h, L, d] each
    length = q.shape[2]
    if extra_bias is not None:
      extra_bias = extra_bias[:, :, :length, :length]
    context = attend(q / jnp.sqrt(jnp.asarray(q.shape[-1], q.dtype)), k, v, bias, extra_bias,
                     self.precision, chunk)  # [B, h, L, d]
    return jnp.transpose(context, (0, 2, 1, 3))

  def _attend_groups(self, qkv: jnp.ndarray, packed: Packing,
                     extra_bias: jnp.ndarray | None) -> jnp.ndarray:
    """Padding-free attention in `packed`'s groups (each at its own width): qkv [T, 3, h, d] ->
    the context [T, h, d]. Each group attends as a whole (the backward pass of the CPU's
    chunked loop costs more than it saves in training)."""
    total = qkv.shape[0]
    layout = Packing(packed.group_rows,
                     jnp.concatenate([s.reshape(-1) for s in packed.groups])[None])
    flat = unpack(qkv, layout)[0]  # [S, 3, h, d]
    contexts, start = [], 0
    for slots in packed.groups:  # [Bg, Lg]
      size = slots.size
      part = flat[start:start + size].reshape(*slots.shape, *flat.shape[1:])
      bias = padding_bias(slots != total, qkv.dtype)
      contexts.append(self._attend(part, bias, extra_bias, slots.shape[0]).reshape(
          size, *flat.shape[2:]))
      start += size
    return pack(jnp.concatenate(contexts)[None], layout)  # [T, h, d]


class TransformerLayer(nn.Module):
  """One post-LN Transformer layer: `x = LN(x + attn(x)); x = LN(x + W2 act(W1 x))`.

  Params: `attention` (`SelfAttention`), `attention_norm`, `intermediate` (kernel [n, f]),
  `output` (kernel [f, n]), `output_norm`.

  Attributes:
    num_heads: attention heads h.
    intermediate_size: f, the feed-forward width.
    act: HuggingFace activation name (`ACTIVATIONS`).
    eps: LayerNorm epsilon.
    precision: matmul precision (None: jax's default).
  """
  num_heads: int
  intermediate_size: int
  act: str = "gelu"
  eps: float = 1e-12
  precision: jax.lax.Precision | str | None = None

  @nn.compact
  def __call__(self, x: jnp.ndarray, bias: jnp.ndarray,
               extra_bias: jnp.ndarray | None = None,
               packed: Packing | None = None) -> jnp.ndarray:
    """x: [B, L, n] ([T, n] with `packed`, the batch's `Packing`); bias: [B, 1, 1, L];
    extra_bias: [1, h, L, L] or None. Returns x's shape."""
    attended = SelfAttention(self.num_heads, self.precision, name="attention")(
        x, bias, extra_bias, packed)
    x = layer_norm(self.eps, "attention_norm")(x + attended)
    y = nn.Dense(self.intermediate_size, precision=self.precision, name="intermediate")(x)
    y = nn.Dense(x.shape[-1], precision=self.precision, name="output")(activation(self.act)(y))
    return layer_norm(self.eps, "output_norm")(x + y)


def transformer_layer(remat: bool) -> type[TransformerLayer]:
  """The layer class an encoder stacks: `TransformerLayer`, or with `remat` the same layer under
  `nn.remat` (gradient checkpointing: its activations are recomputed in the backward pass
  instead of kept; params, names and outputs unchanged)."""
  return _REMAT_LAYER if remat else TransformerLayer


_REMAT_LAYER = nn.remat(TransformerLayer)


# ----------------------------------------------------------------------------------------------
# HuggingFace (PyTorch layout) weights <-> the params of the modules above.

# A HuggingFace weight: its name and the shape it must have.
Source = tuple[str, tuple[int, ...]]


class Recipe(NamedTuple):
  """How one param is made of HuggingFace weights, both ways (read: `hf_folder.load_folder`;
  written: `split_params`).

  Attributes:
    sources: the weights, in the order `combine` takes them and `split` returns them.
    combine: float32 arrays of `sources` (in order, each of its shape) -> the param.
    split: the param -> the arrays of `sources` (the exact inverse of `combine`: transposes and
      reshapes only, so a round trip gives the same bits).
  """
  sources: tuple[Source, ...]
  combine: Callable[..., np.ndarray]
  split: Callable[[np.ndarray], tuple[np.ndarray, ...]]


def copy_recipe(name: str, shape: tuple[int, ...]) -> Recipe:
  """A param equal to one weight (embedding tables, LayerNorm scales and biases)."""
  return Recipe(((name, shape),), lambda w: w, lambda p: (p,))


def dense_recipes(prefix: str, n_in: int, n_out: int) -> dict[tuple[str, ...], Recipe]:
  """{("kernel",): ..., ("bias",): ...} of an `nn.Dense` from a `torch.nn.Linear` named `prefix`
  (weight [out, in], transposed to the kernel [in, out])."""
  return {("kernel",): Recipe(((f"{prefix}.weight", (n_out, n_in)),), lambda w: w.T,
                              lambda p: (p.T,)),
          ("bias",): copy_recipe(f"{prefix}.bias", (n_out,))}


def norm_recipes(prefix: str, n: int) -> dict[tuple[str, ...], Recipe]:
  """{("scale",): ..., ("bias",): ...} of a LayerNorm from a `torch.nn.LayerNorm` `prefix`."""
  return {("scale",): copy_recipe(f"{prefix}.weight", (n,)),
          ("bias",): copy_recipe(f"{prefix}.bias", (n,))}


def layer_recipes(names: dict[str, str], n: int, h: int, f: int
                  ) -> dict[tuple[str, ...], Recipe]:
  """Recipes of every param of one `TransformerLayer` (paths relative to the layer).

  Args:
    names: HuggingFace module names (without `.weight`/`.bias`) for the keys "q", "k", "v", "o"
      (attention projections), "attention_norm", "intermediate", "output", "output_norm".
    n: hidden size; h: heads; f: intermediate size.

  Returns:
    {param path: recipe}.
  """
  d = n // h
  linear = lambda key: (f"{names[key]}.weight", (n, n))
  bias = lambda key: (f"{names[key]}.bias", (n,))
  out = {
      ("attention", "qkv", "kernel"): Recipe(  # [n, 3, h, d] <-> three [n, n] weights (out, in)
          (linear("q"), linear("k"), linear("v")),
          lambda q, k, v: np.stack([q.T, k.T, v.T], axis=1).reshape(n, 3, h, d),
          lambda p: tuple(p.reshape(n, 3, n)[:, j].T for j in range(3))),
      ("attention", "qkv", "bias"): Recipe(  # [3, h, d] <-> three [n]
          (bias("q"), bias("k"), bias("v")),
          lambda q, k, v: np.stack([q, k, v]).reshape(3, h, d),
          lambda p: tuple(p.reshape(3, n))),
      ("attention", "out", "kernel"): Recipe(  # [h, d, n] <-> [n, n] (out, in)
          (linear("o"),), lambda w: w.T.reshape(h, d, n), lambda p: (p.reshape(n, n).T,)),
      ("attention", "out", "bias"): copy_recipe(f"{names['o']}.bias", (n,)),
  }
  for key, width_in, width_out in (("intermediate", n, f), ("output", f, n)):
    out.update({(key, *p): r for p, r in dense_recipes(names[key], width_in, width_out).items()})
  for key in ("attention_norm", "output_norm"):
    out.update({(key, *p): r for p, r in norm_recipes(names[key], n).items()})
  return out


def encoder_recipes(module, embeddings: dict[tuple[str, ...], Recipe],
                    layer_names: Callable[[int], dict[str, str]]
                    ) -> dict[tuple[str, ...], Recipe]:
  """Recipes of a whole encoder: `embeddings` (the architecture's tables), the embeddings
  LayerNorm (`embeddings.LayerNorm`) and every `TransformerLayer` `layer_{i}`, whose HuggingFace
  names `layer_names(i)` gives (the keys of `layer_recipes`). `module` has hidden_size,
  num_heads, intermediate_size and num_layers."""
  n, h, f = module.hidden_size, module.num_heads, module.intermediate_size
  out = dict(embeddings)
  out.update({("embeddings_norm", *p): r
              for p, r in norm_recipes("embeddings.LayerNorm", n).items()})
  for i in range(module.num_layers):
    out.update({(f"layer_{i}", *p): r
                for p, r in layer_recipes(layer_names(i), n, h, f).items()})
  return out


def split_params(recipes: dict[tuple[str, ...], Recipe], params) -> dict[str, np.ndarray]:
  """The HuggingFace weights of an encoder's params: every `Recipe.split`, the inverse of
  reading them (`hf_folder.load_folder`).

  Args:
    recipes: {param path: recipe} of the encoder (`bert.recipes` / `mpnet.recipes`).
    params: its params, a tree of float32 arrays with exactly the recipes' paths.

  Returns:
    {weight name (no `bert.` / `mpnet.` prefix): C-contiguous float32 array of the recipe's
    shape}; reading them back gives `params` bit for bit.

  Raises:
    InputError: naming the param that is missing, unexpected, not float32 or of another shape.
  """
  leaves = {tuple(k.key for k in path): leaf
            for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}
  for path in sorted(set(leaves) ^ set(recipes)):
    what = "missing" if path in recipes else "unexpected"
    raise input_error(f"{what} param for this encoder", file="params", record=".".join(path))
  out = {}
  for path, recipe in recipes.items():
    param = np.asarray(leaves[path])
    if param.dtype != np.float32:
      raise input_error(f"dtype {param.dtype}, must be float32", file="params",
                        record=".".join(path))
    parts = recipe.split(param)
    for (name, shape), part in zip(recipe.sources, parts, strict=True):
      if part.shape != tuple(shape):
        raise input_error(f"gives {name!r} the shape {list(part.shape)}, the encoder's is "
                          f"{list(shape)}", file="params", record=".".join(path))
      assert name not in out, name
      out[name] = np.ascontiguousarray(part)
  return out
