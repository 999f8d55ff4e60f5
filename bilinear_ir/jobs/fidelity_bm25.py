"""The `fidelity_bm25` job: how well random projections keep BM25 rankings (paper 002, sec. 2, 5).

The experiments (Fig. 2, Fig. 3a/3b, minimum margins, the Lemma 1 check) are computed by
`bilinear_ir.studies.fidelity_experiments.run_experiments`, whose docstring says what each number
means;
this job loads the collection, validates the config, and draws the figures and the table.
"""
from __future__ import annotations


import ml_collections

from bilinear_ir.data import bm25
from bilinear_ir.data import loaders
from bilinear_ir.data.collection import Collection
from bilinear_ir.errors import require
from bilinear_ir.fidelity import projections
from bilinear_ir.report import fidelity_bm25 as report
from bilinear_ir.report import outputs
from bilinear_ir.experiment import validation
from bilinear_ir.studies import fidelity_experiments as experiments


def validate(config: ml_collections.ConfigDict) -> None:
  """Refuses a bad config before any work (InputError naming the field)."""
  validation.integer(config.seed, "seed", 0)
  validation.check_data(config.data)
  validation.one_of(config.tokenizer.kind, bm25.TOKENIZER_KINDS, "tokenizer.kind")
  validation.one_of(config.bm25.variant, bm25.BM25_VARIANTS, "bm25.variant")
  validation.real(config.bm25.k1, "bm25.k1", 0.0)
  validation.real(config.bm25.b, "bm25.b", 0.0, 1.0)
  validation.one_of(config.projection.kind, projections.KINDS, "projection.kind")
  validation.integer(config.projection.block_size, "projection.block_size", 1)
  grid = list(config.k_grid)
  require(len(grid) >= 1 and all(int(k) == k and k >= 1 for k in grid),
          "must be positive integers", field="k_grid")
  require(all(a < b for a, b in zip(grid, grid[1:])), "must be increasing", field="k_grid")
  require(0 < config.beta < 1, f"must be in (0, 1), got {config.beta}", field="beta")
  require(config.trials >= 1, f"must be >= 1, got {config.trials}", field="trials")
  require(config.fig3.trials >= 1, f"must be >= 1, got {config.fig3.trials}",
          field="fig3.trials")
  require(config.fig2.num_bins >= 1 and config.fig2.x_max > 0 and config.fig2.triples_per_bin >= 1,
          "num_bins, triples_per_bin >= 1 and x_max > 0", field="fig2")
  require(config.fig3.doc_bins >= 1 and config.fig3.recall_at >= 1 and config.fig3.queries >= 1,
          "doc_bins, recall_at, queries >= 1", field="fig3")
  require(all(r >= 1 for r in config.fig3.ranks), "must be >= 1", field="fig3.ranks")
  require(0 < config.fig3.recall_target <= 1, "must be in (0, 1]", field="fig3.recall_target")
  p = config.passages
  require(1 <= p.min_words <= p.max_words, "need 1 <= min_words <= max_words", field="passages")
  require(all(l >= p.min_words for l in p.lengths), "every length must be >= min_words",
          field="passages.lengths")
  require(p.docs >= 1 and p.queries >= 1, "docs, queries >= 1", field="passages")


def run(config: ml_collections.ConfigDict, workdir: str) -> outputs.Report:
  """Loads `config.data` and runs every experiment; returns the Report (main writes it)."""
  del workdir  # nothing is cached; main writes the outputs
  return run_on(config, loaders.load(config.data))


def run_on(config: ml_collections.ConfigDict, collection: Collection) -> outputs.Report:
  """Every experiment on an already loaded collection (tests build one directly)."""
  validate(config)
  results = experiments.run_experiments(config, collection)
  figures = {"fig2": report.plot_fig2(results["fig2"], config.beta),
             "fig3a": report.plot_fig3a(results["fig3a"]),
             "fig3b": report.plot_fig3b(results["fig3b"])}
  return outputs.Report(results=results, markdown=report.markdown(results, config), figures=figures)
