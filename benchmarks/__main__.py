"""Runs every benchmark, each in its own process, and prints their JSON documents as one list.

    python -m benchmarks            # full size (the README figures; about 45 min on 2 cores)
    python -m benchmarks --quick    # reduced size, for CI: checks that they run, not their speed
    python -m benchmarks --record   # full size, each writes benchmarks/results/<name>.json

Each benchmark needs its own TensorFlow process (one MirroredStrategy per process).
"""

import argparse
import json
import subprocess
import sys

# module → arguments of the reduced (--quick) run
BENCHMARKS = {
    "benchmarks.fit_overhead": ["--quick"],
    "benchmarks.loop_overhead": ["--steps", "20", "--rounds", "1"],
    "benchmarks.backend": ["--replicas", "8", "--steps", "2000", "--repeats", "1"],
    "benchmarks.frontend_render": ["--replicas", "64", "--steps", "1000", "--repeats", "1"],
    "benchmarks.fingerprint_overhead": [
        *("--steps-per-epoch", "8", "--epochs", "1", "--rounds", "1", "--repeats", "3"),
    ],
    "benchmarks.drift_overhead": [
        *("--steps-per-epoch", "8", "--epochs", "1", "--rounds", "1", "--repeats", "2"),
    ],
    "benchmarks.multiworker_load": ["--workers", "2", "--replicas", "2", "--steps", "20"],
    "benchmarks.status_overhead": ["--quick"],
    "benchmarks.pss_overhead": ["--quick"],
}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="reduced sizes (CI)")
    parser.add_argument("--only", nargs="*", help="module names to run (default: all)")
    parser.add_argument(
        "--record",
        action="store_true",
        help="each benchmark writes its figures to benchmarks/results/ (full size only)",
    )
    args = parser.parse_args(argv)
    if args.record and args.quick:
        parser.error("--record: a --quick run's figures are not results; run at full size")
    results = []
    for module, quick_args in BENCHMARKS.items():
        if args.only and module not in args.only and module.split(".")[-1] not in args.only:
            continue
        command = [sys.executable, "-m", module, *(quick_args if args.quick else [])]
        command += ["--record"] if args.record else []
        print(f"running {' '.join(command[1:])}", file=sys.stderr, flush=True)
        # fit_overhead at full size runs 40 child processes (30-45 min on 2 cores).
        done = subprocess.run(command, capture_output=True, text=True, timeout=4 * 3600)
        if done.returncode != 0:
            sys.stderr.write(done.stderr[-4000:])
            raise SystemExit(f"{module} failed with exit status {done.returncode}")
        results.append(json.loads(done.stdout[done.stdout.index("{") :]))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
