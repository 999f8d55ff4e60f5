r"""Counts of a collection: docs, queries and qrels per split, mean lengths in words.

The cheapest job that reads data (it validates the whole collection on the way).

  python -m bilinear_ir.main --config=configs/collection_stats.py --workdir=runs/stats
  python -m bilinear_ir.main --config=configs/collection_stats.py:format=beir,path=DIR \
      --workdir=runs/stats
"""
from __future__ import annotations

import ml_collections

from bilinear_ir.config import arguments
from bilinear_ir.config import blocks


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """`arg`: `format=FORMAT,path=PATH` (defaults: the embedded SciFact)."""
  args = arguments.parse_args(arg, {"format": "scifact", "path": ""})
  c = ml_collections.ConfigDict()
  c.job = "collection_stats"  # bilinear_ir.data.loaders:stats_job
  c.seed = 0  # unused by this job; every config carries one
  # Which collection: format "scifact" | "beir" | "msmarco" | "trec" | "insuranceqa"; path "" =
  # embedded SciFact (scifact) or the installed package's files (insuranceqa).
  c.data = blocks.data_config()
  c.data.format = args["format"]
  c.data.path = args["path"]
  return c
