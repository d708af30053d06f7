"""Where a probe's replicas live: local devices, the worker's place in a multi-worker job."""

import hashlib
import json

import tensorflow as tf


def replica_context_of(strategy):
    """The current replica context when it is `strategy`'s (inside `strategy.run`), else None.

    Outside `strategy.run` and any `strategy.scope()`, TensorFlow's current replica context is
    the default strategy's: for another `strategy` that code is cross-replica code, where
    what `strategy.run` returned is at hand (plain tensors when this worker has one replica).

    Args:
      strategy: the probe's `tf.distribute.Strategy`.

    Returns:
      A `tf.distribute.ReplicaContext`, or None in `strategy`'s cross-replica context.
    """
    context = tf.distribute.get_replica_context()
    if context is None or (not tf.distribute.has_strategy() and context.strategy is not strategy):
        return None
    return context


def worker_local(strategy, value):
    """Under `ParameterServerStrategy`, in a step on a worker: the worker's one local value of
    `value` (a `PerReplica` of one replica, or `value` itself).

    Args:
      strategy: the probe's strategy.
      value: a tensor, composite tensor or `tf.distribute.DistributedValues`.

    Raises:
      ValueError: if the worker has more than one replica (not supported).
    """
    if isinstance(value, tf.distribute.DistributedValues):
        values = strategy.experimental_local_results(value)
        if len(values) != 1:
            raise ValueError(
                f"got {len(values)} replicas on one worker; under ParameterServerStrategy the "
                "probe records workers of one replica each"
            )
        value = values[0]
    return value


def local_devices(strategy):
    """Device names of this worker's replicas, in replica order (under
    `ParameterServerStrategy`, each worker's: a worker is a replica of the run)."""
    if type(strategy).__name__.startswith("ParameterServerStrategy"):
        count = strategy.extended._num_workers  # noqa: SLF001 - the cluster spec's workers
        return [f"/job:worker/replica:0/task:{i}/device:CPU:0" for i in range(count)]
    try:
        devices = tuple(strategy.extended.worker_devices)
    except (AttributeError, RuntimeError, NotImplementedError):
        devices = ()
    if devices:
        return [tf.DeviceSpec.from_string(d).to_string() for d in devices]
    # The default strategy places ops on the first GPU if there is one, else on the CPU.
    kind = "GPU" if tf.config.list_logical_devices("GPU") else "CPU"
    return [f"/job:localhost/replica:0/task:0/device:{kind}:0"]


def worker_info(strategy):
    """This worker's place in a multi-worker job, or None for a single-worker strategy.

    Args:
      strategy: a `tf.distribute.Strategy`.

    Returns:
      None unless the strategy spans several workers (`MultiWorkerMirroredStrategy` with a
      `TF_CONFIG` cluster of 2 or more workers); else a dict with `task_type`, `task_index`,
      `worker` (the worker's index among the workers, chief first: global replica ids start at
      `worker * local replicas`), `num_workers` and `job` (a fingerprint of the cluster spec, the
      same on every worker of one job).
    """
    extended = getattr(strategy, "extended", None)
    num_workers = getattr(extended, "_num_workers", 1)
    resolver = getattr(strategy, "cluster_resolver", None)
    if not isinstance(num_workers, int) or num_workers < 2 or resolver is None:
        return None
    from tensorflow.python.distribute import multi_worker_util

    task_type, task_index = resolver.task_type, resolver.task_id
    cluster = resolver.cluster_spec()
    worker = getattr(extended, "_id_in_cluster", None)
    if worker is None:
        worker = multi_worker_util.id_in_cluster(cluster, task_type, task_index)
    spec = json.dumps(cluster.as_dict(), sort_keys=True).encode("utf-8")
    return {
        "task_type": str(task_type),
        "task_index": int(task_index),
        "worker": int(worker),
        "num_workers": int(num_workers),
        "job": hashlib.blake2b(spec, digest_size=6).hexdigest(),
    }


def central_storage(strategy):
    """True when the strategy keeps one copy of each variable on a parameter device on purpose
    (CentralStorageStrategy) instead of mirroring it on the replica devices."""
    try:
        parameter = {
            tf.DeviceSpec.from_string(d).to_string() for d in strategy.extended.parameter_devices
        }
    except (AttributeError, RuntimeError, NotImplementedError, ValueError):
        return False
    return len(local_devices(strategy)) > 1 and parameter != set(local_devices(strategy))
