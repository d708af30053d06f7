"""The coordinator of a multi-process `ParameterServerStrategy` cluster whose worker 1 the test
kills mid-run (tests/test_pss_failures.py): steps scheduled through `probe.schedule`, the
coordinator's retry and worker 1's recovery recorded.

Usage: `python tests/pss_failures_child.py LOGDIR RESULTS_JSON CLUSTER_JSON`. The test runs the
worker and ps tasks (tests/pss_task.py). This process asks the test on stdout ("kill",
"restart") and waits for its answer on stdin ("done"):

- run "recovered": 6 steps; kill worker 1; 12 more (the step worker 1 was given fails and is put
  back, worker 0 runs it); restart worker 1 at its address; steps until one runs on worker 1
  again; close.
- run "lost": a new probe on the same coordinator; 4 steps; kill worker 1 for good; 8 more;
  close (worker 1 never came back).

Each run's fetched results (the worker each step ran on) and the probes' warnings go to
RESULTS_JSON. A connection to a cluster changes the process's eager context for good: a process
of its own, ended with `os._exit`.
"""

import json
import os
import sys
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # noqa: E402

import tb_replica_plugin  # noqa: E402
from demo.pss import per_worker_iterator  # noqa: E402

ANSWER_SECS = 60  # the test answers at once; it bounds its own waits too
BACK_SECS = 40  # at most this long for worker 1 to run a step again after its restart


def ask(what):
    """Tells the test to `what` worker 1 and waits for its "done" on stdin."""
    print(what, flush=True)
    line = sys.stdin.readline().strip()
    if line != "done":
        raise RuntimeError(f"the test answered {line!r} to {what!r}")


def rows_dataset_fn(input_context):
    """Batches of 4 rows of 3 floats, the same on each worker."""
    del input_context
    rows = tf.data.Dataset.range(100_000).map(lambda i: tf.fill([3], tf.cast(i % 7, tf.float32)))
    return rows.batch(4).repeat()


def make_step(strategy, weights, probe):
    """A step of a few milliseconds that returns the worker it ran on."""

    @tf.function
    def step(iterator):
        def replica_fn(x):
            probe.observe_inputs({"x": x})
            y = tf.random.uniform([96, 96])
            for _ in range(8):
                y = tf.matmul(y, y) / 96.0
            weights.assign_add(tf.reduce_sum(x, axis=0) * 0.0 + tf.reduce_mean(y) * 0.0)
            return tf.distribute.coordinator.experimental_get_current_worker_index()

        return strategy.run(replica_fn, args=(next(iterator),))

    return step


def run(ctx, logdir, name, before, after, restart):
    """One run: `before` steps, worker 1 killed, `after` steps, (restarted, steps until worker 1
    runs one again), join and close. Returns the workers the steps ran on."""
    strategy, coordinator = ctx["strategy"], ctx["coordinator"]
    probe = tb_replica_plugin.ReplicaProbe(os.path.join(logdir, name), strategy, update_freq=1)
    step = make_step(strategy, ctx["weights"], probe)
    iterator = per_worker_iterator(strategy, coordinator, rows_dataset_fn)
    results = [probe.schedule(step, args=(iterator,)) for _ in range(before)]
    coordinator.join()
    ask("kill")
    for _ in range(after):
        results.append(probe.schedule(step, args=(iterator,)))
        time.sleep(0.02)
    coordinator.join()
    if restart:
        ask("restart")
        deadline = time.monotonic() + BACK_SECS
        while time.monotonic() < deadline:
            batch = [probe.schedule(step, args=(iterator,)) for _ in range(4)]
            coordinator.join()
            results += batch
            if any(int(r.fetch()) == 1 for r in batch):
                break
    coordinator.join()
    workers = [int(r.fetch()) for r in results]
    probe.close()
    return workers


def main(logdir, out, spec):
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(json.loads(spec)), rpc_layer="grpc"
    )
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        weights = tf.Variable(tf.zeros([3]))
    ctx = {"strategy": strategy, "coordinator": coordinator, "weights": weights}
    results = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results["recovered"] = run(ctx, logdir, "recovered", 6, 12, restart=True)
        results["lost"] = run(ctx, logdir, "lost", 4, 8, restart=False)
    results["warnings"] = [str(w.message) for w in caught if "tb_replica_plugin" in str(w.message)]
    with open(out, "w") as f:
        json.dump(results, f)
    print("finished", flush=True)
    os._exit(0)  # worker 1's coordinator thread waits for it (up to an hour): no orderly exit


if __name__ == "__main__":
    main(*sys.argv[1:4])
