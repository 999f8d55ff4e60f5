"""File helpers shared by every stage: atomic writes, hashing, streamed and safe zip members, safe
`.npy` I/O.

Every file the project writes goes through `atomic_write*` (temp file in the same folder, then
`os.replace`), so an interrupted or failed job never leaves a half-written result.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno as errno_lib
import hashlib
import json
import os
import posixpath
import re
import shutil
import tempfile
import zipfile
import zlib
from typing import IO, Any, Iterator

import jax
import numpy as np

from bilinear_ir.errors import WriteError
from bilinear_ir.errors import input_error

# OS errors that say the machine refused a write (not a bug of the project): full disk, quota,
# read-only file system, permissions, a file too large, an I/O error, too many open files.
REFUSED_WRITE = frozenset({errno_lib.ENOSPC, errno_lib.EDQUOT, errno_lib.EROFS, errno_lib.EACCES,
                           errno_lib.EPERM, errno_lib.EFBIG, errno_lib.EIO, errno_lib.EMFILE,
                           errno_lib.ENFILE})
# How libraries in other languages pass the errno on: tensorstore (orbax's array writer)
# "RESOURCE_EXHAUSTED: ... [os_error_code='28']", Rust's std::io::Error (safetensors)
# "I/O error: No space left on device (os error 28)".
_FOREIGN_ERRNO = re.compile(r"\[os_error_code='(\d+)'\]|\(os error (\d+)\)")


def refused_errno(error: BaseException) -> int | None:
  """The errno of a refused write (one of `REFUSED_WRITE`) behind `error`, or None.

  Looks through the chain of causes and contexts, exception groups, and the messages of
  tensorstore (orbax's writer threads) and of Rust libraries (safetensors).
  """
  todo, seen = [error], set()
  while todo:
    e = todo.pop()
    if e is None or id(e) in seen:
      continue
    seen.add(id(e))
    if isinstance(e, WriteError):
      return e.errno
    if isinstance(e, OSError) and e.errno in REFUSED_WRITE:
      return e.errno
    match = None if isinstance(e, OSError) else _FOREIGN_ERRNO.search(str(e))
    if match and int(match.group(1) or match.group(2)) in REFUSED_WRITE:
      return int(match.group(1) or match.group(2))
    todo.extend([e.__cause__, e.__context__, *getattr(e, "exceptions", ())])
  return None


def injected_fault(path: str) -> None:
  """Test hook: with `BILINEAR_IR_FAULT=ENOSPC:FOLDER` set (any errno name), a write under
  FOLDER fails as the machine would fail it. The fault tests use it only where no small or
  read-only file system can be mounted."""
  spec = os.environ.get("BILINEAR_IR_FAULT")
  if not spec:
    return
  name, _, folder = spec.partition(":")
  if os.path.abspath(path).startswith(os.path.join(os.path.abspath(folder), "")):
    code = getattr(errno_lib, name)
    raise OSError(code, os.strerror(code), path)


def write_error(path: str, error: BaseException) -> WriteError | None:
  """A `WriteError` naming `path` when `error` is a refused write, else None (a bug: re-raise)."""
  code = refused_errno(error)
  return None if code is None else WriteError(code, path)


@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
  """Yields a temporary path next to `path`; renames it onto `path` if the block succeeds.

  Use for writers that need a file name (matplotlib, np.save, faiss). On error the temporary file
  is removed and `path` is left untouched; a refused write (full disk, read-only folder, ...)
  raises `WriteError` naming `path`.
  """
  folder = os.path.dirname(os.path.abspath(path))
  tmp = None
  try:
    injected_fault(path)
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=os.path.splitext(path)[1], dir=folder)
    os.close(fd)
    yield tmp
    os.replace(tmp, path)
  except BaseException as e:
    if tmp is not None:
      with contextlib.suppress(FileNotFoundError):
        os.remove(tmp)
    refused = write_error(path, e)
    if refused is None:
      raise
    raise refused from None


_RENAME_EXCHANGE = 2  # renameat2's flag (Linux >= 3.15): swap two paths in one step
_AT_FDCWD = -100


def _exchange(a: str, b: str) -> bool:
  """Swaps the folders `a` and `b` atomically (Linux `renameat2(RENAME_EXCHANGE)`); False where
  the system or file system does not offer it."""
  renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
  if renameat2 is None:
    return False
  if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
    return True
  code = ctypes.get_errno()
  if code in (errno_lib.EINVAL, errno_lib.ENOSYS, errno_lib.ENOTSUP):
    return False
  raise OSError(code, os.strerror(code), b)


@contextlib.contextmanager
def atomic_dir(path: str) -> Iterator[str]:
  """Yields a temporary folder next to `path`; if the block succeeds it replaces `path`, else it
  is removed. Readers never see a half-written folder, and `path` never goes missing: the new
  folder is swapped into place in one step (`renameat2(RENAME_EXCHANGE)`; where the system lacks
  it, the old folder is first renamed aside) and the old one is removed after it. A refused write
  (full disk, read-only folder, ...) raises `WriteError` naming `path`."""
  path = os.path.abspath(path)
  parent = os.path.dirname(path)
  tmp = None
  try:
    injected_fault(path)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-", dir=parent)
    yield tmp
    old = None
    if not os.path.exists(path):
      os.replace(tmp, path)
    elif _exchange(tmp, path):
      old = tmp  # the old folder, swapped out
    else:
      old = tempfile.mkdtemp(prefix=".old-", dir=parent)
      os.replace(path, os.path.join(old, "old"))
      os.replace(tmp, path)
    tmp = None
    if old is not None:  # removed only once the new folder is in place
      shutil.rmtree(old, ignore_errors=True)
  except BaseException as e:
    if tmp is not None:
      shutil.rmtree(tmp, ignore_errors=True)
    refused = write_error(path, e)
    if refused is None:
      raise
    raise refused from None


def check_writable_dir(path: str, field: str = "workdir") -> None:
  """Raises `InputError` unless `path` is, or can be created as, a folder this process can write.

  Nothing is left behind: the nearest existing folder on the path gets a probe file that is
  removed at once, and no folder is created.
  """
  path = os.path.abspath(path)
  probe = path
  while not os.path.exists(probe):
    probe = os.path.dirname(probe)
  if not os.path.isdir(probe):
    raise input_error(f"{probe} is not a folder, so {path} cannot be created", file=field)
  try:
    fd, tmp = tempfile.mkstemp(prefix=".probe-", dir=probe)
    os.close(fd)
    os.remove(tmp)
  except OSError as e:
    what = "written" if probe == path else f"created (cannot write in {probe})"
    raise input_error(f"{path} cannot be {what}: {e.strerror or e}", file=field) from None


def atomic_write_bytes(path: str, data: bytes) -> None:
  """Writes `data` to `path` atomically."""
  with atomic_path(path) as tmp:
    with open(tmp, "wb") as f:
      f.write(data)


def atomic_write_text(path: str, text: str) -> None:
  """Writes UTF-8 `text` to `path` atomically."""
  atomic_write_bytes(path, text.encode("utf-8"))


def to_jsonable(obj: Any) -> Any:
  """Converts numpy/jax scalars and arrays (recursively) to plain Python for `json`."""
  if isinstance(obj, dict):
    return {str(k): to_jsonable(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [to_jsonable(v) for v in obj]
  if isinstance(obj, (np.generic,)):
    return obj.item()
  if hasattr(obj, "__array__") and not isinstance(obj, (str, bytes)):
    return to_jsonable(np.asarray(obj).tolist())
  return obj


def atomic_write_json(path: str, obj: Any) -> None:
  """Writes `obj` as indented JSON to `path` atomically (numpy values converted)."""
  atomic_write_text(path, json.dumps(to_jsonable(obj), indent=2, sort_keys=False) + "\n")


def atomic_save_npy(path: str, array: np.ndarray) -> None:
  """Saves one array as `.npy` atomically (no pickle: object arrays are refused)."""
  array = np.asarray(array)
  if array.dtype == object:
    raise ValueError(f"{path}: refusing to save an object array")
  with atomic_path(path) as tmp:
    with open(tmp, "wb") as f:
      # Through `write` in chunks: numpy writes a real file with `tofile`, whose error on a full
      # disk has lost its errno ("problem writing element 1024 to file").
      np.save(_Writes(f), array, allow_pickle=False)


class _Writes:
  """Only the `write` of a file (so numpy writes through it)."""

  def __init__(self, f):
    self.write = f.write


def load_npy(path: str, mmap: bool = False) -> np.ndarray:
  """Loads a `.npy` file without pickle; `mmap=True` memory-maps it read-only."""
  try:
    return np.load(path, allow_pickle=False, mmap_mode="r" if mmap else None)
  except (ValueError, OSError) as e:
    raise input_error(f"cannot read as a plain .npy array ({e})", file=path) from e


def sha256_bytes(data: bytes) -> str:
  """Hex SHA-256 of `data`."""
  return hashlib.sha256(data).hexdigest()


def file_sha256(path: str) -> str:
  """SHA-256 of a file's bytes, read in 1 MiB blocks."""
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def read_json(path: str) -> Any:
  """The JSON value in a UTF-8 file; a missing, undecodable or malformed file is an `InputError`
  naming it."""
  try:
    with open(path, "rb") as f:
      data = f.read()
  except OSError as e:
    raise input_error(f"cannot read ({e.strerror or e})", file=path) from None
  try:
    return json.loads(decode_utf8(data, path))
  except ValueError as e:
    raise input_error(f"not valid JSON ({e})", file=path) from None


def sha256_texts(texts: list[str]) -> str:
  """Hex SHA-256 of a list of strings (length-prefixed, so boundaries count)."""
  h = hashlib.sha256()
  for t in texts:
    b = t.encode("utf-8")
    h.update(len(b).to_bytes(8, "little"))
    h.update(b)
  return h.hexdigest()


def tree_sha256(tree: Any) -> str:
  """SHA-256 of a pytree of arrays (params, embeddings, encoder weights): every leaf's path,
  dtype, shape and bytes (C order), in sorted path order; `{}` hashes too. (The byte format keys
  the embedding caches and doc indexes: do not change it.)"""
  h = hashlib.sha256()
  leaves = jax.tree_util.tree_leaves_with_path(tree)
  for path, leaf in sorted(leaves, key=lambda pl: jax.tree_util.keystr(pl[0])):
    a = np.ascontiguousarray(np.asarray(leaf))
    h.update(f"{jax.tree_util.keystr(path)}|{a.dtype.str}|{a.shape}".encode())
    h.update(a.reshape(-1).view(np.uint8))
  return h.hexdigest()


def safe_member_name(zip_path: str, name: str) -> str:
  """Returns the normalised member name, or raises if it could escape its folder.

  Refuses absolute paths, drive letters, backslashes and `..` components.
  """
  norm = posixpath.normpath(name)
  if (name.startswith("/") or "\\" in name or (len(name) > 1 and name[1] == ":")
      or norm == ".." or norm.startswith("../") or "/../" in f"/{name}/"):
    raise input_error("member path escapes the archive folder", file=zip_path,
                      record=f"member {name!r}", field="name")
  return norm


def zip_names(zip_path: str) -> list[str]:
  """The regular-file members of a zip, each name checked against path traversal
  (`safe_member_name`); the archive's directory only is read, no member's data."""
  try:
    with zipfile.ZipFile(zip_path) as zf:
      return [safe_member_name(zip_path, info.filename) for info in zf.infolist()
              if not info.is_dir()]
  except zipfile.BadZipFile as e:
    raise input_error(f"not a valid zip file ({e})", file=zip_path) from e


@contextlib.contextmanager
def open_zip_member(zip_path: str, name: str) -> Iterator[IO[bytes]]:
  """Yields member `name` of a zip as a binary stream, inflated as it is read (never whole: a
  member that inflates to more than memory holds is read as any file is); a corrupt archive is
  an `InputError` naming the member."""
  try:
    with zipfile.ZipFile(zip_path) as zf, zf.open(name) as f:
      yield f
  except (zipfile.BadZipFile, zlib.error, EOFError) as e:
    raise input_error(f"corrupt zip member ({e})", file=zip_path,
                      record=f"member {name!r}") from e


def read_zip_member(zip_path: str, name: str, limit: int) -> bytes:
  """The bytes of member `name`, streamed; more than `limit` bytes is an `InputError` (the
  member is never inflated beyond it)."""
  with open_zip_member(zip_path, name) as f:
    data = f.read(limit + 1)
  if len(data) > limit:
    raise input_error(f"member larger than {limit >> 20} MiB (data.max_record_mib)",
                      file=zip_path, record=f"member {name!r}")
  return data


def decode_utf8(data: bytes, file: str, record: object = None) -> str:
  """Decodes UTF-8 (BOM allowed) or raises an `InputError` naming the byte offset."""
  try:
    return data.decode("utf-8-sig")
  except UnicodeDecodeError as e:
    raise input_error(f"undecodable bytes at offset {e.start} (not UTF-8)", file=file,
                      record=record) from e


