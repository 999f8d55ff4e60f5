"""The command line's slips: each exits 2 with one stderr line, no traceback, nothing written.

Every case runs `python -m bilinear_ir.main` as a subprocess (all started at once, then checked),
as a new user would type it.
"""
import os
import subprocess
import sys
import tempfile

import pytest

from conftest import main_env

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read_only_dir(root: str) -> str:
  """A folder this process cannot create files in: a chmod 0555 folder, or (as root, who may
  write anywhere on a normal file system) /sys."""
  folder = os.path.join(root, "read_only")
  os.makedirs(folder)
  os.chmod(folder, 0o555)
  try:
    fd, probe = tempfile.mkstemp(dir=folder)
  except OSError:
    return folder
  os.close(fd)
  os.remove(probe)
  return "/sys"


def _cases(root: str) -> dict[str, tuple[list[str], str, str]]:
  """name -> (arguments, workdir, a word the error line must contain)."""
  afile = os.path.join(root, "a_file")
  with open(afile, "w", encoding="utf-8") as f:
    f.write("x")
  w = lambda name: os.path.join(root, name, "work")
  train = "--config=configs/train_eval.py"
  return {
      "config_typo": (["--config=configs/trian_eval.py"], w("typo"), "trian_eval.py"),
      "config_arg_not_an_int": (["--config=configs/train_eval.py:rank=abc"], w("rank"), "rank"),
      "config_arg_unknown": (["--config=configs/train_eval.py:rnak=3"], w("unknown"), "rnak"),
      "config_arg_not_key_value": (["--config=configs/train_eval.py:rank"], w("kv"), "rank"),
      "override_unknown_field": ([train, "--config.train.batch_sizee=3"], w("field"),
                                 "batch_size"),
      "override_bad_type": ([train, "--config.train.lr=fast"], w("type"), "lr"),
      "batch_size_zero": ([train, "--config.train.batch_size=0"], w("batch"),
                          "train.batch_size"),
      "folds_negative": ([train, "--config.data.folds=-1"], w("folds"), "data.folds"),
      "folds_one": ([train, "--config.data.folds=1"], w("folds1"), "data.folds"),
      "learning_rate_negative": ([train, "--config.train.lr=-0.1"], w("lr"), "train.lr"),
      "depth_zero": ([train, "--config.eval.depth=0"], w("depth"), "eval.depth"),
      "unknown_scorer": (["--config=configs/train_eval.py:scorer=bilinaer"], w("scorer"),
                         "bilinaer"),
      "rank_zero": (["--config=configs/train_eval.py:scorer=lowrank,rank=0"], w("rank0"),
                    "rank"),
      "unknown_format": ([train, "--config.data.format=csv"], w("format"), "data.format"),
      "missing_data_path": ([train, "--config.data.format=beir",
                             f"--config.data.path={root}/nowhere"], w("path"), "data.path"),
      "unknown_job": ([train, "--config.job=train"], w("job"), "job"),
      "table_unknown_embedding": (["--config=configs/reproduce_table.py:embeddings=mean+clss"],
                                  w("emb"), "clss"),
      "retrieve_k_zero": (["--config=configs/retrieve.py:k=0"], w("k"), "k"),
      "workdir_is_a_file": ([train], afile, "a_file"),
      "workdir_under_a_file": ([train], os.path.join(afile, "sub", "work"), "a_file"),
      "workdir_read_only": ([train], os.path.join(_read_only_dir(root), "new", "work"),
                            "--workdir"),
  }


def _tree(root: str) -> dict[str, tuple]:
  """Every folder and file under `root`: path -> ("dir", mode) or ("file", mode, bytes,
  mtime_ns)."""
  out = {}
  for folder, dirs, names in os.walk(root):
    for d in dirs:
      path = os.path.join(folder, d)
      out[path] = ("dir", os.stat(path).st_mode)
    for n in names:
      path = os.path.join(folder, n)
      st = os.stat(path)
      with open(path, "rb") as f:
        out[path] = ("file", st.st_mode, f.read(), st.st_mtime_ns)
  return out


def _first_missing(path: str) -> str | None:
  """The outermost folder of `path` that does not exist (what a slip must not create)."""
  missing = None
  while not os.path.exists(path):
    missing, path = path, os.path.dirname(path)
  return missing


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
  """name -> (returncode, stdout, stderr, workdir, word, first missing folder), every case run
  concurrently; "__tree__" -> the files and folders under the root before and after."""
  root = str(tmp_path_factory.mktemp("front_door"))
  cases = _cases(root)
  missing = {name: _first_missing(workdir) for name, (_, workdir, _) in cases.items()}
  before = _tree(root)
  env = main_env()
  procs = {name: subprocess.Popen(
      [sys.executable, "-m", "bilinear_ir.main", *args, f"--workdir={workdir}"], cwd=REPO,
      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for name, (args, workdir, _) in cases.items()}
  out = {}
  for name, proc in procs.items():
    stdout, stderr = proc.communicate(timeout=600)
    out[name] = (proc.returncode, stdout, stderr, cases[name][1], cases[name][2],
                 missing[name])
  out["__tree__"] = (before, _tree(root))
  return out


CASE_NAMES = sorted([
    "config_typo", "config_arg_not_an_int", "config_arg_unknown", "config_arg_not_key_value",
    "override_unknown_field", "override_bad_type", "batch_size_zero", "folds_negative",
    "folds_one", "learning_rate_negative", "depth_zero", "unknown_scorer", "rank_zero",
    "unknown_format", "missing_data_path", "unknown_job", "table_unknown_embedding",
    "retrieve_k_zero", "workdir_is_a_file", "workdir_under_a_file", "workdir_read_only"])


@pytest.mark.parametrize("name", CASE_NAMES)
def test_slip_exits_2_with_one_line(outcomes, name):
  code, stdout, stderr, workdir, word, missing = outcomes[name]
  lines = [line for line in stderr.splitlines() if line.strip()]
  assert code == 2, f"exit {code}; stderr:\n{stderr}"
  assert len(lines) == 1, f"expected one stderr line, got:\n{stderr}"
  assert lines[0].startswith("error: "), lines[0]
  assert word in lines[0], f"{word!r} not named in: {lines[0]}"
  assert "Traceback" not in stderr + stdout
  # Nothing created: not the workdir, nor any folder above it that was missing.
  if missing is not None:
    assert not os.path.exists(missing), f"{missing} was created"


def test_slips_leave_every_file_and_folder_as_it_was(outcomes):
  # The workdir that is a file (and the file a workdir is under) keeps its bytes, mode and
  # mtime; no folder or file appeared or went away anywhere under the cases' root.
  before, after = outcomes["__tree__"]
  assert any(kind[0] == "file" for kind in before.values())
  assert after == before, sorted(set(after) ^ set(before))


def test_cases_cover_every_name(tmp_path):
  assert sorted(_cases(str(tmp_path))) == CASE_NAMES
