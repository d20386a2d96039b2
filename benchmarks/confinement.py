"""What confining the server tasks to the job's network namespace costs.

    python -m benchmarks.confinement

1. Transfer: one TCP peer inside a job namespace (`tfopt.runtime.netns`);
   a 1 KiB ping-pong (round trip) and a 64 MiB stream (throughput) from
   outside through the relay, against the same from a thread inside the
   namespace (directly), alternated round by round; minimums compared.
2. Placed training: an MLP placed by `tfopt.compile(placement="auto")` on
   2 `LoopbackServers` tasks under a memory cap that splits it across
   both, its step time confined (the default as root) against exposed
   (the servers on every interface, what `allow_exposed=True` gives where
   no namespace can be made: simulated here by refusing the namespace in
   that process). Each run is a fresh process, alternating the modes;
   per process the step is the median of `--rounds` (long fit - short fit)
   differences; the table compares the fastest process of each mode. The
   confined rows also count the connections this process holds through
   the relay (the rest of its traffic runs on connections TensorFlow made
   inside the namespace).

Writes benchmarks/results/confinement.json.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_integer("rounds", 7, "Transfer rounds, and timing rounds per "
                     "training process.")
flags.DEFINE_integer("repeats", 2, "Fresh training processes per mode, "
                     "alternating the modes.")
flags.DEFINE_string("out", os.path.join(os.path.dirname(__file__), "results",
                                        "confinement.json"), "Results JSON.")
flags.DEFINE_string("one", None, "Internal: one training run (confined or "
                    "exposed) here, printed as JSON.")
PING_BYTES, PINGS = 1024, 200
STREAM_BYTES = 64 << 20
BATCH, SHORT, LONG = 64, 4, 16


def _peer(listener: socket.socket) -> None:
  """Echoes 'p'-sessions, swallows 's'-sessions and acks their end."""
  def serve(conn):
    with conn:
      kind = conn.recv(1)
      if kind == b"p":
        while True:
          data = conn.recv(PING_BYTES, socket.MSG_WAITALL)
          if not data:
            return
          conn.sendall(data)
      while conn.recv(1 << 20):
        pass
      conn.sendall(b"k")
  while True:
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    threading.Thread(target=serve, args=(conn,), daemon=True).start()


def _ping_us(port: int) -> float:
  with socket.create_connection(("127.0.0.1", port)) as s:
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(b"p")
    payload = b"x" * PING_BYTES
    t0 = time.perf_counter()
    for _ in range(PINGS):
      s.sendall(payload)
      s.recv(PING_BYTES, socket.MSG_WAITALL)
    return (time.perf_counter() - t0) / PINGS * 1e6


def _stream_mb_s(port: int) -> float:
  chunk = b"x" * (1 << 20)
  with socket.create_connection(("127.0.0.1", port)) as s:
    s.sendall(b"s")
    t0 = time.perf_counter()
    for _ in range(STREAM_BYTES // len(chunk)):
      s.sendall(chunk)
    s.shutdown(socket.SHUT_WR)
    s.recv(1)
    return STREAM_BYTES / (time.perf_counter() - t0) / 1e6


def transfer(rounds: int) -> dict:
  from tfopt.runtime import netns  # pylint: disable=g-import-not-at-top
  job = netns.job_namespace()
  (port,) = job.reserve_ports(1)

  def listen():
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    s.listen(16)
    threading.Thread(target=_peer, args=(s,), daemon=True).start()
  job.run_inside(listen)
  found = {"relay": {"ping_us": [], "stream_mb_s": []},
           "direct": {"ping_us": [], "stream_mb_s": []}}
  for _ in range(rounds):
    for path, run in (("relay", lambda f: f(port)),
                      ("direct", lambda f: job.run_inside(f, port))):
      found[path]["ping_us"].append(run(_ping_us))
      found[path]["stream_mb_s"].append(run(_stream_mb_s))
  best = {path: {"ping_us": min(v["ping_us"]),
                 "stream_mb_s": max(v["stream_mb_s"])}
          for path, v in found.items()}
  return {"rounds": found, "best": best,
          "ping_ratio": best["relay"]["ping_us"] / best["direct"]["ping_us"],
          "stream_ratio": (best["relay"]["stream_mb_s"] /
                           best["direct"]["stream_mb_s"])}


def _relayed_connections(relay_pid: int) -> int:
  """Connections the relay holds in this process's namespace."""
  established = set()
  for table in ("tcp", "tcp6"):
    with open(f"/proc/self/net/{table}", encoding="ascii") as f:
      established |= {cols[9] for cols in map(str.split, f.readlines()[1:])
                      if cols[3] == "01"}
  mine = set()
  for fd in os.listdir(f"/proc/{relay_pid}/fd"):
    try:
      link = os.readlink(f"/proc/{relay_pid}/fd/{fd}")
    except OSError:
      continue
    if link.startswith("socket:["):
      mine.add(link[8:-1])
  return len(mine & established) // 2  # each relayed one: two ends here


def train(mode: str, rounds: int) -> dict:
  import keras  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tfopt  # pylint: disable=g-import-not-at-top
  from tfopt import zoo  # pylint: disable=g-import-not-at-top
  from tfopt.runtime import LoopbackServers, netns  # pylint: disable=g-import-not-at-top
  if mode == "exposed":
    def refuse():
      raise OSError("simulated: no namespace (allow_exposed=True)")
    netns.job_namespace = refuse
  keras.utils.set_random_seed(0)
  model = zoo.mlp(input_dim=512, hidden=(1024,) * 4).model
  state = sum(int(np.prod(w.shape)) * 4 for w in model.weights) * 3
  rng = np.random.default_rng(0)
  x = rng.standard_normal((BATCH * LONG, 512)).astype(np.float32)
  y = rng.integers(0, 10, BATCH * LONG)
  with LoopbackServers(2, allow_exposed=mode == "exposed") as servers:
    tfopt.compile(model, optimizer="adam", verbose=False,
                  loss=keras.losses.SparseCategoricalCrossentropy(
                      from_logits=True),
                  placement="auto", devices=servers.device_names,
                  cluster=servers.spec, memory_per_device=state)
    model.fit(x[:BATCH * 2], y[:BATCH * 2], batch_size=BATCH, verbose=0)
    (report,) = model.train_function.reports.values()

    def fit_s(steps):
      t0 = time.perf_counter()
      model.fit(x[:BATCH * steps], y[:BATCH * steps], batch_size=BATCH,
                shuffle=False, verbose=0)
      return time.perf_counter() - t0
    per_step = []
    for _ in range(rounds):
      short, long = fit_s(SHORT), fit_s(LONG)
      per_step.append((long - short) / (LONG - SHORT) * 1e3)
    relayed = (_relayed_connections(servers.namespace.relay_pid)
               if servers.confined else None)
    return {"mode": mode, "confined": servers.confined,
            "devices_used": len(report.devices_used),
            "step_ms": statistics.median(per_step), "per_step_ms": per_step,
            "relayed_connections": relayed}


def _one_process(mode: str) -> dict:
  done = subprocess.run(
      [sys.executable, "-m", "benchmarks.confinement", f"--one={mode}",
       f"--rounds={FLAGS.rounds}"], capture_output=True, text=True,
      check=False, timeout=900,
      cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  if done.returncode:
    raise RuntimeError(f"{mode} run failed: {done.stderr[-3000:]}")
  return json.loads(next(line[4:] for line in done.stdout.splitlines()
                         if line.startswith("ROW ")))


def main(argv):
  del argv
  if FLAGS.one:
    row = train(FLAGS.one, FLAGS.rounds)
    print("ROW " + json.dumps(row), flush=True)
    sys.stdout.flush()
    os._exit(0)  # pylint: disable=protected-access
  from tfopt._io import atomic_write_text  # pylint: disable=g-import-not-at-top
  import keras  # pylint: disable=g-import-not-at-top
  doc = {"benchmark": "confinement", "cpu_count": os.cpu_count()}
  doc["transfer"] = transfer(FLAGS.rounds)
  best = doc["transfer"]["best"]
  print(f"{'1 KiB round trip':18s} relay {best['relay']['ping_us']:8.1f} us"
        f"  direct {best['direct']['ping_us']:8.1f} us  ratio "
        f"{doc['transfer']['ping_ratio']:.2f}")
  print(f"{'64 MiB stream':18s} relay {best['relay']['stream_mb_s']:8.0f} "
        f"MB/s direct {best['direct']['stream_mb_s']:8.0f} MB/s ratio "
        f"{doc['transfer']['stream_ratio']:.2f}")
  runs = {"confined": [], "exposed": []}
  jobs = [mode for _ in range(FLAGS.repeats) for mode in runs]
  bar = keras.utils.Progbar(len(jobs), unit_name="process")
  for k, mode in enumerate(jobs):
    row = _one_process(mode)
    bar.update(k + 1)
    runs[mode].append(row)
    print(f"placed MLP {mode:8s} step {row['step_ms']:7.2f} ms  devices "
          f"{row['devices_used']}  relayed connections "
          f"{row['relayed_connections']}", flush=True)
  fastest = {mode: min(r["step_ms"] for r in rows)
             for mode, rows in runs.items()}
  doc["training"] = {"runs": runs, "fastest_step_ms": fastest,
                     "ratio": fastest["confined"] / fastest["exposed"],
                     "batch_size": BATCH, "steps": [SHORT, LONG],
                     "rounds": FLAGS.rounds}
  print(f"placed MLP fastest step: confined {fastest['confined']:.2f} ms, "
        f"exposed {fastest['exposed']:.2f} ms, ratio "
        f"{doc['training']['ratio']:.2f}")
  atomic_write_text(FLAGS.out, json.dumps(doc, indent=1) + "\n",
                    overwrite=True)
  print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
  app.run(main)
