"""What scales with the workers of a job: bytes written per worker per step, and read time.

Writes a synthetic job the way `ReplicaProbe` does on each worker (same tags, metadata and tensor
layouts: one shapes event, then the dense batch-size series and the step-time series at every
logged step) for `--workers` workers of `--replicas` replicas each, then times the reads the tab
and the report do: `tb_replica_plugin.load` (every sample, with findings) and the plugin's
`/runs`-equivalent read on TensorBoard's Python loader. Prints one JSON document.

    python -m benchmarks.multiworker_load [--workers 16] [--replicas 8] [--steps 1000]
"""

import argparse
import json
import os
import tempfile
import time

from benchmarks import common

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def write_job(logdir, workers, replicas, steps):
    """Writes the runs `logdir/job/worker_<i>`; returns the bytes of each worker's event file."""
    import numpy as np
    import tensorflow as tf

    from tb_replica_plugin import metadata
    from tb_replica_plugin.families.inputs import schema as inputs_schema
    from tb_replica_plugin.families.step_time import schema as step_time_schema

    sizes = []
    for worker in range(workers):
        run_dir = os.path.join(logdir, "job", f"worker_{worker}")
        ids = list(range(worker * replicas, (worker + 1) * replicas))
        document = {
            "devices": [f"/job:worker/replica:0/task:{worker}/device:GPU:{i}" for i in ids],
            "replicas": ids,
            "source": "custom_loop",
            "worker": {
                "task_type": "worker",
                "task_index": worker,
                "worker": worker,
                "num_workers": workers,
                "job": "bench",
            },
            "inputs": [
                {"name": "x", "dtypes": ["float32"] * replicas, "shapes": [[32, 64]] * replicas},
                {"name": "y", "dtypes": ["int64"] * replicas, "shapes": [[32]] * replicas},
            ],
        }
        writer = tf.summary.create_file_writer(run_dir)
        batch = tf.constant(np.full((3, replicas), 32, np.int32))
        start = 1_800_000_000.0
        with writer.as_default():
            tf.summary.write(
                inputs_schema.TAG_SHAPES,
                tf.constant(json.dumps(document)),
                step=0,
                metadata=metadata.create_summary_metadata(inputs_schema.KIND_SHAPES),
            )
            for step in range(steps):
                tf.summary.write(
                    inputs_schema.TAG_BATCH_SIZE,
                    batch,
                    step=step,
                    metadata=metadata.create_summary_metadata(inputs_schema.KIND_BATCH_SIZE),
                )
                now = start + step * 0.1 + (0.02 if worker == 1 else 0.0)
                tf.summary.write(
                    step_time_schema.TAG_STEP_TIME,
                    tf.constant([now, 0.1, 0.1], tf.float64),
                    step=step,
                    metadata=metadata.create_summary_metadata(step_time_schema.KIND_STEP_TIME),
                )
        writer.close()
        sizes.append(sum(os.path.getsize(os.path.join(run_dir, f)) for f in os.listdir(run_dir)))
    return sizes


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--steps", type=int, default=1000)
    common.add_record_argument(parser)
    args = parser.parse_args(argv)

    from tb_replica_plugin import reader, store
    from tb_replica_plugin.read import judge
    from tb_replica_plugin.report import load

    with tempfile.TemporaryDirectory() as logdir:
        start = time.perf_counter()
        sizes = write_job(logdir, args.workers, args.replicas, args.steps)
        write_s = time.perf_counter() - start
        with tempfile.TemporaryDirectory() as one_step:
            base = write_job(one_step, 1, args.replicas, 1)[0]
        start = time.perf_counter()
        report = load(logdir)
        load_s = time.perf_counter() - start
        job = report.runs["job"]
        assert job.inputs.num_replicas == args.workers * args.replicas
        provider, ctx, experiment_id = reader.local_provider(logdir)
        start = time.perf_counter()
        runs_store = store.RunStore(provider)  # through the provider, as with --logdir_spec
        names = reader.groups(runs_store.list_runs(ctx, experiment_id))
        findings = [judge.find_run(runs_store.run_data(ctx, experiment_id, name)) for name in names]
        read_s = time.perf_counter() - start
    result = {
        "benchmark": "multiworker_load",
        "workers": args.workers,
        "replicas_per_worker": args.replicas,
        "steps": args.steps,
        "bytes_per_worker_per_step": round((sizes[0] - base) / max(1, args.steps - 1), 1),
        "bytes_per_worker": sizes[0],
        "write_seconds": round(write_s, 2),
        "load_seconds": round(load_s, 2),
        "read_and_findings_seconds": round(read_s, 2),
        "findings": sum(len(f) for f in findings),
    }
    print(json.dumps(result, indent=2))
    if args.record:
        size = ("workers", "replicas_per_worker", "steps")
        runs = {
            "bytes": {k: result[k] for k in ("replicas_per_worker", "bytes_per_worker_per_step")},
            "load": {k: result[k] for k in (*size, "load_seconds", "read_and_findings_seconds")},
        }
        common.record_results("multiworker_load", runs, argv)


if __name__ == "__main__":
    main()
