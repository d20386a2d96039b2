"""Training at scale, MegaScale's lessons on tf.distribute (issue 8, in
progress). Built so far: FLOPs of a compiled step from its XLA HLO
(`tfopt.scale.flops`), the MFU / throughput / goodput callback
(`tfopt.scale.mfu.MFUMonitor`), two-stage checkpoints
(`tfopt.scale.checkpoint.TwoStageCheckpointer`) and straggler detection
from step phases (`tfopt.scale.stragglers`: recorder, detection, heat map;
the exchange between workers is not built). Not built yet: the launcher
with restarts, heartbeats, preemption, the MultiWorkerMirroredStrategy
compatibility layer."""
