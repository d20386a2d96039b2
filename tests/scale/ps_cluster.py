"""Trains a linear regression with ParameterServerTrainer on a loopback
cluster (2 worker and 1 parameter-server processes started by
`tfopt.runtime.LoopbackServers`; this process is the coordinator, the
chief) and prints the outcome as JSON. Run in a fresh process by
test_ps.py.

The servers are separate processes, as in a real deployment (in this
process they shared its thread pools: deadlocks with the default 2 inter-op
threads in CI). This process died of SIGSEGV inside TensorFlow now and then
in the full suite while it had OR-Tools' and jaxlib's native libraries
loaded beside TensorFlow's; test_ps.py now runs it with TensorFlow alone
(tfopt/_native.py) and the output says what else was loaded."""

import json
import os
import sys


def main() -> None:
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tfopt  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  import keras  # pylint: disable=import-outside-toplevel
  from tfopt.runtime import LoopbackServers  # pylint: disable=import-outside-toplevel
  from tfopt.scale.ps import ParameterServerTrainer  # pylint: disable=import-outside-toplevel

  w_true = np.array([[2.0], [-1.0], [0.5]], np.float32)
  with LoopbackServers({"worker": 2, "ps": 1}) as servers:
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(servers.spec), rpc_layer="grpc")
    with servers.entered():  # the coordinator listens where the tasks are
      strategy = tf.distribute.ParameterServerStrategy(resolver)
    with strategy.scope():
      model = keras.Sequential([keras.Input((3,)),
                                keras.layers.Dense(1, use_bias=False)])
      optimizer = keras.optimizers.SGD(0.1)
    trainer = ParameterServerTrainer(strategy, model, optimizer,
                                     keras.losses.MeanSquaredError())

    def dataset_fn(context):
      rng = np.random.RandomState(context.input_pipeline_id)
      x = rng.randn(256, 3).astype("float32")
      return tf.data.Dataset.from_tensor_slices(
          (x, x @ w_true)).repeat().batch(16)

    history = trainer.fit(dataset_fn, steps=120, verbose=0)
    print(json.dumps({"steps": history["steps"],
                      "losses": len(history["loss"]),
                      "iterations": history["iterations"],
                      "first_loss": history["loss"][0],
                      "last_loss": history["loss"][-1],
                      "weights": model.get_weights()[0].ravel().tolist(),
                      "device": model.weights[0].value.device,
                      # Native stacks loaded beside TensorFlow's.
                      "beside_tensorflow": sorted(
                          m for m in ("jaxlib", "ortools") if m in
                          sys.modules)}), flush=True)
  # Without the servers, the eager context's teardown at exit would try to
  # delete its functions on them: a screen of gRPC errors after the result.
  sys.stderr.flush()
  os._exit(0)  # pylint: disable=protected-access


if __name__ == "__main__":
  main()
