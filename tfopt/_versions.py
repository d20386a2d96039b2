"""The import-time check that the installed TensorFlow and Keras are ones
tfopt supports, read from the installed distributions' metadata (without
importing TensorFlow, which tfopt loads lazily).

tfopt declares no TensorFlow requirement of its own (the user chooses the
build: `tfopt[cpu]`, `tfopt[gpu]`, or one already installed), so this check
is what stands between an unsupported version and an AttributeError from
deep inside. `TFOPT_SKIP_VERSION_CHECK=1` skips it (nightlies, forks).
"""

from __future__ import annotations

import importlib.metadata
import os
import re

TENSORFLOW_RANGE = ((2, 18), (2, 21))  # inclusive minor versions
KERAS_MIN = (3, 10)                    # keras.optimizers.Muon
KERAS_MAJOR = 3
# The distributions that install the `tensorflow` package.
TENSORFLOW_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu",
                            "tensorflow-intel", "tensorflow-macos",
                            "tensorflow-aarch64", "tf-nightly",
                            "tf-nightly-cpu")


def _release(version: str) -> tuple[int, ...]:
  """(major, minor, ...) of a version string; unparseable parts stop it."""
  parts = []
  for piece in version.split("."):
    match = re.match(r"\d+", piece)
    if not match:
      break
    parts.append(int(match.group()))
  return tuple(parts)


def _installed(name: str) -> str | None:
  try:
    return importlib.metadata.version(name)
  except importlib.metadata.PackageNotFoundError:
    return None


def supported_message(tensorflow: str | None, keras: str | None) -> str | None:
  """Why these versions cannot run tfopt, or None when they can.

  >>> supported_message("2.21.0", "3.15.1") is None
  True
  >>> print(supported_message("2.15.1", "2.15.0"))  # doctest: +ELLIPSIS
  tfopt needs TensorFlow 2.18-2.21 with Keras >= 3.10 (< 4); found TensorFlow 2.15.1, Keras 2.15.0. ...
  """
  (lo_major, lo_minor), (hi_major, hi_minor) = TENSORFLOW_RANGE
  tf_ok = tensorflow is not None and (
      (lo_major, lo_minor) <= _release(tensorflow)[:2] <= (hi_major, hi_minor))
  keras_ok = keras is not None and (
      KERAS_MIN <= _release(keras)[:2] and _release(keras)[0] == KERAS_MAJOR)
  if tf_ok and keras_ok:
    return None
  found = (f"TensorFlow {tensorflow or 'not installed'}, "
           f"Keras {keras or 'not installed'}")
  return (f"tfopt needs TensorFlow {lo_major}.{lo_minor}-{hi_major}.{hi_minor} "
          f"with Keras >= {KERAS_MIN[0]}.{KERAS_MIN[1]} (< {KERAS_MAJOR + 1}); "
          f"found {found}. Install a supported build: pip install "
          f"'tfopt[cpu]' (tensorflow-cpu) or 'tfopt[gpu]' "
          f"(tensorflow[and-cuda]), or set TFOPT_SKIP_VERSION_CHECK=1 to try "
          f"anyway.")


def installed_versions() -> tuple[str | None, str | None]:
  """(TensorFlow's version, Keras' version) as installed, None if absent."""
  tensorflow = next((v for v in map(_installed, TENSORFLOW_DISTRIBUTIONS)
                     if v is not None), None)
  return tensorflow, _installed("keras")


def check_versions() -> None:
  """Raises ImportError naming the versions found and the supported ranges
  when they do not fit (see `supported_message`)."""
  if os.environ.get("TFOPT_SKIP_VERSION_CHECK", "") not in ("", "0"):
    return
  message = supported_message(*installed_versions())
  if message:
    raise ImportError(message)
