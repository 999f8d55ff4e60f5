"""`load(config.data)`: the collection a `data` config block names, loaded and validated.

One module per layout (`config.data.format`): `scifact` (the SciFact CSV zip; `path` "" is the
copy embedded in the package), `beir` (a BEIR folder), `msmarco` (MS MARCO passage files),
`trec_folder` (TREC Robust04 SGML / CAR paragraphs), `insuranceqa` (InsuranceQA V2 from the
installed package `insuranceqa_data` when `path` is "", or a folder of its four files). Every
problem is an `InputError` naming the file, the line (or zip member) and the field: duplicate doc
or query ids, qrels naming unknown docs or queries, a doc with neither title nor text, broken
JSON lines, non-integer relevance, bytes that are not UTF-8, missing files or columns, a line
longer than `data.max_record_mib`. Nothing is skipped silently.
"""
from __future__ import annotations

import os

from bilinear_ir.data import beir
from bilinear_ir.data import insuranceqa
from bilinear_ir.data import msmarco
from bilinear_ir.data import readers
from bilinear_ir.data import scifact
from bilinear_ir.data import trec_folder
from bilinear_ir.data.collection import Collection
from bilinear_ir import errors
from bilinear_ir.errors import input_error

LOADERS = {"scifact": scifact.load_scifact, "beir": beir.load_beir,
           "msmarco": msmarco.load_msmarco, "trec": trec_folder.load_trec,
           "insuranceqa": insuranceqa.load_insuranceqa}
FORMATS = tuple(LOADERS)
# Formats whose `path` "" reads a copy that is not a file of the config: the one embedded in the
# package (scifact) or an installed data package (insuranceqa). -> the function giving its path.
DEFAULT_PATHS = {"scifact": scifact.embedded_scifact_path,
                 "insuranceqa": insuranceqa.package_path}
# Collections named by their format alone (a study's `collections` entry): read from `path` "".
INSTALLED = ("insuranceqa",)
# Collections shipped in the package (bilinear_ir/data/embedded/, see its SOURCE.txt): name ->
# (format, file). The classic ones are test-only BEIR zips (use query-level folds).
EMBEDDED = {"scifact": ("scifact", "scifact.zip"), "cacm": ("beir", "cacm.zip"),
            "med": ("beir", "med.zip"), "lisa": ("beir", "lisa.zip")}


def embedded(name: str) -> tuple[str, str]:
  """(format, path) of a collection shipped in the package (`EMBEDDED`)."""
  if name not in EMBEDDED:
    raise input_error(f"unknown embedded collection {name!r}; known: {', '.join(EMBEDDED)}",
                      file="config", field="collections")
  fmt, file = EMBEDDED[name]
  return fmt, os.path.join(os.path.dirname(scifact.embedded_scifact_path()), file)


def load(data_config) -> Collection:
  """Loads and validates the collection named by a `data` config block.

  Args:
    data_config: `config.data` (see `config.blocks.data_config`): `format`, `path` ("": the
      copy `DEFAULT_PATHS` names) and `max_record_mib` (the longest line read).

  Returns:
    The `Collection`.

  Raises:
    InputError: unknown format, missing path, or any malformed file or record.
  """
  fmt, path = data_config.format, data_config.path
  if fmt not in LOADERS:
    raise input_error(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}", file="config",
                      field="data.format")
  if not path:
    if fmt not in DEFAULT_PATHS:
      raise input_error(f"format {fmt!r} needs a path (only {', '.join(DEFAULT_PATHS)} read a "
                        "copy of their own)", file="config", field="data.path")
    path = DEFAULT_PATHS[fmt]()
  if not os.path.exists(path):
    raise input_error("no such file or folder", file=path, field="data.path")
  with errors.doing(f"loading the collection {path}"), readers.record_limit(
      data_config.get("max_record_mib", readers.MAX_RECORD_MIB)):
    return LOADERS[fmt](path)
