"""A large job's first read shared with a helper process (`shared_read`): a real job's event
files (`benchmarks.job_scale`'s, 4 workers), read by a real helper process beside this one.

What the helper read must equal a read in one process (every family's series and notes), later
refreshes read on from the helper's tails (only what was appended), and a helper that dies or
hangs leaves the rest to this process within a bounded wait, warning once.
"""

import dataclasses
import logging
import os
import sys
import time

import numpy as np
import pytest
from test_columns import _same
from test_live_job import _write_job

from benchmarks import live_job
from tb_replica_plugin import group, shared_read
from tb_replica_plugin.read.sources import FileSource

WORKERS = 4
RUNS = [f"job/worker_{i}" for i in range(WORKERS)]


@pytest.fixture(scope="module")
def job_logs(tmp_path_factory):
    """`job_scale`'s job, 4 workers x 2 replicas x 4 logged steps (copied per test: appended)."""
    logdir = str(tmp_path_factory.mktemp("shared"))
    _write_job(logdir, WORKERS)
    return logdir


@pytest.fixture
def logdir(job_logs, tmp_path):
    import shutil

    copy = str(tmp_path / "logs")
    shutil.copytree(job_logs, copy)
    return copy


@pytest.fixture
def shared(monkeypatch):
    """Every job worth a helper, and what the helpers did: `taken` (workers sent by a helper),
    `helpers` (their `_Helper`s). The first worker read here waits 1 s: the helper announces
    the next ones meanwhile."""
    monkeypatch.setattr(shared_read, "MIN_RUNS", 2)
    monkeypatch.setattr(shared_read, "MIN_BYTES", 0)
    monkeypatch.setattr(shared_read, "_warned", False)
    record = {"taken": [], "helpers": []}
    take, start, read_here = (
        shared_read._Helper.take,
        shared_read._Helper.__init__,
        shared_read._read_here,
    )

    def counted_take(self, index, member):
        got = take(self, index, member)
        if got is not None:
            record["taken"].append(index)
        return got

    def recorded_start(self, runs):
        start(self, runs)
        record["helpers"].append(self)

    def slow_first(member, index, helper):
        if index == 0:
            time.sleep(1.0)
        return read_here(member, index, helper)

    monkeypatch.setattr(shared_read._Helper, "take", counted_take)
    monkeypatch.setattr(shared_read._Helper, "__init__", recorded_start)
    monkeypatch.setattr(shared_read, "_read_here", slow_first)
    return record


def _state(logdir):
    state = group.GroupState("job", RUNS, FileSource(logdir), "", shared=True)
    state.refresh()
    return state


def _in_one_process(logdir, monkeypatch):
    with monkeypatch.context() as patch:
        patch.setenv(shared_read.SHARED_READ_ENV, "0")
        return _state(logdir)


def _same_job(state, reference):
    """The job's series, notes and workers are equal; the variables' fingerprint rows as each
    copy's row (a table that grew on keeps rows a fresh read does not hold)."""
    got, expected = state.data(include_live=True), reference.data(include_live=True)
    assert list(got) == list(expected) == ["job"]
    _same(got["job"].notes, expected["job"].notes, "notes")
    _same(got["job"].workers, expected["job"].workers, "workers")
    for name, series in got["job"].series.items():
        other = expected["job"].series[name]
        if name != "variables":
            _same(series, other, name)
            continue
        for field in dataclasses.fields(series):
            if field.name not in ("rows", "row_of"):
                _same(getattr(series, field.name), getattr(other, field.name), field.name)
        _same(_copies(series), _copies(other), "variables' rows of each copy")


def _copies(variables):
    """float64 [S, V, R, D]: each copy's fingerprint row (NaN where it has none)."""
    rows = np.concatenate([variables.rows, np.full((1, variables.rows.shape[1]), np.nan)])
    return rows[np.where(variables.row_of >= 0, variables.row_of, len(variables.rows))]


def test_a_job_read_with_a_helper_equals_a_read_in_one_process_and_reads_on(
    logdir, shared, monkeypatch
):
    state = _state(logdir)
    assert shared["taken"] == [1, 2, 3]  # announced while worker 0 was read here
    assert state.data()["job"].inputs.batch_size.shape == (4, 2 * WORKERS)
    _same_job(state, _in_one_process(logdir, monkeypatch))
    (helper,) = shared["helpers"]
    assert helper._process.returncode == 0 and not os.path.exists(helper._directory)

    # The workers the helper read are read on from its tails: only what was appended.
    read_before = state.values_read
    appended = live_job.append_steps(os.path.join(logdir, "job"), 3)
    state.refresh()
    assert state.values_read - read_before == appended > 0
    assert state.full_reads == 1
    assert state.data()["job"].inputs.steps.tolist() == list(range(7))
    _same_job(state, _in_one_process(logdir, monkeypatch))


def test_a_small_job_or_the_switch_reads_in_one_process(logdir, monkeypatch):
    members = group.GroupState("job", RUNS, FileSource(logdir), "").members
    assert not shared_read.worth_sharing(members)  # 4 workers, some kB: below the minimums
    monkeypatch.setattr(shared_read, "MIN_RUNS", 2)
    monkeypatch.setattr(shared_read, "MIN_BYTES", 0)
    assert shared_read.worth_sharing(members)
    monkeypatch.setenv(shared_read.SHARED_READ_ENV, "0")
    assert not shared_read.worth_sharing(members)
    # The helper's files: in memory where /dev/shm has room, else the temporary directory.
    monkeypatch.setattr(shared_read, "SHM_FREE", 1 << 62)
    assert shared_read._files_directory() is None


# A helper that takes in the start, announces every worker, then does `{end}`.
_FAKE_HELPER = """
import os, struct, sys, time
size, = struct.unpack("<Q", os.read(0, 8))
while size:
    size -= len(os.read(0, size))
for index in range({workers}):
    os.write(1, struct.pack("<cI", b"T", index))
{end}
"""


@pytest.mark.parametrize(
    "end, why",
    [("sys.exit(0)", "it stopped"), ("time.sleep(60)", "it sent nothing for 1 s")],
    ids=["dies", "hangs"],
)
def test_a_helper_that_dies_or_hangs_leaves_the_rest_to_this_process(
    logdir, shared, monkeypatch, caplog, end, why
):
    script = _FAKE_HELPER.format(workers=WORKERS, end=end)
    monkeypatch.setattr(shared_read, "_helper_command", lambda: [sys.executable, "-c", script])
    monkeypatch.setattr(shared_read, "RESULT_TIMEOUT", 1.0)
    caplog.set_level(logging.WARNING, logger=shared_read.__name__)
    started = time.monotonic()
    state = _state(logdir)
    assert time.monotonic() - started < 15  # 1 s for worker 0, 1 s at most for the helper
    assert shared["taken"] == []
    warnings = [r.getMessage() for r in caplog.records if r.name == shared_read.__name__]
    assert len(warnings) == 1 and f"({why})" in warnings[0], warnings
    (helper,) = shared["helpers"]
    assert helper._process.returncode is not None  # ended (killed when it hung)
    assert not os.path.exists(helper._directory)
    _same_job(state, _in_one_process(logdir, monkeypatch))
