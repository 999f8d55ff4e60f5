"""Paired comparisons of a table's rows against its baselines, Holm-adjusted per named family.

Every row is compared per query with the row of the same cell (e.g. the same embedding, or the
same collection and embedding) whose name is a baseline ("dot", "bm25"): `eval.stats.paired`
(randomization and t test, bootstrap CI, effect size), then Holm over the family of every
comparison with that baseline (`add_paired`).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from bilinear_ir.eval import stats


def against(rows: list[dict[str, Any]], baseline: str, cell: Sequence[str], name: str = "scorer",
            enough: Callable[[int], bool] = lambda i: True) -> Callable[[int], int | None]:
  """Row index -> the index of the row named `baseline` (`row[name]`) in the same cell (equal
  `row[k]` for k in `cell`); None for the baseline itself and rows where `enough(i)` fails."""
  index = {tuple(r[k] for k in cell): i for i, r in enumerate(rows) if r[name] == baseline}
  return lambda i: (None if rows[i][name] == baseline or not enough(i)
                    else index[tuple(rows[i][k] for k in cell)])


def add_paired(rows: list[dict[str, Any]], per_query: list[dict[str, float]], baseline,
               field: str, config) -> list[dict[str, Any]]:
  """Adds `row[field]` = `eval.stats.paired(row's per-query values, its baseline's)` to every
  row that has a baseline, then Holm-adjusts them together (`p_holm`): one family.

  Args:
    rows: the rows.
    per_query: [len(rows)] {qid: value} of each row (e.g. `rows.seed_mean`).
    baseline: row index -> the index of the row it is compared with, or None (no comparison),
      e.g. `against(...)`.
    field: where the comparison goes ("vs_dot", "vs_bm25").
    config: has `seed` and `stats` (`config.blocks.stats_config()`).

  Returns:
    The comparisons (one family, Holm-adjusted).
  """
  family = []
  for i, row in enumerate(rows):
    j = baseline(i)
    if j is None:
      continue
    row[field] = stats.paired(per_query[i], per_query[j], seed=config.seed,
                              resamples=config.stats.resamples,
                              bootstrap=config.stats.resamples, alpha=config.stats.alpha)
    family.append(row[field])
  stats.apply_holm(family)
  return family


def against_baselines(rows: list[dict[str, Any]], per_query: list[dict[str, float]],
                      cell: Sequence[str], config, name: str = "scorer",
                      baselines: Sequence[str] = ("dot", "bm25")) -> None:
  """`row["vs_<baseline>"]` for every baseline, each baseline's comparisons one Holm family."""
  for b in baselines:
    add_paired(rows, per_query, against(rows, b, cell, name), f"vs_{b}", config)


def subset_view(rows: list[dict[str, Any]], subsets: Sequence[Sequence[str]], field: str,
                cell: Sequence[str], config, name: str = "model") -> None:
  """`row[field]` = {"n_queries", "mean" (None when empty), "vs_dot" (with at least 2 queries)}
  for every row: its per-query values (`row["per_query"]`: {qid: value}) over its queries
  `subsets[i]` (e.g. the unseen-doc or unseen-answer test queries), compared per query with the
  dot row of its cell (`against`); one Holm family."""
  subs = [{q: r["per_query"][q] for q in sub} for r, sub in zip(rows, subsets)]
  holders = [{"n_queries": len(sub), "mean": float(np.mean(list(sub.values()))) if sub else None}
             for sub in subs]
  add_paired(holders, subs, against(rows, "dot", cell, name, lambda i: len(subs[i]) >= 2),
             "vs_dot", config)
  for r, h in zip(rows, holders):
    r[field] = h


def recovered(rows: list[dict[str, Any]], reference: str, measure: str, cell: Sequence[str],
              name: str = "model") -> None:
  """`row["recovered"]` = {"all"[, "unseen"]} for every row: the fraction of the `reference`
  row's gain over dot that the row recovers, (row - dot) / (reference - dot), on the mean of
  `measure` over all test queries (`row["metrics"]`) and, where the rows carry the unseen view
  (`compare.subset_view`), over the unseen ones (`row["unseen"]["mean"]`); rows compared within
  their cell (equal `cell` fields). None (undefined) where the reference's gain is not positive,
  a mean is missing, or the cell has no reference row."""
  views = {"all": lambda r: r["metrics"][measure]}
  if all("unseen" in r for r in rows):
    views["unseen"] = lambda r: r["unseen"]["mean"]
  for r in rows:
    key = tuple(r[k] for k in cell)
    base = [x for x in rows if x[name] == "dot" and tuple(x[k] for k in cell) == key]
    ref = [x for x in rows if x[name] == reference and tuple(x[k] for k in cell) == key]
    r["recovered"] = {}
    for view, of in views.items():
      vals = [of(x) for x in (r, *base[:1], *ref[:1])]
      gain = vals[2] - vals[1] if len(vals) == 3 and None not in vals else None
      r["recovered"][view] = (vals[0] - vals[1]) / gain if gain is not None and gain > 0 else None


def pooled(rows: list[dict[str, Any]], unseen: dict[str, list[str]], config) -> list[dict]:
  """Per (embedding, model): the unseen-doc queries of every collection (`unseen`: collection ->
  query ids), tested together against dot (`row["per_query"]`: {qid: value}); one Holm family.

  Returns:
    [{"embedding", "model", "n_queries", "collections"[, "vs_dot"]}].
  """
  out, firsts, seconds = [], [], []
  dots = {(r["collection"], r["embedding"]): r for r in rows if r["model"] == "dot"}
  groups: dict[tuple[str, str], list[dict]] = {}
  for r in rows:
    if r["model"] != "dot":
      groups.setdefault((r["embedding"], r["model"]), []).append(r)
  for (emb, model), members in groups.items():
    a, b = {}, {}
    for r in members:
      for q in unseen[r["collection"]]:
        a[f"{r['collection']}/{q}"] = r["per_query"][q]
        b[f"{r['collection']}/{q}"] = dots[r["collection"], emb]["per_query"][q]
    entry = {"embedding": emb, "model": model, "n_queries": len(a),
             "collections": sorted({r["collection"] for r in members})}
    out.append(entry)
    firsts.append(a)
    seconds.append(b)
  add_paired(out + [{} for _ in out], firsts + seconds,
                    lambda i: i + len(out) if i < len(out) and len(firsts[i]) >= 2 else None,
                    "vs_dot", config)
  return out


def tally(rows: list[dict[str, Any]], alpha: float) -> dict[str, dict[str, int]]:
  """Per model (`row["model"]`): in how many cells it is significantly better / tied / worse
  than dot (`row["vs_dot"]`, Holm-adjusted)."""
  out: dict[str, dict[str, int]] = {}
  for r in rows:
    if "vs_dot" not in r:
      continue
    mark = stats.mark(r["vs_dot"], alpha)
    counts = out.setdefault(r["model"], {"better": 0, "tied": 0, "worse": 0})
    counts[{stats.GAIN: "better", stats.LOSS: "worse"}.get(mark, "tied")] += 1
  return out


def curve(rows: list[dict[str, Any]], unseen: dict[int, list[str]], config) -> None:
  """A learning curve's comparisons: `row["vs_dot"]` and `row["unseen"]` ({"n_queries", "mean",
  "vs_dot"}; "empty": True and no "vs_dot" with fewer than 2 of the queries `unseen[n]`) for
  every row but dot's, against dot at the same `n_train`; Holm over the curve of each
  (embedding, model, view)."""
  dots = {(r["embedding"], r["n_train"]): r for r in rows if r["model"] == "dot"}
  groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
  for r in rows:
    sub = unseen[r["n_train"]]
    r["unseen"] = {"n_queries": len(sub),
                   "mean": float(np.mean([r["per_query"][q] for q in sub])) if sub else None}
    if len(sub) < 2:  # the view is empty: no paired test, no crossover at this n
      r["unseen"]["empty"] = True
    if r["model"] != "dot":
      groups.setdefault((r["embedding"], r["model"]), []).append(r)
  for members in groups.values():
    base = [dots[r["embedding"], r["n_train"]] for r in members]
    k = len(members)
    paired = lambda i: i + k if i < k else None
    add_paired(members + base, [r["per_query"] for r in members + base], paired,
                       "vs_dot", config)
    holders = [r["unseen"] for r in members] + [{} for _ in base]
    subsets = [{q: r["per_query"][q] for q in unseen[r["n_train"]]} for r in members + base]
    add_paired(holders, subsets,
                       lambda i: paired(i) if i < k and len(subsets[i]) >= 2 else None,
                       "vs_dot", config)
