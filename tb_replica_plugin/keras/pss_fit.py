"""tf_keras `fit` under `ParameterServerStrategy`: each step's record comes back with its logs.

tf_keras `fit` (with a `DatasetCreator`) schedules its train function on the workers through the
`ClusterCoordinator` and hands callbacks `RemoteValue`s. `ReplicaCallback` instruments the model's
`train_step` as under any strategy, but only with the families that record under this strategy
(`Recorder.pss_fit_step`: captured into the step's record), and gives `fit` its own train
function: `steps_per_execution` steps of tf_keras's own step (`train_step`, the train counter,
the outputs reduced as tf_keras reduces them), each recorded (`ReplicaProbe.pss_execution`),
scheduled as tf_keras schedules its own. What `fit` gets back is a `RemoteValue` of the logs
alone (`write.pss.ScheduledValue`); the records go to the probe (`pss_submit`), which writes them
on the coordinator as it writes `probe.schedule`'s steps. Where each variable lives is handed on
at epoch ends (`Recorder.pss_fit_epoch_end`). Keras 3's `fit` does not support this strategy.
"""

import contextlib

import tensorflow as tf

from tb_replica_plugin.core import nest
from tb_replica_plugin.keras import compat
from tb_replica_plugin.write.pss import ScheduledValue

# Set on the model by an instrumented fit under this strategy: the next step its next fit's
# probe writes (a new callback's probe continues the steps).
NEXT_STEP_ATTR = "_tb_replica_pss_next_step"


def applies(model):
    """Whether `model` trains under `ParameterServerStrategy` with tf_keras (this module's
    case)."""
    strategy = getattr(model, "distribute_strategy", None)
    return (
        strategy is not None
        and type(strategy).__name__.startswith("ParameterServerStrategy")
        and compat.flavour_of(model) == compat.TF_KERAS
    )


def one_step(model):
    """tf_keras's own step for one batch (its `make_train_function`'s `step_function`): the next
    batch of the per-worker iterator, `train_step` in `strategy.run`, the train counter, the
    outputs reduced as tf_keras reduces them.

    Args:
      model: the tf_keras model (its `train_step` already instrumented).

    Returns:
      A Python function `step(iterator)` returning the step's logs.
    """
    from tf_keras.src.engine import training  # only reached with a tf_keras model

    strategy = model.distribute_strategy

    def step(iterator):
        def run_step(data):
            outputs = model.train_step(data)
            with tf.control_dependencies(training._minimum_control_deps(outputs)):
                model._train_counter.assign_add(1)
            return outputs

        outputs = strategy.run(run_step, args=(next(iterator),))
        return training.reduce_per_replica(
            outputs, strategy, reduction=model.distribute_reduction_method
        )

    return step


def instrumented_step(callback, original, befores):
    """The worker's `train_step`: each family's `before(batch)` (its capture), then the model's
    own step (the gradients family's optimizer hook captures inside it)."""
    probe = callback.probe

    def train_step(data):
        try:
            batch = nest.name_fit_batch(data)
        except Exception as error:  # noqa: BLE001 - never break the training it watches
            probe.warn_failed("inputs", error)
        else:
            callback._batches.put(batch)  # noqa: SLF001 - the gradients hook takes it
            for before in befores:
                with contextlib.suppress(Exception):  # each family warns on its own
                    before(batch)
        return original(data)

    return train_step


def train_function(callback, model, key):
    """The train function `fit` calls with the per-worker iterator: schedules one instrumented
    execution (kept on the callback and reused while `key` holds) and returns a `RemoteValue` of
    its logs (`ScheduledValue`).

    Args:
      callback: the `ReplicaCallback` (its probe; `_traced` keeps the traced execution).
      model: the tf_keras model.
      key: what the execution depends on (`ReplicaCallback._traced_key`).
    """
    probe = callback.probe
    kept = callback._traced  # noqa: SLF001 - the callback's own cache
    if kept is not None and kept[0] == key:
        execution = kept[1]
    else:
        execution = probe.pss_execution(one_step(model), compat.steps_per_execution(model))
        callback._traced = (key, execution)  # noqa: SLF001
    coordinator = model._cluster_coordinator

    def scheduled(iterator):
        remote = coordinator.schedule(execution, args=(iterator,))
        probe.pss_submit(remote)
        return ScheduledValue(remote)

    return scheduled


def begin(probe, model):
    """At `on_train_begin`: the probe's steps continue from the model's last instrumented fit
    under this strategy."""
    probe.pss_continue_from(model.__dict__.get(NEXT_STEP_ATTR, 0))


def end(probe, model):
    """At the end of a fit: where the next fit's steps continue."""
    model.__dict__[NEXT_STEP_ATTR] = probe.pss_next_step()
