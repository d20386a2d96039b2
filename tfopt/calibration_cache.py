"""This machine's calibrations, measured once and kept (`calibration="auto"`).

`tfopt.compile(...)` (by default) and `cached_calibration` give the
placer's simulator this machine's link and core sharing without a
`tfopt-calibrate` run by hand: the first call for a kind and count of
devices measures them (`tfopt.runtime.calibrate.fit_cluster`, seconds) and
keeps the result in a cache; later calls, in this process or the next,
read it. A cached file is measured again when it no longer fits: made on
another machine or TensorFlow version (`tfopt.calibration.check_here`),
stale (`STALE_AFTER_DAYS`), or unreadable.

It is tfopt.compile's default: `calibration="default"` is "auto" unless
`$TFOPT_CALIBRATION=none` (`default_mode`); `calibration=None` is Baechi's
PCIe-like model, uncalibrated.

Cache directory: the `directory` argument, else `$TFOPT_CACHE_DIR`, else
`$XDG_CACHE_HOME/tfopt`, else `~/.cache/tfopt`. One file per host, machine
fingerprint, TensorFlow version, device kind and count
(`calibration-<kind>x<n>-<host>-<hash>-tf<version>.json`), written
atomically (processes calibrating at once each write a whole file; the
last one stays). `tfopt-calibrate` remains the way to measure with more
repeats and keep the file where you choose.

Only devices this process can calibrate without starting anything of the
user's are calibrated automatically: logical CPU devices of this process
("logical"). For server tasks the report says they are not calibrated and
how to calibrate them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import platform
import re
from typing import Callable

from tfopt._errors import check_positive_int, invalid_argument
from tfopt.calibration import (KINDS, Calibration, CalibrationError,
                               load_calibration, machine_fingerprint)

ENV_DIR = "TFOPT_CACHE_DIR"
# tfopt.compile's default calibration ("default"): this variable's value,
# "auto" when unset.
ENV_DEFAULT = "TFOPT_CALIBRATION"
DEFAULT_MODES = ("auto", "none")


def default_mode() -> str:
  """What `tfopt.compile(calibration="default")` means here: "auto" (this
  machine's cached calibration) unless `$TFOPT_CALIBRATION` says "none"
  (Baechi's PCIe-like model: plans that do not depend on this machine's
  measured speed, e.g. in a test suite)."""
  value = os.environ.get(ENV_DEFAULT, "").strip().lower() or "auto"
  if value not in DEFAULT_MODES:
    raise ValueError(
        f"Environment variable `{ENV_DEFAULT}` must be one of "
        f"{list(DEFAULT_MODES)} (tfopt.compile's default calibration) or "
        f"unset. Received: {ENV_DEFAULT}={os.environ[ENV_DEFAULT]!r}")
  return value


def cache_directory(directory: str | os.PathLike | None = None
                    ) -> pathlib.Path:
  """Where calibrations are kept (module doc)."""
  if directory is not None:
    return pathlib.Path(directory)
  if os.environ.get(ENV_DIR):
    return pathlib.Path(os.environ[ENV_DIR])
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
      os.path.expanduser("~"), ".cache")
  return pathlib.Path(base) / "tfopt"


def cache_path(kind: str, num_devices: int,
               directory: str | os.PathLike | None = None) -> pathlib.Path:
  """The file of this host's calibration of `num_devices` of `kind`."""
  if kind not in KINDS:
    raise invalid_argument("kind", f"one of {list(KINDS)}", kind)
  check_positive_int("num_devices", num_devices)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  machine = hashlib.sha256(json.dumps(machine_fingerprint(), sort_keys=True)
                           .encode()).hexdigest()[:10]
  host = re.sub(r"[^A-Za-z0-9.-]", "_", platform.node() or "host")
  return cache_directory(directory) / (
      f"calibration-{kind}x{num_devices}-{host}-{machine}-"
      f"tf{tf.__version__}.json")


def cached_calibration(kind: str, num_devices: int, *,
                       directory: str | os.PathLike | None = None,
                       measure: Callable[..., Calibration] | None = None
                       ) -> Calibration:
  """This machine's calibration of `num_devices` devices of `kind`: from
  the cache when a fitting one is there, else measured now and kept.

  `measure(kind, num_devices)` measures (default: `fit_cluster` without a
  progress bar). The result's `path` is its cache file.
  """
  path = cache_path(kind, num_devices, directory)
  if path.is_file():
    try:
      kept = load_calibration(path)
    except (CalibrationError, OSError):
      kept = None  # another machine or TF, or a broken file: measure again
    if kept is not None and not kept.stale and kept.kind == kind and \
        kept.num_devices == num_devices:
      return kept
  if measure is None:
    from tfopt.runtime.calibrate import fit_cluster  # pylint: disable=g-import-not-at-top
    measure = lambda k, n: fit_cluster(k, n, progress=False)  # noqa: E731
  fresh = measure(kind, num_devices)
  path.parent.mkdir(parents=True, exist_ok=True)
  fresh.save(path, overwrite=True)
  return dataclasses.replace(fresh, path=str(path))


def auto_calibration(devices, *, directory: str | os.PathLike | None = None,
                     measure: Callable[..., Calibration] | None = None
                     ) -> Calibration | None:
  """`calibration="auto"` for `devices` (TF device strings): the cached
  "logical" calibration when they are two or more CPU devices of this
  process; None otherwise (nothing here to calibrate without the user's
  servers, or one device: no link)."""
  from tfopt.runtime.remote import in_process_cpus  # pylint: disable=g-import-not-at-top
  names = list(devices)
  if not in_process_cpus(names) or len(names) < 2:
    return None
  return cached_calibration("logical", len(names), directory=directory,
                            measure=measure)
