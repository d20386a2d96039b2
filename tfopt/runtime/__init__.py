"""Running captured and rewritten steps for real: a Session per step
(session.py), placed steps on logical devices or server processes with
actual-device verification (placed.py, processes.py), OS memory caps and
measured peaks (caps.py, memory.py), tasks of a cluster as devices of this
process (remote.py), the job's private network namespace its server
tasks run in (netns.py, relay.py), a Keras model's variables moved onto planned devices
(variables.py), XLA per device (xla.py), the simulator's prediction against
the clock (prediction.py), what a placed step really did op by op
(timeline.py), the fit of a cluster's link and core sharing
(calibrate.py; saved by tfopt.calibration), and the captured step imported
into a tf.function as tfopt.compile's hook runs it (imported.py)."""

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
    "Prediction": "tfopt.runtime.prediction",
    "check_prediction": "tfopt.runtime.prediction",
    "calibrate_devices": "tfopt.runtime.calibrate",
    "fit_cluster": "tfopt.runtime.calibrate",
    "MeasuredStep": "tfopt.runtime.timeline",
    "TimelineComparison": "tfopt.runtime.timeline",
    "compare_timeline": "tfopt.runtime.timeline",
    "measure_timeline": "tfopt.runtime.timeline",
    "read_timeline": "tfopt.runtime.timeline",
    "pinned_cpus": "tfopt.runtime.processes",
    "JobNamespace": "tfopt.runtime.netns",
    "job_namespace": "tfopt.runtime.netns",
}

__getattr__ = lazy_getattr("tfopt.runtime", _LAZY)

__all__ = sorted(_LAZY)
