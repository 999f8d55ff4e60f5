"""FAISS flat export over doc_table equals the JAX exact path; faiss stays out of other modules."""
import subprocess
import sys

import jax
import numpy as np
import pytest

from bilinear_ir import scorers
from bilinear_ir.errors import InputError
from bilinear_ir.export import faiss_index
from bilinear_ir.retrieval import exact
from conftest import REPO, main_env



@pytest.mark.parametrize("name,kw", [("dot", {}), ("bilinear", {}), ("lowrank", {"rank": 6})])
def test_flat_index_equals_exact(name, kw):
  n = 24
  module = scorers.build(name, dim=n, **kw)
  rng = np.random.default_rng(0)
  params = scorers.init_params(module, jax.random.key(0))
  params = jax.tree.map(lambda p: p + 0.3 * rng.normal(size=p.shape).astype(np.float32), params)
  docs = rng.normal(size=(2000, n)).astype(np.float32)
  queries = rng.normal(size=(17, n)).astype(np.float32)
  index = faiss_index.export_faiss(module, params, docs, batch=512)   # 4 doc_table batches
  assert index.ntotal == 2000 and index.d == module.apply(
      {"params": params}, docs[:1], method=module.doc_table).shape[1]
  got = faiss_index.search(index, module, params, queries, 10)
  v = {"params": params}
  want = exact.topk(module.apply(v, queries, method=module.query_table),
                    module.apply(v, docs, method=module.doc_table), 10)
  np.testing.assert_array_equal(got.ids, np.asarray(want.ids))
  np.testing.assert_allclose(got.scores, np.asarray(want.scores), rtol=1e-4, atol=1e-4)


def test_search_checks_k_and_width():
  module = scorers.build("dot", dim=4)
  index = faiss_index.export_faiss(module, {}, np.ones((5, 4), np.float32))
  with pytest.raises(InputError, match="k must be"):
    faiss_index.search(index, module, {}, np.ones((1, 4), np.float32), 6)
  with pytest.raises(InputError, match="width"):
    faiss_index.search(index, scorers.build("dot", dim=3), {}, np.ones((1, 3), np.float32), 2)


def test_faiss_is_imported_only_by_export_faiss_index():
  code = ("import sys; from bilinear_ir.retrieval import exact, sharded, index, certified; "
          "assert 'faiss' not in sys.modules; "
          "from bilinear_ir.export import faiss_index; "
          "faiss_index.export_faiss(__import__('bilinear_ir.scorers', fromlist=['x'])"
          ".build('dot', dim=2), {}, [[1.0, 2.0]]); assert 'faiss' in sys.modules")
  env = main_env()
  proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
