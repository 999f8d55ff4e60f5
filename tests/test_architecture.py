"""The project's import rule, read from the source with `ast` (function-local imports too).

The parts of `bilinear_ir` form layers, and a part imports only parts in layers below its own:

  main -> jobs -> report -> studies -> experiment -> synthetic -> export
  -> {train, retrieval, fidelity} -> data -> {encoders, scorers, eval, lowrank}
  -> {errors, files, allocator, config, progress, timing}

(the bottom modules import each other only in that order). So the jobs say what runs, the report
layer what a reader sees, the studies hold protocol that belongs to one study only (the
late-interaction setting, truncation, approximate top-k, curve subsets, the fidelity experiments,
the agreement table), and the generic experiment protocol (`experiment/`: training with dev
selection, rows, comparisons, evaluation, config checks) sits between them and the libraries,
none of which may import it. A job never imports another job, nor defines a top-level function
that another job or a library module also defines (besides the entry points `validate` / `run`
and its own report's `markdown` / `findings` / `plot`). Function-local imports are only of
optional third-party packages, and a config file imports only `ml_collections` and the modules
of `bilinear_ir.config` (its blocks, argument parsing and embedding specs; so loading one imports
neither jax nor flax: checked in a fresh process).
"""
import ast
import glob
import os
import subprocess
import sys

import pytest

from bilinear_ir import jobs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(REPO, "bilinear_ir")

LAYERS = (
    ("errors", "files", "allocator", "config", "progress", "timing"),
    ("encoders", "scorers", "eval", "lowrank"),
    ("data",),
    ("train", "retrieval", "fidelity"),
    ("export",),  # the FAISS index searches with retrieval's exact top-k
    ("synthetic",),
    ("experiment",),
    ("studies",),
    ("report",),
    ("jobs",),
    ("main",),
)
LAYER = {part: i for i, parts in enumerate(LAYERS) for part in parts}
# The bottom layer's modules may import each other only in this order (each the ones before it).
BOTTOM_ORDER = ("errors", "files", "allocator", "config", "progress", "timing")
# Optional third-party packages (extras or heavy plotting) that may be imported inside functions.
OPTIONAL = ("faiss", "torch", "Stemmer", "matplotlib", "tensorboardX", "tensorflow_datasets",
            "sentence_transformers", "transformers", "huggingface_hub", "array_record", "etils",
            "lancedb", "pyarrow")


def _modules() -> dict[str, str]:
  """{dotted module name: path} of every module of the package."""
  out = {}
  for path in glob.glob(os.path.join(PACKAGE, "**", "*.py"), recursive=True):
    rel = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
    out[rel[:-len(".__init__")] if rel.endswith(".__init__") else rel] = path
  return out


def _imports(path: str, module: str):
  """[(imported dotted name, is function-local, line)] of one module (relative imports resolved)."""
  tree = ast.parse(open(path, encoding="utf-8").read(), path)
  local = set()
  for node in ast.walk(tree):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      for inner in ast.walk(node):
        if isinstance(inner, (ast.Import, ast.ImportFrom)):
          local.add(id(inner))
  package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
  out = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      out += [(a.name, id(node) in local, node.lineno) for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        parts = package.split(".")
        base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
      # `from bilinear_ir.x import y` may import the submodule x.y: count both.
      out.append((base, id(node) in local, node.lineno))
      out += [(f"{base}.{a.name}", id(node) in local, node.lineno) for a in node.names]
  return out


def _part(name: str) -> str | None:
  """Top-level part of a `bilinear_ir.*` name ("data" for bilinear_ir.data.pipeline)."""
  bits = name.split(".")
  return bits[1] if bits[0] == "bilinear_ir" and len(bits) > 1 else None


MODULES = _modules()


def test_every_part_has_a_layer():
  parts = {_part(m) for m in MODULES} - {None}
  assert parts <= set(LAYER), f"parts without a layer: {sorted(parts - set(LAYER))}"


def test_parts_import_only_parts_below_them():
  bad = []
  for module, path in MODULES.items():
    src = _part(module)
    if src is None:
      continue
    for name, _, line in _imports(path, module):
      dst = _part(name)
      if dst is None or dst == src or (dst not in LAYER and name not in MODULES):
        continue
      if LAYER[src] == LAYER[dst] == 0:
        ok = BOTTOM_ORDER.index(dst) < BOTTOM_ORDER.index(src)
      else:
        ok = LAYER[dst] < LAYER[src]
      if not ok:
        bad.append(f"{os.path.relpath(path, REPO)}:{line}: {src} imports {dst} ({name})")
  assert not bad, "imports up or across the layers:\n" + "\n".join(sorted(set(bad)))


def test_no_cycle_between_parts():
  graph = {}
  for module, path in MODULES.items():
    src = _part(module)
    for name, _, _ in _imports(path, module):
      dst = _part(name)
      if src and dst and dst != src:
        graph.setdefault(src, set()).add(dst)
  state = {}

  def visit(node, trail):
    if state.get(node) == 1:
      raise AssertionError(f"import cycle: {' -> '.join(trail + [node])}")
    if state.get(node) == 2:
      return
    state[node] = 1
    for nxt in sorted(graph.get(node, ())):
      visit(nxt, trail + [node])
    state[node] = 2

  for node in sorted(graph):
    visit(node, [])


def test_a_job_never_imports_a_job():
  job_modules = {f"bilinear_ir.jobs.{n}" for n in jobs.JOBS}
  bad = []
  for module in job_modules:
    path = MODULES[module]
    for name, _, line in _imports(path, module):
      if name in job_modules and name != module:
        bad.append(f"{os.path.relpath(path, REPO)}:{line}: imports {name}")
  assert not bad, "\n".join(bad)


def test_every_job_module_exists_with_validate_and_run():
  for name in jobs.JOBS:
    module = jobs.get(name)
    assert callable(module.validate) and callable(module.run), name
  assert sorted(jobs.JOBS) == sorted(
      os.path.basename(p)[:-3] for p in glob.glob(os.path.join(PACKAGE, "jobs", "*.py"))
      if os.path.basename(p)[:-3] != "__init__")


# The functions every job defines for itself: its entry points.
JOB_HOOKS = ("validate", "run")
# What a reader sees lives in bilinear_ir/report, never in a job.
REPORT_HOOKS = ("markdown", "findings", "plot", "figures")


def _top_level_functions(path: str) -> dict[str, int]:
  """{name: line} of the functions defined at the top level of one module."""
  tree = ast.parse(open(path, encoding="utf-8").read(), path)
  return {n.name: n.lineno for n in tree.body
          if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_no_job_defines_a_function_another_job_or_a_library_defines():
  """A job holds only what it runs: a top-level function of a job that another job or any
  library module also defines (same name) is a second copy, to be written once below the jobs."""
  job_modules = {m for m in MODULES if _part(m) == "jobs" and m.rsplit(".", 1)[-1] != "jobs"}
  defined = {m: _top_level_functions(p) for m, p in MODULES.items()}
  assert len(job_modules) == len(jobs.JOBS) and defined["bilinear_ir.jobs.study"]
  bad = []
  for module in sorted(job_modules):
    for name, line in defined[module].items():
      others = [m for m, names in defined.items() if m != module and name in names]
      if name not in JOB_HOOKS and others:
        bad.append(f"{os.path.relpath(MODULES[module], REPO)}:{line}: {name} also in {others}")
  assert not bad, "functions defined twice:\n" + "\n".join(bad)


def test_jobs_hold_no_report_code():
  """Markdown, findings and figures are the report layer's: no job defines them or plots."""
  bad = []
  for module, path in MODULES.items():
    if _part(module) != "jobs":
      continue
    for name, line in _top_level_functions(path).items():
      if name in REPORT_HOOKS or "plot" in name:
        bad.append(f"{os.path.relpath(path, REPO)}:{line}: defines {name}")
    for name, _, line in _imports(path, module):
      if name.split(".")[0] == "matplotlib":
        bad.append(f"{os.path.relpath(path, REPO)}:{line}: imports {name}")
  assert not bad, "report code in the jobs:\n" + "\n".join(bad)


def test_no_library_imports_the_experiment_protocol():
  """Only the studies, the report layer, the jobs and main may import `experiment`, and only
  the report layer, the jobs and main may import `studies`; the test above checks the layers,
  this one names the rule: no library below reaches up into the protocol."""
  bad = []
  for module, path in MODULES.items():
    src = _part(module)
    if src in ("jobs", "main", "report", None):
      continue
    for name, _, line in _imports(path, module):
      dst = _part(name)
      if dst == "studies" and src != "studies" or dst == "experiment" and src not in (
          "experiment", "studies"):
        bad.append(f"{os.path.relpath(path, REPO)}:{line}: {name}")
  assert not bad, "libraries importing experiment/ or studies/:\n" + "\n".join(bad)
  assert (LAYER["synthetic"] + 1 == LAYER["experiment"] == LAYER["studies"] - 1
          == LAYER["report"] - 2 == LAYER["jobs"] - 3)


def test_function_local_imports_are_optional_third_party_only():
  bad = []
  for module, path in MODULES.items():
    for name, is_local, line in _imports(path, module):
      if is_local and name.split(".")[0] not in OPTIONAL:
        bad.append(f"{os.path.relpath(path, REPO)}:{line}: {name}")
  assert not bad, "function-local imports of non-optional modules:\n" + "\n".join(sorted(bad))


CONFIGS = sorted(glob.glob(os.path.join(REPO, "configs", "*.py")))


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_config_imports_only_ml_collections_and_the_config_package(path):
  config_modules = {m for m in MODULES if m.split(".")[:2] == ["bilinear_ir", "config"]}
  assert config_modules >= {"bilinear_ir.config.arguments", "bilinear_ir.config.blocks",
                            "bilinear_ir.config.embedding_specs"}
  allowed = {"__future__", "__future__.annotations", "ml_collections", "ml_collections.ConfigDict",
             "ml_collections.config_dict", "bilinear_ir.config", *config_modules}
  names = {n for n, _, _ in _imports(path, "configs.x")}
  assert names <= allowed, f"{os.path.basename(path)} imports {sorted(names - allowed)}"


def test_every_config_loads_without_jax_or_flax():
  """Every config file, and every module of `bilinear_ir.config` they may import, in a fresh
  process: none of them pulls in jax, flax, optax or orbax."""
  config_modules = sorted(m for m in MODULES if m.split(".")[:2] == ["bilinear_ir", "config"])
  code = (
      "import importlib, importlib.util, sys\n"
      f"for name in {config_modules!r}:\n"
      "  importlib.import_module(name)\n"
      f"paths = {CONFIGS!r}\n"
      "for p in paths:\n"
      "  spec = importlib.util.spec_from_file_location('cfg', p)\n"
      "  m = importlib.util.module_from_spec(spec)\n"
      "  spec.loader.exec_module(m)\n"
      "  assert m.get_config(None).job\n"
      "heavy = sorted(x for x in ('jax', 'flax', 'optax', 'orbax', 'jaxlib') if x in sys.modules)\n"
      "print('HEAVY', heavy)\n")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                       check=True)
  assert "HEAVY []" in out.stdout, out.stdout + out.stderr


def test_pylint_import_exceptions_are_optional_third_party_only():
  bad = []
  for path in MODULES.values():
    for i, line in enumerate(open(path, encoding="utf-8"), 1):
      if "g-import-not-at-top" in line:
        stripped = line.strip()
        words = stripped.split()
        target = words[1] if words[0] in ("import", "from") else ""
        if target.split(".")[0] not in OPTIONAL:
          bad.append(f"{os.path.relpath(path, REPO)}:{i}: {stripped}")
  assert not bad, "\n".join(bad)
