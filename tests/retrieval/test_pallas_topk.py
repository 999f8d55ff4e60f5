"""The Pallas kernels (`retrieval.pallas_topk`) against brute force and float64 numpy twins.

Interpret mode on a CPU (the test suite), compiled on a GPU (`launch/accelerator_check.sh`'s
tests_device step, which leaves the default backend alone): `interpret` follows the backend.
Scores here are exact in float32 (small integers, or one nonzero product per score), so the
kernels must return exactly the float64 twin's top-k, ties by lower id, whatever the summation
order; tiles are small so N, B and w are not multiples of them and k exceeds a block's docs.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from bilinear_ir.errors import InputError
from bilinear_ir.retrieval import exact, mol_topk, pallas_topk

INTERPRET = pallas_topk.interpret_default()
# blocks of 48 docs, width chunks of 16, groups of 4 docs (blockmax)
TILES = pallas_topk.Tiles(tq=16, td=16, steps=3, wk=16, group=4)

def tf32x3(pallas):
  """`exact.tf32x3_topk` as the other variants are called (its TopK; interpret follows the
  backend there too)."""
  return lambda q, d, k, tiles, interpret, **kw: exact.tf32x3_topk(
      q, d, k, tiles, pallas=pallas, **kw)[0]


VARIANTS = {"pallas": exact.fused_topk, "pallas_blockmax": exact.blockmax_topk,
            "tf32x3": tf32x3(False), "tf32x3_pallas": tf32x3(True)}


def twin64(q, d, k):
  """float64 top-k by (score desc, id asc): (scores [B, k], ids [B, k])."""
  s = np.asarray(q, np.float64) @ np.asarray(d, np.float64).T
  order = np.lexsort((np.broadcast_to(np.arange(s.shape[1]), s.shape), -s), axis=1)[:, :k]
  return np.take_along_axis(s, order, axis=1), order


def run(q, d, k, tiles=TILES, variant="pallas", **kw):
  res = VARIANTS[variant](jnp.asarray(q), jnp.asarray(d), k, tiles, interpret=INTERPRET, **kw)
  return np.asarray(res.scores), np.asarray(res.ids)


variants = pytest.mark.parametrize("variant", list(VARIANTS))


@variants
def test_exact_ties_by_lower_id_any_padding(variant):
  # 37 queries (tiles of 16), 250 docs (blocks of 48), width 40 (chunks of 16): integer scores
  # with many exact ties, duplicates of one doc spread over blocks
  rng = np.random.default_rng(0)
  q = rng.integers(-2, 3, (37, 40)).astype(np.float32)
  d = rng.integers(-2, 3, (250, 40)).astype(np.float32)
  d[[60, 130, 249]] = d[7]
  res = exact.topk(q, d, 10, strategy=variant, tiles=TILES)  # the strategy switch
  s64, i64 = twin64(q, d, 10)
  np.testing.assert_array_equal(np.asarray(res.ids), i64)
  np.testing.assert_array_equal(np.asarray(res.scores), s64.astype(np.float32))
  np.testing.assert_array_equal(np.asarray(exact.brute_force(q, d, 10).ids), i64)
  # the k passes per step without the skip of steps that cannot enter the top-k, and the
  # insert merge (the fused kernel's options only): the same
  merges = (TILES._replace(insert=False, skip=False), TILES._replace(insert=True))
  for tiles in merges if variant == "pallas" else ():
    np.testing.assert_array_equal(run(q, d, 10, tiles, variant)[1], i64)
  # every doc the same: ties everywhere, within each block and across them -> ids 0 .. 9
  same = np.tile(d[:1], (250, 1))
  for tiles in (TILES,) + merges[1:] * (variant == "pallas"):  # k passes, the insert merge
    np.testing.assert_array_equal(run(q, same, 10, tiles, variant)[1],
                                  np.tile(np.arange(10), (37, 1)))
  # groups of a whole step (G = td) and groups of 2: the same
  for group in (2, 16):
    np.testing.assert_array_equal(run(q, d, 10, TILES._replace(group=group), variant)[1], i64)


@variants
def test_near_ties_one_ulp_apart(variant):
  # score = d[:, 0] (one-hot queries): values x and the next float32 above x in other blocks
  x = np.float32(1.0)
  up = np.nextafter(x, np.float32(2))
  d = np.zeros((130, 24), np.float32)
  d[:, 0] = np.float32(0.5)
  d[[5, 70, 129], 0] = x
  d[[100, 3], 0] = up
  q = np.zeros((3, 24), np.float32)
  q[:, 0] = 1.0
  for tiles in (TILES, TILES._replace(insert=True))[:2 if variant == "pallas" else 1]:
    scores, ids = run(q, d, 6, tiles, variant=variant)
    np.testing.assert_array_equal(ids, np.tile([3, 100, 5, 70, 129, 0], (3, 1)))
    np.testing.assert_array_equal(scores[0], np.array([up, up, x, x, x, 0.5], np.float32))


@variants
def test_random_floats_against_float64(variant):
  rng = np.random.default_rng(1)
  q = rng.standard_normal((20, 33)).astype(np.float32)
  d = rng.standard_normal((300, 33)).astype(np.float32)
  scores, ids = run(q, d, 7, variant=variant)
  s64, i64 = twin64(q, d, 7)
  np.testing.assert_array_equal(ids, i64)  # random gaps >> float32 rounding
  np.testing.assert_allclose(scores, s64, rtol=0, atol=33 * 2.0 ** -24 * 40)


@variants
@pytest.mark.parametrize("tiles", [TILES, TILES._replace(steps=1, group=16)])
def test_k_beyond_the_docs_pads_with_no_doc(variant, tiles):
  # one block, 6 real docs, k = 9 (groups of 4: 12 groups; of 16: one group, fewer than k)
  rng = np.random.default_rng(2)
  q = rng.integers(-3, 4, (5, 20)).astype(np.float32)
  d = rng.integers(-3, 4, (6, 20)).astype(np.float32)
  scores, ids = run(q, d, 9, tiles, variant, id_offset=1000)
  s64, i64 = twin64(q, d, 6)
  np.testing.assert_array_equal(ids[:, :6], i64 + 1000)
  np.testing.assert_array_equal(scores[:, :6], s64.astype(np.float32))
  assert (ids[:, 6:] == exact.NO_DOC).all() and (scores[:, 6:] == -np.inf).all()


def test_group_maxima_against_float64():
  # the blockmax kernel alone: each group's maximum, groups of 4, 250 docs (the last group
  # has 2 docs, the columns past it -inf)
  rng = np.random.default_rng(5)
  q = rng.integers(-2, 3, (19, 40)).astype(np.float32)
  d = rng.integers(-2, 3, (250, 40)).astype(np.float32)
  got = np.asarray(pallas_topk.group_maxima(jnp.asarray(q), jnp.asarray(d), TILES, INTERPRET))
  s = np.asarray(q, np.float64) @ np.asarray(d, np.float64).T
  want = np.full((19, 63), -np.inf)
  for c in range(63):
    want[:, c] = s[:, 4 * c:4 * c + 4].max(axis=1)
  assert got.shape == (19, 288 // 4)  # 6 blocks of 48 docs
  np.testing.assert_array_equal(got[:, :63], want)
  assert (got[:, 63:] == -np.inf).all()


@pytest.mark.parametrize("n", [37, 300])
def test_select_top_n_equals_lax_top_k(n):
  rng = np.random.default_rng(3)
  x = rng.integers(-20, 20, (5, 300)).astype(np.float32)  # many ties
  x[0, :50] = 0.0
  x[0, 50:60] = -0.0  # ranked below 0.0, as lax.top_k does
  x[1] = rng.standard_normal(300).astype(np.float32)
  vals, pos = pallas_topk.select_top_n(jnp.asarray(x), n, interpret=INTERPRET, tr=8, tm=64)
  ref_vals, ref_pos = lax.top_k(jnp.asarray(x), n)
  np.testing.assert_array_equal(np.asarray(pos), np.asarray(ref_pos))
  np.testing.assert_array_equal(np.asarray(vals), np.asarray(ref_vals))


def test_topk_avg_pallas_selection_same_ids():
  rng = np.random.default_rng(4)
  logits = jnp.asarray(rng.standard_normal((3, 200, 4)).astype(np.float32))
  gates = jax.nn.softmax(jnp.asarray(rng.standard_normal((3, 200, 4)).astype(np.float32)))
  src = mol_topk.DenseSource(logits, gates)
  a = mol_topk.topk_avg(src, 5, 40, tight_bound=False, selection="pallas")
  b = mol_topk.topk_avg(src, 5, 40, tight_bound=False)
  np.testing.assert_array_equal(np.asarray(a.ids), np.asarray(b.ids))


def triton_asm(monkeypatch) -> list[str]:
  """A list that receives the text of every Triton module lowered from now on (lower with
  `lowering_platforms=("cuda",)`: no GPU needed)."""
  from jax._src.pallas.triton import lowering, pallas_call_registration  # private: the asm
  asm = []
  real = lowering.lower_jaxpr_to_triton_module

  def keep(*args, **kwargs):
    out = real(*args, **kwargs)
    asm.append(out.module.operation.get_asm())
    return out

  monkeypatch.setattr(pallas_call_registration.lowering, "lower_jaxpr_to_triton_module", keep)
  return asm


def test_triton_lowering_is_full_float32(monkeypatch):
  """Both kernels lower to Triton for a CUDA GPU on any machine (no GPU needed): every lowering
  rule exists, every block is a power of two, and the score dot runs at input precision IEEE
  (float32 products), never TF32 (`Precision.DEFAULT` would print `inputPrecision = tf32`)."""
  import functools  # pylint: disable=g-import-not-at-top
  asm = triton_asm(monkeypatch)
  q = jax.ShapeDtypeStruct((32, 384), jnp.float32)
  d = jax.ShapeDtypeStruct((1000, 384), jnp.float32)
  scan = functools.partial(pallas_topk.block_candidates, k=10, tiles=pallas_topk.Tiles(),
                           no_doc=exact.NO_DOC, interpret=False)
  jax.jit(scan).trace(q, d).lower(lowering_platforms=("cuda",))
  gmax = functools.partial(pallas_topk.group_maxima, tiles=pallas_topk.Tiles(group=16),
                           interpret=False)
  jax.jit(gmax).trace(q, d).lower(lowering_platforms=("cuda",))
  thr = functools.partial(pallas_topk.top_n_threshold, n=100, interpret=False)
  jax.jit(thr).trace(jax.ShapeDtypeStruct((4, 5000), jnp.float32)).lower(
      lowering_platforms=("cuda",))
  assert len(asm) >= 3  # the scan kernel, the group maxima, the counting kernel (per pass)
  for text in asm[:2]:
    dots = [line for line in text.splitlines() if "tt.dot" in line]
    assert len(dots) == 3 and not any("tf32" in line for line in dots), dots  # 384 = 3 x 128
  assert "tt.reshape" in asm[1]  # [tq, td] -> [tq, td / G, G] before the groups' max


@pytest.mark.parametrize("group", [16, 64])  # a reshape into groups; G = td, a row maximum
def test_triton_lowering_of_the_3xtf32_kernel_uses_tf32(monkeypatch, group):
  """The 3xTF32 group maxima run on tensor cores: every dot of the kernel at input precision
  TF32 (three per width chunk: 384 = 3 x 128), none at IEEE; with G = td no reshape."""
  q = jax.ShapeDtypeStruct((32, 384), jnp.float32)
  d = jax.ShapeDtypeStruct((1000, 384), jnp.float32)
  tiles = pallas_topk.Tiles(td=64, group=group, tf32x3=True)
  asm = triton_asm(monkeypatch)
  jax.jit(lambda q, d: pallas_topk.group_maxima(q, d, tiles)).trace(q, d).lower(
      lowering_platforms=("cuda",))
  [text] = asm
  dots = [line for line in text.splitlines() if "tt.dot" in line]
  assert len(dots) == 9 and all("tf32" in line for line in dots), dots
  assert ("tt.reshape" in text) == (group < 64)


def test_xla_3xtf32_lowers_to_the_tf32_x3_algorithm():
  """The XLA implementation asks the GPU for XLA's 3xTF32 dot algorithm (three TF32 passes,
  float32 accumulation); XLA:CPU rejects that preset, so off a GPU it is emulated."""
  q = jax.ShapeDtypeStruct((32, 384), jnp.float32)
  d = jax.ShapeDtypeStruct((1000, 384), jnp.float32)
  fn = lambda q, d: exact.tf32x3_group_maxima(q, d, 16, emulate=False)
  text = jax.jit(fn).trace(q, d).lower(lowering_platforms=("cuda",)).as_text()
  dots = [line for line in text.splitlines() if "dot_general" in line]
  assert len(dots) == 1 and "lhs_precision_type = tf32" in dots[0] and \
      "rhs_precision_type = tf32" in dots[0] and "accumulation_type = f32" in dots[0] and \
      "num_primitive_operations = 3" in dots[0], dots
  if jax.default_backend() == "cpu":
    with pytest.raises(Exception, match="not supported"):
      jax.block_until_ready(fn(jnp.ones((32, 384)), jnp.ones((1000, 384))))


def test_bad_strategy_is_an_input_error():
  q, d = np.ones((2, 8), np.float32), np.ones((20, 8), np.float32)
  with pytest.raises(InputError, match="strategy"):
    exact.topk(q, d, 3, strategy="triton")
  with pytest.raises(InputError, match="strategy"):
    exact.topk(q, d, 3, strategy="pallas", row_valid=np.ones(20, bool))
  with pytest.raises(InputError, match="strategy"):
    mol_topk.avg_top_n(jnp.ones((2, 20)), 3, strategy="triton")
