"""The simulator: the single source of makespans and memory peaks."""

from tfopt.simulate.simulator import (Schedule, Timing, Transfer, simulate,
                                      simulate_timing)

__all__ = ["Schedule", "Timing", "Transfer", "simulate", "simulate_timing"]
