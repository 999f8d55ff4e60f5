"""`launch/late_interaction_gpu.sh` on the CPU: a finished run is copied, not run again; the
budget stops it before a job starts; a job's error stops the script with the job's exit code
before the next run, leaving no run marked done. (The runs themselves are the job's, tested in
tests/jobs/test_late_interaction_job.py.)"""
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _script(tmp_path, **env):
  env = dict(os.environ, OUT=str(tmp_path / "out"), WORK=str(tmp_path / "work"),
             PYTHON=sys.executable, **{k: str(v) for k, v in env.items()})
  return subprocess.run(["bash", os.path.join(REPO, "launch", "late_interaction_gpu.sh")],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
                        check=False)


def test_runs_finished_by_an_earlier_call_are_copied_to_out(tmp_path):
  done = tmp_path / "work" / "done"
  done.mkdir(parents=True)
  for name in ("curve", "full"):
    (done / f"{name}.json").write_text(f'{{"run": "{name}"}}')
    (done / f"{name}.md").write_text(name)
  (done / "curve.png").write_bytes(b"png")
  # the inputs do not exist: a job started here would fail and the script with it
  proc = _script(tmp_path, DATA=tmp_path / "missing")
  assert proc.returncode == 0, proc.stdout + proc.stderr
  out = tmp_path / "out"
  assert sorted(os.listdir(out)) == ["curve.json", "curve.log", "curve.md", "curve.png",
                                     "full.json", "full.log", "full.md"]
  assert (out / "full.json").read_text() == '{"run": "full"}'
  assert "finished by an earlier call" in (out / "curve.log").read_text()


def test_too_little_budget_starts_no_job(tmp_path):
  proc = _script(tmp_path, BUDGET_S=20)
  assert proc.returncode == 124
  # the seconds left when it checks: 20, or 19 where the script's start took over a second
  assert re.search(r"curve: skipped, (20|19) s of the budget left",
                   (tmp_path / "out" / "curve.log").read_text())
  assert not (tmp_path / "out" / "full.log").exists()


def test_a_failed_job_stops_the_script_with_its_exit_code(tmp_path):
  """The job refuses the missing data folder (exit 2, naming the field) after parsing the
  script's config string and rows: nothing is marked done and the full run never starts."""
  proc = _script(tmp_path, BUDGET_S=200, DATA=tmp_path / "missing")
  log = (tmp_path / "out" / "curve.log").read_text()
  assert proc.returncode == 2, log
  assert "data.path" in log and "curve: rc 2" in log
  assert not (tmp_path / "out" / "full.log").exists()
  assert not os.listdir(tmp_path / "work" / "done")


def test_curve_rows_reach_the_job(tmp_path):
  """CURVE_ROWS replaces the curve's rows: a name the job does not know stops it (exit 2, naming
  the row and the field) before any data is read; the data and model folders exist (empty)."""
  proc = _script(tmp_path, BUDGET_S=200, DATA=tmp_path, MODEL=tmp_path,
                 CURVE_ROWS="'dot','colbert','no_such_row'")
  log = (tmp_path / "out" / "curve.log").read_text()
  assert proc.returncode == 2, log
  assert "no_such_row" in log and "rows" in log and "curve: rc 2" in log
  assert not (tmp_path / "out" / "full.log").exists()
