"""The late-interaction table (LITE paper 004, sections 3-4, appendix A.4) on one collection.

Every scorer sees the same frozen encoder (all-MiniLM-L6-v2): its token outputs for the
late-interaction scorers, its pooled mean embeddings for the dual-encoder baseline. This is the
paper's frozen-encoder ablation (A.4: on MS MARCO, ColBERT 0.112 vs separable LITE 0.188 MRR@10);
only the scorers' own parameters are trained.

Protocol (re-ranking, as the LITE paper's MS MARCO / NQ evaluation): each dev and test query gets
`rerank.bm25_depth` BM25 candidates plus `rerank.random_docs` docs drawn uniformly (from the
config seed) among the rest of the corpus. Unlike the paper, judged positives are NOT added: a
positive is a candidate only if BM25 or the random draw put it there, so the candidate set does
not depend on the judgements (`retrieval.candidates.rerank_candidates` never sees them) and the
metrics are those of a real two-stage system.

Rows (`config.rows`, each a name of `config.models` or "dot" / "hybrid"):
  dot        DE: dot product of the pooled mean embeddings (untrained).
  colbert    sum-max over token similarities; untrained when it has no parameters (no projection),
             trained with a token projection P -> P' otherwise.
  mebert     ME-BERT, m = 8 doc vectors, trained shared projection + LayerNorm.
  lite, lite_flat, knrm   trained on the frozen token similarities.
  hybrid     `lam * dense + (1 - lam) * BM25` (retrieval/hybrid.py) over the same candidates, for
             the dense row best on dev; lam tuned on dev.
Trained rows use cross entropy over 1 positive + BM25 hard + random + in-batch negatives
(`config.train`); the rows of `config.distill.scorers` are also trained with the distillation
losses of appendix A.2 ("kl", "margin_mse") against a teacher: BM25 (exact scores) or a bilinear
similarity trained on the pooled embeddings (the bilinear table's recipe), whichever is better on
dev (or the one `config.distill.teacher` names). Model selection uses the dev split only.

Per row: metrics, bytes per stored document (in `config.storage.dtype`) and the latency of
scoring 1 query x `config.latency.docs` stored docs (`timing`, as benchmarks/
late_interaction_latency.py), measured in the same run.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bilinear_ir import progress
from bilinear_ir import scorers
from bilinear_ir import timing
from bilinear_ir.data import embeddings as embeddings_lib
from bilinear_ir.data import pipeline
from bilinear_ir.errors import require
from bilinear_ir.jobs import common
from bilinear_ir.jobs import report
from bilinear_ir.jobs import validation
from bilinear_ir.retrieval import candidates as candidates_lib
from bilinear_ir.retrieval import hybrid
from bilinear_ir.retrieval import ranking
from bilinear_ir.scorers import multivector
from bilinear_ir.scorers import token_interaction
from bilinear_ir.train import teachers as teacher_lib
from bilinear_ir.train import trainer

TOKEN_SCORERS = ("colbert", "mebert", "lite", "lite_flat", "knrm")
TEACHERS = ("bm25", "bilinear", "best")
SPLITS = ("dev", "test")
PAPER_A4 = {"colbert": 0.112, "lite": 0.188}  # frozen encoders, MS MARCO dev MRR@10


@dataclasses.dataclass
class Setting:
  """What every row of the table is evaluated on.

  Attributes:
    prepared: collection, pooled embeddings, BM25 rankings and model.
    splitset: train / dev / test.
    tokens: token-level embeddings (queries [Q, Tq, n], docs [N, Td, n], float16 + masks).
    rows: {"dev", "test"} -> [Q_s] query rows (of `prepared.embeddings.query_ids`).
    cands: {"dev", "test"} -> [Q_s, K] candidates (`candidates.rerank_candidates`).
    bm25: {"dev", "test"} -> [Q_s, K] exact BM25 scores of the candidates.
    measures: reported measures.
  """
  prepared: pipeline.Prepared
  splitset: pipeline.SplitSet
  tokens: embeddings_lib.TokenEmbeddings
  rows: dict[str, np.ndarray]
  cands: dict[str, np.ndarray]
  bm25: dict[str, np.ndarray]
  measures: tuple[str, ...]

  def split(self, name: str) -> pipeline.Split:
    return getattr(self.splitset, name)

  def token_queries(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """([Q, Tq, n], [Q, Tq]) query tokens of query rows."""
    return self.tokens.queries[rows], self.tokens.query_mask[rows]

  @property
  def token_docs(self) -> tuple[np.ndarray, np.ndarray]:
    """([N, Td, n], [N, Td]) doc tokens."""
    return self.tokens.docs, self.tokens.doc_mask

  def evaluate(self, split: str, idx: np.ndarray, scores: np.ndarray,
               measures: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Metrics {"mean", "per_query"} of a sorted run [Q_s, K] of `split`."""
    s = self.split(split)
    return ranking.evaluate_run(s.query_ids, self.prepared.collection.doc_ids, idx, scores,
                                s.qrels, measures or self.measures)[0]


def build_setting(config: ml_collections.ConfigDict) -> Setting:
  """Loads the collection, pooled + token embeddings, BM25, splits and candidates."""
  prepared = pipeline.prepare(config)
  splitset = pipeline.splits(prepared.collection, config.data, config.seed)[0]
  enc = config.encoder
  tokens = embeddings_lib.embed_collection_tokens(
      prepared.collection, enc, query_max_length=int(enc.query_max_length),
      doc_max_length=int(enc.doc_max_length) or None)
  assert tokens.query_ids == prepared.embeddings.query_ids
  rows, cands, bm25 = {}, {}, {}
  for name in SPLITS:
    r = prepared.query_row_index(getattr(splitset, name).query_ids)
    c = candidates_lib.rerank_candidates(prepared.bm25_idx, r, prepared.collection.num_docs,
                          config.rerank.bm25_depth, config.rerank.random_docs, config.seed)
    safe = np.where(c < 0, 0, c)
    b = prepared.bm25_pair_scores(np.repeat(r, c.shape[1]), safe.reshape(-1)).reshape(c.shape)
    rows[name], cands[name], bm25[name] = r, c, np.where(c < 0, 0.0, b)
  return Setting(prepared, splitset, tokens, rows, cands, bm25, tuple(config.eval.measures))


# ----------------------------------------------------------------------------------------------
# Rows.


@dataclasses.dataclass
class Scored:
  """A dense system's re-ranking of the dev and test candidates.

  Attributes:
    run: {"dev", "test"} -> (idx [Q_s, K], scores [Q_s, K]) sorted.
    dev: dev metrics; test: test metrics {"mean", "per_query"}.
    latency_fn: the timed call of 1 query x `latency.docs` stored docs.
    stored: (vectors, width) stored per doc.
  """
  run: dict[str, tuple[np.ndarray, np.ndarray]]
  dev: dict[str, float]
  test: dict[str, Any]
  latency_fn: Callable[[], Any] | None = None
  stored: tuple[int, int] | None = None


def _model_kwargs(config, name: str) -> dict[str, Any]:
  """Registry name and options of row `name` (`config.models[name]`)."""
  opts = dict(config.models[name].to_dict())
  scorer = opts.pop("scorer")
  require(scorer in TOKEN_SCORERS, f"must be one of {TOKEN_SCORERS}, got {scorer!r}",
          field=f"models.{name}.scorer")
  opts.update(query_len=int(config.encoder.query_max_length), doc_len=_doc_len(config))
  return {"name": scorer, **opts}


def _doc_len(config) -> int:
  """Td: `encoder.doc_max_length`, else `encoder.max_length` (validate requires one)."""
  return int(config.encoder.doc_max_length or config.encoder.max_length or 0)


def build_row_model(config, name: str, dim: int):
  """(module, registry name) of row `name`."""
  kw = _model_kwargs(config, name)
  scorer = kw.pop("name")
  return scorers.build(scorer, dim=dim, **kw), scorer


def _latency_inputs(setting: Setting, config) -> tuple:
  """(q [1, Tq, n], qm [1, Tq], d [K, Td, n], dm [K, Td], doc rows [K]): the first test query and
  its first `latency.docs` candidates (its BM25 top list)."""
  r = setting.rows["test"][:1]
  k = int(config.latency.docs)
  docs = setting.cands["test"][0][:k]
  docs = docs[docs >= 0]
  q, qm = setting.token_queries(r)
  d, dm = setting.token_docs
  return (jnp.asarray(q), jnp.asarray(qm), jnp.asarray(d[docs]), jnp.asarray(dm[docs]), docs)


def score_dense(setting: Setting, module, params, feats: Callable[[np.ndarray], Any],
                d_feats: Any, latency_fn: Callable[[], Any] | None = None,
                stored: tuple[int, int] | None = None) -> Scored:
  """Re-ranks the dev and test candidates with (module, params) and evaluates them.

  Args:
    feats: query rows [Q] -> query features of `module`.
    d_feats: doc features [N, ...].
    latency_fn, stored: kept in the result (see `Scored`).
  """
  run, metrics = {}, {}
  for split in SPLITS:
    idx, scores = ranking.rerank(module, params, feats(setting.rows[split]), d_feats,
                                 setting.cands[split])
    run[split] = (idx, scores)
    metrics[split] = setting.evaluate(split, idx, scores)
  return Scored(run, metrics["dev"]["mean"], metrics["test"], latency_fn, stored)


def eval_module(module, setting: Setting):
  """The scorer for re-ranking: late-interaction scorers score all K candidates of a query in
  one chunk (`doc_chunk = K`; [1, K, Tq, L2'] intermediates), training keeps the module's own."""
  if isinstance(module, token_interaction.LateInteraction):
    return module.clone(doc_chunk=int(setting.cands["test"].shape[1]))
  return module


def train_token_model(setting: Setting, module, params, tcfg, seed: int,
                      teacher: np.ndarray | None = None) -> trainer.FitResult:
  """Fits a token scorer on the train split, selecting on dev re-ranking.

  Args:
    teacher: [Q_all, N] teacher scores (rows of `prepared.embeddings.query_ids`) for the
      distillation losses, else None.
  """
  prepared = setting.prepared
  ts, train_rows = pipeline.trainset(prepared, setting.splitset.train,
                                     tcfg.hard_depth if tcfg.hard_negatives else 0)
  sel = tcfg.select_metric
  dev_measures = tuple(sorted({sel, "ndcg@10", "mrr@10"}))

  scorer = eval_module(module, setting)

  def evaluate(p):
    idx, scores = ranking.rerank(scorer, p, setting.token_queries(setting.rows["dev"]),
                                 setting.token_docs, setting.cands["dev"])
    return setting.evaluate("dev", idx, scores, dev_measures)["mean"]

  evaluate_fn = evaluate if setting.split("dev").query_ids else None
  return trainer.fit(module, params, setting.token_queries(train_rows), setting.token_docs, ts,
                     tcfg, seed, evaluate=evaluate_fn, progress=False,
                     teacher_scores=None if teacher is None else teacher[train_rows])


def _token_row(setting: Setting, config, name: str, lat, dtype, tcfg=None,
               teacher: np.ndarray | None = None) -> tuple[Scored, dict[str, Any]]:
  """Builds, trains (if it has params) and evaluates row `name`; returns (Scored, info)."""
  module, scorer = build_row_model(config, name, setting.tokens.docs.shape[-1])
  params = jax.jit(lambda key: scorers.init_params(module, key))(jax.random.key(config.seed))
  info = {"trained": bool(jax.tree.leaves(params)), "best_step": None, "history": []}
  if info["trained"]:
    tcfg = tcfg or row_train_config(config, name)
    fit = train_token_model(setting, module, params, tcfg, config.seed, teacher)
    params = fit.params
    info.update(best_step=fit.best_step, history=fit.history, temperature=fit.temperature,
                params=int(sum(np.size(x) for x in jax.tree.leaves(params))))
  q, qm, d, dm, _ = lat
  case = timing.mebert_case if scorer == "mebert" else timing.late_case
  lat_module = module if scorer == "mebert" else module.clone(doc_chunk=int(d.shape[0]))
  fn, n_vec, width = case(lat_module, params, q, qm, d, dm, dtype)
  scored = score_dense(setting, eval_module(module, setting), params, setting.token_queries,
                       setting.token_docs, fn, (n_vec, width))
  return scored, {"scorer": scorer, **info}


def row_train_config(config, name: str) -> ml_collections.ConfigDict:
  """`config.train` with the row's overrides (`config.train_overrides[name]`)."""
  c = copy.deepcopy(config.train)
  for key, value in config.train_overrides.get(name, {}).items():
    c[key] = value
  return c


# ----------------------------------------------------------------------------------------------
# Teachers.


def bilinear_teacher(setting: Setting, config) -> tuple[np.ndarray, Any, Any]:
  """Trains `config.teacher.model` on the pooled embeddings (`jobs.common.train_and_evaluate`).

  Returns:
    ([Q_all, N] float32 teacher scores, module, params).
  """
  prepared = setting.prepared
  c = copy.deepcopy(config)
  with c.unlocked():
    c.model = copy.deepcopy(config.teacher.model)
    c.train = copy.deepcopy(config.teacher.train)
  out = common.train_and_evaluate(c, prepared, setting.splitset, progress=False)
  module = scorers.from_config(c.model, prepared.dim)
  emb = prepared.embeddings
  return (teacher_lib.scorer_teacher(module, out["params"], emb.queries, emb.docs), module,
          out["params"])


# ----------------------------------------------------------------------------------------------
# The job.


def validate(config) -> None:
  """Refuses a bad config before any work (`jobs.validation`)."""
  validation.integer(config.seed, "seed", 0)
  validation.check_data(config.data)
  validation.one_of(config.data.folds, (0,), "data.folds")
  validation.check_encoder(config.encoder)
  validation.one_of(config.encoder.kind, ("flax",), "encoder.kind")  # token outputs are needed
  require(_doc_len(config) >= 2, "set encoder.doc_max_length (Td, the doc tokens kept)",
          field="encoder.doc_max_length")
  validation.check_bm25(config.bm25)
  validation.integer(config.rerank.bm25_depth, "rerank.bm25_depth", 1)
  validation.integer(config.rerank.random_docs, "rerank.random_docs", 0)
  validation.check_train(config.train)
  for name in config.train_overrides:
    require(name in config.models, f"unknown row {name!r}", field="train_overrides")
    validation.check_train(row_train_config(config, name), f"train_overrides.{name}")
  validation.check_hybrid(config.hybrid)
  validation.check_eval(config.eval)
  validation.one_of(config.storage.dtype, ("float32", "float16", "bfloat16"), "storage.dtype")
  validation.integer(config.latency.docs, "latency.docs", 1)
  validation.integer(config.latency.repeats, "latency.repeats", 1)
  validation.integer(config.latency.rounds, "latency.rounds", 1)
  validation.one_of(config.distill.teacher, TEACHERS, "distill.teacher")
  for loss in config.distill.losses:
    validation.one_of(loss, trainer.DISTILLATION_LOSSES, "distill.losses")
  real = validation.real
  real(config.distill.teacher_temperature, "distill.teacher_temperature", 0.0, low_open=True)
  for name in config.rows:
    require(name in ("dot", "hybrid") or name in config.models,
            f"unknown row {name!r}: not 'dot', 'hybrid' or a name of config.models",
            field="rows")
  for name in config.distill.scorers:
    require(name in config.models, f"unknown model {name!r}", field="distill.scorers")
  if config.distill.scorers and config.distill.teacher in ("bilinear", "best"):
    validation.check_model(config.teacher.model, "teacher.model")
    validation.check_train(config.teacher.train, "teacher.train")
  for name in config.models:  # traces each scorer's setup (its checks) without computing
    module = build_row_model(config, name, 8)[0]
    jax.eval_shape(functools.partial(scorers.init_params, module), jax.random.key(0))


def run(config, workdir: str) -> report.Report:  # pylint: disable=unused-argument
  """The `late_interaction` job (configs/late_interaction.py)."""
  setting = build_setting(config)
  prepared = setting.prepared
  emb = prepared.embeddings
  dtype = jnp.dtype(config.storage.dtype)
  lat = _latency_inputs(setting, config)
  measures = setting.measures
  sel = config.train.select_metric
  rows: list[dict[str, Any]] = []
  dense: dict[str, Scored] = {}
  calls: dict[str, Callable[[], Any]] = {}  # row -> its timed call (timed at the end)

  def add(label: str, scorer: str, scored: Scored, **extra) -> None:
    n_vec, width = scored.stored
    rows.append({"row": label, "scorer": scorer, "mode": "rerank", "encoder": "frozen",
                 "metrics": scored.test["mean"], "dev": scored.dev,
                 "bytes_per_doc": multivector.bytes_per_doc(n_vec, width, dtype),
                 "stored": [n_vec, width], **extra})
    dense[label] = scored
    calls[label] = scored.latency_fn
    bar.write(f"{label:<28} test {measures[0]} {scored.test['mean'][measures[0]]:.4f} "
              f"(dev {sel} {scored.dev.get(sel, float('nan')):.4f})")

  # References and teachers: BM25's own order of the candidates, the trained bilinear.
  teachers = {"bm25": {"metrics": {}, "dev": {}}}
  for split in SPLITS:
    idx, scores = ranking.sort_candidates(setting.cands[split], setting.bm25[split])
    m = setting.evaluate(split, idx, scores)["mean"]
    teachers["bm25"]["metrics" if split == "test" else "dev"] = m
  teacher_scores = {}
  if config.distill.scorers and config.distill.losses:
    if config.distill.teacher in ("bilinear", "best"):
      scores, module, params = bilinear_teacher(setting, config)
      teacher_scores["bilinear"] = scores
      scored = score_dense(setting, module, params, lambda r: emb.queries[r], emb.docs)
      teachers["bilinear"] = {"metrics": scored.test["mean"], "dev": scored.dev,
                              "model": config.teacher.model.scorer}
    if config.distill.teacher in ("bm25", "best"):
      teacher_scores["bm25"] = teacher_lib.bm25_teacher(prepared)
  teacher_name = None
  if teacher_scores:
    teacher_name = (config.distill.teacher if config.distill.teacher != "best" else
                    max(teacher_scores, key=lambda t: teachers[t]["dev"][sel]))

  work = [r for r in config.rows if r != "hybrid"]
  total = len(work) + len(config.distill.scorers) * len(config.distill.losses)
  bar = progress.bar(total, "rows", unit="row")
  for name in work:
    if name == "dot":
      dot = scorers.build("dot", dim=emb.docs.shape[1])
      q, qm, _, _, docs = lat
      fn, n_vec, width = timing.de_case(q, qm, emb.docs[docs], dtype)
      add("dot", "dot", score_dense(setting, dot, {}, lambda r: emb.queries[r], emb.docs, fn,
                                    (n_vec, width)),
          trained=False, loss=None, teacher=None)
    else:
      scored, info = _token_row(setting, config, name, lat, dtype)
      add(name, info.pop("scorer"), scored, loss=config.train.loss if info["trained"] else None,
          teacher=None, **info)
    bar.update(1)
  if teacher_name is not None:  # the teacher and its temperature are the same for every row
    t = teacher_scores[teacher_name]
    teacher_temperature = float(config.distill.teacher_temperature) * teacher_lib.teacher_scale(
        t, prepared.bm25_idx, config.rerank.bm25_depth)
  for name in config.distill.scorers:
    for loss in config.distill.losses:
      tcfg = row_train_config(config, name)
      tcfg.loss = loss
      tcfg.teacher_temperature = teacher_temperature
      scored, info = _token_row(setting, config, name, lat, dtype, tcfg=tcfg, teacher=t)
      add(f"{name} ({loss}, {teacher_name})", info.pop("scorer"), scored, loss=loss,
          teacher=teacher_name, **info)
      bar.update(1)
  bar.close()

  if "hybrid" in config.rows and rows:
    row, calls[row["row"]] = hybrid_row(setting, config, rows, dense, lat, sel)
    rows.append(row)
  # Latency: every row's call, `rounds` times in turn (so load drift hits all rows alike);
  # the median over rounds of each round's median.
  times = {label: [] for label in calls}
  for _ in range(int(config.latency.rounds)):
    for label, call in calls.items():
      times[label].append(timing.timed(call, int(config.latency.repeats)))
  for row in rows:
    row["ms_1q_100d"] = float(np.median(times[row["row"]]))

  dim, doc_len = int(setting.tokens.docs.shape[-1]), _doc_len(config)
  storage = multivector.storage_table(
      dim, doc_len, [t for t in config.storage.doc_tokens if t <= doc_len],
      [p for p in config.storage.token_dims if p <= dim], config.storage.dtypes)
  results = {
      "rows": rows, "teachers": teachers, "teacher": teacher_name,
      "collection": prepared.collection.name,
      "test_queries": len(setting.splitset.test.query_ids),
      "candidates": {"bm25_depth": int(config.rerank.bm25_depth),
                     "random_docs": int(config.rerank.random_docs),
                     "positives_injected": False,
                     "recall": {s: candidates_lib.candidate_recall(
                         setting.cands[s], setting.split(s).query_ids,
                         prepared.collection.doc_ids, setting.split(s).qrels) for s in SPLITS}},
      "tokens": {"query_len": int(config.encoder.query_max_length), "doc_len": _doc_len(config),
                 "pooled_max_length": prepared.embeddings.manifest["settings"]["max_length"],
                 "dim": int(setting.tokens.docs.shape[-1]),
                 "doc_tokens_truncated": _truncated_share(setting.tokens.doc_mask)},
      "storage": storage, "storage_dtype": str(dtype.name), "hardware": timing.hardware(),
  }
  return report.Report(results=results, markdown=markdown(results, config))


def _truncated_share(mask: np.ndarray) -> float:
  """Share of docs whose last token slot is used (so the text was probably cut): [N, Td] -> ."""
  return float(np.mean(mask[:, -1]))


def hybrid_row(setting: Setting, config, rows: list[dict[str, Any]], dense: dict[str, Scored],
               lat, sel: str) -> tuple[dict[str, Any], Callable[[], Any]]:
  """The hybrid of the dense row best on dev with BM25 over the same candidates.

  Returns:
    (the row, its timed call: the dense call, BM25 scores of the same docs, the fusion).
  """
  best = max(rows, key=lambda r: r["dev"].get(sel, -np.inf))
  scored = dense[best["row"]]
  prepared = setting.prepared
  cfg = config.hybrid

  def candidates(split):
    idx, scores = scored.run[split]
    bm25_fn = lambda qi, di: prepared.bm25_pair_scores(setting.rows[split][qi], di)
    missing = lambda qi, di: np.full(len(qi), np.nan)  # never called: both lists are complete
    return hybrid.union_candidates(idx, scores, setting.cands[split], setting.bm25[split],
                                   missing, bm25_fn)

  cands = {split: candidates(split) for split in SPLITS}
  lam, _ = hybrid.tune_lambda(cands["dev"], setting.split("dev").qrels,
                              setting.split("dev").query_ids, prepared.collection.doc_ids,
                              cfg.measure, tuple(cfg.grid), cfg.normalize)
  metrics = {}
  for split in SPLITS:
    idx, scores = hybrid.rank_candidates(cands[split], lam, cfg.normalize)
    metrics[split] = setting.evaluate(split, idx, scores)["mean"]

  # Latency: the dense call, BM25 scores of the same docs, and the fusion.
  q_row = setting.rows["test"][:1]
  docs = lat[4]

  def call():
    d = np.asarray(scored.latency_fn())[0][:len(docs)]
    b = prepared.bm25_pair_scores(np.repeat(q_row, len(docs)), docs)
    c = hybrid.Candidates(np.sort(docs)[None], d[np.argsort(docs)][None].astype(np.float64),
                          b[np.argsort(docs)][None])
    return hybrid.rank_candidates(c, lam, cfg.normalize)

  bm25_bytes = int(round(prepared.bm25.doc_vectors.nnz / prepared.collection.num_docs * 8))
  return {"row": f"hybrid ({best['row']} + BM25)", "scorer": "hybrid", "mode": "rerank",
          "encoder": "frozen", "metrics": metrics["test"], "dev": metrics["dev"],
          "dense": best["row"], "lambda": lam,
          "bytes_per_doc": int(best["bytes_per_doc"]) + bm25_bytes,
          "bm25_bytes_per_doc": bm25_bytes, "trained": best.get("trained"),
          "loss": best.get("loss"), "teacher": best.get("teacher")}, call


# ----------------------------------------------------------------------------------------------
# Report.


def markdown(results: dict[str, Any], config) -> str:
  """The results table, the storage table and what the numbers show."""
  measures = list(config.eval.measures)
  cand = results["candidates"]
  tok = results["tokens"]
  out = [f"# Late interaction on {results['collection']}: frozen encoder, re-ranking "
         f"(LITE paper A.4 setting)\n\n",
         f"{results['test_queries']} test queries; per query {cand['bm25_depth']} BM25 "
         f"candidates + up to {cand['random_docs']} random docs (seed {config.seed}). Judged "
         f"positives are **not** injected (the paper adds them): a positive is a candidate "
         f"only if retrieved, so {cand['recall']['test']:.3f} of the test positives are "
         f"reachable. Tokens: Tq = {tok['query_len']}, Td = {tok['doc_len']} "
         f"({tok['doc_tokens_truncated']:.0%} of docs fill all Td slots, i.e. are cut), "
         f"n = {tok['dim']}; DE uses the pooled mean embedding of the first "
         f"{tok['pooled_max_length']} tokens. Storage in {results['storage_dtype']}; latency = "
         f"median ms to score 1 query x {config.latency.docs} stored docs (query encoder "
         f"excluded), {results['hardware']}.\n\n"]
  table = []
  for r in results["rows"]:
    table.append([r["row"], "yes" if r.get("trained") else "no", r.get("loss") or "-"]
                 + [r["metrics"][m] for m in measures]
                 + [f"{r['bytes_per_doc']:,}", f"{r['ms_1q_100d']:.2f}"])
  for name, t in results["teachers"].items():
    table.append([f"{name} (reference{', teacher' if name == results['teacher'] else ''})",
                  "yes" if name != "bm25" else "no", "-"]
                 + [t["metrics"][m] for m in measures] + ["-", "-"])
  out.append(report.markdown_table(
      table, ["row", "trained", "loss"] + measures + ["bytes/doc", "ms 1q x 100d"], digits=4))
  out.append(f"\n## Bytes per stored document (P = {tok['dim']}, L2 = {tok['doc_len']})\n\n")
  out.append(report.markdown_table(
      [[s["dtype"], s["doc_tokens"], s["token_dim"], f"{s['bytes_per_doc']:,}",
        f"{s['x_de']:.0f}x"] for s in results["storage"]],
      ["dtype", "doc tokens L2'", "token dim P'", "bytes/doc", "vs DE"]))
  out.append("\n" + findings(results, config))
  return "".join(out)


def findings(results: dict[str, Any], config) -> str:
  """What the numbers show, computed from them."""
  m = "mrr@10" if "mrr@10" in config.eval.measures else config.eval.measures[0]
  rows = {r["row"]: r for r in results["rows"]}
  lines = ["## What the numbers show\n\n"]
  if "dot" in rows:
    dot = rows["dot"]
    better = [n for n, r in rows.items() if n != "dot" and r["metrics"][m] > dot["metrics"][m]]
    lines.append(f"- DE (dot, {m} {dot['metrics'][m]:.4f}) is beaten by "
                 f"{len(better)} of {len(rows) - 1} other rows"
                 + (f" ({', '.join(better)})" if better else "") + ".\n")
  col = next((r for r in results["rows"] if r["scorer"] == "colbert" and not r["trained"]), None)
  lite = rows.get("lite")
  if col is not None and lite is not None:
    lines.append(
        f"- Frozen encoder, as appendix A.4: untrained ColBERT {col['metrics'][m]:.4f} vs "
        f"trained separable LITE {lite['metrics'][m]:.4f} {m} "
        f"({'LITE ahead' if lite['metrics'][m] > col['metrics'][m] else 'ColBERT ahead'}; the "
        f"paper, on MS MARCO: ColBERT {PAPER_A4['colbert']} vs LITE {PAPER_A4['lite']}).\n")
  distilled = [r for r in results["rows"] if r.get("teacher")]
  for r in distilled:
    base = rows.get(r["row"].split(" (")[0])
    if base is not None:
      diff = r["metrics"][m] - base["metrics"][m]
      lines.append(f"- {r['row']}: {r['metrics'][m]:.4f} {m}, {diff:+.4f} vs the same scorer "
                   f"trained with cross entropy.\n")
  if results["teacher"]:
    t = results["teachers"][results["teacher"]]
    lines.append(f"- Teacher: {results['teacher']} (chosen on dev {config.train.select_metric}: "
                 + ", ".join(f"{k} {v['dev'][config.train.select_metric]:.4f}"
                             for k, v in results["teachers"].items())
                 + f"); its test {m} {t['metrics'][m]:.4f}.\n")
  hyb = next((r for r in results["rows"] if r["scorer"] == "hybrid"), None)
  if hyb is not None:
    d = rows[hyb["dense"]]
    lines.append(f"- Hybrid of {hyb['dense']} with BM25 (lam {hyb['lambda']:.2f} on dev): "
                 f"{hyb['metrics'][m]:.4f} vs {d['metrics'][m]:.4f} dense alone and "
                 f"{results['teachers']['bm25']['metrics'][m]:.4f} BM25 alone.\n")
  trained = [r for r in results["rows"] if r.get("best_step") is not None]
  last = [r["row"] for r in trained if r["best_step"] == config.train.steps]
  if trained:
    lines.append(f"- Dev selection kept the last step ({config.train.steps}) for {len(last)} of "
                 f"{len(trained)} trained rows" + (f" ({', '.join(last)}): they may gain from "
                                                   "more steps" if last else "") + ".\n")
  if "dot" in rows:
    de_ms, de_b = rows["dot"]["ms_1q_100d"], rows["dot"]["bytes_per_doc"]
    lines.append("- Cost vs DE (latency x, storage x): " + ", ".join(
        f"{n} {r['ms_1q_100d'] / de_ms:.1f}x / {r['bytes_per_doc'] / de_b:.0f}x"
        for n, r in rows.items() if n != "dot") + ".\n")
  return "".join(lines)
