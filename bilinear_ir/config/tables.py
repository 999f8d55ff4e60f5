"""The rows of a table, declared in config (`config.rows`), run by `experiment.table`.

A table is a tuple of row specs, each a plain dict with a `type`:

  {"type": "dot"}       the untrained dot product of the frozen embeddings
  {"type": "bm25"}      BM25 over every test query of the cell
  {"type": "trained", "model": {...} | "block", "train": {} | "block", "split": "folds" | "ict",
   "grid": {field: values} | "block"}
                        `model` options (and `source`, the training pairs) of a scorer trained at
                        every seed on every split set ("ict": on the cell's ICT split, no folds),
                        with the `train` changes; a string names the config block holding them
                        (e.g. "mol", "mol_train": `--config.mol_train.lr=...` reaches the row);
                        with a `grid` of `train` fields (e.g. "train_grid": lr x temperature),
                        every combination is trained and the one best on dev kept, like the step
  {"type": "dev_best", "over": (names), "per": "run" | "row", "step0": bool}
                        "run": per seed and split set, the row of `over` best on dev (`step0`:
                        its name gets "@step0" where dev selection kept the untrained start);
                        "row": the row of `over` whose dev metric, mean over seeds, is best
  {"type": "hybrid", "partner": name, "from_partner": (keys)}
                        lam * partner + (1 - lam) * BM25, lam tuned on dev per run; the row takes
                        the `from_partner` fields of the partner's chosen row ("dense": its title)

and, each: `name` (unique: what `over` and `partner` name), `title` (a reader's name, e.g.
"lowrank r=32 (identity + PQ^T)"), `label` (the fields naming its row in results.json, e.g.
{"scorer": "wdp", "source": "qrels"} or {"model": "wdp"}) and `hidden` (True: run for a later row,
not reported). A new row of a job is one more entry here. The functions below build each job's
rows from its config file's arguments.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

TYPES = ("dot", "bm25", "trained", "dev_best", "hybrid")
SOURCE_LABELS = {"qrels": "", "ict": ", ICT pairs", "both": ", qrels + ICT pairs"}
# The negatives a row's softmax runs over beyond the recipe's (`train.negatives_from`), by name.
NEGATIVES_LABELS = {"corpus": ", corpus softmax", "mined": ", mined negatives"}


def row(type_: str, name: str, label: Mapping[str, Any], title: str | None = None,
        **fields: Any) -> dict[str, Any]:
  """One row spec: {"type", "name", "title", "label", **fields} (see the module docstring)."""
  return {"type": type_, "name": name, "title": title or name, "label": dict(label), **fields}


def trained(name: str, label: Mapping[str, Any], model: Mapping[str, Any] | str,
            train: str | None = None, title: str | None = None,
            split: str = "folds", grid: str | None = None) -> dict[str, Any]:
  """A trained row: its `model` options (None values left out by `Recipe.row`) or the name of
  the config block holding them, the name of the config block of its `train` changes, and of
  the grid of `train` values it is selected over on dev (None: none)."""
  out = row("trained", name, label, title,
            model=model if isinstance(model, str) else dict(model), train=train or {},
            split=split)
  if grid:
    out["grid"] = grid
  return out


def baselines(label_key: str = "scorer", bm25: Mapping[str, Any] | None = None
              ) -> list[dict[str, Any]]:
  """The untrained dot product and BM25, labelled {label_key: "dot" / "bm25"} (+ `bm25`)."""
  return [row("dot", "dot", {label_key: "dot"}),
          row("bm25", "bm25", {label_key: "bm25", **(bm25 or {})})]


def other_negatives(spec: Mapping[str, Any]) -> str | None:
  """The row's negatives source (`negatives_from`) where it is one of NEGATIVES_LABELS (not the
  recipe's), else None."""
  negatives = spec.get("negatives_from")
  return negatives if isinstance(negatives, str) and negatives in NEGATIVES_LABELS else None


def row_slug(spec: Mapping[str, Any]) -> str:
  """A folder name for a row of the bilinear table: wdp, bilinear, lowrank_r32,
  lowrank_r32_identity, mol, mol_residual (+ _ict, _both for the other training sources; +
  _corpus, _mined for the other negatives)."""
  name = spec["scorer"]
  if name == "lowrank":
    name = f"lowrank_r{spec['rank']}" + ("" if spec["residual"] == "none" else
                                         f"_{spec['residual']}")
  elif name == "mol" and spec.get("residual") == "dot":
    name = "mol_residual"
  name += "" if spec.get("source", "qrels") == "qrels" else f"_{spec['source']}"
  return name + (f"_{other_negatives(spec)}" if other_negatives(spec) else "")


def row_label(spec: Mapping[str, Any]) -> str:
  """A table row's name: "wdp", "lowrank r=32 (identity + PQ^T)", "MoL (P = 4)", "MoL (P = 4)
  + dot", ... (+ its training source, + its negatives where not the recipe's)."""
  name = spec["scorer"]
  if spec["scorer"] == "lowrank":
    name = f"lowrank r={spec['rank']}" + ("" if spec["residual"] == "none" else
                                         f" ({spec['residual']} + PQ^T)")
  elif spec["scorer"] == "mol":
    name = f"MoL (P = {spec['p_q']})" + (" + dot" if spec.get("residual") == "dot" else "")
  return (name + SOURCE_LABELS[spec.get("source", "qrels")]
          + NEGATIVES_LABELS.get(other_negatives(spec), ""))


def bilinear_table(ranks: Sequence[int], residuals: Sequence[str], mol: Mapping[str, Any] | None,
                   sources: Sequence[str], source_rows: Sequence[str],
                   grid: str | None = None, models: Sequence[Mapping[str, Any]] = (),
                   negatives: Sequence[str] = (), negatives_rows: Sequence[str] = ()
                   ) -> tuple[dict[str, Any], ...]:
  """The rows of the bilinear table (configs/reproduce_table.py): dot, BM25, WDP, P Q^T at every
  residual x rank, full bilinear, MoL (`mol` options; None: no MoL row), one row per
  `models` entry (its model options, e.g. {"scorer": "adapter"}, or a MoL's with
  {"residual": "dot"}: the residual MoL, the dot product one more logit), the rows named in
  `source_rows` again on each of `sources` ("ict", "both"), the rows named in `negatives_rows`
  again with each of `negatives` ("corpus", "mined": `train.negatives_from`, the changes of the
  config block `negatives_train.<name>`), then the hybrid of the row best on dev (mean over seeds;
  judged-pair rows only) with BM25. `grid`: the config block of the `train` values every row
  but MoL is selected over on dev (None: the recipe's own)."""
  blank = {"rank": None, "residual": None}
  specs = [{"scorer": "wdp", **blank}]
  specs += [{"scorer": "lowrank", "rank": int(r), "residual": res}
            for res in residuals for r in ranks]
  specs.append({"scorer": "bilinear", **blank})
  if mol is not None:
    specs.append({**dict(mol), **blank})
  specs += [{**blank, **dict(model)} for model in models]
  specs = [{**spec, "source": "qrels"} for spec in specs]
  base = list(specs)  # each trained once with the recipe, on the judged pairs
  for source in sources:
    specs += [{**spec, "source": source} for spec in base if row_slug(spec) in source_rows]
  for negs in negatives:
    specs += [{**spec, "negatives_from": negs} for spec in base
              if row_slug(spec) in negatives_rows]
  rows = baselines("scorer", {"mode": "full"})
  for spec in specs:
    mol_row = spec["scorer"] == "mol"
    train = "mol_train" if mol_row else None
    if other_negatives(spec):
      train = f"negatives_train.{spec['negatives_from']}"
    rows.append(trained(row_slug(spec), spec, {k: v for k, v in spec.items()
                                               if k != "negatives_from"},
                        train, row_label(spec), grid=None if mol_row else grid))
  judged = tuple(r["name"] for r in rows[2:] if r["label"]["source"] == "qrels")
  rows.append(row("dev_best", "best", {}, over=judged, per="row", hidden=True))
  rows.append(row("hybrid", "hybrid", {"scorer": "hybrid"}, partner="best",
                  from_partner=("rank", "residual", "dense")))
  return tuple(rows)


def mol_table(baseline_scorers: Sequence[str], components: Sequence[int],
              mi_weights: Sequence[float], d_p: int) -> tuple[dict[str, Any], ...]:
  """The rows of the MoL job (configs/mol.py): dot, BM25, the trained `baseline_scorers`, MoL for
  every P_q = P_x of `components` x L_MI weight of `mi_weights` (`config.mol_train`'s changes), and
(hidden) the MoL row best on
  dev, whose retrieval the job then measures."""
  rows = baselines("scorer") + [trained(s, {"scorer": s}, {"scorer": s}) for s in baseline_scorers]
  for p in components:
    for a in mi_weights:
      spec = {"scorer": "mol", "p_q": int(p), "p_x": int(p), "d_p": int(d_p),
              "mi_weight": float(a)}
      rows.append(trained(f"mol_p{p}_mi{a}", spec, spec, "mol_train", row_label(spec)))
  rows.append(row("dev_best", "best", {}, over=tuple(r["name"] for r in rows
                                                     if r["label"]["scorer"] == "mol"),
                  per="row", hidden=True))
  return tuple(rows)


def model_specs(models: Sequence[str], ranks: Sequence[int]) -> list[dict[str, Any]]:
  """The trained models a config's `models` names, in its order: [{"name", "scorer", ...model
  options}]. "lowrank" is the residual I + P Q^T at every rank of `ranks` ("lowrank_r{r}"),
  "mol" and "mol_residual" MoL (its options in the config block of that name), any other name
  its own scorer (e.g. "adapter", the residual query adapter)."""
  out = []
  for name in models:
    if name == "lowrank":
      out += [{"name": f"lowrank_r{r}", "scorer": "lowrank", "rank": int(r),
               "residual": "identity"} for r in ranks]
    elif name in ("mol", "mol_residual"):
      out.append({"name": name, "scorer": "mol"})
    else:
      out.append({"name": name, "scorer": name})
  return out


def _named(spec: Mapping[str, Any], source: str | None = None, grid: str | None = None,
           train: str | None = None) -> dict[str, Any]:
  """A trained row labelled {"model": name} (+ "_<source>" for another training source), with
  the `train` changes of the config block `train` names (None: none)."""
  name = spec["name"] + (f"_{source}" if source else "")
  model = {k: v for k, v in spec.items() if k != "name"}
  if source:
    model["source"] = source
  return trained(name, {"model": name}, model, train, split="ict" if source else "folds",
                 grid=grid)


def _model_rows(models: Sequence[str], ranks: Sequence[int], grid: str | None,
                train: str | None) -> list[dict[str, Any]]:
  """The trained rows of `models` (`model_specs`), each with the `train` changes of the block
  `<train>.<its entry of models>` (e.g. "row_train.lowrank" for every rank; None: none); MoL
  rows with `config.mol_train`'s, never a grid."""
  rows = []
  for model in models:
    for s in model_specs((model,), ranks):
      rows.append(trained(s["name"], {"model": s["name"]}, s["name"], "mol_train")
                  if s["scorer"] == "mol" else
                  _named(s, grid=grid, train=f"{train}.{model}" if train else None))
  return rows


def study_table(models: Sequence[str], ranks: Sequence[int], ict_rows: Sequence[str],
                grid: str | None = None, train: str | None = None
                ) -> tuple[dict[str, Any], ...]:
  """The rows of the study (configs/study.py): dot, BM25, the trained `models` (`grid`, `train`:
  as `curve_table`'s), "learned" (per seed and fold, the trained row best on dev, step 0
  included), its hybrid with BM25, and the rows named in `ict_rows` trained on pairs the corpus
  makes itself (no folds)."""
  specs = model_specs(models, ranks)
  rows = baselines("model") + _model_rows(models, ranks, grid, train)
  rows.append(row("dev_best", "learned", {"model": "learned"}, over=tuple(s["name"] for s in specs),
                  per="run", step0=True))
  rows.append(row("hybrid", "hybrid", {"model": "hybrid"}, partner="learned", from_partner=()))
  rows += [_named(s, source="ict") for s in specs if s["name"] in ict_rows]
  return tuple(rows)


def curve_table(models: Sequence[str], ranks: Sequence[int], grid: str | None = None,
                train: str | None = None) -> tuple[dict[str, Any], ...]:
  """The rows of each point of the learning curve (configs/learning_curve.py): dot, the trained
  `models` (MoL: the options of `config.mol` / `config.mol_residual`, with `config.mol_train`'s
  changes; the others with the `train` changes of the block `<train>.<model>`, e.g.
  "row_train.wdp"), and "learned": per seed, the one of dot and the trained rows best on dev.
  `grid`: as `bilinear_table`'s."""
  specs = model_specs(models, ranks)
  rows = [row("dot", "dot", {"model": "dot"})] + _model_rows(models, ranks, grid, train)
  rows.append(row("dev_best", "learned", {"model": "learned"},
                  over=("dot",) + tuple(s["name"] for s in specs), per="run", step0=False))
  return tuple(rows)
