"""The re-ranking setting of late interaction (LITE paper 004): fixed candidates per query.

Each dev and test query gets `rerank.bm25_depth` BM25 candidates plus `rerank.random_docs` docs
drawn uniformly (from the config seed) among the rest of the corpus; judged positives are NOT
added (`retrieval.candidates.rerank_candidates` never sees them). Every row of a table in this
setting re-ranks the same candidates (`setting.Setting.score`); where the collection lists each
query's own candidates (InsuranceQA), each test query's own pool is re-ranked by the same code too
(`Setting.pool_scores`, P@1 over it as `p_at_1_pool`).

One module per concern:
  checks    the config blocks this setting reads besides the shared ones (`check_blocks`)
  setting   `Setting` (candidates, token and pooled embeddings, evaluation), `Scored`,
            `build_setting`, `curve_settings` (the learning curve's nested subsets)
  models    a row's scorer and training (`config.models`, `config.train_overrides`)
  teachers  the references and the distillation teachers
  hybrid    the candidates and the timed call of the hybrid (`experiment.evaluate.HybridEvaluator`)
            of the dense row best on dev with BM25 over the same candidates
  rows      a table's rows on one training split (`table_rows`), dev selection against the
            untrained ColBERT (`select_over_colbert`), the paired comparisons (`compare_rows`)
  latency   the latency call's inputs and timing every row's call in turn
"""
