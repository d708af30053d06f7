"""One worker of a real 2-worker `MultiWorkerMirroredStrategy` job that records the toy family.

Started twice by tests/test_registry.py with `TF_CONFIG` (worker 0 and 1, one replica each):
the toy family (tests/toy_family) is registered here, in the worker's own process, and observed
in a custom loop through `probe.recorder("toy")`, as a third-party family would be. Worker `w`'s
replica counts `COUNTS[step][w]` at each step.

    python tests/toy_job_child.py LOGDIR
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

COUNTS = {0: [3, 1], 1: [2, 0], 2: [5, 4]}  # step -> [worker 0's count, worker 1's]


def main(logdir):
    import tensorflow as tf
    import toy_family

    from tb_replica_plugin import ReplicaProbe, registry

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    worker = strategy.cluster_resolver.task_id
    table = tf.constant([COUNTS[step][worker] for step in sorted(COUNTS)], tf.int32)
    with registry.registered(toy_family.FAMILY):
        probe = ReplicaProbe(os.path.join(logdir, "toy_job"), strategy, update_freq=1)

        @tf.function
        def step(index):
            strategy.run(lambda: probe.recorder("toy").observe(table[index]))

        for index in range(len(COUNTS)):
            step(tf.constant(index))
        probe.close()
    print("toy worker done", worker, probe.disabled_reason, flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
