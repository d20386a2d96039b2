"""Timing a callable: the median of repeated wall-clock runs."""

from __future__ import annotations

import statistics
import time
from typing import Callable


def median_us(run: Callable[[], object], repeats: int, *,
              warmup: int = 1) -> float:
  """Median microseconds of `repeats` calls of `run` after `warmup`
  untimed ones (allocations, kernel caches, a rendezvous)."""
  for _ in range(warmup):
    run()
  samples = []
  for _ in range(repeats):
    began = time.perf_counter()
    run()
    samples.append((time.perf_counter() - began) * 1e6)
  return statistics.median(samples)
