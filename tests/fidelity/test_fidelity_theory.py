"""Paper 002 section 2.1: normalized margin, Lemma 1 / 2, Corollaries 1 / 2, checked empirically.

Empirical checks use enough trials that a pass means something: with T trials and e errors, the
one-sided 95% Clopper-Pearson upper bound on the error rate must be <= beta (0 errors in 300
trials bounds the rate by 0.0099; 0 in 100 by 0.0295).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp
import scipy.stats

from bilinear_ir.data import bm25
from bilinear_ir.studies import fidelity_experiments as experiments
from bilinear_ir.fidelity import projections
from bilinear_ir.fidelity import theory

BETA = 0.05


def _upper95(errors: int, n: int) -> float:
  return 1.0 if errors >= n else scipy.stats.beta.ppf(0.95, errors + 1, n - errors)


def test_normalized_margin_closed_form_and_sparse_form():
  q, d1, d2 = np.array([1.0, 1.0]), np.array([1.0, 0.0]), np.array([0.0, 0.5])
  assert theory.normalized_margin(q, d1, d2) == pytest.approx(0.5 / math.sqrt(2.5))
  assert theory.normalized_margin(3 * q, 2 * d1, 2 * d2) == pytest.approx(0.5 / math.sqrt(2.5))
  rng = np.random.default_rng(0)
  queries = rng.random((4, 12)) * (rng.random((4, 12)) < 0.5)
  docs = rng.random((9, 12)) * (rng.random((9, 12)) < 0.6)
  docs[5] = docs[2]  # an exact duplicate of a target: undefined margin
  targets = np.array([2, 0, 7, 2])
  got = theory.normalized_margins(sp.csr_matrix(queries), sp.csr_matrix(docs), targets)
  for i, t in enumerate(targets):
    want = theory.normalized_margin(queries[i][None], docs[t][None], docs)
    np.testing.assert_allclose(got[i], want, rtol=1e-10, equal_nan=True)
    assert np.isnan(got[i, t])
  assert np.isnan(got[0, 5]) and np.isnan(got[3, 5])


def test_bound_formulas():
  # eq. (2) at beta = .05: k* <= 8.76 (eps^2/2 - eps^3/3)^-1 (paper); eps = 1/2 gives x = 12.
  assert theory.eq2_slope(BETA) == pytest.approx(8.76, abs=0.005)
  assert theory.inverse_margin_term(0.5) == pytest.approx(12.0)
  assert theory.lemma1_k(0.5, BETA) == pytest.approx(24 * math.log(80))
  eps = np.linspace(0.01, 1.0, 50)
  k2 = theory.lemma1_k(eps, BETA)
  np.testing.assert_allclose(theory.lemma1_error_bound(eps, k2), BETA, rtol=1e-12)
  assert np.all(theory.corollary1_k(eps, BETA) >= k2)  # Corollary 1 is the looser bound
  # Lemma 2 with |D| = r0 has C = 4, i.e. eq. (3) = eq. (2); eq. (3) inverts Lemma 2's bound.
  assert theory.lemma2_k(0.3, BETA, 7, 7) == pytest.approx(theory.lemma1_k(0.3, BETA))
  k3 = theory.lemma2_k(0.3, BETA, 100, 10)
  assert theory.lemma2_failure_bound(0.3, k3, 100, 10) == pytest.approx(BETA)
  # Corollary 2 is Corollary 1 at the boolean margin floor (2 L_Q L_D)^-1/2.
  assert theory.corollary2_k(3, 5, BETA) == pytest.approx(
      theory.corollary1_k(theory.boolean_min_margin(3, 5), BETA))
  assert theory.corollary2_k(3, 5, BETA) == pytest.approx(24 * 15 * math.log(80))
  assert theory.sufficient_k(4.0).item() == 4 and theory.sufficient_k(4.0, strict=True).item() == 5
  assert theory.sufficient_k(4.2).item() == 5


def _triple_with_margin(rng, v: int, eps: float):
  """Dense (q, d1, d2) in R^v with mu(q, d1, d2) = eps exactly."""
  q = rng.normal(size=v)
  qh = q / np.linalg.norm(q)
  u = rng.normal(size=v)
  u -= (u @ qh) * qh
  u /= np.linalg.norm(u)
  d2 = rng.normal(size=v)
  d1 = d2 + 2.5 * (eps * qh + math.sqrt(1 - eps**2) * u)
  return q, d1, d2


def _pair_errors(keys, rows: np.ndarray, k: int, kind: str) -> np.ndarray:
  """[T] ranking errors <Aq, Ad2> >= <Aq, Ad1> for rows = [q, d1, d2]."""
  y = np.asarray(projections.project_batch(keys, sp.csr_matrix(rows), k, kind, block_size=128))
  return np.sum(y[:, 0] * (y[:, 2] - y[:, 1]), axis=1) >= 0


@pytest.mark.parametrize("eps", [0.3, 0.6])
def test_lemma1_random_triples_at_eq2_k(eps):
  rng = np.random.default_rng(int(eps * 10))
  rows = np.stack(_triple_with_margin(rng, 300, eps))
  assert theory.normalized_margin(*rows) == pytest.approx(eps)
  k = int(theory.sufficient_k(theory.lemma1_k(eps, BETA)))
  trials = 300
  keys = jax.random.split(jax.random.key(11), trials)
  errors = int(_pair_errors(keys, rows, k, "rademacher").sum())
  assert _upper95(errors, trials) <= BETA
  # The same check can fail: at k = 1 a Gaussian projection errs with probability
  # arccos(eps) / pi exactly (a bivariate normal with correlation eps), far above beta.
  many = jax.random.split(jax.random.key(12), 3000)
  rate = _pair_errors(many, rows, 1, "gaussian").mean()
  p = math.acos(eps) / math.pi
  assert abs(rate - p) < 4 * math.sqrt(p * (1 - p) / 3000)


REAL_DOCS = [
    "Insulin resistance in skeletal muscle precedes type 2 diabetes in obese adults.",
    "Skeletal muscle insulin signalling is impaired by fatty acid accumulation.",
    "Obesity increases the risk of type 2 diabetes and cardiovascular disease.",
    "The tumour suppressor p53 regulates apoptosis after DNA damage.",
    "Loss of p53 function accelerates tumour growth in mouse models.",
    "DNA damage activates checkpoint kinases that arrest the cell cycle.",
    "Vitamin D supplementation did not reduce fracture risk in older women.",
    "Low vitamin D levels are associated with higher fracture risk.",
    "Statins lower LDL cholesterol and reduce cardiovascular events.",
    "High LDL cholesterol is a causal risk factor for coronary heart disease.",
    "Regulatory T cells suppress autoimmune responses in the gut.",
    "Interleukin 6 drives inflammation in rheumatoid arthritis.",
    "Antibiotic exposure in infancy alters the gut microbiome.",
    "The gut microbiome influences insulin sensitivity in mice.",
    "Aspirin reduces the risk of colorectal cancer over long follow up.",
    "Colorectal cancer screening by colonoscopy lowers mortality.",
]
REAL_QUERIES = ["insulin resistance in muscle", "p53 and tumour growth",
                "vitamin D and fracture risk", "LDL cholesterol and heart disease",
                "gut microbiome and insulin"]


def test_lemma1_real_bm25_triples_through_the_job_code():
  model = bm25.BM25(tokenizer=bm25.Tokenizer(stemmer="english")).fit(REAL_DOCS)
  qv = model.query_vectors(REAL_QUERIES)
  scores = model.score(REAL_QUERIES)
  d1 = np.argmax(scores, axis=1)
  margins = theory.normalized_margins(qv, model.doc_vectors, d1)
  qi, d2 = np.nonzero(margins > 0.15)  # eq. (2) k <= ~400: cheap
  assert qi.size >= 30
  eps = margins[qi, d2]
  own_k = theory.sufficient_k(theory.lemma1_k(eps, BETA))
  grid = tuple(int(k) for k in np.unique(own_k))
  rows = sp.vstack([qv, model.doc_vectors]).tocsr()
  xb = projections.blocked(rows, 64, 16)
  nq = qv.shape[0]
  trials, errors = 100, 0
  for t in range(trials):
    y = projections.project(jax.random.key(t), xb, grid[-1], "rademacher", 64, scale=False)
    err = np.asarray(experiments.pairwise_errors(y, jnp.asarray(qi), jnp.asarray(nq + d1[qi]),
                                                 jnp.asarray(nq + d2), grid))
    errors += int(err[np.arange(len(qi)), np.searchsorted(grid, own_k)].sum())
  assert _upper95(errors, trials * len(qi)) <= BETA


def test_lemma2_recall_at_eq3_k():
  rng = np.random.default_rng(5)
  v, n, r0 = 200, 20, 3  # |D| = n - 1 docs besides d1
  q = rng.normal(size=v)
  qh = q / np.linalg.norm(q)
  target = 7
  docs = np.tile(rng.normal(size=v), (n, 1))  # every doc starts as d1, then moves away from q
  for j in range(n):
    if j != target:
      u = rng.normal(size=v)
      u -= (u @ qh) * qh
      e = rng.uniform(0.25, 0.9)
      docs[j] -= 2.0 * (e * qh + math.sqrt(1 - e**2) * u / np.linalg.norm(u))
  m = theory.normalized_margins(sp.csr_matrix(q), sp.csr_matrix(docs), [target])[0]
  others = np.sort(np.delete(m, target))
  assert others[0] > 0.2  # Lemma 2's assumption: every margin positive
  eps = others[r0 - 1]
  k = int(theory.sufficient_k(theory.lemma2_k(eps, BETA, n - 1, r0)))
  assert k < 1000
  rows = sp.csr_matrix(np.vstack([q, docs]))
  trials = 100
  keys = jax.random.split(jax.random.key(2), trials)
  ys = projections.project_batch(keys, rows, k, "rademacher", block_size=64, scale=False)
  hits = jax.vmap(lambda y: experiments.recall_hits(y, jnp.array([0]), jnp.arange(1, n + 1),
                                                    jnp.array([target]), (k,), r0))(ys)
  misses = int(np.sum(~np.asarray(hits)))
  assert _upper95(misses, trials) <= BETA


def test_corollary2_boolean_no_ranking_errors():
  rng = np.random.default_rng(8)
  v, n, l_q, l_d = 10, 20, 3, 4
  q = np.zeros(v)
  q[rng.choice(v, l_q, replace=False)] = 1
  docs = np.zeros((n, v))
  for i in range(n):
    docs[i, rng.choice(v, int(rng.integers(1, l_d + 1)), replace=False)] = 1
  s = docs @ q
  assert len(np.unique(s)) >= 3
  pairs = [(a, b) for a in range(n) for b in range(n) if s[a] > s[b]]
  # The margin floor of the proof: every strictly ordered pair has mu >= (2 L_Q L_D)^-1/2.
  mus = [theory.normalized_margin(q, docs[a], docs[b]) for a, b in pairs]
  assert min(mus) >= theory.boolean_min_margin(l_q, l_d) - 1e-12
  k = int(theory.sufficient_k(theory.corollary2_k(l_q, l_d, BETA)))
  trials = 100
  keys = jax.random.split(jax.random.key(4), trials)
  ys = np.asarray(projections.project_batch(keys, sp.csr_matrix(np.vstack([q, docs])), k,
                                            "rademacher", block_size=64))
  a, b = np.array(pairs).T
  proj = np.einsum("tk,tnk->tn", ys[:, 0], ys[:, 1:])  # [T, n] projected scores
  flawed = np.any(proj[:, a] <= proj[:, b], axis=1)  # any pairwise error in the trial
  assert _upper95(int(flawed.sum()), trials) <= BETA
