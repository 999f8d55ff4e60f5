"""What a job hands back to `main`: results, a markdown table and figures, written atomically.

Jobs never write results themselves; `main` writes `config.json`, `results.json`, `results.md`
and `<name>.png` for each figure only after the job returned, each through a temp file + rename.
The table helpers (`fmt`, `markdown_table`) are the ones every job's markdown uses; a job's
fixed prose lives in `templates/<job>.md`, one `<!-- section -->` per paragraph, filled by `prose`.
"""
from __future__ import annotations

import dataclasses
import json
import functools
import os
import re
from typing import Any, Callable, Sequence

from bilinear_ir import files
from bilinear_ir.eval import stats


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


def fmt(x: Any, digits: int = 3, style: str = "f") -> str:
  """Formats a number for a table: floats with `digits` decimals (`style` "f") or significant
  digits ("g"), None as '-'."""
  if x is None:
    return "-"
  if isinstance(x, float):
    return f"{x:.{digits}{style}}"
  return str(x)


def fmt_paired(comparison: dict[str, Any] | None, alpha: float = 0.05, ci: bool = True) -> str:
  """A paired comparison (`eval.stats.paired`) as a table cell: `+0.012 [-0.004, +0.028]
  p=0.31` with "+" / "\u2212" appended for a significant gain / loss (Holm p when present)."""
  if not comparison:
    return "-"
  p = comparison.get("p_holm", comparison["p_perm"])
  interval = f" [{comparison['ci95'][0]:+.3f}, {comparison['ci95'][1]:+.3f}]" if ci else ""
  return f"{comparison['diff']:+.3f}{interval} p={p:.2g}{stats.mark(comparison, alpha)}"


def markdown_table(rows: Sequence[Sequence[Any]], header: Sequence[str], digits: int = 3) -> str:
  """A GitHub markdown table from `rows` (lists of cells) under `header`."""
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for row in rows:
    lines.append("| " + " | ".join(fmt(c, digits) for c in row) + " |")
  return "\n".join(lines) + "\n"


TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")


@functools.cache
def _sections(job: str) -> dict[str, str]:
  """{section: text} of `templates/<job>.md`: the text after each `<!-- section -->` line up to
  the next such line (its trailing newline kept once)."""
  with open(os.path.join(TEMPLATES, f"{job}.md"), encoding="utf-8") as f:
    parts = re.split(r"^<!-- ([a-z_]+) -->\n", f.read(), flags=re.M)
  return {name: text.rstrip("\n") + "\n" for name, text in zip(parts[1::2], parts[2::2])}


def prose(job: str, section: str, **values: Any) -> str:
  """Paragraph `section` of job `job`'s template with its `{fields}` filled (`str.format`)."""
  return _sections(job)[section].format(**values)


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
