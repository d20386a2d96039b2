"""What the launcher and its workers agree on: environment variable names,
the control file and the preemption exit code. No TensorFlow here: the
launcher imports only this."""

PREEMPTED_EXIT = 75  # EX_TEMPFAIL, "try again": the launcher restarts
CONTROL = "control.json"  # {"attempt", "stop_at_step", "reason"}

ENV_RUN_DIR = "TFOPT_RUN_DIR"
ENV_WORKER = "TFOPT_WORKER"
ENV_WORKERS = "TFOPT_NUM_WORKERS"
ENV_ATTEMPT = "TFOPT_ATTEMPT"
ENV_TIMEOUT = "TFOPT_COLLECTIVE_TIMEOUT_S"
ENV_HEARTBEAT = "TFOPT_HEARTBEAT_S"
