"""The text of the reports: table cells (`fmt`, `fmt_paired`), markdown tables and each job's
fixed prose, kept in `templates/<job>.md` (one `<!-- section -->` per paragraph, filled by
`prose`)."""
from __future__ import annotations

import functools
import os
import re
from typing import Any, Sequence

from bilinear_ir.eval import stats


def fmt(x: Any, digits: int = 3, style: str = "f") -> str:
  """Formats a number for a table: floats with `digits` decimals (`style` "f") or significant
  digits ("g"), None as '-'."""
  if x is None:
    return "-"
  if isinstance(x, float):
    return f"{x:.{digits}{style}}"
  return str(x)


def fmt_diff(x: float, digits: int = 3) -> str:
  """A signed difference as a table cell, e.g. `+0.012`. One below `stats.TIE_TOL` in magnitude
  is a tie (a seed mean of identical runs can move the last bit) and reads `+0.000`, not
  `-0.000`."""
  return f"{0.0 if abs(x) < stats.TIE_TOL else x:+.{digits}f}"


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
