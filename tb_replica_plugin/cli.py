"""`tb-replica`: the findings without a browser.

    tb-replica report LOGDIR [--json] [--run PATTERN] [--fail-on error|warning|info]
                      [--threshold NAME=VALUE ...]
    tb-replica inspect MODULE:FUNCTION --logdir LOGDIR [--replicas N] [--steps N]
    tb-replica export-batch LOGDIR --run RUN --step S --replica R OUT.npz

Exit status: 0 on success, 1 when `--fail-on` is given and a finding at or above that severity
exists, 2 on bad arguments or an unreadable log dir.
"""

import argparse
import importlib
import importlib.util
import json
import os
import sys
from concurrent.futures.process import BrokenProcessPool

from tb_replica_plugin import analysis
from tb_replica_plugin.read import processes


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.print_usage(sys.stderr)
        self.exit(2, f"tb-replica: error: {message}\n")


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def _build_parser():
    parser = _Parser(prog="tb-replica", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    report = commands.add_parser("report", help="print per-run replica data and findings")
    report.add_argument("logdir", help="log directory, as given to tensorboard --logdir")
    report.add_argument("--json", action="store_true", help="print one JSON document")
    report.add_argument("--run", help="only runs whose name matches this shell-style pattern")
    report.add_argument(
        "--fail-on",
        choices=analysis.SEVERITIES,
        help="exit with status 1 if a finding at or above this severity exists",
    )
    report.add_argument(
        "--threshold",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a rule threshold (repeatable), e.g. max_imbalance_ratio=1.5",
    )
    report.add_argument(
        "--processes",
        type=_positive_int,
        metavar="N",
        help="processes reading the event files (default: one per CPU, up to "
        f"{MAX_AUTO_PROCESSES}, for more than {PARALLEL_MIN_EVENT_BYTES // 2**20} MB of events)",
    )

    inspect = commands.add_parser(
        "inspect",
        help="record per-replica shapes of a dataset's first batches, without training",
    )
    inspect.add_argument(
        "dataset_fn",
        help="MODULE:FUNCTION (or path/to/file.py:FUNCTION) returning a batched tf.data.Dataset",
    )
    inspect.add_argument("--logdir", required=True, help="log directory to write")
    inspect.add_argument("--replicas", type=int, default=2, help="logical CPU replicas (>= 1)")
    inspect.add_argument("--steps", type=int, default=10, help="batches to read (>= 1)")
    inspect.add_argument("--run", default="inspect_dataset", help="run name to write")
    inspect.add_argument("--json", action="store_true", help="print the result as JSON")

    export = commands.add_parser(
        "export-batch",
        help="write a replica's captured culprit batch (a step with NaN/Inf) to a .npz file",
    )
    export.add_argument("logdir", help="log directory, as given to tensorboard --logdir")
    export.add_argument("--run", required=True, help="the run (or multi-worker job) name")
    export.add_argument("--step", type=int, required=True, help="the step of the capture")
    export.add_argument("--replica", type=int, required=True, help="the global replica id")
    export.add_argument("out", help="the .npz file to write")
    return parser


def _load_function(spec):
    module_name, _, function_name = spec.rpartition(":")
    if not module_name or not function_name:
        raise ValueError(f"expected MODULE:FUNCTION, got {spec!r}")
    if module_name.endswith(".py"):
        spec_obj = importlib.util.spec_from_file_location("_tb_replica_user", module_name)
        if spec_obj is None or not os.path.isfile(module_name):
            raise ValueError(f"no such file {module_name!r}")
        module = importlib.util.module_from_spec(spec_obj)
        spec_obj.loader.exec_module(module)
    else:
        sys.path.insert(0, os.getcwd())
        module = importlib.import_module(module_name)
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ValueError(f"{function_name!r} is not a function of {module_name!r}")
    return function


def _report(args, processes):
    from tb_replica_plugin import report as report_lib

    try:
        thresholds = analysis.Thresholds.from_overrides(args.threshold)
    except ValueError as error:
        print(f"tb-replica: error: {error}", file=sys.stderr)
        return 2
    try:
        report = report_lib.load(
            args.logdir, run=args.run, thresholds=thresholds, processes=processes
        )
    except report_lib.LogDirError as error:
        print(f"tb-replica: error: {error}", file=sys.stderr)
        return 2
    except BrokenProcessPool:
        print(
            f"tb-replica: error: a process reading the log dir ({processes} at once) stopped "
            "abruptly, most likely out of memory: run again with fewer, e.g. --processes 1",
            file=sys.stderr,
        )
        return 2
    if args.json:
        if sys.stdout.isatty():
            # Indented for a person at a terminal (json encodes an indented document in Python,
            # about 10 times slower than the compact one on a large job).
            print(json.dumps(report.to_json(), indent=1, allow_nan=False, default=str))
        else:
            # Compact, written one family block at a time (`Report.json_chunks`).
            sys.stdout.writelines(report.json_chunks())
            sys.stdout.write("\n")
    else:
        print(report.to_text())
    if args.fail_on:
        limit = analysis.SEVERITY_RANK[args.fail_on]
        if any(analysis.SEVERITY_RANK[f.severity] <= limit for f in report.all_findings()):
            return 1
    return 0


def _export_batch(args):
    from tb_replica_plugin import report as report_lib

    try:
        report = report_lib.load(args.logdir)
    except report_lib.LogDirError as error:
        print(f"tb-replica: error: {error}", file=sys.stderr)
        return 2
    run_data = report.runs.get(args.run)
    if run_data is None:
        runs = ", ".join(report.runs) or "none"
        print(f"tb-replica: error: no run {args.run!r} (runs: {runs})", file=sys.stderr)
        return 2
    series = run_data.gradients
    try:
        if series is None:
            raise KeyError(f"run {args.run!r} recorded no gradients, so no batch was captured")
        captured = series.batch(args.step, args.replica)
    except KeyError as error:
        print(f"tb-replica: error: {error.args[0]}", file=sys.stderr)
        return 2
    import numpy as np

    np.savez(args.out, **captured.arrays)
    print(f"wrote {args.out}: step {captured.step}, replica {captured.replica}")
    for entry in captured.to_json()["inputs"]:
        kept = "" if not entry["truncated"] else f" (first {entry['kept_rows']} rows kept)"
        bad = entry["nonfinite_examples"]
        note = f"; non-finite examples {bad}" if bad else ""
        print(f"  {entry['name']}: {entry['dtype']} {entry['shape']}{kept}{note}")
    return 0


def _inspect(args):
    if args.replicas < 1 or args.steps < 1:
        print("tb-replica: error: --replicas and --steps must be >= 1", file=sys.stderr)
        return 2
    from tb_replica_plugin import requirements

    try:
        tf = requirements.require_tensorflow()
    except requirements.TensorFlowRequirementError as error:
        print(f"tb-replica: error: {error}", file=sys.stderr)
        return 2
    try:
        make_dataset = _load_function(args.dataset_fn)
    except (ValueError, ImportError, OSError) as error:
        print(f"tb-replica: error: cannot load {args.dataset_fn!r}: {error}", file=sys.stderr)
        return 2
    from tb_replica_plugin.preflight import inspect_dataset

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * args.replicas
    )
    devices = [f"/cpu:{i}" for i in range(args.replicas)]
    strategy = tf.distribute.MirroredStrategy(devices)
    result = inspect_dataset(strategy, make_dataset(), args.logdir, args.steps, args.run)
    if args.json:
        body = {
            "run_dir": result.run_dir,
            "batch_sizes": result.batch_sizes,
            "findings": [f.to_json() for f in result.findings],
        }
        print(json.dumps(body, indent=1, default=str))
    else:
        print(f"wrote {result.run_dir}")
        for step, sizes in enumerate(result.batch_sizes):
            print(f"  step {step}: {sizes}")
        for finding in result.findings:
            print(f"  [{finding.severity}] {finding.kind}: {finding.message}")
    return 0


# Event bytes up to which TensorBoard's TF stub reads a log dir faster than TensorFlow: the stub
# checks each record's CRC in Python (about 0.1 s of CPU per MB), TensorFlow's import costs ~3 s.
STUB_MAX_EVENT_BYTES = 24 * 2**20
# Event bytes beyond which `tb-replica report` reads with one process per CPU by default: a
# process costs 1-4 s of CPU to start (TensorFlow's import included), and on 2 CPUs the split pays
# for it from about 1 GB of events.
PARALLEL_MIN_EVENT_BYTES = 2**30
MAX_AUTO_PROCESSES = 8


def _event_bytes(logdir, limit):
    """Bytes of the event files under `logdir`, counted until they exceed `limit`."""
    from tb_replica_plugin.read.event_files import event_bytes

    return event_bytes((directory for directory, _, _ in os.walk(logdir)), limit)


def _choose_event_reader(logdir, counted, defer=False):
    """TensorBoard's TF stub for a small local log dir (saves ~3 s of TF import), else TensorFlow.

    TensorBoard's event reader uses TensorFlow when it is importable; the presence of the module
    `tensorboard.compat.notf` tells it to use its own stub, which reads local files but checks
    CRCs in Python: beyond `STUB_MAX_EVENT_BYTES` of events TensorFlow's reader is faster.
    Remote paths (gs://, s3://) keep TensorFlow's file systems.

    Args:
      logdir: the log dir.
      counted: its event bytes (`_event_bytes`).
      defer: TensorFlow is imported only if this process reads events itself (a report read by
        a pool of processes is merged here: `read.processes.use_event_reader`).
    """
    if "://" not in logdir:
        choice = "tensorflow" if counted > STUB_MAX_EVENT_BYTES else "stub"
        processes.use_event_reader(choice, defer=defer)


def _report_processes(requested, event_bytes):
    """The processes reading the log dir: as asked, else one per CPU (at most
    `MAX_AUTO_PROCESSES`) beyond `PARALLEL_MIN_EVENT_BYTES` of events, else 1."""
    if requested is not None:
        return requested
    if event_bytes <= PARALLEL_MIN_EVENT_BYTES:
        return 1
    return max(1, min(os.cpu_count() or 1, MAX_AUTO_PROCESSES))


def main(argv=None):
    """Entry point of the `tb-replica` console script.

    Args:
      argv: the arguments (default: `sys.argv[1:]`).

    Returns:
      The exit status (0, 1 or 2).
    """
    # TensorFlow (imported by TensorBoard's event reader) logs device set-up noise otherwise.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    args = _build_parser().parse_args(argv)
    if args.command in ("report", "export-batch"):
        counted = 0 if "://" in args.logdir else _event_bytes(args.logdir, PARALLEL_MIN_EVENT_BYTES)
        if args.command == "export-batch":
            _choose_event_reader(args.logdir, counted)
            return _export_batch(args)
        reading = _report_processes(args.processes, counted)
        _choose_event_reader(args.logdir, counted, defer=reading > 1)
        return _report(args, reading)
    return _inspect(args)


if __name__ == "__main__":
    sys.exit(main())
