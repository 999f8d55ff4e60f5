"""notebooks/quickstart.ipynb: its code cells run in order (the colab setup cell skipped by its
marker) and compute what they claim, checked against numpy's SVD and the task's closed forms."""
import os

import matplotlib
import nbformat
import numpy as np
import pytest

SETUP_MARKER = "# colab-setup"


@pytest.fixture(scope="module")
def notebook(repo_root):
  return nbformat.read(os.path.join(repo_root, "notebooks", "quickstart.ipynb"), as_version=4)


@pytest.fixture(scope="module")
def namespace(notebook, repo_root):
  matplotlib.use("Agg")
  cwd = os.getcwd()
  os.chdir(repo_root)
  ns = {"__name__": "__notebook__"}
  try:
    for cell in notebook.cells:
      if cell.cell_type == "code" and not cell.source.startswith(SETUP_MARKER):
        exec(compile(cell.source, "quickstart.ipynb", "exec"), ns)  # pylint: disable=exec-used
  finally:
    os.chdir(cwd)
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
    plt.close("all")
  return ns


def test_notebook_is_valid_and_its_setup_cell_is_first_and_guarded(notebook):
  nbformat.validate(notebook)
  first = notebook.cells[0]
  assert first.cell_type == "code" and first.source.startswith(SETUP_MARKER)
  assert 'find_spec("bilinear_ir") is None' in first.source and "pip" in first.source
  assert sum(c.source.startswith(SETUP_MARKER) for c in notebook.cells) == 1
  assert all(not c.get("outputs") for c in notebook.cells if c.cell_type == "code")


def test_synthetic_job_cells(namespace):
  rows, lp = namespace["rows"], namespace["lp"]
  assert rows["bilinear_rank2_constructed"]["success"] == 1.0
  assert rows["bilinear_rank2_constructed"]["n"] == namespace["config"].num_test
  exhaustive = rows["bilinear_rank2_constructed_exhaustive"]
  assert exhaustive["n"] == 1024 * 45 and exhaustive["successes"] == 46080
  assert rows["wdp_closed_form"]["success"] == 1.0
  assert rows["wdp_trained_512_1ep"]["success"] == 0.0  # v ~ 1 after 4 steps: A_I - B_I < 0
  assert lp == {"wdp": {"3": True, "4": False}, "bilinear": {"3": True, "4": False}}
  written = set(os.listdir(namespace["workdir"]))
  assert {"results.json", "results.md", "config.json", "score_distributions.png"} <= written


def test_lowrank_cells_against_numpy_svd(namespace):
  W = np.asarray(namespace["W"], np.float64)
  U, S, Vt = np.linalg.svd(W)
  n = W.shape[0]
  np.testing.assert_allclose(S, 0.85 ** np.arange(n), rtol=1e-4, atol=1e-6)  # built spectrum
  q = np.asarray(namespace["q"], np.float64)
  d = np.asarray(namespace["d"], np.float64)
  for r, row in namespace["demo"].items():
    assert row["max_error_over_bound"] <= 1.0 + 1e-4  # Theorem 3 on random pairs
    assert row["max_error_over_bound"] < 0.9  # and far from tight on random pairs
    assert row["witness_bound"] == pytest.approx(S[r], rel=1e-4)
    assert row["witness_error"] == pytest.approx(S[r], rel=1e-3)  # equality at the witness
    W_r = (U[:, :r] * S[:r]) @ Vt[:r]
    np.testing.assert_allclose(row["scorer_scores"], np.einsum("bi,ij,bj->b", q, W_r, d),
                               rtol=1e-3, atol=1e-3)
