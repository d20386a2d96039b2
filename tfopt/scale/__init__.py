"""Training at scale, MegaScale's lessons on tf.distribute.

- `tfopt.scale.launch`: start N workers on loopback, watch exit codes and
  heartbeats, classify failures, restart from checkpoints within a budget
  (`python -m tfopt.scale.launch --workers=N -- script.py ...`).
- `tfopt.scale.worker`: the worker side (environment, strategy, the
  resumable `fit` with checkpoints, input position, heartbeats, preemption).
- `tfopt.scale.cluster_env`: a worker's place from the launcher, a cluster
  manager's TF_CONFIG, or SLURM's variables.
- `tfopt.scale.hosts`: several hosts on one machine (`LocalHosts`).
- `tfopt.scale.network`: each host's link measured, network stragglers.
- `tfopt.scale.host_report`: a launched job's MFU, stragglers and link
  per host.
- `tfopt.scale.heartbeat`: progress beats and the stuck / lost verdicts.
- `tfopt.scale.compat`: Keras 3 `fit` under MultiWorkerMirroredStrategy.
- `tfopt.scale.ps`: a custom loop for ParameterServerStrategy.
- `tfopt.scale.flops`, `tfopt.scale.mfu`: FLOPs of the compiled step from
  XLA HLO; MFU, throughput and goodput.
- `tfopt.scale.checkpoint`: two-stage checkpoints.
- `tfopt.scale.stragglers`: step phases, detection, exchange between
  workers, heat map, merged Chrome trace.
"""
