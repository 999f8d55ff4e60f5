"""The `synthetic_agreement` job: Theorem 2 of paper 000 and its synthetic experiment, checked.

Rows (all evaluated on the same `num_test` random (q, I0) test instances, Wilson 95% intervals):

* constructed models, which are handed the instance's I0: the paper's rank-2 `W_I0` (through the
  `bilinear` scorer; also on all 2^n * n(n-1)/2 instances), the rank-1 `e_i1 e_i1^T` (through
  `lowrank`) and the closed-form WDP `v = 1 on I0, 0 elsewhere` (through `wdp`);
* one universal model trained across all I0: WDP with the four ranking pairs, WDP under the
  public code's (q, q, -q) protocol, learned low-rank and full bilinear models;
* one model per fixed I0 (WDP with two inits, low-rank, full), on its own I0 and on the others;

plus the exact LP answer to "does one v / one W solve every I0?" for each n in `lp_dims`, and a
figure of the agreeing vs disagreeing score distributions.
"""
from __future__ import annotations


import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bilinear_ir import scorers
from bilinear_ir.errors import require
from bilinear_ir.report import synthetic_agreement as report
from bilinear_ir.report import outputs
from bilinear_ir.studies import agreement_table as table_lib
from bilinear_ir.synthetic import feasibility

WDP_INITS = ("ones", "uniform")
def _runs(config: ml_collections.ConfigDict, field: str, batch_size: int) -> None:
  for run in config[field]:
    require(len(run) == 2, f"each run is (instances, epochs), got {run!r}", field=field)
    require(int(run[0]) >= batch_size, f"instances must be >= train.batch_size "
            f"({batch_size}), got {run[0]}", field=field)
    require(int(run[1]) >= 1, f"epochs must be >= 1, got {run[1]}", field=field)


def validate(config: ml_collections.ConfigDict) -> None:
  """Raises `InputError` (exit 2 in main) for any config value the job cannot run with."""
  n = config.n
  require(isinstance(n, int) and 3 <= n <= 12, f"must be an int in [3, 12], got {n!r}",
          field="n")
  require(config.num_test >= 1, f"must be >= 1, got {config.num_test}", field="num_test")
  t = config.train
  require(t.batch_size >= 1, f"must be >= 1, got {t.batch_size}", field="train.batch_size")
  require(t.learning_rate > 0, f"must be > 0, got {t.learning_rate}", field="train.learning_rate")
  require(t.weight_decay >= 0, f"must be >= 0, got {t.weight_decay}", field="train.weight_decay")
  require(t.margin > 0, f"must be > 0, got {t.margin}", field="train.margin")
  for field in table_lib.RUN_FIELDS:
    _runs(config, field, t.batch_size)
  require(config.public_init > 0, f"must be > 0, got {config.public_init}", field="public_init")
  for pair in config.fixed_pairs:
    require(len(pair) == 2 and 0 <= pair[0] < pair[1] < n,
            f"each pair is (i1, i2) with 0 <= i1 < i2 < n = {n}, got {pair!r}", field="fixed_pairs")
  for init in config.fixed_inits:
    require(init in WDP_INITS, f"each init is one of {WDP_INITS}, got {init!r}",
            field="fixed_inits")
  for r in config.lowrank_ranks:
    require(1 <= r <= n, f"each rank must be in [1, n = {n}], got {r}", field="lowrank_ranks")
  for m in config.lp_dims:
    require(2 <= m <= 10, f"each dimension must be in [2, 10], got {m}", field="lp_dims")


def run(config: ml_collections.ConfigDict,
        workdir: str) -> outputs.Report:  # pylint: disable=unused-argument
  """Runs every row, the LP and the figure; returns the Report (main writes it to workdir)."""
  validate(config)
  ex = table_lib.Table(config)
  n = ex.n
  ex.constructed()

  wdp = scorers.build("wdp", n)
  ones = scorers.init_params(wdp, table_lib.key_for(ex.root, "wdp_init"))
  for num, epochs in config.wdp_runs:
    ex.universal(f"wdp_trained_{table_lib.size_name(num)}_{epochs}ep", wdp, ones, (num, epochs),
                 model="wdp (v = 1 at init)")
  for num, epochs in config.public_runs:
    name = f"wdp_public_protocol_{table_lib.size_name(num)}_{epochs}ep"
    uniform = table_lib.wdp_uniform(table_lib.key_for(ex.root, name + "/init"), (n,),
                                    config.public_init)
    ex.universal(name, wdp, uniform, (num, epochs), protocol="public",
                 model=f"wdp (v ~ U(-{config.public_init}, {config.public_init}))")
  k = len(config.fixed_pairs)
  for num, epochs in config.fixed_runs:
    for init in config.fixed_inits:
      key = table_lib.key_for(ex.root, f"wdp_fixed_init/{num}/{epochs}")
      params = ({"v": jnp.ones((k, n), jnp.float32)} if init == "ones"
                else table_lib.wdp_uniform(key, (k, n), config.public_init))
      ex.fixed(f"wdp_fixed_{init}", wdp, params, (num, epochs),
               model=f"wdp (init {init})")

  bilinear_models = [(f"lowrank_r{r}", scorers.build("lowrank", n, rank=r), f"lowrank r={r}")
                     for r in config.lowrank_ranks]
  if config.full_bilinear:
    bilinear_models.append(("bilinear_full", scorers.build("bilinear", n),
                            "bilinear (W = I at init)"))
  for prefix, module, label in bilinear_models:
    for num, epochs in config.bilinear_runs:
      params = scorers.init_params(module, table_lib.key_for(ex.root, f"{prefix}/init"))
      ex.universal(f"{prefix}_trained_{table_lib.size_name(num)}_{epochs}ep", module, params,
                   (num, epochs), model=label)
    for num, epochs in config.bilinear_fixed_runs if k else ():
      inits = [scorers.init_params(module, table_lib.key_for(ex.root, f"{prefix}/fixed_init/{j}"))
               for j in range(k)]
      params = jax.tree.map(lambda *leaves: jnp.stack(leaves), *inits)
      ex.fixed(f"{prefix}_fixed", module, params, (num, epochs), model=label)

  lp = {family: {} for family in feasibility.FAMILIES}
  witnesses = {family: {} for family in feasibility.FAMILIES}
  for family in feasibility.FAMILIES:
    for m in config.lp_dims:
      theta = feasibility.universal_solution(int(m), family)
      lp[family][str(m)] = theta is not None
      if theta is not None:
        witnesses[family][str(m)] = np.round(theta, 6).tolist()

  results = {
      "n": n,
      "num_test": config.num_test,
      "num_instances": int(ex.q_all.shape[0]),
      "rows": ex.rows,
      "lp_feasibility": lp,
      "lp_witnesses": witnesses,
      "paper": report.PAPER,
  }
  return outputs.Report(results=results, markdown=report.markdown(config, ex.rows, lp),
                        figures={"score_distributions": report.figure(ex.samples)})
