"""The captured training step as the hook runs it: its GraphDef imported
into a `tf.function` on given variables.

`tfopt.compile`'s train function calls it for every batch; the profile's
clock (`tfopt.cost.profile.profile_step(clock="function")`) times it on
copies of the variables, so that a prediction is of the runtime that runs
the step (a `tf.function` of the same graph ran 1.3-1.9x faster than a
`tf.compat.v1.Session` here: MobileNet 39 vs 75 ms, an LSTM 19 vs 24 ms).
"""

from __future__ import annotations


def imported_step(step, graph_def, variables):
  """A tf.function running `graph_def` on the model's own variables, fed
  the step's input tensors as a list (in `step.input_names`' order):
  `variables` maps each captured variable's node to the Keras variable
  (its current tf.Variable's handle is read when the function is traced)
  or a tf.Variable. The step itself is not kept (its tf.Variables would
  keep a copy of moved weights alive)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  outputs = list(step.output_names)
  targets = list(step.target_names)
  input_names = list(step.input_names)
  # The outputs' structure as type specs only (the traced tensors would
  # keep the captured function's graph and its captures alive); composite
  # outputs (an embedding's IndexedSlices gradient) are several tensors.
  structure = tf.nest.map_structure(tf.type_spec_from_value,
                                    step.output_structure)
  variables = dict(variables)

  import keras  # pylint: disable=g-import-not-at-top

  def handle(var):
    return var.value.handle if isinstance(var, keras.Variable) else var.handle

  @tf.function(autograph=False)
  def run(feeds):
    graph = tf.compat.v1.get_default_graph()
    input_map = {f"{name}:0": tensor
                 for name, tensor in zip(input_names, feeds)}
    # Each captured variable's handle node reads the Keras variable itself.
    input_map.update({f"{name}:0": graph.capture(handle(var))
                      for name, var in variables.items()})
    results = tf.graph_util.import_graph_def(
        graph_def, input_map=input_map, return_elements=outputs + targets,
        name="tfopt_step")
    with tf.control_dependencies(results[len(outputs):]):
      values = [tf.identity(t) for t in results[:len(outputs)]]
    return tf.nest.pack_sequence_as(structure, values, expand_composites=True)

  return run
