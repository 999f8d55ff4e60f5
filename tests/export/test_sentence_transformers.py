"""The query route of the adapter's query-side export: built-in sentence-transformers `Dense`
layers that compute the adapter's `q + f(q)` (its Flax `query_table`) on any input scale."""
import numpy as np
import pytest

from bilinear_ir import scorers
from bilinear_ir.export import sentence_transformers
from conftest import perturbed_params
from conftest import write_model

N_DIM, HIDDEN = 32, 16  # conftest.write_model's width


@pytest.mark.parametrize("scale", [0.05, 1.0, 30.0])
def test_adapter_route_is_the_query_table(tmp_path, scale):
  import torch  # pylint: disable=g-import-not-at-top
  module = scorers.build("adapter", dim=N_DIM, hidden=HIDDEN)
  params = perturbed_params(module, seed=3)
  q = scale * np.random.default_rng(0).normal(size=(64, N_DIM)).astype(np.float32)
  want = np.asarray(module.apply({"params": params}, q, method=module.query_table))
  assert np.abs(want - q).max() > 0.1 * np.abs(want).max()  # f(q) matters
  layers = sentence_transformers.adapter_layers(params)
  model = sentence_transformers.build(
      layers, [], write_model(str(tmp_path / "bert"), "bert"),
      {"max_length": 16, "pooling": "mean", "normalize": True})
  router = model[-1]
  assert not list(router.sub_modules["document"])  # documents stay raw
  features = {"sentence_embedding": torch.from_numpy(q)}
  with torch.no_grad():
    for layer in router.sub_modules["query"]:
      features = layer(features)
  got = features["sentence_embedding"].numpy()
  diff = np.abs(got - want).max()
  print(f"adapter route at scale {scale}: max |Dense route - query_table| = {diff:.2e} "
        f"(values up to {np.abs(want).max():.2f})")
  assert got.shape == want.shape and diff <= 2e-6 * np.abs(want).max()
