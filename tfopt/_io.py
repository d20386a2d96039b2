"""Atomic file output: a file appears whole or not at all, never overwritten
unless the caller asked for it."""

from __future__ import annotations

import os
import tempfile
from typing import Callable

from tfopt._errors import invalid_argument


def _default_mode() -> int:
  # mkstemp creates 0600 files; give the result the mode open() would have.
  umask = os.umask(0)
  os.umask(umask)
  return 0o666 & ~umask


def atomic_write(path: str | os.PathLike, write: Callable[[str], None], *,
                 overwrite: bool = False) -> None:
  """Calls `write(tmp_path)` and renames the result over `path`.

  Raises FileExistsError if `path` exists and `overwrite` is False, and
  ValueError if its directory does not exist. On any error nothing is left
  behind.
  """
  path = os.fspath(path)
  directory = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(directory):
    raise invalid_argument("path", "in an existing directory", path)
  if os.path.exists(path) and not overwrite:
    raise FileExistsError(
        f"Argument `path` names a file that exists; pass overwrite=True to "
        f"replace it. Received: path={path!r}")
  fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=os.path.basename(path),
                             dir=directory)
  os.close(fd)
  try:
    write(tmp)
    os.chmod(tmp, _default_mode())
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.unlink(tmp)


def atomic_write_text(path: str | os.PathLike, text: str, *,
                      overwrite: bool = False) -> None:
  """Writes `text` (UTF-8) to `path` atomically; see `atomic_write`."""

  def write(tmp: str) -> None:
    with open(tmp, "w", encoding="utf-8") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())

  atomic_write(path, write, overwrite=overwrite)
