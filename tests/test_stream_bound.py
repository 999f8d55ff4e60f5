"""The bandwidth of the streamed top-k's roofline bound (`timing.stream_bandwidth`): the memory
bandwidth on a CPU, the measured host-to-device link on an accelerator."""
import jax
import pytest

from bilinear_ir import timing


def test_stream_bandwidth_is_the_memory_copy_on_a_cpu():
  if jax.devices()[0].platform != "cpu":
    pytest.skip("the CPU rule; an accelerator measures its link (next test)")
  peaks = {"gb_per_s": 12.5, "f32_gflops": 1.0}
  got = timing.stream_bandwidth(peaks)
  assert got["gb_per_s"] == 12.5 and got["link_gb_per_s"] is None
  assert "every core" in got["source"]
  # a stream only reads: the read rate where one was measured
  got = timing.stream_bandwidth(peaks | {"read_gb_per_s": 16.0})
  assert got["gb_per_s"] == 16.0 and "read" in got["source"]


def test_host_to_device_probe_counts_the_bytes_moved(monkeypatch):
  # best_s returns the fewest seconds: 2 s for 8 MiB is 4 MiB/s, whatever the machine
  calls = []
  monkeypatch.setattr(timing, "best_s", lambda fn, repeats: (calls.append(fn()), 2.0)[1])
  gbs = timing.host_to_device_gb_per_s(nbytes=8 << 20, repeats=2)
  assert gbs == pytest.approx((8 << 20) / 2.0 / 1e9)
  assert calls[0].shape == ((8 << 20) // 4,) and calls[0].dtype == "float32"


def test_stream_bandwidth_on_an_accelerator_is_the_link(monkeypatch):
  class Dev:
    platform = "gpu"
  monkeypatch.setattr(timing.jax, "devices", lambda: [Dev()])
  monkeypatch.setattr(timing, "host_to_device_gb_per_s", lambda: 25.0)
  got = timing.stream_bandwidth({"gb_per_s": 3000.0})
  assert got["gb_per_s"] == 25.0 and got["link_gb_per_s"] == 25.0
  assert "host-to-device" in got["source"]
