"""Package data: the shipped workloads (`costgraphs/*.json`, MIT; see
`tfopt.graph.load_workload`)."""
