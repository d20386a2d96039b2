"""A TensorFlow-free stand-in for a launched worker (fast launcher tests).

    python fake_worker.py MODE [STEPS]

Writes heartbeats like `tfopt.scale.worker.fit` (through HeartbeatWriter)
and "trains" STEPS steps of 20 ms. MODE: ok; import_error (fails before
any step); exit3 (exits with 3 after step 5); stall (stops stepping after
step 5, keeps beating: alive but stuck); port (prints TensorFlow's bind
error and exits 1 after step 1); oom (prints TensorFlow's OOM error and
exits 1 at step 3); slow_epoch_end (after step 10 of the first attempt: a
validation pass of 3 s, then a checkpoint of 3 s, beating those phases);
hung_validation (after step 10 of the first attempt: "validation" that
never ends); slow_first_step (every attempt's first step takes 3 s, as
tracing and compiling a real step does); task_lost (after step 5 of the
first attempt: says a server task died and exits TASK_LOST_EXIT, as
`worker.fit(servers=...)` does). Every mode exits 75 on SIGTERM (a
preemption).
"""

import os
import signal
import sys
import time


def main(mode: str, steps: int) -> int:
  if mode == "import_error":
    raise ImportError("No module named 'not_a_module'")
  from tfopt.scale import heartbeat, protocol  # pylint: disable=import-outside-toplevel
  run_dir = os.environ[protocol.ENV_RUN_DIR]
  worker = int(os.environ[protocol.ENV_WORKER])
  attempt = int(os.environ[protocol.ENV_ATTEMPT])
  beat = heartbeat.HeartbeatWriter(os.path.join(run_dir, "heartbeats"),
                                   worker, interval_s=0.1,
                                   attempt=attempt).start()
  if mode == "slow_first_step":
    beat.resumed_from = beat.step = 0  # as worker.fit: the resume point
  terminated = []
  signal.signal(signal.SIGTERM, lambda *_: terminated.append(1))
  for step in range(1, steps + 1):
    beat.begin_step()
    time.sleep(3.0 if mode == "slow_first_step" and step == 1 else 0.02)
    beat.end_step(step)
    protocol.raise_fault_if_asked(step)
    if terminated:
      beat.stop()
      return protocol.PREEMPTED_EXIT
    if mode == "exit3" and step == 5:
      # A worker that crashes after training a while has beaten since its
      # first step; these steps are shorter than the beat interval, and
      # under load the launcher saw no step before the exit and (rightly)
      # called it a start-up crash. Beat, and let the launcher read it.
      beat.write()
      time.sleep(0.5)
      return 3
    if mode == "task_lost" and step == 5 and attempt == 0:
      beat.write()
      print("tfopt: server task worker:2 killed by signal 9 during "
            "training; its variables are gone", file=sys.stderr, flush=True)
      return protocol.TASK_LOST_EXIT
    if mode == "oom" and step == 3:
      print("tensorflow.python.framework.errors_impl.ResourceExhaustedError:"
            " OOM when allocating tensor with shape[65536,65536]")
      return 1
    if mode == "port" and step == 1:
      print("E0000 grpc_server_lib: Address already in use")
      return 1
    if mode == "stall" and step == 5 and attempt == 0:
      while True:
        time.sleep(1)
    if mode in ("slow_epoch_end", "hung_validation") and step == 10 and \
        attempt == 0:
      beat.set_phase("validation")
      while mode == "hung_validation":
        time.sleep(1)
      time.sleep(3.0)
      beat.set_phase("checkpoint")
      time.sleep(3.0)
      beat.set_phase("host")
  beat.stop()
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 30))
