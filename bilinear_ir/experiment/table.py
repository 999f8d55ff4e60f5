"""The table runner: the rows a config declares (`config.rows`, `config.tables`), run over cells
(collection x embedding x training-set size) x seeds x split sets (folds).

    table = table_lib.run(config, cells, workdir)   # cells: `Cell`s, e.g. one per embedding
    table.rows        # [row] of results.json: the cell's fields, the row's label, its summary
    table.cells[i], table.runs[i]   # the i-th cell and its {row name: `Runs`}: every fit

Per cell and row spec (`config.tables` says what each type means): "dot" and "bm25" run once on
the cell's split sets; "trained" runs `training.train_and_evaluate` at every seed on every split
set the seed trains on (`Cell.trained_on`), each in its own checkpoint folder under `workdir`
(`training.run_dir`: a killed job's rerun resumes there); "dev_best" selects on dev (per run or
per row); "hybrid" tunes lam on dev per run (`evaluate.HybridEvaluator`). A row over several split
sets (folds) joins their test queries: every query is scored by the split that held it out.

Each row is summarised as `config.runner.summary` says:
  "seeds":   mean and sample std over seeds of the test metrics, the dev metric (mean over seeds),
             best steps, the mean over the unseen-doc test queries (`rows.unseen_doc_queries`),
             the first measure per query (mean over seeds), and with `runner.pool_p_at_1` P@1
             over each test query's own pool where listed;
  "queries": the mean over queries of the seed-mean metrics, the first measure per query (mean
             over seeds), and the `runner.fields` asked for ("n_queries", "dev", "best_steps",
             "seconds", "fit": a trained row's dev metric on up to `runner.fit_queries` of each
             run's own training queries, at step 0 and selected, `rows.training_fit`).
With `runner.paired`, every row is compared per query with dot and with BM25 of its cell (the
rows equal in the `runner.cell` fields; baselines named by the `runner.name` field), one Holm
family per baseline (`compare.against_baselines`); a job adds its own views (e.g. `compare.curve`).
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from bilinear_ir import progress
from bilinear_ir.errors import require
from bilinear_ir.data import pipeline
from bilinear_ir.experiment import compare
from bilinear_ir.experiment import evaluate
from bilinear_ir.experiment import rows as rows_lib
from bilinear_ir.experiment import spec as spec_lib
from bilinear_ir.experiment import training


@dataclasses.dataclass(frozen=True)
class Cell:
  """One cell of a table: an embedding of a collection (at one training-set size).

  Attributes:
    recipe: the embedding's recipe (`spec.Recipe`).
    prepared: its collection, embeddings and BM25 (`pipeline.Prepared`).
    splitsets: the split sets (one, or the folds) whose test queries the rows are scored on.
    fields: the fields naming the cell in each row, e.g. {"embedding": "mean"}.
    tag: part of each run's folder name, e.g. "n100".
    ict_split: the split set of rows trained on pairs the corpus makes itself (`split` "ict").
    trained_on: seed -> the split sets trained rows train on at that seed (None: `splitsets`;
      the learning curve's nested subsets of training queries).
    schedule: (spec, split set) -> `train` changes of one run (e.g. steps for the subset's size).
  """
  recipe: spec_lib.Recipe
  prepared: pipeline.Prepared
  splitsets: Sequence[pipeline.SplitSet]
  fields: Mapping[str, Any]
  tag: str = ""
  ict_split: pipeline.SplitSet | None = None
  trained_on: Callable[[int], Sequence[pipeline.SplitSet]] | None = None
  schedule: Callable[[Mapping[str, Any], pipeline.SplitSet], Mapping[str, Any]] | None = None


@dataclasses.dataclass
class Runs:
  """What one row of one cell ran.

  Attributes:
    spec: its row spec.
    fits: [seeds][split sets] fits: `train_and_evaluate`'s outputs (dot: one seed; BM25 and
      hybrids: {"metrics", "per_query"} and, for a hybrid, "lam", "module", "params").
    chosen: dev_best: the name chosen per run ("run") or the one row chosen ("row").
    partner: dev_best per row: the chosen row's `Runs`; hybrid: its partner's.
  """
  spec: Mapping[str, Any]
  fits: list[list[dict[str, Any]]]
  chosen: list[str] = dataclasses.field(default_factory=list)
  partner: Runs | None = None

  @functools.cached_property
  def outs(self) -> list[dict[str, Any]]:
    """Per seed, its fits joined over the split sets (one split set: the fit itself); joined
    once, on first use."""
    return [f[0] if len(f) == 1 else _joined(f) for f in self.fits]


@dataclasses.dataclass
class Table:
  """The result of `run`: rows (as results.json has them), [rows] per-query first measure, the
  cells, per cell {row name: Runs} and its unseen-doc test queries (`rows.unseen_doc_queries`)."""
  rows: list[dict[str, Any]]
  per_query: list[dict[str, float]]
  cells: list[Cell]
  runs: list[dict[str, Runs]]
  unseen: list[list[str]]


def _joined(fits: list[dict[str, Any]]) -> dict[str, Any]:
  """Fits over disjoint test queries (folds) as one: per_query joined, metrics over them."""
  per_query = {q: v for f in fits for q, v in f["per_query"].items()}
  measures = list(next(iter(per_query.values())))
  return {**fits[0], "per_query": per_query,
          "metrics": {m: float(np.mean([v[m] for v in per_query.values()])) for m in measures},
          "seconds": sum(f.get("seconds", 0.0) for f in fits)}


def run(config, cells: Iterable[Cell], workdir: str | None) -> Table:
  """Every row of `config.rows` in every cell, summarised and compared (module docstring)."""
  table = Table([], [], [], [], [])
  dots: dict[tuple, list[dict[str, Any]]] = {}
  for cell in cells:
    runs = run_cell(config, cell, workdir, dots)
    table.cells.append(cell)
    table.runs.append(runs)
    unseen = rows_lib.unseen_doc_queries(cell.splitsets)
    table.unseen.append(unseen)
    pools = (evaluate.candidate_pools(cell.prepared, cell.splitsets[0].test)
             if config.runner.get("pool_p_at_1") else None)
    for spec in config.rows:
      if spec.get("hidden"):
        continue
      row, per_query = summarise(config, cell, runs[spec["name"]], unseen, pools)
      table.rows.append(row)
      table.per_query.append(per_query)
  if config.runner.paired:
    compare.against_baselines(table.rows, table.per_query, tuple(config.runner.cell), config,
                              name=config.runner.name)
  return table


def run_cell(config, cell: Cell, workdir: str | None,
             dots: dict[tuple, list[dict[str, Any]]] | None = None) -> dict[str, Runs]:
  """{row name: Runs} of every row of `config.rows` in `cell`, in order (`dots`: a cache of the
  dot product's fits per embedding and split sets, shared by the cells of a curve)."""
  measures = list(config.eval.measures)
  sel = config.train.select_metric
  trained = [s for s in config.rows if s["type"] == "trained"]
  bar = progress.bar(sum((1 if s["split"] == "ict" else len(_trained_on(cell, seed)))
                         * len(grid_points(config, s)) for s in trained for seed in config.seeds),
      " / ".join(str(v) for v in cell.fields.values()), unit="model")
  runs: dict[str, Runs] = {}
  for spec in config.rows:
    kind = spec["type"]
    if kind == "dot":
      key = (cell.recipe.name, tuple(id(s) for s in cell.splitsets))
      if dots is None or key not in dots:
        fits = [rows_lib.without_run(training.train_and_evaluate(
                    cell.recipe.row({"scorer": "dot"}, cell.recipe.seed), cell.prepared, s,
                    progress=False)) for s in cell.splitsets]
        if dots is not None:
          dots[key] = fits
      runs[spec["name"]] = Runs(spec, [dots[key] if dots is not None else fits])
    elif kind == "bm25":
      bm25, run_ = _bm25(cell, measures)
      runs[spec["name"]] = Runs(spec, [[{**bm25, "metrics": bm25["mean"], "run": run_}]])
    elif kind == "trained":
      runs[spec["name"]] = Runs(spec, [_trained(config, cell, spec, seed, workdir, bar)
                                       for seed in config.seeds])
    elif kind == "dev_best":
      runs[spec["name"]] = _dev_best(spec, runs, sel)
    else:
      runs[spec["name"]] = hybrid(config, cell, spec, runs[spec["partner"]])
    if kind == "trained":
      outs = runs[spec["name"]].outs
      dev = rows_lib.dev_mean(outs, sel)
      bar.write(f"{cell.recipe.name:>4} {spec['title']:<36} test {measures[0]} "
                f"{np.mean([o['metrics'][measures[0]] for o in outs]):.4f} (dev {sel} "
                f"{'-' if dev is None else f'{dev:.4f}'})")
  bar.close()
  return runs


def _trained_on(cell: Cell, seed: int) -> Sequence[pipeline.SplitSet]:
  return cell.trained_on(seed) if cell.trained_on is not None else cell.splitsets


def _trained(config, cell: Cell, spec, seed: int, workdir, bar) -> list[dict[str, Any]]:
  """One seed of a trained row: a fit per split set it trains on (`rows.seed_runs`); with a
  `grid`, one per grid point, the one best on dev kept (its "grid_point"; "seconds": all of
  theirs)."""
  fits = []
  splits = [cell.ict_split] if spec["split"] == "ict" else _trained_on(cell, seed)
  name = "-".join(x for x in (cell.tag, spec["name"]) if x)
  for s in splits:
    changes = {**(cell.schedule(spec, s) if cell.schedule else {}), **train_of(config, spec)}
    points = grid_points(config, spec)
    outs = [rows_lib.seed_runs(cell.recipe, model_of(config, spec), [seed], cell.prepared, s,
                               {**changes, **point}, each=lambda *_: bar.update(1),
                               workdir=workdir, name=name + _point_slug(point))[0]
            for point in points]
    i = rows_lib.best_on_dev(range(len(outs)),
                             lambda j: outs[j]["dev"].get(config.train.select_metric))
    fits.append({**outs[i], "seconds": sum(o["seconds"] for o in outs)}
                if spec.get("grid") else outs[i])
    if spec.get("grid"):
      fits[-1]["grid_point"] = points[i]
      fits[-1]["grid_dev"] = [o["dev"].get(config.train.select_metric) for o in outs]
  return fits


def grid_points(config, spec: Mapping[str, Any]) -> list[dict[str, Any]]:
  """The `train` changes a trained row tries, each selected on dev like the step: every
  combination of its `grid` ({train field: values}, or the config block that names), in order
  (the first wins ties); [{}] without one."""
  grid = spec.get("grid") or {}
  grid = dict(config[grid]) if isinstance(grid, str) else dict(grid)
  return [dict(zip(grid, values)) for values in itertools.product(*grid.values())] or [{}]


def _point_slug(point: Mapping[str, Any]) -> str:
  return "".join(f"-{k}{v:g}" if isinstance(v, float) else f"-{k}{v}" for k, v in point.items())


def model_of(config, spec: Mapping[str, Any]) -> dict[str, Any]:
  """A trained row's model options: its `model`, or the config block that names."""
  return _block(config, spec["model"])


def train_of(config, spec: Mapping[str, Any]) -> dict[str, Any]:
  """A trained row's `train` changes: its `train`, or the config block that names."""
  return _block(config, spec["train"])


def _block(config, value: Mapping[str, Any] | str) -> dict[str, Any]:
  """`value` itself, or the config block it names (dotted for a nested one: "row_train.wdp")."""
  if not isinstance(value, str):
    return dict(value)
  block = config
  for key in value.split("."):
    require(key in block, f"the config has no block {value!r}", field="rows")
    block = block[key]
  return dict(block)


def _bm25(cell: Cell, measures) -> tuple[dict[str, Any], dict]:
  """BM25 over every test query of the cell's split sets: ({"mean", "per_query"}, run)."""
  qids = sorted(q for s in cell.splitsets for q in s.test.query_ids)
  qrels = {q: s.test.qrels[q] for s in cell.splitsets for q in s.test.query_ids}
  rows = cell.prepared.query_row_index(qids)
  return evaluate.evaluate_run(qids, cell.prepared.collection.doc_ids,
                               cell.prepared.bm25_idx[rows], cell.prepared.bm25_scores[rows],
                               qrels, measures)


def _dev_best(spec, runs: dict[str, Runs], sel: str) -> Runs:
  """Per run: each (seed, split set)'s fit best on dev among `over` (seconds: all of theirs);
  per row: the row of `over` best on dev (mean over seeds)."""
  over = [runs[name] for name in spec["over"]]
  if spec["per"] == "row":
    best = rows_lib.best_on_dev(over, lambda r: rows_lib.dev_mean(r.outs, sel))
    return Runs(spec, best.fits, [best.spec["name"]], best)
  fits, chosen = [], []
  for i in range(max(len(r.fits) for r in over)):
    seed_fits = []
    for j in range(len(over[-1].fits[i])):
      cands = [(r.spec["name"], r.fits[min(i, len(r.fits) - 1)][j]) for r in over]
      name, fit = rows_lib.best_on_dev(cands, lambda t: t[1]["dev"].get(sel))
      chosen.append(name if fit["best_step"] or not spec.get("step0") else f"{name}@step0")
      seed_fits.append({**fit, "seconds": sum(c.get("seconds", 0.0) for _, c in cands)})
    fits.append(seed_fits)
  return Runs(spec, fits, chosen)


def hybrid(config, cell: Cell, spec, partner: Runs) -> Runs:
  """lam * partner + (1 - lam) * BM25 per run, lam tuned on each split set's dev split
  (`evaluate.HybridEvaluator`): a hybrid row's `Runs` (spec: its row spec)."""
  measures, fits = list(config.eval.measures), []
  for seed_fits in partner.fits:
    out = []
    for s, fit in zip(cell.splitsets, seed_fits):
      lam, res = evaluate.HybridEvaluator(s.dev, cell.prepared.collection.doc_ids, config.hybrid,
                                          measures)(
          evaluate.full_corpus(fit["module"], fit["params"], cell.prepared, config.hybrid.depth),
          {"test": s.test})
      out.append({"metrics": res["test"][0]["mean"], "per_query": res["test"][0]["per_query"],
                  "lam": lam, "module": fit["module"], "params": fit["params"]})
    fits.append(out)
  return Runs(spec, fits, partner=partner.partner or partner)


def _pool_runs(runs: Runs) -> list[tuple[float, Any, Any]]:
  """(lam, module, params) per seed for `rows.pool_p_at_1`: 1 a dense row, 0 BM25."""
  kind = runs.spec["type"]
  if kind == "bm25":
    return [(0.0, None, None)]
  return [(o.get("lam", 1.0), o["module"], o["params"]) for o in runs.outs]


def summarise(config, cell: Cell, runs: Runs, unseen: list[str], pools
              ) -> tuple[dict[str, Any], dict[str, float]]:
  """(the row of results.json, its first measure per query, mean over seeds)."""
  measures = list(config.eval.measures)
  m0, sel, spec, outs = measures[0], config.train.select_metric, runs.spec, runs.outs
  kind = spec["type"]
  row = {**cell.fields, **dict(config.runner.get("blank", {})), **spec["label"]}
  if spec.get("from_partner"):
    chosen = runs.partner.spec
    row.update({k: (chosen["title"] if k == "dense" else chosen["label"].get(k))
                for k in spec["from_partner"]})
  per_query = rows_lib.seed_mean([o["per_query"] for o in outs], m0)
  if config.runner.summary == "seeds":
    mean, std = rows_lib.aggregate([o["metrics"] for o in outs], measures)
    if pools is not None:
      mean.update(rows_lib.pool_p_at_1(cell.prepared, cell.splitsets[0].test, pools,
                                       _pool_runs(runs), config.hybrid.normalize))
    if kind == "hybrid":
      row["lambda"] = [o["lam"] for o in outs]
    # per_query: the seeds' mean per test query, for paired tests between any two rows.
    row.update(metrics=mean, std=std, per_query=per_query)
    if kind in ("dot", "trained"):
      row["dev"] = {sel: rows_lib.dev_mean(outs, sel)}
    row["seeds"] = len(outs)
    if kind == "trained":
      row["best_steps"] = [int(o["best_step"]) for o in outs]
      row["negatives_from"] = _negatives_from(outs)
    _grid_fields(row, runs)
    row["unseen_docs"] = rows_lib.unseen_mean(outs, unseen, m0)
    return row, per_query
  row.update(seeds=len(outs), metrics=rows_lib.query_means([o["per_query"] for o in outs],
                                                           measures), per_query=per_query)
  fields = config.runner.fields
  if "n_queries" in fields:
    row["n_queries"] = len(per_query)
  if "dev" in fields and kind in ("dot", "trained", "dev_best"):
    row["dev"] = {sel: rows_lib.dev_mean(outs, sel)}
  if "best_steps" in fields and kind in ("dot", "trained", "dev_best"):
    row["best_steps"] = [int(o["best_step"]) for o in outs]
  if "seconds" in fields:
    row["seconds"] = round(sum(o.get("seconds", 0.0) for o in outs), 1)
  if "fit" in fields and kind == "trained" and spec["split"] != "ict":
    row["fit"] = rows_lib.training_fit(
        cell.prepared, cell.recipe.eval,
        [(seed, s.train, out) for seed, seed_fits in zip(config.seeds, runs.fits)
         for s, out in zip(_trained_on(cell, seed), seed_fits)],
        int(config.runner.fit_queries), sel)
  _grid_fields(row, runs)
  if kind == "trained":
    row["negatives_from"] = _negatives_from(outs)
  if kind == "dev_best":
    row["chosen"] = runs.chosen
  if kind == "trained" and spec["split"] == "ict":
    row["ict_lam"] = [(o.get("ict_guard") or {}).get("lam") for o in outs]
  return row, per_query


def _negatives_from(outs: Sequence[dict[str, Any]]) -> str | list[str]:
  """The runs' negatives source (`train.negatives_from`): one name, or one per run where a grid
  chose it per run."""
  sources = [o.get("negatives_from") for o in outs]
  return sources[0] if len(set(sources)) == 1 else sources


def _grid_fields(row: dict[str, Any], runs: Runs) -> None:
  """A row trained over a grid records the point dev chose per seed (and split set), every
  point's dev metric and what the grid cost: "grid_points" [seeds x split sets], "grid_dev"
  [seeds x split sets][points, in `grid_points`' order], "grid_seconds" (every point's training)."""
  if runs.spec.get("grid"):
    row["grid_points"] = [f["grid_point"] for seed_fits in runs.fits for f in seed_fits]
    row["grid_dev"] = [f["grid_dev"] for seed_fits in runs.fits for f in seed_fits]
    row["grid_seconds"] = round(sum(f["seconds"] for seed_fits in runs.fits for f in seed_fits), 1)
