"""The process's memory allocator setting: keep freed memory resident (glibc `mallopt`).

XLA:CPU allocates each execution's temporary buffers afresh and frees them when it returns.
glibc serves an allocation above its mmap threshold (adaptive, at most 32 MiB by default) with
fresh pages from the kernel and returns them at `free`, so every call of a program with large
temporaries page-faults them in again: the chunked exact top-k, whose score blocks are
[1,000, 8,192] floats, spends a noticeable share of each call doing that on a 2-core CPU; a
fine-tune's train step, whose temporaries take GiBs, spent 2.5 of its 11.4 CPU seconds in the
kernel (InsuranceQA, batches of 32 questions: 1.2 million page faults a step, 6.1 s on 2 cores).

`keep_freed_memory()` makes glibc serve every allocation from one heap and never give freed
memory back: no mmap (M_MMAP_MAX 0: the step's temporaries are GiBs, above any mmap threshold),
one arena (M_ARENA_MAX 1: a thread arena's heap holds at most 64 MiB, so its large allocations
would fall back to mmap) and no trimming (M_TRIM_THRESHOLD at its maximum). Buffers freed by
one call are reused by the next: the train step above then takes no page fault (5.2-6.1 s in
three runs of 4 steps on a quiet machine; with the same settings as environment variables at
start-up, 4.9-5.3 s). The
project's binary (`bilinear_ir.main`) and the benchmarks call it at start-up, before threads
start; the price is that the resident memory of the process does not shrink after a peak. It is
process-wide, so a benchmark's peers measured in the same process (FAISS, numpy, torch) run
with it too. Elsewhere (not glibc) it does nothing. TCMalloc or jemalloc (`LD_PRELOAD`) are
alternatives with a like effect.

The price in memory, measured: a two-tower fine-tune step of 16 SciFact claims (abstracts of 256
tokens, 4.35 GB of temporaries) peaked at 10.0 GB resident over 8 steps of 6 shapes with the
setting, 6.3 GB without it: freed buffers of one size do not serve the next call's of another.
`BILINEAR_IR_KEEP_FREED_MEMORY=0` in the environment leaves glibc's default in force, for a run
that needs the memory more than the speed (the finetune job's two_tower on a 24 GB CPU host).

Only on a CPU host (`accelerator_host`): an accelerator's step temporaries live in device
memory, and on one H200 host (16 cores) with the setting in force the first encode of the 27,413
InsuranceQA answers took 163.7 s where the same job's on the same image, before it, took 39.0
s, and a fine-tune's warm-up compilation did not end in 270 s (one arena
serialises the allocations of XLA's many compiler threads: the suspected cause, not yet measured
apart). There glibc's default stays.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

# glibc mallopt parameters (malloc.h) and the values set: -1 is read as SIZE_MAX (never trim).
_SETTINGS = ((-4, 0),    # M_MMAP_MAX: no allocation served by mmap
             (-8, 1),    # M_ARENA_MAX: one arena for every thread
             (-1, -1))   # M_TRIM_THRESHOLD: never return the heap's top to the kernel

# device files of the accelerators jax runs on (NVIDIA GPUs; TPUs: accel or vfio)
_ACCELERATOR_FILES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/accel0", "/dev/vfio/0")

OPT_OUT = "BILINEAR_IR_KEEP_FREED_MEMORY"  # "0": glibc's default allocator stays

_applied = False
_accelerator = False


def _opted_out() -> bool:
  """Whether the environment asks for glibc's default allocator (OPT_OUT = "0")."""
  return os.environ.get(OPT_OUT, "1") == "0"


def accelerator_host() -> bool:
  """Whether this process computes on an accelerator, told without starting jax (the setting
  must come before threads start): `JAX_PLATFORMS` when it is set (its first entry not "cpu"),
  else whether the host has an accelerator's device file (`_ACCELERATOR_FILES`)."""
  platforms = os.environ.get("JAX_PLATFORMS", "")
  if platforms:
    return platforms.split(",")[0].strip() != "cpu"
  return any(os.path.exists(f) for f in _ACCELERATOR_FILES)


def keep_freed_memory() -> bool:
  """Sets glibc's allocator to keep freed memory (`_SETTINGS`) on a CPU host; returns whether
  it is set.

  Idempotent; False (and nothing more changed) on an accelerator's host (`accelerator_host`),
  with BILINEAR_IR_KEEP_FREED_MEMORY=0 in the environment, and where the C library has no
  `mallopt` or refuses.
  """
  global _applied, _accelerator
  if _applied:
    return True
  if _opted_out():
    return False
  if accelerator_host():
    _accelerator = True
    return False
  name = ctypes.util.find_library("c")
  try:
    libc = ctypes.CDLL(name) if name else None
  except OSError:
    libc = None
  mallopt = getattr(libc, "mallopt", None)
  if mallopt is None:
    return False
  _applied = all(mallopt(param, value) == 1 for param, value in _SETTINGS)
  return _applied


def describe() -> str:
  """A few words for a benchmark's hardware line: which allocator setting is in force."""
  if _applied:
    return "freed memory kept (glibc mallopt)"
  if _opted_out():
    return f"default allocator ({OPT_OUT}=0)"
  return "default allocator (an accelerator's host)" if _accelerator else "default allocator"
