"""`tfopt.compile` under a `tf.distribute.MirroredStrategy` or
`MultiWorkerMirroredStrategy`.

A strategy's training step cannot be captured whole: its all-reduce runs
through collective ops whose ordering tokens are resources of the strategy,
which a flat GraphDef cannot carry. So the step is cut where Keras' own
step crosses replicas:

- captured and rewritten (fold, fusion, XLA marks per device): each
  replica's forward pass, loss, gradients and metric updates -- Keras'
  `train_step` up to `apply_gradients`, traced under `strategy.run` on the
  replica's devices, the replicas' ops side by side in one graph, each on
  its replica's copy of the variables;
- run by Keras and the strategy, unchanged: `optimizer.apply_gradients`
  in each replica (the strategy's all-reduce of the gradients, the update
  of the mirrored variables) and the logs' reduction across replicas
  (`reduce_per_replica`, "auto"), exactly as Keras' `fit` does.

The losses and metrics are then plain Keras' under the same strategy.
Under MultiWorkerMirroredStrategy each worker captures its own replicas
(its task's devices) and checks the rewrite in an in-process Session on
localhost's names for them; the all-reduce across workers is the
strategy's.
Placement inside a replica (`placement=`) is refused: the strategy already
puts each replica on its device. A model with its own `train_step` is
refused under a strategy (the cut is made in Keras' step).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tfopt._errors import invalid_argument


def supported_strategy(model) -> Any:
  """The model's strategy when the hook can train under it, None for no
  strategy; a clear error for others."""
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  strategy = model.distribute_strategy
  if isinstance(strategy, type(tf.distribute.get_strategy())) and not (
      tf.distribute.has_strategy()):
    return None  # the default strategy: one process, no replicas
  if not isinstance(strategy, (tf.distribute.MirroredStrategy,
                               tf.distribute.MultiWorkerMirroredStrategy)):
    raise invalid_argument(
        "model", "built outside a tf.distribute strategy scope, or in a "
        "MirroredStrategy's or MultiWorkerMirroredStrategy's: tfopt.compile "
        "captures each replica's step and leaves the all-reduce to Keras "
        "under those only (other strategies' replica contexts -- "
        "parameter servers, TPUs, one device -- are not verified with the "
        "hook). "
        "Train it with plain `model.compile` under the strategy, or spread "
        "it over devices with tfopt.compile(placement=..., devices=...) "
        "outside the scope", f"<strategy {type(strategy).__name__}>")
  if (type(model).train_step is not keras.Model.train_step or
      "train_step" in vars(model)):
    raise invalid_argument(
        "model", "a model with Keras' own train_step under a strategy (the "
        "hook splits Keras' step at apply_gradients; a model's own "
        "train_step cannot be split): train it with plain `model.compile`",
        f"<{model.name}: its own train_step>")
  return strategy


def cluster_spec(strategy) -> dict[str, list[str]] | None:
  """The multi-worker cluster a strategy's devices belong to ({job:
  [address, ...]}), None for one process's."""
  resolver = getattr(strategy, "cluster_resolver", None)
  spec = resolver.cluster_spec().as_dict() if resolver is not None else {}
  return {job: list(tasks) for job, tasks in spec.items()} or None


def worker_task(strategy) -> str | None:
  """This worker's task ("/job:worker/replica:0/task:1") when the
  strategy's replicas are devices of a cluster's task
  (MultiWorkerMirroredStrategy under TF_CONFIG), None for this process's
  own devices."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  spec = tf.DeviceSpec.from_string(strategy.extended.worker_devices[0])
  if spec.job in (None, "localhost"):
    return None
  return f"/job:{spec.job}/replica:{spec.replica or 0}/task:{spec.task or 0}"


_LOCAL_TASK = "/job:localhost/replica:0/task:0"


def relocated(graph_def, old: str, new: str):
  """A copy of `graph_def` whose device strings on task `old` name the
  same devices on task `new` (its function bodies' too).

  A worker's replica step names the worker's task; the first-batch check
  runs it in an in-process Session, whose devices are localhost's, and the
  checked graph runs on the worker's task again."""
  out = type(graph_def)()
  out.CopyFrom(graph_def)
  nodes = [*out.node, *(n for f in out.library.function for n in f.node_def)]
  for node in nodes:
    if node.device.startswith(old):
      node.device = new + node.device[len(old):]
  return out


def for_local_checks(step, strategy):
  """`step` with its device strings on this process's localhost task, and
  a function putting a checked graph back on the worker's task (the
  identity for a one-process strategy)."""
  import dataclasses  # pylint: disable=g-import-not-at-top
  task = worker_task(strategy)
  if task is None:
    return step, lambda graph_def: graph_def
  local = dataclasses.replace(
      step, graph_def=relocated(step.graph_def, task, _LOCAL_TASK))
  return local, lambda graph_def: relocated(graph_def, _LOCAL_TASK, task)


def refuse_placement(strategy, placement) -> None:
  """Placement inside a replica is not offered."""
  if strategy is not None and placement is not None:
    raise invalid_argument(
        "placement", "None for a model built in a (MultiWorker)MirroredStrategy "
        "scope "
        "(the strategy puts each replica on its device; placing ops inside "
        "a replica is not supported): build the model outside the scope to "
        "place it over `devices`", placement)


def flat_inputs(data) -> list:
  """A distributed batch's tensors, replica by replica, in the order the
  captured step's placeholders have."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.nest.flatten(data, expand_composites=True)


def signature(data) -> tuple:
  """The distributed batch's signature: every replica tensor's shape and
  dtype."""
  return tuple(("replica", tuple(t.shape), t.dtype.name)
               for t in flat_inputs(data))


def capture_replica_step(model, strategy, data):
  """The replicas' forward, loss, gradient and metric ops as one
  CapturedStep whose outputs are, per replica, (logs, gradients), and the
  indices of the trainable weights those gradients belong to (a weight
  the loss does not reach has none, as Keras' optimizer skips it)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tfopt.graph.capture import capture_function  # pylint: disable=g-import-not-at-top
  if not model.optimizer.built:
    with strategy.scope():
      model.optimizer.build(model.trainable_variables)

  kept: list[int] = []

  def replicas(batch):
    return strategy.experimental_local_results(
        strategy.run(_replica_gradients(model, kept), args=(batch,)))

  concrete = tf.function(replicas, autograph=False).get_concrete_function(
      data)
  first = flat_inputs(data)[0]
  step = capture_function(concrete, name=model.name,
                          batch_size=int(first.shape[0]))
  return step, tuple(kept)


def _replica_gradients(model, kept: list):
  """Keras' TF `train_step` up to `apply_gradients`: the same loss (scaled
  for the replicas), loss tracker, gradients and metrics, in the same
  order. `kept` receives the indices of the weights with a gradient."""
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from keras.src.losses import loss as loss_module  # pylint: disable=g-import-not-at-top

  def step(data):
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    with tf.GradientTape() as tape:
      y_pred = (model(x, training=True) if model._call_has_training_arg  # pylint: disable=protected-access
                else model(x))
      loss = model._compute_loss(x=x, y=y, y_pred=y_pred,  # pylint: disable=protected-access
                                 sample_weight=sample_weight, training=True)
      model._loss_tracker.update_state(  # pylint: disable=protected-access
          loss_module.unscale_loss_for_distribution(loss),
          sample_weight=tf.shape(
              next(t for t in tf.nest.flatten(x) if t is not None))[0])
      loss = model.optimizer.scale_loss(loss)
    gradients = tape.gradient(loss, model.trainable_weights)
    kept[:] = [i for i, g in enumerate(gradients) if g is not None]
    return (model.compute_metrics(x, y, y_pred, sample_weight=sample_weight),
            [gradients[i] for i in kept])

  return step


def replica_train_function(model, strategy, run, kept):
  """`fit`'s train function from `run` (the imported replica step: flat
  inputs -> per replica (logs, gradients of the weights at `kept`)): the
  gradients applied by Keras' optimizer in each replica, the logs reduced
  as Keras does."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from keras.src.backend.tensorflow.trainer import reduce_per_replica  # pylint: disable=g-import-not-at-top

  devices = strategy.extended.worker_devices

  def per_replica(values, part):
    # Each replica's tensors on its device (a one-replica strategy's
    # all-reduce finds no destination for a tensor without one).
    def value(ctx):
      # This worker's replicas, in order: under MultiWorkerMirrored the
      # id in the sync group counts every worker's (worker i's are
      # i * local .. i * local + local - 1).
      replica = ctx.replica_id_in_sync_group % len(devices)
      with tf.device(devices[replica]):
        return tf.nest.map_structure(tf.identity, values[replica][part])
    return strategy.experimental_distribute_values_from_function(value)

  def apply(gradients):
    weights = model.trainable_weights
    model.optimizer.apply_gradients(zip(gradients, [weights[i] for i in kept]))

  @tf.function(autograph=False)
  def train(data):
    values = run(flat_inputs(data))
    strategy.run(apply, args=(per_replica(values, 1),))
    return reduce_per_replica(per_replica(values, 0), strategy,
                              reduction="auto")

  return train


def numpy_inputs(data) -> list:
  """The distributed batch's tensors as arrays (for the first-batch check
  and profiling)."""
  return [np.asarray(t) for t in flat_inputs(data)]
