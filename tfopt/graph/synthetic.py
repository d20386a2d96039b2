"""Synthetic layered DAGs with costs, for tests and placement benchmarks.

A layered DAG of `num_ops` ops: layers of random width, each op reading one
to `max_fanin` ops of the previous two layers. Costs are log-normal (compute
around 100 us, outputs around 1 MB), a fifth of the ops hold weights, and a
tenth share a colocation group with the op they read (a variable and its
update, as in training graphs). Deterministic for a given seed.
"""

from __future__ import annotations

import numpy as np

from tfopt._errors import check_positive_int
from tfopt.cost.cost_model import CostModel, OpCost
from tfopt.graph.opgraph import Edge, Op, OpGraph


def layered_dag(num_ops: int, *, seed: int = 0, mean_width: int = 8,
                max_fanin: int = 3) -> tuple[OpGraph, CostModel]:
  """(graph, costs) of a random layered DAG (see module doc)."""
  check_positive_int("num_ops", num_ops)
  check_positive_int("mean_width", mean_width)
  check_positive_int("max_fanin", max_fanin)
  rng = np.random.default_rng(seed)
  layers: list[list[int]] = []
  count = 0
  while count < num_ops:
    width = int(min(num_ops - count, max(1, rng.poisson(mean_width))))
    layers.append(list(range(count, count + width)))
    count += width
  names = [f"op{i}" for i in range(num_ops)]
  out_bytes = np.round(rng.lognormal(np.log(1e6), 1.0, num_ops)).astype(int)
  compute = rng.lognormal(np.log(100.0), 1.0, num_ops)
  weights = np.where(rng.random(num_ops) < 0.2,
                     np.round(rng.lognormal(np.log(4e6), 1.0, num_ops)),
                     0).astype(int)
  temp = np.where(rng.random(num_ops) < 0.3, out_bytes // 2, 0).astype(int)
  edges, colocation = [], {}
  for k in range(1, len(layers)):
    pool = layers[k - 1] + (layers[k - 2] if k >= 2 else [])
    for i in layers[k]:
      fanin = int(rng.integers(1, max_fanin + 1))
      srcs = sorted(set(int(s) for s in rng.choice(pool, size=min(
          fanin, len(pool)), replace=False)))
      for j, s in enumerate(srcs):
        edges.append(Edge(names[s], names[i], 0, j, int(out_bytes[s])))
      if rng.random() < 0.1:
        head = srcs[0]
        colocation.setdefault(head, f"group:{names[head]}")
        colocation[i] = colocation[head]
  ops = [Op(names[i], "Synthetic", output_bytes=(int(out_bytes[i]),),
            colocation=colocation.get(i)) for i in range(num_ops)]
  costs = CostModel({names[i]: OpCost(float(compute[i]), int(temp[i]),
                                      int(weights[i]))
                     for i in range(num_ops)},
                    source=f"synthetic layered DAG, seed {seed}")
  return OpGraph(ops, edges, name=f"layered_{num_ops}_seed{seed}"), costs


def total_memory(graph: OpGraph, costs) -> int:
  """Sum of persistent, temp and output bytes: what `--memory_fraction`
  is a fraction of."""
  return int(sum(costs[op.name].persistent_bytes + costs[op.name].temp_bytes +
                 sum(op.output_bytes) for op in graph.ops))
