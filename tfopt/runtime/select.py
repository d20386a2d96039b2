"""Plans chosen by the clock: `select="measured"`.

The portfolio ranks its candidates by the simulator. `select_measured`
runs the best few distinct plans, and the whole step on one device when
that plan fits its cap, for a few steps each on the real devices, and keeps
the fastest *measured* one. Each candidate gets its own session, one at a
time (a session holds a copy of the variables on its devices: two at once
would double the memory a capped device holds), for `rounds` rounds, every
other one in reverse order, so that drift on a shared machine touches every
candidate alike; its time is the median of all its timed steps. The table shows predicted and measured times side
by side. With it, "never slower than one device" holds on the clock where
one device is among the candidates.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Sequence

from tfopt._errors import check_positive_int
from tfopt.passes.control import merge_control_inputs
from tfopt.passes.place import apply_placement
from tfopt.placement.placement import Placement
from tfopt.runtime.session import StepSession

SELECTS = ("simulated", "measured")


@dataclasses.dataclass(frozen=True)
class MeasuredCandidate:
  """A plan, what the simulator predicted, what the clock said."""
  placer: str
  placement: Placement = dataclasses.field(repr=False)
  predicted_us: float
  measured_us: float | None = None
  error: str | None = None
  graph_def: object = dataclasses.field(default=None, repr=False)


@dataclasses.dataclass(frozen=True)
class Selection:
  """The measured candidates and the one chosen (the fastest measured)."""
  candidates: tuple[MeasuredCandidate, ...]
  chosen: int
  steps: int
  rounds: int

  @property
  def best(self) -> MeasuredCandidate:
    return self.candidates[self.chosen]

  def table(self) -> str:
    lines = [f"chosen by measurement ({self.rounds} round(s) of "
             f"{self.steps} steps each, median):",
             f"{'placer':<22}{'predicted ms':>13}{'measured ms':>13}"]
    for i, c in enumerate(self.candidates):
      measured = (f"{c.measured_us / 1e3:>13.2f}" if c.measured_us is not None
                  else f"{'failed':>13}")
      mark = "  <- chosen" if i == self.chosen else ""
      why = f"  ({c.error})" if c.error else ""
      lines.append(f"{c.placer:<22}{c.predicted_us / 1e3:>13.2f}{measured}"
                   f"{mark}{why}")
    return "\n".join(lines)


def candidate_plans(result, limit: int) -> list[MeasuredCandidate]:
  """The one-device plan when it fits, then up to `limit` other distinct
  feasible plans of a PlacementResult, fastest predicted first."""
  seen, out = set(), []
  feasible = sorted((c for c in result.candidates if c.feasible and
                     c.placement is not None),
                    key=lambda c: c.schedule.makespan_us)
  single = next((c for c in feasible if c.placer == "single"), None)
  ordered = ([single] if single is not None else []) + [
      c for c in feasible if c is not single]
  others = 0
  for c in ordered:
    key = tuple(sorted(c.placement.items()))
    if key in seen:
      continue
    if c is not single:
      if others == limit:
        break
      others += 1
    seen.add(key)
    out.append(MeasuredCandidate(c.placer, c.placement,
                                 c.schedule.makespan_us))
  return out


def select_measured(step, placed_graph_def, result, device_names:
                    Sequence[str], inputs, *, candidates: int = 3,
                    steps: int = 5, warmup: int = 2, rounds: int = 3,
                    target: str = "", config=None) -> Selection:
  """Measures the candidate plans of `result` (see module doc).

  Args:
    step: the CapturedStep.
    placed_graph_def: the graph the place pass wrote (every node placed);
      each candidate rewrites its device strings, then merges its
      cross-device control inputs (the control pass).
    result: the PlacementResult (its candidates).
    device_names: the cluster's device strings.
    inputs: one batch.
    candidates: distinct plans besides one device.
    steps, warmup, rounds: timed steps per round, untimed before them, and
      rounds over all candidates.
    target, config: where the sessions run.
  """
  for name, value in (("candidates", candidates), ("steps", steps),
                      ("rounds", rounds)):
    check_positive_int(name, value)
  plans = candidate_plans(result, candidates)
  graphs = [merge_control_inputs(apply_placement(
      placed_graph_def, p.placement, device_names))[0] for p in plans]
  times: list[list[float]] = [[] for _ in plans]
  errors: list[str | None] = [None] * len(plans)
  for r in range(rounds):
    # Every other round backwards: drift on a shared machine then falls on
    # every candidate alike.
    order = range(len(plans)) if r % 2 == 0 else reversed(range(len(plans)))
    for i in order:
      graph = graphs[i]
      if errors[i] is None:
        try:
          times[i] += _timed_steps(step, graph, inputs, steps, warmup,
                                   target, config)
        except (RuntimeError, ValueError) as err:  # a task died, a device
          errors[i] = f"{type(err).__name__}: {str(err)[:120]}"
  measured = [dataclasses.replace(
      p, measured_us=statistics.median(t) * 1e6 if t and e is None else None,
      error=e, graph_def=g) for p, t, e, g in zip(plans, times, errors,
                                                 graphs)]
  ok = [i for i, c in enumerate(measured) if c.measured_us is not None]
  if not ok:
    raise RuntimeError("No candidate plan could be measured: " + "; ".join(
        f"{c.placer}: {c.error}" for c in measured))
  chosen = min(ok, key=lambda i: measured[i].measured_us)
  return Selection(tuple(measured), chosen, steps, rounds)


def measured_chooser(step, inputs, device_names: Sequence[str], **kwargs):
  """A `PassContext.choose` for the place pass: `select_measured` on its
  result; the PlacementResult of the fastest measured plan (its own
  predicted schedule), and the Selection."""
  def choose(placed_graph_def, result):
    selection = select_measured(step, placed_graph_def, result,
                                device_names, inputs, **kwargs)
    best = selection.best
    schedule = next(c.schedule for c in result.candidates
                    if c.placer == best.placer)
    return dataclasses.replace(result, placer=best.placer,
                               placement=best.placement,
                               schedule=schedule), selection
  return choose


def _timed_steps(step, graph_def, inputs, steps, warmup, target,
                 config) -> list[float]:
  """Seconds of `steps` steps of `graph_def` after `warmup` untimed ones,
  in a session of its own."""
  with StepSession(step, graph_def=graph_def, target=target,
                   config=config) as session:
    for _ in range(warmup):
      session.run(inputs)
    out = []
    for _ in range(steps):
      began = time.perf_counter()
      session.run(inputs)
      out.append(time.perf_counter() - began)
  return out
