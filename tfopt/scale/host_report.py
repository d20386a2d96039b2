"""A launched job's report per host (MegaScale's per-machine view).

`host_report(record, finals)` groups an attempt's workers by the host
they ran on (`record["addresses"]`, one per worker, as `tfopt.scale.launch`
records them) and gives each host:

- `workers`: the worker indices on it;
- `mfu`: its workers' MFU pooled (`pooled_mfu`: achieved
  FLOP/s over the peak of the cores or devices they have together), from
  the `"mfu"` entry each worker wrote into its final record (None when the
  job wrote none);
- `stragglers` / `compute_stragglers`: the workers on it that the chief's
  `StragglerMonitor` named late before their steps (host side: input,
  Python) or late inside them (compute), from the chief's final record;
- `link` and `network_straggler`: the host's measured link rates after
  the attempt and whether they are far below the other hosts'
  (`tfopt.scale.network`);
- `slow_during`: the periods of the attempt in which its link was found
  far slower than the others' while training (`NetworkWatch`'s `slow`
  entries: from / to step, the rates measured then).

`job_mfu(finals)` pools every worker. `host_lines(...)` is the text the
launcher's summary prints; on one host it is the job's MFU line alone.
"""

from __future__ import annotations

import glob
import json
import os
import re


def pooled_mfu(workers) -> dict | None:
  """The MFU of several workers together (one host's, or the job's), from
  their `MFUMonitor.summary()` dicts: the FLOP/s they achieve summed, over
  the peak they have together. Workers with a CPU peak count each core
  (host name, core) once, at their peak per core: two workers of one
  host on the same cores share that host's peak, as processes of one
  machine in different network namespaces do. None without workers.

  >>> a = {"flops_per_step": 2e9, "step_s": 0.1, "peak_flops": 40e9,
  ...      "cores": [["m", 0], ["m", 1]]}
  >>> b = dict(a, step_s=0.2)
  >>> round(pooled_mfu([a, b])["mfu"], 4)  # (20 + 10) / 40 GFLOP/s
  0.75
  >>> round(pooled_mfu([a, dict(b, cores=[["n", 0], ["n", 1]])])["mfu"], 4)
  0.375
  """
  workers = [w for w in workers if w]
  if not workers:
    return None
  achieved = sum(w["flops_per_step"] / w["step_s"] for w in workers)
  peak, seen = 0.0, set()
  for w in workers:
    cores = w.get("cores")
    if not cores:  # a device of its own (GPU) or a stated figure
      peak += w["peak_flops"]
      continue
    fresh = [tuple(c) for c in cores if tuple(c) not in seen]
    seen.update(fresh)
    peak += w["peak_flops"] * len(fresh) / len(cores)
  return {"mfu": achieved / peak, "achieved_flops": achieved,
          "peak_flops": peak, "workers": len(workers),
          "step_s": max(w["step_s"] for w in workers)}


def read_finals(run_dir: str) -> dict:
  """worker -> its `final-worker-<i>.json` record (the ones that parse)."""
  finals = {}
  paths = glob.glob(os.path.join(run_dir, "final-worker-*.json"))
  for path in sorted(paths, key=lambda p: int(re.findall(r"\d+", p)[-1])):
    try:
      with open(path, encoding="utf-8") as f:
        final = json.load(f)
    except (OSError, ValueError):
      continue  # cut by a kill: the summary says what it has
    if isinstance(final, dict):
      finals[final.get("worker", int(re.findall(r"\d+", path)[-1]))] = final
  return finals


def job_mfu(finals: dict) -> dict | None:
  """Every worker's MFU pooled; None when no worker wrote one."""
  return pooled_mfu([f.get("mfu") for f in finals.values()])


def host_report(record: dict, finals: dict) -> list[dict]:
  """Per host of the attempt `record` (hosts in the order of their first
  worker), see the module doc. Empty for an attempt on fewer than two
  hosts."""
  addresses = record.get("addresses") or []
  if len(set(addresses)) < 2:
    return []
  verdict = next((f["stragglers"] for f in finals.values()
                  if isinstance(f.get("stragglers"), dict)), {})
  links = {link["address"]: link for link in record.get("links") or ()
           if link is not None}
  slow = set(record.get("network_stragglers") or ())
  during = (record.get("network_watch") or {}).get("slow") or ()
  report = []
  for address in dict.fromkeys(addresses):
    workers = [w for w, a in enumerate(addresses) if a == address]
    report.append({
        "address": address, "workers": workers,
        "mfu": pooled_mfu([finals.get(w, {}).get("mfu") for w in workers]),
        "stragglers": [w for w in verdict.get("host_side") or ()
                       if w in workers],
        "compute_stragglers": [w for w in verdict.get("compute") or ()
                               if w in workers],
        "link": links.get(address),
        "network_straggler": address in slow,
        "slow_during": [p for p in during if p["address"] == address]})
  return report


def host_lines(record: dict, finals: dict) -> list[str]:
  """The summary's lines: one per host (`host_report`), then the job's
  MFU; on one host only the job's MFU (when the workers wrote theirs)."""
  lines = [_host_line(host) for host in host_report(record, finals)]
  job = job_mfu(finals)
  if job is not None:
    lines.append(f"MFU (job): {_mfu_text(job)}")
  return lines


def _host_line(host: dict) -> str:
  workers = ",".join(str(w) for w in host["workers"])
  parts = []
  if host["mfu"] is not None:
    parts.append(f"MFU {_mfu_text(host['mfu'])}")
  link = host["link"]
  if link is not None and "error" in link:
    parts.append(f"link not measured ({link['error']})")
  elif link is not None:
    parts.append(f"link {link['down_bits'] / 1e6:.1f} Mbit/s in, "
                 f"{link['up_bits'] / 1e6:.1f} Mbit/s out")
  for key, what in (("compute_stragglers", "compute straggler"),
                    ("stragglers", "host-side straggler")):
    if host[key]:
      parts.append(f"{what}: worker "
                   f"{','.join(str(w) for w in host[key])}")
  parts.extend(_slow_text(period) for period in host.get("slow_during")
               or ())
  if host["network_straggler"]:
    parts.append("NETWORK STRAGGLER (its link far slower than the other "
                 "hosts')")
  text = f"host {host['address']} (workers {workers})"
  return text + (": " + "; ".join(parts) if parts else "")


def _slow_text(period: dict) -> str:
  until = ("not measured back before the attempt ended"
           if period["to_step"] is None else f"to step {period['to_step']}")
  return (f"NETWORK STRAGGLER from step {period['from_step']} {until} "
          f"(its link {period['down_bits'] / 1e6:.1f} Mbit/s in, "
          f"{period['up_bits'] / 1e6:.1f} Mbit/s out then)")


def slow_lines(record: dict) -> list[str]:
  """An attempt's slow periods (its `network_watch`), one line each:
  "host ADDRESS: NETWORK STRAGGLER from step A to step B (...)"; for the
  attempts before the last, whose hosts the summary does not list."""
  periods = (record.get("network_watch") or {}).get("slow") or ()
  return [f"host {period['address']}: {_slow_text(period)}"
          for period in periods]


def _mfu_text(pooled: dict) -> str:
  """'1.23 % of 166 GFLOP/s peak (2 workers)' (three significant digits:
  a small model's MFU on a CPU is a fraction of a per cent)."""
  return (f"{100 * pooled['mfu']:.3g} % of "
          f"{pooled['peak_flops'] / 1e9:.0f} GFLOP/s peak "
          f"({pooled['workers']} worker{'s' if pooled['workers'] > 1 else ''})")
