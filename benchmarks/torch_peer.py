"""torch on the same device as a peer: `torch.topk(q @ d.T)` over chunks at its best chunk size.

The peer runs only where it is like-for-like: torch with a CUDA device while jax runs on a GPU
(`torch.device("cuda")`). Elsewhere `setup` names the reason, and the benchmarks record
`peer_torch_ms: null` with that `note` (on the development CPU: torch is the CPU wheel, no CUDA).
`--torch-device cpu` in a benchmark forces the CPU (a smoke test of this code, not a GPU peer).

Top-k peer (`topk_fn`): the doc table on the device in `dtype` (float32 with TF32 off, i.e.
`torch.backends.cuda.matmul.allow_tf32 = False`, the arithmetic of our float32 scan; or bfloat16,
scores returned in bf16 by cuBLAS); per chunk of `chunk` docs one matmul and one `torch.topk`,
then one `torch.topk` over the chunks' candidates. `best_chunk` times the candidate chunk sizes
and keeps the fastest. Every call ends with `torch.cuda.synchronize()`, so `timing.timed*` (which
blocks on jax outputs only) times the whole call.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

CHUNKS = (8192, 32768, 131072, 1 << 20)


def setup(requested: str = "cuda") -> tuple[Any, Any, str | None]:
  """(torch, device, None) when the peer can run on `requested`, else (None, None, reason)."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None, None, "torch is not installed"
  if requested == "cpu":
    return torch, torch.device("cpu"), None
  import jax  # pylint: disable=g-import-not-at-top
  if not torch.cuda.is_available():
    return None, None, (f"torch {torch.__version__} has no CUDA device (jax runs on "
                        f"{jax.default_backend()}): no torch peer on this device")
  if jax.default_backend() != "gpu":
    return None, None, f"jax runs on {jax.default_backend()}, not the GPU torch would use"
  torch.backends.cuda.matmul.allow_tf32 = False  # float32 is float32 (TF32 off)
  torch.backends.cudnn.allow_tf32 = False
  return torch, torch.device("cuda"), None


def sync(torch: Any, device: Any) -> None:
  """Waits for the device's queued work (no-op on the CPU)."""
  if device.type == "cuda":
    torch.cuda.synchronize()


def topk_fn(torch: Any, device: Any, q: np.ndarray, d: np.ndarray, k: int, dtype: str,
            chunk: int) -> Callable[[], Any]:
  """A timed call: top-k ids [B, k] of q [B, w] against d [N, w] in `dtype`, `chunk` docs at a
  time (tables placed on the device once, here)."""
  tdtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
  qt = torch.from_numpy(np.array(q, np.float32)).to(device, tdtype)  # copies: writable
  dt = torch.from_numpy(np.array(d, np.float32)).to(device, tdtype)
  n = dt.shape[0]

  def run():
    vals, ids = [], []
    for start in range(0, n, chunk):
      v, i = torch.topk(qt @ dt[start:start + chunk].T, min(k, min(chunk, n - start)), dim=1)
      vals.append(v)
      ids.append(i + start)
    if len(vals) == 1:
      out = ids[0]
    else:
      _, pos = torch.topk(torch.cat(vals, 1), k, dim=1)
      out = torch.gather(torch.cat(ids, 1), 1, pos)
    sync(torch, device)
    return out

  return run


def best_chunk(torch: Any, device: Any, q: np.ndarray, d: np.ndarray, k: int, dtype: str,
               repeats: int = 3) -> tuple[int, dict[int, float]]:
  """The fastest of `CHUNKS` (those below N, and N) for this case: (chunk, {chunk: ms})."""
  n = d.shape[0]
  sizes = sorted({min(c, n) for c in CHUNKS})
  ms = {}
  for c in sizes:
    fn = topk_fn(torch, device, q, d, k, dtype, c)
    fn()
    best = float("inf")
    for _ in range(repeats):
      t0 = time.perf_counter()
      fn()
      best = min(best, (time.perf_counter() - t0) * 1e3)
    ms[c] = round(best, 3)
    del fn
  return min(ms, key=ms.get), ms
