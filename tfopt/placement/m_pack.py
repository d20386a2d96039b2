"""m-pack: memory first, for caps near the live-memory bound.

At tight caps the constructive placers dead-end: m-TOPO and m-ETF account
memory statically (every output held all step) and run out of room long
before the liveness peak does; m-stage's contiguous cuts cannot balance a
few large layers; the group-level local search (`refine`) started from one
device needs thousands of single-op moves to spread the weights. m-pack
packs whole layers instead, judged by the simulator's liveness peaks:

1. **Blocks**: m-stage's layers (`m_stage.layer_blocks`): each layer's
   forward ops, gradients, weights, optimizer slots and update together, so
   a move never separates a weight from its update.
2. **Start**: the blocks cut into one contiguous stage per device, of about
   equal persistent bytes (weights and slots), static bytes (activations
   too) or compute, each re-cut a few times by the peaks it measured
   (`_starts`); the descent below starts from the even cut least over its
   caps, then, while over, from the re-cut least over.
3. **Descent**: while a device is over its cap, each of the largest
   blocks of the device furthest over is tried on every other device, and
   the move that lowers the summed excess most (then the makespan) is
   kept; when no move helps, a swap of one of its blocks with a smaller
   block elsewhere (the first one that helps). Ends when the plan fits,
   nothing helps, or the simulation budget is spent.
4. **Finer**: still over, the same descent with each colocation group a
   block of its own (a weight may now leave its optimizer slots); then the
   group-level search (`refine`), which sweeps every group by the same
   score.

The returned plan fits every cap by the liveness model; the portfolio then
refines its makespan like any other. Deterministic: no randomness, budgets
counted in simulations, not seconds.
"""

from __future__ import annotations

from tfopt.placement import m_stage
from tfopt.placement import refine as refine_search
from tfopt.placement.placement import Placement
from tfopt.placement.problem import InfeasiblePlacement, PlacementProblem
from tfopt.simulate.simulator import Schedule, simulate

# The budgets, in op simulations (tried plans x ops), as `refine`'s: each
# block-level descent's (a few hundred plans on a 650-op graph, 5-15 s on
# the CI machine; m-pack runs up to two, and its starts' plans and the
# group-level descent draw on the same amount once more), then the
# group-level finish's.
PACK_OP_SIMULATIONS = 400_000
FINISH_OP_SIMULATIONS = 200_000
# Moves and swaps try the largest blocks of the device furthest over only
# (and swap partners among the largest smaller ones): at group granularity a
# device holds hundreds, most of them too small to matter.
MAX_CANDIDATES = 24
# Re-cuts of each start by the measured peaks (`_starts`): on MobileNetV2
# the fourth to sixth still lowered the start's excess.
RECUT_ROUNDS = 6


def _excess(schedule: Schedule) -> float:
  """Bytes over the caps, summed over the devices."""
  return float(sum(peak - cap for _, peak, cap in schedule.over_cap()))


class _Packing:
  """Blocks on devices, each assignment simulated once."""

  def __init__(self, problem: PlacementProblem, blocks, budget: int,
               spent: int = 0):
    self.problem, self.blocks, self.budget = problem, blocks, budget
    self.simulations = spent
    # What a move relieves: weights and slots, and the static bytes of
    # what the block computes.
    self.size = [sum(problem.costs[n].persistent_bytes + problem.memory[n]
                     for gid in gids for n in problem.members[gid])
                 for gids in blocks]

  def placement(self, assign) -> Placement:
    """Each block's groups on its device; a group that may not go there
    (pins, device types) on the first device it may use."""
    table = {}
    for gids, device in zip(self.blocks, assign):
      for gid in gids:
        allowed = self.problem.allowed[gid]
        d = device if device in allowed else allowed[0]
        for n in self.problem.members[gid]:
          table[n] = d
    return Placement(table, self.problem.num_devices)

  def score(self, assign):
    """((excess, makespan), schedule) of `assign`."""
    self.simulations += 1
    schedule = simulate(self.problem.graph, self.placement(assign),
                        self.problem.costs, self.problem.cluster)
    return (_excess(schedule), schedule.makespan_us), schedule

  @property
  def spent(self) -> bool:
    return self.simulations >= self.budget

  def _worst(self, schedule: Schedule) -> int:
    return max(range(self.problem.num_devices), key=lambda d: (
        schedule.peak_bytes[d] - (schedule.memory_caps[d] or float("inf"))))

  def _largest_on(self, assign, device: int) -> list[int]:
    """The MAX_CANDIDATES largest blocks on `device`, largest first."""
    mine = sorted((i for i, d in enumerate(assign) if d == device),
                  key=lambda i: -self.size[i])
    return mine[:MAX_CANDIDATES]

  def best_move(self, assign, worst: int):
    """The best single-block move off `worst`: (score, schedule, assign)."""
    best = None
    for i in self._largest_on(assign, worst):
      for d in range(self.problem.num_devices):
        if d == worst or self.spent:
          continue
        trial = list(assign)
        trial[i] = d
        score, schedule = self.score(trial)
        if best is None or score < best[0]:
          best = (score, schedule, trial)
    return best

  def first_swap(self, assign, worst: int, current):
    """The first swap of a block on `worst` with a smaller block
    elsewhere that lowers the score, or None."""
    for i in self._largest_on(assign, worst):
      others = sorted((j for j, d in enumerate(assign)
                       if d != worst and self.size[j] < self.size[i]),
                      key=lambda j: -self.size[j])[:MAX_CANDIDATES]
      for j in others:
        if self.spent:
          return None
        trial = list(assign)
        trial[i], trial[j] = assign[j], assign[i]
        score, schedule = self.score(trial)
        if score < current:
          return score, schedule, trial
    return None

  def descend(self, assign):
    """Block moves, then swaps, off the device furthest over (module doc);
    (assign, schedule) at the end."""
    current, schedule = self.score(assign)
    while current[0] > 0 and not self.spent:
      worst = self._worst(schedule)
      found = self.best_move(assign, worst)
      if found is None or not found[0] < current:
        found = self.first_swap(assign, worst, current)
      if found is None or not found[0] < current:
        break
      current, schedule, assign = found
    return assign, schedule


def _stages(problem: PlacementProblem, blocks, weights) -> list[int]:
  """Each block's stage when the blocks are cut into one contiguous run of
  about equal `weights` per device."""
  cuts = m_stage.even_cuts(weights, problem.num_devices)
  return [s for s, (begin, end) in enumerate(
      m_stage.stage_bounds(cuts, len(blocks))) for _ in range(begin, end)]


def _starts(packing: _Packing, blocks) -> list[list[int]]:
  """The contiguous cut least over its caps among the even cuts (the
  fastest of those that fit), then, where it is over, the one least over
  among their re-cuts if that is less over (module doc, step 2).

  Each weighting (persistent, static, compute) is cut evenly, then re-cut
  up to RECUT_ROUNDS times with every block's weight scaled by its
  device's liveness peak per unit of weight in the last cut: the peaks
  are not additive in any one weighting (what is live at a device's peak
  depends on when its stages run), so the measured ratio corrects the
  weighting where it was wrong. Persistent bytes balance a model whose
  weights fill the devices, static bytes one whose activations do."""
  problem = packing.problem
  even: list[tuple] = []
  recut: list[tuple] = []
  seen: set[tuple[int, ...]] = set()
  for weights in m_stage.block_weights(problem, blocks).values():
    start = _stages(problem, blocks, weights)
    for round_ in range(RECUT_ROUNDS + 1):
      if tuple(start) in seen:  # judged already: the re-cuts went round
        break
      seen.add(tuple(start))
      score, schedule = packing.score(start)
      (recut if round_ else even).append((score, start))
      if score[0] <= 0 or packing.spent:  # it fits: no re-cut needed
        break
      load = [0.0] * problem.num_devices
      for weight, device in zip(weights, start):
        load[device] += weight
      ratio = [schedule.peak_bytes[d] / load[d] if load[d] > 0 else 1.0
               for d in range(problem.num_devices)]
      weights = [w * ratio[d] for w, d in zip(weights, start)]
      start = _stages(problem, blocks, weights)
  # By (excess, makespan): of cuts that fit, the fastest.
  first = min(even, key=lambda e: e[0])
  starts = [first[1]]
  if recut and first[0][0] > 0:
    second = min(recut, key=lambda e: e[0])
    if second[0][0] < first[0][0]:
      starts.append(second[1])
  return starts


def m_pack(problem: PlacementProblem, *,
           op_simulations: int = PACK_OP_SIMULATIONS,
           finish_op_simulations: int = FINISH_OP_SIMULATIONS) -> Placement:
  """A plan whose liveness peaks fit every cap (module doc); raises
  InfeasiblePlacement naming the excess left when none was found."""
  blocks = m_stage.layer_blocks(problem)
  ops = max(1, len(problem.graph))
  per_descent = max(1, op_simulations // ops)
  # The starts' plans (3 weightings, each cut and re-cut) on a budget of
  # their own.
  packing = _Packing(problem, blocks, 3 * (RECUT_ROUNDS + 1))
  # A descent from each start until one fits, each with the whole budget:
  # a start's excess does not say how far its descent gets (Inception-V3 at
  # 1.1x packs from the even cut, not from a re-cut one less over;
  # MobileNetV2 at 1.5x from a re-cut one).
  best = None
  for start in _starts(packing, blocks):
    packing.budget = packing.simulations + per_descent
    assign, schedule = packing.descend(start)
    if best is None or _excess(schedule) < _excess(best[1]):
      best = assign, schedule
    if not schedule.memory_exceeded:
      break
  assign, schedule = best
  if schedule.memory_exceeded and not packing.spent:
    # The same descent with each colocation group a block of its own: a
    # layer's weight, slots and update may now part.
    groups = [[gid] for gids in blocks for gid in gids]
    by_group = [d for gids, d in zip(blocks, assign) for _ in gids]
    packing = _Packing(problem, groups, packing.budget, packing.simulations)
    assign, schedule = packing.descend(by_group)
  if schedule.memory_exceeded:
    finished = refine_search.refine(
        problem, packing.placement(assign), schedule,
        max_simulations=max(1, finish_op_simulations // ops))
    schedule = finished.schedule
    if not schedule.memory_exceeded:
      return finished.placement
    over = ", ".join(f"device {d} {(peak - cap) / 1e6:,.1f} MB"
                     for d, peak, cap in schedule.over_cap())
    raise InfeasiblePlacement(
        f"m-pack found no packing of the {len(blocks)} layer blocks (then "
        f"single groups) whose liveness peaks fit the caps; the closest is "
        f"over by {over}.")
  return packing.placement(assign)
