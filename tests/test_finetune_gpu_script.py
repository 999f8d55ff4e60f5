"""`launch/finetune_gpu.sh` on the CPU: finished runs are copied, not run again; the budget stops
it before a run starts; a failed run does not stop the next one, and the script exits with its
status; an unknown run name is refused. (The runs are the peer benchmark's and the jobs', tested
in tests/test_finetune_peer.py, tests/jobs/test_finetune_job.py and
tests/jobs/test_late_interaction_ft.py.)"""
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _script(tmp_path, **env):
  env = {**os.environ, "OUT": str(tmp_path / "out"), "WORK": str(tmp_path / "work"),
         "PYTHON": sys.executable, **{k: str(v) for k, v in env.items()}}
  return subprocess.run(["bash", os.path.join(REPO, "launch", "finetune_gpu.sh")],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
                        check=False)


def test_finished_runs_are_copied_and_a_spent_budget_starts_nothing(tmp_path):
  done = tmp_path / "work" / "done"
  done.mkdir(parents=True)
  for name in ("peer", "table", "late"):
    (done / f"{name}.json").write_text(f'{{"run": "{name}"}}')
  (done / "table.md").write_text("table")
  # the inputs do not exist: a run started here would fail and the script with it
  proc = _script(tmp_path, DATA=tmp_path / "missing")
  assert proc.returncode == 0, proc.stdout + proc.stderr
  out = tmp_path / "out"
  assert sorted(os.listdir(out)) == ["late.json", "late.log", "peer.json", "peer.log",
                                     "table.json", "table.log", "table.md"]
  assert (out / "late.json").read_text() == '{"run": "late"}'
  proc = _script(tmp_path, BUDGET_S=20, OUT=tmp_path / "out2", WORK=tmp_path / "work2")
  assert proc.returncode == 124
  assert "peer: skipped" in (tmp_path / "out2" / "peer.log").read_text()
  assert not (tmp_path / "out2" / "table.log").exists()


def test_a_failed_run_lets_the_next_run_and_exits_with_its_status(tmp_path):
  """The table job refuses the missing data folder (exit 2, naming the field); the late and
  curve runs still start (and fail the same way); nothing is marked done."""
  proc = _script(tmp_path, BUDGET_S=200, DATA=tmp_path / "missing", RUNS="table late curve")
  assert proc.returncode == 2, proc.stdout + proc.stderr
  for name in ("table", "late", "curve"):
    log = (tmp_path / "out" / f"{name}.log").read_text()
    assert "data.path" in log and f"{name}: rc 2" in log, log
  assert not os.listdir(tmp_path / "work" / "done")
  # the name alone: refused before any run (a run named with it would start the table job on
  # the default data, where that data is present)
  proc = _script(tmp_path, RUNS="nothing")
  assert proc.returncode == 2 and "unknown run nothing" in proc.stdout
