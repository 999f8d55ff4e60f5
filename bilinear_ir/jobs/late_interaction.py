"""The late-interaction table (LITE paper 004, sections 3-4, appendix A.4) on one collection.

Every scorer sees the same frozen encoder (all-MiniLM-L6-v2): its token outputs for the
late-interaction scorers, its pooled mean embeddings for the dual-encoder baseline. This is the
paper's frozen-encoder ablation (A.4: on MS MARCO, ColBERT 0.112 vs separable LITE 0.188 MRR@10);
only the scorers' own parameters are trained.

Collection (`config.collection`, read as the learning_curve job reads it): scifact, insuranceqa
or a BEIR folder / zip with a train split; its official dev split selects where it has one, else
a dev part carved out of train. With `config.sizes`, the table is run once per n on the learning
curve's nested subsets of the training queries (`studies.curve_subsets`, drawn by the seed); dev and
test stay whole.

Protocol (re-ranking, as the LITE paper's MS MARCO / NQ evaluation): each dev and test query gets
`rerank.bm25_depth` BM25 candidates plus `rerank.random_docs` docs drawn uniformly (from the
config seed) among the rest of the corpus. Unlike the paper, judged positives are NOT added: a
positive is a candidate only if BM25 or the random draw put it there, so the candidate set does
not depend on the judgements (`retrieval.candidates.rerank_candidates` never sees them) and the
metrics are those of a real two-stage system. Where the collection lists negatives per query
(InsuranceQA), each test question is also re-ranked over its own pool (gold + listed negatives):
P@1 as `p_at_1_pool`.

Rows (`config.rows`, each a name of `config.models` or one of `ROWS`):
  dot        DE: dot product of the pooled mean embeddings (untrained).
  bm25       BM25's own order of the candidates (their exact scores; the first stage itself).
  table      the table similarity best on dev among `config.table.models` (full W, I + P Q^T),
             trained on the pooled embeddings by the learning curve's recipe: the token rows'
             like-for-like rival (`studies.late_interaction.rows.table_row`); every row is also
             compared with it ("vs_table").
  colbert    sum-max over the raw token similarities: untrained (the protocol's candidate);
             colbert_proj adds a trained token projection P -> P'.
  mebert     ME-BERT, m = 8 doc vectors, trained shared projection + LayerNorm.
  lite, lite_flat, knrm   trained on the frozen token similarities.
  de_ft, mebert_ft, colbert_ft, lite_ft   (not default rows: the encoder trains) DE, ME-BERT,
             ColBERT with a trained projection and separable LITE, each trained jointly with the
             encoder (`config.finetune` + the model's "finetune" changes; two_tower); qt_ft: DE
             with the query tower only trained (query_tower: the index never changes); selected on
             dev every `finetune.eval_every` steps (step 0 a candidate; not against ColBERT),
             the candidate docs encoded again with the tuned weights
             (`studies.late_interaction.finetuned`); each is also a baseline of the paired tests
             ("vs_<row>"), and carries "finetune": {mode, steps, seconds, device,
             reindex_seconds}. With de_ft (the two-tower fine-tune), every row carries
             "recovered": {"all", "unseen": its fraction of de_ft's gain over dot}, the
             finetune job's column on these candidates.
  hybrid     `lam * dense + (1 - lam) * BM25` (retrieval/hybrid.py) over the same candidates, for
             the dense row best on dev; lam tuned on dev.
Trained rows use cross entropy over 1 positive + BM25 (InsuranceQA: listed) hard + random +
in-batch negatives (`config.train`); the rows of `config.distill.scorers` are also trained with
the distillation losses of appendix A.2 ("kl", "margin_mse") against a teacher: BM25 (exact
scores) or a bilinear similarity trained on the pooled embeddings (the bilinear table's recipe),
whichever is better on dev (or the one `config.distill.teacher` names). Model selection uses the
dev split only, with the untrained ColBERT as a candidate of every trained row
(`studies.late_interaction.rows.select_over_colbert`: "kept_colbert"). Every row is compared per
test query with colbert and dot ("vs_colbert", "vs_dot"; Holm per baseline over all rows and n).

Per row: metrics, per-query nDCG@10, bytes per stored document (in `config.storage.dtype`) and
the latency of scoring 1 query x `config.latency.docs` stored docs (`timing`, as benchmarks/
late_interaction_latency.py), measured in the same run; "unseen": its mean over the test queries
whose gold docs no training query of its n has (`studies.curve_subsets.unseen_answer_queries`,
the finetune job's view), against dot per query (one Holm family).
"""
from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp

from bilinear_ir import progress
from bilinear_ir import scorers
from bilinear_ir import timing
from bilinear_ir.data import embeddings
from bilinear_ir.errors import require
from bilinear_ir.experiment import spec as spec_lib
from bilinear_ir.experiment import validation
from bilinear_ir.report import late_interaction as report
from bilinear_ir.report import outputs
from bilinear_ir.scorers import multivector
from bilinear_ir.studies import curve_subsets as curve
from bilinear_ir.studies.late_interaction import checks
from bilinear_ir.studies.late_interaction import latency
from bilinear_ir.studies.late_interaction import models
from bilinear_ir.studies.late_interaction import rows as li_rows
from bilinear_ir.studies.late_interaction import setting as setting_lib
from bilinear_ir.train import finetune


ROWS = ("dot", "bm25", "table", "hybrid")  # the rows that are not models of config.models


def validate(config) -> None:
  """Refuses a bad config before any work (`experiment.validation`)."""
  validation.integer(config.seed, "seed", 0)
  validation.check_collection(config.collection, path=config.data.path)
  validation.integers(config.sizes, "sizes", low=1, nonempty=False)
  validation.check_data(spec_lib.collection_block(config.data, config.collection))
  validation.one_of(config.data.folds, (0,), "data.folds")
  embeddings.check_encoder(config.encoder)
  validation.one_of(config.encoder.kind, ("flax",), "encoder.kind")  # token outputs are needed
  require(models.doc_len(config) >= 2, "set encoder.doc_max_length (Td, the doc tokens kept)",
          field="encoder.doc_max_length")
  validation.check_bm25(config.bm25)
  checks.check_blocks(config)
  validation.check_train(config.train)
  for name in config.train_overrides:
    require(name in config.models, f"unknown row {name!r}", field="train_overrides")
    validation.check_train(models.row_train(config, name), f"train_overrides.{name}")
  validation.check_hybrid(config.hybrid)
  validation.check_eval(config.eval)
  validation.check_stats(config.stats)
  validation.one_of(config.storage.dtype, ("float32", "float16", "bfloat16"), "storage.dtype")
  for name in config.rows:
    require(name in ROWS or name in config.models,
            f"unknown row {name!r}: not one of {ROWS} or a name of config.models", field="rows")
  require("dot" in config.rows and "colbert" in config.rows, "must hold 'dot' and 'colbert': "
          "the baselines of the paired tests", field="rows")
  for name in (n for n in config.rows if models.is_finetuned(config, n)):
    cfg = models.row_finetune(config, name)
    finetune.check_config(cfg)  # query_tower only with the "dot" scorer (DE)
    require(name not in config.distill.scorers, "must not name a fine-tuned row",
            field="distill.scorers")
  used = {n for n in (*config.rows, *config.distill.scorers) if n in config.models}
  for name in sorted(used):  # traces each used scorer's setup (its checks) without computing
    module = models.row_model(config, name, 8)[0]
    params = jax.eval_shape(functools.partial(scorers.init_params, module), jax.random.key(0))
    require(name != "colbert" or not jax.tree.leaves(params), "must be the untrained ColBERT "
            "(no projection or reduction): every trained row is selected against it",
            field="models.colbert")


def run(config, workdir: str) -> outputs.Report:
  """The `late_interaction` job (configs/late_interaction.py). Every trained row checkpoints in
  its own folder under `workdir/runs` (`training.run_dir`): a killed job's rerun resumes."""
  setting = setting_lib.build_setting(config, spec_lib.collection_block(config.data,
                                                                   config.collection))
  collection = setting.prepared.collection.name
  require(len(setting.splitset.train.query_ids) > 0, f"{collection} has no training queries",
          field="collection")
  dtype = jnp.dtype(config.storage.dtype)
  lat = latency.latency_inputs(setting, int(config.latency.docs))
  settings = setting_lib.curve_settings(setting, config.sizes, config.seed)
  per_n = len([r for r in config.rows if r != "hybrid"]) + len(config.distill.scorers) * len(
      config.distill.losses)
  bar = progress.bar(per_n * len(settings), "rows", unit="row")
  rows, by_n, unseen = [], {}, {}
  for n, cut in settings.items():
    train = cut.splitset.train
    unseen[n] = curve.unseen_answer_queries(train, [train.query_ids], cut.splitset.test)
    started = time.perf_counter()
    mine, calls, by_n[str(n)] = li_rows.table_rows(cut, config, lat, dtype, n, bar, workdir)
    by_n[str(n)]["seconds"] = round(time.perf_counter() - started, 1)
    ms = latency.time_in_turn(calls, config.latency.rounds, config.latency.repeats)
    for row in mine:
      row["ms_1q_100d"] = ms[row["row"]]
    rows += mine
  bar.close()
  li_rows.compare_rows(rows, config, unseen)
  dim, doc_len = int(setting.tokens.docs.shape[-1]), models.doc_len(config)
  storage = multivector.storage_table(
      dim, doc_len, [t for t in config.storage.doc_tokens if t <= doc_len],
      [p for p in config.storage.token_dims if p <= dim], config.storage.dtypes)
  top = by_n[str(max(settings))]
  results = {
      "rows": rows, "teachers": top["teachers"], "teacher": top["teacher"], "by_n": by_n,
      "collection": collection, "sizes": sorted(settings),
      "test_queries": len(setting.splitset.test.query_ids), "measure": setting.measures[0],
      "unseen_queries": {str(n): q for n, q in unseen.items()},
      "holm": "one family per baseline (vs_colbert, vs_dot): every other row at every n",
      "selection": "every trained token row on dev, with the untrained ColBERT as a candidate "
                   "(kept_colbert: ColBERT's numbers reported; model_metrics: the model's own)",
      **setting.describe(config.rerank, int(config.encoder.query_max_length), doc_len),
      "storage": storage, "storage_dtype": str(dtype.name), "hardware": timing.hardware(),
  }
  figures = {"late_interaction_curve": report.plot(results)} if len(settings) > 1 else {}
  return outputs.Report(results=results, markdown=report.markdown(results, config), figures=figures)
