"""Similarity scorers: pure Flax Linen modules, picked by name from one table (`registry`).

    module = scorers.build("lowrank", dim=384, rank=32, residual="identity")
    params = scorers.init_params(module, jax.random.key(config.seed))
    s = module.apply({"params": params}, q, docs, method=module.score_all)   # [B, N]
"""
from bilinear_ir.scorers.registry import build, from_config, init_params, names, options

__all__ = ["build", "from_config", "init_params", "names", "options"]
