"""The re-ranking setting of late interaction (LITE paper 004): fixed candidates per query.

Each dev and test query gets `rerank.bm25_depth` BM25 candidates plus `rerank.random_docs` docs
drawn uniformly (from the config seed) among the rest of the corpus; judged positives are NOT
added (`retrieval.candidates.rerank_candidates` never sees them). Every row of a table in this
setting re-ranks the same candidates (`Setting.score`); where the collection lists each query's
own candidates (InsuranceQA), each test query's own pool is re-ranked by the same code too
(`Setting.pool_scores`, P@1 over it as `p_at_1_pool`). A token row is built, trained with the
protocol (`experiment.training.train_token_model`) and scored by `token_row`; a trained row is
then selected on dev against the untrained ColBERT (`select_over_colbert`); `table_row` trains
the table similarities on the pooled embeddings and re-ranks with the one best on dev (the token
rows' like-for-like rival). `table_rows` runs a
table's rows on one training split (`curve_settings`: one per size of a learning curve, the
learning curve's nested subsets); `compare_rows` adds the paired tests against ColBERT and dot.
The hybrid's lam is tuned on dev over the same candidates (`hybrid`, and `hybrid_row` for the
dense row best on dev); a row's scorer and training come from `config.models` /
`config.train_overrides` (`row_model`, `row_train`); `teachers` gives the references and the
distillation teachers; latencies are timed in turn (`time_in_turn`).
"""
from __future__ import annotations

import copy
import dataclasses
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bilinear_ir import scorers
from bilinear_ir import timing
from bilinear_ir.data import embeddings as embeddings_lib
from bilinear_ir.data import pipeline
from bilinear_ir.errors import require
from bilinear_ir.experiment import compare
from bilinear_ir.experiment import curve
from bilinear_ir.experiment import evaluate
from bilinear_ir.experiment import rows as rows_lib
from bilinear_ir.experiment import spec as spec_lib
from bilinear_ir.experiment import training
from bilinear_ir.experiment import validation
from bilinear_ir.retrieval import candidates as candidates_lib
from bilinear_ir.retrieval import hybrid as hybrid_lib
from bilinear_ir.retrieval import ranking
from bilinear_ir.scorers import multivector
from bilinear_ir.scorers import token_interaction
from bilinear_ir.train import teachers as teachers_lib
from bilinear_ir.train import trainer

SPLITS = ("dev", "test")
TOKEN_SCORERS = ("colbert", "mebert", "lite", "lite_flat", "knrm")
TEACHERS = ("bm25", "bilinear", "best")  # distill.teacher


@dataclasses.dataclass
class Scored:
  """A dense system's re-ranking of the dev and test candidates.

  Attributes:
    run: {"dev", "test"} -> (idx [Q_s, K], scores [Q_s, K]) sorted.
    dev: dev metrics; test: test metrics {"mean", "per_query"}.
    latency_fn: the timed call of 1 query x `latency.docs` stored docs.
    stored: (vectors, width) stored per doc.
    pool: [Q_test, M] scores of each test query's own pool (`Setting.pools`, pool order), or
      None without pools.
  """
  run: dict[str, tuple[np.ndarray, np.ndarray]]
  dev: dict[str, float]
  test: dict[str, Any]
  latency_fn: Callable[[], Any] | None = None
  stored: tuple[int, int] | None = None
  pool: np.ndarray | None = None


@dataclasses.dataclass
class Setting:
  """What every row of the table is evaluated on.

  Attributes:
    prepared: collection, pooled embeddings, BM25 rankings and model.
    splitset: train / dev / test.
    tokens: token-level embeddings (queries [Q, Tq, n], docs [N, Td, n], float16 + masks);
      the docs and their mask are one device array each (`build_setting`), which training and
      every re-ranking read without copying them again.
    rows: {"dev", "test"} -> [Q_s] query rows (of `prepared.embeddings.query_ids`).
    cands: {"dev", "test"} -> [Q_s, K] candidates (`candidates.rerank_candidates`).
    bm25: {"dev", "test"} -> [Q_s, K] exact BM25 scores of the candidates.
    measures: reported measures.
    pools: [Q_test, M] each test query's own pool (`evaluate.candidate_pools`: its gold docs
      and the negatives the collection lists for it), or None when the collection lists none.
    seed: the seed of the candidates' random docs (`config.seed`).
  """
  prepared: pipeline.Prepared
  splitset: pipeline.SplitSet
  tokens: embeddings_lib.TokenEmbeddings
  rows: dict[str, np.ndarray]
  cands: dict[str, np.ndarray]
  bm25: dict[str, np.ndarray]
  measures: tuple[str, ...]
  pools: np.ndarray | None = None
  seed: int = 0

  def split(self, name: str) -> pipeline.Split:
    return getattr(self.splitset, name)

  def token_queries(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """([Q, Tq, n], [Q, Tq]) query tokens of query rows."""
    return self.tokens.queries[rows], self.tokens.query_mask[rows]

  @property
  def token_docs(self) -> tuple[np.ndarray, np.ndarray]:
    """([N, Td, n], [N, Td]) doc tokens."""
    return self.tokens.docs, self.tokens.doc_mask

  def pooled_queries(self, rows: np.ndarray) -> np.ndarray:
    """[Q, n] pooled query embeddings of query rows."""
    return self.prepared.embeddings.queries[rows]

  def evaluate(self, split: str, idx: np.ndarray, scores: np.ndarray,
               measures: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Metrics {"mean", "per_query"} of a sorted run [Q_s, K] of `split`."""
    s = self.split(split)
    return evaluate.evaluate_run(s.query_ids, self.prepared.collection.doc_ids, idx, scores,
                                 s.qrels, measures or self.measures)[0]

  def eval_module(self, module):
    """The scorer for re-ranking: late-interaction scorers score all K candidates of a query in
    one chunk (`doc_chunk = K`; [1, K, Tq, L2'] intermediates), training keeps the module's own."""
    if isinstance(module, token_interaction.LateInteraction):
      return module.clone(doc_chunk=int(self.cands["test"].shape[1]))
    return module

  def rerank(self, split: str, module, params, feats: Callable[[np.ndarray], Any], d_feats: Any,
             measures: tuple[str, ...] | None = None) -> tuple[tuple, dict[str, Any]]:
    """((idx, scores) [Q_s, K] sorted, metrics) of `split`'s candidates re-ranked by
    (module, params); `feats`: query rows [Q] -> query features, `d_feats`: [N, ...]."""
    idx, scores = ranking.rerank(module, params, feats(self.rows[split]), d_feats,
                                 self.cands[split])
    return (idx, scores), self.evaluate(split, idx, scores, measures)

  def score(self, module, params, feats: Callable[[np.ndarray], Any], d_feats: Any,
            latency_fn: Callable[[], Any] | None = None,
            stored: tuple[int, int] | None = None) -> Scored:
    """Re-ranks the dev and test candidates with (module, params) and evaluates them
    (`latency_fn`, `stored`: kept in the result, see `Scored`); with `pools`, also each test
    query's own pool (`pool_scores`), its P@1 as the test metric "p_at_1_pool"."""
    run, metrics = {}, {}
    for split in SPLITS:
      run[split], metrics[split] = self.rerank(split, module, params, feats, d_feats)
    pool = None
    if self.pools is not None:
      pool = self.pool_scores(module, params, feats, d_feats)
      metrics["test"]["mean"]["p_at_1_pool"] = evaluate.pool_p_at_1(
          self.prepared, self.split("test"), self.pools, 1.0, pool_scores=pool)["mean"]
    return Scored(run, metrics["dev"]["mean"], metrics["test"], latency_fn, stored, pool)

  def pool_scores(self, module, params, feats: Callable[[np.ndarray], Any], d_feats: Any
                  ) -> np.ndarray:
    """[Q_test, M] scores of each test query's own pool (`pools`, -inf on padding), in pool
    order: re-ranked by the code that re-ranks the candidates (`retrieval.ranking.rerank`), then
    put back in the pool's ascending doc-row order."""
    idx, scores = ranking.rerank(module, params, feats(self.rows["test"]), d_feats, self.pools)
    order = np.argsort(np.where(idx < 0, np.iinfo(np.int64).max, idx), axis=1, kind="stable")
    return np.take_along_axis(scores, order, 1)

  def describe(self, rerank_cfg, query_len: int, doc_len: int) -> dict[str, Any]:
    """The setting as results state it: {"candidates": how they were drawn and the share of
    each split's judged positives among them (`candidates.candidate_recall`), whether any
    judged positive is a candidate the draw did not give (`candidates.injected_positives`
    against `candidates.rerank_candidates` redrawn), "tokens": Tq, Td,
    the pooled embeddings' max length, n, the share of docs filling all Td slots (cut)}."""
    doc_ids = self.prepared.collection.doc_ids
    return {
        "candidates": {"bm25_depth": int(rerank_cfg.bm25_depth),
                       "random_docs": int(rerank_cfg.random_docs),
                       "positives_injected": any(candidates_lib.injected_positives(
                           self.cands[s], candidates_lib.rerank_candidates(
                               self.prepared.bm25_idx, self.rows[s], len(doc_ids),
                               rerank_cfg.bm25_depth, rerank_cfg.random_docs, self.seed),
                           self.split(s).query_ids, doc_ids, self.split(s).qrels)
                                             for s in SPLITS),
                       "recall": {s: candidates_lib.candidate_recall(
                           self.cands[s], self.split(s).query_ids, doc_ids, self.split(s).qrels)
                                  for s in SPLITS}},
        "tokens": {"query_len": query_len, "doc_len": doc_len,
                   "pooled_max_length": self.prepared.embeddings.manifest["settings"]["max_length"],
                   "dim": int(self.tokens.docs.shape[-1]),
                   "doc_tokens_truncated": float(np.mean(self.tokens.doc_mask[:, -1]))}}


def check_blocks(config: ml_collections.ConfigDict) -> None:
  """The blocks this setting reads besides the shared ones (`experiment.validation`): `rerank`
  (candidates), `latency` (timed calls), `distill` and, when it distils from a trained table
  scorer, `teacher`. Raises `InputError` naming the field."""
  validation.integer(config.rerank.bm25_depth, "rerank.bm25_depth", 1)
  validation.integer(config.rerank.random_docs, "rerank.random_docs", 0)
  validation.integer(config.latency.docs, "latency.docs", 1)
  validation.integer(config.latency.repeats, "latency.repeats", 1)
  validation.integer(config.latency.rounds, "latency.rounds", 1)
  validation.one_of(config.distill.teacher, TEACHERS, "distill.teacher")
  for loss in config.distill.losses:
    validation.one_of(loss, trainer.DISTILLATION_LOSSES, "distill.losses")
  validation.real(config.distill.teacher_temperature, "distill.teacher_temperature", 0.0,
                  low_open=True)
  for name in config.distill.scorers:
    require(name in config.models, f"unknown model {name!r}", field="distill.scorers")
  if config.distill.scorers and config.distill.teacher in ("bilinear", "best"):
    validation.check_model(config.teacher.model, "teacher.model")
    validation.check_train(config.teacher.train, "teacher.train")
  if "table" in config.rows:
    require(len(config.table.models) > 0, "must name at least one table similarity",
            field="table.models")
    for label, model in config.table.models.items():
      validation.check_model(model, f"table.models.{label}")
    validation.check_train(config.table.train, "table.train")


def build_setting(config: ml_collections.ConfigDict,
                  data: ml_collections.ConfigDict | None = None) -> Setting:
  """Loads the collection, pooled + token embeddings, BM25, splits, candidates and the test
  queries' own pools (`data` (default `config.data`), `encoder`, `bm25`, `rerank`, `seed` and
  `eval.measures` of `config`)."""
  data = config.data if data is None else data
  prepared = pipeline.prepare(ml_collections.ConfigDict(
      {"data": data, "encoder": config.encoder, "bm25": config.bm25}))
  splitset = pipeline.splits(prepared.collection, data, config.seed)[0]
  enc = config.encoder
  tokens = embeddings_lib.embed_collection_tokens(
      prepared.collection, enc, query_max_length=int(enc.query_max_length),
      doc_max_length=int(enc.doc_max_length) or None)
  assert tokens.query_ids == prepared.embeddings.query_ids
  # The doc tokens go to the device once (InsuranceQA: 2.7 GB): `fit`'s `device_put` and
  # `ranking.rerank`'s `jnp.asarray` of an array already there copy nothing, where each used to
  # make its own copy of the host array.
  tokens = dataclasses.replace(tokens, docs=jax.device_put(tokens.docs),
                               doc_mask=jax.device_put(tokens.doc_mask))
  rows, cands, bm25 = {}, {}, {}
  for name in SPLITS:
    r = prepared.query_row_index(getattr(splitset, name).query_ids)
    c = candidates_lib.rerank_candidates(prepared.bm25_idx, r, prepared.collection.num_docs,
                                         config.rerank.bm25_depth, config.rerank.random_docs,
                                         config.seed)
    safe = np.where(c < 0, 0, c)
    b = prepared.bm25_pair_scores(np.repeat(r, c.shape[1]), safe.reshape(-1)).reshape(c.shape)
    rows[name], cands[name], bm25[name] = r, c, np.where(c < 0, 0.0, b)
  return Setting(prepared, splitset, tokens, rows, cands, bm25, tuple(config.eval.measures),
                 evaluate.candidate_pools(prepared, splitset.test), int(config.seed))


def curve_settings(setting: Setting, sizes, seed: int) -> dict[int, Setting]:
  """{n: `setting` training on n queries}: the learning curve's nested subsets of the training
  split (`curve.nested_subsets` by `seed`, `curve.subset_splitset`: dev and test whole); empty
  `sizes` = the whole training split only."""
  train = setting.splitset.train.query_ids
  subsets = curve.nested_subsets(train, sizes or (len(train),), seed)
  return {n: dataclasses.replace(setting, splitset=curve.subset_splitset(setting.splitset, q, n))
          for n, q in subsets.items()}


def _model_kwargs(config, name: str) -> dict[str, Any]:
  """Registry name and options of row `name` (`config.models[name]`)."""
  opts = dict(config.models[name].to_dict())
  scorer = opts.pop("scorer")
  require(scorer in TOKEN_SCORERS, f"must be one of {TOKEN_SCORERS}, got {scorer!r}",
          field=f"models.{name}.scorer")
  opts.update(query_len=int(config.encoder.query_max_length), doc_len=doc_len(config))
  return {"name": scorer, **opts}


def doc_len(config) -> int:
  """Td: `encoder.doc_max_length`, else `encoder.max_length` (validate requires one)."""
  return int(config.encoder.doc_max_length or config.encoder.max_length or 0)


def row_model(config, name: str, dim: int):
  """(module, registry name) of row `name`."""
  kw = _model_kwargs(config, name)
  scorer = kw.pop("name")
  return scorers.build(scorer, dim=dim, **kw), scorer


def row_train(config, name: str) -> ml_collections.ConfigDict:
  """`config.train` with the row's overrides (`config.train_overrides[name]`)."""
  c = copy.deepcopy(config.train)
  for key, value in config.train_overrides.get(name, {}).items():
    c[key] = value
  return c


def latency_inputs(setting: Setting, docs: int) -> tuple:
  """(q [1, Tq, n], qm [1, Tq], d [K, Td, n], dm [K, Td], doc rows [K]): the first test query and
  its first `docs` candidates (its BM25 top list)."""
  r = setting.rows["test"][:1]
  rows = setting.cands["test"][0][:docs]
  rows = rows[rows >= 0]
  q, qm = setting.token_queries(r)
  d, dm = setting.token_docs
  return (jnp.asarray(q), jnp.asarray(qm), jnp.asarray(d[rows]), jnp.asarray(dm[rows]), rows)


def token_row(setting: Setting, module, scorer: str, tcfg, seed: int, lat: tuple, dtype,
              teacher: teachers_lib.Teacher | None = None,
              checkpoint_dir: str | None = None) -> tuple[Scored, dict[str, Any]]:
  """Initialises (by `seed`), trains if it has params (`training.train_token_model` with the
  `train` block `tcfg`, checkpointing in `checkpoint_dir`) and scores one token row; its
  latency call scores `lat` (`latency_inputs`) in `dtype`.

  Returns:
    (Scored, {"trained", "best_step", "history"[, "temperature", "skipped_steps", "params",
     "train_seconds"]}).
  """
  params = jax.jit(lambda key: scorers.init_params(module, key))(jax.random.key(seed))
  info = {"trained": bool(jax.tree.leaves(params)), "best_step": None, "history": []}
  if info["trained"]:
    started = time.perf_counter()
    fit = training.train_token_model(setting, module, params, tcfg, seed, teacher,
                                     checkpoint_dir)
    params = fit.params
    info.update(best_step=fit.best_step, history=fit.history, temperature=fit.temperature,
                skipped_steps=fit.skipped_steps,
                params=int(sum(np.size(x) for x in jax.tree.leaves(params))),
                train_seconds=round(time.perf_counter() - started, 1))
  q, qm, d, dm, _ = lat
  case = timing.mebert_case if scorer == "mebert" else timing.late_case
  lat_module = module if scorer == "mebert" else module.clone(doc_chunk=int(d.shape[0]))
  fn, n_vec, width = case(lat_module, params, q, qm, d, dm, dtype)
  scored = setting.score(setting.eval_module(module), params, setting.token_queries,
                         setting.token_docs, fn, (n_vec, width))
  return scored, info


def table_row(setting: Setting, config, lat: tuple, dtype, n_train: int,
              workdir: str | None = None) -> tuple[Scored, dict[str, Any]]:
  """The "table" row: the table similarity (`config.table.models`: full W, low rank, ...) best
  on dev, each trained on the pooled embeddings of the training split by the table recipe
  (`training.train_and_evaluate` with `config.table.train`, its dev selection over the full
  corpus as the learning curve's; checkpointed under `workdir`), re-ranking the same candidates
  as every token row. The docs are stored as for dot (pooled vectors); the table is applied at
  query time (`timing.de_case` with the module).

  Returns:
    (its Scored, {"scorer", "trained", "best_step", "model": the chosen label, "train_seconds",
     "table_dev": {label: its dev `select_metric` in this setting}}).
  """
  prepared, sel = setting.prepared, config.train.select_metric
  q, qm, _, _, docs = lat
  runs = []
  for label, model in config.table.models.items():
    row = spec_lib.Row(model, config.table.train, config.eval, config.encoder, config.seed)
    started = time.perf_counter()
    out = training.train_and_evaluate(
        row, prepared, setting.splitset, progress=False,
        workdir=training.run_dir(workdir, row, prepared, setting.splitset,
                                 f"table-{label}-n{n_train}"))
    module = scorers.from_config(model, prepared.dim)
    fn, n_vec, width = timing.de_case(q, qm, prepared.embeddings.docs[docs], dtype, module,
                                      out["params"])
    scored = setting.score(module, out["params"], setting.pooled_queries,
                           prepared.embeddings.docs, fn, (n_vec, width))
    runs.append((label, scored, {"scorer": model.scorer, "trained": True,
                                 "best_step": out["best_step"],
                                 "train_seconds": round(time.perf_counter() - started, 1)}))
  label, scored, info = rows_lib.best_on_dev(runs, lambda r: r[1].dev.get(sel))
  return scored, {**info, "model": label,
                  "table_dev": {lab: s.dev.get(sel) for lab, s, _ in runs}}


def hybrid(setting: Setting, scored: Scored, cfg, docs: np.ndarray
           ) -> tuple[float, dict[str, dict[str, Any]], Callable[[], Any]]:
  """The dev-chosen hybrid of a dense row with BM25 over the same candidates.

  Args:
    scored: the dense row's re-ranking.
    cfg: `config.blocks.hybrid_config()`.
    docs: [K] doc rows of the latency call (`latency_inputs`).

  Returns:
    (lam, {"dev": mean metrics, "test": {"mean", "per_query"}} (with `pools`, the test mean
    holds "p_at_1_pool": the same fusion over each test query's own pool), its timed call: the
    dense call, BM25 scores of the same docs, the fusion).
  """
  prepared = setting.prepared

  def candidates(split):
    idx, scores = scored.run[split]
    bm25_fn = lambda qi, di: prepared.bm25_pair_scores(setting.rows[split][qi], di)
    missing = lambda qi, di: np.full(len(qi), np.nan)  # never called: both lists are complete
    return hybrid_lib.union_candidates(idx, scores, setting.cands[split], setting.bm25[split],
                                       missing, bm25_fn)

  cands = {split: candidates(split) for split in SPLITS}
  lam, ranked = evaluate.tune_on_dev(cands["dev"], setting.split("dev"),
                                     [cands[s] for s in SPLITS], prepared.collection.doc_ids, cfg)
  metrics = {s: setting.evaluate(s, *r) for s, r in zip(SPLITS, ranked)}
  metrics["dev"] = metrics["dev"]["mean"]
  if scored.pool is not None:
    metrics["test"]["mean"]["p_at_1_pool"] = evaluate.pool_p_at_1(
        prepared, setting.split("test"), setting.pools, lam, cfg.normalize,
        pool_scores=scored.pool)["mean"]
  q_row = setting.rows["test"][:1]

  def call():
    d = np.asarray(scored.latency_fn())[0][:len(docs)]
    b = prepared.bm25_pair_scores(np.repeat(q_row, len(docs)), docs)
    c = hybrid_lib.Candidates(np.sort(docs)[None], d[np.argsort(docs)][None].astype(np.float64),
                              b[np.argsort(docs)][None])
    return hybrid_lib.rank_candidates(c, lam, cfg.normalize)

  return lam, metrics, call


def hybrid_row(setting: Setting, config, rows: list[dict[str, Any]],
               dense: dict[str, Scored], lat) -> tuple[dict[str, Any], Callable[[], Any]]:
  """The hybrid of the dense row best on dev with BM25 over the same candidates
  (`hybrid`): (the row, its timed call)."""
  sel = config.train.select_metric
  best = rows_lib.best_on_dev(rows, lambda r: r["dev"].get(sel))
  lam, metrics, call = hybrid(setting, dense[best["row"]], config.hybrid, lat[4])
  prepared = setting.prepared
  bm25_bytes = int(round(prepared.bm25.doc_vectors.nnz / prepared.collection.num_docs * 8))
  return {"row": f"hybrid ({best['row']} + BM25)", "scorer": "hybrid", "mode": "rerank",
          "encoder": "frozen", "collection": best["collection"], "n_train": best["n_train"],
          "metrics": metrics["test"]["mean"], "dev": metrics["dev"],
          "per_query": _per_query(metrics["test"], setting.measures[0]),
          "dense": best["row"], "lambda": lam,
          "bytes_per_doc": int(best["bytes_per_doc"]) + bm25_bytes,
          "bm25_bytes_per_doc": bm25_bytes, "trained": best.get("trained"),
          "loss": best.get("loss"), "teacher": best.get("teacher")}, call


def row_line(row: dict[str, Any], measure: str, sel: str) -> str:
  """The line a row's result prints: its test `measure` and dev `sel`; for a trained row also its
  best step, training seconds and any updates skipped for a non-finite gradient, and where dev
  kept ColBERT its own model's values (so a run stopped before its results file still shows
  them)."""
  line = (f"{row['row']:<28} n={row['n_train']} test {measure} {row['metrics'][measure]:.4f} "
          f"(dev {sel} {row['dev'].get(sel, float('nan')):.4f})")
  if row.get("best_step") is not None:
    line += f", best step {row['best_step']}, train {row.get('train_seconds', 0.0):.1f} s"
  if row.get("skipped_steps"):
    line += f", {row['skipped_steps']} updates skipped (non-finite gradient)"
  if row.get("kept_colbert"):
    line += (f"; kept ColBERT, own model: test {row['model_metrics'][measure]:.4f} "
             f"(dev {row['model_dev'].get(sel, float('nan')):.4f})")
  return line


def _per_query(test: dict[str, Any], measure: str) -> dict[str, float]:
  """{qid: `measure`} of test metrics {"mean", "per_query"}."""
  return {q: float(v[measure]) for q, v in test["per_query"].items()}


def select_over_colbert(trained: Scored, colbert: Scored, sel: str) -> tuple[Scored, bool]:
  """The protocol's choice for a trained token row: the untrained ColBERT is a candidate of its
  dev selection. The trained model (its best step on dev) is kept only if its dev `sel` beats
  ColBERT's; a tie, or no dev split, keeps ColBERT (`rows.best_on_dev`, ColBERT first).

  Returns:
    (the chosen `Scored`, True when it is ColBERT's).
  """
  chosen = rows_lib.best_on_dev([colbert, trained], lambda s: s.dev.get(sel))
  return chosen, chosen is colbert


def table_rows(setting: Setting, config, lat: tuple, dtype, n_train: int, bar,
               workdir: str | None = None
               ) -> tuple[list[dict[str, Any]], dict[str, Callable[[], Any]], dict[str, Any]]:
  """The rows of a late-interaction table (`config.rows`, then the distillation rows of
  `config.distill`, then the hybrid) on the training split of `setting`.

  Every row re-ranks the same candidates; a trained token row is selected on dev against the
  untrained ColBERT (`select_over_colbert`): when ColBERT is kept, the row's metrics, dev and
  per-query values are ColBERT's ("kept_colbert": true) and its own model's are in
  "model_metrics" / "model_dev"; "bytes_per_doc" and its timed call are always its own model's.

  Args:
    lat: `latency_inputs`; dtype: the storage dtype; n_train: training queries (in the rows);
    bar: a progress bar (`progress.bar`), one update per row.
    workdir: each trained row (and the bilinear teacher) checkpoints in its own folder under
      it (`training.run_dir`), so a killed job's rerun resumes; None: no checkpoints.

  Returns:
    (rows, {row label: its timed call}, {"teachers": references, "teacher": the teacher used}
     (`teachers`)).
  """
  prepared, measures = setting.prepared, setting.measures
  sel = config.train.select_metric
  dim = int(setting.tokens.docs.shape[-1])
  rows: list[dict[str, Any]] = []
  dense: dict[str, Scored] = {}
  base = {"mode": "rerank", "encoder": "frozen", "collection": prepared.collection.name,
          "n_train": int(n_train)}

  def add(label: str, scorer: str, scored: Scored, **extra) -> None:
    n_vec, width = scored.stored
    rows.append({"row": label, "scorer": scorer, **base, "metrics": scored.test["mean"],
                 "dev": scored.dev, "per_query": _per_query(scored.test, measures[0]),
                 "bytes_per_doc": multivector.bytes_per_doc(n_vec, width, dtype),
                 "stored": [n_vec, width], **extra})
    dense[label] = scored
    bar.write(row_line(rows[-1], measures[0], sel))
    bar.update(1)

  def one(name: str, tcfg, teacher=None, label=None) -> tuple[Scored, dict[str, Any]]:
    module, scorer = row_model(config, name, dim)
    identity = {"model": config.models[name].to_dict(), "train": tcfg.to_dict(),
                "encoder": config.encoder.to_dict(), "rerank": config.rerank.to_dict(),
                "seed": int(config.seed),
                "teacher": None if teacher is None else [teacher_name, config.teacher.to_dict()]}
    folder = training.run_dir(workdir, identity, prepared, setting.splitset,
                              f"{label or name}-n{n_train}")
    scored, info = token_row(setting, module, scorer, tcfg, config.seed, lat, dtype, teacher,
                             folder)
    if info["trained"]:
      chosen, kept = select_over_colbert(scored, colbert, sel)
      info.update(kept_colbert=kept, model_metrics=scored.test["mean"], model_dev=scored.dev)
      scored = dataclasses.replace(chosen, latency_fn=scored.latency_fn, stored=scored.stored)
    return scored, {"scorer": scorer, **info}

  colbert, colbert_info = one("colbert", row_train(config, "colbert"))  # untrained (validate)
  refs, teacher_by_name, teacher_name = teachers(setting, config, workdir)
  for name in (r for r in config.rows if r != "hybrid"):
    if name == "dot":
      dot = scorers.build("dot", dim=prepared.embeddings.docs.shape[1])
      q, qm, _, _, docs = lat
      fn, n_vec, width = timing.de_case(q, qm, prepared.embeddings.docs[docs], dtype)
      add("dot", "dot", setting.score(dot, {}, setting.pooled_queries, prepared.embeddings.docs,
                                      fn, (n_vec, width)), trained=False, loss=None, teacher=None)
    elif name == "table":
      scored, info = table_row(setting, config, lat, dtype, n_train, workdir)
      add("table", info.pop("scorer"), scored, loss=config.table.train.loss, teacher=None,
          **info)
    else:
      scored, info = ((colbert, dict(colbert_info)) if name == "colbert" else
                      one(name, row_train(config, name)))
      add(name, info.pop("scorer"), scored, loss=config.train.loss if info["trained"] else None,
          teacher=None, **info)
  if teacher_name is not None:  # the teacher and its temperature are the same for every row
    t = teacher_by_name[teacher_name]
    teacher_temperature = float(config.distill.teacher_temperature) * teachers_lib.teacher_scale(
        t, prepared.bm25_idx, config.rerank.bm25_depth, prepared.collection.num_docs)
  for name in config.distill.scorers:
    for loss in config.distill.losses:
      tcfg = row_train(config, name)
      tcfg.loss = loss
      tcfg.teacher_temperature = teacher_temperature
      scored, info = one(name, tcfg, teacher=t, label=f"{name}-{loss}-{teacher_name}")
      add(f"{name} ({loss}, {teacher_name})", info.pop("scorer"), scored, loss=loss,
          teacher=teacher_name, **info)
  calls = {label: scored.latency_fn for label, scored in dense.items()}
  if "hybrid" in config.rows and rows:
    row, calls[row["row"]] = hybrid_row(setting, config, rows, dense, lat)
    rows.append(row)
  return rows, calls, {"teachers": refs, "teacher": teacher_name}


def compare_rows(rows: list[dict[str, Any]], config) -> None:
  """`row["vs_colbert"]` and `row["vs_dot"]`: each row against the untrained ColBERT row and
  the dot row of the same n, and `row["vs_table"]` against the "table" row where the table has
  one, paired over the test queries (`row["per_query"]`, `eval.stats.paired`); each baseline's
  comparisons, over every row and n of the table, are one Holm family
  (`experiment.compare.against_baselines`)."""
  table = ("table",) if any(r["row"] == "table" for r in rows) else ()
  compare.against_baselines(rows, [r["per_query"] for r in rows], ("n_train",), config,
                            name="row", baselines=("colbert", "dot") + table)


def teachers(setting: Setting, config: ml_collections.ConfigDict, workdir: str | None = None
             ) -> tuple[dict[str, dict[str, Any]], dict[str, teachers_lib.Teacher], str | None]:
  """The references and distillation teachers: BM25's own order of the candidates, and, when
  `config.distill` distils, the table scorer `config.teacher` (model, train) trained on the
  pooled embeddings (`training.scorer_teacher`; it checkpoints in its own folder under
  `workdir`, `training.run_dir`).

  Returns:
    ({name: {"metrics", "dev"[, "model"]}} of each reference, {name: its teacher
     (`train.teachers`), scoring rows of `prepared.embeddings`},
     the teacher used: `distill.teacher`, or for "best" the one best on dev; None without
     distillation).
  """
  prepared = setting.prepared
  refs = {"bm25": {"metrics": {}, "dev": {}}}
  for split in SPLITS:
    idx, scores = ranking.sort_candidates(setting.cands[split], setting.bm25[split])
    refs["bm25"]["metrics" if split == "test" else "dev"] = setting.evaluate(split, idx,
                                                                             scores)["mean"]
  if setting.pools is not None:  # BM25 alone over each test query's own pool (lam = 0)
    refs["bm25"]["metrics"]["p_at_1_pool"] = evaluate.pool_p_at_1(
        prepared, setting.split("test"), setting.pools, 0.0)["mean"]
  out = {}
  distill = config.distill
  if distill.scorers and distill.losses:
    if distill.teacher in ("bilinear", "best"):
      row = spec_lib.Row(config.teacher.model, config.teacher.train, config.eval,
                         config.encoder, config.seed)
      teacher, module, params = training.scorer_teacher(
          row, prepared, setting.splitset,
          training.run_dir(workdir, row, prepared, setting.splitset, "teacher-bilinear"))
      out["bilinear"] = teacher
      scored = setting.score(module, params, setting.pooled_queries, prepared.embeddings.docs)
      refs["bilinear"] = {"metrics": scored.test["mean"], "dev": scored.dev,
                          "model": config.teacher.model.scorer}
    if distill.teacher in ("bm25", "best"):
      out["bm25"] = teachers_lib.bm25_teacher(prepared)
  name = None
  if out:
    sel = config.train.select_metric
    name = (distill.teacher if distill.teacher != "best" else
            rows_lib.best_on_dev(list(out), lambda t: refs[t]["dev"].get(sel)))
  return refs, out, name


def time_in_turn(calls: dict[str, Callable[[], Any]], rounds: int, repeats: int
                 ) -> dict[str, float]:
  """{label: ms}: every call timed `repeats` times (`timing.timed`) in turn, `rounds`
  times (so load drift hits all alike); the median over rounds of each round's median."""
  times = {label: [] for label in calls}
  for _ in range(int(rounds)):
    for label, call in calls.items():
      times[label].append(timing.timed(call, int(repeats)))
  return {label: float(np.median(t)) for label, t in times.items()}
