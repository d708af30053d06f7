"""Merging workers into one job, as pure logic on hand-made worker series (no TensorFlow job):
their order and a missing one, cross-worker example overlaps, gradients and their non-finite
events, and the straggler rule. tests/test_multiworker.py reads a real 2-worker job.
"""

import numpy as np

from tb_replica_plugin import analysis, group, reader
from tb_replica_plugin.core import jobs
from tb_replica_plugin.families.examples import read as examples_read
from tb_replica_plugin.families.gradients import present as gradients_present
from tb_replica_plugin.families.gradients import read as gradients_read
from tb_replica_plugin.families.gradients import rules as gradients_rules
from tb_replica_plugin.families.inputs import read as inputs_read
from tb_replica_plugin.families.step_time import read as step_time_read
from tb_replica_plugin.families.step_time import rules as step_time_rules
from tb_replica_plugin.families.step_time import schema as step_time_schema

DEVICE = "/job:worker/replica:0/task:{}/device:CPU:0"


def _member(run, worker, replicas, sizes, steps, times=None):
    series = inputs_read.build_inputs_series(
        run,
        [
            {
                "step": steps[0],
                "inputs": [
                    {
                        "name": "x",
                        "dtypes": ["float32"] * len(replicas),
                        "shapes": [[s, 3] for s in sizes],
                        "mismatch": False,
                        "mismatch_dims": [],
                    }
                ],
                "devices": [DEVICE.format(worker) for _ in replicas],
                "replicas": replicas,
                "source": "custom_loop",
                "worker": {
                    "task_type": "worker",
                    "task_index": worker,
                    "worker": worker,
                    "num_workers": 3,
                    "job": "abc",
                },
            }
        ],
        [(s, np.array([sizes, sizes, sizes])) for s in steps],
    )
    samples = {}
    if times is not None:
        samples[step_time_schema.TAG_STEP_TIME] = [
            (s, np.array(t)) for s, t in zip(steps, times, strict=True)
        ]
    return reader.RunData(run=run, inputs=series, samples=samples, notes=[])


def test_merge_job_orders_workers_and_notes_a_missing_one():
    times_0 = [[10.0, np.nan, np.nan], [10.5, 0.5, 0.5]]
    times_2 = [[10.2, np.nan, np.nan], [10.5, 0.3, 0.3]]
    members = [
        _member("j/worker_2", 2, [4, 5], [3, 3], [0, 1], times_2),
        _member("j/worker_0", 0, [0, 1], [4, 4], [0, 1], times_0),
    ]
    job = group.merge_job("j", members)
    assert [w["name"] for w in job.workers] == ["worker_0", "worker_2"]
    assert job.inputs.replicas == [0, 1, 4, 5]
    assert job.inputs.batch_size.tolist() == [[4, 4, 3, 3], [4, 4, 3, 3]]
    assert job.inputs.dense.shape == (2, 3, 4)
    assert any("Only 2 of the job's 3 workers" in note and "[1]" in note for note in job.notes)
    timing = job.step_time
    np.testing.assert_allclose(timing.lateness, [[0.0, 0.2], [0.0, 0.0]])
    # busy = period - (latest arrival - own arrival)
    np.testing.assert_allclose(timing.busy[1], [0.5, 0.3])


def _data_member(replica, fingerprints, window=1):
    """A worker's `DataSeries` (one replica) at steps 0.. from its distinct examples per step."""
    size = 16
    rows, counts = [], []
    for examples in fingerprints:
        unique = np.unique(np.asarray(examples, np.int64))
        sketch = np.zeros(size, np.int64)
        sketch[: min(size, unique.size)] = unique[:size]
        rows.append(sketch)
        counts.append(unique.size)
    steps = len(rows)
    counts = np.array(counts, np.int64)[:, None]
    return examples_read.DataSeries(
        run=f"j/worker_{replica}",
        replicas=[replica],
        steps=np.arange(steps, dtype=np.int64) * window + window - 1,
        window_steps=np.full(steps, window, np.int64),
        batch_size=counts.copy(),
        distinct=counts.copy(),
        duplicated=np.zeros((steps, 1), np.int64),
        window_duplicated=np.zeros((steps, 1), np.int64),
        shared=counts[:, :, None].copy(),
        window_shared=counts[:, :, None] * window,
        steps_shared=np.full((steps, 1, 1), window, np.int64),
        sketch=np.stack(rows)[:, None, :],
        notes=[],
    )


def test_cross_worker_data_exact_and_estimated():
    workers = [{"name": f"worker_{i}", "replicas": [i], "run": f"j/worker_{i}"} for i in (0, 1)]
    rng = np.random.default_rng(3)
    pool = rng.integers(-(2**62), 2**62, size=400)
    # Step 0: 8 examples each, 3 shared (exact). Step 1: 200 each, 100 shared (estimated).
    first = [pool[:8], pool[100:200].tolist() + pool[200:300].tolist()]
    second = [pool[5:13], pool[100:200].tolist() + pool[300:400].tolist()]
    members = [
        reader.RunData(run=w["run"], inputs=None, samples={}, notes=[], data=_data_member(i, f))
        for i, (w, f) in enumerate(zip(workers, [first, second], strict=True))
    ]
    notes = []
    merged = jobs.merge_all(examples_read.ExamplesMerger, "j", members, workers, notes)
    assert merged.replicas == [0, 1]
    assert merged.shared[0].tolist() == [[8, 3], [3, 8]]
    assert merged.duplicated[0].tolist() == [3, 3]
    estimate = merged.shared[1, 0, 1]
    assert merged.shared[1, 1, 0] == estimate and 40 <= estimate <= 160  # true value: 100
    assert any("at 1 of 2 logged step(s)" in note and "estimated" in note for note in notes)
    assert examples_read.sketch_overlap(np.array([1, 2, 3, 0]), 3, np.array([2, 3, 5, 0]), 3) == (
        2,
        True,
    )
    # Logged every 5th step: the cross-worker window counts are extrapolated (and noted).
    members = [
        reader.RunData(run=w["run"], inputs=None, samples={}, notes=[], data=_data_member(i, f, 5))
        for i, (w, f) in enumerate(zip(workers, [[pool[:8]], [pool[:8]]], strict=True))
    ]
    notes = []
    merged = jobs.merge_all(examples_read.ExamplesMerger, "j", members, workers, notes)
    assert merged.steps.tolist() == [4]
    assert merged.window_shared[0].tolist() == [[40, 40], [40, 40]]
    assert merged.steps_shared[0].tolist() == [[5, 5], [5, 5]]
    assert any("extrapolated" in note for note in notes)
    # Pair matrices beyond the memory bound: not computed, and noted (the workers keep theirs).
    original = examples_read.MAX_PAIR_BYTES
    examples_read.MAX_PAIR_BYTES = 95  # one step × 2² pairs × 3 int64 arrays is 96 bytes
    try:
        notes = []
        assert jobs.merge_all(examples_read.ExamplesMerger, "j", members, workers, notes) is None
        assert any("1 logged steps × 2² replica pairs" in note for note in notes)
    finally:
        examples_read.MAX_PAIR_BYTES = original
    # A worker without data: the job has none, and says why.
    members[1].data = None
    notes = []
    assert jobs.merge_all(examples_read.ExamplesMerger, "j", members, workers, notes) is None
    assert any("worker_1 recorded no example fingerprints" in note for note in notes)


GRADIENT_WORKERS = [
    {"name": f"worker_{i}", "replicas": [i], "run": f"j/worker_{i}"} for i in (0, 1)
]


def gradients_member(replica, steps, events, scaling="as_given"):
    """Worker `replica`'s run `j/worker_<replica>` (one replica) holding only gradients: global
    norms `0, 1, ...` + replica at `steps`, every per-variable norm replica + 1, and `events`
    `{step: NaN count}` of its gradients."""
    series = gradients_read.GradientsSeries(
        run=f"j/worker_{replica}",
        replicas=[replica],
        variables=["k"],
        shapes=[[2]],
        has_loss=True,
        scaling=scaling,
        steps=np.array(steps, np.int64),
        global_norm=np.arange(len(steps), dtype=float)[:, None] + replica,
        loss=np.ones((len(steps), 1)),
        variable_norms=np.ones((len(steps), 1, 1)) * (replica + 1),
        nonfinite_steps=np.array(sorted(events), np.int64),
        nonfinite=np.array([[[n], [0], [0], [0]] for _, n in sorted(events.items())]).reshape(
            -1, 4, 1
        ),
    )
    run = f"j/worker_{replica}"
    return reader.RunData(run=run, inputs=None, samples={}, notes=[], gradients=series)


def test_cross_worker_gradients_keep_every_nonfinite_event():
    notes = []
    merged = jobs.merge_all(
        gradients_read.GradientsMerger,
        "j",
        [gradients_member(0, [0, 2, 4], {3: 5}), gradients_member(1, [0, 2], {1: 2, 3: 1})],
        GRADIENT_WORKERS,
        notes,
    )
    assert merged.steps.tolist() == [0, 2]
    assert merged.global_norm.tolist() == [[0.0, 1.0], [1.0, 2.0]]
    assert merged.variable_norms[:, 0].tolist() == [[1.0, 2.0], [1.0, 2.0]]
    assert merged.nonfinite_steps.tolist() == [1, 3]
    assert merged.nonfinite[:, 0].tolist() == [[0, 2], [5, 1]]
    assert any("every worker logged" in note for note in notes)
    found = gradients_rules.find_gradients(merged)
    assert [(f.kind, f.replicas, f.first_step) for f in found] == [
        ("nonfinite_gradients", [1], 1),
        ("nonfinite_gradients", [0], 3),
    ]


def test_job_gradient_ratios_are_kept_for_rows_no_worker_wrote_again():
    """The job's ratio to the median is computed for new and rewritten rows only, and equals
    `ratio_to_median` of the whole job at every result."""

    def member(replica, steps, norms):
        base = gradients_member(replica, steps, {})
        base.gradients.global_norm = np.array(norms, float)[:, None]
        return base

    merger = gradients_read.GradientsMerger(2)
    merger.add(0, member(0, [0, 1, 2], [1.0, 2.0, 3.0]), None)
    merger.add(1, member(1, [0, 1, 2], [2.0, 2.0, 9.0]), None)
    first = merger.result("j", [0, 1], GRADIENT_WORKERS, [])
    expected = gradients_rules.ratio_to_median(first.global_norm)
    np.testing.assert_array_equal(gradients_rules.global_ratio(first), expected)
    # Worker 1 rewrites its last step (read again from it) and adds one.
    merger.add(1, member(1, [2, 3], [1.0, 4.0]), 2)
    merger.add(0, member(0, [3], [8.0]), 2)
    second = merger.result("j", [0, 1], GRADIENT_WORKERS, [])
    expected = gradients_rules.ratio_to_median(second.global_norm)
    np.testing.assert_array_equal(gradients_rules.global_ratio(second), expected)
    assert second.global_norm.tolist() == [[1.0, 2.0], [2.0, 2.0], [3.0, 1.0], [8.0, 4.0]]
    assert gradients_rules.global_ratio(second)[2:].tolist() == [[3.0, 1 / 3], [2.0, 0.5]]


def test_job_of_workers_with_different_gradient_scalings_is_labelled_so():
    """A job whose workers recorded different gradient scalings (one `fit` with Keras's own
    loss, one custom loop, say) is not labelled "gradients as given" in the report."""

    def head(scalings):
        notes = []
        members = [gradients_member(r, [0, 1], {}, scaling) for r, scaling in enumerate(scalings)]
        merged = jobs.merge_all(
            gradients_read.GradientsMerger, "j", members, GRADIENT_WORKERS, notes
        )
        (line,) = [line for line in gradients_present.gradients_text(merged) if "variable" in line]
        return merged.scaling, line, notes

    scaling, line, notes = head(["replica_loss", "as_given"])
    assert scaling == "as_given,replica_loss"
    assert line == (
        "  gradients (scalings differ across workers: gradients as given, gradient of each "
        "replica's own loss; norms not comparable across workers), 2 logged step(s) 0–1, "
        "1 variable(s):"
    )
    assert notes == [
        "The workers recorded gradients of different scalings (worker_0: gradient of each "
        "replica's own loss; worker_1: gradients as given): the norms of replicas on different "
        "workers are not comparable."
    ]
    scaling, line, notes = head(["as_given", "as_given"])
    assert (scaling, notes) == ("as_given", [])
    assert line == "  gradients (gradients as given), 2 logged step(s) 0–1, 1 variable(s):"


def test_straggler_thresholds():
    steps = np.arange(5)
    busy = np.array([[np.nan] * 3] + [[0.10, 0.11, 0.30]] * 4)
    timing = step_time_read.StepTimeSeries(
        run="j",
        workers=["worker_0", "worker_1", "worker_2"],
        steps=steps,
        arrival=np.zeros((5, 3)),
        period=np.full((5, 3), 0.3),
        window_mean=np.full((5, 3), 0.3),
        lateness=np.zeros((5, 3)),
        busy=busy,
    )
    workers = [{"name": f"worker_{i}", "replicas": [i]} for i in range(3)]
    found = step_time_rules.find_stragglers(timing, workers)
    assert [(f.name, f.value, f.first_step, f.count) for f in found] == [
        ("worker_2", round(0.30 / 0.11, 3), 2, 3)
    ]
    assert not step_time_rules.find_stragglers(
        timing, workers, analysis.Thresholds(straggler_factor=3)
    )
    # Millisecond steps: a 2x slower worker within timer noise is not reported.
    tiny = step_time_read.StepTimeSeries(**{**timing.__dict__, "busy": busy / 100})
    assert not step_time_rules.find_stragglers(tiny, workers)


def test_a_workers_context_starts_at_its_last_two_distinct_steps_in_order_or_not():
    """A worker keeps each tag's samples from the first of its last `CONTEXT_STEPS` distinct
    steps: read from the end when the steps are in order, the same as sorting them all."""
    from tb_replica_plugin import group

    rng = np.random.default_rng(5)
    for trial in range(300):
        steps = np.sort(rng.integers(0, rng.integers(1, 12), size=rng.integers(1, 9)))
        if trial % 3 == 0:
            steps = rng.permutation(steps)  # a step written again after later ones
        want = np.unique(steps)[-group.CONTEXT_STEPS :][0]
        assert group.context_start(steps) == want, steps
    assert group.context_start(np.array([4, 4, 4])) == 4
    assert group.context_start(np.array([1, 2, 2, 3, 3])) == 2
