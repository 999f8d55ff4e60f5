"""Mixture-of-Logits (MoL): Ding & Zhai, "Retrieval with Learned Similarities" (WWW 2025), eq. 2.

A query becomes P_q component embeddings f_1(q)..f_{P_q}(q), an item P_x embeddings
g_1(x)..g_{P_x}(x), all of width d_P and L2-normalised. The P = P_q * P_x outer-product logits

    l_{a,b}(q, x) = <f_a(q), g_b(x)> / temperature          (index p = a * P_x + b)

are mixed by a gating distribution over the P logits,

    phi(q, x) = sum_p pi_p(q, x) * l_p(q, x),   pi(q, x) = softmax(MLP(l(q, x))),

where the MLP has two layers with SiLU between them and, as in the paper's question-answering setup
(its appendix A.3), sees only the P logits. `temperature` divides the logits before both the gate
and the mixture, as the reference MoL does; since the gate sums to 1, phi <= max_p l_p, the fact
the top-k algorithms of `bilinear_ir.retrieval.mol_topk` rest on.

Residual MoL (`residual="dot"`, "vector" inputs): the plain dot product of the raw embeddings
l_dot = <q, x> (not divided by the temperature) is one more logit, the last (index P_q * P_x), and

    phi(q, x) = (1 - lam) * l_dot + lam * sum_p pi_p(q, x) * l_p(q, x)   (p over all P_q*P_x + 1),

pi = softmax(MLP(component logits)) a distribution over the P_q * P_x + 1 logits (the gate sees
the component logits, whose scale is set by the temperature whatever the embedding's, and weighs
the dot logit too), lam a learned scalar (param `lam`, shape [1]) that starts at 0. The mixture's
weights lam * pi + (1 - lam) e_dot sum to 1 and start at exactly 1 on the dot logit and 0
elsewhere, so step 0 scores exactly as the dot product (the table scorers' upgrade path); lam's
gradient there, sum_p pi_p l_p - l_dot, is not zero, so it moves (as LoRA's zero factor does).
lam is not confined to [0, 1] (a clip would stop its gradient at the start), so phi may exceed
the largest logit: `mol_topk`'s bound-based algorithms refuse the residual form, its brute force
(what evaluation uses) serves it exactly. `gates` returns pi, the distribution L_MI balances.

Component embeddings (`inputs`):
  "vector": inputs are frozen embeddings [B, n]; each side has its own two-layer MLP
    n -> hidden -> P * d_P (SiLU), as in the paper's recommendation setup (appendix A.2.1).
  "tokens": inputs are token embeddings [B, T, n] with a bool mask [B, T] (True = real token).
    Each side uses the paper's *parameterised pooling* (appendix A.2.2): the embedding at the first
    position ([CLS]) is mapped by a dense layer to pooling logits [max_len, P_side], a masked
    softmax over positions gives one distribution over tokens per component, and each pooled
    vector has its own projection n -> d_P. The pooling layer starts at zero, so step 0 is mean
    pooling. The paper's other half, *special aggregation tokens* added to the encoder's input,
    needs a fine-tuned encoder and has no place over frozen token embeddings: not implemented.

Method inputs: `(q, docs)` for "vector" and `(q, q_mask, docs, d_mask)` for "tokens" (the order the
trainer passes `*q, *docs`). Shapes below are for "vector"; for "tokens" read [B, T, n] + [B, T].

  score_pairs(q [B, n], d [B, n]) -> [B]
  score_all(q [B, n], docs [N, n]) -> [B, N]
  score_all_with_gates(q, docs) -> ([B, N], (B, N, P))   (for training with L_MI)
  logits(q, docs) -> (B, N, P);  gates(q, docs) -> (B, N, P)
  query_components(q [B, n]) -> (B, P_q, d_P);  item_components(docs [N, n]) -> (N, P_x, d_P)
  mix(logits (..., P)) -> (phi (...), gates (..., P))
where P = `num_logits` = P_q * P_x, plus 1 (the dot logit, last) for the residual form.

Memory: `score_all` materialises the (B, N, P) logits and (B, N, gate_hidden) gate activations, fine
for training batches; retrieval over a corpus goes through `bilinear_ir.retrieval.mol_topk`, which
chunks over items.

Retrieval: MoL has no exact query/doc table factorisation (it is not a `TableScorer`). What it
offers is the doc-side tables of `mol_topk.MolIndex`, built once by `mol_topk.build_index`: the item
components (N, P_x, d_P) (per-component MIPS, the exact two-pass algorithm and MoL re-scoring) and
the TopKAvg table sum_b g_b(x) / P (N, d_P), whose inner product with sum_a f_a(q) is the mean of
the P logits (times temperature); any MIPS index can serve either. A residual MoL's index also
keeps the raw docs [N, n] (its dot logit).

Training (paper eq. 4): sampled-softmax / in-batch cross entropy on `score_all` plus
`mi_weight * bilinear_ir.train.losses.mol_load_balancing_loss(gates)` (alpha = 0.001 in the paper),
e.g. through the trainer's `aux_loss(params, q, docs)` hook with `method=module.gates`, or in one
pass with `score_all_with_gates`.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bilinear_ir.errors import input_error, require
from bilinear_ir.scorers.multivector import l2_normalize, zero_padding

INPUTS = ("vector", "tokens")
RESIDUALS = ("none", "dot")  # `Mol.residual`: a plain MoL, or one that starts at the dot product


def outer_logits(qc: jnp.ndarray, ic: jnp.ndarray, temperature: float = 1.0) -> jnp.ndarray:
  """The P_q * P_x component logits <f_a(q), g_b(x)> / temperature, index p = a * P_x + b.

  Args:
    qc: (B, P_q, d_P) query components.
    ic: (N, P_x, d_P) item components (every query against every item) or (B, C, P_x, d_P)
      (each query against its own C candidates).

  Returns:
    (B, N, P_q*P_x) or (B, C, P_q*P_x).
  """
  if ic.ndim == 3:
    # One 2-D product [B*P_q, d_P] x [d_P, N*P_x], then a transpose: on XLA:CPU 5x faster than
    # the einsum straight to (B, N, P_q, P_x), with the same values.
    (b, p_q, d), (n, p_x) = qc.shape, ic.shape[:2]
    out = (qc.reshape(b * p_q, d) @ ic.reshape(n * p_x, d).T).reshape(b, p_q, n, p_x)
    out = out.transpose(0, 2, 1, 3)
  else:
    out = jnp.einsum("bad,bcxd->bcax", qc, ic)
  return out.reshape(out.shape[:2] + (-1,)) / temperature


def with_dot_logit(logits: jnp.ndarray, dot: jnp.ndarray) -> jnp.ndarray:
  """The residual MoL's logits: component logits (..., P_q*P_x) and the dot products (...) of the
  raw embeddings -> (..., P_q*P_x + 1), the dot product last."""
  return jnp.concatenate([logits, dot[..., None]], axis=-1)


class ComponentMLP(nn.Module):
  """Two-layer MLP n -> hidden -> num * d_p (SiLU), reshaped to `num` L2-normalised components.

  Attributes:
    hidden: hidden width.
    num: number of components (P_q or P_x).
    d_p: component width.
  """
  hidden: int
  num: int
  d_p: int

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    """x [B, n] -> (B, num, d_P)."""
    h = nn.silu(nn.Dense(self.hidden, name="hidden")(x))
    out = nn.Dense(self.num * self.d_p, name="out")(h)
    return l2_normalize(out.reshape(x.shape[:-1] + (self.num, self.d_p)))


class ParamPooling(nn.Module):
  """The paper's parameterised pooling: `num` learned distributions over token positions.

  The first token's embedding gives pooling logits [max_len, num] (dense layer, zero init = mean
  pooling at step 0); a masked softmax over the T real positions weights the token embeddings into
  `num` pooled vectors, each projected n -> d_p by its own matrix and L2-normalised.

  Attributes:
    num: number of components (P_q or P_x).
    d_p: component width.
    max_len: positions the pooling layer parameterises (inputs may be shorter, never longer).
  """
  num: int
  d_p: int
  max_len: int

  @nn.compact
  def __call__(self, x: jnp.ndarray, mask: jnp.ndarray) -> jnp.ndarray:
    """x [B, T, n], mask [B, T] bool -> (B, num, d_P)."""
    n, t = x.shape[-1], x.shape[-2]
    if t > self.max_len:
      raise input_error(f"{t} token positions exceed max_len={self.max_len}", file="config",
                        field="model.max_len")
    x = zero_padding(x, mask)
    pool = nn.Dense(self.max_len * self.num, kernel_init=nn.initializers.zeros, name="pool")(
        x[:, 0])
    pool = pool.reshape(x.shape[0], self.max_len, self.num)[:, :t]
    pool = jnp.where(mask[..., None], pool, -jnp.inf)
    weights = jax.nn.softmax(pool, axis=1)  # [B, T, num]
    weights = jnp.where(mask[..., None], weights, 0.0)  # an all-padding row pools to 0
    pooled = jnp.einsum("btp,btn->bpn", weights, x)
    proj = self.param("proj", nn.initializers.normal(stddev=n ** -0.5), (self.num, n, self.d_p))
    bias = self.param("bias", nn.initializers.zeros, (self.num, self.d_p))
    return l2_normalize(jnp.einsum("bpn,pnd->bpd", pooled, proj) + bias)


class GatingMLP(nn.Module):
  """pi = softmax(Dense(P)(silu(Dense(hidden)(logits)))): a distribution over the P logits.

  Attributes:
    hidden: hidden width.
    num_logits: P.
  """
  hidden: int
  num_logits: int

  @nn.compact
  def __call__(self, logits: jnp.ndarray) -> jnp.ndarray:
    """logits (..., P) -> gates (..., P), each row summing to 1.

    The leading axes are flattened first: XLA:CPU runs the two small products (K = P, then
    K = hidden) on a 2-D [pairs, P] operand about 3x faster than on (B, N, P), same values.
    """
    flat = logits.reshape(-1, logits.shape[-1])
    h = nn.silu(nn.Dense(self.hidden, name="hidden")(flat))
    gates = jax.nn.softmax(nn.Dense(self.num_logits, name="out")(h), axis=-1)
    return gates.reshape(logits.shape[:-1] + (self.num_logits,))


class Mol(nn.Module):
  """Mixture-of-Logits over frozen embeddings (see the module docstring for the formulas).

  Attributes:
    dim: embedding (token) width n.
    p_q: P_q, query components.
    p_x: P_x, item components.
    d_p: d_P, component width.
    hidden: hidden width of the per-side component MLPs ("vector" inputs).
    gate_hidden: hidden width of the gating MLP.
    temperature: logits are <f_a, g_b> / temperature (gate input and mixed values).
    mi_weight: alpha, the weight of L_MI the trainer adds (paper: 0.001); unused in scoring.
    inputs: "vector" ([B, n], component MLPs) or "tokens" ([B, T, n] + mask, parameterised
      pooling).
    max_len: "tokens": the longest sequence the pooling layer accepts.
    example_len: "tokens": T of `example_inputs`.
    residual: "none" (the paper's MoL) or "dot" ("vector" inputs only): the dot product of the
      raw embeddings is one more logit and the mixture starts on it (module docstring).
  """
  registry_name = "mol"

  dim: int
  p_q: int = 4
  p_x: int = 4
  d_p: int = 64
  hidden: int = 256
  gate_hidden: int = 128
  temperature: float = 1.0
  mi_weight: float = 0.001
  inputs: str = "vector"
  max_len: int = 512
  example_len: int = 8
  residual: str = "none"

  def setup(self):
    for name in ("p_q", "p_x", "d_p", "hidden", "gate_hidden", "max_len", "example_len"):
      value = getattr(self, name)
      require(int(value) == value and value >= 1, f"must be an integer >= 1, got {value!r}",
              field=f"model.{name}")
    require(self.temperature > 0, f"must be > 0, got {self.temperature}", field="model.temperature")
    require(self.mi_weight >= 0, f"must be >= 0, got {self.mi_weight}", field="model.mi_weight")
    require(self.inputs in INPUTS, f"must be one of {INPUTS}, got {self.inputs!r}",
            field="model.inputs")
    require(self.example_len <= self.max_len, f"must be <= max_len={self.max_len}",
            field="model.example_len")
    require(self.residual in RESIDUALS, f"must be one of {RESIDUALS}, got {self.residual!r}",
            field="model.residual")
    require(self.residual == "none" or self.inputs == "vector",
            f"residual {self.residual!r} needs inputs 'vector' (a dot product of single vectors), "
            f"got inputs {self.inputs!r}", field="model.residual")
    if self.residual == "dot":
      self.lam = self.param("lam", nn.initializers.zeros, (1,), jnp.float32)  # [1]: a tensor
    if self.inputs == "vector":
      self.query_net = ComponentMLP(self.hidden, self.p_q, self.d_p)
      self.item_net = ComponentMLP(self.hidden, self.p_x, self.d_p)
    else:
      self.query_net = ParamPooling(self.p_q, self.d_p, self.max_len)
      self.item_net = ParamPooling(self.p_x, self.d_p, self.max_len)
    self.gate_net = GatingMLP(self.gate_hidden, self.num_logits)

  @property
  def num_logits(self) -> int:
    """P = P_q * P_x, + 1 for the dot logit of `residual="dot"`."""
    return self.p_q * self.p_x + (self.residual == "dot")

  def example_inputs(self) -> tuple[jnp.ndarray, ...]:
    """`(q [1, n], d [1, n])`, or `(q [1, T, n], q_mask [1, T], d, d_mask)` for "tokens"."""
    if self.inputs == "vector":
      z = jnp.zeros((1, self.dim), jnp.float32)
      return z, z
    z = jnp.zeros((1, self.example_len, self.dim), jnp.float32)
    m = jnp.ones((1, self.example_len), bool)
    return z, m, z, m

  def _split(self, args: tuple) -> tuple[tuple, tuple]:
    """(q..., docs...) -> ((q...), (docs...)): 1 + 1 arrays for "vector", 2 + 2 for "tokens"."""
    per_side = 1 if self.inputs == "vector" else 2
    if len(args) != 2 * per_side:
      raise TypeError(f"mol with inputs={self.inputs!r} takes {2 * per_side} arrays "
                      f"({'q, docs' if per_side == 1 else 'q, q_mask, docs, d_mask'}), "
                      f"got {len(args)}")
    return args[:per_side], args[per_side:]

  def query_components(self, *q: jnp.ndarray) -> jnp.ndarray:
    """q [B, n] (or q [B, T, n], q_mask [B, T]) -> (B, P_q, d_P), L2-normalised."""
    return self.query_net(*q)

  def item_components(self, *docs: jnp.ndarray) -> jnp.ndarray:
    """docs [N, n] (or docs [N, T, n], d_mask [N, T]) -> (N, P_x, d_P), L2-normalised."""
    return self.item_net(*docs)

  def mix(self, logits: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Gate and mix precomputed logits: (..., P) -> (phi (...), gates (..., P)).

    Residual form: the last logit is the dot product; phi = (1 - lam) l_dot + lam sum pi l.
    """
    if self.residual == "none":
      gates = self.gate_net(logits)
      return jnp.sum(gates * logits, axis=-1), gates
    gates = self.gate_net(logits[..., :-1])  # the gate sees the P_q * P_x component logits
    lam = self.lam[0]
    weights = (lam * gates).at[..., -1].add(1.0 - lam)  # exactly e_dot at lam = 0
    return jnp.sum(weights * logits, axis=-1), gates

  def logits(self, *args: jnp.ndarray) -> jnp.ndarray:
    """All pairs: q [B, n], docs [N, n] -> (B, N, P)."""
    q, docs = self._split(args)
    out = outer_logits(self.query_components(*q), self.item_components(*docs), self.temperature)
    return out if self.residual == "none" else with_dot_logit(out, q[0] @ docs[0].T)

  def gates(self, *args: jnp.ndarray) -> jnp.ndarray:
    """All pairs: q [B, n], docs [N, n] -> (B, N, P), each row summing to 1 (pi)."""
    return self.mix(self.logits(*args))[1]

  def score_all_with_gates(self, *args: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """All pairs: q [B, n], docs [N, n] -> (scores [B, N], gates (B, N, P))."""
    return self.mix(self.logits(*args))

  def score_all(self, *args: jnp.ndarray) -> jnp.ndarray:
    """All pairs: q [B, n], docs [N, n] -> [B, N]."""
    return self.mix(self.logits(*args))[0]

  def score_pairs(self, *args: jnp.ndarray) -> jnp.ndarray:
    """Paired scores: q [B, n], d [B, n] -> [B]."""
    q, d = self._split(args)
    ic = self.item_components(*d)[:, None]  # (B, 1, P_x, d_P): one candidate per query
    logits = outer_logits(self.query_components(*q), ic, self.temperature)[:, 0]
    if self.residual == "dot":
      logits = with_dot_logit(logits, jnp.sum(q[0] * d[0], axis=-1))
    return self.mix(logits)[0]

  def __call__(self, *args: jnp.ndarray) -> jnp.ndarray:
    """Same as `score_pairs`."""
    return self.score_pairs(*args)
