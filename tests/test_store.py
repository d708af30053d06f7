"""One state per run or job, read on as it grows, answers cached per version: the plugin in-process
on a real loader (TensorBoard's multiplexer lists the runs; the plugin reads their event files)."""

import argparse
import json
import os
import shutil
import threading
import time

import pytest
from conftest import REPO, mirrored, write_loop_15_7

from tb_replica_plugin import metadata, reader, registry
from tb_replica_plugin.read import cache as cache_lib
from tb_replica_plugin.read import judge
from tb_replica_plugin.store import LISTING_REUSE_SECONDS

PLUGIN = "/data/plugin/replicas"


class RecordingProvider:
    """A data provider passing every call on to a real one, recording the tags each read asks."""

    def __init__(self, provider):
        self._provider = provider
        self.reads = []  # (runs, tags) of each read_tensors call
        self.downsample = []  # the samples per tag each read asked for

    def read_tensors(self, ctx, *, run_tag_filter, **kwargs):
        self.reads.append((tuple(run_tag_filter.runs), frozenset(run_tag_filter.tags)))
        self.downsample.append(kwargs.get("downsample"))
        return self._provider.read_tensors(ctx, run_tag_filter=run_tag_filter, **kwargs)

    def __getattr__(self, name):
        return getattr(self._provider, name)


def serve(logdir, hint=0):
    """`(werkzeug client, recording provider, plugin, multiplexer)` over `logdir`; `hint`: the
    `--samples_per_plugin replicas=N` hint (0: every sample). The plugin reads the event files
    of `logdir` (`TB_REPLICA_READ=provider` in the environment: through the provider)."""
    from tensorboard.backend import application
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from werkzeug import test as werkzeug_test

    from tb_replica_plugin.plugin import ReplicasPlugin

    multiplexer = plugin_event_multiplexer.EventMultiplexer(
        tensor_size_guidance={metadata.PLUGIN_NAME: 0}, max_reload_threads=1
    )
    multiplexer.AddRunsFromDirectory(logdir)
    multiplexer.Reload()
    provider = RecordingProvider(data_provider.MultiplexerDataProvider(multiplexer, logdir))
    context = base_plugin.TBContext(
        logdir=logdir, data_provider=provider, sampling_hints={metadata.PLUGIN_NAME: hint}
    )
    plugin = ReplicasPlugin(context)
    plugin.store.listing_reuse_s = 0  # each request sees the tests' explicit reloads
    app = application.TensorBoardWSGI([plugin], data_provider=provider)
    return werkzeug_test.Client(app), provider, plugin, multiplexer


def append_balanced_steps(logdir):
    """New data for loop_15_7/replicas: a second probe appends 2 balanced steps of 2 replicas."""
    write_loop_15_7(mirrored(2), logdir, examples=8, global_batch=4)


def get_json(client, path):
    """`(status, body)`: the JSON answer, or the text of an error (TensorBoard's own)."""
    response = client.get(PLUGIN + path)
    body = response.get_data()
    return response.status_code, json.loads(body) if response.status_code < 400 else body.decode()


@pytest.mark.parametrize("family", [f.name for f in registry.families() if f.route])
def test_every_route_answers_from_one_read_of_the_run(unit_logs, family):
    client, provider, plugin, _ = serve(unit_logs)
    get_json(client, "/findings?run=fit_17_8/replicas")
    descriptor = registry.family(family)
    status, body = get_json(client, f"{descriptor.route}?run=fit_17_8/replicas")
    assert status in (200, 404), body
    # The run's files were read once, by the plugin (not through the provider), for every route.
    assert plugin.store.computed["read"] == 1 and provider.reads == []
    if family == "watch":
        assert body["values"], body
    if family == "inputs":
        assert body["batch_size"] == [[4, 4], [4, 4], [1, 0]]
    if family == "gradients":
        assert body["steps"] == [2]


def test_a_job_grows_by_what_its_workers_append(tmp_path):
    """New steps of a job's workers are read from where each worker's file stopped and merged
    from its last step on: the answers equal a new plugin's, from every value read once."""
    from benchmarks import live_job
    from benchmarks.multiworker_load import write_job

    logdir = str(tmp_path)
    write_job(logdir, workers=3, replicas=2, steps=5)
    client, _, plugin, _ = serve(logdir)
    paths = ["/runs", "/findings?run=job", "/inputs?run=job", "/step_time?run=job"]
    before = [get_json(client, path) for path in paths]
    state = plugin.store._states[("", "job")]
    read_first = state.values_read
    appended = live_job.append_steps(os.path.join(logdir, "job"), 4, heartbeat=False)
    after = [get_json(client, path) for path in paths]
    assert (state.values_read - read_first, appended) == (3 * 4 * 2, 3 * 4 * 2)
    assert plugin.store.computed["read"] == 1 and plugin.store.computed["refresh"] == 1
    assert after[2][1]["steps"] == list(range(9)) and before[2][1]["steps"] == list(range(5))
    fresh, _, _, _ = serve(logdir)
    assert after == [get_json(fresh, path) for path in paths]
    # Nothing new: the next look reads nothing and answers from the cache.
    assert [get_json(client, path) for path in paths] == after
    assert plugin.store.computed["refresh"] == 1 and plugin.store.computed["summary"] == 2


def test_a_worker_writing_a_step_again_or_out_of_order_reads_the_job_again(tmp_path):
    """A worker's values at its last step written again (a flush between two records of one
    step) are merged again in place; a step below it makes the job read from its start."""
    import numpy as np
    from tensorboard.compat.proto import event_pb2
    from tensorboard.summary.writer import record_writer
    from tensorboard.util import tensor_util

    from benchmarks import live_job
    from benchmarks.multiworker_load import write_job

    logdir = str(tmp_path)
    write_job(logdir, workers=2, replicas=2, steps=4)
    client, _, plugin, _ = serve(logdir)
    get_json(client, "/step_time?run=job")
    run_dir = os.path.join(logdir, "job", "worker_1")
    step, values, _ = live_job.last_step_values(run_dir)

    def write(at_step, arrival):
        event = event_pb2.Event(step=at_step, wall_time=2e9)
        for value in values:
            copied = event.summary.value.add()
            copied.CopyFrom(value)
            copied.ClearField("metadata")
            if value.tag == "workers/step_time":
                times = np.array([arrival, 0.1, 0.1])
                copied.tensor.CopyFrom(tensor_util.make_tensor_proto(times))
        with open(live_job.event_files(run_dir)[-1], "ab") as handle:
            record_writer.RecordWriter(handle).write(event.SerializeToString())

    write(step, 1_900_000_000.0)  # its last step again: a later write wins
    _, body = get_json(client, "/step_time?run=job")
    assert plugin.store.computed["read"] == 1  # taken in place
    fresh, _, _, _ = serve(logdir)
    assert body == get_json(fresh, "/step_time?run=job")[1]
    write(step - 2, 1_900_000_001.0)  # a step before its last: read from the start
    _, body = get_json(client, "/step_time?run=job")
    assert plugin.store.computed["read"] == 2
    fresh, _, _, _ = serve(logdir)
    assert body == get_json(fresh, "/step_time?run=job")[1]


def test_findings_computed_once_then_again_after_new_data(unit_logs, tmp_path, monkeypatch):

    logdir = str(tmp_path / "logs")
    shutil.copytree(unit_logs, logdir)
    calls = []
    find_run = judge.find_run

    live_calls = []

    def counting(run_data, *args, **kwargs):
        # The live (status) findings are judged at each request from a cached read; the rest
        # are computed once per data version.
        (live_calls if kwargs.get("live") else calls).append(run_data.run)
        return find_run(run_data, *args, **kwargs)

    monkeypatch.setattr(judge, "find_run", counting)
    client, provider, plugin, multiplexer = serve(logdir)

    _, first = get_json(client, "/findings")
    assert sorted(calls) == [
        "dict_mismatch/replicas",
        "fit_17_8/replicas",
        "inspect_7/inspect_dataset",
        "loop_15_7/replicas",
    ]
    reads = plugin.store.computed["read"]
    _, second = get_json(client, "/findings")
    _, runs = get_json(client, "/runs")
    _, overview = get_json(client, "/overview")
    assert second == first
    assert len(calls) == 4 and plugin.store.computed["read"] == reads == 4  # from the cache
    assert len(live_calls) == 4 * 4  # each request judged each run's status again, unread
    assert {r["run"] for r in runs["runs"]} == {r["run"] for r in overview["runs"]}
    loop_counts = {r["run"]: r["findings"] for r in runs["runs"]}["loop_15_7/replicas"]
    assert loop_counts == {"error": 1, "warning": 2, "info": 0}  # first batch, uneven, empty

    # New data for one run (a second probe appends 2 balanced steps): only it is computed again.
    append_balanced_steps(logdir)
    _, third = get_json(client, "/findings")
    assert calls[4:] == ["loop_15_7/replicas"]
    get_json(client, "/findings?run=loop_15_7/replicas")
    assert len(calls) == 5
    assert plugin.store.computed["summary"] == 5


def test_settled_runs_are_computed_ahead_once_and_a_run_with_new_data_after_it_settles(
    unit_logs, tmp_path, monkeypatch
):
    from tensorboard import context as context_lib

    from tb_replica_plugin import plugin as plugin_lib
    from tb_replica_plugin import store as store_lib
    from tb_replica_plugin.plugin import runs_entry

    logdir = str(tmp_path / "logs")
    shutil.copytree(unit_logs, logdir)
    client, provider, plugin, multiplexer = serve(logdir)
    assert not any(t.name == "tb_replica_warm" for t in threading.enumerate())
    now, find_run = [0.0], judge.find_run

    def one_second_each(run_data, *args, **kwargs):  # each run's findings "take" 1 s
        now[0] += 1.0
        return find_run(run_data, *args, **kwargs)

    monkeypatch.setattr(judge, "find_run", one_second_each)
    store, ctx, warmed = plugin.store, context_lib.RequestContext(), {}

    def warm(seen):
        return store.warm(ctx, "", runs_entry, seen, warmed, clock=lambda: now[0])

    seen = warm({})  # every run read, and computed ahead: its version is new
    assert len(seen) == 4 and store.computed["summary"] == 4 and store.computed["read"] == 4
    assert store.computed["warm"] == 4 and store.computed["body"] == 0
    # The fourth run was computed from 3 s to 4 s: a new version not before 3 s + 10 × 1 s.
    assert warmed["loop_15_7/replicas"][1] == 3.0 + store_lib.WARM_BACKOFF * 1.0
    seen = warm(seen)  # all four settled: their run views built, once
    assert store.computed["summary"] == 4 and store.computed["warm"] == 8
    views = store.computed["body"]
    assert views >= 4
    seen = warm(seen)
    assert store.computed["warm"] == 8 and store.computed["body"] == views
    _, runs = get_json(client, "/runs")  # from what was computed ahead
    assert len(runs["runs"]) == 4 and store.computed["read"] == 4
    before = {r["run"]: r for r in runs["runs"]}["loop_15_7/replicas"]
    view = "&".join(f"{k}={v}" for k, v in plugin_lib.run_view_query(2, "inputs").items())
    get_json(client, f"/inputs?run=loop_15_7/replicas&{view}")
    assert store.computed["body"] == views  # built ahead
    assert store.computed["summary"] == 4 and store.computed["warm"] == 8

    # New data for one run: read at the next look; computed ahead once its wait has passed,
    # its view too (not settled: the tab asked it less than VIEWED_SECONDS ago).
    append_balanced_steps(logdir)
    seen = warm(seen)
    assert store.computed["summary"] == 4 and store.computed["refresh"] == 1
    assert store.computed["body"] == views
    now[0] = 13.0
    seen = warm(seen)
    assert store.computed["summary"] == 5 and store.computed["warm"] == 9
    views_of_loop = store.computed["body"] - views
    assert views_of_loop >= 1
    get_json(client, f"/inputs?run=loop_15_7/replicas&{view}")
    assert store.computed["body"] == views + views_of_loop  # built ahead at the new version
    seen = warm(seen)  # now settled: its view was built already
    assert store.computed["warm"] == 9 and store.computed["body"] == views + views_of_loop
    _, runs = get_json(client, "/runs")
    loop = {r["run"]: r for r in runs["runs"]}["loop_15_7/replicas"]
    assert store.computed["summary"] == 5 and store.computed["read"] == 4
    assert before["notes"] == [] and loop["notes"] and loop != before  # the new data's entry

    # A run whose computation raises: the others are computed, the error is handed back once.
    def broken(run_data, *args, **kwargs):
        if run_data.run == "fit_17_8/replicas":
            raise ValueError("unreadable")
        return find_run(run_data, *args, **kwargs)

    monkeypatch.setattr(judge, "find_run", broken)
    store.cache.clear()
    warmed.clear()
    errors = []
    store.warm(ctx, "", runs_entry, seen, warmed, clock=lambda: now[0], errors=errors)
    assert [(group, str(error)) for group, error in errors] == [("fit_17_8/replicas", "unreadable")]
    assert store.computed["warm"] == 13 and len(warmed) == 4
    store.warm(ctx, "", runs_entry, seen, warmed, clock=lambda: now[0], errors=errors)
    assert len(errors) == 1 and store.computed["warm"] == 13


def test_tensorboard_starts_the_warming_thread_unless_turned_off(unit_logs, monkeypatch):
    from tensorboard.plugins import base_plugin

    from tb_replica_plugin import plugin as plugin_lib

    def started(**context):
        before = {id(t) for t in threading.enumerate()}
        made = plugin_lib.ReplicasPlugin(base_plugin.TBContext(**context))
        new = [t for t in threading.enumerate() if id(t) not in before]
        made.stop_warming.set()
        return [t.name for t in new]

    flags = argparse.Namespace(logdir=unit_logs)
    assert started(flags=flags, data_provider=None) == ["tb_replica_warm"]
    assert started(data_provider=None) == []  # no TensorBoard server around it
    monkeypatch.setenv(plugin_lib.WARM_ENV, "0")
    assert started(flags=flags, data_provider=None) == []


def test_the_run_view_arguments_are_the_tabs(unit_logs):
    import re

    from tb_replica_plugin import plugin as plugin_lib

    # The arguments the tab's run view sends.
    with open(os.path.join(REPO, "frontend", "src", "sections.js"), encoding="utf-8") as handle:
        sections = handle.read()
    sent = re.findall(r"const (MAX_POINTS|MAX_CELLS|TOP_VARIABLES) = (\d+);", sections)
    assert dict(sent) == {"MAX_POINTS": "10000", "MAX_CELLS": "262144", "TOP_VARIABLES": "8"}
    assert (plugin_lib.RUN_VIEW_MAX_POINTS, plugin_lib.RUN_VIEW_MAX_CELLS) == (10000, 262144)
    assert plugin_lib.RUN_VIEW_TOP == 8
    matrix = os.path.join(REPO, "frontend", "src", "views", "match_matrix.js")
    with open(matrix, encoding="utf-8") as handle:
        assert "export const CANVAS_SIDE = 640;" in handle.read()
    assert plugin_lib.RUN_VIEW_MATRIX_SIDE == 640  # the canvas's side: matrices cut to blocks
    # Fewer steps for many replicas: 2^18 step × replica values per series.
    counts = [plugin_lib.run_view_query(n)["max_points"] for n in (0, 4, 26, 27, 2048, 10**6)]
    assert counts == ["10000", "10000", "10000", "9709", "128", "2"]
    assert plugin_lib.run_view_query(40) == {
        "max_points": "6553",
        "top": "8",
        "matrix_side": "640",
        "replica_blocks": "64",
    }


def test_a_job_through_the_provider_reads_every_sample_again_and_merges_the_new(
    tmp_path, monkeypatch
):
    """`TB_REPLICA_READ=provider`: each look at new data asks the provider for every sample of
    the job's runs (its `read_tensors` has no step range), and merges only those past each
    worker's last step (per-step filtering): the same answers as the event files give."""
    from benchmarks import live_job
    from benchmarks.multiworker_load import write_job
    from tb_replica_plugin import store as store_lib

    logdir = str(tmp_path)
    write_job(logdir, workers=2, replicas=2, steps=5)
    monkeypatch.setenv(store_lib.READ_ENV, "provider")
    client, provider, plugin, multiplexer = serve(logdir)
    get_json(client, "/step_time?run=job")
    assert sorted(runs for runs, _ in provider.reads) == [("job/worker_0",), ("job/worker_1",)]
    live_job.append_steps(os.path.join(logdir, "job"), 3, heartbeat=False)
    multiplexer.Reload()
    _, body = get_json(client, "/step_time?run=job")
    assert body["steps"] == list(range(8)) and len(provider.reads) == 4
    state = plugin.store._states[("", "job")]
    assert state.full_reads == 1 and state.values_read == 2 * (1 + 2 * 5) + 2 * (1 + 2 * 8)
    monkeypatch.delenv(store_lib.READ_ENV)
    files, _, _, _ = serve(logdir)
    assert body == get_json(files, "/step_time?run=job")[1]


def test_byte_lru_evicts_least_recently_used_and_replaces_a_slot():
    import numpy as np

    lru = cache_lib.ByteLRU(3 * 8_000 + 1_000)
    for name in "abc":
        lru.put(name, np.zeros(1000))  # 8,000 bytes each, plus overhead
    assert lru.get("a") is not None  # "a" is now the most recently used
    lru.put("d", np.zeros(1000))
    assert lru.get("b") is None and lru.get("a") is not None and len(lru) == 3
    assert lru.bytes <= lru.max_bytes
    lru.put(("run", 2), [1], slot="run")
    lru.put(("run", 3), [2], slot="run")
    assert lru.get(("run", 2)) is None and lru.get(("run", 3)) == [2]
    assert lru.put("huge", np.zeros(10_000)) is not None and lru.get("huge") is None
    # More than half the budget is not kept either: it would evict every other entry.
    assert lru.put("large", np.zeros(1_700)) is not None and lru.get("large") is None
    assert lru.get(("run", 3)) == [2] and lru.get("a") is not None
    with pytest.raises(ValueError, match="must be positive"):
        cache_lib.ByteLRU(0)


def test_byte_lru_computes_a_key_once_for_threads_missing_it_together():
    import threading
    import time

    import numpy as np

    lru = cache_lib.ByteLRU(10_000)
    release, calls, results = threading.Event(), [], []

    def compute():  # too large to keep: the second thread gets it only from the computation
        calls.append(threading.current_thread().name)
        release.wait(10)
        return np.arange(5_000)

    threads = [
        threading.Thread(target=lambda: results.append(lru.get_or_compute("run", compute)))
        for _ in range(2)
    ]
    threads[0].start()
    while not calls:
        time.sleep(0.01)
    threads[1].start()
    time.sleep(0.3)  # the second thread is waiting for the first's computation
    release.set()
    for thread in threads:
        thread.join(10)
    assert len(calls) == 1 and len(results) == 2 and results[0] is results[1]
    assert lru.get("run") is None and not len(lru._computing)

    def fail():
        raise ValueError("unreadable")

    with pytest.raises(ValueError, match="unreadable"):
        lru.get_or_compute("bad", fail)
    assert lru.get_or_compute("bad", lambda: [1]) == [1] and not len(lru._computing)


def test_the_scale_benchmark_asks_each_route_with_the_tabs_arguments():
    """`benchmarks.job_scale` measures the run view the plugin computes ahead: each of its
    paths passes the arguments of `run_view_query` that the family's route takes."""
    import urllib.parse

    from benchmarks.job_scale import RUN_VIEW, _family_of
    from tb_replica_plugin.plugin import run_view_query

    routes = {f.route: f for f in registry.families() if f.route}
    for path in RUN_VIEW[1:]:  # after /findings
        family = routes[path.split("?")[0]]
        query = run_view_query(2048, family.name)
        arguments = urllib.parse.parse_qs(path.format(run="job", **query).partition("?")[2])
        asked = {name: values[0] for name, values in arguments.items() if name != "run"}
        assert asked == {k: v for k, v in query.items() if k in family.present.args}, path
    assert _family_of("/data?run=job") == "examples" and _family_of("/findings?run=j") is None


def test_requests_listing_at_once_share_one_listing(unit_logs):
    import time

    from tensorboard import context as context_lib

    _, provider, plugin, _ = serve(unit_logs)
    ctx = context_lib.RequestContext()
    release, calls, listings = threading.Event(), [], []
    list_tensors = provider.list_tensors

    def slow_list_tensors(*args, **kwargs):
        calls.append(1)
        release.wait(10)
        return list_tensors(*args, **kwargs)

    provider.list_tensors = slow_list_tensors
    store = plugin.store
    store.listing_reuse_s = LISTING_REUSE_SECONDS
    threads = [
        threading.Thread(target=lambda: listings.append(store.list_runs(ctx, ""))) for _ in range(3)
    ]
    threads[0].start()
    while not calls:
        time.sleep(0.01)
    for thread in threads[1:]:
        thread.start()
    time.sleep(0.3)  # the others are waiting for the first listing
    release.set()
    for thread in threads:
        thread.join(10)
    assert len(calls) == 1 and len(listings) == 3
    assert listings[0] is listings[1] is listings[2] and len(listings[0]) == 4
    # A listing started less than LISTING_REUSE_SECONDS ago answers later requests too.
    now = [store._recent_listing[""][0]]  # when the first listing started
    store._clock = lambda: now[0]
    assert store.list_runs(ctx, "") is listings[0] and len(calls) == 1
    now[0] += store.listing_reuse_s
    assert store.list_runs(ctx, "") is not listings[0] and len(calls) == 2
    assert store.list_runs(ctx, "") is store.list_runs(ctx, "") and len(calls) == 2
    store.listing_reuse_s = 0  # every request lists
    store.list_runs(ctx, "")
    assert len(calls) == 3


def test_with_needs():
    assert reader.with_needs(["examples"]) == {"examples", "inputs"}
    assert reader.with_needs(["step_time"]) == {"step_time", "inputs"}


def test_reads_through_the_provider_follow_the_sampling_hint(unit_logs, monkeypatch):
    from tb_replica_plugin import store as store_lib

    monkeypatch.setenv(store_lib.READ_ENV, "provider")
    client, provider, _, _ = serve(unit_logs)
    get_json(client, "/inputs?run=fit_17_8/replicas")
    assert provider.downsample == [reader.ALL_SAMPLES]  # replicas=0: every sample kept
    client, provider, _, _ = serve(unit_logs, hint=2)
    status, body = get_json(client, "/inputs?run=fit_17_8/replicas")
    # At most 2 samples per tag asked, as TensorBoard's own plugins do with their hint.
    assert provider.downsample == [2] and status == 200 and body["replicas"] == [0, 1]


def test_run_store_docstring_example_runs_as_written(tmp_path):
    """`RunStore`'s docstring example, run by doctest on a real provider over a balanced run
    of 2 replicas (the run its example names)."""
    import doctest

    import numpy as np
    import tensorflow as tf
    from conftest import custom_loop_inputs

    from tb_replica_plugin import store

    strategy = mirrored(2)
    dataset = tf.data.Dataset.from_tensor_slices(np.zeros((16, 3), "float32")).batch(8)
    run_dir = str(tmp_path / "balanced" / "replicas")
    custom_loop_inputs(strategy, run_dir, strategy.experimental_distribute_dataset(dataset))
    provider, ctx, _ = reader.local_provider(str(tmp_path))
    globs = {"RunStore": store.RunStore, "provider": provider, "ctx": ctx}
    (test,) = doctest.DocTestFinder(recurse=False).find(store.RunStore, globs=globs)
    runner = doctest.DocTestRunner()
    result = runner.run(test)
    assert (result.failed, result.attempted) == (0, len(test.examples)) and result.attempted >= 2


class _CountingLock:
    """A lock that counts the threads that came to take it."""

    def __init__(self):
        self.lock, self.came = threading.Lock(), 0

    def __enter__(self):
        self.came += 1
        self.lock.acquire()

    def __exit__(self, *exc):
        self.lock.release()


@pytest.mark.parametrize("held_look", ["returns", "raises"])
def test_refreshes_asked_during_one_share_the_next_which_reads_what_came_before_them(
    tmp_path, held_look
):
    """The requests of one view come together: those that come while a refresh looks at the
    runs wait for it, then share one more look (it started after each came, so it reads what
    was appended before they asked); a refresh after that looks again. A held look that
    raises gives its error to its own request only: the others still look and read."""
    from benchmarks import live_job
    from benchmarks.multiworker_load import write_job
    from tb_replica_plugin import group
    from tb_replica_plugin.read.sources import FileSource

    logdir = str(tmp_path)
    write_job(logdir, workers=3, replicas=2, steps=5)
    state = group.GroupState("job", [f"job/worker_{i}" for i in range(3)], FileSource(logdir), "")
    state.refresh()
    state._lock = _CountingLock()
    # The next look stops after reading the last worker, until the others came.
    last = state.members[-1].tail
    read, read_done, go_on = last.read, threading.Event(), threading.Event()
    errors = []

    def held_read(*args):
        got = read(*args)
        read_done.set()
        go_on.wait(60)
        if held_look == "raises":
            raise OSError("the file went away")
        return got

    def held_refresh():
        try:
            state.refresh()
        except OSError as error:
            errors.append(str(error))

    last.read = held_read
    held = threading.Thread(target=held_refresh)
    held.start()
    assert read_done.wait(60)
    last.read = read
    assert live_job.append_steps(os.path.join(logdir, "job"), 2, heartbeat=False) == 3 * 2 * 2
    came_after = [threading.Thread(target=state.refresh) for _ in range(4)]
    for thread in came_after:
        thread.start()
    deadline = time.monotonic() + 60
    while state._lock.came < 1 + 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    go_on.set()
    for thread in [held, *came_after]:
        thread.join(60)
        assert not thread.is_alive()
    assert errors == (["the file went away"] if held_look == "raises" else [])
    assert state.looks == 3  # the first, the held one, one for the four
    assert state.data()["job"].inputs.steps.tolist() == list(range(7))
    state.refresh()
    assert state.looks == 4
