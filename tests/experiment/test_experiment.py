"""The experiment protocol's pieces: typed rows narrowed from a config, rows over seeds, the
dev-selected item, paired comparisons per cell, the unseen-doc subset, templates."""
import dataclasses

import ml_collections
import numpy as np
import pytest

from bilinear_ir.config import blocks
from bilinear_ir.config import embedding_specs
from bilinear_ir.data import pipeline
from bilinear_ir.eval import stats
from bilinear_ir.experiment import compare
from bilinear_ir.experiment import rows as rows_lib
from bilinear_ir.experiment import spec as spec_lib
from bilinear_ir.report import text as report


def _config():
  c = blocks.table_recipe(ml_collections.ConfigDict())
  c.seed = 7
  c.embeddings = ("mean", "cls")
  c.train_overrides = {"mean": {}, "cls": {"lr": 0.5}}
  return c


def test_a_row_holds_its_own_blocks_and_leaves_the_config_alone():
  c = _config()
  before = c.to_dict()
  recipe = spec_lib.Recipe.of(c, "cls")
  row = recipe.row({"name": "x", "scorer": "lowrank", "rank": 4, "residual": "identity",
                    "source": "ict"}, seed=3, train={"steps": 5})
  assert c.to_dict() == before  # nothing written back
  assert (row.model.scorer, row.model.rank, row.model.residual) == ("lowrank", 4, "identity")
  assert (row.train.source, row.train.steps, row.train.lr, row.seed) == ("ict", 5, 0.5, 3)
  assert recipe.encoder.pooling == embedding_specs.embedding_spec("cls")["pooling"]
  assert recipe.train.lr == 0.5 and spec_lib.Recipe.of(c, "mean").train.lr == c.train.lr
  # None options and the row's name are not model options; the row is frozen.
  plain = recipe.row({"scorer": "dot", "rank": None}, seed=0)
  assert plain.model.scorer == "dot" and plain.model.rank == c.model.rank
  assert "name" not in row.model
  with pytest.raises(dataclasses.FrozenInstanceError):
    row.seed = 1  # pytype: disable=not-writable
  # "" is the config's own encoder and train blocks.
  own = spec_lib.Recipe.of(c, "")
  assert own.encoder.to_dict() == c.encoder.to_dict() and own.train.to_dict() == c.train.to_dict()
  assert spec_lib.Row.of(c).model is c.model


def test_best_on_dev_is_the_first_best_and_the_first_without_dev():
  items = [("a", 0.2), ("b", 0.5), ("c", 0.5), ("d", 0.1)]
  assert rows_lib.best_on_dev(items, lambda t: t[1])[0] == "b"
  assert rows_lib.best_on_dev([("a", None), ("b", 0.9)], lambda t: t[1])[0] == "a"


def test_means_over_seeds_are_mean_sample_std_and_unseen_subset_mean():
  outs = [{"metrics": {"m": v}, "dev": {"s": d}, "best_step": b,
           "per_query": {"q1": {"m": v}, "q2": {"m": 2 * v}}}
          for v, d, b in ((0.2, 0.1, 4), (0.4, 0.3, 8))]
  mean, std = rows_lib.aggregate([o["metrics"] for o in outs], ["m"])
  assert mean["m"] == pytest.approx(0.3)
  assert std["m"] == pytest.approx(np.std([0.2, 0.4], ddof=1))
  assert rows_lib.aggregate([outs[0]["metrics"]], ["m"])[1] == {"m": 0.0}
  assert rows_lib.dev_mean(outs, "s") == pytest.approx(0.2)
  assert rows_lib.unseen_mean(outs, ["q2"], "m")["m"] == pytest.approx(np.mean([0.4, 0.8]))
  assert rows_lib.dev_mean([{"dev": {}}], "s") is None
  means = rows_lib.query_means([o["per_query"] for o in outs], ["m"])
  assert means["m"] == pytest.approx(np.mean([0.3, 0.6]))


def test_unseen_doc_queries_leave_out_docs_a_training_or_dev_query_judged():
  split = lambda name, qrels: pipeline.Split(name, sorted(qrels), qrels)
  s = pipeline.SplitSet("main", split("train", {"a": {"d1": 1}}), split("dev", {"b": {"d2": 1}}),
                        split("test", {"x": {"d1": 1}, "y": {"d2": 1, "d3": 1},
                                       "z": {"d3": 1, "d1": 0}}))
  assert rows_lib.unseen_doc_queries([s]) == ["z"]


def test_against_pairs_each_row_with_the_baseline_of_its_cell():
  rows = [{"e": "m", "scorer": "dot"}, {"e": "m", "scorer": "bm25"}, {"e": "m", "scorer": "w"},
          {"e": "c", "scorer": "w"}, {"e": "c", "scorer": "dot"}]
  base = compare.against(rows, "dot", ("e",))
  assert [base(i) for i in range(5)] == [None, 0, 0, 4, None]
  few = compare.against(rows, "dot", ("e",), enough=lambda i: i != 2)
  assert few(2) is None and few(3) == 4


def test_against_baselines_adds_one_holm_family_per_baseline():
  rng = np.random.default_rng(0)
  qids = [f"q{i}" for i in range(30)]
  per_query = [{q: float(v) for q, v in zip(qids, rng.normal(size=30) + shift)}
               for shift in (0.0, 0.0, 1.0, 0.2)]
  rows = [{"e": "m", "scorer": s} for s in ("dot", "bm25", "w", "v")]
  config = ml_collections.ConfigDict({"seed": 0, "stats": {"resamples": 200, "alpha": 0.05}})
  compare.against_baselines(rows, per_query, ("e",), config)
  assert "vs_dot" not in rows[0] and "vs_bm25" not in rows[1]
  family = [rows[i]["vs_dot"] for i in (1, 2, 3)]
  want = stats.holm([c["p_perm"] for c in family])
  assert [c["p_holm"] for c in family] == pytest.approx(want)
  assert rows[2]["vs_dot"]["diff"] == pytest.approx(
      np.mean([per_query[2][q] - per_query[0][q] for q in qids]))


def test_a_tie_reads_as_zero_and_a_real_difference_keeps_its_sign():
  """A seed mean of three identical runs minus the single run is -5.6e-17 (the mpnet-mean
  curve's step-0 rows): a tie, "+0.000"; a real difference that rounds to zero keeps its sign."""
  assert np.mean([0.4649] * 3) - 0.4649 != 0.0  # the case, as it happens in float64
  assert report.fmt_diff(np.mean([0.4649] * 3) - 0.4649) == "+0.000"
  assert report.fmt_diff(-2e-4) == "-0.000" and report.fmt_diff(0.0123) == "+0.012"
  assert report.fmt_diff(-0.0123, digits=4) == "-0.0123"


def test_prose_fills_a_template_section():
  text = report.prose("reproduce_table", "unseen", m0="ndcg@10", pool="")
  assert text.startswith("*unseen docs*: ndcg@10 on the test queries") and text.endswith(".\n")
  pool = report.prose("reproduce_table", "pool").rstrip("\n")
  with_pool = report.prose("reproduce_table", "unseen", m0="ndcg@10", pool=pool)
  assert with_pool == text.rstrip("\n") + pool + "\n" and "own pool" in pool
  assert report.prose("synthetic_agreement", "theorem", n=4, lp_bilinear="b", lp_wdp="w",
                      universal="u", bound="B", overlap="o", fixed="f").count("{d1, d2}") == 1
