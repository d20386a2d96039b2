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
that lasts is found; one that came and went during the attempt is not.

No TensorFlow and no NumPy here: the launcher imports this.
"""

from __future__ import annotations

import statistics

from tfopt._errors import invalid_argument

# A host is a network straggler when its link carries less than this
# fraction of the median of the other hosts' links.
SLOW_LINK_RATIO = 0.5


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
    except OSError as err:
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
