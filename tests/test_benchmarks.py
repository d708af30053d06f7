"""The benchmarks run (reduced size) and print their figures; their speed is not asserted here."""

import json
import subprocess
import sys

from conftest import REPO


def test_every_benchmark_runs_and_prints_its_figures():
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = {r["benchmark"]: r for r in json.loads(done.stdout)}
    assert set(results) == {
        "fit_overhead",
        "loop_overhead",
        "backend",
        "frontend_render",
        "drift_overhead",
        "fingerprint_overhead",
        "multiworker_load",
    }
    fit = results["fit_overhead"]
    assert fit["ratio_to_no_callback"]["no_callback"] == 1.0
    assert set(fit["ratio_to_no_callback"]) == {
        "no_callback",
        "keras_tensorboard_update_freq_1",
        "replica_callback_default",
        "replica_callback_inputs_only",
        "replica_callback_default_variables_off",
        "replica_callback_examples_every_1",
        "replica_callback_every_step",
    }
    assert all(v > 0 for v in fit["median_seconds_per_step"].values())
    assert set(fit["median_cpu_seconds_per_step"]) == set(fit["ratio_to_no_callback"])
    assert fit["cpu_ratio_to_no_callback"]["no_callback"] == 1.0
    loop = results["loop_overhead"]
    assert loop["ratio_to_no_probe"]["no_probe"] == 1.0
    assert all(v > 0 for v in loop["event_bytes_per_logged_step_per_replica"].values())
    backend = results["backend"]
    assert backend["points_per_plugin"] == 8 * 2000
    assert backend["ratio_replicas_to_scalars"] > 0
    assert results["frontend_render"]["median_render_ms"] > 0
    fingerprints = results["fingerprint_overhead"]
    assert set(fingerprints["fit"]["median_cpu_seconds_per_step"]) == {
        "no_callback",
        "inputs_only",
        "inputs_rng",
        "inputs_examples",
        "all_default",
    }
    assert fingerprints["ops_alone_by_batch"]["256"]["fingerprints_us_per_example"] != 0
    workers = results["multiworker_load"]
    assert workers["workers"] == 2 and workers["bytes_per_worker_per_step"] > 0
