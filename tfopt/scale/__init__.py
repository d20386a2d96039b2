"""Training at scale, MegaScale's lessons on tf.distribute (issue 8, in
progress). Built so far: FLOPs of a compiled step from its XLA HLO
(`tfopt.scale.flops`), the MFU / throughput / goodput callback
(`tfopt.scale.mfu.MFUMonitor`) and two-stage checkpoints
(`tfopt.scale.checkpoint.TwoStageCheckpointer`). Not built yet: the
launcher with restarts, heartbeats, straggler detection, preemption, the
MultiWorkerMirroredStrategy compatibility layer."""
