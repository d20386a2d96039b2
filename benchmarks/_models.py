"""What the optimizer step-time benchmarks update, and with what (any Keras
backend; no TensorFlow or absl needed)."""


def mlp():
  """784-2048-1024-10 MLP: 3.72M parameters."""
  import keras
  return keras.Sequential([
      keras.Input((784,)), keras.layers.Dense(2048, activation="relu"),
      keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(10)])


def transformer(layers=4, d=512, heads=8, vocab=1000, seq=64):
  """Post-LN Transformer encoder from Keras layers (3-D attention kernels)."""
  import keras
  inputs = keras.Input((seq,), dtype="int32")
  h = keras.layers.Embedding(vocab, d)(inputs)
  for _ in range(layers):
    a = keras.layers.MultiHeadAttention(heads, d // heads)(h, h)
    h = keras.layers.LayerNormalization()(h + a)
    f = keras.layers.Dense(4 * d, activation="gelu")(h)
    h = keras.layers.LayerNormalization()(h + keras.layers.Dense(d)(f))
  return keras.Model(inputs, keras.layers.Dense(vocab)(h))


MODELS = {"mlp_3.7M": mlp, "transformer_4x512": transformer}


def optimizer_pairs():
  """(name, make ours, make Keras' twin): CWD on, the same hyperparameters.

  Muon is compared with routing="keras", the same work as Keras' Muon.
  """
  import keras
  from tfopt.optimizers import CautiousAdamW, CautiousLion, CautiousMuon
  return [
      ("adamw", lambda: CautiousAdamW(weight_decay=0.1),
       lambda: keras.optimizers.AdamW(weight_decay=0.1)),
      ("lion", lambda: CautiousLion(learning_rate=1e-4, weight_decay=1.0),
       lambda: keras.optimizers.Lion(learning_rate=1e-4, weight_decay=1.0)),
      ("muon", lambda: CautiousMuon(weight_decay=0.1, routing="keras"),
       lambda: keras.optimizers.Muon(weight_decay=0.1)),
  ]
