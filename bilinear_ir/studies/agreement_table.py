"""The rows of the Structured Agreement Ranking Task's table (paper 000, section 4).

A `Table` holds one run's shared state: the `num_test` random (q, I0) test instances, every
(q, I0) instance, one training pool whose prefixes every trained model sees, keys derived by
name (so a row's draws do not depend on which other rows run), the rows and the score samples
of the figure. `constructed` adds the models handed each I0, `universal` trains one model across
all I0, `fixed` one model per fixed I0 (vmapped over the pairs).
"""
from __future__ import annotations

import dataclasses
import functools
import zlib
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bilinear_ir import scorers
from bilinear_ir.synthetic import task
from bilinear_ir.synthetic import training

RUN_FIELDS = ("wdp_runs", "public_runs", "fixed_runs", "bilinear_runs", "bilinear_fixed_runs")
FIGURE_ROWS = ("bilinear_rank2_constructed", "wdp_closed_form", "wdp_trained",
               "wdp_public_protocol", "lowrank_r2_trained", "bilinear_full_trained")


def key_for(root: jax.Array, name: str) -> jax.Array:
  """A key for `name`, independent of which other rows run."""
  return jax.random.fold_in(root, zlib.crc32(name.encode()) & 0x7FFFFFFF)


def size_name(num: int) -> str:
  """Row-name form of an instance count: 50000 -> "50k", 512 -> "512"."""
  return f"{num // 1000}k" if num % 1000 == 0 else str(num)


@functools.lru_cache(maxsize=None)
def scores_fn(module: Any, mode: str):
  """A jit'd scoring function `(params, q [B, n], e [B, n]) -> [B, 4]` of `module`.

  mode "shared": one parameter set; "per_instance": params with a leading B axis; "stacked": K
  models, every argument with a leading K axis -> [K, B, 4].
  """
  if mode == "per_instance":
    return jax.jit(functools.partial(task.per_instance_scores, module))
  f = functools.partial(task.instance_scores, module)
  return jax.jit(jax.vmap(f) if mode == "stacked" else f)


class Table:
  """Shared state of one run: test instances, keys, rows, score samples for the figure."""

  def __init__(self, config: ml_collections.ConfigDict):
    self.config = config
    self.n = n = config.n
    self.pairs = task.pairs(n)
    self.root = jax.random.key(config.seed)
    t = config.train
    self.spec = training.TrainSpec(int(t.batch_size), float(t.learning_rate),
                                   float(t.weight_decay), float(t.margin), "all_pairs")
    q_test, pair_test = task.sample_instances(key_for(self.root, "test"), config.num_test, n)
    self.q_test, self.pair_test = np.asarray(q_test), np.asarray(pair_test)
    self.e_test = self.e_of(self.pair_test)
    # every (q, I0) instance, pair-major
    q_all = task.all_queries(n)
    self.pair_all = np.repeat(np.arange(len(self.pairs), dtype=np.int32), q_all.shape[0])
    self.q_all = np.tile(q_all, (len(self.pairs), 1))
    self.e_all = self.e_of(self.pair_all)
    self.pool: tuple[jnp.ndarray, jnp.ndarray] | None = None
    self.rows: dict[str, dict[str, Any]] = {}
    self.samples: dict[str, np.ndarray] = {}

  def e_of(self, pair_index: np.ndarray | jnp.ndarray) -> np.ndarray:
    """I0 indicators of pair indices [...] -> [..., n]."""
    return task.indicator(self.pairs[np.asarray(pair_index)], self.n)

  def data(self, num: int) -> tuple[jnp.ndarray, jnp.ndarray]:
    """The first `num` instances of one random training pool (q [num, n], pair index [num]).

    Every model trained on `num` instances sees the same ones; smaller sets are prefixes of larger.
    """
    if self.pool is None:
      size = max((int(r[0]) for f in RUN_FIELDS for r in self.config[f]), default=num)
      self.pool = task.sample_instances(key_for(self.root, "train_pool"), size, self.n)
    return self.pool[0][:num], self.pool[1][:num]

  def add(self, name: str, scores: jnp.ndarray, keep: bool = False, **extra: Any) -> None:
    row = task.summarize(scores)
    row.update(extra)
    self.rows[name] = row
    if keep:
      self.samples[name] = np.asarray(scores)

  # -- constructed models ------------------------------------------------------------------------

  def constructed(self) -> None:
    """W_I0 (bilinear), e_i1 e_i1^T (lowrank rank 1) and v = 1 on I0 (wdp), given each I0."""
    n = self.n
    bilinear = scorers.build("bilinear", n)
    diag = (self.e_test + 1.0) / 2.0  # [B, n], 1 on I0
    W = np.eye(n, dtype=np.float32)[None] * diag[:, None, :]  # [B, n, n] = diag(1 on I0)
    s = scores_fn(bilinear, "per_instance")({"W": W}, self.q_test, self.e_test)
    self.add("bilinear_rank2_constructed", s, keep=True,
             model="bilinear, W_I0 = e_i1 e_i1^T + e_i2 e_i2^T", trained_on="- (given I0)",
             scores_agreeing=sorted(set(np.asarray(s[:, :2]).ravel().tolist())),
             scores_disagreeing=sorted(set(np.asarray(s[:, 2:]).ravel().tolist())))
    shared = scores_fn(bilinear, "shared")
    parts = []
    for p, (i1, i2) in enumerate(self.pairs):
      W_p = np.zeros((n, n), np.float32)
      W_p[i1, i1] = W_p[i2, i2] = 1.0
      sel = self.pair_all == p
      parts.append(shared({"W": W_p}, self.q_all[sel], self.e_all[sel]))
    s_all = jnp.concatenate(parts)
    self.add("bilinear_rank2_constructed_exhaustive", s_all,
             model="bilinear, W_I0 = e_i1 e_i1^T + e_i2 e_i2^T",
             trained_on="- (given I0); all 2^n x n(n-1)/2 instances",
             scores_agreeing=sorted(set(np.asarray(s_all[:, :2]).ravel().tolist())),
             scores_disagreeing=sorted(set(np.asarray(s_all[:, 2:]).ravel().tolist())))
    lowrank = scorers.build("lowrank", n, rank=1)
    first = np.eye(n, dtype=np.float32)[self.pairs[np.asarray(self.pair_test), 0]][:, :, None]
    s = scores_fn(lowrank, "per_instance")({"P": first, "Q": first}, self.q_test, self.e_test)
    self.add("lowrank_rank1_constructed", s, model="lowrank r=1, W = e_i1 e_i1^T",
             trained_on="- (given I0)")
    wdp = scorers.build("wdp", n)
    s = scores_fn(wdp, "per_instance")({"v": diag}, self.q_test, self.e_test)
    self.add("wdp_closed_form", s, keep=True, model="wdp, v = 1 on I0, 0 elsewhere",
             trained_on="- (given I0)")

  # -- universal models (one model for every I0) -------------------------------------------------

  def universal(self, name: str, module: Any, params: Any, run: tuple[int, int],
                protocol: str = "all_pairs", **extra: Any) -> None:
    """Trains one model on `run` = (instances, epochs) of random (q, I0); adds its row."""
    num, epochs = int(run[0]), int(run[1])
    q, pair = self.data(num)
    spec = dataclasses.replace(self.spec, protocol=protocol)
    params, history = training.fit(module, params, q, self.e_of(pair), key_for(self.root, name),
                                   epochs, spec)
    both = scores_fn(module, "shared")(params, np.concatenate([self.q_test, self.q_all]),
                                        np.concatenate([self.e_test, self.e_all]))
    s, s_all = np.asarray(both[:self.config.num_test]), np.asarray(both[self.config.num_test:])
    seen = np.isin(task.instance_codes(self.q_test, self.pair_test, len(self.pairs)),
                   task.instance_codes(q, pair, len(self.pairs)))
    base = name.rsplit("_", 2)[0]  # e.g. "wdp_trained" from "wdp_trained_50k_5ep"
    keep = base in FIGURE_ROWS and not any(k.startswith(base) for k in self.samples)
    self.add(name, s, keep=keep, trained_on=f"all I0: {num} x {epochs} ep ({protocol})",
             protocol=protocol, train_loss=history,
             exhaustive_success=float(np.mean(np.asarray(task.solved(s_all)))),
             test_in_train=float(seen.mean()), **extra)
    if "v" in params:
      self.rows[name]["v"] = np.round(np.asarray(params["v"]), 4).tolist()

  # -- one model per fixed I0 --------------------------------------------------------------------

  def fixed(self, prefix: str, module: Any, params: Any, run: tuple[int, int], **extra: Any
            ) -> None:
    """Trains one model per pair of `config.fixed_pairs` (vmapped); rows `..._own` / `..._other`.

    params: stacked initial params, leading axis K = number of fixed pairs.
    """
    if not self.config.fixed_pairs:
      return
    num, epochs = int(run[0]), int(run[1])
    fixed = [int(np.flatnonzero((self.pairs == np.asarray(p)).all(1))[0])
             for p in self.config.fixed_pairs]
    k = len(fixed)
    q, _ = self.data(num)
    qs = jnp.broadcast_to(q, (k,) + q.shape)
    es = jnp.broadcast_to(self.e_of(fixed)[:, None, :], qs.shape)
    keys = jnp.stack([key_for(self.root, f"{prefix}/{p}") for p in fixed])
    params, history = training.fit(module, params, qs, es, keys, epochs, self.spec, stacked=True)
    # evaluated on the test queries with its own I0, then on random instances of the other pairs
    own_e = np.broadcast_to(self.e_of(fixed)[:, None, :], (k,) + self.q_test.shape)
    q_eval, e_eval = [], []
    for j, p in enumerate(fixed):
      others = np.array([i for i in range(len(self.pairs)) if i != p])
      qo, po = task.sample_instances(key_for(self.root, f"test_other/{p}"), self.config.num_test,
                                     self.n, others)
      q_eval.append(np.concatenate([self.q_test, np.asarray(qo)]))
      e_eval.append(np.concatenate([own_e[j], self.e_of(po)]))
    both = np.asarray(scores_fn(module, "stacked")(params, np.stack(q_eval), np.stack(e_eval)))
    own, other = both[:, :self.config.num_test], both[:, self.config.num_test:]
    for j, p in enumerate(fixed):
      i1, i2 = (int(x) for x in self.pairs[p])
      name = f"{prefix}_I0_{i1}_{i2}_{size_name(num)}_{epochs}ep"
      info = dict(fixed_pair=[i1, i2], trained_on=f"I0 = ({i1}, {i2}): {num} x {epochs} ep",
                  train_loss=[h[j] for h in history], **extra)
      if "v" in params:
        info["v"] = np.round(np.asarray(params["v"][j]), 4).tolist()
      self.add(f"{name}_own", own[j], evaluated_on="own I0", **info)
      self.add(f"{name}_other", other[j], evaluated_on="other I0s", **info)


def wdp_uniform(key: jax.Array, shape: tuple[int, ...], scale: float) -> dict[str, jnp.ndarray]:
  """WDP params `{"v": shape}` drawn from U(-scale, scale) (the public code's init)."""
  return {"v": jax.random.uniform(key, shape, jnp.float32, -scale, scale)}
