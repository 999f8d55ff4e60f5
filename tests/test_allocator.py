"""The allocator setting: applied once, reported, and a no-op where there is no glibc mallopt."""
import ctypes.util
import os
import platform
import subprocess
import sys

from bilinear_ir import allocator


def _run(code: str) -> str:
  return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                        text=True).stdout.strip()


def test_keep_freed_memory_sets_glibc_thresholds_once():
  """Applied (and reported) under glibc; elsewhere the documented no-op."""
  out = _run("from bilinear_ir import allocator as a; "
             "print(a.describe(), '|', a.keep_freed_memory(), a.keep_freed_memory(), '|', "
             "a.describe())")
  before, applied, after = (part.strip() for part in out.split("|"))
  assert before == "default allocator"
  if platform.libc_ver()[0] == "glibc":
    assert applied == "True True"
    assert after == "freed memory kept (glibc mallopt)"
  else:
    assert applied == "False False"
    assert after == "default allocator"


def test_an_accelerator_host_keeps_the_default(monkeypatch, tmp_path):
  """JAX_PLATFORMS names the platform first; unset, an accelerator's device file decides."""
  monkeypatch.setattr(allocator, "_applied", False)
  monkeypatch.setattr(allocator, "_accelerator", False)
  monkeypatch.setenv("JAX_PLATFORMS", "cuda,cpu")
  assert allocator.accelerator_host()
  assert allocator.keep_freed_memory() is False
  assert allocator.describe() == "default allocator (an accelerator's host)"
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  assert not allocator.accelerator_host()
  monkeypatch.delenv("JAX_PLATFORMS")
  device = tmp_path / "nvidia0"
  monkeypatch.setattr(allocator, "_ACCELERATOR_FILES", (str(device),))
  assert not allocator.accelerator_host()
  device.write_text("")
  assert allocator.accelerator_host()


def test_the_environment_can_keep_the_default(monkeypatch):
  """BILINEAR_IR_KEEP_FREED_MEMORY=0: nothing set (a run that needs the memory more)."""
  monkeypatch.setattr(allocator, "_applied", False)
  monkeypatch.setattr(allocator, "_accelerator", False)
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  monkeypatch.setenv(allocator.OPT_OUT, "0")
  assert allocator.keep_freed_memory() is False
  assert allocator.describe() == "default allocator (BILINEAR_IR_KEEP_FREED_MEMORY=0)"
  monkeypatch.setenv(allocator.OPT_OUT, "1")
  assert allocator.describe() == "default allocator"


def test_without_mallopt_nothing_changes(monkeypatch):
  monkeypatch.setattr(allocator, "_applied", False)
  monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
  assert allocator.keep_freed_memory() is False
  assert allocator.describe() == "default allocator"


def test_freed_memory_is_reused_without_page_faults():
  """A 256 MiB buffer written, freed and allocated again: by default glibc hands it back to the
  kernel and the second one faults every page in again; with the setting it is served from the
  heap, resident. (Through libc's malloc, as XLA's buffers are; numpy would add huge pages.)"""
  code = ("import ctypes, ctypes.util, resource, sys\n"
          "from bilinear_ir import allocator\n"
          "if sys.argv[1] != 'default': allocator.keep_freed_memory()\n"
          "libc = ctypes.CDLL(ctypes.util.find_library('c'))\n"
          "libc.malloc.restype = ctypes.c_void_p\n"
          "libc.free.argtypes = [ctypes.c_void_p]\n"
          "n = 1 << 28\n"
          "p = libc.malloc(n); ctypes.memset(p, 1, n); libc.free(p)\n"
          "before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
          "p = libc.malloc(n); ctypes.memset(p, 1, n); libc.free(p)\n"
          "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)\n")
  env = lambda mode: {**os.environ, allocator.OPT_OUT: "0" if mode == "opted out" else "1"}
  faults = {mode: int(subprocess.run([sys.executable, "-c", code, mode], check=True,
                                     capture_output=True, text=True, env=env(mode)).stdout)
            for mode in ("default", "kept", "opted out")}
  pages = (1 << 28) // 4096
  if platform.libc_ver()[0] == "glibc":
    assert faults["default"] > pages // 2, faults
    assert faults["kept"] < pages // 100, faults
    assert faults["opted out"] > pages // 2, faults  # the environment kept glibc's default
