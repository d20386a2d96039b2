"""Running captured and rewritten steps for real: a Session per step
(session.py), placed steps on logical devices or server processes with
actual-device verification (placed.py, processes.py), OS memory caps and
measured peaks (caps.py, memory.py), tasks of a cluster as devices of this
process (remote.py), a Keras model's variables moved onto planned devices
(variables.py), XLA per device (xla.py), and the simulator's calibration
(calibration.py)."""

from tfopt._lazy import lazy_getattr

_LAZY = {
    "StepSession": "tfopt.runtime.session",
    "session_config": "tfopt.runtime.session",
    "StepRun": "tfopt.runtime.placed",
    "DeviceCheck": "tfopt.runtime.placed",
    "actual_devices": "tfopt.runtime.placed",
    "check_rewritten": "tfopt.runtime.placed",
    "compare_runs": "tfopt.runtime.placed",
    "local_cluster": "tfopt.runtime.placed",
    "run_and_compare": "tfopt.runtime.placed",
    "run_steps": "tfopt.runtime.placed",
    "verify_devices": "tfopt.runtime.placed",
    "LoopbackServers": "tfopt.runtime.processes",
    "MemoryCap": "tfopt.runtime.caps",
    "ProcessPeak": "tfopt.runtime.caps",
    "MeasuredMemory": "tfopt.runtime.memory",
    "measure_peak_bytes": "tfopt.runtime.memory",
    "connect": "tfopt.runtime.remote",
    "move_variables": "tfopt.runtime.variables",
    "XlaReport": "tfopt.runtime.xla",
    "compile_step": "tfopt.runtime.xla",
    "mark_for_xla": "tfopt.runtime.xla",
    "Calibration": "tfopt.runtime.calibration",
    "calibrate": "tfopt.runtime.calibration",
}

__getattr__ = lazy_getattr("tfopt.runtime", _LAZY)

__all__ = sorted(_LAZY)
