"""The benchmarks run (reduced size) and print their figures, their speed not asserted; and the
figures README and docs state are the results files' (`benchmarks.tables`)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO


def _run_benchmark(module, *args, timeout=600):
    """Runs `python -m <module> <args>` in the repo; returns its stdout (exit status 0 asserted)."""
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_every_benchmark_runs_and_prints_its_figures():
    results = {
        r["benchmark"]: r for r in json.loads(_run_benchmark("benchmarks", "--quick", timeout=1200))
    }
    assert set(results) == {
        "fit_overhead",
        "loop_overhead",
        "backend",
        "frontend_render",
        "drift_overhead",
        "fingerprint_overhead",
        "multiworker_load",
        "status_overhead",
        "pss_overhead",
    }
    fit = results["fit_overhead"]
    assert set(fit["models"]) == {"mlp", "cnn", "guide"}
    # The counts of the MLP's step (deterministic): one transfer per sending replica.
    counts = fit["models"]["mlp"]["step_counts"]
    assert counts["added"]["transfers_per_replica"] == 1.0 and counts["added"]["transfers"] == 3
    assert counts["added"]["ops_per_step"] > 0
    assert fit["pairs"] == 1
    figures = set(fit["figures"])
    assert {
        "first_batch_cpu_s",
        "first_batch_wall_s",
        "steady_cpu_per_step",
        "steady_wall_per_step",
        "second_fit_cpu_s",
        "second_fit_wall_s",
        "process_cpu_s",
        "process_wall_s",
    } <= figures
    mlp = fit["models"]["mlp"]["variants"]
    assert set(mlp) == {
        "no_callback",
        "replica_callback_default",
        "replica_callback_every_step",
        "keras_tensorboard_every_step",
    }
    # The cnn path runs too (tiny; BatchNormalization and Dropout under every family).
    cnn = fit["models"]["cnn"]["variants"]
    assert set(cnn) == {"no_callback", "replica_callback_every_step"}
    assert fit["models"]["cnn"]["sizes"]["image_size"] == 32
    guide = fit["models"]["guide"]["variants"]
    assert set(guide) == set(mlp)
    for variants in (mlp, cnn, guide):
        assert all(v["ratio_to_no_callback"].keys() == figures for v in variants.values())
        assert all(v["median"][f] > 0 for v in variants.values() for f in figures)
        assert all(len(v["raw"][f]) == 1 for v in variants.values() for f in figures)
        assert all(r == 1.0 for r in variants["no_callback"]["ratio_to_no_callback"].values())
        assert variants["no_callback"]["median"]["log_bytes"] == 0
    assert mlp["replica_callback_default"]["median"]["log_bytes"] > 0
    assert cnn["replica_callback_every_step"]["median"]["log_bytes"] > 0
    assert mlp["keras_tensorboard_every_step"]["median"]["log_bytes"] > 0
    loop = results["loop_overhead"]
    assert loop["ratio_to_no_probe"]["no_probe"] == loop["cpu_ratio_to_no_probe"]["no_probe"] == 1.0
    assert set(loop["median_cpu_seconds_per_step"]) == set(loop["median_seconds_per_step"])
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
    status = results["status_overhead"]
    assert status["write"]["heartbeats"] >= 2 and status["write"]["events"] == 2  # start, end
    assert 64 < status["write"]["bytes_per_heartbeat"] < 1000  # 8 float64 values, tag, metadata
    serve = status["serve"]
    assert serve["states"] == {"job": "running", "single": "running"}  # an hour, heartbeating
    assert serve["heartbeats_per_run"] == 721 and serve["reads_of_live_data"] >= 2
    assert all(seconds > 0 for seconds in serve["median_seconds"].values())
    pss = results["pss_overhead"]
    assert (pss["workers"], pss["ps"], pss["pairs"], pss["steps"]) == (2, 2, 1, 10)
    assert [len(pss["raw"][v]) for v in ("coordinator_schedule", "probe_schedule")] == [1, 1]
    cpu = pss["cpu_ms_per_step"]
    assert all(cpu[v]["median"] > 0 for v in ("coordinator_schedule", "probe_schedule"))
    ratio = cpu["probe_schedule"]["median"] / cpu["coordinator_schedule"]["median"]
    assert pss["cpu_ratio"]["median"] == pytest.approx(ratio, rel=1e-3)


def test_job_scale_serves_the_whole_job_on_both_loaders():
    """`benchmarks.job_scale` at a tiny size (run on its own, not by `python -m benchmarks`)."""
    stdout = _run_benchmark(
        "benchmarks.job_scale",
        "--workers",
        "2",
        "--replicas",
        "2",
        "--steps",
        "4",
        "--live_steps",
        "2",
        "--live_period",
        "2",
        "--live_wait",
        "12",
    )
    result = json.loads(stdout.strip().splitlines()[-1])
    assert (result["workers"], result["replicas"], result["steps"]) == (2, 2, 4)
    # The job grows by 2 steps per loader, then by a step every 2 s while its view is timed.
    grown = 2 + result["python"]["live_steps_appended"]
    for loader, steps in (("python", 4), ("rust", 4 + grown)):
        figures = result[loader]
        # The job as the tab sees it: 2 workers of 2 replicas, every logged step.
        assert figures["workers_served"] == 2 and figures["replicas_served"] == 4
        assert figures["steps_served"] == steps
        assert figures["refresh_steps_served"] == steps + 2 and figures["refresh_load_s"] > 0
        assert set(figures["findings"]) == {"error", "warning", "info"}
        assert figures["first_load_s"] > 0 and figures["cached_load_s"] > 0
        assert figures["first_parse_s"] > 0 and figures["cached_parse_s"] > 0
        assert figures["warm"] is True and figures["tensorboard_load_cpu_s"] > 0
        assert figures["peak_rss_mb"] > 50
        # Each view of the growing job answered, and the job grew in between.
        assert len(figures["live_load_s"]) == 5 and min(figures["live_load_s"]) > 0
        assert figures["live_first_load_s"] > 0
        first, last = figures["live_last_step_served"]
        assert steps + 2 <= first < last <= steps + 1 + figures["live_steps_appended"]
    assert result["report_replicas"] == 4 and result["report_s"] > 0
    assert result["report_peak_rss_mb"] > 50


def test_job_scale_leaves_a_kept_job_as_it_was_written(tmp_path):
    """The live phases append steps to the job's event files; a kept `--logdir` gets its files
    back at their written sizes (the next run reuses the job as written)."""
    from benchmarks import job_scale

    worker = tmp_path / "job" / "worker_0"
    worker.mkdir(parents=True)
    events = worker / "events.out.tfevents.1"
    events.write_bytes(b"written")
    with job_scale._appends_undone(str(tmp_path / "job")):
        with open(events, "ab") as handle:
            handle.write(b" and appended")
        (worker / "events.out.tfevents.2").write_bytes(b"new")
    assert events.read_bytes() == b"written"
    assert (worker / "events.out.tfevents.2").read_bytes() == b"new"  # not the job's: kept


def test_fit_alternated_times_both_copies_every_round():
    """`benchmarks.fit_alternated` at a tiny size (run on its own, not by `-m benchmarks`)."""
    result = json.loads(_run_benchmark("benchmarks.fit_alternated", "--quick"))
    assert result["benchmark"] == "fit_alternated"
    assert (result["variant"], result["rounds"], result["steps_per_epoch"]) == (
        "replica_callback_default",
        2,
        2,
    )
    for figure in ("cpu_per_step", "cpu_per_fit"):
        assert set(result[figure]) == {"no_callback", "replica_callback_default"}
        assert all(len(v) == 2 and min(v) > 0 for v in result[figure].values())
    ratio = result["ratio_per_step"]
    per_step = result["cpu_per_step"]
    pairs = sorted(
        zip(per_step["replica_callback_default"], per_step["no_callback"], strict=True),
        key=lambda pair: pair[0] / pair[1],
    )
    # The ratios are taken from the figures before the JSON rounds them to 6 decimals: besides
    # the ratio's own rounding to 4 (5e-5), half a unit of 1e-6 in each figure.
    for got, (a, b) in ((ratio["min"], pairs[0]), (ratio["max"], pairs[-1])):
        assert abs(got - a / b) <= 5e-5 + a / b * 5e-7 * (1 / a + 1 / b) + 1e-12


# --- the figures of README and docs/*.md (fast: JSON files, no TensorFlow) -----------------


def _results_copy():
    from benchmarks import tables

    return json.loads(json.dumps(tables.load_results()))


def test_every_figure_of_readme_and_docs_is_the_results_files_figure():
    """`python -m benchmarks.tables --check`: every marked block of README.md and docs/*.md is
    what the results files render; the blocks that carry figures are where they belong."""
    from benchmarks import tables

    assert tables.stale() == []
    found = {}
    for path in tables.pages():
        with open(path) as handle:
            names = [name for name, _ in tables.MARKER.findall(handle.read())]
        found[os.path.relpath(path, REPO)] = names
    assert found["README.md"] == ["heartbeat_bytes", "targets"]
    assert found["docs/data-format.md"] == ["memory"]
    assert found["docs/parameter-server.md"] == ["pss_overhead"]
    assert set(found["docs/benchmarks.md"]) == set(tables.RENDERERS) - {
        "targets",
        "memory",
        "heartbeat_bytes",
        "pss_overhead",
    }


def test_a_changed_result_makes_the_pages_that_state_it_stale():
    from benchmarks import tables

    results = _results_copy()
    results["job_scale"]["runs"]["default_python"]["figures"]["peak_rss_gb"] = 3.21
    assert tables.stale(results=results) == [
        ("README.md", "targets"),
        ("docs/benchmarks.md", "job_scale"),
        ("docs/data-format.md", "memory"),
    ]
    text = tables.rendered("x <!-- figures:memory -->old<!-- /figures:memory --> y", results)
    assert (
        text
        == "x <!-- figures:memory -->1.9–3.2 GB instead of 4.5–7.4 GB<!-- /figures:memory --> y"
    )
    with pytest.raises(ValueError, match="unknown figures block 'nope'"):
        tables.rendered("<!-- figures:nope --><!-- /figures:nope -->", results)


def test_a_target_is_met_or_a_known_gap_as_its_figure_says():
    from benchmarks import tables

    results = _results_copy()
    cold = results["job_scale"]["runs"]["cold_rust"]["figures"]
    readme, more = tables.targets(results)
    rows = {what: met for what, _, _, met, _ in readme + more}
    assert rows["refresh after 10 new steps per worker"] is True
    assert rows["the same, opened before the plugin's first read (`--cold`)"] is False
    gb = results["job_scale"]["runs"]["default_rust"]["figures"]["logdir_gb"]
    first = f"first load of a 256 × 8 × 1,000 job ({gb} GB)"
    assert rows[first] is True
    cold["first_load_s"] = {"median": 2.9, "min": 2.7, "max": 3.2}  # one run above 3 s
    assert {w: m for w, _, _, m, _ in tables.targets(results)[0]}[first] is False
    assert "**known gap**" in tables.render_targets(results)


def test_the_pss_overhead_pairs_are_summarized_pair_by_pair():
    from benchmarks import pss_overhead

    def run(cpu, wall):
        return {"cpu_per_step": cpu, "wall_per_step": wall}

    runs = {
        "coordinator_schedule": [run(0.002, 0.004), run(0.004, 0.004), run(0.003, 0.002)],
        "probe_schedule": [run(0.004, 0.004), run(0.005, 0.006), run(0.006, 0.003)],
    }
    figures = pss_overhead.summarize(runs)
    assert figures["pairs"] == 3
    assert figures["cpu_ms_per_step"]["probe_schedule"] == {"median": 5.0, "min": 4.0, "max": 6.0}
    assert figures["cpu_ratio"] == {"median": 2.0, "min": 1.25, "max": 2.0}
    assert figures["wall_ratio"] == {"median": 1.5, "min": 1.0, "max": 1.5}
    assert figures["added_cpu_ms_per_step"] == 2.0  # differences 2, 1, 3 ms


def test_the_pss_target_is_met_only_when_both_paths_pairs_straddle_one():
    from benchmarks import tables

    results = _results_copy()
    runs = results["pss_overhead"]["runs"]
    loop, fit = runs["default"]["figures"], runs["fit"]["figures"]
    kept = tables.ratio(runs["kept"]["figures"]["cpu_ratio"])
    what = "CPU per step, `ParameterServerStrategy` (2 workers, 2 ps): custom loop, tf_keras `fit`"

    def row():
        return {r[0]: r for r in tables.targets(results)[0]}[what]

    loop["cpu_ratio"] = {"median": 1.02, "min": 0.95, "max": 1.1}
    fit["cpu_ratio"] = {"median": 1.01, "min": 0.9, "max": 1.2}
    assert row()[1] == "within the noise" and row()[3] is True
    fit["cpu_ratio"] = {"median": 1.3, "min": 1.1, "max": 1.4}
    assert row()[3] is False  # the fit path alone misses it
    loop["cpu_ratio"] = {"median": 1.8, "min": 1.6, "max": 2.0}
    loop["cpu_ms_per_step"]["probe_schedule"]["median"] = 5.89
    loop["cpu_ms_per_step"]["coordinator_schedule"]["median"] = 3.21
    fit["cpu_ms_per_step"]["fit_replica_callback"]["median"] = 17.5
    fit["cpu_ms_per_step"]["fit"]["median"] = 14.25
    assert row()[2] == (
        "custom loop 1.80× (1.60–2.00×); 5.89 vs 3.21 ms (a step of a few kernels; "
        f"{kept} against a loop keeping its results); `fit` 1.30× (1.10–1.40×); 17.50 vs 14.25 ms"
    )
    assert row()[3] is False


def test_every_results_file_names_its_runs_command_date_machine_and_versions():
    from benchmarks import common, tables

    results = tables.load_results()
    assert set(results) == {
        "fit_overhead", "step_counts", "fit_alternated", "loop_overhead", "backend",
        "frontend_render", "drift_overhead", "fingerprint_overhead", "multiworker_load",
        "status_overhead", "job_scale", "pss_overhead",
    }  # fmt: skip
    for name, document in results.items():
        assert document["runs"], name
        for key, run in document["runs"].items():
            assert run["source"] == "measured" or run["source"].startswith(
                "transcribed from the run of "
            )
            assert run["date"][:4] == "2026" and run["figures"], (name, key)
            assert run["command"] is None or run["command"].startswith("python -m benchmarks")
            assert run["command"] is not None or run["note"], (name, key)
            assert {"arch", "cores", "cpu_model", "gpu"} <= set(run["machine"])
            assert set(run["versions"]) == {"python", *common.VERSIONED}


def test_a_recorded_run_replaces_its_entry_and_keeps_the_others(tmp_path):
    from benchmarks import common

    path = common.record_results(
        "backend", {"a": {"x": 1}, "b": {"x": 2}}, ["--steps", "9"], tmp_path
    )
    common.record_results("backend", {"b": {"x": 3}}, [], tmp_path)
    with open(path) as handle:
        document = json.load(handle)
    assert document["benchmark"] == "backend"
    assert {k: r["figures"] for k, r in document["runs"].items()} == {"a": {"x": 1}, "b": {"x": 3}}
    first = document["runs"]["a"]
    assert first["source"] == "measured"
    assert first["command"] == "python -m benchmarks.backend --steps 9"
    assert first["machine"]["cores"] == os.cpu_count() and first["machine"]["gpu"] is None
    assert first["versions"]["numpy"] == np.__version__
    assert first["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))


def test_a_quick_run_is_not_recorded():
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--record"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--quick run's figures are not results" in done.stderr


def test_job_scale_loaders_both_is_python_and_rust():
    from benchmarks import job_scale

    assert job_scale.loaders("both") == ["python", "rust"]
    assert job_scale.loaders("python,rust") == ["python", "rust"]
    assert job_scale.loaders("rust") == ["rust"] and job_scale.loaders("") == []
    with pytest.raises(ValueError, match=r"unknown \['go'\]"):
        job_scale.loaders("rust,go")
    args = job_scale._parser().parse_args(["--sampled", "--cold", "--live_steps", "10"])
    assert job_scale.record_key(args, "rust") == "cold_live_rust"
    args = job_scale._parser().parse_args([])
    assert job_scale.record_key(args, "python") == "keep_all_python"


def test_the_pages_state_no_measured_figure_outside_the_marked_blocks():
    """docs/benchmarks.md and README's performance section: a measured figure (ms, µs, GB, MB,
    a ratio) appears only inside a block rendered from the results files."""
    import re

    from benchmarks import tables

    def prose(text):
        text = tables.MARKER.sub("", text)
        text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
        return re.sub(r"`[^`]*`", "", text)

    with open(os.path.join(REPO, "docs", "benchmarks.md")) as handle:
        pages = [prose(handle.read())]
    with open(os.path.join(REPO, "README.md")) as handle:
        readme = handle.read()
    pages.append(prose(readme[readme.index("## Performance") : readme.index("## Documentation")]))
    figure = re.compile(r"\d(?:[.,]\d+)?\s?(?:ms|µs|GB|MB|KB)\b|\d\.\d+×")
    for text in pages:
        assert figure.findall(text) == []


def _trace(tmp_path, steps):
    """A profiler trace file: `steps`, each a list of op types run after one step function
    call (its kernels' events, on a line of their own)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    plane = space.planes.add(name="/host:CPU")
    ids = {}

    def metadata(name):
        if name not in ids:
            ids[name] = len(ids) + 1
            plane.event_metadata[ids[name]].name = name
        return ids[name]

    calls, kernels = plane.lines.add(timestamp_ns=1000), plane.lines.add(timestamp_ns=1000)
    for index, kinds in enumerate(steps):
        start = index * 1_000_000
        call = "EagerLocalExecute: __inference_multi_step_on_iterator_3034"
        calls.events.add(metadata_id=metadata(call), offset_ps=start)
        for position, kind in enumerate(kinds):
            kernels.events.add(
                metadata_id=metadata(f"StatefulPartitionedCall/n{position}:{kind}"),
                offset_ps=start + 10 + position,
            )
    directory = tmp_path / "plugins" / "profile" / "run"
    directory.mkdir(parents=True)
    (directory / "host.xplane.pb").write_bytes(space.SerializeToString())
    return str(tmp_path)


def test_a_plain_step_is_the_most_common_count_of_the_traced_steps(tmp_path):
    from benchmarks import step_counts

    plain = ["Add", "_Send", "Mul"]
    sampled = plain + ["Sum", "_Send", "Cast", "Pack"]
    # The last call is left out of the plain step (the trace may cut it), not of the kernels.
    trace = _trace(tmp_path, [plain, plain, sampled, plain, sampled + sampled])
    assert step_counts.plain_step(trace) == {
        "kernels": 3,
        "sends": 1,
        "by_type": {"Add": 1, "Mul": 1, "_Send": 1},
    }
    assert step_counts.profiled_ops(trace, 5) == (3 * 3 + 7 + 14) / 5


def test_the_cost_model_is_solved_from_three_points():
    from benchmarks import step_counts

    # a·R + b·R·V + h with a = 12, b = 1, h = 52 (the MLP's counts before issue 57).
    model = step_counts.cost_model([(4, 6, 124), (2, 6, 88), (4, 8, 132)])
    assert (model["a"], model["b"], model["h"]) == (12.0, 1.0, 52.0)
    assert model["points"][1] == {"replicas": 2, "variables": 6, "kernels": 88}


def test_the_plain_step_targets_are_met_only_within_the_cost_model_and_without_transfers():
    from benchmarks import tables

    results = _results_copy()
    mlp = results["step_counts"]["runs"]["mlp"]["figures"]
    plain, model = mlp["added"]["plain_step"], mlp["cost_model"]
    what = "kernels added per MLP plain step (neither logged nor sampled; 4 replicas, 6 variables)"

    def rows():
        return {row[0]: row for row in tables.targets(results)[1]}

    plain.update(kernels=124, sends=3)
    model.update(a=12.0, b=1.0, h=52.0)
    assert rows()[what][2:4] == ("124: a·R + b·R·V + h with a = 12, b = 1, h = 52", False)
    assert rows()["device→host transfers added at a plain step (MLP)"][2:4] == ("3", False)
    plain.update(kernels=40, sends=0)
    model.update(a=4.0, b=1.0, h=3.5)
    assert rows()[what][2:4] == ("40: a·R + b·R·V + h with a = 4, b = 1, h = 3.50", True)
    assert rows()["device→host transfers added at a plain step (MLP)"][3] is True
    model.update(h=5.0)  # within 44 kernels, but a constant above its target
    assert rows()[what][3] is False


def test_the_recorded_step_counts_hold_the_plain_step_and_the_cost_model():
    from benchmarks import step_counts, tables

    plain = {"kernels": 10, "sends": 1, "by_type": {"Add": 9, "_Send": 1}}
    result = {
        "replicas": 2,
        "no_callback": {"plain_step": plain},
        "replica_callback_default": {"plain_step": dict(plain, kernels=13, sends=2)},
        "added": {"plain_step": {"kernels": 3, "sends": 1, "by_type": {"tb_replica/Sum": 3}}},
        "cost_model": step_counts.cost_model([(4, 6, 124), (2, 6, 88), (4, 8, 132)]),
    }
    figures = step_counts.recorded_figures(result)
    assert figures["plain_step"] == {
        "no_callback": {"kernels": 10, "sends": 1},
        "replica_callback_default": {"kernels": 13, "sends": 2},
    }
    assert figures["cost_model"]["h"] == 52.0
    assert tables._plain_cells(figures) == ("10 → 13 (+3)", "1 → 2 (+1)")
    assert tables._plain_cells({"added": {}}) == ("—", "—")
    del result["cost_model"]
    assert "cost_model" not in step_counts.recorded_figures(result)


def test_the_gpu_estimate_prices_the_counted_kernels_and_copies():
    from benchmarks import step_counts, tables

    # The MLP's counts: 4 replicas (3 send), a plain step +37 kernels and no `_Send`, 16 steps'
    # mean +51.69 (one sampled step: round(16 × 51.69) - 16 × 37 = 235 more).
    counted = {
        "replicas": 4,
        "added": {
            "ops_per_step": 51.69,
            "transfers_per_replica": 1.0,
            "plain_step": {"kernels": 37, "sends": 0},
        },
    }
    model = {"a": 3.0, "b": 1.0, "h": 1.0}
    variables = {"MobileNetV2": 158, "BERT-base": 199}
    found = step_counts.gpu_estimate(model, variables, counted, launch_us=5.0, copy_us=7.0)
    assert found["sampled_extra_kernels"] == 235 and found["sampled_every"] == 16
    cnn = found["models"]["MobileNetV2"]
    # 3·8 + 1·8·158 + 1 kernels; per replica no transfer, its fault `If`'s predicate.
    assert cnn["plain"] == {"kernels": 1289, "copies": 8, "us": 1289 * 5.0 + 8 * 7.0}
    # + 235 kernels; per replica its transfer, the predicate and the batch's 2 leaves (BERT: 4).
    assert cnn["sampled"] == {"kernels": 1524, "copies": 32, "us": 1524 * 5.0 + 32 * 7.0}
    assert cnn["mean_us"] == 6584.9  # 6501 + (7844 - 6501) / 16
    assert found["models"]["BERT-base"]["sampled"]["copies"] == 48
    # A plain step that sent one vector per sending replica (3 of 4): one copy more on a GPU.
    counted["added"]["plain_step"] = {"kernels": 37, "sends": 3}
    cnn = step_counts.gpu_estimate(model, variables, counted, replicas=2)["models"]["MobileNetV2"]
    assert cnn["plain"]["kernels"] == 2 * 3 + 2 * 158 + 1 and cnn["plain"]["copies"] == 4
    assert cnn["sampled"]["copies"] == 2 * (2 + 2)
    with pytest.raises(ValueError, match="plain step"):
        step_counts.gpu_estimate(model, variables, {"replicas": 4, "added": {}})
    # Recorded with the cost model; rendered from the results file's cost model.
    counted["added"]["plain_step"] = {"kernels": 37, "sends": 0}
    result = {"replicas": 4, "added": counted["added"], "gpu_estimate": found}
    result.update(no_callback={}, replica_callback_default={})
    assert step_counts.recorded_figures(result)["gpu_estimate"] is found
    results = _results_copy()
    mlp = results["step_counts"]["runs"]["mlp"]["figures"]
    mlp.update(replicas=4, cost_model=dict(model, points=[]))
    mlp["added"].update(ops_per_step=51.69, transfers_per_replica=1.0)
    mlp["added"]["plain_step"].update(kernels=37, sends=0)
    text = tables.render_gpu_estimate(results)
    assert "| MobileNetV2 | 158 | 1,289, 8 | 1,524, 32 | 6.5 ms / 7.8 ms / 6.6 ms |" in text
    assert "a = 3, b = 1, h = 1" in text and "https://github.com/NVIDIA/gdrcopy" in text
