r"""reproduce_table: the bilinear paper's real-world table on SciFact (the README's main job).

  python -m bilinear_ir.main --config=configs/reproduce_table.py --workdir=runs/table
  python -m bilinear_ir.main --config=configs/reproduce_table.py:collection=insuranceqa \
      --workdir=runs/table_iqa

For the frozen all-MiniLM-L6-v2 embeddings "mean" (mean-pooled, L2-normalised: aligned with the
dot product, the paper's all-mpnet-base-v2 case) and "cls" (CLS-pooled, unnormalised: misaligned,
the analogue of the paper's general-purpose bert-base-uncased), over 3 seeds: dot (untrained),
WDP, low-rank P Q^T at r in {2, ..., 128} (pure, as in the paper, and residual I + P Q^T), full
bilinear, the similarities that start at the dot product (the residual query adapter, which
needs no new index, and the residual MoL), full W and I + P Q^T r = 32 trained again with the exact
softmax over the corpus and with negatives mined by the model, BM25 and the hybrid of the best
learned similarity (picked on dev) with BM25.

Args (after `:`): collection ("", the default: the `data` block as it is, SciFact unless
`--config.data.*` says otherwise; scifact; insuranceqa: InsuranceQA V2 from the package
insuranceqa-data 1.2, its official dev split, its listed negatives as the hard negatives, and
P@1 over each question's own pool; or a BEIR folder or zip with a train split), seeds (e.g.
`seeds=0+1+2`), ranks (e.g. `ranks=2+8+32`), residuals (none+identity), sources (ict+both, or
none), mol (bool: add the MoL row), models (the rows that start at the dot product:
adapter+mol_residual, or none), negatives (corpus+mined, or none: the `negatives_rows` trained
again with each `train.negatives_from`), negatives_rows (bilinear+lowrank_r32_identity),
embeddings (`mean+cls`), grid (bool: each row but MoL selected on dev over `train_grid`'s lr x
temperature), quick (bool: one seed, ranks 2+32+128, pure form only, none of the `models` and
`negatives` rows — a smoke run). Ranks 0 and an empty residuals / sources / mol take the
collection's default: SciFact's is the paper's grid; InsuranceQA's (27k answers, 12,889
training questions) is r = 32 + 128 residual only, no ICT rows, the MoL row, and at most
`max_steps` steps per run.
"""
from ml_collections import ConfigDict

from bilinear_ir.config import arguments
from bilinear_ir.config import blocks
from bilinear_ir.config import tables


def get_config(arg=None):
  a = arguments.parse_args(arg, {"collection": "", "seeds": (0, 1, 2), "ranks": (0,),
                              "embeddings": ("mean", "cls"), "residuals": (), "sources": (),
                              "source_rows": ("bilinear", "lowrank_r32_identity"),
                              "mol": "", "models": ("adapter", "mol_residual"),
                              "negatives": ("corpus", "mined"),
                              "negatives_rows": ("bilinear", "lowrank_r32_identity"),
                              "max_steps": 2000, "grid": False, "quick": False})
  iqa = a["collection"] == "insuranceqa"
  # ranks (0,), residuals (), sources (), mol "": the collection's default
  ranks = (a["ranks"] if a["ranks"] != (0,) else
           (32, 128) if iqa else (2, 4, 8, 16, 32, 64, 96, 128))
  residuals = a["residuals"] or (("identity",) if iqa else ("none", "identity"))
  sources = tuple(x for x in a["sources"] or ((), ("ict", "both"))[not iqa] if x != "none")
  starts_at_dot = {"adapter": {"scorer": "adapter"},
                   "mol_residual": {**blocks.mol_row(), "residual": "dot"}}
  models = [starts_at_dot[m] for m in arguments.choices(a["models"], "models",
                                                         tuple(starts_at_dot))]
  negatives = arguments.choices(a["negatives"], "negatives", tuple(tables.NEGATIVES_LABELS))
  c = ConfigDict()
  c.job = "reproduce_table"
  c.collection = a["collection"]   # "" or an entry of experiment.spec.collection_block
  c.seed = 0                       # splits (dev carve-out); each model also runs every seed
  c.seeds = a["seeds"] if not a["quick"] else (0,)
  c.embeddings = a["embeddings"]   # "mean" and/or "cls" (embedding_specs.EMBEDDINGS)
  # The rows (config.tables.bilinear_table): dot, BM25, WDP, P Q^T at every residual x rank, full
  # bilinear, the MoL row (configs/mol.py's model, with `mol_train`'s changes), the residual
  # query adapter and the residual MoL (both start as dot), the rows of `source_rows` (names as
  # the models/ folders) trained again on other pairs, "ict" (pairs the corpus makes itself, no
  # judgement read) and "both" (judged + ICT pairs), the rows of `negatives_rows` trained again
  # with other negatives (`negatives_train`), and the hybrid of the judged-pair row best on dev
  # with BM25. A new row is one more entry of `c.rows`.
  c.rows = tables.bilinear_table(
      ranks if not a["quick"] else (2, 32, 128), residuals if not a["quick"] else ("none",),
      blocks.mol_row().to_dict() if arguments.optional_bool(a["mol"], "mol", iqa) else None,
      sources if not a["quick"] else (), a["source_rows"], "train_grid" if a["grid"] else None,
      models if not a["quick"] else (), negatives if not a["quick"] else (),
      a["negatives_rows"])
  # The `train` changes of the rows trained with other negatives: "corpus", the exact softmax
  # over every document (the other training queries' judged documents masked); "mined", each
  # query's hard negative drawn from the model's own top `train.hard_depth`, judged ones
  # removed, mined again every `refresh_every` steps.
  c.negatives_train = ConfigDict({"corpus": {"negatives_from": "corpus"},
                                  "mined": {"negatives_from": "mined", "refresh_every": 100}})
  c.train_grid = blocks.train_grid()  # with `grid`: the lr x temperature rows are selected over
  c.runner = ConfigDict({"summary": "seeds", "blank": {"rank": None, "residual": None},
                         "pool_p_at_1": True, "paired": True, "cell": ("embedding",),
                         "name": "scorer"})
  # data, encoder, bm25, model, train (+ per-embedding train_overrides), hybrid, eval: the
  # table's recipe (see blocks.table_recipe for each block's role).
  blocks.table_recipe(c)
  c.mol_train = blocks.mol_train()  # the MoL row's changes to `train`
  if iqa:  # the question's listed negatives; a run capped at max_steps (evaluated 10 times)
    c.train.negatives_from = "dataset"
    c.train.steps = a["max_steps"]
    c.train.eval_every = max(1, a["max_steps"] // 10)
    c.negatives_train.mined.refresh_every = 500  # as the learning curve's (27,413 answers)
  c.distributed = False
  return c
