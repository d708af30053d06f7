"""tb_replica_plugin: distributed TensorFlow training, replica by replica, in TensorBoard.

Public API (imported lazily so that TensorBoard can load the plugin without TensorFlow; the
write side checks at its first import that TensorFlow is there and in the supported window,
`requirements.require_tensorflow`):

- `ReplicaCallback`: Keras callback for `model.fit`.
- `ReplicaProbe`: the same collection for custom loops with `strategy.run`.
- `inspect_dataset`: per-replica shapes of a dataset's first batches, without training.
- `load`: read a log dir into numpy arrays and findings (notebooks, scripts).
"""

__version__ = "0.1.0"

__all__ = ["ReplicaCallback", "ReplicaProbe", "inspect_dataset", "load", "__version__"]

# The write side: needs TensorFlow (checked before its modules are imported).
_NEEDS_TENSORFLOW = ("ReplicaCallback", "ReplicaProbe", "inspect_dataset")
_LAZY = {
    "ReplicaCallback": ("tb_replica_plugin.keras.callback", "ReplicaCallback"),
    "ReplicaProbe": ("tb_replica_plugin.probe", "ReplicaProbe"),
    "inspect_dataset": ("tb_replica_plugin.preflight", "inspect_dataset"),
    "load": ("tb_replica_plugin.report", "load"),
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module_name, attribute = _LAZY[name]
        if name in _NEEDS_TENSORFLOW:
            from tb_replica_plugin import requirements

            requirements.require_tensorflow()
        return getattr(importlib.import_module(module_name), attribute)
    raise AttributeError(f"module 'tb_replica_plugin' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_LAZY))
