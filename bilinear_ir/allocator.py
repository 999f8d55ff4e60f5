"""The process's memory allocator setting: keep freed memory resident (glibc `mallopt`).

XLA:CPU allocates each execution's temporary buffers afresh and frees them when it returns.
glibc serves an allocation above its mmap threshold (adaptive, at most 32 MiB by default) with
fresh pages from the kernel and returns them at `free`, so every call of a program with large
temporaries page-faults them in again (the chunked exact top-k, whose score blocks are
[1,000, 8,192] floats, spends a noticeable share of each call doing that on a 2-core CPU).

`keep_freed_memory()` raises glibc's mmap and trim thresholds to 1 GiB, so buffers below that
come from the heap and stay resident between calls. The project's binary (`bilinear_ir.main`)
and the benchmarks call it at start-up; the price is that the resident memory of the process
does not shrink after a peak (by up to 1 GiB of freed heap). It is process-wide, so a benchmark's
peers measured in the same process (FAISS, numpy, torch) run with it too. Elsewhere (not glibc)
it does nothing. TCMalloc or jemalloc (`LD_PRELOAD`) are alternatives with the same effect.
"""
from __future__ import annotations

import ctypes
import ctypes.util

THRESHOLD = 1 << 30  # bytes: allocations below it are served from (and freed to) the heap
_M_TRIM_THRESHOLD = -1  # glibc mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3

_applied = False


def keep_freed_memory() -> bool:
  """Raises glibc's mmap and trim thresholds to THRESHOLD; returns whether they are set.

  Idempotent; False (and nothing changed) where the C library has no `mallopt` or refuses.
  """
  global _applied
  if _applied:
    return True
  name = ctypes.util.find_library("c")
  try:
    libc = ctypes.CDLL(name) if name else None
  except OSError:
    libc = None
  mallopt = getattr(libc, "mallopt", None)
  if mallopt is None:
    return False
  _applied = bool(mallopt(_M_MMAP_THRESHOLD, THRESHOLD)) and bool(
      mallopt(_M_TRIM_THRESHOLD, THRESHOLD))
  return _applied


def describe() -> str:
  """A few words for a benchmark's hardware line: which allocator setting is in force."""
  return "freed memory kept (glibc mallopt)" if _applied else "default allocator"
