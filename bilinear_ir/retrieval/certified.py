r"""Certified low-rank retrieval: exact full-`W` top-k from a rank-r scan plus a proof of it.

A full bilinear scorer `s_W(q, d) = q^T W d` (W [n, n]) is retrieved with the rank-r factors
`W_r = P Q^T` (`bilinear_ir.lowrank.truncate`), whose tables are r wide instead of n. Theorem 3
(paper 000) bounds the error of every score: `|s_W - s_Wr| <= sigma_{r+1} |q| |d|`. So per query

  lower bound  L(d) = s_Wr(q, d) - e |q| |d|,   upper bound  U(d) = s_Wr(q, d) + e |q| |d|,

and with tau = the k-th largest L, every doc of the exact top-k has U >= tau (k docs have
s_W >= L >= tau, so the k-th best s_W is >= tau). Only the docs with U >= tau are rescored with
the full W; the exact top-k is the top-k of those, and their count per query is the certificate.

Both bounds are MIPS over tables of width r + 1 (`[q P, -+ e |q|] . [d Q, |d|]`), so they run on
the exact chunked scan (`exact.topk`). Docs with U >= tau are found as the top-M by U: first
M = 4k; queries with more candidates are counted (`exact.count_at_least`) and rescanned with M the
next power of two above their count; a query whose M would pass `max_candidates` is scored with
the full W against every doc (its certificate then says N).

Float32 error: the bound is made rigorous for what is computed.
  * e starts at ||W - P Q^T||_2 computed in float64 for the factors actually used (in exact
    arithmetic that is sigma_{r+1}; it also absorbs the float32 SVD's error);
  * plus a rounding slack `safety * gamma_m * (|| |P| |Q|^T ||_2 + || |W| ||_2)`, with
    m = 2n + r + 2, gamma_m = m u / (1 - m u), u = 2^-24: the worst-case error of float32 inner
    products (Higham, Accuracy and Stability of Numerical Algorithms, section 3.1) in the low-rank
    score, the bound terms and the full-W rescore `(q W) . d`. The `safety` factor (default 2)
    covers the rounding of the bound terms themselves. Typical rounding is ~sqrt(m) u, so the
    slack is conservative; relative to sigma_1 |q||d| it is about `safety * m * u * sqrt(n)`.
Every matmul here (the tables, the bound scans, the rescoring) runs at `exact.PRECISION`
(float32, passed explicitly): u = 2^-24 is the float32 unit roundoff, not TF32's 2^-11 (GPU
default) or bf16's 2^-8 (TPU default), so the slack would not cover the backends' defaults.
With it, L <= the float32 full-W score <= U for every (q, d), so the candidate set holds every doc
whose float32 score reaches the k-th float32 score: the result is the float32 brute-force top-k of
`(q W) . d`, ties by lower id (and, up to one score's rounding, the real-number top-k).
Theorem 3 is a worst case (q and d aligned with the (r+1)-th singular pair): it prunes well when
sigma_{r+1} |q| |d| is small next to the spread of the top scores (fast-decaying spectra); for
a W near the identity (a trained bilinear model started at I) it prunes little.

    index = build_certified(W, docs, rank=32)
    res = certified_topk(index, queries, k=10)   # res.ids, res.scores, res.rescored [B], ...

The same certificate serves a low-PRECISION scan (`bf16_topk`): the candidates come from a
bfloat16 copy of any doc table (bf16 inputs, float32 accumulation: 2-3x faster matmuls on CPUs
with AVX512-BF16/AMX, half the bytes), whose scores differ from the float32 ones by at most
`c |q| max|d|` with c = `bf16_relative_bound(w)`; the candidates are rescored in float32, so the
result is the exact float32 top-k.

    res = bf16_topk(query_table, doc_table, k=10, doc_table_bf16=low)   # low = table in bf16
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from bilinear_ir import lowrank
from bilinear_ir.errors import input_error
from bilinear_ir.retrieval import exact

BF16_UNIT_ROUNDOFF = 2.0 ** -9
RESCORE_BYTES = 1 << 26     # [query tile, M, n] float32 gathered docs per rescoring step


class CertifiedIndex(NamedTuple):
  """What `certified_topk` needs, built once per (W, docs, rank).

  Attributes:
    W: [n, n] float32 full bilinear matrix.
    P, Q: [n, r] rank-r factors, `P Q^T = W_r`.
    docs: [N, n] float32 doc embeddings (for the full-W rescoring).
    doc_table: [N, r + 1] = `[d Q, |d|]`, the bound scan's doc table.
    sigma_next: sigma_{r+1} of W (float64 SVD), the paper's Theorem 3 constant.
    residual_norm: ||W - P Q^T||_2 in float64 for these factors (== sigma_next up to the SVD's
      float32 error).
    slack: the float32 rounding slack added to the bound (see the module docstring).
    bound: e = residual_norm + slack, the per-unit-norm bound used.
  """
  W: jax.Array
  P: jax.Array
  Q: jax.Array
  docs: jax.Array
  doc_table: jax.Array
  sigma_next: float
  residual_norm: float
  slack: float
  bound: float


class CertifiedTopK(NamedTuple):
  """Exact full-W top-k and its certificate.

  Attributes:
    scores: [B, k] float32 full-W scores `(q W) . d`, descending (ties: lower id first).
    ids: [B, k] int32 doc ids.
    rescored: [B] int32, docs whose upper bound reached tau, all rescored with the full W.
    threshold: [B] float32 tau, the k-th largest lower bound.
    scanned: M, candidate list length per query (>= max(rescored)), or N after a full scan.
  """
  scores: jax.Array
  ids: jax.Array
  rescored: jax.Array
  threshold: jax.Array
  scanned: int


def build_certified(W, docs, rank: int, *, safety: float = 2.0) -> CertifiedIndex:
  """Factors W, bounds the error, and builds the width-(r+1) doc table.

  Args:
    W: [n, n] full bilinear matrix (the `bilinear` scorer's `W`).
    docs: [N, n] doc embeddings.
    rank: r, 0 <= r <= n.
    safety: multiplier of the float32 rounding slack (>= 1).

  Returns:
    A CertifiedIndex.
  """
  W = np.asarray(W, np.float32)
  if W.ndim != 2 or W.shape[0] != W.shape[1]:
    raise input_error(f"must be square [n, n], got shape {W.shape}", file="W")
  n = W.shape[0]
  if np.ndim(docs) != 2 or np.shape(docs)[1] != n:
    raise input_error(f"must be [N, {n}], got shape {np.shape(docs)}", file="docs")
  if safety < 1.0:
    raise input_error(f"must be >= 1, got {safety}", file="config", field="certified.safety")
  dec = lowrank.svd(jnp.asarray(W))
  P, Q = lowrank.truncate(jnp.asarray(W), rank, dec)
  P64, Q64, W64 = (np.asarray(x, np.float64) for x in (P, Q, W))
  residual = float(np.linalg.norm(W64 - P64 @ Q64.T, 2))
  abs_pq = float(np.linalg.norm(np.abs(P64) @ np.abs(Q64).T, 2)) if rank else 0.0
  abs_w = float(np.linalg.norm(np.abs(W64), 2))
  slack = safety * exact.gamma(2 * n + rank + 2) * (abs_pq + abs_w)
  docs = jnp.asarray(docs, jnp.float32)
  doc_table = _doc_table(docs, Q)
  sigma = float(np.linalg.svd(W64, compute_uv=False)[rank]) if rank < n else 0.0
  return CertifiedIndex(jnp.asarray(W), P, Q, docs, doc_table, sigma, residual, slack,
                        residual + slack)


@jax.jit
def _doc_table(docs, Q):
  """docs [N, n], Q [n, r] -> [N, r + 1] = [d Q, |d|]."""
  return jnp.concatenate([jnp.matmul(docs, Q, precision=exact.PRECISION),
                          jnp.linalg.norm(docs, axis=1, keepdims=True)], axis=1)


@jax.jit
def _query_tables(queries, P, W, bound):
  """queries [B, n] -> lower-bound table, upper-bound table [B, r + 1], full-W table [B, n]."""
  qp = jnp.matmul(queries, P, precision=exact.PRECISION)
  e = bound * jnp.linalg.norm(queries, axis=1, keepdims=True)
  return (jnp.concatenate([qp, -e], axis=1), jnp.concatenate([qp, e], axis=1),
          jnp.matmul(queries, W, precision=exact.PRECISION))


@functools.partial(jax.jit, static_argnames=("k",))
def _rescore(qt, dt, ids, k):
  """Exact top-k of candidates: qt [b, w], dt [N, w], ids [b, M] -> TopK [b, k].

  Scores are float32 `qt . dt[id]` (at `exact.PRECISION` on every backend); ties by lower id.
  """
  scores = jnp.einsum("bw,bmw->bm", qt, dt[ids], precision=exact.PRECISION,
                      preferred_element_type=jnp.float32)
  return exact.merge(scores, ids, k)


def _rescore_tiles(qt, dt, ids, k) -> exact.TopK:
  """`_rescore` over query tiles of at most RESCORE_BYTES gathered rows."""
  b, m = ids.shape
  tile = max(1, RESCORE_BYTES // (4 * m * dt.shape[1]))
  parts = [_rescore(qt[i:i + tile], dt, ids[i:i + tile], k) for i in range(0, b, tile)]
  if len(parts) == 1:
    return parts[0]
  return exact.TopK(jnp.concatenate([p.scores for p in parts]),
                    jnp.concatenate([p.ids for p in parts]))


def _certify(scan_q, scan_d, full_q, full_d, k: int, *, cutoff=None, slack=None,
             first_m: int, limit: int, query_chunk: int = exact.DEFAULT_QUERY_CHUNK
             ) -> CertifiedTopK:
  """Candidates by a cheap scan, exact top-k by rescoring them (shared by both methods).

  Every doc whose scan score (`scan_q . scan_d`) reaches the query's cutoff must be rescored.
  A first scan finds each query's top-M0 docs by scan score; a query is settled when its M-th
  scan score is below its cutoff (then all docs at or above it are among the M) or M == N.
  The others are counted (`exact.count_at_least`) and rescanned in groups with M = the next power
  of two above their count (x2 again in the rare case rounding differs between the two scans).
  Settled queries' M candidates are rescored exactly (`full_q . full_d`, float32) and the top-k
  of them returned. Queries whose M would exceed `limit` are scored against all docs with the
  full tables (`exact.topk`); their certificate says N. With `limit < 2 M0` the queries left
  open after the first scan go straight there (no counting scan).

  Args:
    scan_q, scan_d: [B, w'] and [N, w'] candidate tables.
    full_q, full_d: [B, w] and [N, w] exact tables.
    k: results per query.
    cutoff: [B] scan-score cutoff; or None: the k-th scan score minus `slack` [B] (from the
      first scan).
    first_m, limit: first and largest M.
    query_chunk: queries per scan.
  """
  b, n_docs = full_q.shape[0], full_d.shape[0]
  out_scores = np.zeros((b, k), np.float32)
  out_ids = np.zeros((b, k), np.int32)
  rescored = np.zeros((b,), np.int32)
  cut = None if cutoff is None else np.asarray(cutoff, np.float32)
  scanned = 0

  # the scans and the rescoring compile once per size class of open or settled queries
  padded = functools.partial(exact.pad_rows, limit=b)

  def settle(rows: np.ndarray, m: int) -> np.ndarray:
    """Scans rows' top-m, rescores the settled ones; returns the rows left open."""
    nonlocal cut, scanned
    n, p = rows.size, padded(rows)
    if m > limit:  # the bound is too loose for these queries: score every doc exactly
      full = exact.topk(full_q[p], full_d, k, query_chunk=query_chunk)
      out_scores[rows], out_ids[rows] = np.asarray(full.scores)[:n], np.asarray(full.ids)[:n]
      rescored[rows] = n_docs
      scanned = n_docs
      return rows[:0]
    found = exact.topk(scan_q[p], scan_d, m, query_chunk=query_chunk)
    found_scores = np.asarray(found.scores)[:n]
    if cut is None:  # the first scan covers every query
      cut = np.asarray(found_scores[:, k - 1] - np.asarray(slack), np.float32)
    done = (found_scores[:, m - 1] < cut[rows]) | (m == n_docs)
    if done.any():  # rescores all of p (one shape per size class), keeps the settled ones
      res = _rescore_tiles(full_q[p], full_d, found.ids, k)
      out_scores[rows[done]] = np.asarray(res.scores)[:n][done]
      out_ids[rows[done]] = np.asarray(res.ids)[:n][done]
      rescored[rows[done]] = np.sum(found_scores[done] >= cut[rows[done], None], axis=1)
    scanned = max(scanned, m)
    return rows[~done]

  m0 = min(n_docs, first_m)
  pending = settle(np.arange(b), m0)
  if pending.size and 2 * m0 > limit:  # no room to grow their lists: score them exactly
    settle(pending, limit + 1)
  elif pending.size:
    p = padded(pending)
    counts = np.asarray(exact.count_at_least(scan_q[p], scan_d, cut[p],
                                             query_chunk=query_chunk))[:pending.size]
    sizes = np.minimum(n_docs, np.maximum(2 * m0, 2 ** np.ceil(np.log2(counts + 1)))).astype(int)
    for m in np.unique(sizes):
      rows = pending[sizes == m]
      while rows.size:
        rows = settle(rows, int(m))
        m = min(n_docs, 2 * m)
  return CertifiedTopK(jnp.asarray(out_scores), jnp.asarray(out_ids), jnp.asarray(rescored),
                       jnp.asarray(cut), scanned)


def certified_topk(index: CertifiedIndex, queries, k: int, *, first_candidates: int | None = None,
                   max_candidates: int | None = None, chunk: int | None = None
                   ) -> CertifiedTopK:
  """Exact full-W top-k with the rank-r scan and Theorem 3: queries [B, n] -> CertifiedTopK.

  Args:
    index: from `build_certified`.
    queries: [B, n] query embeddings.
    k: results per query, 1 <= k <= N.
    first_candidates: first M (default max(4k, 16)).
    max_candidates: largest M before a query falls back to the full-W scan (default N // 4).
    chunk: doc rows per step of the lower-bound scan.

  Returns:
    CertifiedTopK; `ids` equal the full-W brute-force top-k, `rescored` [B] counts the docs
    whose upper bound reached tau (N for queries that fell back), `threshold` [B] is tau.
  """
  n_docs, n = index.docs.shape
  if np.ndim(queries) != 2 or np.shape(queries)[1] != n:
    raise input_error(f"must be [B, {n}], got shape {np.shape(queries)}", file="queries")
  exact.check_tables(np.zeros((1, 1)), np.zeros((0, 1)), k, num_docs=n_docs)
  queries = jnp.asarray(queries, jnp.float32)
  lower_q, upper_q, qw = _query_tables(queries, index.P, index.W, jnp.float32(index.bound))
  tau = exact.topk(lower_q, index.doc_table, k, chunk=chunk).scores[:, k - 1]
  m = first_candidates or max(4 * k, 16)
  limit = max(m, n_docs // 4 if max_candidates is None else max_candidates)
  return _certify(upper_q, index.doc_table, qw, index.docs, k, cutoff=tau, first_m=m,
                  limit=limit)


def bf16_pays(platform: str | None = None, cpu_flags: str | None = None) -> bool:
  """Whether `bf16_topk` (a bf16 scan + float32 rescoring) is expected to beat the float32
  scan `exact.topk` on this device: the rule docs/benchmarks/README.md states, from measurements.

  CPU with AVX512-BF16 (`avx512_bf16` in /proc/cpuinfo): yes (bf16 matmuls 2-3x the float32
  rate; on the 2-core development CPU 1.05-1.07x FAISS against the float32 scan's 1.01-1.04x).
  CPU without it: no (bf16 is emulated). GPU: no (one H100: 14.9 ms against 5.84 ms for the
  float32 scan at 1,000 x 200k; the scan is not bound by its matmul there, and bf16 adds a
  second pass). TPU: no (not measured; its float32 matmuls are bf16 passes already).

  Args:
    platform: "cpu", "gpu", "tpu" (None: jax's default backend).
    cpu_flags: the CPU's flags (None: read /proc/cpuinfo).
  """
  if (platform or jax.default_backend()) != "cpu":
    return False
  if cpu_flags is None:
    try:
      with open("/proc/cpuinfo", encoding="utf-8") as f:
        cpu_flags = next((line for line in f if line.startswith("flags")), "")
    except OSError:
      cpu_flags = ""
  return "avx512_bf16" in cpu_flags.split()


def bf16_relative_bound(width: int, safety: float = 1.1) -> float:
  """c with |s_bf16 - s_f32| <= c |q| |d| for tables of width w.

  s_bf16 rounds q and d to bfloat16 (relative error <= u_b = 2^-9 each; the products of two
  bf16 values are exact in float32) and accumulates in float32 (error <= gamma_w sum|q_i d_i|);
  s_f32 accumulates the float32 inputs (error <= gamma_w sum|q_i d_i|). With
  sum|q_i d_i| <= |q| |d|: c = safety * (2 u_b + u_b^2 + 2.01 gamma_w); safety (1.1) covers the
  float32 rounding of the bound itself and flushed subnormals (absolute errors below 2^-126).
  """
  return safety * (2 * BF16_UNIT_ROUNDOFF + BF16_UNIT_ROUNDOFF ** 2 + 2.01 * exact.gamma(width))


def bf16_table(doc_table) -> tuple[jax.Array, float]:
  """The bf16 copy of a doc table and its largest row norm: dt [N, w] -> ([N, w] bf16, max|d|).

  Build it once per table (like an index) and pass both to `bf16_topk`.
  """
  dt = jnp.asarray(doc_table, jnp.float32)
  return dt.astype(jnp.bfloat16), float(jnp.max(jnp.linalg.norm(dt, axis=1)))


def bf16_topk(query_table, doc_table, k: int, *, doc_table_bf16=None,
              max_doc_norm: float | None = None, first_candidates: int | None = None,
              max_candidates: int | None = None,
              query_chunk: int = exact.DEFAULT_QUERY_CHUNK) -> CertifiedTopK:
  """Exact float32 top-k from a bfloat16 candidate scan + float32 rescoring.

  Per query, the top-M docs by bf16 score are found (`exact.topk` on the bf16 table); with
  tau = the k-th bf16 score and e = c |q| max|d| (`bf16_relative_bound`), every doc of the
  float32 top-k has a bf16 score >= tau - 2e. When the M-th bf16 score is below tau - 2e the M
  candidates contain them all and are rescored in float32. The few queries where it is not are
  scored by the float32 scan (`exact.topk`), by default at once: for a handful of queries that
  costs less than growing their bf16 lists (a counting scan + a longer bf16 rescan). With
  `max_candidates` > 2 M their
  lists grow instead (as `certified_topk`). The result equals the float32 brute-force top-k
  (ties: lower id first).

  Args:
    query_table: [B, w] float32.
    doc_table: [N, w] float32 (rows are gathered for the rescoring only).
    k: results per query, 1 <= k <= N.
    doc_table_bf16, max_doc_norm: from `bf16_table(doc_table)` (computed here if not given).
    first_candidates: first M (default max(4k, 16)).
    max_candidates: largest M before a query falls back to the float32 scan (default: the first
      M).
    query_chunk: queries per scan.

  Returns:
    CertifiedTopK: `rescored` [B] counts the docs at or above tau - 2e (the certified candidate
    set), `threshold` [B] is tau - 2e, `scanned` the largest M used.
  """
  exact.check_tables(query_table, doc_table, k)
  qt = jnp.asarray(query_table, jnp.float32)
  dt = jnp.asarray(doc_table, jnp.float32)
  if doc_table_bf16 is None or max_doc_norm is None:
    doc_table_bf16, max_doc_norm = bf16_table(dt)
  if tuple(doc_table_bf16.shape) != tuple(dt.shape):
    raise input_error(f"shape {tuple(doc_table_bf16.shape)} != doc table {tuple(dt.shape)}",
                      file="doc_table_bf16")
  slack = 2.0 * bf16_relative_bound(dt.shape[1]) * max_doc_norm * jnp.linalg.norm(qt, axis=1)
  m = first_candidates or max(4 * k, 16)
  limit = m if max_candidates is None else max(m, max_candidates)
  return _certify(qt.astype(jnp.bfloat16), doc_table_bf16, qt, dt, k, slack=slack,
                  first_m=m, limit=limit, query_chunk=query_chunk)
