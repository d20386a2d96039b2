"""The simulator: the single source of makespans and memory peaks."""

from tfopt.simulate.simulator import Schedule, Transfer, simulate

__all__ = ["Schedule", "Transfer", "simulate"]
