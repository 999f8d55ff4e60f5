"""The table runner (`experiment.table`): rows declared in config, dev selection per run and per
row, the hybrid's partner, one Holm family per baseline, and a rerun that resumes."""
import dataclasses
import zlib

import numpy as np
import pytest

from bilinear_ir.config import tables
from bilinear_ir.data import pipeline
from bilinear_ir.errors import InputError
from bilinear_ir.eval import stats
from bilinear_ir.experiment import spec as spec_lib
from bilinear_ir.experiment import table as table_lib
from bilinear_ir.experiment import validation
from bilinear_ir.train import trainer
from conftest import get_config, random_prepared, write_beir

DIM = 8


@pytest.fixture(scope="module")
def collection(tmp_path_factory):
  """A BEIR folder of 60 docs / 48 queries with random 8-d embeddings and its BM25 ranking."""
  beir = write_beir(str(tmp_path_factory.mktemp("beir")), num_docs=60, num_queries=48)
  c = _config(beir)
  return beir, random_prepared(c.data, c.bm25, DIM)


def _config(beir: str, rows=None, summary="seeds"):
  """A configs/reproduce_table.py config over `beir` with `rows` (default: dot, BM25, WDP,
  bilinear, the dev-best hidden, its hybrid), short training, two seeds."""
  c = get_config("reproduce_table", "seeds=0+1")
  with c.unlocked():
    c.data.format, c.data.path, c.data.dev_fraction = "beir", beir, 0.25
    c.train.batch_size, c.train.steps, c.train.eval_every = 8, 6, 3
    c.train.hard_negatives, c.train.hard_depth = 1, 10
    c.eval.depth, c.hybrid.depth, c.stats.resamples = 20, 20, 200
    c.runner.summary = summary
    c.runner.fields = ("n_queries", "dev", "best_steps")
    c.rows = rows or (
        *tables.baselines(), tables.trained("wdp", {"scorer": "wdp"}, {"scorer": "wdp"}),
        tables.trained("bilinear", {"scorer": "bilinear"}, {"scorer": "bilinear"}),
        tables.row("dev_best", "best", {}, over=("wdp", "bilinear"), per="row", hidden=True),
        tables.row("hybrid", "hybrid", {"scorer": "hybrid"}, partner="best",
                   from_partner=("dense",)))
  return c


def _cell(c, prepared):
  recipe = spec_lib.Recipe.of(c, "")
  return table_lib.Cell(recipe, prepared, pipeline.splits(prepared.collection, c.data, c.seed)[:1],
                        {"embedding": "e"})


def _fake_training(monkeypatch, favour: str = ""):
  """Training replaced by made-up outcomes per (scorer, seed): a dev metric (+1 for the scorer
  `favour`) and per-query test values; module and params are the real untrained dot product's,
  so the hybrid has a model to score with."""
  real = table_lib.training.train_and_evaluate
  calls = []

  def fake(row, prepared, s, workdir=None, progress=True):  # pylint: disable=unused-argument
    model = row.model.copy_and_resolve_references()
    model.scorer = "dot"
    out = real(dataclasses.replace(row, model=model), prepared, s, progress=False)
    if row.model.scorer == "dot":
      return out
    rng = np.random.default_rng([zlib.crc32(row.model.scorer.encode()), row.seed])
    per_query = {q: {m: float(rng.random()) for m in row.eval.measures} for q in s.test.query_ids}
    calls.append((row.model.scorer, row.seed))
    return {**out, "per_query": per_query, "best_step": 3,
            "metrics": {m: float(np.mean([v[m] for v in per_query.values()]))
                        for m in row.eval.measures},
            "dev": {row.train.select_metric: float(rng.random()) + (row.model.scorer == favour)}}

  monkeypatch.setattr(table_lib.rows_lib.training, "train_and_evaluate", fake)
  return calls


def test_rows_come_out_as_declared_and_the_hybrid_takes_the_row_best_on_dev(collection,
                                                                            monkeypatch):
  beir, prepared = collection
  c = _config(beir)
  validation.check_rows(c)
  calls = _fake_training(monkeypatch, favour="bilinear")  # the last of `over`
  table = table_lib.run(c, [_cell(c, prepared)], None)
  assert [r["scorer"] for r in table.rows] == ["dot", "bm25", "wdp", "bilinear", "hybrid"]
  assert sorted(calls) == [("bilinear", 0), ("bilinear", 1), ("wdp", 0), ("wdp", 1)]
  runs = table.runs[0]
  sel = c.train.select_metric
  dev = {n: np.mean([o["dev"][sel] for o in runs[n].outs]) for n in ("wdp", "bilinear")}
  best = max(dev, key=dev.get)
  assert best == "bilinear"
  assert runs["best"].chosen == [best] and table.rows[-1]["dense"] == best
  # The hybrid scored the chosen row's fits, seed by seed (two seeds, one lam each).
  assert all(h["params"] is o["params"] for h, o in zip(runs["hybrid"].outs, runs[best].outs))
  assert len(table.rows[-1]["lambda"]) == 2 and table.rows[-1]["seeds"] == 2
  # Seeds summary: mean and sample std over seeds of the test metric.
  m0 = c.eval.measures[0]
  wdp = table.rows[2]
  vals = [o["metrics"][m0] for o in runs["wdp"].outs]
  assert wdp["metrics"][m0] == pytest.approx(np.mean(vals))
  assert wdp["std"][m0] == pytest.approx(np.std(vals, ddof=1))
  assert wdp["dev"] == {sel: pytest.approx(dev["wdp"])} and wdp["best_steps"] == [3, 3]
  assert wdp["negatives_from"] == c.train.negatives_from
  # ...and each test query's value, the mean over seeds (for paired tests between rows).
  outs = runs["wdp"].outs
  assert wdp["per_query"] == pytest.approx(
      {q: np.mean([o["per_query"][q][m0] for o in outs]) for q in outs[0]["per_query"]})
  # The dense rows keep per-query metrics, not their run dicts (100 MB each on InsuranceQA).
  assert all("run" not in o and o["per_query"] for n in ("dot", "wdp", "bilinear")
             for o in runs[n].outs)


def test_dev_best_per_run_picks_each_seeds_own_best(collection, monkeypatch):
  beir, prepared = collection
  rows = (*tables.baselines("model"),
          tables.trained("wdp", {"model": "wdp"}, {"scorer": "wdp"}),
          tables.trained("bilinear", {"model": "bilinear"}, {"scorer": "bilinear"}),
          tables.row("dev_best", "learned", {"model": "learned"}, over=("dot", "wdp", "bilinear"),
                     per="run"))
  c = _config(beir, rows, summary="queries")
  c.runner.name = "model"
  _fake_training(monkeypatch)
  table = table_lib.run(c, [_cell(c, prepared)], None)
  runs, sel, m0 = table.runs[0], c.train.select_metric, c.eval.measures[0]
  want, picks = [], []
  for i in range(2):
    cands = [("dot", runs["dot"].fits[0][0])] + [(n, runs[n].fits[i][0]) for n in ("wdp",
                                                                                   "bilinear")]
    name, fit = max(cands, key=lambda t: t[1]["dev"][sel])
    picks.append(name)
    want.append(fit["per_query"])
  learned = table.rows[-1]
  assert learned["chosen"] == picks
  assert learned["per_query"] == pytest.approx(
      {q: np.mean([w[q][m0] for w in want]) for q in want[0]})
  assert learned["n_queries"] == len(want[0])


def test_each_baseline_is_one_holm_family_over_every_cell(collection, monkeypatch):
  beir, prepared = collection
  c = _config(beir)
  _fake_training(monkeypatch)
  cells = [_cell(c, prepared), dataclasses.replace(_cell(c, prepared), fields={"embedding": "f"})]
  table = table_lib.run(c, cells, None)
  for baseline in ("dot", "bm25"):
    family = [r[f"vs_{baseline}"] for r in table.rows if f"vs_{baseline}" in r]
    assert len(family) == 2 * 4  # 5 rows a cell, one of them the baseline
    raw = [stats.paired(table.per_query[i], table.per_query[j], seed=c.seed,
                        resamples=c.stats.resamples, bootstrap=c.stats.resamples,
                        alpha=c.stats.alpha)
           for i, r in enumerate(table.rows) if r["scorer"] != baseline
           for j, b in enumerate(table.rows)
           if b["scorer"] == baseline and b["embedding"] == r["embedding"]]
    stats.apply_holm(raw)
    assert [f["p_holm"] for f in family] == pytest.approx([f["p_holm"] for f in raw])


def test_a_rerun_resumes_every_finished_run(collection, tmp_path, monkeypatch):
  beir, prepared = collection
  c = _config(beir)
  first = table_lib.run(c, [_cell(c, prepared)], str(tmp_path))

  def no_training(*args, **kwargs):
    raise AssertionError("a finished run trained again")

  monkeypatch.setattr(trainer, "train_steps", no_training)
  again = table_lib.run(c, [_cell(c, prepared)], str(tmp_path))
  assert [r["metrics"] for r in again.rows] == [r["metrics"] for r in first.rows]


def test_a_row_naming_a_later_row_is_refused(collection):
  beir, _ = collection
  c = _config(beir)
  with c.unlocked():
    c.rows = (c.rows[-1],) + tuple(c.rows[:-1])
  with pytest.raises(InputError, match=r"rows\[0\]\.partner"):
    validation.check_rows(c)


def test_negatives_from_the_corpus_need_a_table_scorer(collection):
  beir, _ = collection
  c = _config(beir)
  with c.unlocked():
    c.train.negatives_from = "corpus"
  validation.check_rows(c)  # wdp and bilinear have query / doc tables
  with c.unlocked():
    c.rows = c.rows + (tables.trained("mol", {"scorer": "mol"}, {"scorer": "mol", "p_q": 2,
                                                                 "p_x": 2, "d_p": 4}),)
  with pytest.raises(InputError, match=r"rows\[6\]\.train\.negatives_from"):
    validation.check_rows(c)


def test_a_grid_trains_every_point_and_keeps_the_one_best_on_dev(collection, monkeypatch):
  beir, prepared = collection
  c = _config(beir)
  with c.unlocked():
    c.rows = (tables.row("dot", "dot", {"scorer": "dot"}),
              tables.trained("wdp", {"scorer": "wdp"}, {"scorer": "wdp"}, grid="g"))
    c.g = {"lr": (1e-4, 1e-3, 1e-2), "temperature": (0.1, 0.2)}
    c.runner.pool_p_at_1, c.runner.paired = False, False
  validation.check_rows(c)
  real = table_lib.training.train_and_evaluate
  tried = []

  def fake(row, prepared_, s, workdir=None, progress=True):  # pylint: disable=unused-argument
    out = real(row, prepared_, s, progress=False)
    if row.model.scorer == "dot":
      return out
    tried.append((row.seed, row.train.lr, row.train.temperature))
    # dev favours lr 1e-3 with temperature 0.2 at seed 0, lr 1e-2 with 0.1 at seed 1
    best = {0: (1e-3, 0.2), 1: (1e-2, 0.1)}[row.seed]
    return {**out, "dev": {row.train.select_metric: float((row.train.lr, row.train.temperature)
                                                          == best)}}

  monkeypatch.setattr(table_lib.rows_lib.training, "train_and_evaluate", fake)
  table = table_lib.run(c, [_cell(c, prepared)], None)
  assert len(tried) == 2 * 3 * 2 and len(set(tried)) == 12  # every point at every seed
  row = table.rows[1]
  assert row["grid_points"] == [{"lr": 1e-3, "temperature": 0.2}, {"lr": 1e-2, "temperature": 0.1}]
  points = table_lib.grid_points(c, c.rows[1])  # every point's dev, in that order, per seed
  assert row["grid_dev"] == [[float((p["lr"], p["temperature"]) == best) for p in points]
                             for best in ((1e-3, 0.2), (1e-2, 0.1))]
  fits = table.runs[0]["wdp"].fits
  assert row["grid_seconds"] == pytest.approx(sum(f[0]["seconds"] for f in fits), abs=0.1)
  with c.unlocked():
    c.g = {"lr": (1e-3,), "nonsense": (1,)}
  with pytest.raises(InputError, match=r"rows\[1\]\.grid"):
    validation.check_rows(c)


def test_each_model_row_trains_with_the_changes_of_its_own_block(collection, monkeypatch):
  """`curve_table(..., train="row_train")`: each trained row reads `row_train.<its model>` (every
  rank of "lowrank" the same block), MoL rows `mol_train`; a missing block is refused by name."""
  beir, prepared = collection
  c = _config(beir)
  with c.unlocked():
    c.rows = tables.curve_table(("wdp", "lowrank"), (2, 4), train="row_train")
    c.row_train = {"wdp": {"lr": 5e-3, "temperature": 0.2}, "lowrank": {"lr": 2e-4}}
    c.runner.pool_p_at_1, c.runner.paired = False, False
  validation.check_rows(c)
  real = table_lib.training.train_and_evaluate
  seen = {}

  def fake(row, prepared_, s, workdir=None, progress=True):  # pylint: disable=unused-argument
    rank = row.model.rank if row.model.scorer == "lowrank" else None
    seen[(row.model.scorer, rank)] = (row.train.lr, row.train.temperature)
    return real(row, prepared_, s, progress=False)

  monkeypatch.setattr(table_lib.rows_lib.training, "train_and_evaluate", fake)
  table_lib.run(c, [_cell(c, prepared)], None)
  recipe_t = c.train.temperature
  assert seen[("wdp", None)] == (5e-3, 0.2)
  assert seen[("lowrank", 2)] == seen[("lowrank", 4)] == (2e-4, recipe_t)
  with c.unlocked():
    del c.row_train["lowrank"]
  with pytest.raises(InputError, match="row_train.lowrank"):
    validation.check_rows(c)
