"""A custom training loop for ParameterServerStrategy.

Keras 3's `fit` does not run under `tf.distribute.ParameterServerStrategy`
(it needs a `ClusterCoordinator` that schedules steps on workers), so this
is the loop TensorFlow's own tutorial writes by hand, as a class: the
coordinator (chief) schedules `steps` training steps, each a `tf.function`
that a free worker runs on its own per-worker dataset, reading and
updating the variables that live on the parameter servers. Updates are
asynchronous (each worker applies its own gradients to the current
variables), so unlike the synchronous strategies the result depends on
scheduling; a worker lost mid-step makes the coordinator re-run that step
on another worker (TensorFlow's fault tolerance for PS training). Keras'
optimizer step counter is not atomic across workers: `iterations` can end
lower than the steps run (measured: 15 of 20 on 2 workers), so the steps
are counted here from the scheduled closures.

    # On LoopbackServers: the coordinator's own server inside the tasks'
    # private network namespace, where they call back to it.
    with servers.entered():
      strategy = tf.distribute.ParameterServerStrategy(resolver)
    with strategy.scope():
      model = make_model()
      optimizer = keras.optimizers.SGD(0.1)
    trainer = ParameterServerTrainer(strategy, model, optimizer,
                                     keras.losses.MeanSquaredError())
    history = trainer.fit(dataset_fn, steps=1000)
"""

from __future__ import annotations

import keras

from tfopt._errors import check_positive_int, invalid_argument


class ParameterServerTrainer:
  """Trains `model` with `optimizer` and `loss` (a Keras loss or a callable
  (y_true, y_pred) -> scalar) under `strategy`, a ParameterServerStrategy;
  `model` and `optimizer` must be created under `strategy.scope()` so their
  variables live on the parameter servers."""

  def __init__(self, strategy, model, optimizer, loss):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    if not isinstance(strategy, tf.distribute.ParameterServerStrategy):
      raise invalid_argument("strategy", "a "
                             "tf.distribute.ParameterServerStrategy",
                             type(strategy).__name__)
    if not callable(loss):
      raise invalid_argument("loss", "a Keras loss or a callable (y_true, "
                             "y_pred) -> scalar", loss)
    self.strategy = strategy
    self.model = model
    self.optimizer = optimizer
    self.loss = loss
    self.coordinator = (
        tf.distribute.experimental.coordinator.ClusterCoordinator(strategy))
    with strategy.scope():
      if not optimizer.built:
        optimizer.build(model.trainable_variables)
    self._step = None

  def _make_step(self):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    model, optimizer, loss_fn = self.model, self.optimizer, self.loss

    def replica_step(x, y):
      with tf.GradientTape() as tape:
        prediction = model(x, training=True)
        loss = tf.reduce_mean(loss_fn(y, prediction))
        if model.losses:
          loss += tf.add_n(model.losses)
      grads = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(grads, model.trainable_variables))
      return loss

    @tf.function
    def step(iterator):
      x, y = next(iterator)
      losses = self.strategy.run(replica_step, args=(x, y))
      return self.strategy.reduce("MEAN", losses, axis=None)

    return step

  def fit(self, dataset_fn, steps: int, verbose: int = 1) -> dict:
    """Schedules `steps` steps; `dataset_fn(input_context)` makes each
    worker's (repeating) dataset of per-worker batches (x, y). Returns
    {"loss": [per-step losses in scheduling order], "steps": steps run,
    "iterations": the optimizer's (racy) step counter}."""
    check_positive_int("steps", steps)
    if not callable(dataset_fn):
      raise invalid_argument("dataset_fn", "a function input_context -> "
                             "tf.data.Dataset", type(dataset_fn).__name__)
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    if self._step is None:
      self._step = self._make_step()

    def per_worker():
      return self.strategy.distribute_datasets_from_function(dataset_fn)

    iterator = iter(self.coordinator.create_per_worker_dataset(per_worker))
    bar = keras.utils.Progbar(steps, unit_name="step") if verbose else None
    remotes = []
    for i in range(steps):
      remotes.append(self.coordinator.schedule(self._step,
                                               args=(iterator,)))
      if bar is not None and (i + 1) % max(1, steps // 20) == 0:
        bar.update(i + 1)
    self.coordinator.join()
    if bar is not None:
      bar.update(steps, finalize=True)
    losses = [float(r.fetch()) for r in remotes]
    return {"loss": losses, "steps": len(losses),
            "iterations": int(tf.convert_to_tensor(
                self.optimizer.iterations))}
