"""The family registry: order and needs, and a new family added with one registry entry; and the
package's size limits (modules, the probe's core).

The toy family (tests/toy_family/) is registered at test time by `registry.registered`; nothing
else in the package changes.
"""

import json
import os

import numpy as np
import pytest
from werkzeug import test as werkzeug_test
from werkzeug import wrappers

from tb_replica_plugin import analysis, group, reader, registry
from tb_replica_plugin import report as report_lib
from tb_replica_plugin.read import judge

PLUGIN = "/data/plugin/replicas"
COUNTS = {0: [3, 1], 1: [2, 0], 2: [5, 4]}


def test_every_family_needs_only_families_registered_before_it():
    seen = set()
    names = [family.name for family in registry.families()]
    assert len(names) == len(set(names))
    for family in registry.families():
        missing = [need for need in family.needs if need not in seen]
        assert not missing, f"{family.name} needs {missing}, not registered before it"
        seen.add(family.name)


def test_modules_and_the_probe_core_stay_small():
    """No module of the package over 800 lines; the probe's core class at most 500."""
    import ast

    package = os.path.dirname(registry.__file__)
    long = {}
    for directory, _, names in os.walk(package):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                with open(path, encoding="utf-8") as source:
                    count = len(source.read().splitlines())
                if count > 800:
                    long[os.path.relpath(path, package)] = count
    assert not long, f"modules over 800 lines: {long}"
    with open(os.path.join(package, "write", "probe.py"), encoding="utf-8") as source:
        tree = ast.parse(source.read())
    (core,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ProbeCore"]
    assert core.end_lineno - core.lineno + 1 <= 500


def test_out_of_order_needs_are_refused():
    inputs, examples = registry.family("inputs"), registry.family("examples")
    registry.check_order([inputs, examples])
    with pytest.raises(ValueError, match="'examples' needs 'inputs'"):
        registry.check_order([examples, inputs])


def test_tags_kinds_and_finding_kinds_are_unique_across_families():
    tags = [tag for family in registry.families() for tag in family.tags]
    assert len(tags) == len(set(tags)) == len(registry.tag_kinds())
    kinds = judge.finding_kinds()
    fields = set(analysis.Thresholds.__dataclass_fields__)
    for kind, meta in kinds.items():
        assert meta["severity"] in analysis.SEVERITIES, kind
        assert set(meta["thresholds"]) <= fields, kind


@pytest.fixture
def toy_registered():
    import toy_family

    with registry.registered(toy_family.FAMILY):
        yield


def write_toy_run(logdir):
    """Records COUNTS through the probe's write path: a real 2-replica strategy, the toy family's
    recorder (created by the probe from the registry) observing each replica's count."""
    import tensorflow as tf
    from conftest import mirrored

    from tb_replica_plugin import ReplicaProbe

    strategy = mirrored(2)
    table = tf.constant([COUNTS[step] for step in sorted(COUNTS)], tf.int32)
    probe = ReplicaProbe(os.path.join(logdir, "toy_run"), strategy, update_freq=1)

    @tf.function
    def step(index):
        def replica_fn():
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            probe.recorder("toy").observe(table[index][replica])

        strategy.run(replica_fn)

    for index in range(len(COUNTS)):
        step(tf.constant(index))
    probe.close()
    assert probe.disabled_reason == "the probe was closed"  # closed, never failed


def get_json(app, path):
    """`(status, body)`: the JSON answer, or the text of an error (TensorBoard's own)."""
    response = werkzeug_test.Client(app, wrappers.Response).get(PLUGIN + path)
    text = response.get_data(as_text=True)
    return response.status_code, json.loads(text) if response.status_code < 400 else text


def test_toy_family_read_routed_listed_found_and_reported(toy_registered, tmp_path):
    from bad_logs import wsgi_app

    logdir = str(tmp_path)
    write_toy_run(logdir)

    run_data = group.read_log_dir(logdir)["toy_run"]
    assert run_data.toy.steps.tolist() == [0, 1, 2]
    assert run_data.toy.counts.tolist() == [[3, 1], [2, 0], [5, 4]]
    assert run_data.toy.replicas == [0, 1]  # the inputs family (a need) has no replicas here
    assert run_data.inputs.steps.size == 0 and run_data.gradients is None

    app, _ = wsgi_app(logdir)
    status, body = get_json(app, "/toy?run=toy_run")
    assert status == 200
    assert body == {
        "run": "toy_run",
        "replicas": [0, 1],
        "steps": [0, 1, 2],
        "counts": [[3, 1], [2, 0], [5, 4]],
    }
    status, body = get_json(app, "/toy?run=toy_run&max_points=1")
    assert status == 400 and body.startswith("Invalid argument: max_points must be between")
    status, body = get_json(app, "/toy?run=nope")
    assert status == 404 and body == "Not found: no replica data for run 'nope'"

    status, body = get_json(app, "/runs")
    assert status == 200
    (entry,) = body["runs"]
    assert entry["run"] == "toy_run" and entry["families"] == ["status", "toy"]
    assert entry["findings"] == {"error": 0, "warning": 0, "info": 1}

    status, body = get_json(app, "/findings?run=toy_run")
    (finding,) = body["findings"]
    assert (finding["kind"], finding["replicas"], finding["first_step"]) == ("toy_zero", [1], 1)
    assert judge.finding_kinds()["toy_zero"]["family"] == "toy"

    report = report_lib.load(logdir)
    assert report.to_json()["runs"][0]["toy"] == [[3, 1], [2, 0], [5, 4]]
    assert "  toy counts: [[3, 1], [2, 0], [5, 4]]" in report.to_text().splitlines()


def test_toy_family_records_under_fit_through_its_own_fit_hook(toy_registered, tmp_path):
    """`ReplicaCallback` calls the toy recorder's `fit_step` like any family's: 16 examples in
    batches of 8 on 2 replicas count 4 per replica at each of the 2 steps; read and served."""
    from bad_logs import wsgi_app
    from conftest import mirrored, small_model

    from tb_replica_plugin import ReplicaCallback

    model = small_model(mirrored(2), 3)
    x = np.arange(48, dtype=np.float32).reshape(16, 3)
    callback = ReplicaCallback(str(tmp_path), run_name="fit", update_freq="batch")
    model.fit(x, np.zeros((16, 1), np.float32), batch_size=8, epochs=1, verbose=0,
              callbacks=[callback])  # fmt: skip
    run_data = group.read_log_dir(str(tmp_path))["fit"]
    assert run_data.toy.steps.tolist() == [0, 1]
    assert run_data.toy.counts.tolist() == [[4, 4], [4, 4]]
    assert run_data.toy.replicas == run_data.inputs.replicas == [0, 1]
    status, body = get_json(wsgi_app(str(tmp_path))[0], "/toy?run=fit")
    assert (status, body["counts"]) == (200, [[4, 4], [4, 4]])


def test_toy_family_merged_over_a_job_judged_and_presented(toy_registered):
    """A job of workers 0 and 2 (of 3): the toy's whole-job `merge` puts their counts on the
    global replica axis at the steps both logged; its rule names the global replica."""
    from test_job_merge import _member
    from toy_family import present as toy_present
    from toy_family import schema as toy_schema

    members = [
        _member("j/worker_2", 2, [4, 5], [4, 4], [0, 1, 2]),
        _member("j/worker_0", 0, [0, 1], [4, 4], [0, 1]),
    ]
    counts = {"j/worker_0": {0: [3, 1], 1: [2, 2]}, "j/worker_2": {0: [5, 0], 1: [1, 1], 2: [7, 7]}}
    for member in members:
        member.samples[toy_schema.TAG_TOY_COUNTS] = [
            (step, np.array(value, np.int32)) for step, value in counts[member.run].items()
        ]
    job = group.merge_job("j", members)
    assert job.toy.steps.tolist() == [0, 1]
    assert job.toy.counts.tolist() == [[3, 1, 5, 0], [2, 2, 1, 1]]
    assert job.toy.replicas == [0, 1, 4, 5]
    (found,) = [f for f in judge.find_run(job) if f.kind == "toy_zero"]
    assert (found.replicas, found.first_step, found.count) == ([5], 0, 1)
    body = toy_present.body("j", job, {})
    assert body["replicas"] == [0, 1, 4, 5] and body["counts"][1] == [2, 2, 1, 1]


def _run_toy_job(logdir, timeout=240):
    """Runs tests/toy_job_child.py as a real 2-worker job on localhost (`TF_CONFIG`), bounded by
    `timeout` s; every worker started here is stopped by its pid whatever happens."""
    import subprocess
    import sys
    import time

    from demo import multiworker

    here = os.path.dirname(os.path.abspath(__file__))
    ports = multiworker.free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    processes = []
    try:
        for index in range(2):
            env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
            env["TF_CONFIG"] = json.dumps(
                {"cluster": cluster, "task": {"type": "worker", "index": index}}
            )
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (multiworker.REPO, env.get("PYTHONPATH")) if p
            )
            command = [sys.executable, os.path.join(here, "toy_job_child.py"), logdir]
            processes.append(
                subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            )
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in processes) and time.monotonic() < deadline:
            time.sleep(0.2)
        codes = [p.poll() for p in processes]
    finally:
        for process in processes:
            multiworker.stop_worker(process)
    outputs = [p.stdout.read().decode(errors="replace")[-3000:] for p in processes]
    assert codes == [0, 0], f"exit codes {codes}\n" + "\n".join(outputs)
    return outputs


def test_toy_family_job_of_two_real_workers_merged_judged_and_served(toy_registered, tmp_path):
    """A real 2-worker MultiWorkerMirroredStrategy job whose workers record the toy family in a
    custom loop (tests/toy_job_child.py): the served job puts worker 1's counts on global replica
    1 and its rule names that replica; the report says the same."""
    from bad_logs import wsgi_app

    logdir = str(tmp_path)
    outputs = _run_toy_job(logdir)
    assert all("the probe was closed" in output for output in outputs), outputs

    app, _ = wsgi_app(logdir)
    status, body = get_json(app, "/toy?run=toy_job")
    assert status == 200, body
    assert body == {
        "run": "toy_job",
        "replicas": [0, 1],
        "steps": [0, 1, 2],
        "counts": [[3, 1], [2, 0], [5, 4]],
    }
    status, body = get_json(app, "/runs")
    (entry,) = [e for e in body["runs"] if e["run"] == "toy_job"]
    assert entry["families"] == ["status", "toy"]
    status, body = get_json(app, "/findings?run=toy_job")
    toy = [f for f in body["findings"] if f["kind"] == "toy_zero"]
    assert [(f["replicas"], f["first_step"], f["count"]) for f in toy] == [([1], 1, 1)]
    report = report_lib.load(logdir, "toy_job")
    assert report.to_json()["runs"][0]["toy"] == [[3, 1], [2, 0], [5, 4]]


def test_toy_series_is_skipped_when_not_registered(tmp_path):
    import toy_family

    logdir = str(tmp_path)
    with registry.registered(toy_family.FAMILY):
        write_toy_run(logdir)  # writing needs the kind registered
    run_data = group.read_log_dir(logdir)["toy_run"]
    assert not hasattr(run_data, "toy")
    assert run_data.inputs.steps.size == 0
    assert np.array_equal(run_data.inputs.batch_size, np.zeros((0, 0)))


def test_the_core_imports_no_family():
    """No module of `core/` imports a family's module: the core reaches the families through the
    registry's descriptors and the recorders' public hooks (`core.recorder.Recorder`), as
    write/probe.py's docstring says."""
    import ast

    from tb_replica_plugin.write import probe

    core = os.path.join(os.path.dirname(registry.__file__), "core")
    imported = set()
    for name in sorted(os.listdir(core)):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(core, name), encoding="utf-8") as source:
            tree = ast.parse(source.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "tb_replica_plugin.families"
            ):
                imported.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                imported.update(
                    a.name for a in node.names if a.name.startswith("tb_replica_plugin.families")
                )
    assert imported == set()
    assert "through the\nrecorders' public hooks" in probe.__doc__


def test_run_data_unpickled_in_a_new_process_has_its_family_properties():
    """A reading pool's process sends `RunData` back: the process that unpickles it may not have
    made one yet (its properties come from the registry at the first `RunData`)."""
    import pickle
    import subprocess
    import sys

    sent = pickle.dumps(reader.RunData("run", notes=["a note"]))
    code = (
        "import pickle, sys; data = pickle.loads(sys.stdin.buffer.read()); "
        "print(data.inputs is data.series['inputs'], data.notes)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], input=sent, capture_output=True, timeout=120, check=True
    )
    assert done.stdout.decode().split() == ["True", "['a", "note']"]
