"""Trains every demo scenario into a log dir: `python -m demo.train [LOGDIR] [--replicas N]`."""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("logdir", nargs="?", default="demo_logs")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument(
        "--no-multiworker",
        action="store_true",
        help="skip the multi-worker job (2 worker processes on localhost, demo/multiworker.py)",
    )
    args = parser.parse_args()

    from demo import scenarios

    devices = scenarios.configure_devices(args.replicas)
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy(devices)
    for name in scenarios.SCENARIOS:
        start = time.perf_counter()
        scenarios.run_scenario(name, args.logdir, strategy)
        print(f"demo: {name} done in {time.perf_counter() - start:.1f}s", flush=True)
    from demo import pss

    # A ParameterServerStrategy job: its in-process cluster in a process of its own.
    seconds = pss.launch(args.logdir)
    print(f"demo: pss_unbalanced done in {seconds:.1f}s", flush=True)
    if not args.no_multiworker:
        from demo import multiworker

        # Separate processes (one MultiWorkerMirroredStrategy worker each, 1 CPU replica each).
        seconds = multiworker.launch(args.logdir, num_workers=2)
        names = ", ".join(multiworker.SCENARIOS)
        print(f"demo: multi-worker job ({names}) done in {seconds:.1f}s", flush=True)
        # A job whose worker 1 stops, then dies: both workers end with an error, on purpose.
        seconds = multiworker.launch(
            args.logdir, num_workers=2, scenarios=["mw_stall"], allow_failure=True
        )
        print(f"demo: multi-worker job (mw_stall) done in {seconds:.1f}s", flush=True)


if __name__ == "__main__":
    main()
