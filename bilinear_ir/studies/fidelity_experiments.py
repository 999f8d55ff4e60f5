"""How well random projections keep BM25 rankings (paper 002, sections 2 and 5): the experiments.

`run_experiments(config, collection)` computes what the `fidelity_bm25` job reports
(bilinear_ir/report/fidelity_bm25.py draws the figures and the table) on the tasks of
`studies.fidelity_tasks`.

Two query sets over one collection (default SciFact), BM25 vectors q~, d~ from
`data.bm25` (paper setting: lowercased wordpieces, gensim BM25 k1 = 1.5, b = 0.75,
epsilon = 0.25), projected by Rademacher (or Gaussian) matrices A [k, V] from
`fidelity.projections`, one fresh A per trial and per collection:

* claims: the queries of `data.split` against every document of the collection.
  - min_margin: the smallest positive normalized margin mu(q, d1 = argmax_d BM25(q, d), d2) over
    all queries and docs d2, for BM25 and for the boolean inner product (same tokens). Paper
    (TREC-CAR): 6.8e-06 vs 0.0169.
  - Fig. 2: the triples (q, d1, d2) with a positive margin eps are binned by
    x = (eps^2/2 - eps^3/3)^-1 (`fig2.num_bins` equal-width bins on (0, fig2.x_max]; larger x
    are left out, as in the paper); `fig2.triples_per_bin` are sampled per bin and projected
    in `trials` trials. Per bin: the smallest k of `k_grid` whose pairwise accuracy over
    triples x trials (error: <Aq, Ad2> >= <Aq, Ad1>) reaches 1 - beta, next to eq. (2)'s
    sufficient k = 2 ln(4/beta) x (8.76 x at beta = .05) at the bin's mean x. slope:
    least-squares slope through the origin of min k vs mean x; tightness = 2 ln(4/beta) / slope
    (how many times eq. (2) over-asks).
  - lemma1_check: over the Fig. 2 triples whose eq. (2) k fits in the grid, the error rate at the
    largest grid k, and at each triple's own eq. (2) k (rounded up to the grid), with a
    Clopper-Pearson 95% upper bound.
  - Fig. 3a / 3b: documents are cut into `fig3.doc_bins` equal-count bins by length (tokens). Per
    query and bin, d1 = the bin's best BM25 doc (queries with no overlap in the bin are left
    out): Fig. 3a the `fig3.ranks`-th smallest margins of d1 over the other docs of the bin
    (median and quartiles over queries; exact ties count, as margin 0); Fig. 3b the smallest
    grid k at which d1 is in the projected top `fig3.recall_at` of its bin (other docs scoring
    >= d1 count against it) in a share >= `fig3.recall_target` of (query, trial) pairs, on
    `fig3.queries` queries and `fig3.trials` projections of every document.
* containing passage (section 5): `passages.docs` documents (a seeded sample) are cut into
  passages of at most l whitespace words, for each l in `passages.lengths`; a collection D_l per
  l. `passages.queries` queries per l are random runs of 5..25 consecutive words of a random
  passage (left in it). Each D_l is one bin of Fig. 3a / 3b; `bm25_mrr10` is the MRR@10 of the
  source passage under exact BM25.

Every grid k is read off one unscaled projection at k = k_grid[-1] per trial (prefix sums over
the first k coordinates; see `projections`). Ties: d1 is the lowest-index doc of the top score;
margins <= 1e-12 count as ties, not positive margins (min_margin, Fig. 2). Every random choice
derives from `config.seed` (host sampling with numpy, projections from `jax.random.key(seed)`
folded with trial and task).
"""
from __future__ import annotations

import functools
import math
from typing import Any

from absl import logging
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import scipy.sparse as sp
import scipy.stats

from bilinear_ir.data.collection import Collection
from bilinear_ir.fidelity import projections
from bilinear_ir.fidelity import theory
from bilinear_ir.studies import fidelity_tasks

def _blocked(config, rows: sp.csr_matrix) -> projections.BlockedSparse:
  return projections.prepare(rows, int(config.k_grid[-1]), int(config.projection.block_size))


# ---------------------------------------------------------------------------------------------
# Projected side: every grid k from one projection at the largest k (prefix sums).


@functools.partial(jax.jit, static_argnames=("grid",))
def pairwise_errors(y: jax.Array, q: jax.Array, d1: jax.Array, d2: jax.Array,
                    grid: tuple[int, ...]) -> jax.Array:
  """Ranking errors <A_k q, A_k d2> >= <A_k q, A_k d1> at every grid k.

  Args:
    y: [R, K] an unscaled projection (`project(..., scale=False)`), K = grid[-1].
    q, d1, d2: [T] rows of y of each triple.
    grid: increasing dimensions k <= K; A_k is the first k columns.

  Returns:
    [T, G] bool.
  """
  step = functools.reduce(math.gcd, grid)
  steps = grid[-1] // step

  def chunk_sums(t, out):  # one triple at a time: 3x faster on CPU than gathering [T, K] rows
    row = lambda i: jax.lax.dynamic_index_in_dim(y, i, keepdims=False)[:steps * step]
    prod = row(q[t]) * (row(d1[t]) - row(d2[t]))  # [K]
    return out.at[t].set(prod.reshape(steps, step).sum(axis=1))

  chunks = jax.lax.fori_loop(0, q.shape[0], chunk_sums,
                             jnp.zeros((q.shape[0], steps), jnp.float32))  # [T, K / step]
  margin = jnp.cumsum(chunks, axis=1)  # unscaled <A_k q, A_k (d1 - d2)> at k = step, 2 step, ..
  return margin[:, jnp.asarray(grid) // step - 1] <= 0


@functools.partial(jax.jit, static_argnames=("grid", "r"))
def recall_hits(y: jax.Array, q: jax.Array, docs: jax.Array, targets: jax.Array,
                grid: tuple[int, ...], r: int) -> jax.Array:
  """Whether each query's target doc is in the projected top r of `docs`, at every grid k.

  The target's rank counts the other docs scoring >= it (ties count against it).

  Args:
    y: [R, K] an unscaled projection; grid[-1] = K.
    q: [m] query rows of y.
    docs: [n] doc rows of y.
    targets: [m] position of each query's target inside `docs`.
    grid: increasing dimensions.
    r: the recall depth.

  Returns:
    [m, G] bool.
  """
  step = functools.reduce(math.gcd, grid)
  steps = grid[-1] // step
  yq = y[q][:, :steps * step].reshape(len(q), steps, step).transpose(1, 0, 2)  # [S, m, c]
  yd = y[docs][:, :steps * step].reshape(len(docs), steps, step).transpose(1, 0, 2)  # [S, n, c]

  def body(s, chunk):
    a, b = chunk
    s = s + a @ b.T  # [m, n] scores at the next multiple of `step`
    own = jnp.take_along_axis(s, targets[:, None], axis=1)
    return s, jnp.sum(s >= own, axis=1) - 1 < r

  _, hits = jax.lax.scan(body, jnp.zeros((len(q), len(docs)), jnp.float32), (yq, yd))
  return hits[jnp.asarray(grid) // step - 1].T


# ---------------------------------------------------------------------------------------------
# The experiments.


def _first_reaching(values: np.ndarray, grid: tuple[int, ...], target: float) -> int | None:
  ok = np.flatnonzero(values >= target)
  return int(grid[ok[0]]) if ok.size else None


def _quantiles(values: list[float]) -> dict[str, Any]:
  if not values:
    return {"n": 0, "q25": None, "median": None, "q75": None}
  q = np.quantile(values, [0.25, 0.5, 0.75])
  return {"n": len(values), "q25": float(q[0]), "median": float(q[1]), "q75": float(q[2])}


def run_experiments(config: ml_collections.ConfigDict, collection: Collection) -> dict[str, Any]:
  """Every experiment of the module docstring on a loaded collection: the results dict.

  Args:
    config: the `fidelity_bm25` job's config (configs/fidelity_bm25.py), already validated.
    collection: the collection whose `data.split` queries and documents are used.

  Returns:
    {"k_grid", "trials", "projection", "collection", "fig2", "fig3a", "fig3b", "min_margin",
     "lemma1_check"} (see the module docstring for each).
  """
  rng = np.random.default_rng(config.seed)
  grid = tuple(int(k) for k in config.k_grid)
  kmax, kind = grid[-1], config.projection.kind
  tokenizer = fidelity_tasks.tokenizer_of(config)
  (pair_task, bin_task), cinfo = fidelity_tasks.claims_task(config, collection, tokenizer, rng)
  doc_sample = np.sort(rng.permutation(collection.num_docs)[:config.passages.docs])
  passage_tasks, pinfo = [], []
  for length in config.passages.lengths:
    task, info = fidelity_tasks.passage_task(config, collection, tokenizer, int(length),
                                             doc_sample, rng)
    passage_tasks.append(task)
    pinfo.append(info)
  tasks = [pair_task, bin_task] + passage_tasks
  tri = cinfo["triples"]
  errors = np.zeros((len(tri["q"]), len(grid)), np.int64)
  for task in tasks:
    for b in task.bins:
      b.hits = np.zeros((len(b.queries), len(grid)), np.int64)

  root = jax.random.key(config.seed)
  bs, r = int(config.projection.block_size), int(config.fig3.recall_at)
  # Device copies of the trial-invariant index arrays, made once for every trial.
  pairs = {j: tuple(jnp.asarray(a) for a in task.pairs) for j, task in enumerate(tasks)
           if task.pairs is not None}
  bin_rows = {(j, i): (jnp.asarray(b.queries), jnp.asarray(task.num_queries + b.docs),
                       jnp.asarray(b.targets))
              for j, task in enumerate(tasks) for i, b in enumerate(task.bins) if len(b.queries)}
  for t in range(max(task.trials for task in tasks)):
    tkey = jax.random.fold_in(root, t)
    for j, task in enumerate(tasks):
      if t >= task.trials:
        continue
      y = projections.project(jax.random.fold_in(tkey, j), task.blocked, kmax, kind, bs,
                              scale=False)
      if task.pairs is not None and len(tri["q"]):
        errors += np.asarray(pairwise_errors(y, *pairs[j], grid))
      for i, b in enumerate(task.bins):
        if len(b.queries):
          b.hits += np.asarray(recall_hits(y, *bin_rows[j, i], grid, r))
    logging.info("fidelity trial %d done", t + 1)

  results = {"k_grid": list(grid), "trials": {"fig2": int(config.trials),
                                               "fig3b": int(config.fig3.trials)},
             "projection": kind,
             "collection": {"name": collection.name, "queries": cinfo["queries"],
                            "docs": cinfo["docs"], "vocab": cinfo["vocab"]}}
  results["fig2"] = _fig2(config, grid, tri, errors)
  results["fig3a"], results["fig3b"] = _fig3(config, grid, bin_task, passage_tasks, pinfo)
  results["min_margin"] = cinfo["min_margin"]
  results["lemma1_check"] = _lemma1_check(config, grid, tri, errors)
  return results


def _fig2(config, grid, tri, errors) -> dict[str, Any]:
  trials, beta = config.trials, config.beta
  edges = tri["edges"]
  out = {"bins": [], "x_mean": [], "triples": [], "accuracy": [], "min_k": [], "bound_k": []}
  for b in range(config.fig2.num_bins):
    sel = tri["bin"] == b
    out["bins"].append([float(edges[b]), float(edges[b + 1])])
    out["triples"].append(int(sel.sum()))
    if not sel.any():
      for key in ("x_mean", "accuracy", "min_k", "bound_k"):
        out[key].append(None)
      continue
    acc = 1.0 - errors[sel].sum(axis=0) / (sel.sum() * trials)
    xm = float(tri["x"][sel].mean())
    out["x_mean"].append(xm)
    out["accuracy"].append([float(a) for a in acc])
    out["min_k"].append(_first_reaching(acc, grid, 1.0 - beta))
    out["bound_k"].append(theory.eq2_slope(beta) * xm)
  pts = [(x, k) for x, k in zip(out["x_mean"], out["min_k"]) if k is not None]
  slope = (sum(x * k for x, k in pts) / sum(x * x for x, _ in pts)) if pts else None
  out["slope"] = slope
  out["bound_slope"] = theory.eq2_slope(beta)
  out["tightness"] = out["bound_slope"] / slope if slope else None
  out["candidates"] = tri["candidates"]
  out["candidates_in_range"] = tri["candidates_in_range"]
  return out



def _fig3(config, grid, claims: fidelity_tasks.Task, passage_tasks: list[fidelity_tasks.Task],
          pinfo: list[dict[str, Any]]
          ) -> tuple[dict[str, Any], dict[str, Any]]:
  """Fig. 3a (margin quantiles per bin) and Fig. 3b (min k for recall@r per bin)."""
  ranks = [int(r) for r in config.fig3.ranks]
  target, trials = float(config.fig3.recall_target), config.fig3.trials

  def panel(bins: list[fidelity_tasks.Bin]):
    a = {"bins": [b.label for b in bins], "docs": [int(len(b.docs)) for b in bins],
         "margins": {str(r): [_quantiles(b.margins[r]) for b in bins] for r in ranks}}
    recall = [(b.hits.sum(axis=0) / max(1, len(b.queries) * trials)) for b in bins]
    bb = {"bins": a["bins"], "queries": [int(len(b.queries)) for b in bins],
          "recall": [[float(v) for v in r] if len(b.queries) else None
                     for r, b in zip(recall, bins)],
          "min_k": [_first_reaching(r, grid, target) if len(b.queries) else None
                    for r, b in zip(recall, bins)]}
    return a, bb

  ca, cb = panel(claims.bins)
  pa, pb = panel([b for t in passage_tasks for b in t.bins])
  pa["passages"] = [i["passages"] for i in pinfo if i["queries"]]
  pa["bm25_mrr10"] = [i["bm25_mrr10"] for i in pinfo if i["queries"]]
  fig3a = {"ranks": ranks, "claims": ca, "containing_passage": pa}
  fig3b = {"recall_at": int(config.fig3.recall_at), "target": target, "claims": cb,
           "containing_passage": pb}
  return fig3a, fig3b


def _upper95(errors: int, n: int) -> float | None:
  """One-sided 95% Clopper-Pearson upper bound on a binomial rate (errors of n)."""
  if n == 0:
    return None
  return 1.0 if errors >= n else float(scipy.stats.beta.ppf(0.95, errors + 1, n - errors))


def _lemma1_check(config, grid, tri, errors) -> dict[str, Any]:
  """Lemma 1 on the Fig. 2 triples whose eq. (2) k is within the grid."""
  beta, trials = config.beta, config.trials
  k_t = theory.sufficient_k(theory.lemma1_k(tri["eps"], beta))
  elig = np.flatnonzero(k_t <= grid[-1])
  n = int(elig.size)
  at_max = int(errors[elig, -1].sum())
  own = errors[elig, np.searchsorted(np.asarray(grid), k_t[elig])]  # [n] errors at own k
  return {"beta": float(beta), "k": int(grid[-1]), "triples": n, "trials": int(trials),
          "empirical_error": at_max / (n * trials) if n else None,
          "upper95": _upper95(at_max, n * trials),
          "own_k_error": float(own.sum() / (n * trials)) if n else None,
          "own_k_upper95": _upper95(int(own.sum()), n * trials),
          "own_k_max_triple_error": float(own.max() / trials) if n else None}


