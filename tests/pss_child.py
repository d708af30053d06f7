"""Scenarios on one in-process `ParameterServerStrategy` cluster (2 workers, 2 ps), run in a
child process: connecting to a cluster changes the process's eager context for good, so it
cannot share the test process with the logical CPU replicas of tests/conftest.py.

Usage: `python tests/pss_child.py LOGDIR RESULTS_JSON [SCENARIO ...]`; writes each scenario's
facts (or its error) to RESULTS_JSON.
"""

import contextlib
import json
import os
import sys
import traceback
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The checkout, for `demo.pss` (and the package, unless the installed copy is under test: the
# version window's `TB_REPLICA_INSTALLED_COPY`).
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.environ.get("TB_REPLICA_INSTALLED_COPY") == "1":
    sys.path.append(_REPO)
else:
    sys.path.insert(0, _REPO)

import tensorflow as tf  # noqa: E402

import tb_replica_plugin  # noqa: E402
from demo.pss import (  # noqa: E402
    cluster,
    per_worker_iterator,
    sum_step,
    uneven_dataset_fn,
    uneven_xy_fn,
)

STEPS = 12


def summed_loop(ctx, logdir, dataset_fn, steps=STEPS):
    """`steps` steps of `sum_step` over `dataset_fn`'s per-worker batches, scheduled through
    `probe.schedule` (`update_freq=1`), joined, fetched and the probe closed: the results."""
    strategy, coordinator = ctx["strategy"], ctx["coordinator"]
    with strategy.scope():
        weights = tf.Variable(tf.ones([3]))
    iterator = per_worker_iterator(strategy, coordinator, dataset_fn)
    probe = tb_replica_plugin.ReplicaProbe(logdir, strategy, update_freq=1)
    step = sum_step(strategy, weights, probe)
    results = [probe.schedule(step, args=(iterator,)) for _ in range(steps)]
    coordinator.join()
    fetched = [float(r.fetch()) for r in results]
    probe.close()
    return fetched


def uneven_inputs(ctx, logdir):
    """Worker 0 fed batches of 8, worker 1 of 2; steps scheduled through `probe.schedule`."""
    fetched = summed_loop(ctx, logdir, uneven_dataset_fn)
    return {"results": len(fetched), "finite": all(v == v for v in fetched)}


def direct_schedule(ctx, logdir):
    """`observe_inputs` in a step given to `coordinator.schedule`: refused with one warning."""
    strategy, coordinator = ctx["strategy"], ctx["coordinator"]
    with strategy.scope():
        weights = tf.Variable(tf.ones([3]))
    iterator = per_worker_iterator(strategy, coordinator, uneven_dataset_fn)
    probe = tb_replica_plugin.ReplicaProbe(logdir, strategy, update_freq=1)
    step = sum_step(strategy, weights, probe)
    results = [coordinator.schedule(step, args=(iterator,)) for _ in range(4)]
    coordinator.join()
    probe.close()
    return {"results": [float(r.fetch()) for r in results]}


@contextlib.contextmanager
def partitioned(strategy, partitioner):
    """Variables created inside are partitioned by `partitioner` (the strategy's
    `variable_partitioner`, given at its construction; a second strategy on this cluster would
    reconnect the process's eager context)."""
    extended = strategy.extended
    previous = extended._variable_partitioner
    extended._variable_partitioner = partitioner
    try:
        yield
    finally:
        extended._variable_partitioner = previous


def ids_dataset_fn(input_context):
    """Batches of 4 ids in [0, 4000), each worker's own."""
    del input_context
    ids = tf.data.Dataset.range(10_000).map(lambda i: i % 4000)
    return ids.batch(4).repeat()


def embedding_model(strategy, coordinator, probe, partitioner=None, observe=False, steps=4):
    """An `Embedding(4000, 16)` and a `Dense(1)` (tf_keras) trained by scheduled steps of plain
    SGD; `observe_variables` on the coordinator first with `observe`, else in the step; returns
    the losses."""
    import tf_keras

    with partitioned(strategy, partitioner), strategy.scope():
        embedding = tf_keras.layers.Embedding(4000, 16)
        dense = tf_keras.layers.Dense(1)
        embedding.build((None,))
        dense.build((None, 16))
    variables = embedding.trainable_weights + dense.trainable_weights
    iterator = per_worker_iterator(strategy, coordinator, ids_dataset_fn)
    if observe:
        probe.observe_variables(variables)

    @tf.function
    def step(iterator):
        def replica_fn(ids):
            probe.observe_inputs({"ids": ids})
            if not observe:
                probe.observe_variables(variables)  # in the step: handed on once, when traced
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(dense(embedding(ids)) - 1.0))
            grads = tape.gradient(loss, variables)
            for variable, grad in zip(variables, grads, strict=True):
                variable.assign_sub(0.1 * tf.convert_to_tensor(grad))
            return loss

        return strategy.run(replica_fn, args=(next(iterator),))

    results = [probe.schedule(step, args=(iterator,)) for _ in range(steps)]
    coordinator.join()
    return [float(r.fetch()) for r in results]


def ps_unbalanced(ctx, logdir):
    """An unpartitioned embedding: one ps holds nearly all the bytes (`observe_variables` in
    the scheduled step)."""
    strategy, coordinator = ctx["strategy"], ctx["coordinator"]
    probe = tb_replica_plugin.ReplicaProbe(logdir, strategy, update_freq=1)
    losses = embedding_model(strategy, coordinator, probe)
    probe.close()
    return {"losses": losses}


def ps_partitioned(ctx, logdir):
    """The same model with `FixedShardsPartitioner(2)` (`observe_variables` on the
    coordinator)."""
    strategy, coordinator = ctx["strategy"], ctx["coordinator"]
    probe = tb_replica_plugin.ReplicaProbe(logdir, strategy, update_freq=1)
    partitioner = tf.distribute.experimental.partitioners.FixedShardsPartitioner(2)
    losses = embedding_model(strategy, coordinator, probe, partitioner, observe=True)
    probe.close()
    return {"losses": losses}


NAN_STEP = 1  # worker 1's 2nd batch holds a NaN


def nan_dataset_fn(input_context):
    """Batches of 4 rows of 3 floats; worker 1's batch `NAN_STEP` holds a NaN."""
    del input_context
    worker = tf.distribute.coordinator.experimental_get_current_worker_index()
    rows = tf.data.Dataset.range(10_000).map(lambda i: tf.fill([3], tf.cast(i % 7, tf.float32)))

    def poison(index, batch):
        bad = tf.logical_and(tf.equal(worker, 1), tf.equal(index, NAN_STEP))
        return tf.where(bad, batch * float("nan"), batch)

    return rows.batch(4).enumerate().map(poison).repeat()


def nan_gradients(ctx, logdir):
    """Gradients and loss observed in each worker's step; worker 1's gradients at its step
    `NAN_STEP` hold NaN (not applied: the weights stay finite for the other steps)."""
    strategy, coordinator = ctx["strategy"], ctx["coordinator"]
    with strategy.scope():
        weights = tf.Variable(tf.ones([3]), name="w")
        bias = tf.Variable(0.5, name="b")
    iterator = per_worker_iterator(strategy, coordinator, nan_dataset_fn)
    probe = tb_replica_plugin.ReplicaProbe(logdir, strategy, update_freq=1)

    @tf.function
    def step(iterator):
        def replica_fn(x):
            probe.observe_inputs({"x": x})
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(tf.reduce_sum(x * weights, axis=1) + bias))
            grads = tape.gradient(loss, [weights, bias])
            probe.observe_gradients(grads, [weights, bias], loss=loss)
            return loss

        return strategy.run(replica_fn, args=(next(iterator),))

    results = [probe.schedule(step, args=(iterator,)) for _ in range(STEPS)]
    coordinator.join()
    losses = [float(r.fetch()) for r in results]
    probe.close()
    return {"losses": len(losses), "nan_losses": sum(v != v for v in losses)}


def fit_tf_keras(ctx, logdir):
    """tf_keras `fit` with a `DatasetCreator` (batches of 8 on worker 0, 2 on worker 1),
    `steps_per_execution=2`, 2 epochs of 6 steps, then a second fit of 1 epoch."""
    import tf_keras

    strategy = ctx["strategy"]
    with strategy.scope():
        model = tf_keras.Sequential([tf_keras.layers.Dense(1, input_shape=(3,), name="head")])
        model.compile(tf_keras.optimizers.legacy.SGD(0.01), loss="mse", steps_per_execution=2)
    data = tf_keras.utils.experimental.DatasetCreator(uneven_xy_fn)
    callback = tb_replica_plugin.ReplicaCallback(logdir, update_freq=1)
    first = model.fit(data, epochs=2, steps_per_epoch=6, callbacks=[callback], verbose=0)
    second = model.fit(data, epochs=1, steps_per_epoch=4, callbacks=[callback], verbose=0)
    return {
        "losses": [len(first.history["loss"]), len(second.history["loss"])],
        "finite": all(v == v for v in first.history["loss"] + second.history["loss"]),
        "keys": sorted(first.history),
        "iterations": int(model.optimizer.iterations.numpy()),
        "train_step_restored": "train_step" not in model.__dict__,
    }


SLOW_SECONDS = 0.06  # worker 1's pipeline sleeps this long per batch
SLOW_STEPS = 40


def slow_dataset_fn(input_context):
    """Batches of 4 rows of 3 floats; worker 1's pipeline sleeps `SLOW_SECONDS` per batch (in
    its step: the step's `next(iterator)` waits for it)."""
    import time

    del input_context
    worker = tf.distribute.coordinator.experimental_get_current_worker_index()

    def nap(batch, index):
        if int(index) == 1:
            time.sleep(SLOW_SECONDS)
        return batch

    def slowed(batch):
        batch = tf.numpy_function(nap, [batch, worker], tf.float32, stateful=True)
        return tf.ensure_shape(batch, [4, 3])

    rows = tf.data.Dataset.range(10_000).map(lambda i: tf.fill([3], tf.cast(i % 7, tf.float32)))
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False  # the sleep stays in the step
    return rows.batch(4).map(slowed).repeat().with_options(options)


def slow_worker(ctx, logdir):
    """`SLOW_STEPS` steps scheduled on 2 workers, worker 1 slowed by its input pipeline: it runs
    fewer of them (the coordinator gives each step to a free worker)."""
    return {"results": len(summed_loop(ctx, logdir, slow_dataset_fn, SLOW_STEPS))}


def rows_dataset_fn(shard, offset=0):
    """Batches of 4 rows `[i, i, i]` of `range(offset, offset + 10_000)`: every worker's the
    same (no `shard`), or worker w's every other row from w (`shard`)."""

    def dataset_fn(input_context):
        del input_context
        rows = tf.data.Dataset.range(offset, offset + 10_000)
        if shard:
            worker = tf.distribute.coordinator.experimental_get_current_worker_index()
            rows = rows.shard(2, tf.cast(worker, tf.int64))
        return rows.map(lambda i: tf.fill([3], tf.cast(i, tf.float32))).batch(4).repeat()

    return dataset_fn


def sampled_by_content(row, every):
    """Whether `observe_examples` samples a batch whose first example is `row` (floats), as
    families/examples/pss.py decides on the worker."""
    from tb_replica_plugin.families.examples.fingerprints import byte_view

    first = tf.constant([row], tf.float32)
    digest = tf.bitcast(tf.fingerprint(tf.reshape(byte_view(first), [1, -1])), tf.int64)
    return int(digest.numpy().reshape(-1)[0]) % every == 0


def _examples_loop(ctx, logdir, shard, examples_every, offset=0):
    strategy, coordinator = ctx["strategy"], ctx["coordinator"]
    iterator = per_worker_iterator(strategy, coordinator, rows_dataset_fn(shard, offset))
    probe = tb_replica_plugin.ReplicaProbe(
        logdir, strategy, update_freq=1, examples_every=examples_every
    )

    @tf.function
    def step(iterator):
        def replica_fn(x):
            probe.observe_inputs({"x": x})
            probe.observe_examples({"x": x})
            return tf.reduce_sum(x)

        return strategy.run(replica_fn, args=(next(iterator),))

    results = [probe.schedule(step, args=(iterator,)) for _ in range(STEPS)]
    coordinator.join()
    sums = [float(r.fetch()) for r in results]
    probe.close()
    return {"results": len(sums)}


def unsharded_examples(ctx, logdir):
    """Every worker iterates the same pipeline: its k-th batch is every other worker's k-th
    (batches sampled by content, one in 2). The rows start where the first batch is sampled;
    the facts list the steps whose batch is sampled."""
    every = 2
    offset = next(o for o in range(64) if sampled_by_content([o] * 3, every))
    facts = _examples_loop(ctx, logdir, shard=False, examples_every=every, offset=offset)
    first_rows = [offset + 4 * k for k in range(STEPS)]
    facts["sampled"] = [k for k, r in enumerate(first_rows) if sampled_by_content([r] * 3, every)]
    return facts


def sharded_examples(ctx, logdir):
    """The twin sharded by worker (every batch compared)."""
    return _examples_loop(ctx, logdir, shard=True, examples_every=1)


SCENARIOS = {
    f.__name__: f
    for f in (
        uneven_inputs,
        direct_schedule,
        ps_unbalanced,
        ps_partitioned,
        nan_gradients,
        fit_tf_keras,
        slow_worker,
        unsharded_examples,
        sharded_examples,
    )
}


def main(logdir, out, names):
    strategy, coordinator, servers = cluster()
    ctx = {"strategy": strategy, "coordinator": coordinator, "servers": servers}
    results = {}
    for name in names or list(SCENARIOS):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                facts = SCENARIOS[name](ctx, os.path.join(logdir, name))
                results[name] = {"facts": facts}
            except Exception:  # noqa: BLE001 - reported to the test
                results[name] = {"error": traceback.format_exc()}
        results[name]["warnings"] = [
            str(w.message) for w in caught if "tb_replica_plugin" in str(w.message)
        ]
    with open(out, "w") as f:
        json.dump(results, f, indent=1)
    sys.stdout.flush()
    os._exit(0)  # the servers' threads keep an orderly exit waiting


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
