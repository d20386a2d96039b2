"""Network stragglers: hosts whose link is slower than the other hosts'.

A host with a throttled link (a degraded NIC, a congested switch port)
slows every synchronous step, but not where `tfopt.scale.stragglers` looks:
its workers compute as fast as the others and arrive at the all-reduce in
time; then every worker waits inside the collective for the bytes crossing
that link, the healthy ones as long as its own. Step timings cannot tell
which host it is (with two hosts every transfer crosses both links). So,
as MegaScale runs its network tests once timings point at the network,
`probe_links` measures each host's link on its own -- a TCP stream each
way between the host and a place on the fabric whose own link is not
shaped (`LocalHosts.measure_link`) -- and `network_stragglers` names the
hosts whose rate is far below the others'. The launcher probes after each
attempt on `hosts`, when no training traffic shares the links: a throttle
that lasts is found there.

A throttle that comes and goes during an attempt is found by
`NetworkWatch`: the launcher samples, about once a second, each host's
TCP round-trip time (`ss`'s view of the host's connections,
`LocalHosts.tcp_rtt_ms`) and the job's step time (from the heartbeats),
and when the RTTs rise far above their level in the attempt -- bytes
queueing at a link slower than the traffic -- or the step slows down
far, probes every link right then (a throttled link measures at most its
rate with the training's traffic beside it, a healthy one far more) and
records who was slow, from which step, and from which step its link
measured back. The RTT and the step time say *when* the network may be
slow, not where: with two hosts every connection crosses both links, so
every host's RTT rises; the probe says which.

No TensorFlow and no NumPy here: the launcher imports this.
"""

from __future__ import annotations

import re
import statistics

from tfopt._errors import invalid_argument

# A host is a network straggler when its link carries less than this
# fraction of the median of the other hosts' links.
SLOW_LINK_RATIO = 0.5
# NetworkWatch: a host's RTT is raised when it is above RTT_JUMP x its level
# and at least RTT_MIN_RISE_MS above it (measured on 2 LocalHosts at 1
# Gbit/s, benchmarks/scale.py: 0.5-2 ms at a healthy sample, 10-40 ms
# through a link throttled to 1/50).
RTT_JUMP = 4.0
RTT_MIN_RISE_MS = 5.0
# NetworkWatch: seconds between two probes of the links (each takes
# 2 x link_probe_s per host and shares the links with the training); while
# the same hosts stay named, the confirming probes back off, doubling it up
# to MAX_COOLDOWN_S.
PROBE_COOLDOWN_S = 5.0
MAX_COOLDOWN_S = 60.0
# NetworkWatch: how long an alarm that named nobody holds the levels up.
LEVEL_HOLD_S = 30.0
# NetworkWatch: the probes kept in full (each is counted in probe_counts),
# and the slow periods kept (the latest).
MAX_PROBES_KEPT = 50
MAX_PERIODS_KEPT = 50
# NetworkWatch: the step time is raised above STEP_JUMP x its level (a
# link throttled to 1/10 made this job's step 3x slower; 1/50: 10x).
STEP_JUMP = 2.0
# The launcher samples each host's RTT this often (an `ss` run per host).
RTT_EVERY_S = 1.0
# `ss -ti`'s "name:value" fields (rtt:12.5/3.1, unacked:4, lastack:16).
_SS_FIELD = re.compile(r"\b(rtt|rto|unacked|lastack|lastsnd):([\d./]+)")


def probe_links(hosts, seconds: float = 0.25, skip=()) -> list[dict | None]:
  """Per host of `hosts` (a `tfopt.scale.hosts.LocalHosts`): {"address",
  "down_bits", "up_bits"} measured for `seconds` each way, or {"address",
  "error"} where the probe failed (a diagnosis never fails the job); None
  for the hosts in `skip` (a link taken down on purpose)."""
  links = []
  for host in range(hosts.num_hosts):
    if host in skip:
      links.append(None)
      continue
    try:
      rates = hosts.measure_link(host, seconds)
    except Exception as err:  # pylint: disable=broad-except
      # A diagnosis never fails the job, nor the other hosts' probes.
      links.append({"address": hosts.addresses[host], "error": str(err)})
      continue
    links.append({"address": hosts.addresses[host], **rates})
  return links


def slowest_rate(link: dict | None) -> float | None:
  """A probed link's slower direction in bits per second (None: not
  measured)."""
  if not link or "error" in link:
    return None
  return min(link["down_bits"], link["up_bits"])


def network_stragglers(rates_bits, ratio: float = SLOW_LINK_RATIO
                       ) -> list[int]:
  """The hosts whose rate (bits per second; None: not measured) is below
  `ratio` x the median of the other measured hosts' rates, slowest first.
  Fewer than two measured hosts: none (nothing to compare with).

  >>> network_stragglers([95e6, 9.6e6, 96e6])
  [1]
  >>> network_stragglers([95e6, 9.6e6])
  [1]
  >>> network_stragglers([95e6, 60e6, 96e6])
  []
  """
  if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or \
      not 0 < ratio < 1:
    raise invalid_argument("ratio", "a fraction in (0, 1)", ratio)
  measured = {h: r for h, r in enumerate(rates_bits) if r is not None}
  slow = []
  for host, rate in measured.items():
    others = [r for h, r in measured.items() if h != host]
    if others and rate < ratio * statistics.median(others):
      slow.append(host)
  return sorted(slow, key=measured.get)


def ss_rtts_ms(text: str, max_idle_ms: float = 2000.0) -> list[float]:
  """Per TCP connection to another address in `ss -tin state established`
  output, how long a round trip takes now (ms): its smoothed RTT, or, while
  bytes sent wait for their acknowledgement (`unacked`) for longer than
  the connection's retransmission timeout (`rto`, at least 200 ms on
  Linux), the time since the last send (`lastsnd`: those bytes have
  waited at least that long) -- a connection stalled on a slow link stops
  producing RTT samples. Shorter waits are not counted: `ss` gives
  `lastsnd` in kernel ticks (4 ms), and healthy connections showed
  4-12 ms there between a send and its delayed acknowledgement. (Not the
  time since the last ACK, `lastack`: a connection idle before its last
  send would count its idle time.)
  Connections to the
  host itself (127.x, ::1, its own address: its processes among
  themselves, not its link) are skipped, and those with nothing
  outstanding that sent nothing for more than `max_idle_ms` (`lastsnd`):
  their RTT is as old as their last bytes.

  >>> out = ("Recv-Q Send-Q Local Address:Port  Peer Address:Port\\n"
  ...        "0  0  10.0.0.1:2222  10.0.0.2:4100\\n"
  ...        "\\t cubic rto:204 rtt:12.5/3.1 mss:1448 lastsnd:40\\n"
  ...        "0  0  10.0.0.1:2223  10.0.0.2:4102\\n"
  ...        "\\t cubic rto:204 rtt:6.1/3.1 lastsnd:9000 lastack:9000\\n"
  ...        "0  0  10.0.0.1:2224  10.0.0.3:4103\\n"
  ...        "\\t cubic rto:408 rtt:3.0/1.0 lastsnd:900 lastack:900 "
  ...        "unacked:12\\n"
  ...        "0  0  10.0.0.1:2225  10.0.0.3:4104\\n"
  ...        "\\t cubic rto:204 rtt:0.05/0.02 lastsnd:12 lastack:4000 "
  ...        "unacked:3\\n"
  ...        "0  0  [::ffff:10.0.0.1]:2222  [::ffff:10.0.0.1]:4101\\n"
  ...        "\\t cubic rto:204 rtt:9.0/0.01 mss:1448 lastsnd:4\\n")
  >>> ss_rtts_ms(out)
  [12.5, 900.0, 0.05]
  """
  delays, local, peer = [], None, None
  for line in text.splitlines():
    if not line.strip() or line.startswith("Recv-Q"):
      continue
    if not line[0].isspace():  # a connection: local, peer: columns 3, 4
      columns = line.split()
      local, peer = ((_address(columns[2]), _address(columns[3]))
                     if len(columns) > 3 else (None, None))
      continue
    fields = dict(_SS_FIELD.findall(line))
    if "rtt" not in fields or peer is None or peer == local or \
        peer.startswith("127.") or peer == "::1":
      continue
    try:
      rtt = float(fields["rtt"].split("/")[0])
      since_sent = float(fields.get("lastsnd", 0))
      outstanding = float(fields.get("unacked", 0)) > 0
      rto = float(fields.get("rto", 200))
    except ValueError:
      continue  # a field this parser does not know how to read
    if outstanding and since_sent > rto:
      delays.append(max(rtt, since_sent))
    elif outstanding or since_sent <= max_idle_ms:
      delays.append(rtt)
  return delays


def _address(column: str) -> str:
  """The address of an `ss` column "addr:port" ("[::ffff:a.b.c.d]:port"
  gives a.b.c.d)."""
  host = column.rsplit(":", 1)[0].strip("[]")
  return host[7:] if host.startswith("::ffff:") else host


class NetworkWatch:
  """Decides, from each host's TCP round-trip time and the job's step time
  sampled during an attempt, when to probe the links, and keeps what the
  probes found.

  Per host the RTT *level* is the lowest RTT sampled in the attempt; a
  host's RTT is *raised* above `jump` x its level and `min_rise_ms` above
  it. The step *level* is the lowest seconds per step sampled; the step
  time is raised above `step_jump` x it. The network *looks slow* when
  two hosts' RTTs are raised at once (one, where only one host was
  sampled) -- a slow link delays both ends of the connections that cross
  it, while one host's RTT alone rising is that host's own delay (a busy
  process acknowledging late) -- or when the step time is raised: a link
  slow enough to slow the step need not raise the RTT at the moments
  sampled (BBR paces, and a step's bursts fall between samples), but it
  slows the step.

  Probes (`sample` asks for one; the caller measures the links,
  `probe_links`, and hands them to `probed`), alarms and confirming ones
  at most one per `cooldown_s` -- doubled at each confirming probe that
  names the same hosts again, up to MAX_COOLDOWN_S (a throttle that lasts
  is not probed every few seconds) -- and none on a sample without a step
  time (starting, a pause, the job's end: the bursts of a job's first and
  last steps raise the RTTs of a healthy network; a step in progress
  longer than the sampling interval gives its time so far, so a stalled
  link is still judged):
  - *baseline*: once, at the first sample with a step time where no
    probe ran before (a link already slow when the attempt started
    raises nothing later);
  - *alarm*: the network looks slow and no slow period is open;
  - *confirming*: a period is open and the network no longer looks slow
    (the signals may fall while the link is still slow: the step's
    traffic changed).
  Each host a probe names (`network_stragglers`) that has no open period
  opens one; an open period ends at a probe that measured its host and
  at least one other (no error, not skipped) and does not name it. An
  alarm that names nobody holds every level at least at its value now
  for `hold_s` (a busy network, or a step slowed by something else -- a
  compute straggler, a checkpoint -- is probed once, not every
  cooldown, unless it gets slower still).

  `slow` lists the last MAX_PERIODS_KEPT periods: {"address", "from_s",
  "from_step", "to_s", "to_step" (None while open), "down_bits",
  "up_bits", "rtt_ms"} (times from the watch's start); `probes` the last
  MAX_PROBES_KEPT probes: {"at_s", "step", "kind", "rtt_ms", "step_s",
  "took_s", "links", "named"}, and `probe_counts` every probe's kind
  counted, false alarms (alarms that named nobody) as "false_alarm".
  """

  def __init__(self, addresses, jump: float = RTT_JUMP,
               min_rise_ms: float = RTT_MIN_RISE_MS,
               step_jump: float = STEP_JUMP,
               cooldown_s: float = PROBE_COOLDOWN_S,
               hold_s: float = LEVEL_HOLD_S, start: float = 0.0):
    for name, value, low in (("jump", jump, 1.0),
                             ("min_rise_ms", min_rise_ms, 0.0),
                             ("step_jump", step_jump, 1.0),
                             ("cooldown_s", cooldown_s, 0.0),
                             ("hold_s", hold_s, 0.0)):
      if isinstance(value, bool) or not isinstance(value, (int, float)) or \
          not value > low or value != value or value == float("inf"):
        raise invalid_argument(name, f"a finite number > {low:g}", value)
    self.addresses = list(addresses)
    self.jump, self.min_rise_ms = float(jump), float(min_rise_ms)
    self.step_jump, self.hold_s = float(step_jump), float(hold_s)
    self.cooldown_s, self.start = float(cooldown_s), float(start)
    self.level: list[float | None] = [None] * len(self.addresses)
    self.step_level: float | None = None
    self.slow: list[dict] = []
    self.probes: list[dict] = []
    self.probe_counts = {"baseline": 0, "alarm": 0, "confirming": 0,
                         "false_alarm": 0}
    self._last_probe = float("-inf")
    self._wait_s = self.cooldown_s  # the cooldown now (backed off)
    self._step_s: float | None = None
    self._baseline_done = False
    self._asked = None  # the kind of probe `sample` last asked for
    # After an alarm that named nobody: the levels' floor, and until when.
    self._floor: tuple = ([None] * len(self.addresses), None)
    self._floor_until = float("-inf")

  def raised(self, rtts_ms) -> list[int]:
    """The hosts whose RTT (ms; None: not sampled) is raised over their
    level (see the class doc).

    >>> watch = NetworkWatch(["a", "b"])
    >>> watch.sample(0.0, 1, [0.5, 1.0])  # no step time: no decision
    False
    >>> watch.raised([2.0, 5.0]), watch.raised([0.9, 30.0])
    ([], [1])
    """
    return [h for h, (rtt, level) in enumerate(zip(rtts_ms, self.level))
            if rtt is not None and level is not None and
            rtt > max(self.jump * level, level + self.min_rise_ms)]

  def sample(self, now: float, step: int, rtts_ms,
             step_s: float | None = None) -> bool:
    """Takes one sample: per host its RTT in ms (or None), and the seconds
    per step of the last steps (None: none measured since the last
    sample). True when the links should be probed now (then call
    `probed`; see the class doc for when)."""
    if len(rtts_ms) != len(self.addresses) or any(
        rtt is not None and (isinstance(rtt, bool) or not isinstance(
            rtt, (int, float)) or not 0 <= rtt < float("inf"))
        for rtt in rtts_ms):
      raise invalid_argument("rtts_ms", f"one RTT (finite ms >= 0, or "
                             f"None) per host ({len(self.addresses)})",
                             rtts_ms)
    if step_s is not None and (isinstance(step_s, bool) or not isinstance(
        step_s, (int, float)) or not 0 < step_s < float("inf")):
      raise invalid_argument("step_s", "a positive finite number of "
                             "seconds, or None", step_s)
    sampled = sum(rtt is not None for rtt in rtts_ms)
    slow = (sampled > 0 and len(self.raised(rtts_ms)) >= min(2, sampled)) \
        or (step_s is not None and self.step_level is not None and
            step_s > self.step_jump * self.step_level)
    self._lower_levels(now, rtts_ms, step_s)
    self._step_s = step_s
    if step_s is None or now - self._last_probe < self._wait_s:
      return False
    if any(period["to_s"] is None for period in self.slow):
      self._asked = "confirming"
      return not slow
    self._asked = ("alarm" if slow else
                   "baseline" if not self._baseline_done and
                   step_s is not None else None)
    return self._asked is not None

  def _lower_levels(self, now: float, rtts_ms, step_s) -> None:
    """Each level to the lowest value sampled, but not below the floor an
    alarm naming nobody left, while it holds."""
    floors, step_floor = self._floor if now < self._floor_until else (
        [None] * len(self.addresses), None)
    for h, rtt in enumerate(rtts_ms):
      if rtt is not None and (self.level[h] is None or rtt < self.level[h]):
        self.level[h] = max(rtt, floors[h] or 0.0)
    if step_s is not None and (self.step_level is None or
                               step_s < self.step_level):
      self.step_level = max(step_s, step_floor or 0.0)

  def probed(self, now: float, step: int, rtts_ms, links,
             took_s: float | None = None) -> list[str]:
    """Takes the links `probe_links` measured after `sample` asked for
    it (one entry per host: measured, {"error"}, or None when skipped),
    and how long the probe took; returns the addresses of the hosts named
    slow now (see the class doc for the periods opened and ended)."""
    if len(links) != len(self.addresses):
      raise invalid_argument("links", f"one probed link (or None) per host "
                             f"({len(self.addresses)})", links)
    rates = [slowest_rate(link) for link in links]
    slow = network_stragglers(rates)
    named = [self.addresses[h] for h in slow]
    open_ = {period["address"]: period for period in self.slow
             if period["to_s"] is None}
    kind = "confirming" if open_ else (
        "baseline" if self._asked == "baseline" else "alarm")
    self._baseline_done, self._asked = True, None
    # An alarm right after a baseline that named nobody may run; a
    # confirming probe naming the same hosts again backs off.
    if kind != "baseline" or slow:
      self._last_probe = now
    same = kind == "confirming" and set(named) == set(open_)
    self._wait_s = (min(2 * self._wait_s, MAX_COOLDOWN_S) if same
                    else self.cooldown_s)
    self.probe_counts[kind] += 1
    self.probes.append({"at_s": now - self.start, "step": step,
                        "kind": kind, "rtt_ms": list(rtts_ms),
                        "step_s": self._step_s, "took_s": took_s,
                        "links": list(links), "named": named})
    del self.probes[:-MAX_PROBES_KEPT]
    measured = sum(rate is not None for rate in rates)
    for address, period in open_.items():
      h = self.addresses.index(address)
      if address not in named and rates[h] is not None and measured >= 2:
        period["to_s"], period["to_step"] = now - self.start, step
    for h in slow:
      if self.addresses[h] not in open_:
        self.slow.append({"address": self.addresses[h],
                          "from_s": now - self.start, "from_step": step,
                          "to_s": None, "to_step": None,
                          "down_bits": links[h]["down_bits"],
                          "up_bits": links[h]["up_bits"],
                          "rtt_ms": rtts_ms[h]})
    del self.slow[:-MAX_PERIODS_KEPT]
    if kind == "alarm" and not slow:
      self.probe_counts["false_alarm"] += 1
      self._floor = (list(rtts_ms), self._step_s)
      self._floor_until = now + self.hold_s
      self.level = [max(level, rtt) if None not in (level, rtt) else
                    (rtt if level is None else level)
                    for rtt, level in zip(rtts_ms, self.level)]
      if self._step_s is not None:
        self.step_level = max(self.step_level or 0.0, self._step_s)
    return named

  def record(self) -> dict:
    """What the attempt record keeps: {"probes", "probe_counts",
    "slow"}."""
    return {"probes": self.probes, "probe_counts": dict(self.probe_counts),
            "slow": self.slow}
