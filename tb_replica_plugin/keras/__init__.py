"""The Keras glue: `ReplicaCallback` for `fit` (Keras 3 and tf_keras alike).

- `callback`: `ReplicaCallback`, which instruments the model's train step when Keras calls
  `set_model` and restores the model when training ends or fails.
- `hooks`: the wrappers it installs on the model and its optimizer instance, and the per-family
  observers of the train step.
- `compat`: every call that differs between Keras 3 and tf_keras.

Importing this package imports neither TensorFlow nor Keras; its modules do.
"""
