"""The `reproduce_table` job on a tiny collection: paired statistics against dot and BM25, the
sample std over seeds, and findings chosen on dev."""
import copy
import os

import numpy as np
import pytest

from bilinear_ir.eval import stats
from bilinear_ir.experiment import rows as rows_lib
from bilinear_ir.export import saved_model
from bilinear_ir.jobs import reproduce_table
from bilinear_ir.report import reproduce_table as table_report
from conftest import get_config, write_beir

# No claim here is about sharding: the job trains on one device (fewer, smaller compiles).
pytestmark = pytest.mark.usefixtures("one_device_training")


@pytest.fixture(scope="module")
def table(tmp_path_factory):
  root = tmp_path_factory.mktemp("table")
  c = get_config("reproduce_table", "seeds=0+1,ranks=4,embeddings=mean,source_rows=bilinear")
  c.data.format, c.data.path = "beir", write_beir(str(root / "beir"), num_docs=40,
                                                   num_queries=30, seed=3)
  c.data.dev_fraction = 0.3
  c.train.steps, c.train.eval_every, c.train.batch_size = 12, 4, 8
  c.encoder.max_length, c.encoder.cache_dir = 32, str(root / "cache")
  c.stats.resamples = 500
  c.train.ict.dev_docs = 8
  c.hybrid.depth = 10
  reproduce_table.validate(c)
  return c, reproduce_table.run(c, str(root / "w"))


def test_every_row_is_compared_with_dot_and_bm25_holm_adjusted(table):
  _, rep = table
  rows = rep.results["rows"]
  assert [r["scorer"] for r in rows] == ["dot", "bm25", "wdp", "lowrank", "lowrank", "bilinear",
                                         "adapter", "mol", "bilinear", "bilinear", "bilinear",
                                         "bilinear", "hybrid"]
  assert rows[7]["residual"] == "dot"  # the residual MoL
  assert [r.get("source") for r in rows[8:12]] == ["ict", "both", "qrels", "qrels"]
  # The rows trained again with other negatives record them; the others the recipe's.
  assert [r["negatives_from"] for r in rows[2:12]] == ["bm25"] * 8 + ["corpus", "mined"]
  assert [table_report._row_name(r) for r in rows[10:12]] == [  # pylint: disable=protected-access
      "bilinear, corpus softmax", "bilinear, mined negatives"]
  assert "vs_dot" not in rows[0] and "vs_bm25" not in rows[1]
  family = [r["vs_dot"] for r in rows[1:]]
  assert [c["p_holm"] for c in family] == pytest.approx(stats.holm([c["p_perm"] for c in family]))
  for r in rows[2:]:
    assert set(r["vs_dot"]) == {"diff", "ci95", "p_perm", "p_t", "effect_size", "n", "p_holm"}
    assert r["vs_dot"]["n"] == rep.results["test_queries"]
  # Each row keeps its per-query values (mean over seeds): the ones compared with dot.
  for r in rows[1:]:
    diff = np.mean(stats.paired_differences(r["per_query"], rows[0]["per_query"]))
    assert diff == pytest.approx(r["vs_dot"]["diff"])
    assert np.mean(list(r["per_query"].values())) == pytest.approx(r["metrics"]["ndcg@10"])
  # BM25 vs dot and dot vs BM25 are the same comparison with opposite signs.
  assert rows[1]["vs_dot"]["diff"] == pytest.approx(-rows[0]["vs_bm25"]["diff"])
  assert rows[1]["vs_dot"]["p_t"] == pytest.approx(rows[0]["vs_bm25"]["p_t"])


def test_findings_name_the_learned_row_best_on_dev(table):
  c, rep = table
  rows = rep.results["rows"]
  # As the table's dev_best row: every row trained on the judged pairs (ICT rows select on ICT
  # pairs, not comparable).
  learned = [r for r in rows if r["scorer"] not in ("dot", "bm25", "hybrid")
             and r["source"] == "qrels"]
  best = max(learned, key=lambda r: r["dev"][c.train.select_metric])
  name = table_report._row_name(best)  # pylint: disable=protected-access
  assert f"The learned similarity best on dev: {name} {best['metrics']['ndcg@10']:.4f}" in (
      rep.markdown)
  assert "sample std (ddof = 1) over the n = 2 training seeds" in rep.markdown


def test_findings_read_the_papers_rows_and_list_the_rows_beyond_them(table):
  """The paper's comparison (full bilinear, the residual ranks) reads the rows trained with the
  recipe's negatives, not their corpus-softmax or mined twins, which are listed apart."""
  c, rep = table
  rows = copy.deepcopy(rep.results["rows"])
  for i, r in enumerate(rows):  # every row its own value, so a wrong pick shows
    r["metrics"][c.eval.measures[0]] = 0.5 + i / 100
  by = {(r["scorer"], r.get("negatives_from")): r for r in rows if r.get("source") == "qrels"}
  text = table_report.findings(rows, c)
  assert f"full bilinear {by[('bilinear', 'bm25')]['metrics']['ndcg@10']:.4f}" in text
  beyond = next(line for line in text.splitlines() if "Beyond the paper's rows" in line)
  for key, name in ((("bilinear", "corpus"), "bilinear, corpus softmax"),
                    (("bilinear", "mined"), "bilinear, mined negatives"),
                    (("adapter", "bm25"), "adapter"), (("mol", "bm25"), "MoL (P = 4) + dot")):
    assert f"{name} {by[key]['metrics']['ndcg@10']:.4f}" in beyond


def test_aggregate_uses_the_sample_std():
  mean, std = rows_lib.aggregate([{"m": 0.5}, {"m": 0.7}, {"m": 0.9}], ["m"])
  assert mean["m"] == pytest.approx(0.7)
  assert std["m"] == pytest.approx(0.2)  # sqrt(((-.2)^2 + 0 + .2^2) / 2); ddof = 0 gives 0.163
  assert rows_lib.aggregate([{"m": 0.5}], ["m"])[1]["m"] == 0.0
  assert np.isclose(rows_lib.seed_mean([{"a": {"m": 1.0}}, {"a": {"m": 2.0}}], "m")["a"], 1.5)


def test_every_trained_model_is_saved_and_reloads(table, tmp_path):
  c, rep = table
  rep.folders["models"](str(tmp_path / "models"))
  got = sorted(os.path.relpath(os.path.join(d), tmp_path / "models")
               for d, _, names in os.walk(tmp_path / "models") if "config.json" in names)
  rows = ["adapter", "bilinear", "bilinear_both", "bilinear_corpus", "bilinear_ict",
          "bilinear_mined", "lowrank_r4", "lowrank_r4_identity", "mol_residual", "wdp"]
  assert got == sorted(f"mean/{r}/seed{s}" for r in rows for s in c.seeds)
  module, params, meta = saved_model.load_model(str(tmp_path / "models" / "mean" / "bilinear" /
                                                    "seed1"))
  assert meta["scorer"] == "bilinear" and meta["seed"] == 1 and params["W"].shape == (384, 384)
  assert meta["embedding"]["pooling"] == "mean" and meta["embedding"]["normalize"] is True
  assert module.dim == 384
