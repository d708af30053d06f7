"""One task of a multi-process `ParameterServerStrategy` cluster: a `tf.distribute.Server` that
serves until the process is killed (tests/test_pss_failures.py starts and kills it).

Usage: `python tests/pss_task.py CLUSTER_JSON JOB INDEX`; CLUSTER_JSON is `{"worker": [...],
"ps": [...]}` (host:port addresses). Prints "ready" once the server is up.
"""

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402


def main(spec, job, index):
    cluster = tf.train.ClusterSpec(json.loads(spec))
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=4)
    server = tf.distribute.Server(
        cluster, job_name=job, task_index=int(index), protocol="grpc", config=config
    )
    print("ready", flush=True)
    while server is not None:
        time.sleep(3600)


if __name__ == "__main__":
    main(*sys.argv[1:4])
