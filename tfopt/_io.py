"""Atomic file output: a file appears whole or not at all, never overwritten
unless the caller asked for it."""

from __future__ import annotations

import os
import tempfile

from tfopt._errors import invalid_argument


def atomic_write_text(path: str | os.PathLike, text: str, *,
                      overwrite: bool = False) -> None:
  """Writes `text` to `path` through a temporary file and a rename.

  Raises FileExistsError if `path` exists and `overwrite` is False, and
  ValueError if its directory does not exist.
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
  try:
    with os.fdopen(fd, "w", encoding="utf-8") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise
