"""Timing a callable (the median of repeated wall-clock runs), and the
length of a set of time intervals."""

from __future__ import annotations

import statistics
import time
from typing import Callable, Iterable


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


def union_us(intervals: Iterable[tuple[float, float]]) -> float:
  """The time covered by (start, end) intervals, overlaps counted once:
  how long a device had something running.

  >>> union_us([(0.0, 4.0), (2.0, 6.0), (8.0, 9.0)])
  7.0
  """
  total, reach = 0.0, float("-inf")
  for begin, end in sorted(intervals):
    if end > reach:
      total += end - max(begin, reach)
      reach = end
  return total
