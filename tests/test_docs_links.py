"""The README and docs/ stay usable: every relative link resolves, the README stays short.

Every relative link (markdown links, images and reference definitions) in README.md,
launch/README.md and every .md under docs/ must name an existing file or folder; a `#anchor`
into a markdown file (or into the same file) must name one of its headings, slugged as GitHub
does. Links inside fenced code blocks and inline code are not links. Absolute URLs (`https:`,
`mailto:`) are not checked (nothing outside can be reached from CI). The README is at most 300
lines, with the quickstart's heading within its first 40 (issue 38).
"""
import glob
import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(REPO, "README.md")
MAX_README_LINES = 300
QUICKSTART_WITHIN = 40

_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"(`+).*?\1")
_INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^()\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def markdown_files() -> list[str]:
  """README.md, launch/README.md and every .md under docs/ (absolute paths, sorted)."""
  files = [README, os.path.join(REPO, "launch", "README.md")]
  files += glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True)
  return sorted(f for f in files if os.path.isfile(f))


def prose_lines(text: str, keep_code: bool = False) -> list[tuple[int, str]]:
  """(1-based line number, line) outside fenced code blocks; inline code spans blanked unless
  `keep_code` (a heading's anchor includes its code's text)."""
  out, fenced = [], False
  for number, line in enumerate(text.split("\n"), 1):
    if _FENCE.match(line):
      fenced = not fenced
      continue
    if not fenced:
      out.append((number, line if keep_code else _CODE_SPAN.sub("", line)))
  return out


def github_slug(heading: str) -> str:
  """The anchor GitHub gives a heading's text: markup dropped, lowercase, every character that
  is not a letter, digit, space, '-' or '_' removed, spaces to '-'."""
  text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link or image: its text
  text = text.replace("`", "").lower()
  text = "".join(c for c in text if c.isalnum() or c in " -_")
  return text.replace(" ", "-")


def anchors(path: str) -> set[str]:
  """Every heading anchor of markdown file `path`; repeated headings get -1, -2, ... as on GitHub."""
  with open(path, encoding="utf-8") as f:
    text = f.read()
  seen: dict[str, int] = {}
  out = set()
  for _, line in prose_lines(text, keep_code=True):
    m = _HEADING.match(line)
    if not m:
      continue
    slug = github_slug(m.group(2))
    if slug in seen:
      seen[slug] += 1
      out.add(f"{slug}-{seen[slug]}")
    else:
      seen[slug] = 0
      out.add(slug)
  return out


def links(path: str) -> list[tuple[int, str]]:
  """(line, target) of every link, image and reference definition in markdown file `path`."""
  with open(path, encoding="utf-8") as f:
    text = f.read()
  out = []
  for number, line in prose_lines(text):
    m = _REFERENCE_DEF.match(line)
    if m:
      out.append((number, m.group(1)))
      continue
    out.extend((number, target) for target in _INLINE_LINK.findall(line))
  return out


def broken_links(path: str, root: str = REPO) -> list[str]:
  """'file:line: target (why)' for each relative link of `path` that does not resolve (file
  named relative to `root`)."""
  problems = []
  rel = os.path.relpath(path, root)
  for number, target in links(path):
    if _SCHEME.match(target) or target.startswith("//"):
      continue  # an absolute URL
    file_part, _, anchor = target.partition("#")
    resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
    if not os.path.exists(resolved):
      problems.append(f"{rel}:{number}: {target} (no such file)")
      continue
    if anchor and resolved.endswith(".md") and os.path.isfile(resolved):
      if anchor not in anchors(resolved):
        problems.append(f"{rel}:{number}: {target} (no heading #{anchor})")
  return problems


@pytest.mark.parametrize("heading, slug", [
    # slugs as github.com renders them
    ("Quickstart (two commands, a fresh machine with Python 3.11)",
     "quickstart-two-commands-a-fresh-machine-with-python-311"),
    ("Using a trained similarity", "using-a-trained-similarity"),
    ("Where the GPU scan's time goes: `benchmarks/gpu_sweep.py`",
     "where-the-gpu-scans-time-goes-benchmarksgpu_sweeppy"),
    ("Data, attribution, citation", "data-attribution-citation"),
    ("InsuranceQA V2", "insuranceqa-v2"),
    ("A [linked](x.md) heading", "a-linked-heading"),
])
def test_github_slug(heading, slug):
  assert github_slug(heading) == slug


def test_the_checker_finds_what_is_broken(tmp_path):
  """A made-up tree: a good link, a missing file, a missing heading, a repeated heading's -1
  anchor, links in code (ignored) and an absolute URL (ignored)."""
  (tmp_path / "docs").mkdir()
  (tmp_path / "docs" / "a.md").write_text("# Title\n\n## Part\n\n## Part\n")
  page = tmp_path / "README.md"
  page.write_text(
      "[ok](docs/a.md) [ok](docs/a.md#part-1) ![img](docs/gone.png)\n"
      "[bad anchor](docs/a.md#nothing) [self](#top) `[code](nowhere.md)`\n"
      "```\n[fenced](nowhere.md)\n```\n"
      "[web](https://example.org/x.md) [ref]: docs/missing.md\n"
      "[ref]: docs/also_missing.md\n"
      "# Top\n")
  assert broken_links(str(page), root=str(tmp_path)) == [
      "README.md:1: docs/gone.png (no such file)",
      "README.md:2: docs/a.md#nothing (no heading #nothing)",
      "README.md:7: docs/also_missing.md (no such file)",
  ]


def test_docs_are_checked():
  """The files this test reads exist (a renamed docs/ folder would check nothing)."""
  names = {os.path.relpath(f, REPO) for f in markdown_files()}
  assert "README.md" in names
  assert any(n.startswith(os.path.join("docs", "results")) for n in names)
  assert any(n.startswith(os.path.join("docs", "benchmarks")) for n in names)


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: os.path.relpath(p, REPO))
def test_every_relative_link_resolves(path):
  assert broken_links(path) == []


def test_readme_is_short_with_the_quickstart_first():
  with open(README, encoding="utf-8") as f:
    lines = f.read().split("\n")
  if lines and lines[-1] == "":
    lines = lines[:-1]
  assert len(lines) <= MAX_README_LINES
  quickstart = [i for i, line in enumerate(lines, 1) if re.match(r"#{1,6}\s+Quickstart\b", line)]
  assert quickstart and quickstart[0] <= QUICKSTART_WITHIN
