"""Every matmul behind an exact claim, a certificate or a pruning bound runs at float32.

JAX's default matmul precision is float32 on CPU but TF32 on recent NVIDIA GPUs and one bf16 pass
on TPU; the exact scans, the certificates (u = 2^-24) and MoL's exact two-pass slack assume
float32. These tests lower each of those functions (`jax.jit(...).lower(...)`) and read the
StableHLO: every `dot_general` must carry `precision = [HIGHEST, HIGHEST]` (what
`lax.Precision.HIGHEST` / "float32" lowers to). They run on CPU (the lowering records the
requested precision whatever the backend). The end-to-end test dumps the StableHLO of every
module compiled while the public entry points run (`jax_dump_ir_to`), so a jitted helper or an
eager matmul that a wrapper adds later is caught too. `train.matmul_precision` is checked the same
way on the compiled train step.
"""
import glob
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bilinear_ir import lowrank, scorers
from bilinear_ir.config import blocks
from bilinear_ir.errors import InputError
from bilinear_ir.experiment import validation
from bilinear_ir.export import faiss_index
from bilinear_ir.retrieval import certified, exact, mol_topk, sharded
from bilinear_ir.scorers import base as scorers_base
from bilinear_ir.train import trainer

PRECISION = re.compile(r"precision = \[(\w+), (\w+)\]")


def dot_precisions(text: str) -> list:
  """The precision config of every `dot_general` in StableHLO text: [(lhs, rhs) or None]."""
  out = []
  for line in text.splitlines():
    if "stablehlo.dot_general" in line:  # the op, not a debug location naming it
      m = PRECISION.search(line)
      out.append(m.groups() if m else None)
  return out


def assert_float32(text: str, name: str, need_dots: bool = True) -> int:
  """Every dot_general in `text` is at HIGHEST; returns how many there are."""
  precs = dot_precisions(text)
  assert precs or not need_dots, f"{name}: no dot_general lowered (nothing checked)"
  bad = [p for p in precs if p != ("HIGHEST", "HIGHEST")]
  assert not bad, f"{name}: {len(bad)} of {len(precs)} dot_general(s) not at float32: {bad}"
  return len(precs)


def _tables(b=5, n=300, w=16, seed=0):
  rng = np.random.default_rng(seed)
  return (jnp.asarray(rng.normal(size=(b, w)), jnp.float32),
          jnp.asarray(rng.normal(size=(n, w)), jnp.float32))


def _mol_source(b=3, items=200, p=2, d_p=8):
  module = scorers.build("mol", dim=d_p, p_q=p, p_x=p, d_p=d_p, gate_hidden=16,
                         temperature=0.1)
  params = scorers.init_params(module, jax.random.key(0))
  rng = np.random.default_rng(1)
  unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
  qc = jnp.asarray(unit(rng.normal(size=(b, p, d_p))), jnp.float32)
  index = mol_topk.index_from_components(jnp.asarray(unit(rng.normal(size=(items, p, d_p)))), p)
  return mol_topk.MolSource(qc, index, params, module)


def _lowered():
  """(name, thunk -> jax.stages.Lowered) for every function whose matmuls must be float32."""
  q, d = _tables()
  qb, db = q.astype(jnp.bfloat16), d.astype(jnp.bfloat16)
  off = jnp.int32(0)
  mesh = sharded.doc_mesh()
  placed = sharded.shard_rows(np.asarray(d), mesh)
  W = jnp.asarray(np.random.default_rng(2).normal(size=(16, 16)), jnp.float32)
  index = certified.build_certified(W, d, 4)
  ids = jnp.zeros((5, 12), jnp.int32)
  src = _mol_source()
  P, Q = lowrank.truncate(W, 4)
  doc_ids = np.repeat(np.arange(100), 3)
  return [
      ("exact._brute_force", lambda: exact._brute_force.lower(q, d, k=5)),
      ("exact.topk float32", lambda: exact._topk_jit.lower(q, d, None, k=5, chunk=64, block=None,
                                                           id_offset=off)),
      ("exact.topk bf16", lambda: exact._topk_jit.lower(qb, db, None, k=5, chunk=64, block=None,
                                                        id_offset=off)),
      ("exact.topk row_valid", lambda: exact._topk_jit.lower(
          q, d, jnp.ones((300,), bool), k=5, chunk=64, block=8, id_offset=off)),
      ("exact.topk (wrapper)", lambda: jax.jit(lambda a, b: exact.topk(a, b, 5)).lower(q, d)),
      ("exact.count_at_least", lambda: exact._count_jit.lower(q, d, jnp.zeros(5), chunk=64)),
      ("exact.count_at_least bf16", lambda: exact._count_jit.lower(qb, db, jnp.zeros(5),
                                                                   chunk=64)),
      ("exact.topk_stream", lambda: jax.jit(
          lambda a, b: exact.topk_stream(a, [b[:128], b[128:]], 5)).lower(q, d)),
      ("exact.multi_vector_topk", lambda: jax.jit(
          lambda a, b: exact.multi_vector_topk(a, b, doc_ids, 4)).lower(q, d)),
      ("sharded._sharded", lambda: sharded._sharded.lower(
          q, placed, 5, mesh, None, None, jnp.int32(300), off)),
      ("certified._doc_table", lambda: certified._doc_table.lower(d, index.Q)),
      ("certified._query_tables", lambda: certified._query_tables.lower(
          q, index.P, index.W, jnp.float32(index.bound))),
      ("certified._rescore", lambda: certified._rescore.lower(q, d, ids, k=5)),
      ("mol_topk.brute_force", lambda: mol_topk.brute_force.lower(src, k=5, chunk=64)),
      ("mol_topk.exact_two_pass", lambda: mol_topk.exact_two_pass.lower(src, k=5, max_range=32,
                                                                         chunk=64)),
      ("lowrank.truncated", lambda: jax.jit(lowrank.truncated, static_argnums=1).lower(W, 4)),
      ("lowrank.pointwise_error", lambda: jax.jit(lowrank.pointwise_error).lower(
          W, P @ Q.T, q, q)),
  ]


@pytest.mark.parametrize("name,lower", _lowered(), ids=lambda x: x if isinstance(x, str) else "")
def test_every_dot_general_is_float32(name, lower):
  assert_float32(lower().as_text(), name)


def test_svd_is_traced_at_float32():
  """The SVD has no dot_general on CPU; whatever it lowers to on other backends inherits the
  float32 setting (checked through the config it is traced under)."""
  W = jnp.eye(6, dtype=jnp.float32)
  for fn in (lowrank.svd, lowrank.spectrum):
    assert_float32(jax.jit(fn).lower(W).as_text(), fn.__name__, need_dots=False)


def test_checker_sees_default_precision():
  """The checker itself: a plain `@` lowers to DEFAULT and is rejected."""
  q, d = _tables()
  text = jax.jit(lambda a, b: a @ b.T).lower(q, d).as_text()
  assert dot_precisions(text) == [("DEFAULT", "DEFAULT")]
  with pytest.raises(AssertionError, match="not at float32"):
    assert_float32(text, "plain matmul")


def test_public_entry_points_compile_only_float32_matmuls(tmp_path):
  """Runs the public functions with every compiled module dumped, then reads them all.

  Shapes are unusual (width 19, 1,531 docs) so that nothing comes from a cache compiled by
  another test; the dumps must include the functions named below.
  """
  rng = np.random.default_rng(3)
  w, n = 19, 1531
  q = rng.normal(size=(7, w)).astype(np.float32)
  d = rng.normal(size=(n, w)).astype(np.float32)
  W = (np.linalg.qr(rng.normal(size=(w, w)))[0] * 0.5 ** np.arange(w)).astype(np.float32)
  doc_ids = np.repeat(np.arange(n // 3 + 1), 3)[:n]
  src = _mol_source(b=2, items=333, p=3, d_p=w)
  old = jax.config.read("jax_dump_ir_to")
  jax.config.update("jax_dump_ir_to", str(tmp_path))
  try:
    exact.topk(q, d, 9)
    exact.brute_force(q, d, 9)
    exact.topk_stream(q, [d[:700], d[700:]], 9)
    exact.multi_vector_topk(q, d, doc_ids, 4)
    exact.count_at_least(q, d, np.zeros(7, np.float32))
    sharded.sharded_topk(q, d, 9)
    lo, hi = sharded.process_rows(n)
    sharded.multihost_topk(q, d[lo:hi], 9, id_offset=lo, num_docs=n)
    index = certified.build_certified(W, d, 5)
    certified.certified_topk(index, q, 9)
    certified.bf16_topk(q, d, 9)
    certified.bf16_topk(q, d, 9, max_candidates=200)  # the growing path (count + rescans)
    mol_topk.brute_force(src, k=6, chunk=64)
    mol_topk.exact_two_pass(src, k=6, max_range=40, chunk=64)
    jax.block_until_ready(lowrank.pointwise_error(W, lowrank.truncated(W, 5), q, q))
  finally:
    jax.config.update("jax_dump_ir_to", old)
  paths = sorted(glob.glob(os.path.join(str(tmp_path), "*.mlir")))
  names = " ".join(os.path.basename(p) for p in paths)
  for fn in ("_topk_jit", "_brute_force", "_count_jit", "_sharded", "_doc_table",
             "_query_tables", "_rescore", "brute_force", "exact_two_pass",
             "_einsum", "matmul"):  # the last two: lowrank's eager matmuls
    assert fn in names, f"{fn} was not compiled during the run (cached?): {names[:400]}"
  total = 0
  for path in paths:
    with open(path, encoding="utf-8") as f:
      total += assert_float32(f.read(), os.path.basename(path), need_dots=False)
  assert total > 0


def _train_step_text(precision: str) -> str:
  module = scorers.build("bilinear", dim=8)
  params = scorers.init_params(module, jax.random.key(0))
  hp = trainer.StepConfig(loss="softmax", temperature=0.1, margin=1.0, batch_size=4, negatives=0,
                          l2_to_init=0.0, lr=1e-3, warmup_steps=1, total_steps=5,
                          end_lr_fraction=0.1, weight_decay=0.0, clip_norm=1.0,
                          matmul_precision=precision)
  tx = trainer.make_optimizer(hp, 5)
  state = {"params": params, "opt_state": tx.init(params), "step": jnp.zeros((), jnp.int32)}
  feats = jnp.ones((10, 8), jnp.float32)
  rows, cands, mask = (jnp.zeros((2, 4), jnp.int32), jnp.zeros((2, 8), jnp.int32),
                       jnp.ones((2, 4, 8), bool))
  return trainer.train_steps.lower(state, params, feats, feats, rows, cands, mask, module=module,
                                   hp=hp).as_text()


def test_train_matmul_precision_reaches_the_compiled_step():
  assert_float32(_train_step_text("float32"), "train step, float32")
  assert set(dot_precisions(_train_step_text("default"))) == {("DEFAULT", "DEFAULT")}
  assert set(dot_precisions(_train_step_text("tensorfloat32"))) == {("HIGH", "HIGH")}


def test_train_matmul_precision_is_validated():
  c = blocks.train_config()
  assert c.matmul_precision == "default"
  validation.check_train(c)
  c.matmul_precision = "fp8"
  with pytest.raises(InputError, match="matmul_precision"):
    validation.check_train(c)


EXPORT_SCORERS = (("bilinear", {}), ("lowrank", {"rank": 3}),
                  ("lowrank", {"rank": 3, "residual": "none"}), ("wdp", {}), ("dot", {}))


@pytest.mark.parametrize("name,opts", EXPORT_SCORERS, ids=lambda v: str(v))
def test_export_table_reads_are_float32(name, opts):
  """`table_fn` (behind `table_matrices` and the FAISS export) lowers its matmuls at float32."""
  module = scorers.build(name, dim=6, **opts)
  params = scorers.init_params(module, jax.random.key(0))
  eye = np.eye(6, dtype=np.float32)
  for method in ("query_table", "doc_table"):
    text = scorers_base.table_fn(module, method).lower(params, eye).as_text()
    # dot and WDP tables have no matmul; bilinear's doc table and the low-rank ones have one.
    need = name == "bilinear" and method == "doc_table" or name == "lowrank"
    assert_float32(text, f"{name} {method}", need_dots=need)


def test_export_compiles_only_float32_matmuls(tmp_path):
  """`table_matrices` and the FAISS doc table, run with every compiled module dumped: each
  module's dot_generals are at float32 (width 23: nothing cached by another test)."""
  module = scorers.build("lowrank", dim=23, rank=4)
  params = scorers.init_params(module, jax.random.key(1))
  docs = np.random.default_rng(0).normal(size=(50, 23)).astype(np.float32)
  old = jax.config.read("jax_dump_ir_to")
  jax.config.update("jax_dump_ir_to", str(tmp_path))
  try:
    scorers_base.table_matrices(module, params)
    faiss_index.doc_table_array(module, params, docs)
  finally:
    jax.config.update("jax_dump_ir_to", old)
  paths = sorted(glob.glob(os.path.join(str(tmp_path), "*.mlir")))
  reads = [p for p in paths if "_table_read" in os.path.basename(p)]
  assert len(reads) >= 5, [os.path.basename(p) for p in paths]  # eye + check rows x 2, FAISS
  total = 0
  for path in paths:
    with open(path, encoding="utf-8") as f:
      total += assert_float32(f.read(), os.path.basename(path), need_dots=False)
  assert total >= 5  # the query and doc tables of a low-rank model are matmuls
