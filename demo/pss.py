"""An in-process `ParameterServerStrategy` cluster on localhost (2 workers, 2 ps), as in
TensorFlow's "Parameter server training" tutorial, the per-worker input pipelines the tests, the
benchmark (`benchmarks.pss_overhead`) and the demo train on, and the demo's scenario:

- `pss_unbalanced`: a custom loop scheduled through `probe.schedule` on the cluster, training an
  unpartitioned `[4000, 16]` embedding table and a `[16, 1]` kernel by plain SGD; the table
  (250 KiB) sits whole on ps 0 (`ps_imbalance`), and worker 1's pipeline batches 2 ids where
  worker 0's batches 8 (`uneven_batch`, naming worker 1). Inputs, each worker's local gradients
  and the variables' parameter servers are recorded (`LOGDIR/pss_unbalanced/replicas`).

`python -m demo.pss LOGDIR` runs the scenario; `launch(LOGDIR)` runs that in a child process (as
`demo/train.py` does). Connecting to a cluster changes the process's eager context for good: run
it in a process of its own (no MirroredStrategy on logical CPU devices beside it), and end that
process with `os._exit` (the servers' threads keep an orderly exit waiting).
"""

import os
import socket
import subprocess
import sys
import time

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


def uneven_xy_fn(input_context):
    """`(x, y)` batches for `fit`: worker 0's pipeline batches 8 rows of 3 floats (`i % 5`),
    worker 1's 2; y = 1."""
    import tensorflow as tf

    del input_context
    worker = tf.distribute.coordinator.experimental_get_current_worker_index()
    batch = tf.where(tf.equal(worker, 0), tf.constant(8, tf.int64), tf.constant(2, tf.int64))
    rows = tf.data.Dataset.range(10_000).map(
        lambda i: (tf.fill([3], tf.cast(i % 5, tf.float32)), tf.ones([1]))
    )
    return rows.batch(batch).repeat()


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


DEMO_STEPS = 24


def uneven_ids_fn(input_context):
    """Ids in [0, 4000): worker 0's pipeline batches 8 of them, worker 1's 2."""
    import tensorflow as tf

    del input_context
    worker = tf.distribute.coordinator.experimental_get_current_worker_index()
    batch = tf.where(tf.equal(worker, 0), tf.constant(8, tf.int64), tf.constant(2, tf.int64))
    return tf.data.Dataset.range(100_000).map(lambda i: i * 7 % 4000).batch(batch).repeat()


def pss_unbalanced(logdir, steps=DEMO_STEPS):
    """The demo's scenario (module docstring), written to `logdir/pss_unbalanced/replicas`.

    Returns:
      The steps' losses, fetched from their `RemoteValue`s.
    """
    import tensorflow as tf

    import tb_replica_plugin

    strategy, coordinator, _servers = cluster()
    with strategy.scope():  # created first: the table goes to ps 0, the kernel to ps 1
        embeddings = tf.Variable(
            tf.random.stateless_normal([4000, 16], [1, 2]) * 0.1, name="embeddings"
        )
        kernel = tf.Variable(tf.ones([16, 1]) * 0.1, name="kernel")
    variables = [embeddings, kernel]
    iterator = per_worker_iterator(strategy, coordinator, uneven_ids_fn)
    run_dir = os.path.join(logdir, "pss_unbalanced", "replicas")
    probe = tb_replica_plugin.ReplicaProbe(run_dir, strategy, update_freq=1)
    probe.observe_variables(variables)  # once, on the coordinator: which ps holds what

    @tf.function
    def step(iterator):
        def replica_fn(ids):
            probe.observe_inputs({"ids": ids})
            with tf.GradientTape() as tape:
                out = tf.matmul(tf.gather(embeddings, ids), kernel)
                loss = tf.reduce_mean(tf.square(out - 1.0))
            grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, variables)]
            probe.observe_gradients(grads, variables, loss=loss)
            for variable, grad in zip(variables, grads, strict=True):
                variable.assign_sub(0.1 * grad)
            return loss

        return strategy.run(replica_fn, args=(next(iterator),))

    results = [probe.schedule(step, args=(iterator,)) for _ in range(steps)]
    coordinator.join()
    losses = [float(r.fetch()) for r in results]
    probe.close()
    return losses


def launch(logdir, timeout=300):
    """Runs `python -m demo.pss LOGDIR` (the scenario, in a process of its own) and waits.

    Returns:
      The seconds it took.

    Raises:
      RuntimeError: it failed or took more than `timeout` seconds (with its output's tail).
    """
    start = time.monotonic()
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    try:
        done = subprocess.run(
            [sys.executable, "-m", "demo.pss", logdir],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"demo.pss took more than {timeout}s") from e
    if done.returncode != 0:
        raise RuntimeError(f"demo.pss failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return time.monotonic() - start


def main(argv=None):
    logdir = (sys.argv[1:] if argv is None else argv)[0]
    losses = pss_unbalanced(logdir)
    print(f"demo: pss_unbalanced: {len(losses)} steps, last loss {losses[-1]:.4f}", flush=True)
    sys.stderr.flush()
    os._exit(0)  # the servers' threads keep an orderly exit waiting


if __name__ == "__main__":
    main()
