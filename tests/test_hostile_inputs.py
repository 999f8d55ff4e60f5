"""Hostile inputs through `python -m bilinear_ir.main` under a 6 GiB address-space limit, as a new
user meets them: a BEIR zip whose corpus.jsonl inflates to 12 GiB (12 MB on disk), a corpus.jsonl
of one 3 GiB line. Each ends in one stderr line and exit code 2, no traceback, in bounded memory;
and a `MemoryError` (the record limit raised above what memory holds) ends the same way, naming
what was being read.

jax imports and runs under the limit (its CPU client reserves little address space); the job's
peak RSS is printed (`pytest -s`) and bounded.
"""
import json
import os
import resource
import subprocess
import sys
import zipfile
import zlib

import pytest

from conftest import REPO, main_env

LIMIT = 6 << 30  # RLIMIT_AS of the child, bytes
MIB = 1 << 20


def _limited():
  resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))


# Runs argv[1:] and prints its peak RSS in KiB: a small process between pytest and the job, so the
# job's peak is its own (a child forked from pytest would count pytest's memory as its own).
_LAUNCHER = ("import resource, subprocess, sys\n"
             "code = subprocess.call(sys.argv[1:], stdout=subprocess.DEVNULL)\n"
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
             "sys.exit(code)\n")


def _stats(tmp_path, fmt: str, path: str, *extra: str) -> tuple[int, str, float]:
  """Runs the collection_stats job on `path` under the limit: (exit code, stderr, peak RSS MiB)."""
  env = main_env()
  proc = subprocess.run(
      [sys.executable, "-c", _LAUNCHER, sys.executable, "-m", "bilinear_ir.main",
       "--config=configs/collection_stats.py", f"--config.data.format={fmt}",
       f"--config.data.path={path}", f"--workdir={tmp_path / 'w'}", *extra],
      cwd=REPO, env=env, capture_output=True, text=True, preexec_fn=_limited, timeout=300)
  return proc.returncode, proc.stderr, int(proc.stdout.split()[-1]) / 1024


def _one_line(code: int, stderr: str, rss: float, what: str, *words: str) -> str:
  print(f"\n{what}: exit {code}, peak RSS {rss:.0f} MiB, stderr: {stderr.strip()}")
  assert code == 2, stderr[-3000:]
  assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr[-3000:]
  for w in words:
    assert w in stderr, stderr
  return stderr.strip()


def write_zip_bomb(path: str, gib: int = 12) -> int:
  """A BEIR zip whose corpus.jsonl is one JSON line `gib` GiB long (~1 KB per inflated MiB on
  disk), written in bounded memory and time: deflate resets its state at a full flush, so one
  compressed MiB of "a" repeats as it is. Returns the member's inflated size."""
  first = b'{"_id": "d0", "text": "' + b"a" * (MIB - 23)
  rest = b"a" * MIB
  c = zlib.compressobj(9, zlib.DEFLATED, -15)
  head = c.compress(first) + c.flush(zlib.Z_FULL_FLUSH)
  block = c.compress(rest) + c.flush(zlib.Z_FULL_FLUSH)
  assert block == c.compress(rest) + c.flush(zlib.Z_FULL_FLUSH)  # the same bytes every MiB
  tail = c.flush()

  class Repeats:  # zipfile's compressor of the member: the blocks above, not recomputed
    def compress(self, data):
      return head if data is first else block

    def flush(self):
      return tail

  with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
    zf.writestr("queries.jsonl", '{"_id": "q0", "text": "a query"}\n')
    zf.writestr("qrels/test.tsv", "query-id\tcorpus-id\tscore\nq0\td0\t1\n")
    with zf.open("corpus.jsonl", "w", force_zip64=True) as member:
      member._compressor = Repeats()  # pylint: disable=protected-access
      member.write(first)
      for _ in range(gib * 1024 - 1):
        member.write(rest)
  return gib << 30


def test_the_zip_bomb_is_streamed_and_its_long_line_refused(tmp_path):
  bomb = str(tmp_path / "bomb.zip")
  size = write_zip_bomb(bomb)
  with zipfile.ZipFile(bomb) as zf:  # a valid zip: 12 GiB inflated, ~12 MB on disk
    assert zf.getinfo("corpus.jsonl").file_size == size
    with zf.open("corpus.jsonl") as f:
      assert f.read(30) == b'{"_id": "d0", "text": "aaaaaaa'
  assert os.path.getsize(bomb) < size / 900
  line = _one_line(*_stats(tmp_path, "beir", bomb), "zip bomb",
                   f"{bomb}/corpus.jsonl: line 1:", "longer than 64 MiB")
  assert "data.max_record_mib" in line


def _long_line_folder(folder, gib: int = 3) -> str:
  """A BEIR folder whose corpus.jsonl is one line of `gib` GiB (sparse: NUL bytes after the
  opening of a JSON object; no disk used for them)."""
  os.makedirs(folder / "qrels")
  with open(folder / "corpus.jsonl", "wb") as f:
    f.write(b'{"_id": "d0", "text": "')
    f.truncate(gib << 30)
  (folder / "queries.jsonl").write_text(json.dumps({"_id": "q0", "text": "a query"}) + "\n")
  (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td0\t1\n")
  return str(folder)


def test_a_3_gib_line_is_refused_after_the_record_limit(tmp_path):
  folder = _long_line_folder(tmp_path / "long")
  code, stderr, rss = _stats(tmp_path, "beir", folder)
  _one_line(code, stderr, rss, "3 GiB line", f"{folder}/corpus.jsonl: line 1:",
            "longer than 64 MiB")
  assert rss < 1024  # MiB: the interpreter, jax and one record, not the line
  # A smaller limit from the config refuses it as early.
  code, stderr, _ = _stats(tmp_path, "beir", folder, "--config.data.max_record_mib=1")
  _one_line(code, stderr, rss, "3 GiB line, 1 MiB limit", "longer than 1 MiB")


def test_a_memory_error_is_one_line_naming_what_was_read(tmp_path):
  """The record limit raised above what the 6 GiB allow: reading the 3 GiB line runs out of
  memory, and main says what it was reading."""
  folder = _long_line_folder(tmp_path / "long")
  code, stderr, rss = _stats(tmp_path, "beir", folder, "--config.data.max_record_mib=16384")
  _one_line(code, stderr, rss, "MemoryError", f"out of memory reading {folder}/corpus.jsonl")
  assert not os.path.exists(tmp_path / "w" / "results.json")


@pytest.mark.parametrize("mib", [0, -1])
def test_the_record_limit_must_be_positive(tmp_path, mib):
  folder = _long_line_folder(tmp_path / "long", gib=0)
  code, stderr, rss = _stats(tmp_path, "beir", folder, f"--config.data.max_record_mib={mib}")
  _one_line(code, stderr, rss, "bad limit", "data.max_record_mib")
