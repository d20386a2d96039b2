"""The model of tests/_fit_across_devices_script.py trained through
`tfopt.compile` on server processes under OS memory caps; prints one JSON
line for tests/runtime/test_caps.py. One cluster per process (connecting
a process to a second cluster would invalidate the first).

    python -m tests._capped_servers_script placed|single LIMIT_BYTES
"""

import json
import sys

import keras
import numpy as np

import tfopt
from tfopt.runtime import LoopbackServers
from tfopt.runtime import session as session_module
from tests._fit_across_devices_script import (build, compile_kwargs,
                                              state_bytes)


def main(mode: str, limit: int) -> None:
  rng = np.random.default_rng(0)
  x = rng.standard_normal((128, 1024)).astype(np.float32)
  y = rng.integers(0, 10, 128).astype(np.int32)
  fit = dict(batch_size=32, epochs=2, shuffle=False, verbose=0)
  plain = build()
  plain.compile(**compile_kwargs())
  out = {"plain": plain.fit(x, y, **fit).history["loss"]}
  cap = state_bytes(plain) // 2
  # A task killed at its cap is reported after this deadline.
  session_module.REMOTE_RUN_TIMEOUT_S = 10
  tasks = 4 if mode == "placed" else 1
  with LoopbackServers(tasks, memory_limit_bytes=limit) as servers:
    model = build()
    tfopt.compile(model, placement="auto" if mode == "placed" else "single",
                  devices=servers.device_names, cluster=servers.spec,
                  memory_per_device=cap if mode == "placed" else None,
                  verbose=False, **compile_kwargs())
    servers.reset_peaks()
    try:
      out["placed"] = model.fit(x, y, **fit).history["loss"]
      out["error"] = None
    except RuntimeError as err:
      out["error"] = str(err)
    out["peaks"] = servers.peak_bytes()
    out["exited"] = servers.exited()
    out["oom_kills"] = [cap.oom_kills for cap in servers.caps]
    out["devices"] = sorted({v.value.device for v in model.variables})
    (report,) = (model.train_function.reports.values()
                 if out["error"] is None else (None,))
    out["predicted"] = list(report.peak_bytes) if report else []
  keras.backend.clear_session()
  print(json.dumps(out))


if __name__ == "__main__":
  main(sys.argv[1], int(sys.argv[2]))
