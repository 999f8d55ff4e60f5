"""Two real JAX processes on localhost (CPU, gloo collectives) give the single-process top-k.

The test launches this file twice as a worker
(`python tests/retrieval/retrieval/test_multihost.py worker I PORT OUT`):
each worker calls `jax.distributed.initialize(coordinator_address="localhost:PORT",
num_processes=2, process_id=I)`, loads only its half of the docs (`process_rows`), and
`multihost_topk` all-gathers and merges the per-process top-k. Both must equal one process's
brute force over all the docs.
"""
import os
import subprocess
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/x/
N_DOCS, DIM, K = 1003, 8, 12


def data():
  """The same queries and docs in every process (integer values: exact scores, many ties)."""
  rng = np.random.default_rng(0)
  q = rng.integers(-3, 4, (6, DIM)).astype(np.float32)
  d = rng.integers(-3, 4, (N_DOCS, DIM)).astype(np.float32)
  return q, d


def worker(process_id: int, port: int, out: str) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_cpu_collectives_implementation", "gloo")  # the 0.10 default, explicit
  jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=2,
                             process_id=process_id)
  from bilinear_ir.retrieval import sharded  # pylint: disable=g-import-not-at-top
  assert jax.process_count() == 2 and jax.process_index() == process_id
  q, d = data()
  lo, hi = sharded.process_rows(N_DOCS)
  local = d[lo:hi]   # this process only ever sees its half
  res = sharded.multihost_topk(q, local, K, id_offset=lo, num_docs=N_DOCS, chunk=64)
  np.save(os.path.join(out, f"ids{process_id}.npy"), res.ids)
  np.save(os.path.join(out, f"scores{process_id}.npy"), res.scores)
  np.save(os.path.join(out, f"span{process_id}.npy"), np.array([lo, hi]))
  jax.distributed.shutdown()


def test_two_processes_equal_one(tmp_path):
  # Here, not at the top: this file also runs as a worker script, outside pytest.
  from conftest import free_port, main_env  # pylint: disable=g-import-not-at-top
  env = main_env()  # one CPU device per process
  port = free_port()
  procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "worker", str(i),
                             str(port), str(tmp_path)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for i in range(2)]
  logs = []
  for p in procs:
    try:
      logs.append(p.communicate(timeout=240)[0])
    except subprocess.TimeoutExpired:
      for other in procs:
        other.kill()
      raise
  assert all(p.returncode == 0 for p in procs), "\n".join(logs)[-3000:]
  q, d = data()
  s = q.astype(np.float64) @ d.astype(np.float64).T
  ids = np.lexsort((np.broadcast_to(np.arange(N_DOCS), s.shape), -s), axis=1)[:, :K]
  spans = [tuple(np.load(tmp_path / f"span{i}.npy")) for i in range(2)]
  assert spans == [(0, N_DOCS // 2), (N_DOCS // 2, N_DOCS)]
  for i in range(2):
    np.testing.assert_array_equal(np.load(tmp_path / f"ids{i}.npy"), ids)
    np.testing.assert_array_equal(np.load(tmp_path / f"scores{i}.npy"),
                                  np.take_along_axis(s, ids, axis=1))
  # The answer needs both halves: each half alone misses some of the global top-k.
  assert np.any(ids < N_DOCS // 2) and np.any(ids >= N_DOCS // 2)


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "worker":
  worker(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
