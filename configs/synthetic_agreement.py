r"""Structured Agreement Ranking Task (paper 000, section 4, Theorem 2 and its synthetic check).

Run:
  python -m bilinear_ir.main --config=configs/synthetic_agreement.py --workdir=runs/agreement
  python -m bilinear_ir.main --config=configs/synthetic_agreement.py:tiny=true --workdir=runs/a

Config arguments (after `:`): `tiny` (seconds-long smoke run: few instances and epochs),
`seed`, `n`. Any field can also be set with `--config.FIELD=VALUE`.

A "run" below is `(instances, epochs)`: that many random training instances, that many passes.
"""
from __future__ import annotations

import ml_collections

from bilinear_ir.config import arguments


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The synthetic agreement job's config (see the module docstring for arguments)."""
  args = arguments.parse_args(arg, {"tiny": False, "seed": 0, "n": 10})
  c = ml_collections.ConfigDict()
  c.job = "synthetic_agreement"
  c.seed = args["seed"]  # every random choice (test set, training data, inits) derives from it
  c.distributed = False  # True: main calls jax.distributed.initialize() (multi-host launch)
  c.n = args["n"]  # dimension of the hypercube {-1, +1}^n, 3 <= n <= 16 (paper: 10)
  c.num_test = 1000  # random (q, I0) test instances per evaluation (paper: 1000)

  c.train = ml_collections.ConfigDict()
  c.train.batch_size = 128  # instances per step (4 ranking pairs each); paper code: 128
  c.train.learning_rate = 1e-3  # AdamW step size; paper code: 1e-3
  c.train.weight_decay = 1e-2  # AdamW decoupled weight decay (torch.optim.AdamW's default)
  c.train.margin = 1.0  # hinge margin of the margin ranking loss; paper code: 1.0

  # WDP (`wdp` scorer, v = 1 at init) on random (q, I0) with all four ranking pairs; the paper's
  # 50k x 5, 50k x 15 and 100k x 5. Rows `wdp_trained_{N}_{E}ep`.
  c.wdp_runs = ((50000, 5), (50000, 15), (100000, 5))
  # The public implementation's protocol: WDP sees only (q, pos = q, neg = -q), never I0;
  # v ~ uniform(-public_init, public_init). Rows `wdp_public_protocol_{N}_{E}ep`.
  c.public_runs = ((50000, 5),)
  c.public_init = 0.1
  # Models trained on ONE fixed I0 each (one model per pair), evaluated on their own I0 and on the
  # other pairs; the paper's 10k / 20k samples, 3 epochs, and the pairs it names.
  c.fixed_pairs = ((0, 1), (0, 2), (0, 3))
  # For WDP; (20000, 10) is ours: with v = 1 at init and lr 1e-3 each AdamW step moves a weight by
  # about 1e-3, and A - B = 2 v_I - 8 v_rest needs ~600 steps to turn positive.
  c.fixed_runs = ((10000, 3), (20000, 3), (20000, 10))
  c.fixed_inits = ("ones", "uniform")  # WDP init: the scorer's v = 1 or the public U(-.1, .1)
  # Learned bilinear models, trained as WDP is ("all_pairs"): `lowrank` (W = P Q^T, residual
  # "none", orthonormal P = Q at init) at each rank, and the full `bilinear` W (= I at init).
  c.lowrank_ranks = (1, 2, 4)
  c.full_bilinear = True
  c.bilinear_runs = ((50000, 5),)  # across all I0
  c.bilinear_fixed_runs = ((10000, 3), (10000, 10))  # per fixed I0 (the pairs above)
  # Exact LP: does ONE v / ONE full W solve every I0 for all q, at each n (each 2 <= n <= 10)?
  c.lp_dims = (3, 4, 5, 6, 7, 8)

  if args["tiny"]:  # one tiny run of each kind, for tests and the notebook
    c.num_test = 200
    c.wdp_runs = ((512, 1),)
    c.public_runs = ((256, 1),)
    c.fixed_pairs = ((0, 1),)
    c.fixed_runs = ((256, 1),)
    c.fixed_inits = ("uniform",)
    c.lowrank_ranks = (2,)
    c.full_bilinear = False
    c.bilinear_runs = ((256, 1),)
    c.bilinear_fixed_runs = ()
    c.lp_dims = (3, 4)
  return c
