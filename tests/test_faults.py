"""Faults during a run, through `python -m bilinear_ir.main` as a user meets them: a full disk,
a read-only cache folder, corrupted and truncated cache files, SIGKILL, SIGINT and SIGTERM.

Each ends with a known exit code and one stderr line (or a clean success), no traceback, no
partial or temporary file, and, once the fault is removed, the same command gives the numbers of
an undisturbed run. Full and read-only disks are small tmpfs mounts (root can mount them); where
mounting is refused, the same errno is injected at the write layer (`files.injected_fault`) and
a warning says so.
"""
import contextlib
import errno
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

from conftest import REPO, main_env, write_beir

TRAIN = ("--config.train.steps=120", "--config.train.eval_every=40",
         "--config.train.checkpoint_every=10", "--config.train.hard_negatives=0")


def _cmd(workdir, data, bert, cache, *extra):
  return [sys.executable, "-m", "bilinear_ir.main",
          "--config=configs/train_eval.py:scorer=lowrank,rank=4,residual=identity",
          f"--workdir={workdir}", "--config.data.format=beir", f"--config.data.path={data}",
          f"--config.encoder.model={bert}", f"--config.encoder.cache_dir={cache}",
          "--config.encoder.max_length=32", "--config.train.batch_size=8",
          "--config.eval.depth=50", *extra]


def _env(fault=None):
  env = main_env()  # one CPU device, as a user runs it
  if fault:
    env["BILINEAR_IR_FAULT"] = fault
  return env


def _run(cmd, fault=None):
  return subprocess.run(cmd, cwd=REPO, env=_env(fault), capture_output=True, text=True,
                        timeout=300)


def _outputs(workdir) -> dict:
  """The numbers a run reports: results.json and the run file."""
  with open(os.path.join(workdir, "results.json"), encoding="utf-8") as f:
    res = json.load(f)
  with open(os.path.join(workdir, "run.trec"), encoding="utf-8") as f:
    return {"results": res, "run": f.read()}


def _leftovers(*folders) -> list[str]:
  """Temporary and partial files under `folders`: orbax's `*.orbax-checkpoint-tmp*` folders and
  the project's `.tmp-*` files and folders (atomic writes)."""
  out = []
  for folder in folders:
    for root, dirs, names in os.walk(folder):
      out += [os.path.join(root, n) for n in dirs + names
              if ".orbax-checkpoint-tmp" in n or n.startswith(".tmp-")]
  return out


# The one line a finished stage prints when stderr is not a terminal (bilinear_ir/progress.py).
PROGRESS = re.compile(r"^[\w .-]+: \d+/\d+ \w+ in [\d.]+ s$")


def _one_error_line(proc, code, *words):
  """Asserts exit `code` and, besides the progress lines of the stages that finished, one stderr
  line, the last, starting with "error: " and holding `words`; no traceback."""
  lines = [line for line in proc.stderr.splitlines() if line.strip()]
  assert proc.returncode == code, f"exit {proc.returncode}; stderr:\n{proc.stderr[-3000:]}"
  others = [line for line in lines if not PROGRESS.match(line)]
  assert len(others) == 1 and others[0] == lines[-1], f"stderr:\n{proc.stderr[-3000:]}"
  assert lines[-1].startswith("error: "), lines[-1]
  for word in words:
    assert word in lines[-1], f"{word!r} not in {lines[-1]!r}"
  assert "Traceback" not in proc.stderr + proc.stdout
  print(f"exit {proc.returncode}, {len(lines)} stderr lines ({len(lines) - 1} progress): "
        f"{lines[-1]}")
  return lines[-1]


def _complete_steps(ckpts) -> list[int]:
  """Checkpoint steps orbax finished (step folders with their commit marker)."""
  if not os.path.isdir(ckpts):
    return []
  return sorted(int(s) for s in os.listdir(ckpts)
                if s.isdigit() and os.path.exists(os.path.join(ckpts, s, "_CHECKPOINT_METADATA")))


class Disk:
  """A folder on a small tmpfs whose size and mode can change (`remount`), or, where mounting is
  refused, a plain folder whose faults are injected: `fault` is then the `BILINEAR_IR_FAULT`
  value a faulty run gets (None on a real mount)."""

  def __init__(self, path: str, kib: int, read_only: bool = False):
    self.path, self.mounted = path, False
    os.makedirs(path)
    opts = f"size={kib}k" + (",ro" if read_only else "")
    try:
      proc = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", path],
                            capture_output=True, text=True)
      self.mounted, why = proc.returncode == 0, proc.stderr.strip()
    except OSError as e:  # no mount command
      why = str(e)
    self.errno = "EROFS" if read_only else "ENOSPC"
    if not self.mounted:
      warnings.warn(f"no tmpfs here ({why}): {self.errno} is injected at the write layer "
                    "instead")

  @property
  def fault(self):
    return None if self.mounted or self.errno is None else f"{self.errno}:{self.path}"

  def remount(self, kib: int, read_only: bool = False):
    """The next fault (a smaller disk, read-only) or its removal (a big writable disk)."""
    if self.mounted:
      opts = f"remount,size={kib}k," + ("ro" if read_only else "rw")
      subprocess.run(["mount", "-o", opts, self.path], check=True)
    self.errno = "EROFS" if read_only else ("ENOSPC" if kib < 1024 else None)

  def close(self):
    if self.mounted:
      subprocess.run(["umount", self.path], check=True)
      self.mounted = False


@contextlib.contextmanager
def small_disk(path, kib, read_only=False):
  disk = Disk(path, kib, read_only)
  try:
    yield disk
  finally:
    disk.close()


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_bert_dir):
  """(collection, warm cache, the undisturbed run's outputs)."""
  root = tmp_path_factory.mktemp("faults")
  data = write_beir(str(root / "beir"), num_docs=60, num_queries=48)
  cache = str(root / "cache")
  proc = _run(_cmd(root / "reference", data, tiny_bert_dir, cache, *TRAIN))
  assert proc.returncode == 0, proc.stderr[-3000:]
  return data, cache, _outputs(root / "reference")


def test_full_disk_while_checkpointing_then_rerun_matches(tmp_path, setup, tiny_bert_dir):
  data, cache, reference = setup
  with small_disk(str(tmp_path / "disk"), 200) as disk:
    w = os.path.join(disk.path, "w")
    cmd = _cmd(w, data, tiny_bert_dir, cache, *TRAIN)
    proc = _run(cmd, disk.fault)
    line = _one_error_line(proc, 2, "no space left on device writing", f"{w}/checkpoints/")
    failed_step = int(line.rsplit("/", 1)[1])
    assert failed_step % 10 == 0 and failed_step <= 120
    assert not _leftovers(w), _leftovers(w)
    assert not os.path.exists(os.path.join(w, "results.json"))
    kept = _complete_steps(os.path.join(w, "checkpoints"))
    assert all(s < failed_step for s in kept)
    if disk.mounted:  # the tmpfs holds at least one checkpoint before it is full
      assert kept, os.listdir(os.path.join(w, "checkpoints"))
    disk.remount(8192)  # space freed: the same command resumes and ends as an undisturbed run
    proc = _run(cmd)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert _outputs(w) == reference
    assert not _leftovers(w), _leftovers(w)


def test_cache_folder_read_only_then_full_then_freed(tmp_path, setup, tiny_bert_dir):
  data, _, reference = setup
  with small_disk(str(tmp_path / "cache"), 1024, read_only=True) as disk:
    w = tmp_path / "w"
    cmd = _cmd(w, data, tiny_bert_dir, disk.path, *TRAIN)
    proc = _run(cmd, disk.fault)
    _one_error_line(proc, 2, "read-only file system writing", f"{disk.path}/")
    disk.remount(4)  # writable, but one page: the embeddings do not fit
    proc = _run(cmd, disk.fault)
    _one_error_line(proc, 2, "no space left on device writing", f"{disk.path}/")
    assert not _leftovers(disk.path, w), _leftovers(disk.path, w)
    assert not os.path.exists(w / "results.json")
    disk.remount(8192)
    proc = _run(cmd)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert _outputs(w) == reference
    assert not _leftovers(disk.path, w)


def test_corrupted_and_truncated_cache_files_are_recomputed(tmp_path, setup, tiny_bert_dir):
  data, cache, reference = setup
  spoilt = str(tmp_path / "cache")
  shutil.copytree(cache, spoilt)
  arrays = sorted(glob.glob(os.path.join(spoilt, "*.npy")))
  assert len(arrays) >= 2, arrays
  good = {p: open(p, "rb").read() for p in arrays}
  with open(arrays[0], "r+b") as f:  # corrupted: bytes of the array changed, size kept
    f.seek(len(good[arrays[0]]) - 64)
    f.write(bytes(64))
  with open(arrays[1], "r+b") as f:  # truncated: half the file
    f.truncate(len(good[arrays[1]]) // 2)
  w = tmp_path / "w"
  proc = _run(_cmd(w, data, tiny_bert_dir, spoilt, *TRAIN))
  assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert _outputs(w) == reference
  assert {p: open(p, "rb").read() for p in arrays} == good  # rewritten as they were
  assert not _leftovers(spoilt, w)


def _wait_for_checkpoint(proc, ckpts, at_least, timeout=240):
  deadline = time.time() + timeout
  while time.time() < deadline and proc.poll() is None:
    if any(s >= at_least for s in _complete_steps(ckpts)):
      return
    time.sleep(0.02)
  assert proc.poll() is None, "the run ended before it could be stopped"
  raise AssertionError(f"no checkpoint >= {at_least} in {timeout} s")


def _interrupt(cmd, ckpts, signum, after):
  """Runs `cmd`, sends `signum` once a checkpoint >= `after` is complete; the finished process."""
  p = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
  _wait_for_checkpoint(p, ckpts, after)
  p.send_signal(signum)
  stdout, stderr = p.communicate(timeout=120)
  return subprocess.CompletedProcess(cmd, p.returncode, stdout, stderr)


def test_sigint_then_sigterm_end_in_one_line_and_the_same_command_resumes(tmp_path, setup,
                                                                          tiny_bert_dir):
  # SIGINT (exit 130), the same command resumes; SIGTERM later (exit 143), the same command
  # resumes again and ends with the undisturbed run's numbers.
  data, cache, reference = setup
  w = tmp_path / "w"
  cmd = _cmd(w, data, tiny_bert_dir, cache, *TRAIN)
  last = 0
  for signum, code, name, after in ((signal.SIGINT, 130, "SIGINT", 30),
                                    (signal.SIGTERM, 143, "SIGTERM", 70)):
    proc = _interrupt(cmd, w / "checkpoints", signum, after)
    _one_error_line(proc, code, name, "run the same command to resume")
    kept = _complete_steps(w / "checkpoints")
    assert kept and after <= max(kept) < 120 and max(kept) > last
    last = max(kept)
    assert not _leftovers(w), _leftovers(w)
    assert not (w / "results.json").exists()
  proc = _run(cmd)
  assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert _outputs(w) == reference


def test_sigkill_then_rerun_of_a_cross_validated_job_matches(tmp_path, tiny_bert_dir):
  """Three folds, each its own model and checkpoints (`foldK/`): killed in the second fold."""
  data = write_beir(str(tmp_path / "only"), num_docs=50, num_queries=30, seed=3,
                    splits=("test",))
  cache = tmp_path / "cache"
  folds = ("--config.data.folds=3", "--config.train.steps=100", "--config.train.eval_every=50",
           "--config.train.checkpoint_every=10")
  ref = tmp_path / "ref"
  proc = _run(_cmd(ref, data, tiny_bert_dir, cache, *folds))
  assert proc.returncode == 0, proc.stderr[-3000:]
  w = tmp_path / "w"
  cmd = _cmd(w, data, tiny_bert_dir, cache, *folds)
  p = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
  second = sorted(d for d in os.listdir(ref) if os.path.isdir(ref / d / "checkpoints"))[1]
  _wait_for_checkpoint(p, w / second / "checkpoints", 20)
  p.kill()
  p.wait()
  assert not (w / "results.json").exists()
  proc = _run(cmd)
  assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert _outputs(w) == _outputs(ref)
  assert len(_outputs(w)["results"]["folds"]) == 3
  assert not _leftovers(w), _leftovers(w)


def test_refused_errno_is_found_where_orbax_and_tensorstore_put_it():
  """The translation keeps real bugs: only the errnos of a refused write become one line."""
  from bilinear_ir import files  # pylint: disable=g-import-not-at-top
  ts = ValueError("RESOURCE_EXHAUSTED: Error writing local file \"x\": Failed to write 3219 "
                  "bytes to file 17: No space left on device [os_error_code='28']")
  assert files.refused_errno(ts) == errno.ENOSPC
  rust = RuntimeError("Error while serializing: I/O error: Read-only file system (os error 30)")
  assert files.refused_errno(rust) == errno.EROFS
  assert files.refused_errno(RuntimeError("I/O error: (os error 2)")) is None  # ENOENT: a bug
  try:
    try:
      raise OSError(errno.EROFS, os.strerror(errno.EROFS), "f")
    except OSError as inner:
      raise RuntimeError("wrapped") from inner
  except RuntimeError as outer:
    assert files.refused_errno(outer) == errno.EROFS
  assert files.refused_errno(FileNotFoundError(errno.ENOENT, "gone", "f")) is None
  assert files.refused_errno(ValueError("[os_error_code='2']")) is None
  assert files.refused_errno(KeyError("x")) is None


def test_saved_model_and_report_writes_on_a_full_disk(tmp_path, monkeypatch):
  """The saved model (a folder inside a folder) and the report's files: one `WriteError` naming
  what was being written, nothing left behind; the same writes succeed once space is freed."""
  from bilinear_ir import scorers  # pylint: disable=g-import-not-at-top
  from bilinear_ir.errors import WriteError  # pylint: disable=g-import-not-at-top
  from bilinear_ir.report import outputs as report  # pylint: disable=g-import-not-at-top
  from bilinear_ir.export import saved_model  # pylint: disable=g-import-not-at-top
  module = scorers.build("bilinear", 256)  # W: 256 x 256 float32, 256 KiB
  params = {"W": np.eye(256, dtype=np.float32)}
  rep = report.Report(results={"x": 1}, markdown="# x\n",
                      extra_files={"run.trec": "q0 Q0 d0 1 1.0 x\n" * 20000})  # ~340 KB
  with small_disk(str(tmp_path / "disk"), 64) as disk:
    if disk.fault:
      monkeypatch.setenv("BILINEAR_IR_FAULT", disk.fault)
    models = os.path.join(disk.path, "models")
    with pytest.raises(WriteError, match="no space left on device writing") as e:
      saved_model.save_many(models, {"a": (module, params, {"pooling": "mean"}, {})})
    assert e.value.path == models and e.value.errno == errno.ENOSPC
    with pytest.raises(WriteError, match="no space left on device writing") as e:
      report.write(os.path.join(disk.path, "w"), "{}", rep)
    assert e.value.path.startswith(os.path.join(disk.path, "w", ""))
    assert not _leftovers(disk.path) and not os.path.exists(models)
    disk.remount(8192)
    monkeypatch.delenv("BILINEAR_IR_FAULT", raising=False)
    saved_model.save_many(models, {"a": (module, params, {"pooling": "mean"}, {})})
    report.write(os.path.join(disk.path, "w"), "{}", rep)
    _, got, _ = saved_model.load_model(os.path.join(models, "a"))
    np.testing.assert_array_equal(got["W"], params["W"])
    with open(os.path.join(disk.path, "w", "run.trec"), encoding="utf-8") as f:
      assert f.read() == rep.extra_files["run.trec"]
    assert not _leftovers(disk.path)


# A process killed right after the first step of `files.atomic_dir`'s replacement that removes
# anything: the real removal, then exit without cleanup (as SIGKILL would).
_KILLED_AFTER_A_REMOVAL = """
import os, shutil, sys
from bilinear_ir import files
if sys.argv[2] == "no-exchange":
  files._exchange = lambda a, b: False  # a system without renameat2's RENAME_EXCHANGE
real = shutil.rmtree
def killed(path, *args, **kwargs):
  real(path, *args, **kwargs)
  os._exit(9)
shutil.rmtree = killed
with files.atomic_dir(sys.argv[1]) as tmp:
  for name in ("a", "b"):
    with open(os.path.join(tmp, name), "w") as f:
      f.write("new " + name)
"""


@pytest.mark.parametrize("how", ["exchange", "no-exchange"])
def test_atomic_dir_killed_between_its_steps_leaves_a_whole_folder(tmp_path, how):
  """The new folder goes into place before the old one is removed: a kill between the two
  leaves the new folder whole at the path (the old one was removed first, the path was gone)."""
  path = tmp_path / "saved"
  path.mkdir()
  for name in ("a", "b", "c"):
    (path / name).write_text("old " + name)
  proc = subprocess.run([sys.executable, "-c", _KILLED_AFTER_A_REMOVAL, str(path), how],
                        cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
  assert proc.returncode == 9, proc.stderr[-2000:]
  assert sorted(os.listdir(path)) == ["a", "b"]
  assert [(path / n).read_text() for n in ("a", "b")] == ["new a", "new b"]


def test_atomic_dir_replaces_a_folder_or_keeps_it_whole(tmp_path):
  from bilinear_ir import files  # pylint: disable=g-import-not-at-top
  path = tmp_path / "saved"
  with files.atomic_dir(str(path)) as tmp:
    (tmp_path / tmp / "a").write_text("1")
  with files.atomic_dir(str(path)) as tmp:  # an existing folder: swapped, the old one removed
    (tmp_path / tmp / "b").write_text("2")
  assert os.listdir(path) == ["b"] and os.listdir(tmp_path) == ["saved"]
  with pytest.raises(RuntimeError, match="half"):
    with files.atomic_dir(str(path)) as tmp:
      (tmp_path / tmp / "c").write_text("3")
      raise RuntimeError("half-written")
  assert os.listdir(path) == ["b"] and os.listdir(tmp_path) == ["saved"]


def test_an_abandoned_checkpoint_writer_does_not_follow_the_error_line():
  """A write refused mid-checkpoint leaves orbax's other fragment writers (coroutines) unawaited;
  Python warns of each at exit, after the error line (seen once in CI). `fail` keeps the error the
  last line; any other warning still prints."""
  script = ("import asyncio, sys, warnings\n"
            "from bilinear_ir import main\n"
            "async def write_fragment():\n  pass\n"
            "sys.modules['__main__'].pending = write_fragment()  # collected at exit, unawaited\n"
            "warnings.warn('another warning', RuntimeWarning)\n"
            "main.fail('no space left on device writing w/checkpoints/30')\n")
  proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=_env(), capture_output=True,
                        text=True, timeout=120)
  lines = [line for line in proc.stderr.splitlines() if line.strip()]
  assert proc.returncode == 2, proc.stderr
  assert lines[-1] == "error: no space left on device writing w/checkpoints/30", proc.stderr
  assert "another warning" in proc.stderr and "never awaited" not in proc.stderr, proc.stderr
