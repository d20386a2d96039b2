"""Where a worker sits in its job: from the launcher, TF_CONFIG or SLURM.

A worker started by `tfopt.scale.launch` finds its place in the `TFOPT_*`
variables the launcher sets. On a real cluster no tfopt launcher runs: the
cluster manager starts one process per task and tells each where it sits
in its own way, and the same training script has to read it:

- **TF_CONFIG** (Kubernetes' TFJob, Vertex AI, hand-written):
  `{"cluster": {"chief": [...], "worker": [...]}, "task": {"type": ...,
  "index": ...}}`. The chief (where there is one) is worker 0, worker i
  then worker i + 1: the order MultiWorkerMirroredStrategy ranks them in.
  Only chief and worker tasks train data-parallel; a "ps" or "evaluator"
  task is refused with the reason.
- **SLURM** (a job step started by `srun`): SLURM_PROCID,
  SLURM_STEP_NUM_TASKS, SLURM_STEP_NODELIST and SLURM_STEP_TASKS_PER_NODE.
  A process of the batch script itself (no step variables: `python
  train.py` in an sbatch script, not under srun) is one process alone, not
  rank 0 of a job that would wait for peers never started. The spec is
  built here rather than by TensorFlow's SlurmClusterResolver, which on
  nodes without GPUs finds no task (it pairs tasks with GPUs, and calls
  nvidia-smi to count them), orders the nodes by sorted name (node10
  before node9, not SLURM's order) and ignores SLURM_DISTRIBUTION: here
  the nodes keep SLURM's order, the ranks go to them as the distribution
  says (block, the default, or cyclic), each task listens at `port_base` +
  its local index on its node, and the result is checked against this
  task's own SLURM_NODEID and SLURM_LOCALID. SLURM_RESTART_COUNT (a
  requeued job) is the attempt. GPUs are left as SLURM set them
  (CUDA_VISIBLE_DEVICES under --gpus-per-task).

`place_from_environ(environ)` returns the `Place`; `TFOPT_RUN_DIR` (a
directory every task can write: a shared filesystem), `TFOPT_ATTEMPT` and
`TFOPT_SLURM_PORT_BASE` may be set beside either. No TensorFlow here.
"""

from __future__ import annotations

import dataclasses
import json
import re

from tfopt.scale.protocol import (ENV_ATTEMPT, ENV_RUN_DIR, ENV_WORKER,
                                  ENV_WORKERS)

ENV_SLURM_PORT_BASE = "TFOPT_SLURM_PORT_BASE"
DEFAULT_SLURM_PORT_BASE = 8888  # TensorFlow's SlurmClusterResolver's
TRAINING_TASKS = ("chief", "worker")


@dataclasses.dataclass(frozen=True)
class Place:
  """This process's place: `worker` of `workers` (0 is the chief),
  `attempt`, `run_dir`, `source` ("launcher", "tf_config", "slurm" or
  "single"), and under SLURM the `cluster` spec ({"worker": ["host:port",
  ...]}) this process builds its strategy from (None otherwise: the
  strategy reads TF_CONFIG itself)."""
  worker: int = 0
  workers: int = 1
  attempt: int = 0
  run_dir: str | None = None
  source: str = "single"
  cluster: dict | None = None


def place_from_environ(environ) -> Place:
  """The place the launcher, TF_CONFIG or SLURM gives, in that order of
  precedence (the launcher writes TF_CONFIG too); one process alone
  without any of them. Raises ValueError naming the variable whose value
  cannot be used."""
  run_dir = environ.get(ENV_RUN_DIR) or None
  attempt = _int_var(environ, ENV_ATTEMPT, 0)
  if ENV_WORKER in environ:
    return Place(worker=_int_var(environ, ENV_WORKER, 0),
                 workers=_int_var(environ, ENV_WORKERS, 1), attempt=attempt,
                 run_dir=run_dir, source="launcher")
  rank = tf_config_rank(environ["TF_CONFIG"]) if environ.get(
      "TF_CONFIG") else None
  if rank is not None:
    return Place(worker=rank[0], workers=rank[1], attempt=attempt,
                 run_dir=run_dir, source="tf_config")
  if "SLURM_PROCID" in environ and "SLURM_STEP_NUM_TASKS" in environ:
    port_base = _int_var(environ, ENV_SLURM_PORT_BASE,
                         DEFAULT_SLURM_PORT_BASE)
    cluster, rank = slurm_cluster(environ, port_base)
    restarts = _int_var(environ, "SLURM_RESTART_COUNT", 0)
    return Place(worker=rank, workers=len(cluster["worker"]),
                 attempt=attempt if ENV_ATTEMPT in environ else restarts,
                 run_dir=run_dir, source="slurm", cluster=cluster)
  return Place(attempt=attempt, run_dir=run_dir)


def tf_config_rank(text: str) -> tuple[int, int] | None:
  """(this task's rank among the training tasks, their count) from a
  TF_CONFIG JSON string: the chief first, then the workers in order. None
  where it names no task (a cluster alone, as a client placing ops on
  server tasks reads it: this process is none of them)."""
  try:
    config = json.loads(text)
    if "task" not in config:
      return None
    cluster, task = config["cluster"], config["task"]
    kind, index = task["type"], int(task["index"])
  except (ValueError, TypeError, KeyError) as err:
    raise ValueError(f"Environment variable `TF_CONFIG` must be JSON with "
                     f"'cluster' and 'task' ({{'type', 'index'}}); {err!r}. "
                     f"Received: TF_CONFIG={text[:200]!r}") from None
  others = sorted(set(cluster) - set(TRAINING_TASKS))
  if kind not in TRAINING_TASKS or others:
    raise ValueError(
        f"Environment variable `TF_CONFIG` must describe data-parallel "
        f"training (only {' and '.join(TRAINING_TASKS)} tasks: "
        f"tfopt.scale.worker trains with MultiWorkerMirroredStrategy; "
        f"ParameterServerStrategy jobs use tfopt.scale.ps). Received: task "
        f"type {kind!r} in a cluster of {sorted(cluster)}")
  chiefs = len(cluster.get("chief", []))
  workers = chiefs + len(cluster.get("worker", []))
  rank = index if kind == "chief" else chiefs + index
  if not 0 <= rank < workers or (kind == "chief" and index >= chiefs):
    raise ValueError(f"Environment variable `TF_CONFIG` must name a task of "
                     f"its cluster. Received: task {kind}:{index} in "
                     f"{ {k: len(v) for k, v in cluster.items()} }")
  return rank, workers


def slurm_cluster(environ, port_base: int = DEFAULT_SLURM_PORT_BASE
                  ) -> tuple[dict, int]:
  """({"worker": ["node:port", ...]} in rank order, this task's rank) from
  SLURM's variables (see the module doc)."""
  rank = _int_var(environ, "SLURM_PROCID", 0)
  nodes = expand_hostlist(_step_var(environ, "SLURM_STEP_NODELIST"),
                          "SLURM_STEP_NODELIST")
  per_node = expand_tasks_per_node(
      _step_var(environ, "SLURM_STEP_TASKS_PER_NODE"),
      "SLURM_STEP_TASKS_PER_NODE")
  ntasks = _int_var(environ, "SLURM_STEP_NUM_TASKS", 0)
  if len(per_node) != len(nodes) or sum(per_node) != ntasks:
    raise ValueError(
        f"Environment variables SLURM_STEP_NODELIST, "
        f"SLURM_STEP_TASKS_PER_NODE and SLURM_STEP_NUM_TASKS must agree. "
        f"Received: {len(nodes)} nodes {nodes[:8]}, tasks per node "
        f"{per_node[:8]} (sum {sum(per_node)}), SLURM_STEP_NUM_TASKS="
        f"{ntasks}")
  text = environ.get("SLURM_DISTRIBUTION", "block")
  slots = _assign(per_node, text)  # rank -> (node, local index)
  if not 0 <= rank < ntasks:
    raise ValueError(f"Environment variable `SLURM_PROCID` must be in [0, "
                     f"{ntasks}). Received: SLURM_PROCID={rank}")
  node, local = slots[rank]
  for var, expected in (("SLURM_NODEID", node), ("SLURM_LOCALID", local)):
    if var in environ and _int_var(environ, var, 0) != expected:
      raise ValueError(
          f"Environment variable `{var}` must be {expected} for task {rank} "
          f"under SLURM_DISTRIBUTION={text!r} over {nodes[:8]} (else give "
          f"the cluster spec through TF_CONFIG). Received: "
          f"{var}={environ[var]}")
  spec = [f"{nodes[n]}:{port_base + i}" for n, i in slots]
  return {"worker": spec}, rank


def _assign(per_node: list[int], text: str) -> list[tuple[int, int]]:
  """(node, local index) of each rank under SLURM_DISTRIBUTION `text`:
  its node part (before ':' and ','; ",Pack" and ",NoPack" change how
  tasks fill nodes whose counts SLURM already gave)."""
  distribution = text.split(":")[0].split(",")[0]
  if distribution in ("block", "*", ""):
    return [(n, i) for n, count in enumerate(per_node) for i in range(count)]
  if distribution == "cyclic":
    slots, placed = [], [0] * len(per_node)
    while len(slots) < sum(per_node):
      for n, count in enumerate(per_node):
        if placed[n] < count:
          slots.append((n, placed[n]))
          placed[n] += 1
    return slots
  raise ValueError(f"Environment variable `SLURM_DISTRIBUTION` must start "
                   f"with block or cyclic (other distributions cannot be "
                   f"derived here: give the cluster spec through TF_CONFIG "
                   f"instead). Received: SLURM_DISTRIBUTION={text}")


_GROUP = re.compile(r"([^,\[]+)(?:\[([^\]]+)\])?([^,\[]*)(?:,|$)")


def expand_hostlist(text: str, name: str = "SLURM_STEP_NODELIST"
                    ) -> list[str]:
  """SLURM's compressed node list, in its order:
  "node[09-11,20],gpu1" -> node09, node10, node11, node20, gpu1 (zero
  padding kept; one bracket group per name)."""
  hosts, at = [], 0
  text = text.strip()
  while at < len(text):
    match = _GROUP.match(text, at)
    if not match or match.end() == at:
      raise ValueError(f"Environment variable `{name}` must be node names "
                       f"with optional [a-b,c] ranges, one group per name. "
                       f"Received: {name}={text!r}")
    prefix, ranges, suffix = match.groups()
    if ranges is None:
      hosts.append(prefix + suffix)
    else:
      for part in ranges.split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
          raise ValueError(f"Environment variable `{name}` must have "
                           f"numeric ranges, not [{ranges}]. Received: "
                           f"{name}={text!r}")
        for number in range(int(low), int(high or low) + 1):
          hosts.append(f"{prefix}{number:0{len(low)}d}{suffix}")
    at = match.end()
  return hosts


def expand_tasks_per_node(text: str,
                          name: str = "SLURM_STEP_TASKS_PER_NODE"
                          ) -> list[int]:
  """SLURM's tasks per node: "2(x3),1" -> [2, 2, 2, 1]."""
  counts = []
  for part in text.split(","):
    match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
    if not match:
      raise ValueError(f"Environment variable `{name}` must look like "
                       f"'2(x3),1'. Received: {name}={text!r}")
    counts += [int(match.group(1))] * int(match.group(2) or 1)
  return counts


def _step_var(environ, name: str) -> str:
  if environ.get(name):
    return environ[name]
  raise ValueError(f"Environment variable `{name}` must be set in a SLURM "
                   f"job step (srun sets it with SLURM_STEP_NUM_TASKS). "
                   f"Received: {name}={environ.get(name)!r}")


def _int_var(environ, name: str, default: int) -> int:
  text = environ.get(name)
  if text in (None, ""):
    return default
  try:
    return int(text)
  except ValueError:
    raise ValueError(f"Environment variable `{name}` must be an integer. "
                     f"Received: {name}={text!r}") from None
