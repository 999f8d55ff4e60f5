r"""The one entry point: `python -m bilinear_ir.main --config=configs/NAME.py[:ARGS] --workdir=DIR`.

`config.job` names the job (`bilinear_ir/jobs/<job>.py`); every knob can be overridden with
`--config.x=y`. The job's config is validated and the workdir checked before any work starts;
outputs (`config.json`, `results.json`, `results.md`, PNG plots) are written to `--workdir` only
when the job finished. Bad input (a config file that does not load, a bad value, a workdir that
cannot be written, a malformed data file) exits with code 2 and one line on stderr, and so does a
write the machine refuses during the run (a full disk, a read-only folder, a quota: the line names
the path and the reason) or memory it cannot give (a `MemoryError`: the line names what was being
read or built); rerun the same command once the cause is removed and training resumes
from its last complete checkpoint. SIGINT (Ctrl-C) and SIGTERM end the run with one line saying
so, the last complete checkpoint kept, and exit code 130 (SIGINT) or 143 (SIGTERM), 128 + the
signal number as shells report it; the same command resumes.
"""
from __future__ import annotations

import os
import signal
import sys
import warnings

from absl import app
from absl import flags
from absl import logging
import jax
from ml_collections import config_flags

from bilinear_ir import allocator
from bilinear_ir import files
from bilinear_ir import jobs
from bilinear_ir.errors import InputError
from bilinear_ir.report import outputs as report_lib

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Path to a config file, e.g. configs/x.py:arg.",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for outputs (results, checkpoints, caches).")


def _quiet_abandoned_writes() -> None:
  """Keeps the error line the last one: a write the machine refused mid-checkpoint leaves orbax's
  other fragment writers (coroutines) unawaited, and Python warns of each at exit."""
  warnings.filterwarnings("ignore", message=r"coroutine .* was never awaited",
                          category=RuntimeWarning)


def fail(message: str) -> None:
  """One line on stderr, exit code 2."""
  _quiet_abandoned_writes()
  print(f"error: {' '.join(str(message).split())}", file=sys.stderr)
  sys.exit(2)


class Stopped(BaseException):
  """SIGINT or SIGTERM arrived (a BaseException, as KeyboardInterrupt: `except Exception` does not
  catch it)."""

  def __init__(self, signum: int):
    super().__init__(signal.Signals(signum).name)
    self.signum = signum


def _stop(signum, frame):  # pylint: disable=unused-argument
  raise Stopped(signum)


def run(config, workdir: str):
  """Validates `config`, runs `config.job` and writes its report into `workdir` (process 0)."""
  if config.get("distributed", False):
    jax.distributed.initialize()
  job = jobs.get(config.get("job", ""))
  job.validate(config)
  files.check_writable_dir(workdir, field="--workdir")
  report = job.run(config, workdir)
  if jax.process_index() == 0:
    report_lib.write(workdir, report_lib.config_to_json(config), report)
    print(report.markdown)
  return report


def main(argv):
  if len(argv) > 1:
    fail(f"unexpected arguments: {argv[1:]}")
  if FLAGS.config is None or FLAGS.workdir is None:
    fail("both --config and --workdir are required")
  logging.set_verbosity(logging.WARNING)
  allocator.keep_freed_memory()
  for s in (signal.SIGINT, signal.SIGTERM):
    signal.signal(s, _stop)
  try:
    run(FLAGS.config, os.path.abspath(FLAGS.workdir))
  except InputError as e:
    fail(str(e))
  except MemoryError as e:  # one line naming what was being read or built, as a refused write
    what = getattr(e, "doing", None) or f"running the job {FLAGS.config.get('job', '')!r}"
    fail(f"out of memory {what}: the machine cannot hold it; free memory or give a smaller input")
  except Stopped as e:
    _quiet_abandoned_writes()
    print(f"error: stopped by {e}; the last complete checkpoint is kept: run the same command "
          "to resume", file=sys.stderr)
    sys.exit(128 + e.signum)
  except Exception as e:  # pylint: disable=broad-except  # re-raised unless a refused write
    code = files.refused_errno(e)
    if code is None:
      raise
    # Not through the project's writers (which name what they write): the OS's words and path.
    path = next((x.filename for x in _chain(e) if getattr(x, "filename", None)), None)
    text = os.strerror(code)
    fail(f"{text[:1].lower()}{text[1:]}" + (f": {path}" if path else ""))


def _chain(error: BaseException) -> list[BaseException]:
  """`error` and its causes and contexts, outermost first."""
  chain, e = [], error
  while e is not None and all(e is not c for c in chain):
    chain.append(e)
    e = e.__cause__ or e.__context__
  return chain


def _config_path(argv) -> str | None:
  """The file part of `--config=PATH[:ARGS]` (or `--config PATH`) in `argv`, if any."""
  for i, arg in enumerate(argv):
    if arg.startswith("--config="):
      return arg[len("--config="):].split(":", 1)[0]
    if arg == "--config" and i + 1 < len(argv):
      return argv[i + 1].split(":", 1)[0]
  return None


def _reason(error: BaseException) -> str:
  """What went wrong, without traceback text.

  config_flags re-raises an error of a config's `get_config` as the same type with the formatted
  traceback as its message, and absl wraps that once more: the innermost `InputError` of the
  chain is the project's own message; otherwise absl's message (which names the flag) or, when
  that holds a traceback, the innermost exception.
  """
  chain = _chain(error)
  inputs = [e for e in chain if isinstance(e, InputError) and "Traceback" not in str(e)]
  if inputs:
    return str(inputs[-1])
  if isinstance(error, flags.Error) and "Traceback" not in str(error):
    return str(error)

  def text(e: BaseException) -> str:  # a KeyError's message is its (possibly nested) argument
    t = e.args[0] if isinstance(e, (KeyError, AttributeError)) and e.args else e
    while isinstance(t, KeyError) and t.args:
      t = t.args[0]
    return str(t)

  texts = [text(e) for e in chain if "Traceback" not in text(e)]
  return max(texts, key=len) if texts else type(chain[-1]).__name__


def parse_flags(argv):
  """absl flag parsing whose errors (a config file that is missing or does not load, a bad
  override) exit 2 with one line on stderr."""
  path = _config_path(argv)
  if path is not None and not os.path.isfile(path):
    fail(f"--config: no such config file {path!r}")
  try:
    parsed = FLAGS(argv)
    if FLAGS.config is not None:
      FLAGS.config.get("job")  # a config that failed to load raises here, not at parse time
  except Exception as e:  # pylint: disable=broad-except  # every way a config can fail to load
    reason = _reason(e)
    fail(reason if reason.startswith("config: ") else f"--config: {reason}")
  return parsed


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
