r"""learning_curve: how many judged queries does a learned similarity need to beat the dot product?

  python -m bilinear_ir.main --config=configs/learning_curve.py --workdir=runs/curve
  python -m bilinear_ir.main --config=configs/learning_curve.py:collection=scifact,\
embeddings=mean,seeds=0,sizes=100+300+809 --workdir=runs/curve_scifact

Trains every model on nested subsets of the training queries (n = `sizes`; each larger subset
holds the smaller ones, drawn by seed), selects on the collection's dev split (InsuranceQA's
official dev questions; a dev part carved out of train where there is none, before subsetting)
and evaluates on every test query over the full corpus. Per n: paired tests against dot on all
test queries and on the unseen-answer ones (no gold answer judged for a training query of the
subset), Holm over the curve.

Args (after `:`, comma separated; lists joined by `+`): collection (insuranceqa: the package
insuranceqa-data 1.2, the `iqa` extra; scifact; or a BEIR folder or zip with a train split),
embeddings (mean, cls, mpnet-mean, ... or precomputed:DIR), seeds, sizes (a size larger than
the training split means all of it), grid (bool: select lr x temperature on dev per run),
models (wdp, lowrank, bilinear, mol, mol_residual, adapter; "learned", the
dev-selected one, is always added), ranks (of the residual I + P Q^T rows), max_steps,
finetunes (query_tower, two_tower: the encoder itself fine-tuned at every n as one more row per
mode, `configs/finetune.py`'s recipe; default none), finetune_epochs (of each fine-tune over its
n queries), quick (bool: one seed, sizes 100+1000, mean only, wdp + lowrank r = 32: a smoke run).
"""
from ml_collections import ConfigDict

from bilinear_ir.config import arguments
from bilinear_ir.config import blocks
from bilinear_ir.config import tables


def get_config(arg=None):
  a = arguments.parse_args(arg, {"collection": "insuranceqa",
                                "embeddings": ("mean", "cls", "mpnet-mean"), "seeds": (0, 1, 2),
                                "sizes": (100, 300, 1000, 3000, 12889),
                                "models": ("wdp", "lowrank", "bilinear", "adapter"),
                                "ranks": (32,), "max_steps": 2000, "grid": False,
                                "finetunes": (), "finetune_epochs": 1.0, "finetune_evals": 10,
                                "quick": False})
  quick = a["quick"]
  c = ConfigDict()
  c.job = "learning_curve"
  c.seed = 0                       # the dev carve-out where there is no dev split; statistics
  c.collection = a["collection"]
  c.embeddings = a["embeddings"] if not quick else ("mean",)
  c.seeds = a["seeds"] if not quick else (0,)   # each seed: its own subset order and init
  c.sizes = a["sizes"] if not quick else (100, 1000)
  # The rows of each point (config.tables.curve_table): dot, the trained `models` (lowrank:
  # residual I + P Q^T at every rank of `ranks`; mol: the `mol` block with `mol_train`'s changes)
  # and "learned", per seed the one of dot and them best on dev. A new row is one more entry.
  c.rows = tables.curve_table(a["models"] if not quick else ("wdp", "lowrank"),
                              a["ranks"] if not quick else (32,),
                              "train_grid" if a["grid"] else None, "row_train")
  # Each trained row but MoL takes its model's entry of `row_train`: the learning rate its dev
  # split chose at full n (blocks.row_train).
  c.row_train = blocks.row_train()
  # With `grid`, every row but MoL is trained at each point of `train_grid` (lr x temperature)
  # and the point best on dev kept, per run, like the step (rows record "grid_points").
  c.train_grid = blocks.train_grid()
  # "fit": each trained row's dev metric on up to `fit_queries` of each run's own training
  # questions, at step 0 and selected: set beside the gain on dev, what it learnt of those
  # questions only (rows record "fit").
  c.runner = ConfigDict({"summary": "queries", "fields": ("dev", "best_steps", "seconds", "fit"),
                         "fit_queries": 2000, "paired": False})
  # data, encoder, bm25, model, train, hybrid, eval, stats: the bilinear table's recipe.
  blocks.table_recipe(c)
  # Training length per subset: the recipe's `train.epochs` over the subset's judged pairs, at
  # most `max_steps` steps, with `evals` dev evaluations spread over the run (step 0, the
  # untrained model, is one of them: selection can keep it).
  c.max_steps = a["max_steps"]
  c.evals = 10
  # The hard negative: on InsuranceQA, from the current model's own top `train.hard_depth`
  # (100) answers over the whole corpus, judged ones removed, mined again every 500 steps
  # ("mined"): dev preferred it to the 200 the dataset lists per question (a search engine's;
  # `--config.train.negatives_from=dataset`) on every row and embedding measured, and mining
  # every 500 steps instead of 100 kept that at a fifth of the cost
  # (docs/results/learning_curve.md). BM25's top `train.hard_depth` elsewhere. results.json
  # records both ("negatives"; each row's `negatives_from`).
  if c.collection == "insuranceqa":
    c.train.negatives_from = "mined"
    c.train.refresh_every = 500
  c.train.hard_depth = 100
  # The MoL row: configs/mol.py's model (P = 4, d_P = 64, L_MI 0.001) and its training changes.
  c.mol = blocks.mol_row()
  # models=mol_residual: the residual MoL (the dot product one more logit, its gate on it at
  # step 0: it starts as dot).
  c.mol_residual = blocks.mol_row()
  c.mol_residual.residual = "dot"
  c.mol_train = blocks.mol_train()
  # finetunes=query_tower+two_tower: per n, the encoder fine-tuned on the same subset of each
  # seed (`experiment.finetuning.curve_rows`), one row per mode, beside the learned
  # similarities: configs/finetune.py's recipe (MNRL, batches of 64 queries, AdamW with warm-up),
  # `finetune_epochs` epochs of the n queries, `finetune_evals` dev evaluations (a two-tower
  # one re-encodes the corpus: 7-12 min for InsuranceQA's on 2 CPU cores), step 0 a candidate;
  # each query's hard negative from the collection's listed ones (else BM25's) where the rows mine
  # theirs (a fine-tune does not re-encode the corpus to mine; `experiment.finetuning.Setting`).
  c.modes = a["finetunes"] if not quick else ()
  c.finetune_epochs = a["finetune_epochs"]
  c.finetune_evals = a["finetune_evals"]
  c.finetune = blocks.finetune_config()
  del c.finetune.mode
  c.finetune.loss = "mnrl"
  c.distributed = False
  return c
