"""Running captured steps for real (see session.py)."""

from tfopt.runtime.session import StepSession

__all__ = ["StepSession"]
