"""The allocator setting: applied once, reported, and a no-op where there is no glibc mallopt."""
import ctypes.util
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


def test_without_mallopt_nothing_changes(monkeypatch):
  monkeypatch.setattr(allocator, "_applied", False)
  monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
  assert allocator.keep_freed_memory() is False
  assert allocator.describe() == "default allocator"
