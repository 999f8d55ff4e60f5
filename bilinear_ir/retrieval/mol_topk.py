"""Top-K retrieval with Mixture-of-Logits (Ding & Zhai, WWW 2025, section 3 and appendix B).

MoL scores phi(q, x) = sum_p pi_p(q, x) l_p(q, x) with gates pi summing to 1, so
phi(q, x) <= max_p l_p(q, x): every algorithm here rests on that. Notation: P = P_q * P_x
component logits l_p = <f_a(q), g_b(x)> / temperature, K results, N items.

The residual MoL (`Mol.residual="dot"`) adds the dot product of the raw embeddings as logit P + 1
and mixes (1 - lam) l_dot + lam sum_p pi_p l_p with a learned lam that may leave [0, 1], so its
score is not bounded by its largest logit: only `brute_force` serves it (its index keeps the raw
docs, its source the raw queries); the bound-based algorithms refuse it.

Doc-side tables, precomputed once (`MolIndex`, from `build_index` or `index_from_components`):
  items (N, P_x, d_P): the L2-normalised item components (per-component MIPS, MoL re-scoring);
  avg (N, d_P): sum_b g_b(x) / P, the TopKAvg table; <sum_a f_a(q) / temperature, avg(x)> is the
    mean of the P logits, one inner product per item whatever P is.

Algorithms (each batched over the B queries and jitted, K static):
  brute_force(src, k): MoL on every item (the ground truth).
  exact_two_pass(src, k, max_range): Algorithm 1. G is the union of the per-component top K;
    S_min is the K-th largest MoL score in G (the paper takes the smallest one in G; the K-th
    largest is >= it and the same argument holds: every true top-K item x has
    max_p l_p(x) >= phi(x) >= S_min). The range query {x : max_p l_p(x) >= S_min} runs with a
    static size: one scan keeps the `max_range + 1` items with the largest max_p l_p, and when the
    last of them falls below S_min the first `max_range` hold the whole range; those are
    MoL-scored and the top K returned. When it does not (the range overflows the static bound),
    that query falls back to brute force (`fallback` True): the result is exact either way.
  topk_per_embedding(src, k, n): TopKPerEmbd(N), the union over the P components of the top N by
    l_p, re-scored by MoL.
  topk_avg(src, k, n): TopKAvg(N), the top N by the mean logit (the avg table), re-scored.
  comb_topk(src, k, n1, n2): CombTopK(N1, N2), the union of both candidate sets, re-scored.

Gap bounds (`MolTopK.gap_bound*`, per query): the true gap is how far the K-th retrieved MoL score
S_K falls below the real K-th (more strongly, below any item of the real top K that was missed).
For an item x that was not retrieved, phi(x) <= max_p l_p(x), so the gap is at most S - S_K for
any S >= max_p l_p(x) over non-retrieved x. Reported as max(0, S - S_K); 0 when every item was
retrieved, +inf when fewer than K candidates were.
  gap_bound: Theorem 2 for TopKPerEmbd(N): S = max_p of the (N+1)-th largest l_p (appendix B:
    0.3). Theorem 3 for CombTopK(N1, N2) and TopKAvg(N) (= CombTopK(0, N)): S' = max over p and
    over x outside X_{N1,p} and outside the TopKAvg set of l_p(x). For TopKAvg this needs a scan
    of every item's logits, as costly as TopKPerEmbd's; `tight_bound=False` skips it (+inf).
  gap_bound_retrieved: the looser bound from the retrieved lists only: S = max_p of the N-th (N1-th)
    largest l_p (appendix B: 0.4); for TopKAvg, which retrieves no per-component list, S is the
    largest possible logit (1 / temperature for normalised components).
  brute_force and exact_two_pass report 0.

Ties are deterministic: equal scores rank the lower item index first, everywhere.

Precision: the exact algorithms (`brute_force`, `exact_two_pass`) trace every matmul (component
logits, the gating MLP, the per-component scans) at float32 (`FLOAT32`, i.e.
`jax.default_matmul_precision("highest")` around their bodies), on every backend: JAX's default is
TF32 on recent NVIDIA GPUs and one bf16 pass on TPU, relative errors near 1e-3, which the fixed
1e-4 slack of `exact_two_pass` does not cover (float32 rounding, ~d_P 2^-24, does). The
approximate algorithms run at the backend's default precision; their gap bounds hold for the
scores as computed.

Memory: scans over the items hold (B, chunk, P) logits at a time (plus (B, chunk, gate_hidden)
gate activations where they MoL-score), so 1M items fit; re-scoring gathers (B, chunk, P_x, d_P)
candidate components at a time (on CPU at most CPU_RESCORE_CHUNK candidates: a smaller step that
stays in the caches is 2-3x faster there, `default_chunk`) and keeps the C candidates' MoL scores
in one [B, C] array for a single top-K; TopKAvg scores all items in one
[B, N] array, and its tight bound marks the TopKAvg set in a [B, N] bool mask.

The dot-product retrieval steps: the per-component top N is one MIPS per item component over the
table g_b (N, d_P), by the repo's exact chunked scan `retrieval.exact.scan_topk` (any MIPS index
could serve it); TopKAvg's top N is one [B, N] matmul and a top-N selection, `avg_top_n`, with
`lax.top_k`'s ids whatever the device: on CPU `pruned_top_n` (block maxima, then a `lax.top_k`
over the scores above the n-th best block's maximum), on GPUs the scan's block selection
(`exact.block_top_k`), where a large-N `lax.top_k` sorts (`avg_method`).

Lower level: the algorithms take a *source* of component logits and gates, `MolSource` (a `Mol`
scorer, its params, query components and a `MolIndex`) or `DenseSource` (explicit logits and
gates (B, N, P), for worked examples such as appendix B and for tests). A source provides
`logits(start, size)`, `avg_scores(start, size)`, `logits_at(ids)`, `phi(logits, ids)` and
`component_topk(k)`.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from bilinear_ir.errors import require
from bilinear_ir.retrieval import exact, pallas_topk
from bilinear_ir.scorers.mol import outer_logits, with_dot_logit

DEFAULT_CHUNK = 4096  # items (candidates) per step of the approximate algorithms' scans
ACCEL_CHUNK = 65536  # brute force's items per step on accelerators (`default_chunk`)
CPU_CHUNK = 256  # brute force's items per step on CPU (`default_chunk`)
AVG_BLOCK = 16  # GPUs: items per block of TopKAvg's block selection "blocks" (`avg_plan`)
PRUNE_MIN_BLOCK = 8  # CPU: smaller blocks make "pruned" slower than `lax.top_k` (`avg_plan`)
CPU_RESCORE_CHUNK = 128  # at most this many candidates per MoL rescoring step on CPU
FLOAT32 = "highest"  # `jax.default_matmul_precision` of the exact algorithms (module docstring)


def default_chunk(platform: str | None = None) -> int:
  """Brute force's items per step: CPU_CHUNK on CPU, ACCEL_CHUNK on accelerators.

  On CPU a step's (B, chunk, gate_hidden) gate activations and (B, chunk, P_x, d_P) gathered
  candidates should stay in the caches: on a 2-core CPU (loaded), 100,000 synthetic items
  (`benchmarks/mol_topk.py`), P_q = P_x = 4, d_P 64, 32 queries, brute force took 1,150 / 1,288 /
  1,307 / 1,394 / about 3,000 ms at chunks 128 / 256 / 512 / 1,024 / 4,096 (same ids), and the
  TopKAvg(4,000) rescoring 80 / 93 / 104 / 127 / 232 ms at 128 / 256 / 512 / 1,024 / 4,096
  candidates per step (hence CPU_RESCORE_CHUNK). Accelerators take large steps: on one H200
  (`benchmarks/gpu_sweep.py`, 1M items, 32 queries, P = 4) brute force took 41.0 ms at 4,096
  items per step and 31.6 ms at 65,536, its best.

  Args:
    platform: "cpu", "gpu", "tpu" (None: jax's default backend).
  """
  return CPU_CHUNK if (platform or jax.default_backend()) == "cpu" else ACCEL_CHUNK


def _top_k(x: jnp.ndarray, k: int) -> tuple[jnp.ndarray, jnp.ndarray]:
  """`lax.top_k(x, k)` behind an optimisation barrier: x [..., M] -> ([..., k], [..., k]).

  XLA:CPU runs a `lax.top_k` as a partial sort only where every use of its outputs is the whole
  [:, :k] slice; a later use of one column (the k-th value) folded into it turns it into a sort
  of the whole row (several times slower at M in the thousands). The barrier keeps uses apart.
  """
  return jax.lax.optimization_barrier(jax.lax.top_k(x, k))


AVG_METHODS = ("top_k", "blocks", "pruned")  # TopKAvg's XLA top-N selections (`avg_top_n`)


def avg_method(platform: str | None = None) -> str:
  """TopKAvg's XLA top-N selection per device: "pruned" on CPU, "blocks" on GPUs, "top_k" on TPU.

  "top_k" is one `lax.top_k`; "blocks" `exact.block_top_k` (a `lax.top_k` over the block maxima,
  then one over the scores of the n best blocks); "pruned" `pruned_top_n` (the same two steps,
  the second over the scores above the n-th best block's maximum only). The same ids, all three.
  On GPUs `lax.top_k` of a large N sorts the row: on one H200 it was 7.68 of TopKAvg(4,000)'s
  8.15 ms over 1M items (`benchmarks/gpu_sweep.py`); there (`avg_selection_rows`; 1M items, 32
  queries, N = 2,000 / 4,000 / 8,000) `lax.top_k` took 7.54 / 7.53 / 7.71 ms, blocks of 8: 1.48
  / 1.51 / 2.14, of 16: 1.02 / 1.21 / 2.04, of 32: 0.99 / 1.70 / - ms. On XLA:CPU `lax.top_k` is
  a partial sort: on a loaded 2-core CPU, N = 4,000 over the mean logits of 1M synthetic items
  (`benchmarks/mol_topk.py`), 32 queries, `lax.top_k` took 287 ms, "pruned" 215 / 180 / 168 ms
  at blocks of 8 / 16 / 32 (same ids; `exact.block_top_k` about as long as `lax.top_k`). TPU is
  not measured.

  Args:
    platform: "cpu", "gpu", "tpu" (None: jax's default backend).
  """
  return {"cpu": "pruned", "gpu": "blocks"}.get(platform or jax.default_backend(), "top_k")


def pruned_top_n(scores: jnp.ndarray, n: int, block: int) -> tuple[jnp.ndarray, jnp.ndarray]:
  """`lax.top_k(scores, n)` by block maxima, the second `lax.top_k` over pruned scores.

  1. The block maxima m [B, ceil(N / block)] (one vectorised reduction over the row).
  2. The n best blocks, `lax.top_k(m, n)`; t_b, the n-th best block's maximum, bounds the n-th
     largest score from below (the n blocks each hold a score >= t_b).
  3. The scores of those blocks [B, n * block], in item order, those below t_b set to -inf, and
     one `lax.top_k`. Every one of the n best scores is >= t_b and lies in a chosen block: a
     block left out has maximum <= t_b and, if equal, a higher index than every chosen block of
     maximum t_b, so its scores equal to t_b come after at least n - (scores above t_b) equal
     ones in chosen blocks. Hence the result is `lax.top_k(scores, n)`, ties to the lower index.
  `exact.block_top_k` takes the same two steps without the pruning. XLA:CPU's `lax.top_k` is a
  partial sort (a heap of the n best): every entry costs a comparison and every entry that beats
  the heap's worst an insertion. Here the row meets only the vectorised maximum, the first heap
  sees N / block maxima and the second about n scores above t_b.

  Args:
    scores: [B, N] float32, finite.
    n: results per row, n * block <= N.
    block: items per block.

  Returns:
    (values [B, n], ids [B, n] int32): those of `lax.top_k(scores, n)`.
  """
  b, num = scores.shape
  full = num // block
  m = scores[:, :full * block].reshape(b, full, block).max(-1)
  if num % block:
    m = jnp.concatenate([m, scores[:, full * block:].max(-1, keepdims=True)], axis=1)
  best, blocks = _top_k(m, n)
  blocks = jnp.sort(blocks, axis=1)  # item order: lax.top_k's ties go to the lower index
  ids = (blocks[:, :, None] * block + jnp.arange(block, dtype=jnp.int32)).reshape(b, n * block)
  vals = jnp.take_along_axis(scores, jnp.minimum(ids, num - 1), axis=1)
  keep = (vals >= best[:, n - 1:]) & (ids < num)
  top, pos = _top_k(jnp.where(keep, vals, -jnp.inf), n)
  return top, jnp.take_along_axis(ids, pos, axis=1)


SELECTION_STRATEGIES = ("xla", "pallas")  # TopKAvg's top-N selection (`avg_top_n`)


def avg_plan(n: int, num: int, block: int | None = None, method: str | None = None
             ) -> tuple[str, int]:
  """(method, block) that `avg_top_n` runs for the top n of num scores per row.

  `method` None: `avg_method()`. `block` None: AVG_BLOCK for "blocks", the largest
  `exact.default_block` allows for "pruned"; either is capped by `exact.default_block` (the n best
  blocks at most a quarter of the row). "pruned" with a block under PRUNE_MIN_BLOCK, and any
  block of 1, is ("top_k", 1): on the loaded 2-core CPU, 32 rows of 100,000 / 200,000 mean logits,
  `lax.top_k` took 71 / 159 ms for n = 4,000 / 8,000 at 100,000 and "pruned" 77 / 153 at blocks
  of 4 / 2, and 91 / 159 against 81 / 163 ms at 200,000 (blocks 8 / 4), while from blocks of 8
  up it is faster (n = 100 to 2,000: 10-70% less).
  """
  method = avg_method() if method is None else method
  require(method in AVG_METHODS, f"must be one of {AVG_METHODS}, got {method!r}", field="method")
  allowed = exact.default_block(n, num)
  if block is None:
    block = allowed if method == "pruned" else AVG_BLOCK
  block = min(block, allowed)
  if method == "top_k" or block == 1 or (method == "pruned" and block < PRUNE_MIN_BLOCK):
    return "top_k", 1
  return method, block


def avg_top_n(scores: jnp.ndarray, n: int, block: int | None = None,
              strategy: str = "xla", method: str | None = None) -> jnp.ndarray:
  """TopKAvg's candidate set: ids [B, n] of the n best mean logits, as `lax.top_k` ranks them.

  Args:
    scores: [B, N] mean logits (finite).
    n: N of TopKAvg (n <= N).
    block: items per block of "blocks" and "pruned" (`avg_plan`).
    strategy: "xla" (`method`) or "pallas" (`pallas_topk.select_top_n`: a Pallas kernel finds
      each row's n-th value, then the kept entries are sorted; `block`, `method` do not apply).
    method: "top_k", "blocks" or "pruned" (`avg_method`; None: `avg_method()`); `avg_plan`
      says which one runs at which block.
    The same ids, whichever strategy and method.
  """
  require(strategy in SELECTION_STRATEGIES,
          f"must be one of {SELECTION_STRATEGIES}, got {strategy!r}", field="strategy")
  if strategy == "pallas":
    return pallas_topk.select_top_n(scores, n)[1]
  method, block = avg_plan(n, scores.shape[1], block, method)
  if method == "top_k":
    return jax.lax.top_k(scores, n)[1]
  if method == "pruned":
    return pruned_top_n(scores, n, block)[1]
  return exact.block_top_k(scores, n, block).ids


def _rescore_step(chunk: int) -> int:
  """Candidates per rescoring step: `chunk`, at most CPU_RESCORE_CHUNK on CPU."""
  return min(chunk, CPU_RESCORE_CHUNK) if jax.default_backend() == "cpu" else chunk


@flax.struct.dataclass
class MolIndex:
  """Doc-side MoL tables.

  Attributes:
    items: (N, P_x, d_P) L2-normalised item components g_b(x).
    avg: (N, d_P) the TopKAvg table sum_b g_b(x) / P, P = P_q * P_x.
    docs: [N, n] the raw doc embeddings (the dot logit of a residual MoL), else None.
  """
  items: jnp.ndarray
  avg: jnp.ndarray
  docs: jnp.ndarray | None = None


def index_from_components(items: jnp.ndarray, p_q: int,
                          docs: jnp.ndarray | None = None) -> MolIndex:
  """Builds the tables from item components (N, P_x, d_P), the query component count P_q and,
  for a residual MoL, the raw doc embeddings docs [N, n]."""
  items = jnp.asarray(items, jnp.float32)
  docs = None if docs is None else jnp.asarray(docs, jnp.float32)
  return MolIndex(items=items, avg=jnp.sum(items, axis=1) / (p_q * items.shape[1]), docs=docs)


@functools.partial(jax.jit, static_argnames=("mol",))
def _item_components(params: Any, *docs: jnp.ndarray, mol: nn.Module) -> jnp.ndarray:
  """docs [C, n] (or [C, T, n], [C, T]) -> (C, P_x, d_P); compiled once per module and shape."""
  return mol.apply({"params": params}, *docs, method=mol.item_components)


def build_index(mol: nn.Module, params: Any, *docs: np.ndarray | jnp.ndarray,
                chunk: int = DEFAULT_CHUNK) -> MolIndex:
  """Item components of every doc, computed `chunk` docs at a time, and the TopKAvg table.

  Args:
    mol: a `Mol` scorer.
    params: its params.
    *docs: docs [N, n] (or docs [N, T, n], d_mask [N, T] for `inputs="tokens"`).
    chunk: docs per call.

  Returns:
    The `MolIndex` (N, P_x, d_P) + (N, d_P) (+ the raw docs [N, n] for a residual MoL).
  """
  n = docs[0].shape[0]
  parts = [_item_components(params, *(x[i:i + chunk] for x in docs), mol=mol)
           for i in range(0, n, chunk)]
  return index_from_components(jnp.concatenate(parts, axis=0), mol.p_q,
                               docs[0] if mol.residual == "dot" else None)


@flax.struct.dataclass
class MolSource:
  """A `Mol` scorer over a `MolIndex` for a batch of queries.

  Attributes:
    qc: (B, P_q, d_P) query components (`mol.query_components`).
    index: the doc-side tables.
    params: the scorer's params (only the gate's, and a residual MoL's lam, are used here).
    mol: the `Mol` module (static).
    q: [B, n] the raw queries (the dot logit of a residual MoL), else None.
  """
  qc: jnp.ndarray
  index: MolIndex
  params: Any
  mol: nn.Module = flax.struct.field(pytree_node=False)
  q: jnp.ndarray | None = None

  @property
  def num_items(self) -> int:
    """N."""
    return self.index.items.shape[0]

  @property
  def logit_max(self) -> float:
    """The largest value a logit can take (normalised components): 1 / temperature."""
    return 1.0 / self.mol.temperature

  def _raw(self) -> tuple[jnp.ndarray, jnp.ndarray] | None:
    """(q [B, n], docs [N, n]) of a residual MoL, None for the plain one."""
    if self.mol.residual == "none":
      return None
    require(self.q is not None and self.index.docs is not None, "a residual MoL's source needs "
            "the raw queries (MolSource q=...) and an index of the raw docs (build_index)",
            field="model.residual")
    return self.q, self.index.docs

  def logits(self, start: jnp.ndarray | int, size: int) -> jnp.ndarray:
    """Logits of items [start, start + size): (B, size, P)."""
    ic = jax.lax.dynamic_slice_in_dim(self.index.items, start, size, axis=0)
    out = outer_logits(self.qc, ic, self.mol.temperature)
    if (raw := self._raw()) is None:
      return out
    return with_dot_logit(out, raw[0] @ jax.lax.dynamic_slice_in_dim(raw[1], start, size).T)

  def avg_scores(self, start: jnp.ndarray | int, size: int) -> jnp.ndarray:
    """Mean logit of items [start, start + size) from the avg table: [B, size]."""
    avg = jax.lax.dynamic_slice_in_dim(self.index.avg, start, size, axis=0)
    return (jnp.sum(self.qc, axis=1) / self.mol.temperature) @ avg.T

  def logits_at(self, ids: jnp.ndarray) -> jnp.ndarray:
    """Logits of each query's own candidates, ids [B, C] in [0, N): (B, C, P)."""
    out = outer_logits(self.qc, self.index.items[ids], self.mol.temperature)
    if (raw := self._raw()) is None:
      return out
    return with_dot_logit(out, jnp.einsum("bn,bcn->bc", raw[0], raw[1][ids]))

  def component_topk(self, k: int) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Top k items of every component logit: (vals (B, P, k), ids (B, P, k)), -inf / -1 padded.

    Per item component b, one MIPS of all the query components f_a(q) / temperature against the
    table g_b(x) (N, d_P), by the repo's exact chunked scan (`retrieval.exact.scan_topk`).
    """
    batch, p_q, d_p = self.qc.shape
    qt = (self.qc / self.mol.temperature).reshape(batch * p_q, d_p)
    outs = [exact.scan_topk(qt, self.index.items[:, b], k)
            for b in range(self.index.items.shape[1])]

    def stack(parts):  # P_x lists of (B * P_q, k) -> (B, P_q * P_x, k), index p = a * P_x + b
      return jnp.stack([x.reshape(batch, p_q, k) for x in parts], axis=2).reshape(batch, -1, k)

    vals, ids = stack([o.scores for o in outs]), stack([o.ids for o in outs])
    return vals, jnp.where(ids == exact.NO_DOC, -1, ids)

  def phi(self, logits: jnp.ndarray, ids: jnp.ndarray) -> jnp.ndarray:
    """MoL scores from logits (B, C, P) of items ids [B, C] (or [C], unused here): [B, C]."""
    del ids
    return self.mol.apply({"params": self.params}, logits, method=self.mol.mix)[0]


@flax.struct.dataclass
class DenseSource:
  """Explicit component logits and gates for every (query, item) pair (small examples, tests).

  Attributes:
    all_logits: (B, N, P) component logits l_p(q, x).
    gates: (B, N, P) gating weights pi_p(q, x), each row summing to 1 (the bounds and the exact
      algorithm need that).
  """
  all_logits: jnp.ndarray
  gates: jnp.ndarray

  @property
  def num_items(self) -> int:
    """N."""
    return self.all_logits.shape[1]

  @property
  def logit_max(self) -> jnp.ndarray:
    """The largest logit (a bound TopKAvg's looser gap bound may use)."""
    return jnp.max(self.all_logits)

  def logits(self, start: jnp.ndarray | int, size: int) -> jnp.ndarray:
    """Logits of items [start, start + size): (B, size, P)."""
    return jax.lax.dynamic_slice_in_dim(self.all_logits, start, size, axis=1)

  def avg_scores(self, start: jnp.ndarray | int, size: int) -> jnp.ndarray:
    """Mean logit of items [start, start + size): [B, size]."""
    return jnp.mean(self.logits(start, size), axis=-1)

  def logits_at(self, ids: jnp.ndarray) -> jnp.ndarray:
    """ids [B, C] -> (B, C, P)."""
    return jnp.take_along_axis(self.all_logits, ids[..., None], axis=1)

  def component_topk(self, k: int) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Top k items of every component logit: (vals (B, P, k), ids (B, P, k)), -inf / -1 padded."""
    vals = jnp.swapaxes(self.all_logits, 1, 2)
    pad = max(0, k - vals.shape[-1])
    vals = jnp.pad(vals, ((0, 0), (0, 0), (0, pad)), constant_values=-jnp.inf)
    top, ids = jax.lax.top_k(vals, k)
    return top, jnp.where(top == -jnp.inf, -1, ids)

  def phi(self, logits: jnp.ndarray, ids: jnp.ndarray) -> jnp.ndarray:
    """sum_p gates * logits for logits (B, C, P) of items ids [B, C] (or [C]): [B, C]."""
    ids = jnp.broadcast_to(ids, logits.shape[:2])
    return jnp.sum(jnp.take_along_axis(self.gates, ids[..., None], axis=1) * logits, axis=-1)


Source = MolSource | DenseSource


class MolTopK(NamedTuple):
  """Top-K results for a batch of B queries.

  Attributes:
    ids: [B, K] int32 item ids, best first (ties: lower id first); -1 where fewer than K
      candidates were found.
    scores: [B, K] their MoL scores (-inf where ids is -1).
    gap_bound: [B] the Theorem 2/3 bound on the gap (module docstring); +inf if not computed.
    gap_bound_retrieved: [B] the looser bound from the retrieved lists only.
    fallback: [B] bool, True where exact_two_pass's range overflowed and brute force answered.
  """
  ids: jnp.ndarray
  scores: jnp.ndarray
  gap_bound: jnp.ndarray
  gap_bound_retrieved: jnp.ndarray
  fallback: jnp.ndarray


def _scan_ranges(total: int, chunk: int, body: Callable[[Any, Any, int], Any], carry: Any) -> Any:
  """carry = body(carry, start, size) over [0, total) in ranges of `chunk` (the last shorter)."""
  n_full, tail = divmod(total, chunk)
  if n_full:
    carry = jax.lax.fori_loop(0, n_full, lambda i, c: body(c, i * chunk, chunk), carry)
  if tail:
    carry = body(carry, n_full * chunk, tail)
  return carry


def _merge_topk(vals: jnp.ndarray, ids: jnp.ndarray, new_vals: jnp.ndarray, new_ids: jnp.ndarray,
                k: int) -> tuple[jnp.ndarray, jnp.ndarray]:
  """Top k of two lists along the last axis: [..., k] + [..., c] -> [..., k].

  `vals` goes first, so on equal values its entries (the earlier, lower ids) win; `lax.top_k`
  ranks equal values by position.
  """
  if new_vals.shape[-1] > k:
    new_vals, pos = jax.lax.top_k(new_vals, k)
    new_ids = jnp.take_along_axis(new_ids, pos, axis=-1)
  top, pos = jax.lax.top_k(jnp.concatenate([vals, new_vals], axis=-1), k)
  return top, jnp.take_along_axis(jnp.concatenate([ids, new_ids], axis=-1), pos, axis=-1)


def _running_topk(total: int, chunk: int, chunk_fn: Callable[[Any, int], dict[str, jnp.ndarray]],
                  ks: dict[str, int]) -> dict[str, tuple[jnp.ndarray, jnp.ndarray]]:
  """Top-k item ids of several per-item quantities in one scan over the items.

  Args:
    total: N.
    chunk: items per step.
    chunk_fn: (start, size) -> {name: values [..., size]} for items [start, start + size).
    ks: {name: k}.

  Returns:
    {name: (values [..., k], ids [..., k] int32)}, -inf / -1 padded when N < k.
  """
  size0 = min(chunk, total)
  shapes = jax.eval_shape(lambda s: chunk_fn(s, size0), jnp.int32(0))
  init = {name: (jnp.full(shapes[name].shape[:-1] + (k,), -jnp.inf, shapes[name].dtype),
                 jnp.full(shapes[name].shape[:-1] + (k,), -1, jnp.int32))
          for name, k in ks.items()}

  def body(carry, start, size):
    vals = chunk_fn(start, size)
    ids = start + jnp.arange(size, dtype=jnp.int32)
    return {name: _merge_topk(*carry[name], vals[name],
                              jnp.broadcast_to(ids, vals[name].shape), ks[name])
            for name in carry}

  return _scan_ranges(total, chunk, body, init)


def _rescore(src: Source, cand: jnp.ndarray, k: int, chunk: int
             ) -> tuple[jnp.ndarray, jnp.ndarray]:
  """MoL top-k among candidate ids [B, C] (-1 = none, duplicates allowed), `chunk` candidates
  per step (at most CPU_RESCORE_CHUNK on CPU: `default_chunk`).

  The steps write the candidates' MoL scores into one [B, C] array, then one `lax.top_k` over
  it (in ascending id order: ties to the lower id), not a merge per step.

  Returns:
    (scores [B, k], ids [B, k]), padded with -inf / -1 when fewer than k distinct candidates.
  """
  cand = jnp.sort(cand, axis=-1)  # duplicates adjacent; ascending ids make ties go to lower ids
  first = jnp.concatenate([jnp.ones_like(cand[:, :1], bool), cand[:, 1:] != cand[:, :-1]], axis=1)
  valid = (cand >= 0) & first
  safe = jnp.maximum(cand, 0)

  def body(phi, start, size):
    ids = jax.lax.dynamic_slice_in_dim(safe, start, size, axis=1)
    return jax.lax.dynamic_update_slice_in_dim(phi, src.phi(src.logits_at(ids), ids), start,
                                               axis=1)

  batch, num = cand.shape
  phi = _scan_ranges(num, _rescore_step(chunk), body, jnp.zeros((batch, num), jnp.float32))
  phi = jnp.pad(jnp.where(valid, phi, -jnp.inf), ((0, 0), (0, max(0, k - num))),
                constant_values=-jnp.inf)  # fewer than k candidates: -inf / -1 slots
  # A plain top-k: behind `_top_k`'s barrier, inside exact_two_pass's cond, XLA:CPU's
  # TopkDecomposer aborted the process (tests/jobs/test_mol_job.py end to end).
  top, pos = jax.lax.top_k(phi, k)
  ids = jnp.take_along_axis(safe, jnp.minimum(pos, num - 1), axis=1)
  return top, jnp.where(top == -jnp.inf, -1, ids)


def _gap(s: jnp.ndarray, s_k: jnp.ndarray) -> jnp.ndarray:
  """max(0, s - s_k) per query: 0 where nothing was left out (s = -inf), +inf if s_k = -inf."""
  return jnp.where(s == -jnp.inf, 0.0,
                   jnp.where(s_k == -jnp.inf, jnp.inf, jnp.maximum(s - s_k, 0.0)))


def _check(k: int, *sizes: int) -> None:
  """InputError unless K >= 1 and every candidate count is >= 0."""
  require(k >= 1, f"must be >= 1, got {k}", field="k")
  for n in sizes:
    require(n >= 0, f"candidate counts must be >= 0, got {n}", field="n")


@functools.partial(jax.jit, static_argnames=("k", "chunk"))
def brute_force(src: Source, k: int, chunk: int | None = None) -> MolTopK:
  """Exact top-k by MoL over every item, `chunk` items at a time.

  Args:
    src: a `MolSource` or `DenseSource` with B queries and N items.
    k: K.
    chunk: items per step (memory: (B, chunk, P) logits + (B, chunk, gate_hidden) activations;
      None: `default_chunk()`, per device).

  Returns:
    `MolTopK` with ids/scores [B, K]; gap bounds 0.
  """
  _check(k)
  chunk = default_chunk() if chunk is None else chunk

  def chunk_fn(start, size):
    return {"phi": src.phi(src.logits(start, size), start + jnp.arange(size))}

  with jax.default_matmul_precision(FLOAT32):  # the ground truth: float32 on every backend
    scores, ids = _running_topk(src.num_items, chunk, chunk_fn, {"phi": k})["phi"]
  zero = jnp.zeros(ids.shape[:1], jnp.float32)
  return MolTopK(ids, scores, zero, zero, jnp.zeros(ids.shape[:1], bool))


@functools.partial(jax.jit, static_argnames=("k", "max_range", "chunk"))
def exact_two_pass(src: Source, k: int, max_range: int = 4096,
                   chunk: int = DEFAULT_CHUNK) -> MolTopK:
  """Exact top-k by Algorithm 1 with a static bound on the range-retrieval size.

  Args:
    src: a `MolSource` or `DenseSource` (gates summing to 1).
    k: K.
    max_range: the most items the range query may return; a query whose range holds more falls
      back to brute force (`fallback` True; with one such query the whole batch pays a brute-force
      pass, as `lax.cond` runs once for the batch).
    chunk: items per step.

  Returns:
    `MolTopK` equal to `brute_force` up to floating-point ties; gap bounds 0.
  """
  _check(k)
  require(max_range >= 1, f"must be >= 1, got {max_range}", field="max_range")
  with jax.default_matmul_precision(FLOAT32):  # the slack below assumes float32 logits
    return _exact_two_pass(src, k, max_range, chunk)


def _require_bounded(src: Source) -> None:
  """InputError for a residual MoL, whose score may exceed its largest logit (module docstring):
  the algorithms that rest on phi <= max_p l_p do not apply to it."""
  if isinstance(src, MolSource):
    require(src.mol.residual == "none", f"the residual MoL (residual {src.mol.residual!r}) "
            "mixes with an unconstrained weight, so its score is not bounded by its largest "
            "logit; only brute_force retrieves with it exactly", field="model.residual")


def _exact_two_pass(src: Source, k: int, max_range: int, chunk: int) -> MolTopK:
  """The body of `exact_two_pass` (traced under float32 matmul precision)."""
  _require_bounded(src)
  num_p = src.logits(0, 1).shape[-1]

  comp_ids = src.component_topk(k)[1]
  g_scores, _ = _rescore(src, comp_ids.reshape(comp_ids.shape[0], num_p * k), k, chunk)
  s_min = g_scores[:, k - 1]
  # phi <= max_p l_p holds exactly; the slack covers float32 rounding between the two
  # computations (~P d_P 2^-24 relative; not TF32 / bf16, hence FLOAT32).
  threshold = s_min - 1e-4 * (1.0 + jnp.abs(s_min))
  m_vals, m_ids = _running_topk(
      src.num_items, chunk, lambda s, z: {"max": jnp.max(src.logits(s, z), axis=-1)},
      {"max": max_range + 1})["max"]
  overflow = ~(m_vals[:, max_range] < threshold)
  scores, ids = _rescore(src, m_ids[:, :max_range], k, chunk)

  def brute(_):
    bf = brute_force(src, k, chunk)
    return bf.ids, bf.scores

  bf_ids, bf_scores = jax.lax.cond(jnp.any(overflow), brute, lambda _: (ids, scores), None)
  ids = jnp.where(overflow[:, None], bf_ids, ids)
  scores = jnp.where(overflow[:, None], bf_scores, scores)
  zero = jnp.zeros(ids.shape[:1], jnp.float32)
  return MolTopK(ids, scores, zero, zero, overflow)


def _approx(src: Source, k: int, n1: int, n2: int, tight: bool, chunk: int,
            selection: str = "xla", method: str | None = None) -> MolTopK:
  """CombTopK(n1, n2) with its gap bounds; n2 = 0 is TopKPerEmbd(n1), n1 = 0 is TopKAvg(n2);
  `selection`, `method`: the strategy and XLA method of the top-n2 selection (`avg_top_n`)."""
  _require_bounded(src)
  num_items = src.num_items
  batch = src.logits(0, 1).shape[0]
  num_p = src.logits(0, 1).shape[-1]
  n1, n2 = min(n1, num_items), min(n2, num_items)
  cand = []
  excluded = None
  if n2:
    avg_ids = avg_top_n(src.avg_scores(0, num_items), n2,  # one [B, N] matmul + top-N
                        strategy=selection, method=method)
    cand.append(avg_ids)
    if tight:
      rows = jnp.arange(batch)[:, None]
      excluded = jnp.zeros((batch, num_items), bool).at[rows, avg_ids].set(True)

  if n1:  # X_{n1,p}, with the (n1+1)-th entry for Theorem 2 when there is no avg set
    comp_vals, comp_ids = src.component_topk(n1 if n2 else n1 + 1)
    cand.append(comp_ids[:, :, :n1].reshape(batch, num_p * n1))
  scores, ids = _rescore(src, jnp.concatenate(cand, axis=1), k, chunk)
  s_k = scores[:, k - 1]

  everything = max(n1, n2) >= num_items  # every item is a candidate: the result is exact
  if n1:
    s_ret = jnp.max(comp_vals[:, :, n1 - 1], axis=-1)
  else:
    s_ret = jnp.full((batch,), src.logit_max, jnp.float32)
  if everything:
    s_ret = jnp.full((batch,), -jnp.inf, jnp.float32)
  if not tight:
    s_tight = jnp.full((batch,), jnp.inf, jnp.float32)
  elif not n2:
    s_tight = jnp.max(comp_vals[:, :, n1], axis=-1)  # Theorem 2: the (N+1)-th of each component
  else:
    def chunk_fn(start, size):  # (B, P, size) logits, -inf for the items of the avg set
      logits = jnp.swapaxes(src.logits(start, size), 1, 2)
      ex = jax.lax.dynamic_slice_in_dim(excluded, start, size, axis=1)
      return {"free": jnp.where(ex[:, None, :], -jnp.inf, logits)}

    free_vals = _running_topk(num_items, chunk, chunk_fn, {"free": n1 + 1})["free"][0]
    if n1:
      in_avg = jnp.take_along_axis(excluded, jnp.maximum(comp_ids, 0).reshape(batch, -1), axis=1)
      own = ((comp_ids >= 0) & ~in_avg.reshape(comp_ids.shape)).sum(-1)  # |X_{n1,p} \ X'|
    else:
      own = jnp.zeros((batch, num_p), jnp.int32)
    s_tight = jnp.max(jnp.take_along_axis(free_vals, own[..., None], axis=-1)[..., 0], axis=-1)
  gap = _gap(s_tight, s_k) if tight else s_tight
  return MolTopK(ids, scores, gap, _gap(s_ret, s_k), jnp.zeros((batch,), bool))


@functools.partial(jax.jit, static_argnames=("k", "n", "chunk"))
def topk_per_embedding(src: Source, k: int, n: int, chunk: int = DEFAULT_CHUNK) -> MolTopK:
  """TopKPerEmbd(N): union of the per-component top N by l_p, re-scored by MoL.

  Args:
    src: a `MolSource` or `DenseSource` (B queries, N items, P components).
    k: K (the union holds at most P * n items; n * P >= K is needed for K results).
    n: N, candidates per component.
    chunk: items per step.

  Returns:
    `MolTopK`; gap_bound is Theorem 2's S - S_K, gap_bound_retrieved uses the N-th values.
  """
  _check(k, n)
  require(n >= 1, f"must be >= 1, got {n}", field="n")
  return _approx(src, k, n, 0, True, chunk)


@functools.partial(jax.jit, static_argnames=("k", "n", "tight_bound", "chunk", "selection",
                                             "method"))
def topk_avg(src: Source, k: int, n: int, tight_bound: bool = True,
             chunk: int = DEFAULT_CHUNK, selection: str = "xla",
             method: str | None = None) -> MolTopK:
  """TopKAvg(N): the top N by the mean logit (one inner product per item), re-scored by MoL.

  Args:
    src: a `MolSource` or `DenseSource`.
    k: K (needs n >= K).
    n: N.
    tight_bound: compute Theorem 3's bound (a scan of every item's P logits, which costs more than
      TopKAvg itself); False reports +inf.
    chunk: items per step.
    selection: the top-N selection's strategy, "xla" or "pallas" (`avg_top_n`; the same ids).
    method: the XLA selection, "top_k", "blocks" or "pruned" (None: `avg_method()`; the same
      ids).

  Returns:
    `MolTopK`; gap_bound_retrieved uses the largest possible logit (1 / temperature).
  """
  _check(k, n)
  require(n >= 1, f"must be >= 1, got {n}", field="n")
  return _approx(src, k, 0, n, tight_bound, chunk, selection, method)


@functools.partial(jax.jit, static_argnames=("k", "n1", "n2", "tight_bound", "chunk",
                                             "selection", "method"))
def comb_topk(src: Source, k: int, n1: int, n2: int, tight_bound: bool = True,
              chunk: int = DEFAULT_CHUNK, selection: str = "xla",
              method: str | None = None) -> MolTopK:
  """CombTopK(N1, N2): union of TopKPerEmbd(N1) and TopKAvg(N2) candidates, re-scored by MoL.

  Args:
    src: a `MolSource` or `DenseSource`.
    k: K (needs n1 * P + n2 >= K).
    n1: N1, candidates per component.
    n2: N2, candidates by mean logit.
    tight_bound: compute Theorem 3's S' (one more top-(N1+1) per component, of the logits of the
      items outside the TopKAvg set); False reports +inf.
    chunk: items per step.
    selection: the top-N2 selection's strategy, "xla" or "pallas" (`avg_top_n`; the same ids).
    method: the XLA selection, as `topk_avg`'s.

  Returns:
    `MolTopK`; gap_bound_retrieved uses the N1-th value of each component.
  """
  _check(k, n1, n2)
  require(n1 >= 1 and n2 >= 1, f"needs n1, n2 >= 1, got {n1}, {n2}", field="n")
  return _approx(src, k, n1, n2, tight_bound, chunk, selection, method)
