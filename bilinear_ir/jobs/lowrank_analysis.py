"""The `lowrank_analysis` job: SVD truncation of a trained full bilinear W (paper 000, section 5).

For each frozen embedding of the bilinear table (`embedding_specs.EMBEDDINGS`) and each training
seed, the full bilinear `W` [n, n] is trained with the table's recipe (`config.train` +
`config.train_overrides`, selected on the dev split carved out of train) and then only analysed:

  * its spectrum sigma_1 >= ... >= sigma_n (Fig. 1c);
  * the best rank-r approximation `W_r = P Q^T` (`lowrank.lowrank_params(W, r)`, scored by the
    `lowrank` scorer, full-corpus exact retrieval) on dev and test at every rank of
    `config.ranks` (Fig. 1a) and against sigma_{r+1} (Fig. 1b), as a share of the full W's metric,
    with parameters counted as the paper does (n r) and as stored (P and Q: 2 n r) against n^2;
  * Theorem 3, `|s_W(q, d) - s_Wr(q, d)| <= sigma_{r+1} |q| |d|`, checked on real pairs (each
    test query with its top docs under W and random docs) at every rank, and at the tightness
    witness `(u_{r+1}, v_{r+1})`;
  * the ranks the spectrum suggests (`lowrank.select_rank` by energy and by bound) against the
    ranks best on dev and on test and the smallest rank reaching a share of the full W on dev.

This is the paper's Fig. 1 procedure: one trained full W, truncated after training. The
reproduce_table job's low-rank rows are different models (P Q^T trained at each rank).

Curves are means over the training seeds; the spectrum is the mean of the seeds' sorted spectra.
"""
from __future__ import annotations



from bilinear_ir import progress
from bilinear_ir.errors import require
from bilinear_ir.experiment import spec as spec_lib
from bilinear_ir.experiment import validation
from bilinear_ir.studies import truncation
from bilinear_ir.report import lowrank_analysis as report
from bilinear_ir.report import outputs



def validate(config) -> None:
  """Refuses a bad config before any work (`experiment.validation`)."""
  validation.check_table(config, hybrid_block=False)
  validation.integers(config.ranks, "ranks", low=1)
  validation.one_of(config.eval.mode, ("full",), "eval.mode")
  validation.one_of(config.data.folds, (0,), "data.folds")
  validation.real(config.data.dev_fraction, "data.dev_fraction", 0.0, 0.9, low_open=True)
  validation.integer(config.pointwise.top_docs, "pointwise.top_docs", 0)
  validation.integer(config.pointwise.random_docs, "pointwise.random_docs", 0)
  require(config.pointwise.top_docs + config.pointwise.random_docs >= 1,
          "pointwise.top_docs + pointwise.random_docs must be >= 1", field="pointwise")
  validation.real(config.pointwise.tolerance, "pointwise.tolerance", 0.0)
  for key in ("energy", "bound"):
    for x in config.rank_selection[key]:
      validation.real(x, f"rank_selection.{key}", 0.0, 1.0, low_open=True)
  validation.real(config.rank_selection.share, "rank_selection.share", 0.0, 1.0, low_open=True)
  validation.check_model(spec_lib.model_block(config.model, truncation.FULL_W))


def run(config, workdir: str) -> outputs.Report:
  """The `lowrank_analysis` job (configs/lowrank_analysis.py)."""
  out, info = {}, {}
  bar = progress.bar(len(config.embeddings) * len(config.seeds), "full W", unit="model")
  for recipe, prepared, (splitset, *_) in spec_lib.embeddings_of(config):
    emb_name = recipe.name
    require(len(splitset.dev.query_ids) > 0, "rank selection needs a dev split; set "
            "data.dev_fraction > 0", field="data.dev_fraction")
    out[emb_name] = res = truncation.trained_and_truncated(recipe, prepared, splitset, config,
                                                           each=lambda *_: bar.update(1),
                                                           workdir=workdir)
    m0 = config.eval.measures[0]
    bar.write(f"{emb_name:>4}: full W test {m0} {res['full']['test'][m0]:.4f}; "
              + ", ".join(f"r={row['rank']}: {row[m0]:.4f}" for row in res["by_rank"]))
    info = {"collection": prepared.collection.name, "test_queries": len(splitset.test.query_ids),
            "dev_queries": len(splitset.dev.query_ids)}
  bar.close()
  first = config.embeddings[0]
  results = {
      **truncation.pointwise_totals(list(out.values())),
      "pointwise_tolerance": float(config.pointwise.tolerance),
      "by_rank": out[first]["by_rank"],
      "primary_embedding": first,
      "embeddings": out,
      "measure": config.eval.measures[0],
      "seeds": list(config.seeds),
      "procedure": report.PROCEDURE,
      "paper": report.PAPER,
      **info,
  }
  return outputs.Report(results=results, markdown=report.markdown(results, config),
                        figures=report.figures(results, config))
