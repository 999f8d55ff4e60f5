r"""mol: Mixture-of-Logits (paper 003) on SciFact next to the bilinear table's dot / WDP / bilinear.

  python -m bilinear_ir.main --config=configs/mol.py --workdir=runs/mol

Same collection, train / dev / test split, frozen all-MiniLM-L6-v2 embeddings ("mean" normalised,
"cls" unnormalised) and measures as configs/reproduce_table.py, whose training recipe
(`train`, `train_overrides`) the comparison rows use unchanged. MoL rows: P_q = P_x in
`components`, with and without L_MI (`mi_weights`), each over `seeds`; then the MoL top-k
algorithms on the corpus for the best MoL (see bilinear_ir.eval.mol_table).

Args (after `:`, comma separated): seeds (`seeds=0+1+2`), components (`components=4+8`; the
default, 4 alone, keeps the run to minutes on 2 CPU cores: a P = 8 row costs ~2.5x),
mi_weights (`mi_weights=0.001+0`), embeddings (`mean+cls`), d_p, baselines (`wdp+bilinear`, or
`none` for MoL rows only), quick (bool: one seed, P = 4, "mean" only: a smoke run). Every field
can also be set with `--config.FIELD=VALUE`.
"""
from ml_collections import ConfigDict

from bilinear_ir.config import arguments
from bilinear_ir.config import blocks
from bilinear_ir.config import tables


def get_config(arg=None):
  a = arguments.parse_args(arg, {"seeds": (0, 1, 2), "components": (4,),
                               "mi_weights": (0.001, 0.0), "embeddings": ("mean", "cls"),
                               "d_p": 64, "baselines": ("wdp", "bilinear"), "quick": False})
  t = blocks.table_recipe(ConfigDict())    # the bilinear table's recipe
  c = ConfigDict()
  c.job = "mol"
  c.seed = 0                      # splits (dev carve-out); each model also runs every seed
  c.seeds = a["seeds"] if not a["quick"] else (0,)
  c.embeddings = a["embeddings"] if not a["quick"] else ("mean",)  # embedding_specs
  # The rows (config.tables.mol_table): dot, BM25, the trained comparison rows (`baselines`),
  # MoL for every P_q = P_x of `components` x alpha of L_MI of `mi_weights` (paper: 0.001; 0 =
  # none), each with `mol_train`'s changes. A new row is one more entry of `c.rows`.
  c.rows = tables.mol_table(tuple(b for b in a["baselines"] if b != "none"),
                            a["components"] if not a["quick"] else (4,), a["mi_weights"],
                            a["d_p"])
  c.runner = ConfigDict({"summary": "seeds", "paired": False,
                         "blank": {"p_q": None, "p_x": None, "d_p": None, "mi_weight": None}})
  c.data = t.data                 # the shipped SciFact: train (dev carved out), test
  c.encoder = t.encoder           # all-MiniLM-L6-v2, max_length 256, cached
  c.bm25 = t.bm25                 # BM25 row, hard negatives
  c.model = t.model               # scorer (and rank) set per row; the MoL fields below
  c.model.p_q = 4                 # set per row from `components`
  c.model.p_x = 4
  c.model.d_p = a["d_p"]          # component width d_P
  c.model.hidden = 256            # hidden width of each side's component MLP (384 -> 256 -> P*d_P)
  # Hidden width of the gating MLP (P logits -> gate_hidden -> P). It runs on every (query,
  # candidate) pair of a batch (128 x 384 here) and dominates a step's cost, so it is smaller
  # than the scorer's default 128.
  c.model.gate_hidden = 32
  # Logits are plain cosines in [-1, 1] (the softmax temperature is in `mol_train`). Dividing
  # them by 0.05 before the gate, as the reference MoL does, made the gates specialise (H(p|q,x)
  # 1.38 vs 2.74 nats of log 16 = 2.77) but lost on dev: nDCG@10 0.551 vs 0.652 ("mean", P = 4,
  # seed 0, alpha 0.001).
  c.model.temperature = 1.0
  c.model.mi_weight = 0.001       # set per row from `mi_weights`
  c.model.inputs = "vector"       # frozen pooled embeddings [B, n]
  c.train = t.train               # the table's recipe (loss, negatives, epochs, lr, selection)
  c.train_overrides = t.train_overrides  # the table's per-embedding changes to `train`
  # Changes to `train` for the MoL rows only (applied after `train_overrides`). MoL's logits are
  # cosines of L2-normalised components whatever the embedding's scale, so the softmax gets a
  # fixed temperature; `auto_temperature` would measure the spread of a randomly initialised
  # network's scores instead. lr is the table's (the paper's QA grid, 2e-4..8e-4, fine-tunes an
  # LM; here small MLPs start from scratch). 40 epochs (~240 steps): on SciFact "mean", P = 4,
  # seed 0, the dev nDCG@10 of MoL levels off after ~150 steps (0.652 at 40 epochs vs 0.658 at the
  # table's 100, whose test nDCG@10 was lower, 0.596 vs 0.607) at 2.5x less time.
  c.mol_train = ConfigDict({"auto_temperature": False, "temperature": 0.05,
                            "lr": t.train.lr, "epochs": 40})
  c.gate_sample_docs = 512        # docs (drawn by seed) per test query for the gate entropies
  c.retrieval = ConfigDict()      # the MoL top-k algorithms on the corpus (retrieval.mol_topk)
  c.retrieval.k = 10              # K
  c.retrieval.max_range = 4096    # exact_two_pass: static bound of the range query
  c.retrieval.per_embedding = (5, 10, 50)   # TopKPerEmbd(N): N per component
  c.retrieval.avg = (10, 100, 500)          # TopKAvg(N)
  c.retrieval.comb_n1 = (5,)                # CombTopK(N1, N2), paired with comb_n2
  c.retrieval.comb_n2 = (100,)
  c.retrieval.chunk = 1024        # items per scan step: (query_batch, chunk, P) logits at once
  c.retrieval.query_batch = 32    # queries per call (the paper's latency batch)
  c.eval = t.eval                 # full-corpus exact ranking, the four measures
  c.distributed = False
  return c
