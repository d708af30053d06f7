"""Replica ready times (`step_time/replicas`): read, merge, `slow_replica`, route and report.

Pure numpy on synthetic samples (`replica_time_logs`), then event files written with
TensorBoard's own writer, read by `load` and served by the plugin in-process. No TensorFlow.
"""

import json
import os

import numpy as np
import pytest
from replica_time_logs import (
    STEPS,
    WARM_UP,
    devices_of,
    ready_points,
    ready_sample,
    shapes_document,
    write_logdir,
    write_run,
)

from tb_replica_plugin import analysis, group, reader
from tb_replica_plugin.families.inputs import schema as inputs_schema
from tb_replica_plugin.families.step_time import present, rules
from tb_replica_plugin.families.step_time import schema as step_time_schema
from tb_replica_plugin.read import judge
from tb_replica_plugin.report import load

SLOW = [0.020, 0.030]  # replica 1 needs 10 ms more per step than replica 0
THIRD = ("median per step over 3 logged windows",)


def build(replicas, points, devices=None, worker=None, num_workers=1, run="run"):
    """A run's `RunData` from samples: its shapes event and `points` of `step_time/replicas`."""
    devices = devices_of(replicas, "GPU", worker) if devices is None else devices
    document = shapes_document(replicas, devices, worker, num_workers)
    samples = {inputs_schema.TAG_SHAPES: [(0, np.asarray(document.encode()))]}
    if points is not None:
        samples[step_time_schema.TAG_REPLICA_TIME] = points
    return reader.build_run(run, samples)


def kinds(findings, kind="slow_replica"):
    return [f for f in findings if f.kind == kind]


def test_ready_times_are_read_with_the_runs_replicas():
    data = build([0, 1], ready_points(SLOW))
    ready = data.step_time.ready
    assert (ready.run, ready.replicas, ready.workers) == ("run", [0, 1], [])
    assert ready.devices == devices_of([0, 1])
    assert ready.steps.tolist() == list(STEPS)
    assert ready.ready_median.tolist() == [[WARM_UP, WARM_UP]] + [SLOW] * 3
    assert ready.ready_max.tolist() == [[WARM_UP + 0.005] * 2] + [[0.025, 0.035]] * 3
    assert np.allclose(ready.wait_median, [[0.0, 0.0]] + [[0.01, 0.0]] * 3)
    assert ready.window_steps.tolist() == [[1, 1]] + [[10, 10]] * 3
    # No per-worker timing in a single run: the old per-worker arrays are empty.
    assert data.step_time.workers == [] and data.step_time.busy.shape == (0, 0)
    assert data.notes == []
    # The first window holds one step (the warm-up): left out of the run's figures.
    assert rules.timed_windows(ready).tolist() == [False, True, True, True]
    median_ready, median_wait, max_ready = rules.ready_medians(ready)
    assert median_ready.tolist() == SLOW and max_ready.tolist() == [0.025, 0.035]
    assert np.allclose(median_wait, [0.01, 0.0])
    # Asked again (the findings, then the route body): the same arrays, read-only; another
    # series gets its own.
    assert rules.ready_medians(ready)[0] is median_ready and not median_ready.flags.writeable
    other = build([0, 1], ready_points([0.02, 0.02])).step_time.ready
    assert rules.ready_medians(other)[0].tolist() == [0.02, 0.02]
    assert rules.ready_medians(ready)[0].tolist() == SLOW


def test_a_replica_ready_at_30_ms_against_20_ms_is_slow():
    data = build([0, 1], ready_points(SLOW))
    (finding,) = judge.find_run(data)
    assert (finding.kind, finding.severity, finding.view) == (
        "slow_replica",
        "warning",
        "step_time",
    )
    assert (finding.replicas, finding.value, finding.threshold) == ([1], 1.5, 1.25)
    assert finding.name == "/job:localhost/replica:0/task:0/device:GPU:1"
    assert (finding.first_step, finding.last_step, finding.count) == (10, 30, 3)
    assert finding.message.startswith(
        "Replica 1 (GPU:1) is slow: it is ready 0.030 s after the step starts against 0.020 s "
        "for the other replicas (median per step over 3 logged windows; 1.50×), so they wait "
        "0.010 s per step for it at the all-reduce."
    )
    for words in ("throttled or busier GPU", "uneven shapes", "a branch on the data"):
        assert words in finding.message
    assert "CPU replicas" not in finding.message
    # Steps: the windows where it was over the threshold (not the warm-up).
    points = ready_points(SLOW)
    points[2] = (points[2][0], ready_sample([0.020, 0.021]))  # step 20: in step with replica 0
    (finding,) = judge.find_run(build([0, 1], points))
    assert (finding.first_step, finding.last_step, finding.count) == (10, 30, 2)


def test_equal_replicas_give_no_finding():
    assert judge.find_run(build([0, 1, 2, 3], ready_points([0.020] * 4))) == []
    # Twins up to timer noise, and a slow warm-up of one replica: nothing either.
    points = ready_points([0.0200, 0.0204, 0.0198, 0.0201])
    points[0] = (0, ready_sample([0.5, 2.0, 0.5, 0.5], window=1))
    assert judge.find_run(build([0, 1, 2, 3], points)) == []


def test_a_difference_below_the_minimum_seconds_is_noise():
    # 1.5x on millisecond steps: 1 ms more is not a slow replica at the default 5 ms.
    data = build([0, 1], ready_points([0.002, 0.003]))
    assert judge.find_run(data) == []
    sensitive = analysis.Thresholds(slow_replica_min_seconds=0.0005)
    assert [f.replicas for f in judge.find_run(data, sensitive)] == [[1]]
    # 10 ms more on 100 ms steps (1.1x) is below the factor.
    assert judge.find_run(build([0, 1], ready_points([0.100, 0.110]))) == []
    loose = analysis.Thresholds(slow_replica_factor=1.6)
    assert judge.find_run(build([0, 1], ready_points(SLOW)), loose) == []


def test_the_others_median_leaves_the_replica_out():
    # 4 replicas, two slow: each is compared with the median of the 3 others (one slow).
    findings = judge.find_run(build([0, 1, 2, 3], ready_points([0.02, 0.03, 0.02, 0.03])))
    assert [(f.replicas, f.value) for f in findings] == [([1], 1.5), ([3], 1.5)]
    # On CPU replicas the message says what contention for the host's cores can do.
    cpus = devices_of([0, 1], "CPU")
    (finding,) = judge.find_run(build([0, 1], ready_points(SLOW), devices=cpus))
    assert "Replica 1 (CPU:1) is slow" in finding.message
    assert "logical devices sharing the host's cores" in finding.message


def test_slow_replicas_found_among_candidates_equal_those_of_every_replica(monkeypatch):
    """The rule judges only the replicas whose median is above the others' (`_candidates`):
    its findings equal judging every replica, with medians on the thresholds exactly, and one
    replica alone."""
    # Replica 3 exactly 1.25 times the others' median, replica 7 just below it.
    medians = np.array([0.02, 0.02, 0.02, 0.025, 0.02, 0.05, 0.02, 0.0249, 0.02, 0.02, 0.03, 0.02])
    points = ready_points(list(medians))
    found_by_width = {}
    for width in (12, 7, 1):
        cut = [(step, value[:, :width]) for step, value in points]
        ready = build(list(range(width)), cut).step_time.ready
        found = rules.find_slow_replicas(ready)
        with monkeypatch.context() as patch:
            patch.setattr(rules, "_candidates", lambda values, positions, thresholds: positions)
            assert found == rules.find_slow_replicas(ready), width
        found_by_width[width] = [(f.replicas, f.value) for f in found]
    assert found_by_width == {
        12: [([3], 1.25), ([5], 2.5), ([10], 1.5)],
        7: [([3], 1.25), ([5], 2.5)],
        1: [],  # one replica: nobody to compare with
    }


def test_malformed_samples_are_skipped_with_a_note():
    points = ready_points(SLOW)
    points += [
        (40, np.zeros((3, 2))),  # 3 rows
        (50, np.zeros((4, 3))),  # 3 replicas in a run of 2
        (60, ready_sample([np.nan, 0.02])),
        (70, ready_sample([-0.01, 0.02])),
        (80, ready_sample(SLOW, window=0)),
        (90, np.array("not a tensor")),
    ]
    data = build([0, 1], points)
    assert data.step_time.ready.steps.tolist() == list(STEPS)
    assert data.notes == [
        "6 replica ready-time sample(s) skipped: each should be 4 rows of finite, non-negative "
        "values for the run's 2 replicas (step_time/replicas, docs/data-format.md)."
    ]
    assert [f.replicas for f in judge.find_run(data)] == [[1]]
    # Nothing readable: no series, the note says why.
    data = build([0, 1], [(0, np.zeros((4, 3)))])
    assert data.step_time is None and "1 replica ready-time sample(s) skipped" in data.notes[0]


def test_a_later_sample_at_a_step_wins_and_values_of_mixed_kinds_are_judged_each():
    points = ready_points(SLOW)
    points.insert(3, (20, ready_sample([0.04, 0.05])))  # step 20 written again: this one wins
    points.insert(1, (5, np.full((4, 2), "x")))  # strings of the right shape: skipped
    points.insert(2, (7, ready_sample([1, 2]).astype(np.int32)))  # integers: kept as float
    data = build([0, 1], points)
    ready = data.step_time.ready
    assert ready.steps.tolist() == [0, 7, 10, 20, 30]
    assert ready.ready_median.tolist() == [[WARM_UP] * 2, [1, 2], SLOW, [0.04, 0.05], SLOW]
    assert ready.ready_median.dtype == np.float64
    assert data.notes == [
        "1 replica ready-time sample(s) skipped: each should be 4 rows of finite, non-negative "
        "values for the run's 2 replicas (step_time/replicas, docs/data-format.md)."
    ]


def test_runs_without_the_tag_are_unchanged():
    data = build([0, 1], None)
    assert data.step_time is None and judge.find_run(data) == []
    assert present.listed(data) is False
    assert present.step_time_body(data, 2000) == {
        "run": "run",
        "workers": [],
        "steps": [],
        "busy": [],
        "lateness": [],
        "period": [],
        "median_busy": [],
        "median_lateness": [],
        "downsampled": False,
        "ready": None,
        "pss_workers": None,
    }
    thresholds = analysis.Thresholds()
    assert present.report_json(data, thresholds) == {
        "step_time": None,
        "replica_time": None,
        "pss_workers": None,
    }
    assert present.report_text(data, thresholds) == []


def worker_run(worker, replicas, medians, steps=STEPS, num_workers=2):
    return build(
        replicas,
        ready_points(medians, steps),
        worker=worker,
        num_workers=num_workers,
        run=f"job/worker_{worker}",
    )


def test_a_job_merges_ready_times_on_global_replicas():
    members = [
        worker_run(1, [2, 3], SLOW, STEPS),
        worker_run(0, [0, 1], [0.020, 0.021], STEPS + (40,)),  # a step worker_1 lacks
    ]
    job = group.merge_job("job", members)
    ready = job.step_time.ready
    assert (ready.replicas, ready.workers) == ([0, 1, 2, 3], ["worker_0"] * 2 + ["worker_1"] * 2)
    assert ready.devices[2] == "/job:worker/replica:0/task:1/device:GPU:0"
    assert ready.steps.tolist() == list(STEPS)
    assert ready.ready_median[1].tolist() == [0.020, 0.021, 0.020, 0.030]
    assert (
        "Replica ready times are compared at the 4 logged step(s) every worker has; 1 logged "
        "step(s) some workers lack are left out."
    ) in job.notes
    # Jobs without workers/step_time samples have no per-worker timing: no straggler rule.
    assert (
        job.step_time.workers == []
        and present.report_json(job, analysis.Thresholds())["step_time"] is None
    )
    (finding,) = judge.find_run(job)
    assert (finding.kind, finding.replicas, finding.value) == ("slow_replica", [3], 1.5)
    assert finding.message.startswith(
        "Replica 3 (GPU:1 on worker_1) is slow: it is ready 0.030 s after the step starts "
        "against 0.020 s for the other replicas of worker_1 (median per step over 3 logged "
        "windows; 1.50×)"
    )
    assert " On worker_1." not in finding.message  # named once, by the rule itself
    assert rules.slow_replicas(ready) == [3]


def test_replicas_of_different_workers_are_not_compared():
    # Every replica of worker_1 is 10 ms slower than worker_0's: the straggler rule's business.
    job = group.merge_job(
        "job", [worker_run(0, [0, 1], [0.02, 0.02]), worker_run(1, [2, 3], [0.03, 0.03])]
    )
    assert kinds(judge.find_run(job)) == []
    # A worker of one replica has nobody to be compared with.
    job = group.merge_job("job", [worker_run(0, [0], [0.02]), worker_run(1, [1], [0.03])])
    assert kinds(judge.find_run(job)) == []


def test_a_job_some_of_whose_workers_recorded_none_has_none():
    without = build([2, 3], None, worker=1, num_workers=2, run="job/worker_1")
    job = group.merge_job("job", [worker_run(0, [0, 1], SLOW), without])
    assert job.step_time is None
    assert (
        "Replica ready times are left out of the job: worker_1 recorded none (the other "
        "workers did); each worker's own run shows its own."
    ) in job.notes


def test_a_job_keeps_its_per_worker_timing_beside_the_ready_times():
    members = [worker_run(0, [0, 1], SLOW), worker_run(1, [2, 3], [0.02, 0.02])]
    for worker, member in enumerate(members):
        arrivals = [100.0 + step + 0.1 * worker for step in STEPS]
        member.samples[step_time_schema.TAG_STEP_TIME] = [
            (step, np.array([now, 1.0, 1.0])) for step, now in zip(STEPS, arrivals, strict=True)
        ]
    job = group.merge_job("job", members)
    assert job.step_time.workers == ["worker_0", "worker_1"]
    assert np.allclose(job.step_time.lateness[:, 1], 0.1)
    assert job.step_time.ready.replicas == [0, 1, 2, 3]
    assert [(f.kind, f.replicas) for f in judge.find_run(job)] == [("slow_replica", [1])]
    body = present.step_time_body(job, 2000)
    assert body["steps"] == list(STEPS) and body["ready"]["steps"] == list(STEPS)


def test_route_body_of_a_single_run():
    data = build([0, 1], ready_points(SLOW))
    body = present.step_time_body(data, 2000)
    assert present.listed(data) is True
    assert body["steps"] == [] and body["workers"] == [] and body["busy"] == []
    ready = body["ready"]
    assert ready["replicas"] == [0, 1] and ready["workers"] == []
    assert ready["steps"] == list(STEPS) and ready["downsampled"] is False
    assert ready["warm_up"] is True  # the first window (one step) is left out of the figures
    assert ready["median"] == [[WARM_UP, WARM_UP]] + [SLOW] * 3
    assert ready["max"] == [[WARM_UP + 0.005] * 2] + [[0.025, 0.035]] * 3
    assert np.allclose(ready["wait"], [[0, 0]] + [[0.01, 0]] * 3)
    assert ready["median_ready"] == SLOW and ready["max_ready"] == [0.025, 0.035]
    assert np.allclose(ready["median_wait"], [0.01, 0.0])
    assert "pooled" not in ready
    # Beyond max_points: bucket means of the medians and waits, maxima of the maxima.
    small = present.step_time_body(data, 2)["ready"]
    assert small["downsampled"] is True and small["steps"] == [0, 20]
    assert np.allclose(small["median"], [[0.26, 0.265], SLOW])
    assert np.allclose(small["max"], [[0.505, 0.505], [0.025, 0.035]])
    assert small["median_ready"] == SLOW  # the run's figures are not bucketed


def test_route_body_cuts_many_replicas_to_blocks():
    medians = [0.02] * 6
    medians[4] = 0.05
    body = present.step_time_body(build(list(range(6)), ready_points(medians)), 2000, 3)
    ready = body["ready"]
    assert ready["pooled"] == {"blocks": [[0, 1], [2, 3], [4, 5]]}
    assert ready["median"][1] == [0.02, 0.02, 0.05]  # the slowest of each block
    assert ready["median_ready"] == medians  # per replica


def test_report_json_and_text():
    data = build([0, 1], ready_points(SLOW))
    thresholds = analysis.Thresholds()
    block = present.report_json(data, thresholds)
    assert block["step_time"] is None
    assert block["replica_time"] == {
        "replicas": [0, 1],
        "workers": [],
        "windows": 3,
        "median_ready": SLOW,
        "median_wait": [0.01, 0.0],
        "max_ready": [0.025, 0.035],
        "slow_replicas": [1],
    }
    assert present.report_text(data, thresholds) == [
        "  replica ready time per step (medians over 3 logged window(s); waits: for the slowest "
        "replica of its worker):",
        "    replica 0 (GPU:0): ready 0.020 s, waits 0.010 s, max 0.025 s",
        "    replica 1 (GPU:1): ready 0.030 s, waits 0.000 s, max 0.035 s  <- slow_replica",
    ]
    # Many replicas: the TEXT_REPLICAS slowest, in replica order.
    medians = [0.02] * 20
    medians[17] = 0.04
    lines = present.report_text(build(list(range(20)), ready_points(medians)), thresholds)
    assert len(lines) == 1 + present.TEXT_REPLICAS + 1
    assert "replica 17 (GPU:17): ready 0.040 s" in lines[-2] and "slow_replica" in lines[-2]
    assert lines[-1] == "    … 4 faster replicas (see --json)"


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    return write_logdir(str(tmp_path_factory.mktemp("replica_time")))


def test_event_files_read_back_by_load(logdir):
    report = load(logdir)
    assert sorted(report.runs) == ["even_gpus", "job", "slow_gpu"]
    assert [(f.kind, f.replicas) for f in report.findings["slow_gpu"]] == [("slow_replica", [1])]
    assert report.findings["even_gpus"] == []
    assert [(f.kind, f.replicas) for f in report.findings["job"]] == [("slow_replica", [3])]
    ready = report.runs["job"].step_time.ready
    assert ready.workers == ["worker_0", "worker_0", "worker_1", "worker_1"]
    assert ready.ready_median[-1].tolist() == [0.020, 0.021, 0.020, 0.030]
    document = {run["run"]: run for run in report.to_json()["runs"]}
    assert document["slow_gpu"]["replica_time"]["slow_replicas"] == [1]
    assert document["job"]["replica_time"]["slow_replicas"] == [3]
    assert document["job"]["step_time"] is None  # the synthetic job has no per-worker timing
    text = report.to_text()
    assert "    replica 3 (GPU:1 on worker_1): ready 0.030 s, waits 0.000 s" in text


def test_routes_serve_ready_times(logdir):
    from test_store import get_json, serve

    client, _, _, _ = serve(logdir)
    _, runs = get_json(client, "/runs")
    families = {r["run"]: r["families"] for r in runs["runs"]}
    assert all("step_time" in names for names in families.values())
    status, body = get_json(client, "/step_time?run=slow_gpu&replica_blocks=2")
    assert status == 200 and body["steps"] == [] and body["workers"] == []
    ready = body["ready"]
    assert ready["pooled"] == {"blocks": [[0, 1], [2, 3]]}
    assert ready["median"][-1] == [0.030, 0.020]
    assert ready["median_ready"] == [0.020, 0.030, 0.020, 0.020]
    status, job = get_json(client, "/step_time?run=job")
    assert status == 200 and [w["name"] for w in job["workers"]] == ["worker_0", "worker_1"]
    assert job["ready"]["workers"] == ["worker_0", "worker_0", "worker_1", "worker_1"]
    assert job["ready"]["median"][-1] == [0.020, 0.021, 0.020, 0.030]
    _, findings = get_json(client, "/findings?run=job")
    assert [(f["kind"], f["replicas"]) for f in findings["findings"]] == [("slow_replica", [3])]
    # A worker's own run has its own replicas' ready times.
    _, own = get_json(client, "/step_time?run=job/worker_1")
    assert own["ready"]["replicas"] == [2, 3] and own["ready"]["workers"] == []
    assert get_json(client, "/step_time?run=slow_gpu&replica_blocks=1")[0] == 400


def test_a_run_written_without_ready_times_serves_the_old_body(tmp_path):
    from test_store import get_json, serve

    write_run(str(tmp_path), "old", [0, 1], None)
    client, _, _, _ = serve(str(tmp_path))
    _, runs = get_json(client, "/runs")
    assert "step_time" not in runs["runs"][0]["families"]
    _, body = get_json(client, "/step_time?run=old")
    assert body["ready"] is None and body["steps"] == [] and body["workers"] == []
    assert json.loads(json.dumps(body)) == body


def test_a_job_growing_ready_times_answers_as_a_fresh_read(logdir, tmp_path):
    """New steps of the workers' ready times are merged in place (the job is not read again)."""
    import shutil

    from test_store import get_json, serve

    from benchmarks import live_job

    shutil.copytree(os.path.join(logdir, "job"), str(tmp_path / "job"))
    client, _, plugin, _ = serve(str(tmp_path))
    paths = ["/step_time?run=job&replica_blocks=2", "/findings?run=job"]
    [get_json(client, path) for path in paths]
    live_job.append_steps(str(tmp_path / "job"), 2, heartbeat=False)
    after = [get_json(client, path) for path in paths]
    assert after[0][1]["ready"]["steps"][-2:] == [31, 32]
    assert plugin.store.computed["read"] == 1 and plugin.store.computed["refresh"] == 1
    fresh, _, _, _ = serve(str(tmp_path))
    assert after == [get_json(fresh, path) for path in paths]


def test_a_workers_step_timing_reads_alike_as_a_column_and_as_a_list():
    from tb_replica_plugin.core.columns import Column
    from tb_replica_plugin.families.step_time.merge import worker_step_times

    steps = np.array([0, 1, 1, 2], np.int64)  # step 1 twice: the later (2.0) wins
    values = np.array([[0.5, 0.1, 0.2], [1.0, 0.1, 0.2], [2.0, 0.1, 0.2], [3.0, 0.1, 0.2]])
    as_list = worker_step_times(list(zip(steps.tolist(), values, strict=True)))
    as_column = worker_step_times(Column(steps, values.astype(np.float32)))
    assert as_list[0].tolist() == as_column[0].tolist() == [0, 1, 2]
    assert as_list[1][:, 0].tolist() == [0.5, 2.0, 3.0]
    np.testing.assert_array_equal(as_column[1], as_list[1].astype(np.float32))
    assert as_column[1].dtype == np.float64
    # Values of another length: NaN rows, as for a list.
    odd = worker_step_times(Column(steps[:2], np.zeros((2, 2))))
    assert np.isnan(odd[1]).all() and odd[1].shape == (2, 3)


def test_column_medians_equal_np_median_over_steps():
    values = np.random.default_rng(4).choice([0.01, 0.02, 0.5, np.inf, 3.0], size=(7, 6))
    values[2, 3] = np.nan  # a NaN window: NaN, as np.median gives
    for rows in (values, values[:6], values[:1]):
        np.testing.assert_array_equal(rules._column_medians(rows), np.median(rows, axis=0))
