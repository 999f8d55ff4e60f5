r"""finetune: what judged queries buy. Per embedding, the frozen dot product, BM25, the learned
similarities over the frozen embeddings, the encoder itself fine-tuned (query tower, two towers)
and the best hybrid, each against dot on all test questions and on the unseen-answer ones, with
what each costs.

  python -m bilinear_ir.main --config=configs/finetune.py --workdir=runs/finetune
  python -m bilinear_ir.main --config=configs/finetune.py:collection=insuranceqa,\
modes=two_tower,steps=2000,seeds=0 --workdir=runs/finetune_iqa

On a CPU host with 24 GB, two_tower needs `BILINEAR_IR_KEEP_FREED_MEMORY=0` in the environment
and `--config.finetune.batch_size=32`: at the default 64 SciFact claims (with their abstracts) the
job was killed for memory, and at 32 with the kept heap too; with both it peaked at 13.1 GB
(docs/results/finetune.md, `blocks.finetune_config`'s remat, `bilinear_ir.allocator`).

Rows (per embedding; `c.rows` as the learning curve declares its rows, `config.tables.study_table`,
run by the table runner): dot (the frozen encoder), BM25, the trained `models` over the frozen
embeddings (wdp, lowrank: residual I + P Q^T at every rank of `ranks`, bilinear: full W,
adapter; each with its `row_train` learning rate, the learning curve's `max_steps` / `evals`
schedule, selected on dev with step 0 a candidate), "learned" (per seed, the one of them best
on dev), "hybrid" (learned + BM25, lam on dev); then one fine-tune row per entry of `modes`
(`bilinear_ir.train.finetune` on the training queries' judged pairs with each query's hard
negatives, selected on dev every `steps / 10` steps, step 0, the frozen encoder, a candidate).
Dev is the collection's dev split (InsuranceQA's official dev questions; a dev part carved out
of train elsewhere); every test query is ranked over the full corpus. Columns: the measures, each
row against dot per query (all test queries; unseen-answer ones: no gold answer judged for a
training query; Holm over the table per view), the fraction of the two-tower gain over dot each
row recovers, training seconds and the hardware, whether the index changes (corpus re-encode
seconds, extra bytes per doc) and the scoring latency per query (exact top-10 over the corpus,
the query encoder left out: it is the same for every dense row). The chosen encoder of the
first seed of each mode is written to `WORKDIR/model/<embedding>-<mode>` as a
sentence-transformers folder (query_tower: the query tower; the doc side is the unchanged
source model). Every training run checkpoints under `WORKDIR/runs`: a killed job's rerun
resumes there.

Args (after `:`, comma separated; lists joined by `+`): collection (scifact; insuranceqa: the
`iqa` extra; or a BEIR folder or zip with a train split), modes (query_tower: only the query
encoder trains, the doc index never changes; two_tower: one shared encoder for both sides, the
corpus re-encoded for each dev evaluation and for test), loss (mnrl; corpus: query_tower only),
steps (of each fine-tune), embeddings (mean, cls: the pooling of the model the fine-tune starts
from), seeds, models (the trained rows over frozen embeddings: wdp, lowrank, bilinear, adapter),
ranks (of the lowrank rows), max_steps (of each trained row).
"""
from ml_collections import ConfigDict

from bilinear_ir.config import arguments
from bilinear_ir.config import blocks
from bilinear_ir.config import tables


def get_config(arg=None):
  a = arguments.parse_args(arg, {"collection": "scifact", "modes": ("query_tower", "two_tower"),
                                "loss": "mnrl", "steps": 1000, "embeddings": ("mean",),
                                "seeds": (0,), "models": ("wdp", "lowrank", "bilinear", "adapter"),
                                "ranks": (32,), "max_steps": 2000})
  c = ConfigDict()
  c.job = "finetune"
  c.seed = 0                       # the dev carve-out where there is no dev split; statistics
  c.collection = a["collection"]
  c.embeddings = a["embeddings"]   # each: the model's pooling and normalisation, trained as is
  c.seeds = a["seeds"]             # each seed: its own batch order and init
  # The rows over the frozen embeddings (config.tables.study_table, run by the table runner):
  # dot, BM25, the trained `models`, "learned" (per seed, the trained row best on dev, step 0
  # included) and "hybrid" (learned + BM25, lam on dev). A new row is one more entry.
  c.rows = tables.study_table(a["models"], a["ranks"], (), None, "row_train")
  # Each trained row takes its model's entry of `row_train` (the lr its dev split chose at full
  # n on InsuranceQA, blocks.row_train) and the learning curve's schedule: `train.epochs` over
  # the judged pairs, at most `max_steps` steps, `evals` dev evaluations besides step 0.
  c.row_train = blocks.row_train()
  c.max_steps = a["max_steps"]
  c.evals = 10
  c.runner = ConfigDict({"summary": "queries", "fields": ("dev", "best_steps", "seconds"),
                         "paired": False})
  # data, encoder, bm25, model, train, hybrid, eval, stats: the bilinear table's recipe. The
  # fine-tune reads `train.hard_depth` / `train.negatives_from` (each query's pool of hard
  # negatives) and `train.select_metric` (dev), `eval` (full-corpus ranking, measures).
  blocks.table_recipe(c)
  # InsuranceQA lists 200 negatives per question (a search engine's): the hard negative comes
  # from the first `train.hard_depth` of them there, from BM25's top `hard_depth` elsewhere.
  if c.collection == "insuranceqa":
    c.train.negatives_from = "dataset"
  c.train.hard_depth = 100
  # The fine-tunes, one row per mode (config.blocks.finetune_config, its `mode` set by `modes`:
  # AdamW with warm-up, temperature 0.05 = MNRL's scale 20, batches of 64 queries with 1 hard
  # negative each, dev every `eval_every` steps). `max_length` 0: the embeddings'
  # (`encoder.max_length`, else the model's: 256 for MiniLM).
  c.modes = a["modes"]
  c.finetune = blocks.finetune_config()
  del c.finetune.mode
  c.finetune.loss = a["loss"]
  c.finetune.steps = a["steps"]
  c.finetune.eval_every = max(1, a["steps"] // 10)          # 10 dev evaluations besides step 0
  c.finetune.warmup_steps = min(100, a["steps"] // 10)      # 10% of the steps, at most 100
  # Query latency: the exact top-10 of the first `batch` test queries over the corpus, each
  # row's scoring path (`experiment.costs`), the median of `repeats` interleaved rounds.
  c.latency = ConfigDict({"batch": 128, "repeats": 10})
  c.distributed = False
  return c
