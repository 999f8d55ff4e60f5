"""pytest setup: 8 fake CPU devices (set before jax is imported) and shared fixtures."""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import jax  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
import pytest  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def repo_root() -> str:
  """The repository root (where `configs/` lives)."""
  return REPO


def pytest_report_header(config):  # pylint: disable=unused-argument
  return f"jax {jax.__version__}, devices: {jax.device_count()} x {jax.devices()[0].platform}"
