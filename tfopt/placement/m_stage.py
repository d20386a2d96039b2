"""m-stage: a training graph cut into contiguous layer stages, one per
device, each plan checked by the simulator's liveness peak.

Parameter-heavy training steps defeat the static placers: an optimizer's
update of a weight matrix makes a dozen temporaries of the matrix's size,
which static accounting holds for the whole step (a 12.6 M-parameter MLP
"needs" 1 GB statically while its liveness peak is 285 MB on one device),
and a topological order interleaves the forward pass of every layer before
any backward op, so a contiguous split of it separates each weight from its
gradient and update. Model parallelism by layers is what people do by hand:
layer i's forward ops, its gradients, its weights, optimizer slots and
update on one device. m-stage finds that split from the graph alone:

1. **Positions.** Each op gets a position along the network's depth. A
   forward op: its depth (longest path from a source among forward ops).
   A backward op (`Op.backward`): its depth in the backward pass, mirrored
   onto the forward span (the gradient of layer i sits where layer i
   sits). Ops downstream of gradients that are not flagged backward (an
   optimizer's update math) take the position of the gradients they read;
   parameter-like sources and everything fed only by them (constants,
   variable handles and reads) take the lowest position of their
   consumers.
2. **Blocks.** A colocation group (a variable with its readers and
   updaters) is one unit at its members' lowest position; every other op
   is a unit alone. Units at one position form a block (a layer).
3. **Stages.** Blocks sorted by position are cut into `k` contiguous stages
   of about equal weight, for k = 1 .. D devices and for three weights:
   persistent bytes (where parameter memory dominates), static memory, and
   compute time. Every cut is simulated; the fastest whose liveness peak
   fits every cap wins, with the fewest stages that fit (more stages of a
   chain add transfers, not parallelism). When stages are over their caps,
   the cut points of the stage furthest over are moved by one block at a
   time toward a neighbour, while that lowers the excess, before the cut is
   given up.

The plans are feasible by the simulator's liveness model, not by static
accounting (like m-topo-live). Graphs without backward ops are cut along
their forward depth, which is a pipeline split.
"""

from __future__ import annotations

import bisect

from tfopt.placement.placement import Placement
from tfopt.placement.problem import InfeasiblePlacement, PlacementProblem
from tfopt.simulate.simulator import simulate

# Sources that hold parameters or constants (profiling gives them a few
# microseconds, so "no compute" alone does not find them).
_PARAMETER_SOURCES = frozenset({"Const", "HostConst", "VarHandleOp",
                                "VariableV2"})
# Cut-point repair rounds per cut before it is given up.
REPAIR_ROUNDS = 24


def positions(problem: PlacementProblem) -> dict[str, float]:
  """Each op's position along the network's depth (see module doc)."""
  graph, order = problem.graph, problem.order
  preds = {n: [e.src for e in graph.in_edges(n) if not e.is_control]
           for n in order}
  succs = {n: [e.dst for e in graph.out_edges(n) if not e.is_control]
           for n in order}
  params = parameter_like(problem, preds)
  backward = {n for n in order if graph[n].backward and n not in params}
  after_grad = set(backward)
  for n in order:
    if n not in params and any(p in after_grad for p in preds[n]):
      after_grad.add(n)
  pos: dict[str, float] = {}
  for n in order:  # forward ops: their depth
    if n not in params and n not in after_grad:
      pos[n] = 1.0 + max((pos[p] for p in preds[n] if p in pos), default=0.0)
  for n in reversed(order):  # weights: where the forward pass reads them
    if n in params:
      _take(pos, n, [pos[c] for c in succs[n] if c in pos])
  anchored = params | {m for names in problem.members.values()
                       if len(names) > 1 for m in names}
  changed = True
  while changed:
    changed = _join_groups(problem, pos)
    for n in order:  # an op reading a placed weight goes with it
      if n not in pos:
        changed |= _take(pos, n, [pos[p] for p in preds[n]
                                  if p in anchored and p in pos])
    for n in reversed(order):  # else with what it feeds
      if n not in pos:
        changed |= _take(pos, n, [pos[c] for c in succs[n] if c in pos])
  _mirror_rest(problem, pos, preds, backward)
  return pos


def parameter_like(problem: PlacementProblem, preds) -> set[str]:
  """Constants and variable handles (sources of those types, or sources
  without compute that are not fed) and what only they feed (variable
  reads, casts of weights)."""
  params = set()
  for n in problem.order:
    if preds[n]:
      if all(p in params for p in preds[n]):
        params.add(n)
    elif problem.graph[n].type in _PARAMETER_SOURCES or (
        problem.graph[n].type != "Placeholder" and
        problem.costs[n].compute_us <= 0):
      params.add(n)
  return params


def _take(pos, name: str, values) -> bool:
  """Sets pos[name] to the lowest of `values`; whether it did."""
  if not values:
    return False
  pos[name] = min(values)
  return True


def _join_groups(problem: PlacementProblem, pos) -> bool:
  """Every member of a colocation group at the group's lowest position."""
  changed = False
  for names in problem.members.values():
    if len(names) < 2:
      continue
    placed = [pos[m] for m in names if m in pos]
    if placed:
      low = min(placed)
      for m in names:
        if pos.get(m) != low:
          pos[m] = low
          changed = True
  return changed


def _mirror_rest(problem: PlacementProblem, pos, preds, backward) -> None:
  """Ops still without a position: backward ones mirrored onto the forward
  span by their depth in the backward pass, the rest after their inputs."""
  span = max(pos.values(), default=1.0)
  depth: dict[str, float] = {}
  for n in problem.order:
    if n in backward:
      depth[n] = 1.0 + max((depth[p] for p in preds[n] if p in depth),
                           default=0.0)
  deepest = max(depth.values(), default=1.0)
  for n in problem.order:
    if n in pos:
      continue
    if n in depth:
      pos[n] = span * (1.0 - (depth[n] - 1.0) / max(deepest, 1.0))
    else:
      pos[n] = max((pos[p] for p in preds[n] if p in pos), default=0.0)


def layer_blocks(problem: PlacementProblem) -> list[list[str]]:
  """The graph's layers: lists of group ids, sorted by position (steps 1
  and 2 of the module doc)."""
  return _blocks(problem, positions(problem))


def _blocks(problem: PlacementProblem, pos) -> list[list[str]]:
  """Units (group ids) with one position form a block, sorted by position;
  stages are cut between blocks only (a layer is never split)."""
  at: dict[float, list[tuple[int, str]]] = {}
  for gid, names in problem.members.items():
    low = min(pos[n] for n in names)
    at.setdefault(low, []).append((min(problem.rank[n] for n in names), gid))
  return [[gid for _, gid in sorted(at[p])] for p in sorted(at)]


def block_weights(problem: PlacementProblem,
                  blocks) -> dict[str, list[float]]:
  """Each block's persistent bytes, static bytes and compute."""
  persistent, static, compute = [], [], []
  for gids in blocks:
    names = [n for gid in gids for n in problem.members[gid]]
    persistent.append(float(sum(problem.costs[n].persistent_bytes
                                for n in names)))
    static.append(float(sum(problem.group_memory[gid] for gid in gids)))
    compute.append(float(sum(problem.costs[n].compute_us for n in names)))
  return {"persistent": persistent, "static": static, "compute": compute}


def even_cuts(weights: list[float], k: int) -> list[int]:
  """k - 1 cut indices splitting `weights` into k runs of about equal sum
  (each cut at the block boundary nearest its share)."""
  prefix = [0.0]
  for w in weights:
    prefix.append(prefix[-1] + w)
  total = prefix[-1]
  if total <= 0:
    return [len(weights) * j // k for j in range(1, k)]
  cuts = []
  for j in range(1, k):
    target = total * j / k
    cut = bisect.bisect_left(prefix, target)
    if cut > 0 and target - prefix[cut - 1] < prefix[min(cut, len(weights))] \
        - target:
      cut -= 1
    low = cuts[-1] if cuts else 0
    cuts.append(min(max(cut, low), len(weights)))
  return cuts


def stage_bounds(cuts, count: int) -> list[tuple[int, int]]:
  """Each stage's [begin, end) block range for the cut indices `cuts`
  over `count` blocks (stage s holds blocks begin..end-1)."""
  bounds = [0] + list(cuts) + [count]
  return list(zip(bounds[:-1], bounds[1:]))


def _plan(problem: PlacementProblem, blocks, cuts, devices) -> Placement:
  """The placement of stage s on devices[s]; a unit that may not go to
  its stage's device (pins, device types) goes to the first device it
  may use (the simulator then judges the plan)."""
  table = {}
  for s, (begin, end) in enumerate(stage_bounds(cuts, len(blocks))):
    for gid in (g for block in blocks[begin:end] for g in block):
      allowed = problem.allowed[gid]
      d = devices[s] if devices[s] in allowed else allowed[0]
      for n in problem.members[gid]:
        table[n] = d
  return Placement(table, problem.num_devices)


def _excess(schedule) -> tuple[float, float]:
  """(largest, total) bytes over cap across the devices."""
  over = [p - c for p, c in zip(schedule.peak_bytes, schedule.memory_caps)
          if c is not None and p > c]
  return (max(over, default=0.0), sum(over))


def _repair(problem: PlacementProblem, blocks, cuts, devices):
  """Moves cut points, one block at a time, from the stage furthest over
  its cap toward its lighter neighbour while that lowers the excess;
  (plan, schedule) once nothing is over, else None."""
  cuts = list(cuts)

  def run(c):
    plan = _plan(problem, blocks, c, devices)
    return plan, simulate(problem.graph, plan, problem.costs, problem.cluster)

  current = run(cuts)
  for _ in range(REPAIR_ROUNDS):
    _, schedule = current
    if not schedule.memory_exceeded:
      return current
    peaks = schedule.peak_bytes
    caps = schedule.memory_caps
    stage = max(range(len(devices)), key=lambda s: peaks[devices[s]] -
                (caps[devices[s]] or 0))
    options = []
    begin, end = stage_bounds(cuts, len(blocks))[stage]
    if stage + 1 < len(devices) and end - begin > 1:
      moved = list(cuts)
      moved[stage] -= 1  # its last block to the next stage
      options.append(moved)
    if stage > 0 and end - begin > 1:
      moved = list(cuts)
      moved[stage - 1] += 1  # its first block to the previous stage
      options.append(moved)
    tried = [(run(c), c) for c in options]
    if not tried:
      return None
    result, chosen = min(tried, key=lambda rc: _excess(rc[0][1]))
    if _excess(result[1]) >= _excess(schedule):
      return None
    current, cuts = result, chosen
  return None if current[1].memory_exceeded else current


def m_stage(problem: PlacementProblem) -> Placement:
  """The fastest feasible stage cut (see module doc); raises
  InfeasiblePlacement when no cut fits."""
  blocks = layer_blocks(problem)
  weights = block_weights(problem, blocks)
  best = None
  tried = set()
  for k in range(1, problem.num_devices + 1):
    devices = list(range(k))
    for weight in ("persistent", "static", "compute"):
      cuts = tuple(even_cuts(weights[weight], k))
      if cuts in tried:
        continue
      tried.add(cuts)
      found = _repair(problem, blocks, cuts, devices)
      if found is not None and (best is None or
                                found[1].makespan_us < best[1].makespan_us):
        best = found
    if best is not None:
      break  # the fewest stages that fit: more only add transfers
  if best is None:
    raise InfeasiblePlacement(
        f"m-stage found no cut of the {len(blocks)} blocks into contiguous "
        f"stages on up to {problem.num_devices} devices whose liveness peaks "
        f"fit the caps.")
  return best[0]
