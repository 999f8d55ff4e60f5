r"""finetune: the encoder itself trained on the judged queries, against the frozen dot product.

  python -m bilinear_ir.main --config=configs/finetune.py --workdir=runs/finetune
  python -m bilinear_ir.main --config=configs/finetune.py:collection=insuranceqa,\
mode=two_tower,steps=2000,seeds=0 --workdir=runs/finetune_iqa

Fine-tunes all-MiniLM-L6-v2 (`bilinear_ir.train.finetune`) on the training queries' judged pairs
with each query's hard negatives, selects the step on the collection's dev split (InsuranceQA's
official dev questions; a dev part carved out of train elsewhere), step 0, the frozen encoder,
a candidate, and ranks every test query over the full corpus. Rows: dot (the frozen encoder)
and the fine-tune, paired against dot on all test queries and on the unseen-answer ones (no
gold answer judged for a training query). The chosen encoder of the first seed is written to
`WORKDIR/model/<embedding>` as a sentence-transformers folder (query_tower: the query tower; the
doc side is the unchanged source model). Each fine-tune checkpoints under `WORKDIR/runs`: a
killed job's rerun resumes there.

Args (after `:`, comma separated; lists joined by `+`): collection (scifact; insuranceqa: the
`iqa` extra; or a BEIR folder or zip with a train split), mode (query_tower: only the query
encoder trains, the doc index never changes; two_tower: one shared encoder for both sides, the
corpus re-encoded for each dev evaluation and for test), loss (mnrl; corpus: query_tower only),
steps, embeddings (mean, cls: the pooling of the model the fine-tune starts from), seeds.
"""
from ml_collections import ConfigDict

from bilinear_ir.config import arguments
from bilinear_ir.config import blocks


def get_config(arg=None):
  a = arguments.parse_args(arg, {"collection": "scifact", "mode": "two_tower", "loss": "mnrl",
                                "steps": 1000, "embeddings": ("mean",), "seeds": (0,)})
  c = ConfigDict()
  c.job = "finetune"
  c.seed = 0                       # the dev carve-out where there is no dev split; statistics
  c.collection = a["collection"]
  c.embeddings = a["embeddings"]   # each: the model's pooling and normalisation, trained as is
  c.seeds = a["seeds"]             # each seed: its own batch order
  # data, encoder, bm25, model, train, hybrid, eval, stats: the bilinear table's recipe. The
  # fine-tune reads `train.hard_depth` / `train.negatives_from` (each query's pool of hard
  # negatives) and `train.select_metric` (dev), `eval` (full-corpus ranking, measures).
  blocks.table_recipe(c)
  # InsuranceQA lists 200 negatives per question (a search engine's): the hard negative comes
  # from the first `train.hard_depth` of them there, from BM25's top `hard_depth` elsewhere.
  if c.collection == "insuranceqa":
    c.train.negatives_from = "dataset"
  c.train.hard_depth = 100
  # The fine-tune (config.blocks.finetune_config: AdamW with warm-up, temperature 0.05 = MNRL's
  # scale 20, batches of 64 queries with 1 hard negative each, dev every `eval_every` steps).
  # `max_length` 0: the embeddings' (`encoder.max_length`, else the model's: 256 for MiniLM).
  c.finetune = blocks.finetune_config()
  c.finetune.mode = a["mode"]
  c.finetune.loss = a["loss"]
  c.finetune.steps = a["steps"]
  c.finetune.eval_every = max(1, a["steps"] // 10)          # 10 dev evaluations besides step 0
  c.finetune.warmup_steps = min(100, a["steps"] // 10)      # 10% of the steps, at most 100
  c.distributed = False
  return c
