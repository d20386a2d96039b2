"""m-branch: the parallel branches of a network on different devices.

Greedy list schedulers (m-ETF, m-SCT) decide op by op, and on a training
graph of hundreds of small ops they scatter an optimizer's update math and
gradients across devices, paying a transfer at every hop: on two server
processes a wide two-tower MLP placed by m-ETF simulated (and ran) 3x slower
than one device. What people do by hand for such a model is place whole
branches -- each tower's layers, their gradients, weights, optimizer slots
and updates -- on different devices. m-branch finds that split from the
graph alone:

1. **Branches.** In the forward graph (ops that are neither parameter-like
   nor backward nor downstream of a gradient, see `m_stage`), a fork is an
   op whose dominator-tree children include at least two *branch roots*:
   children whose dominated region is entered from no sibling's region and
   computes something. The region a branch root dominates is the branch (a
   tower, an Inception block's path); the child entered from its siblings is
   the join (a concatenation) and belongs to the trunk. A residual block
   (one path and a skip connection) has one branch root and is not split.
   Forks inside a branch already assigned stay with that branch.
2. **Devices.** At each fork, branches go to the k devices by LPT (heaviest
   forward compute first, to the least loaded device; the first to the
   trunk's device 0, where the fork's input already is). The trunk stays
   on device 0.
3. **The rest follows the data.** Parameter-like ops take the device of
   their forward readers; a colocation group (a variable with its reads and
   updates) the device of its first labelled member; a backward op or an
   optimizer op the device most of the bytes it reads and writes are on
   (its inputs, and its readers already placed, e.g. the update of its
   weight; ties: where the forward tensors and weights it reads are);
   constants that only updates read follow their readers. Repeated to a fixpoint; what is left
   goes to device 0.

Plans on 2 .. D devices are simulated; the fastest within the caps wins
(`InfeasiblePlacement` when the graph has no parallel branches, or no plan
fits).
"""

from __future__ import annotations

import networkx as nx

from tfopt.placement.m_stage import parameter_like
from tfopt.placement.placement import Placement
from tfopt.placement.problem import InfeasiblePlacement, PlacementProblem
from tfopt.simulate.simulator import simulate

_ROOT = "\0root"
# A path lighter than this share of its fork's heaviest branch (a shape
# computation, a bias) stays on the trunk: moving it costs transfers only.
MIN_BRANCH_SHARE = 0.1


def op_classes(problem: PlacementProblem) -> dict[str, str]:
  """Each op's class: "param" (constants, variable handles and what only
  they feed), "forward", "backward", or "update" (downstream of a gradient
  without being flagged backward: an optimizer's math and writes)."""
  graph, order = problem.graph, problem.order
  preds = {n: [e.src for e in graph.in_edges(n) if not e.is_control]
           for n in order}
  params = parameter_like(problem, preds)
  out: dict[str, str] = {}
  for n in order:
    if n in params:
      out[n] = "param"
    elif graph[n].backward:
      out[n] = "backward"
    elif any(out.get(p) in ("backward", "update") for p in preds[n]):
      out[n] = "update"
    else:
      out[n] = "forward"
  return out


def branches(problem: PlacementProblem, classes: dict[str, str]
             ) -> list[list[list[str]]]:
  """The forward graph's forks, outermost first: per fork, its branches'
  forward ops (see module doc, step 1)."""
  graph = problem.graph
  forward = [n for n in problem.order if classes[n] == "forward"]
  fwd = set(forward)
  dag = nx.DiGraph()
  dag.add_node(_ROOT)
  dag.add_nodes_from(forward)
  for n in forward:
    inputs = [e.src for e in graph.in_edges(n)
              if not e.is_control and e.src in fwd]
    dag.add_edges_from((p, n) for p in inputs)
    if not inputs:
      dag.add_edge(_ROOT, n)
  idom = nx.immediate_dominators(dag, _ROOT)
  children: dict[str, list[str]] = {}
  for n in forward:  # topological order: children sorted the same way
    children.setdefault(idom[n], []).append(n)
  enter, leave = _intervals(children)
  compute = [0.0] * (len(enter) + 1)  # prefix sums in Euler order
  by_time = sorted(enter, key=enter.get)
  for i, n in enumerate(by_time):
    compute[i + 1] = compute[i] + (
        0.0 if n == _ROOT else problem.costs[n].compute_us)

  def region_compute(c):
    return compute[leave[c]] - compute[enter[c]]

  forks, taken = [], set()
  for u in [_ROOT] + forward:
    if u in taken or len(children.get(u, ())) < 2:
      continue
    # Only the child itself can be entered from outside its region (it
    # dominates the rest); a join reads a sibling's region, a branch root
    # reads the fork alone.
    roots = [c for c in children[u] if region_compute(c) > 0 and all(
        e.src == u for e in graph.in_edges(c)
        if not e.is_control and e.src in fwd)]
    heaviest = max((region_compute(c) for c in roots), default=0.0)
    roots = [c for c in roots
             if region_compute(c) >= MIN_BRANCH_SHARE * heaviest]
    if len(roots) < 2:
      continue
    fork = [[y for y in by_time[enter[c]:leave[c]]] for c in roots]
    forks.append(fork)
    taken.update(y for branch in fork for y in branch)
  return forks


def _intervals(children) -> tuple[dict[str, int], dict[str, int]]:
  """Euler-tour entry / exit indices of the dominator tree (iterative)."""
  enter, leave, time = {}, {}, 0
  stack = [(_ROOT, False)]
  while stack:
    node, done = stack.pop()
    if done:
      leave[node] = time
      continue
    enter[node] = time
    time += 1
    stack.append((node, True))
    stack.extend((c, False) for c in reversed(children.get(node, ())))
  return enter, leave


def assign(problem: PlacementProblem, forks, k: int) -> dict[str, int]:
  """Forward op -> device: each fork's branches by LPT over k devices."""
  labels: dict[str, int] = {}
  for fork in forks:
    weights = [sum(problem.costs[n].compute_us for n in b) for b in fork]
    loads = [0.0] * k
    for i in sorted(range(len(fork)), key=lambda i: -weights[i]):
      d = min(range(k), key=lambda j: (loads[j], j))
      loads[d] += weights[i]
      for n in fork[i]:
        labels[n] = d
  return labels


def follow_data(problem: PlacementProblem, classes, labels) -> dict[str, int]:
  """Every op's device from the forward labels (module doc, step 3)."""
  graph, order = problem.graph, problem.order
  labels = dict(labels)
  for n in order:
    if classes[n] == "forward":
      labels.setdefault(n, 0)
  anchors = ("forward", "param")
  changed = True
  while changed:
    changed = _label_parameters(problem, classes, labels, anchors)
    changed |= _unify_groups(problem, labels)
    for n in order:  # backward and updates: with the data they move
      if n not in labels:
        changed |= _vote(labels, n, [
            (labels[e.src], e.bytes, classes[e.src] in anchors)
            for e in graph.in_edges(n)
            if not e.is_control and e.src in labels] + [
                (labels[e.dst], e.bytes, False) for e in graph.out_edges(n)
                if not e.is_control and e.dst in labels])
    changed |= _unify_groups(problem, labels)
    # Constants only updates read (an optimizer's betas) follow them.
    changed |= _label_parameters(problem, classes, labels, None)
  return {n: labels.get(n, 0) for n in order}


def _label_parameters(problem: PlacementProblem, classes, labels,
                      readers) -> bool:
  """Parameter-like ops take their labelled readers' device (readers of
  those classes only, unless None); whether any was labelled."""
  changed = False
  for n in reversed(problem.order):
    if n not in labels and classes[n] == "param":
      changed |= _vote(labels, n, [
          (labels[e.dst], e.bytes, True)
          for e in problem.graph.out_edges(n)
          if not e.is_control and e.dst in labels and
          (readers is None or classes[e.dst] in readers)])
  return changed


def _vote(labels, name: str, votes) -> bool:
  """Labels `name` with the device most of the bytes it reads or writes
  are on ((device, bytes, anchored) triples: its labelled inputs, and
  readers already labelled, such as the update of a weight whose group
  sits on its branch); ties go to the device of forward tensors and
  weights it reads (a ReluGrad reads as many bytes of gradient from the
  trunk as of activation from its branch), then the lower device. Whether
  it labelled."""
  if not votes:
    return False
  weight: dict[int, list[int]] = {}
  for d, b, anchored in votes:
    w = weight.setdefault(d, [0, 0])
    w[0] += b
    w[1] += b if anchored else 0
  labels[name] = min(weight, key=lambda d: (-weight[d][0], -weight[d][1], d))
  return True


def _unify_groups(problem: PlacementProblem, labels) -> bool:
  """A colocation group's members all take its first labelled member's
  device (topological order)."""
  changed = False
  for names in problem.members.values():
    if len(names) < 2:
      continue
    first = next((labels[n] for n in names if n in labels), None)
    if first is None:
      continue
    for n in names:
      if labels.get(n) != first:
        labels[n] = first
        changed = True
  return changed


def _plan(problem: PlacementProblem, labels) -> Placement:
  """The labels as a placement; a group that may not use its device (pins,
  device types) goes to the first device it may use."""
  table = {}
  for gid, names in problem.members.items():
    allowed = problem.allowed[gid]
    d = labels[names[0]]
    d = d if d in allowed else allowed[0]
    for n in names:
      table[n] = d
  return Placement(table, problem.num_devices)


def m_branch(problem: PlacementProblem) -> Placement:
  """The fastest feasible branch split on 2 .. D devices (module doc)."""
  classes = op_classes(problem)
  forks = branches(problem, classes)
  if not forks:
    raise InfeasiblePlacement("m-branch found no parallel branches in the "
                              "forward graph.")
  best = None
  for k in range(2, problem.num_devices + 1):
    plan = _plan(problem, follow_data(problem, classes,
                                      assign(problem, forks, k)))
    schedule = simulate(problem.graph, plan, problem.costs, problem.cluster)
    if schedule.feasible and (best is None or
                              schedule.makespan_us < best[1].makespan_us):
      best = (plan, schedule)
  if best is None:
    raise InfeasiblePlacement(
        f"m-branch's splits of {len(forks)} fork(s) on 2 to "
        f"{problem.num_devices} devices are over the memory caps.")
  return best[0]
