"""What a job hands back to `main`: results, markdown and figures, written atomically.

Jobs never write results themselves; `main` writes `config.json`, `results.json`, `results.md`
and `<name>.png` for each figure only after the job returned, each through a temp file + rename.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable

from bilinear_ir import files


@dataclasses.dataclass
class Report:
  """A job's output.

  Attributes:
    results: JSON-able dict -> `results.json`.
    markdown: the human table(s) -> `results.md` (also printed at the end of the run).
    figures: `{name: matplotlib Figure}` -> `<name>.png`.
    extra_files: `{file name: text}` other text outputs (e.g. `run.trec`).
    folders: `{folder name: writer}` outputs that are folders (e.g. `embeddings/`): main calls
      `writer(path)` with `path` = that folder inside the workdir; the writer must write it
      atomically (a temporary folder renamed into place).
  """
  results: dict[str, Any]
  markdown: str
  figures: dict[str, Any] = dataclasses.field(default_factory=dict)
  extra_files: dict[str, str] = dataclasses.field(default_factory=dict)
  folders: dict[str, Callable[[str], None]] = dataclasses.field(default_factory=dict)


def save_figure(fig: Any, path: str) -> None:
  """Saves a matplotlib figure as PNG atomically and closes it."""
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  with files.atomic_path(path) as tmp:
    fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
  plt.close(fig)


def write(workdir: str, config_json: str, report: Report) -> None:
  """Writes every output of a finished job into `workdir` (each file atomically)."""
  os.makedirs(workdir, exist_ok=True)
  for name, fig in report.figures.items():
    save_figure(fig, os.path.join(workdir, f"{name}.png"))
  for name, text in report.extra_files.items():
    files.atomic_write_text(os.path.join(workdir, name), text)
  for name, writer in report.folders.items():
    writer(os.path.join(workdir, name))
  files.atomic_write_text(os.path.join(workdir, "config.json"), config_json)
  files.atomic_write_text(os.path.join(workdir, "results.md"), report.markdown)
  files.atomic_write_json(os.path.join(workdir, "results.json"), report.results)


def config_to_json(config: Any) -> str:
  """The resolved config as indented JSON."""
  return json.dumps(files.to_jsonable(config.to_dict()), indent=2, sort_keys=True) + "\n"
