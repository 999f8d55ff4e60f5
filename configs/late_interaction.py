r"""late_interaction: DE, ColBERT, ME-BERT, LITE, flattened LITE, KNRM and a hybrid, re-ranking.

  python -m bilinear_ir.main --config=configs/late_interaction.py --workdir=runs/late_interaction
  python -m bilinear_ir.main --config=configs/late_interaction.py:collection=insuranceqa,\
sizes=300+1000+3000+12889 --workdir=runs/late_interaction_iqa

The LITE paper's frozen-encoder ablation (appendix A.4) on SciFact: frozen all-MiniLM-L6-v2 token
outputs (Tq = 32, Td = 128, cached once on disk), re-ranking of BM25 top-100 + 100 random docs per
test query (no judged docs injected), scorers trained on SciFact train (dev carved out for
selection; any collection with a training split through `collection`), and KL / margin-MSE
distillation of separable LITE from the better (on dev) of BM25 and a bilinear similarity trained
on the pooled embeddings (bilinear_ir/jobs/late_interaction.py).

Models defined besides the default rows (name them in `--config.rows`): colbert_proj (ColBERT's
P' = 128 projection, trained), lite_paper (separable LITE at the paper's widths m1 = 360, m2 =
2400), lite_small (the paper's small LITE: L2' = 50 doc tokens by a learned linear map,
m2 = 768), table (the table similarity of `c.table` best on dev, full W or I + P Q^T r = 32,
on the pooled embeddings, re-ranking the same candidates) and bm25 (BM25's own order of the
candidates, the first stage itself).

Fine-tuned rows (expensive: the encoder trains; name them in `--config.rows`), each trained
jointly with the encoder (two_tower, `c.finetune` with the model's "finetune" changes), selected on
dev every `finetune.eval_every` steps (step 0, the frozen encoder, a candidate), the candidate
docs encoded again with the tuned weights, and compared per query with every row (each is a
baseline of the paired tests too): de_ft (paper 002's fine-tuned dual encoder, pooled mean, dot),
mebert_ft (ME-BERT m = 8, paper 002), colbert_ft (ColBERT sum-max with a trained P' = 128
projection, paper 004) and lite_ft (separable LITE, paper 004's main setting); and qt_ft, DE
with only its query tower trained (query_tower: the doc index never changes). With de_ft, the
report adds "what judged queries buy" in this one protocol: every row against dot on all test
queries and on the unseen-answer ones, the fraction of de_ft's gain it recovers, its training
and what it does to the index, e.g.

  python -m bilinear_ir.main --config=configs/late_interaction.py:quick=true \
--config.rows="('dot','bm25','table','colbert','qt_ft','de_ft','colbert_ft','lite_ft','hybrid')" \
--config.finetune.steps=20 --workdir=runs/late_interaction_ft

Every trained token row is selected on dev with the untrained ColBERT as a candidate (the row
reports ColBERT's numbers, `kept_colbert`, when no trained step beats it on dev) and compared per
test query with ColBERT and with dot (Holm over each baseline's comparisons).

Args (after `:`): collection (scifact; insuranceqa: the package insuranceqa-data 1.2, the `iqa`
extra, with its own dev split and, per test question, the own-pool P@1; or a BEIR folder or zip
with a train split), sizes (training questions n, joined by `+`: one set of rows per n on the
learning curve's nested subsets drawn by the seed; empty: the whole training split), seed, steps
(training steps of every trained row), td (doc tokens Td), distill (bool: the distillation
rows), quick (bool: 40 steps, LITE/KNRM/colbert rows only, no distillation — a smoke run on the
real data).
"""
from ml_collections import ConfigDict

from bilinear_ir.config import arguments
from bilinear_ir.config import blocks


def get_config(arg=None):
  a = arguments.parse_args(arg, {"collection": "scifact", "sizes": "", "seed": 0, "steps": 100,
                               "td": 128, "distill": True, "quick": False})
  c = ConfigDict()
  c.job = "late_interaction"
  c.seed = a["seed"]                 # splits, inits, batches, random candidates
  # The collection (`experiment.spec.collection_block` turns it into the data block): an
  # embedded name (scifact), an installed one (insuranceqa) or a BEIR folder or zip with a train
  # split. Its official dev split selects where it has one, else `data.dev_fraction` of train.
  c.collection = a["collection"]
  c.data = blocks.data_config()            # splits and dev carve-out (format/path: collection)
  # Training subsets of the curve (the learning_curve job's nested subsets, drawn by `seed`): one
  # set of rows per n; () = the whole training split. A size above the split means all of it.
  c.sizes = arguments.optional_ints(a["sizes"], "sizes")
  c.encoder = blocks.encoder_config()      # all-MiniLM-L6-v2: pooled (DE) + token outputs
  c.encoder.query_max_length = 32    # Tq query tokens (12% of SciFact claims are longer)
  # Td doc tokens. SciFact abstracts have a median of 316 tokens (98% are cut at 128, 91% at 180,
  # 71% at 256); the token cache is 509 MB at 128 (float16), 716 MB at 180, 1.02 GB at 256, and
  # every late-interaction scorer's cost grows linearly in Td: 128 keeps the job near 15 min.
  c.encoder.doc_max_length = a["td"]
  c.bm25 = blocks.bm25_config()               # candidates, hard negatives, BM25 teacher, hybrid
  c.rerank = ConfigDict()
  c.rerank.bm25_depth = 100          # BM25 candidates per query
  c.rerank.random_docs = 100         # + random docs from the rest of the corpus (seeded)

  # Table rows, in order: "dot" (DE, pooled mean embeddings), names of c.models, "hybrid".
  # "colbert_proj" (ColBERT with a trained P' = 128 projection) is defined but left out by
  # default to keep the job within ~15 minutes on 2 CPU cores; so is "table" (`c.table`).
  c.rows = ("dot", "colbert", "mebert", "lite", "lite_flat", "knrm", "hybrid")
  # Row name -> registry scorer + options (query_len / doc_len come from c.encoder).
  c.models = ConfigDict({
      "colbert": {"scorer": "colbert"},                       # sum-max on raw tokens: untrained
      "colbert_proj": {"scorer": "colbert", "token_dim": 128,  # ColBERT's P' = 128 projection
                       "normalize": True},
      "mebert": {"scorer": "mebert", "num_vectors": 8, "proj_dim": 128, "query_pool": "mean"},
      "lite": {"scorer": "lite", "m1": 32, "m2": 256},        # paper: m1 360, m2 2400 (A.1)
      "lite_paper": {"scorer": "lite", "m1": 360, "m2": 2400},  # the paper's widths (A.1)
      # the paper's "small" LITE: L2' = 50 doc tokens (a learned linear map), W1 (768, 50)
      "lite_small": {"scorer": "lite", "m1": 360, "m2": 768, "doc_tokens": 50,
                     "doc_reduction": "linear"},
      "lite_flat": {"scorer": "lite_flat", "width": 256},
      "knrm": {"scorer": "knrm"},
      # Fine-tuned with the encoder (`c.finetune` + these changes): DE at MNRL's scale 20 on
      # cosines; the token heads on their raw scores (temperature 1, as papers 002 and 004 train
      # them with cross entropy), their own params (from random) at `head_lr`.
      "de_ft": {"scorer": "dot", "finetune": {"temperature": 0.05}},
      # DE with only its query tower trained (the doc index stays the frozen one).
      "qt_ft": {"scorer": "dot", "finetune": {"temperature": 0.05, "mode": "query_tower"}},
      "mebert_ft": {"scorer": "mebert", "num_vectors": 8, "proj_dim": 128, "query_pool": "mean",
                    "finetune": {}},
      "colbert_ft": {"scorer": "colbert", "token_dim": 128, "normalize": True, "finetune": {}},
      "lite_ft": {"scorer": "lite", "m1": 32, "m2": 256, "finetune": {}},
  })
  c.train = blocks.train_config()     # shared recipe of the trained rows (cross entropy)
  c.train.loss = "softmax"
  c.train.auto_temperature = True    # temperature = 0.1 x std of the initial scores
  c.train.temperature = 0.1
  c.train.batch_size = 16            # B queries; C = 3B candidates, all B x C pairs scored
  c.train.hard_negatives = 1         # one BM25 top-100 negative + one random per query
  c.train.random_negatives = 1
  c.train.in_batch = True
  # InsuranceQA lists 200 negatives per question (a search engine's): the hard negative comes
  # from them there; BM25 elsewhere.
  if c.collection == "insuranceqa":
    c.train.negatives_from = "dataset"
  c.train.steps = a["steps"]         # 100 x 16 pairs ~ 2 epochs of SciFact train
  c.train.lr = 3e-3                  # on dev (100 steps), 3e-3 beat 1e-3 for lite, lite_flat
  c.train.warmup_steps = 10
  c.train.eval_every = 50            # dev re-ranking for model selection
  c.train_overrides = ConfigDict({   # row name -> {field: value} changes to c.train
      "knrm": {"lr": 1e-3}})         # and mebert; 1e-3 was better for knrm
  # The fine-tuned rows' shared recipe (`bilinear_ir.train.finetune`): the encoder at the
  # sentence-transformers learning rate, the heads at the frozen rows' 3e-3 (`c.train.lr`).
  c.finetune = blocks.finetune_config()
  c.finetune.mode = "two_tower"
  c.finetune.temperature = 1.0
  c.finetune.lr = 5e-5
  c.finetune.head_lr = 3e-3
  c.finetune.batch_size = 16         # + 1 hard negative each (c.train's pool): C = 32
  c.finetune.hard_negatives = 1
  c.finetune.steps = 200
  c.finetune.warmup_steps = 20
  c.finetune.eval_every = 50
  c.finetune.checkpoint_every = 50
  c.distill = ConfigDict()
  c.distill.scorers = ("lite",) if a["distill"] else ()  # rows also trained by distillation
  c.distill.losses = ("kl", "margin_mse")
  c.distill.teacher = "best"         # "bm25", "bilinear" or "best" (higher dev select_metric)
  c.distill.teacher_temperature = 0.3  # x the teacher's score std over BM25 top-100 lists
  c.teacher = ConfigDict()           # the bilinear teacher on pooled mean embeddings
  c.teacher.model = blocks.model_config()
  c.teacher.model.scorer = "bilinear"
  c.teacher.train = blocks.train_config()    # the reproduce_table recipe
  c.teacher.train.auto_temperature = True
  c.teacher.train.temperature = 0.1
  c.teacher.train.batch_size = 128
  c.teacher.train.epochs = 40
  c.teacher.train.eval_every = 25
  if c.collection == "insuranceqa":  # the curve's full-n schedule (configs/learning_curve.py):
    c.teacher.train.steps = 2000     # 40 epochs would be 6,700 steps and 268 dev rankings of
    c.teacher.train.eval_every = 200  # 2,000 questions over 27,413 answers
  # The "table" row (name it in `rows`): the table similarity best on dev among these, each
  # trained on the pooled mean embeddings by the learning curve's recipe (configs/
  # learning_curve.py: its train block, at most 2,000 steps and 10 dev evaluations on
  # InsuranceQA), re-ranking the same candidates: the like-for-like rival of the token rows.
  c.table = ConfigDict()
  c.table.models = ConfigDict({
      "lowrank_r32": blocks.model_config(), "bilinear": blocks.model_config()})
  c.table.models.lowrank_r32.scorer = "lowrank"          # I + P Q^T, r = 32
  c.table.models.lowrank_r32.residual = "identity"
  c.table.train = blocks.train_config()
  if c.collection == "insuranceqa":
    c.table.train.negatives_from = "dataset"
    c.table.train.steps = 2000
    c.table.train.eval_every = 200
  c.hybrid = blocks.hybrid_config()    # lam grid, min-max normalisation, dev measure
  c.eval = blocks.eval_config()       # measures (and the teacher's own full-ranking evaluation)
  c.stats = blocks.stats_config()     # paired tests of every row against colbert and dot
  c.storage = ConfigDict()
  c.storage.dtype = "float16"        # stored doc vectors (as the token cache); bytes_per_doc
  c.storage.doc_tokens = (100, 50, 32)      # L2' rows of the storage table
  c.storage.token_dims = (128, 64, 32)      # P' rows of the storage table
  c.storage.dtypes = ("float32", "float16")
  c.latency = ConfigDict()
  c.latency.docs = 100               # 1 query x 100 stored docs (LITE paper Table 3)
  c.latency.repeats = 20             # timed calls per round (median)
  c.latency.rounds = 3               # rounds over all rows in turn (median of round medians)
  c.distributed = False
  if a["quick"]:
    c.rows = ("dot", "colbert", "lite", "knrm", "hybrid")
    c.train.steps = 40
    c.train.eval_every = 20
    c.finetune.steps = 20
    c.finetune.warmup_steps = 2
    c.finetune.eval_every = 10
    c.distill.scorers = ()
  return c
