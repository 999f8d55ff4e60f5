"""Exact top-k with the doc table split over devices (`jax.shard_map`) and over processes.

Devices: the doc table is sharded by rows over a 1-D mesh; each shard runs the chunked exact
top-k (`exact.scan_topk`) on its own rows, adds its global row offset (`lax.axis_index * rows`),
and ONE merge of num_shards * k candidates (by score desc, id asc) gives the global top-k. There is
never a `top_k` over a sharded axis. Rows are padded to a multiple of the device count; padding
rows are masked, so any N works.

Processes (multi-host): `process_rows` gives each process a contiguous slice of the docs; each
process retrieves over its slice (on its local devices) and `multihost_topk` all-gathers the
per-process [B, k] lists and merges them, so every process ends with the same global top-k.
On CPU the cross-process collectives are gloo (jax 0.10's default
`jax_cpu_collectives_implementation`); call `jax.distributed.initialize(...)` first.

    mesh = doc_mesh()                               # all devices, axis "docs", Auto axis type
    res = sharded_topk(qt, dt, k=10, mesh=mesh)     # == exact.topk(qt, dt, 10)

    lo, hi = process_rows(num_docs)                 # this process's docs
    res = multihost_topk(qt, dt_local, 10, id_offset=lo, num_docs=num_docs)
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from bilinear_ir.errors import input_error
from bilinear_ir.retrieval import exact

AXIS = "docs"


def doc_mesh(num_devices: int | None = None, devices=None) -> Mesh:
  """A 1-D mesh with axis "docs" (Auto axis type, so the merge after shard_map compiles).

  Args:
    num_devices: how many devices (default: all of `devices`).
    devices: the devices to use (default: `jax.local_devices()`).
  """
  devices = list(jax.local_devices() if devices is None else devices)
  num_devices = len(devices) if num_devices is None else num_devices
  if not 1 <= num_devices <= len(devices):
    raise input_error(f"must be in [1, {len(devices)}], got {num_devices}", file="config",
                      field="retrieval.num_devices")
  return jax.make_mesh((num_devices,), (AXIS,), axis_types=(AxisType.Auto,),
                       devices=devices[:num_devices])


def shard_rows(doc_table, mesh: Mesh) -> jax.Array:
  """Pads dt [N, w] to a multiple of the mesh size and places it row-sharded: [S * R, w]."""
  shards = mesh.shape[AXIS]
  n = np.shape(doc_table)[0]
  padded = -(-n // shards) * shards
  if isinstance(doc_table, jax.Array) and padded == n:
    table = doc_table
  else:
    table = np.asarray(doc_table)
    if padded != n:
      table = np.concatenate([table, np.zeros((padded - n, table.shape[1]), table.dtype)])
  return jax.device_put(table, NamedSharding(mesh, P(AXIS, None)))


def sharded_topk(query_table, doc_table, k: int, *, mesh: Mesh | None = None,
                 num_docs: int | None = None, chunk: int | None = None,
                 block: int | None = None, id_offset: int = 0) -> exact.TopK:
  """Exact top-k with the doc table row-sharded over `mesh`: qt [B, w], dt [N, w] -> TopK [B, k].

  Args:
    query_table: [B, w] (replicated to every device).
    doc_table: [N, w], or an already placed [S * R, w] from `shard_rows` (then pass `num_docs`).
    k: results per query, 1 <= k <= N.
    mesh: 1-D mesh with axis "docs" (default `doc_mesh()`).
    num_docs: real rows when `doc_table` carries padding rows at its end.
    chunk, block: per-shard scan settings (`exact.topk`).
    id_offset: added to every id.

  Returns:
    TopK [B, k], identical to the single-device `exact.topk` (ties by lower id first).
  """
  mesh = doc_mesh() if mesh is None else mesh
  n = np.shape(doc_table)[0] if num_docs is None else num_docs
  exact.check_tables(query_table, doc_table, k, num_docs=n)
  if n > np.shape(doc_table)[0]:
    raise input_error(f"num_docs {n} exceeds the table's {np.shape(doc_table)[0]} rows",
                      file="doc_table", field="num_docs")
  table = shard_rows(doc_table, mesh)
  qt = jax.device_put(jnp.asarray(query_table), NamedSharding(mesh, P()))
  return _sharded(qt, table, k, mesh, chunk, block, jnp.int32(n), jnp.int32(id_offset))


@functools.partial(jax.jit, static_argnames=("k", "mesh", "chunk", "block"))
def _sharded(qt, table, k, mesh, chunk, block, num_docs, id_offset):
  rows = table.shape[0] // mesh.shape[AXIS]

  def local(qt, dt):
    start = lax.axis_index(AXIS) * rows
    res = exact.scan_topk(qt, dt, k, chunk, block, id_offset=start,
                          num_valid=num_docs - start)
    return res.scores[None], res.ids[None]

  scores, ids = jax.shard_map(local, mesh=mesh, in_specs=(P(), P(AXIS, None)),
                              out_specs=(P(AXIS), P(AXIS)),
                              check_vma=False)(qt, table)  # the scan's initial state is unvarying
  # [S, B, k] -> [B, S * k]: one merge of every shard's candidates.
  b = qt.shape[0]
  scores = jnp.transpose(scores, (1, 0, 2)).reshape(b, -1)
  ids = jnp.transpose(ids, (1, 0, 2)).reshape(b, -1)
  res = exact.merge(scores, ids, k)
  return exact.TopK(res.scores, jnp.where(res.ids == exact.NO_DOC, res.ids, res.ids + id_offset))


def process_rows(num_docs: int, process_index: int | None = None,
                 process_count: int | None = None) -> tuple[int, int]:
  """This process's contiguous doc rows `[lo, hi)` (sizes differ by at most one).

  Args:
    num_docs: N, total docs.
    process_index: default `jax.process_index()`.
    process_count: default `jax.process_count()`.
  """
  i = jax.process_index() if process_index is None else process_index
  p = jax.process_count() if process_count is None else process_count
  if not 0 <= i < p:
    raise input_error(f"process index {i} not in [0, {p})", file="distributed")
  return (i * num_docs) // p, ((i + 1) * num_docs) // p


def multihost_topk(query_table, local_doc_table, k: int, *, id_offset: int, num_docs: int,
                   mesh: Mesh | None = None, local_docs: int | None = None,
                   **kwargs) -> exact.TopK:
  """Global top-k when each process holds the rows `process_rows(num_docs)` of the doc table.

  Every process passes the same queries; each retrieves over its rows (sharded over its local
  devices), the per-process [B, k] lists are all-gathered and merged. Every process returns the
  same result, identical to `exact.topk` over the whole table.

  Args:
    query_table: [B, w], equal on every process.
    local_doc_table: [N_p, w], this process's rows (may hold fewer than k rows, or none), or
      `shard_rows(rows, mesh)` placed once for many calls (then pass `local_docs`).
    k: results per query, 1 <= k <= num_docs.
    id_offset: global id of this process's first row (`process_rows(num_docs)[0]`).
    num_docs: N over all processes.
    mesh: mesh of this process's local devices (default: all of them).
    local_docs: N_p, this process's real rows, when `local_doc_table` carries padding rows at
      its end (default: all its rows).
    **kwargs: `chunk`, `block` for the per-device scan.

  Returns:
    TopK [B, k] as numpy arrays (host values, the same on every process).
  """
  exact.check_tables(query_table, local_doc_table, k, num_docs=num_docs)
  b = np.shape(query_table)[0]
  rows = np.shape(local_doc_table)[0] if local_docs is None else local_docs
  if rows:
    local = sharded_topk(query_table, local_doc_table, min(k, rows), mesh=mesh, num_docs=rows,
                         id_offset=id_offset, **kwargs)
    scores, ids = np.asarray(local.scores), np.asarray(local.ids)
    if rows < k:  # pad to [B, k] so every process contributes the same shape
      scores = np.concatenate([scores, np.full((b, k - rows), -np.inf, np.float32)], axis=1)
      ids = np.concatenate([ids, np.full((b, k - rows), exact.NO_DOC, np.int32)], axis=1)
  else:
    scores = np.full((b, k), -np.inf, np.float32)
    ids = np.full((b, k), exact.NO_DOC, np.int32)
  return merge_processes(multihost_utils.process_allgather(scores),
                         multihost_utils.process_allgather(ids), k)


def merge_processes(scores, ids, k: int) -> exact.TopK:
  """Merges per-process lists: scores, ids [P, B, k] -> TopK [B, k] (numpy), ties by lower id."""
  p, b, kk = np.shape(scores)
  flat_s = np.transpose(np.asarray(scores, np.float32), (1, 0, 2)).reshape(b, p * kk)
  flat_i = np.transpose(np.asarray(ids, np.int32), (1, 0, 2)).reshape(b, p * kk)
  res = exact.merge(flat_s, flat_i, k)
  return exact.TopK(np.asarray(res.scores), np.asarray(res.ids))
