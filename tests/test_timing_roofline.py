"""`timing.roofline` with known numbers: the compute term at the peak of the case's precision,
the memory term at the read-only bandwidth, and the larger of the two as the bound."""
import pytest

from bilinear_ir import timing

PEAKS = {"f32_gflops": 50_000.0, "bf16_gflops": 800_000.0, "default_gflops": 400_000.0,
         "gb_per_s": 3_000.0, "read_gb_per_s": 4_000.0}


def test_memory_bound_uses_the_read_bandwidth():
  # 8 x 1M x 384 float32: 1.536e9 table bytes at 4,000 GB/s (not the 3,000 GB/s copy rate) =
  # 0.384 ms; 6.144e9 FLOPs at 50 TFLOP/s = 0.12288 ms (rounded to 4 decimals)
  b = timing.roofline(6.144e9, 1.536e9, "float32", PEAKS)
  assert b["bound_memory_ms"] == pytest.approx(0.384)
  assert b["bound_compute_ms"] == pytest.approx(0.1229)
  assert b["bound_ms"] == pytest.approx(0.384) and b["bound_limit"] == "memory"
  assert b["bandwidth_gbs"] == 4000.0 and b["bandwidth_kind"] == "read"


@pytest.mark.parametrize("dtype,gflops", [("float32", 50_000.0), ("bfloat16", 800_000.0),
                                          ("default", 400_000.0)])
def test_compute_bound_takes_the_peak_of_the_precision(dtype, gflops):
  # 1,000 x 200k x 384: 1.536e11 FLOPs
  b = timing.roofline(1.536e11, 3.072e8, dtype, PEAKS)
  assert b["bound_compute_ms"] == pytest.approx(1.536e11 / (gflops * 1e9) * 1e3, abs=1e-4)
  assert b["peak_flops"] == gflops * 1e9
  assert b["bound_ms"] == max(b["bound_compute_ms"], b["bound_memory_ms"])


def test_tf32x3_runs_three_passes_at_the_tf32_peak():
  # 1,000 x 200k x 384 by 3xTF32: 1.536e11 float32-product FLOPs as three TF32 passes at
  # 400 TFLOP/s = 1.152 ms, not the float32 peak's 3.072 ms; 32 x 1M stays memory-bound
  b = timing.roofline(1.536e11, 3.072e8, "tf32x3", PEAKS)
  assert b["bound_compute_ms"] == pytest.approx(1.152) and b["bound_limit"] == "compute"
  assert b["peak_flops"] == pytest.approx(400e12 / 3, rel=1e-6)
  b = timing.roofline(2.4576e10, 1.536e9, "tf32x3", PEAKS)
  assert b["bound_ms"] == pytest.approx(0.384) and b["bound_limit"] == "memory"
  out = timing.with_interleaved_peaks(PEAKS, {"peak_default": 2.0}, 1e12)
  assert out["default_gflops"] == pytest.approx(500_000.0)  # faster than at the start: raised


def test_copy_rate_only_without_a_read_probe_and_bad_dtype():
  peaks = {k: v for k, v in PEAKS.items() if k != "read_gb_per_s"}
  b = timing.roofline(0.0, 3e9, "float32", peaks)
  assert b["bound_memory_ms"] == pytest.approx(1.0) and b["bandwidth_kind"] == "copy"
  with pytest.raises(ValueError):
    timing.roofline(1.0, 1.0, "tf32", PEAKS)


def test_interleaved_read_probe_raises_the_bandwidth_only():
  out = timing.with_interleaved_peaks(PEAKS, {"peak_read": 0.25}, 1.0, read_bytes=1.5e9)
  assert out["read_gb_per_s"] == pytest.approx(6000.0)  # faster than at the start: raised
  out = timing.with_interleaved_peaks(PEAKS, {"peak_read": 1.0}, 1.0, read_bytes=1.5e9)
  assert out["read_gb_per_s"] == 4000.0 and out["read_gb_per_s_interleaved"] == 1500.0


def test_read_probes_named_in_the_peaks_line():
  # the read bound is the largest probe; the line names each probe's rate
  peaks = {"measured": PEAKS | {"source": "measured", "read": {
      "xla_gb_per_s": 2849.0, "xla_rows_gb_per_s": 3100.5, "torch_gb_per_s": None}}}
  line = timing.peaks_line(peaks)
  assert "read 4000.0 GB/s (XLA sum 2849.0, XLA row sums 3100.5)" in line
  assert "torch sum" not in line


def test_torch_read_probe_needs_a_cuda_device_beside_jax():
  # this test runs where jax's default device is no GPU (CI) or torch lacks CUDA: no rate, why
  import jax  # pylint: disable=g-import-not-at-top
  if jax.devices()[0].platform == "gpu":
    rate, how = timing.torch_read_gb_per_s(1 << 20, repeats=2)
    assert rate is None or (rate > 0 and "torch" in how)
  else:
    rate, how = timing.torch_read_gb_per_s(1 << 20, repeats=2)
    assert rate is None and how
