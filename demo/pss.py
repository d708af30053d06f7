"""An in-process `ParameterServerStrategy` cluster on localhost (2 workers, 2 ps), as in
TensorFlow's "Parameter server training" tutorial, and the per-worker input pipelines and the
step that the tests and the benchmark (`benchmarks.pss_overhead`) train on.

Connecting to a cluster changes the process's eager context for good: run it in a process of its
own (no MirroredStrategy on logical CPU devices beside it), and end that process with
`os._exit` (the servers' threads keep an orderly exit waiting).
"""

import socket

WORKERS, PS = 2, 2


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("localhost", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def cluster(workers=WORKERS, ps=PS, variable_partitioner=None):
    """A new in-process cluster on free localhost ports.

    Args:
      workers, ps: the number of worker and parameter-server tasks.
      variable_partitioner: the strategy's `variable_partitioner` (None: variables whole).

    Returns:
      `(strategy, coordinator, servers)`: the `ParameterServerStrategy`, its
      `ClusterCoordinator` and the `tf.distribute.Server`s (workers first).
    """
    import tensorflow as tf

    ports = _free_ports(workers + ps)
    spec = tf.train.ClusterSpec(
        {
            "worker": [f"localhost:{p}" for p in ports[:workers]],
            "ps": [f"localhost:{p}" for p in ports[workers:]],
        }
    )
    # TensorFlow's in-process recipe: workers need more inter-op threads than there are tasks.
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=workers + 1)
    servers = [
        tf.distribute.Server(spec, job_name=job, task_index=i, protocol="grpc", config=config)
        for job, count in (("worker", workers), ("ps", ps))
        for i in range(count)
    ]
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(spec, rpc_layer="grpc")
    strategy = tf.distribute.ParameterServerStrategy(
        resolver, variable_partitioner=variable_partitioner
    )
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    return strategy, coordinator, servers


def uneven_dataset_fn(input_context):
    """Worker 0's pipeline batches 8 examples (rows of 3 floats), worker 1's 2.

    `input_context.input_pipeline_id` is a Python 0 when the per-worker dataset function is
    traced (once, for every worker): the worker's index is
    `experimental_get_current_worker_index()`, a tensor.
    """
    import tensorflow as tf

    del input_context
    worker = tf.distribute.coordinator.experimental_get_current_worker_index()
    batch = tf.where(tf.equal(worker, 0), tf.constant(8, tf.int64), tf.constant(2, tf.int64))
    features = tf.data.Dataset.range(10_000).map(lambda i: tf.fill([3], tf.cast(i, tf.float32)))
    return features.batch(batch).repeat()


def per_worker_iterator(strategy, coordinator, dataset_fn):
    """An iterator over `dataset_fn`'s per-worker datasets (`create_per_worker_dataset`)."""
    dataset = coordinator.create_per_worker_dataset(
        lambda: strategy.distribute_datasets_from_function(dataset_fn)
    )
    return iter(dataset)


def sum_step(strategy, weights, probe=None):
    """A `tf.function` step: `reduce_sum(x * weights)` over the worker's next batch, its inputs
    observed by `probe` (None: no probe)."""
    import tensorflow as tf

    @tf.function
    def step(iterator):
        def replica_fn(x):
            if probe is not None:
                probe.observe_inputs({"x": x})
            return tf.reduce_sum(x * weights)

        return strategy.run(replica_fn, args=(next(iterator),))

    return step
