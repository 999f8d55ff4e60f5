"""Latency of a late-interaction table's rows: the inputs of the timed call (1 query x
`latency.docs` stored docs) and every row's call timed in turn."""
from __future__ import annotations

from typing import Any, Callable

import jax.numpy as jnp
import numpy as np

from bilinear_ir import timing
from bilinear_ir.studies.late_interaction.setting import Setting


def latency_inputs(setting: Setting, docs: int) -> tuple:
  """(q [1, Tq, n], qm [1, Tq], d [K, Td, n], dm [K, Td], doc rows [K]): the first test query and
  its first `docs` candidates (its BM25 top list)."""
  r = setting.rows["test"][:1]
  rows = setting.cands["test"][0][:docs]
  rows = rows[rows >= 0]
  q, qm = setting.token_queries(r)
  d, dm = setting.token_docs
  return (jnp.asarray(q), jnp.asarray(qm), jnp.asarray(d[rows]), jnp.asarray(dm[rows]), rows)

def token_call(module, scorer: str, params: Any, lat: tuple, dtype
               ) -> tuple[Callable[[], Any], int, int]:
  """A token row's timed call on `lat` (`latency_inputs`) stored in `dtype` (`timing.mebert_case`
  for ME-BERT, else `timing.late_case` over all K docs in one chunk): (call, vectors per doc,
  width)."""
  q, qm, d, dm, _ = lat
  case = timing.mebert_case if scorer == "mebert" else timing.late_case
  lat_module = module if scorer == "mebert" else module.clone(doc_chunk=int(d.shape[0]))
  return case(lat_module, params, q, qm, d, dm, dtype)

def time_in_turn(calls: dict[str, Callable[[], Any]], rounds: int, repeats: int
                 ) -> dict[str, float]:
  """{label: ms}: every call timed `repeats` times (`timing.timed`) in turn, `rounds`
  times (so load drift hits all alike); the median over rounds of each round's median."""
  times = {label: [] for label in calls}
  for _ in range(int(rounds)):
    for label, call in calls.items():
      times[label].append(timing.timed(call, int(repeats)))
  return {label: float(np.median(t)) for label, t in times.items()}
