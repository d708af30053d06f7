"""Step time under `ParameterServerStrategy`: the workers' totals (`step_time/pss_workers`), the
`pss_straggler` rule and the `slow_replica` wording, on synthetic samples. Pure numpy, no
TensorFlow (tests/test_pss.py runs them on a real cluster).
"""

import numpy as np

from tb_replica_plugin import analysis
from tb_replica_plugin.families.step_time import present, read, rules, schema

PSS = "ParameterServerStrategy"
DEVICES = [f"/job:worker/replica:0/task:{w}/device:CPU:0" for w in range(3)]


def totals_sample(steps, busy, span):
    """A `step_time/pss_workers` value as the coordinator writes it."""
    steps, busy, span = (np.asarray(v, np.float64) for v in (steps, busy, span))
    rate = np.where(span > 0, steps / np.where(span > 0, span, 1), 0.0)
    return np.stack([steps, busy, span, rate])


def ready_series(seconds, window_steps=1):
    """A PSS run's `ReplicaTimeSeries`: each worker's step seconds per window, [S, W]."""
    seconds = np.asarray(seconds, np.float64)
    count = seconds.shape[1]
    return read.ReplicaTimeSeries(
        run="run",
        replicas=list(range(count)),
        devices=DEVICES[:count],
        workers=[],
        steps=np.arange(seconds.shape[0]),
        ready_median=seconds,
        ready_max=seconds * 1.1,
        wait_median=np.zeros_like(seconds),
        window_steps=np.full(seconds.shape, window_steps, np.int64),
        strategy=PSS,
    )


def series_of(sample, ready=None, step=11):
    notes = []
    totals = read.read_pss_totals([(step, sample)], notes)
    assert notes == []
    series = read.StepTimeSeries.of_replicas("run", ready)
    series.pss = totals
    return series


def test_a_worker_running_fewer_slower_steps_is_a_pss_straggler():
    # Worker 1: 12 steps of 1.05 s over 13.3 s (0.9 steps/s); workers 0 and 2: 30 and 31.
    sample = totals_sample([30, 12, 31], [9.3, 12.6, 9.6], [9.7, 13.3, 10.0])
    series = series_of(sample)
    (finding,) = rules.find_pss_stragglers(series)
    assert finding.kind == "pss_straggler" and finding.severity == "warning"
    assert finding.replicas == [1] and finding.count == 12
    assert (finding.first_step, finding.last_step) == (0, 11)
    base_rate, rate = np.median([30 / 9.7, 31 / 10.0]), 12 / 13.3
    assert finding.value == round(base_rate / rate, 3) == 3.432
    assert finding.threshold == 1.5
    assert finding.message.startswith(
        "Worker 1 ran 12 steps at 0.90 steps/s while the others ran 30.5 at 3.10 steps/s "
        "(median); its steps take 1.050 s against 0.310 s (median of the others)."
    )
    assert "asynchronous training its updates fall behind" in finding.message
    body = present.pss_workers_json(series)
    assert body["steps_run"] == [30, 12, 31] and body["stragglers"] == [1]
    assert body["step_seconds"] == [0.31, 1.05, round(9.6 / 31, 6)]
    lines = present.pss_workers_lines(series, analysis.Thresholds())
    assert lines[2] == "    worker 1: ran 12 steps, 12.6 s busy (1.050 s/step), 0.90 steps/s" + (
        "  <- pss_straggler"
    )


def test_each_threshold_alone_keeps_a_worker_out():
    base = analysis.Thresholds()
    # Rates 2.0 against 2.9 (1.45x < 1.5x): not a straggler.
    sample = totals_sample([30, 20], [9.0, 10.0], [10.3, 10.0])
    assert rules.find_pss_stragglers(series_of(sample), base) == []
    # 3x slower but only 4 steps fewer (a short run: steps go to the free worker).
    sample = totals_sample([6, 2], [0.6, 0.6], [0.6, 0.6])
    assert rules.find_pss_stragglers(series_of(sample), base) == []
    found = rules.find_pss_stragglers(
        series_of(sample), analysis.Thresholds(pss_straggler_min_steps=4)
    )
    assert [f.replicas for f in found] == [[1]]
    # Fewer steps per second, yet its steps are as fast: the gap is not in its steps.
    sample = totals_sample([40, 10], [0.04, 0.0105], [1.0, 1.0])
    assert rules.find_pss_stragglers(series_of(sample), base) == []


def test_the_window_medians_judge_the_step_seconds_not_the_warm_up():
    # Worker 1's mean per step is 0.02 s, from its first step (0.05 s); its later steps 0.002 s.
    sample = totals_sample([30, 10], [0.06, 0.2], [1.0, 1.0])
    assert rules.pss_step_seconds(series_of(sample)).tolist() == [0.002, 0.02]
    ready = ready_series([[0.05, 0.05], [0.002, 0.002], [0.002, 0.002]])
    series = series_of(sample, ready)
    assert rules.pss_step_seconds(series).tolist() == [0.002, 0.002]
    assert rules.find_pss_stragglers(series) == []


def test_a_worker_that_ran_no_step_is_named():
    sample = totals_sample([25, 0], [2.5, 0.0], [2.5, 0.0])
    (finding,) = rules.find_pss_stragglers(series_of(sample, step=24))
    assert finding.replicas == [1] and finding.count == 0 and finding.value == float("inf")
    assert finding.message.startswith(
        "Worker 1 ran 0 steps at 0.00 steps/s while the others ran 25 at 10.00 steps/s "
        "(median). Under ParameterServerStrategy"
    )


def test_malformed_totals_are_skipped_with_a_note():
    notes = []
    good = totals_sample([3, 2], [0.3, 0.2], [0.3, 0.2])
    points = [(0, good), (1, good[:3]), (2, -good), (3, np.full((4, 2), np.nan))]
    totals = read.read_pss_totals(points, notes)
    assert totals.step == 0 and totals.steps_run.tolist() == [3, 2]
    assert len(notes) == 1 and notes[0].startswith("3 worker totals sample(s) skipped")
    assert schema.TAG_PSS_WORKERS in notes[0]


def test_slow_replica_under_pss_says_worker_and_needs_enough_steps():
    slow = [[0.010, 0.050]] * 7  # worker 1's steps 40 ms longer, 7 windows of one step
    found = rules.find_slow_replicas(ready_series(slow))
    (finding,) = found
    assert finding.replicas == [1]
    assert finding.message.startswith(
        f"Worker 1 ({DEVICES[1]}) is slow: its steps take 0.050 s against 0.010 s for the other "
        "workers (median per step over 6 logged windows; 5.00×)"
    )
    assert "all-reduce" not in finding.message
    # 4 timed steps (the first window left out) are below pss_straggler_min_steps (5).
    assert rules.find_slow_replicas(ready_series(slow[:5])) == []
    # Under this strategy the floor is straggler_min_seconds (0.01), not 0.005.
    assert rules.find_slow_replicas(ready_series([[0.010, 0.018]] * 7)) == []
    lines = present.replica_time_lines(ready_series(slow), analysis.Thresholds())
    assert lines[2] == "    worker 1: step 0.050 s, max 0.055 s  <- slow_replica"


def test_find_names_a_pss_straggler_once():
    class RunData:  # what `rules.find` reads of a run
        workers = []
        step_time = series_of(
            totals_sample([30, 7], [0.3, 0.35], [1.0, 1.0]), ready_series([[0.010, 0.050]] * 7)
        )

    kinds = [(f.kind, f.replicas) for f in rules.find(RunData())]
    assert kinds == [("pss_straggler", [1])]
