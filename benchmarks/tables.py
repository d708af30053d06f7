"""The figures of README and docs/*.md, rendered from the results files (benchmarks/results/).

Every figure a page states sits between marker comments, `<!-- figures:NAME -->` …
`<!-- /figures:NAME -->`; this module renders each NAME from the results files and writes it
there (a table, or an inline phrase when the markers share a line).

    python -m benchmarks.tables           # rewrite the marked figures of README and docs/*.md
    python -m benchmarks.tables --check   # exit status 1 and the stale blocks' names if any

Runs without TensorFlow (the results are JSON files). A benchmark run with `--record` updates
its results file; run this after it.
"""

import argparse
import glob
import json
import os
import re
import sys

from benchmarks import common, fit_overhead, step_counts

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKER = re.compile(r"<!-- figures:([a-z_]+) -->(.*?)<!-- /figures:\1 -->", re.DOTALL)


def load_results(results_dir=None):
    """`{benchmark: its results document}` of every `*.json` in `results_dir` (default
    `common.RESULTS_DIR`)."""
    results = {}
    for path in sorted(glob.glob(os.path.join(results_dir or common.RESULTS_DIR, "*.json"))):
        with open(path) as handle:
            document = json.load(handle)
        results[document["benchmark"]] = document
    return results


# --- formatting ---------------------------------------------------------------------------


def number(x, digits=2):
    """`x` with `digits` decimals (thousands separated when it has none)."""
    return f"{x:,.0f}" if digits == 0 else f"{x:.{digits}f}"


def value(v, unit="", scale=1.0, digits=2):
    """A figure as text: a number (`0.22 s`), a range (`0.16–0.20 s`) or a median and its range
    (`2.83 s (2.72–2.98 s)`); `scale` converts it (1000: seconds to ms)."""
    suffix = f" {unit}" if unit and unit != "×" else unit

    def one(x):
        return number(x * scale, digits)

    if isinstance(v, dict):
        span = f"{one(v['min'])}–{one(v['max'])}{suffix}"
        return f"{one(v['median'])}{suffix} ({span})" if "median" in v else span
    return f"{one(v)}{suffix}"


def coefficient(x):
    """A solved coefficient: `12` when whole, else `12.5`."""
    return number(x, 0) if x == round(x) else number(x)


def ratio(v):
    """A ratio figure: `1.29× (1.19–1.44×)`."""
    return value(v, "×")


def high(v):
    """The worst (largest) value of a figure."""
    return v["max"] if isinstance(v, dict) else v


def source_line(run):
    """Where a run's figures come from: date, command, machine, versions, note."""
    machine = run["machine"]
    where = f"{machine['arch']}, {machine['cores']} cores"
    if machine.get("cpu_model"):
        where += f" ({machine['cpu_model']})"
    where += ", no GPU" if not machine.get("gpu") else f", {machine['gpu']}"
    versions = ", ".join(f"{k} {v}" for k, v in run["versions"].items() if v)
    how = "Transcribed from the run of" if run["source"] != "measured" else "Measured"
    command = f"`{run['command']}`" if run.get("command") else "no benchmark module"
    text = f"{how} {run['date']}: {command}; {where}"
    text += f"; {versions}" if versions else ""
    if run.get("load_average") is not None:
        text += f"; load average {run['load_average']}"
    note = run.get("note")
    return f"{text}. {note[0].upper()}{note[1:]}." if note else f"{text}."


def table(header, rows):
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def block(results, benchmark, keys, header, rows):
    """A table and the source line of each run it draws on."""
    runs = results[benchmark]["runs"]
    lines = dict.fromkeys(source_line(runs[key]) for key in keys)  # a run behind several once
    sources = "\n".join(f"- {line}" for line in lines)
    return f"\n{table(header, rows)}\n{sources}\n"


def run_figures(results, benchmark, key):
    return results[benchmark]["runs"][key]["figures"]


# --- the targets (README) ------------------------------------------------------------------


def _fit(results, model, figure):
    variants = run_figures(results, "fit_overhead", model)["variants"]
    return variants["replica_callback_default"][figure]["ratio"]


def _fit_pair(results, model, figure, unit, scale, digits):
    variants = run_figures(results, "fit_overhead", model)["variants"]
    base = variants["no_callback"][figure]["median"]
    with_callback = variants["replica_callback_default"][figure]["median"]
    return f"{number(with_callback * scale, digits)} vs {value(base, unit, scale, digits)}"


def _fit_limit(model, figure):
    """The ratio `fit_overhead.TARGETS` sets for a model's figure (the one statement of it)."""
    return next(
        t["max_ratio"]
        for t in fit_overhead.TARGETS
        if t["model"] == model and t.get("figure") == figure
    )


def _ratio_row(results, model, figure, unit, scale=1.0, digits=2):
    """`(target, figure, met)` of a `fit` ratio target."""
    limit = _fit_limit(model, figure)
    got = _fit(results, model, figure)
    text = f"{ratio(got)}; {_fit_pair(results, model, figure, unit, scale, digits)}"
    return f"≤ {limit}×", text, got["median"] <= limit


def _job(results, key):
    return run_figures(results, "job_scale", key)


def targets(results):
    """`(readme, more)`: one row per target, `(what a user pays, target, figure, met,
    benchmark)`; `readme` the ones README states, `more` the others (docs/benchmarks.md)."""
    counts = {m: run_figures(results, "step_counts", m)["added"] for m in ("mlp", "cnn", "guide")}
    loop = run_figures(results, "loop_overhead", "default")
    heartbeat = run_figures(results, "status_overhead", "fit_heartbeat")
    backend = run_figures(results, "backend", "default")
    render = run_figures(results, "frontend_render", "default")
    warm, cold = _job(results, "default_rust"), _job(results, "cold_rust")
    python, cold_live = _job(results, "default_python"), _job(results, "cold_live_rust")
    keep = [_job(results, k)["peak_rss_gb"] for k in ("keep_all_rust", "keep_all_python")]
    rss = [warm["peak_rss_gb"], python["peak_rss_gb"]]
    job = f"{warm['workers']} × {warm['replicas']} × {number(warm['steps'], 0)} job"
    job += f" ({number(warm['logdir_gb'], 1)} GB)"
    fit, scale = "`benchmarks.fit_overhead`", "`benchmarks.job_scale`"
    transfers = max(counts["mlp"]["transfers_per_replica"], counts["cnn"]["transfers_per_replica"])
    report = [high(warm["report_s"]), high(warm["report_peak_rss_gb"])]
    first = [high(warm["first_load_s"]), high(cold["first_load_s"])]
    readme = [
        ("time to the end of the first batch, MLP `fit`",
         *_ratio_row(results, "mlp", "first_batch_cpu_s", "s CPU"), fit),
        ("CPU per step, MobileNetV2 `fit`",
         *_ratio_row(results, "cnn", "steady_cpu_per_step", "ms", 1000, 0), fit),
        ("CPU per step, keras.io multi-GPU guide's model",
         *_ratio_row(results, "guide", "steady_cpu_per_step", "ms", 1000, 1), fit),
        ("a whole repeated `fit` (the second), MLP",
         *_ratio_row(results, "mlp", "second_fit_cpu_s", "s CPU"), fit),
        (f"first load of a {job}", "≤ 3 s",
         f"{value(warm['first_load_s'], 's')} read ahead by the plugin; "
         f"{value(cold['first_load_s'], 's')} opened before its first read (`--cold`)",
         max(first) <= 3, scale),
        ("the same, repeated", "≤ 0.3 s", value(warm["cached_load_s"], "s"),
         high(warm["cached_load_s"]) <= 0.3, scale),
        ("refresh after 10 new steps per worker", "≤ 1 s", value(warm["refresh_load_s"], "s"),
         high(warm["refresh_load_s"]) <= 1, scale),
        ("the same, opened before the plugin's first read (`--cold`)", "≤ 1 s",
         value(cold_live["refresh_load_s"], "s"), high(cold_live["refresh_load_s"]) <= 1, scale),
        ("TensorBoard's peak RSS on that job (RustBoard, Python loader)", "≤ 4 GB",
         f"{value(rss[0], 'GB')}, {value(rss[1], 'GB')}", max(rss) <= 4, scale),
        ("the same with `--samples_per_plugin replicas=0` (every sample kept)", "≤ 4 GB",
         f"{value(keep[0], 'GB', digits=1)}, {value(keep[1], 'GB', digits=1)}",
         max(keep) <= 4, scale),
        ("`tb-replica report` on that log dir", "≤ 40 s, ≤ 2 GB",
         f"{value(report[0], 's', digits=1)}, {value(report[1], 'GB')}",
         report[0] <= 40 and report[1] <= 2, scale),
        _pss_row(results),
    ]  # fmt: skip
    more = [
        ("first render of the tab (64 replicas × 10k steps)", "≤ 300 ms",
         value(render["median_render_ms"], "ms", digits=0),
         high(render["median_render_ms"]) <= 300, "`benchmarks.frontend_render`"),
        ("device→host transfers per replica added at a sampled step (MLP, MobileNetV2)", "≤ 1",
         number(transfers, 0), transfers <= 1, "`benchmarks.step_counts`"),
        _plain_kernels_row(results),
        _plain_transfers_row(results),
        ("bytes per replica per logged step, custom loop", "≤ 256",
         number(loop["event_bytes_per_logged_step_per_replica"]["probe_default"], 0),
         loop["event_bytes_per_logged_step_per_replica"]["probe_default"] <= 256,
         "`benchmarks.loop_overhead`"),
        ("CPU per step with the status heartbeat, on / off", "within the noise",
         ratio(heartbeat["steady_cpu_per_step_on_vs_off"]),
         heartbeat["steady_cpu_per_step_on_vs_off"]["min"] <= 1
         <= heartbeat["steady_cpu_per_step_on_vs_off"]["max"], "`benchmarks.status_overhead`"),
        ("the tab's requests against the scalars plugin (8 × 100k points)", "≤ 1×",
         ratio(backend["ratio_replicas_to_scalars"]), backend["ratio_replicas_to_scalars"] <= 1,
         "`benchmarks.backend`"),
    ]  # fmt: skip
    return readme, more


def _pss_row(results):
    """The target row of CPU per step under `ParameterServerStrategy`: a custom loop through
    `probe.schedule` against `coordinator.schedule`, and tf_keras `fit` with `ReplicaCallback`
    against without; met when both pairs' ratios straddle 1."""
    loop = run_figures(results, "pss_overhead", "default")
    fit = run_figures(results, "pss_overhead", "fit")
    loop_cpu, fit_cpu = loop["cpu_ms_per_step"], fit["cpu_ms_per_step"]
    kept = run_figures(results, "pss_overhead", "kept")
    text = f"custom loop {ratio(loop['cpu_ratio'])}; {number(loop_cpu['probe_schedule']['median'])}"
    text += f" vs {value(loop_cpu['coordinator_schedule']['median'], 'ms')} (a step of a few "
    text += f"kernels; {ratio(kept['cpu_ratio'])} against a loop keeping its results); "
    text += f"`fit` {ratio(fit['cpu_ratio'])}; "
    text += f"{number(fit_cpu['fit_replica_callback']['median'])} vs "
    text += f"{value(fit_cpu['fit']['median'], 'ms')}"
    met = all(f["cpu_ratio"]["min"] <= 1 <= f["cpu_ratio"]["max"] for f in (loop, fit))
    return (
        "CPU per step, `ParameterServerStrategy` (2 workers, 2 ps): custom loop, tf_keras `fit`",
        "within the noise", text, met, "`benchmarks.pss_overhead`",
    )  # fmt: skip


def _plain_kernels_row(results):
    """The target row of the kernels a plain MLP step adds (issue 57), with its cost model."""
    figures = run_figures(results, "step_counts", "mlp")
    kernels = figures["added"]["plain_step"]["kernels"]
    model = figures["cost_model"]
    text = f"{kernels}: a·R + b·R·V + h with a = {coefficient(model['a'])}, "
    text += f"b = {coefficient(model['b'])}, h = {coefficient(model['h'])}"
    met = kernels <= 44 and model["a"] <= 4 and model["b"] <= 1 and model["h"] <= 4
    return (
        "kernels added per MLP plain step (neither logged nor sampled; 4 replicas, 6 variables)",
        "≤ 44 (a ≤ 4, b ≤ 1, h ≤ 4)", text, met, "`benchmarks.step_counts --cost-model`",
    )  # fmt: skip


def _plain_transfers_row(results):
    """The target row of the device→host transfers (`_Send` kernels) a plain MLP step adds."""
    sends = run_figures(results, "step_counts", "mlp")["added"]["plain_step"]["sends"]
    return (
        "device→host transfers added at a plain step (MLP)", "0", number(sends, 0), sends == 0,
        "`benchmarks.step_counts`",
    )  # fmt: skip


def _targets_table(rows):
    rows = [
        (what, target, figure, "met" if met else "**known gap**", bench)
        for what, target, figure, met, bench in rows
    ]
    return "\n" + table(("what you pay", "target", "now", "", "benchmark"), rows) + "\n"


def render_targets(results):
    return _targets_table(targets(results)[0])


def render_targets_more(results):
    return _targets_table(targets(results)[1])


# --- docs/benchmarks.md --------------------------------------------------------------------

FIT_MODELS = {"mlp": "MLP", "guide": "guide", "cnn": "MobileNetV2"}
FIT_COLUMNS = (
    ("first_batch_cpu_s", 1, 2),
    ("steady_cpu_per_step", 1000, 1),
    ("second_fit_cpu_s", 1, 2),
    ("process_cpu_s", 1, 1),
)


def render_fit_overhead(results):
    rows = []
    for model, label in FIT_MODELS.items():
        for variant, name in (("no_callback", "no callback"), ("replica_callback_default", None)):
            cells = []
            for figure, scale, digits in FIT_COLUMNS:
                entry = run_figures(results, "fit_overhead", model)["variants"][variant][figure]
                shown = entry["median"] * scale
                text = number(shown, 0 if shown >= 100 else 1 if shown >= 10 else digits)
                if "ratio" in entry:
                    r = entry["ratio"]
                    text += (
                        f" ({r['median']:.2f}×; {value({'min': r['min'], 'max': r['max']}, '×')})"
                    )
                cells.append(text)
            rows.append((f"{label}, {name or '`ReplicaCallback()`'}", *cells))
    header = (
        "model, variant",
        "first batch (CPU s)",
        "steady step (CPU ms)",
        "second `fit` (CPU s)",
        "whole process (CPU s)",
    )
    return block(results, "fit_overhead", list(FIT_MODELS), header, rows)


def _plain_cells(figures):
    """The plain step's kernels and `_Send` kernels, without → with the callback (`—` for a run
    that did not count them)."""
    plain = figures.get("plain_step")
    if not plain:
        return "—", "—"
    base, with_callback = plain["no_callback"], plain["replica_callback_default"]
    added = figures["added"]["plain_step"]
    return tuple(
        f"{number(base[key], 0)} → {number(with_callback[key], 0)} (+{added[key]})"
        for key in ("kernels", "sends")
    )


def _plain_by_type(figures):
    """The plain step's added kernels by op type, most first, the model's and then the package's
    (its `tb_replica/` name scope): `24 L2Loss, 4 Max; the package's: 9 Bitcast, ...`."""
    by_type = figures["added"]["plain_step"]["by_type"]
    ranked = sorted(by_type.items(), key=lambda item: (-item[1], item[0]))
    prefix = "tb_replica/"
    model = [f"{n} `{kind}`" for kind, n in ranked if not kind.startswith(prefix)]
    own = [f"{n} `{kind[len(prefix) :]}`" for kind, n in ranked if kind.startswith(prefix)]
    return f"{', '.join(model)}; in its `tb_replica/` name scope: {', '.join(own)}"


def render_step_counts(results):
    rows = []
    for model, label in FIT_MODELS.items():
        figures = run_figures(results, "step_counts", model)
        added = figures["added"]
        sampled = added.get("sampled_step_kernels")
        sampled = "—" if sampled is None else f"+{sampled}"
        rows.append(
            (label, figures["replicas"], number(added["transfers_per_replica"], 0), sampled,
             f"+{number(added['ops_per_step'], 0)}", *_plain_cells(figures))
        )  # fmt: skip
    header = (
        "model",
        "replicas",
        "sampled step: transfers added per sending replica",
        "sampled step's kernels",
        "kernels (mean step)",
        "plain step's kernels",
        "plain step's `_Send`s",
    )
    text = block(results, "step_counts", list(FIT_MODELS), header, rows)
    mlp = run_figures(results, "step_counts", "mlp")
    if "cost_model" in mlp:
        model = mlp["cost_model"]
        points = ", ".join(
            f"({p['replicas']}, {p['variables']}) +{p['kernels']}" for p in model["points"]
        )
        text += (
            f"\nThe MLP's plain step, added kernels by (replicas, variables): {points}; as "
            f"a·R + b·R·V + h: a = {coefficient(model['a'])}, b = {coefficient(model['b'])}, "
            f"h = {coefficient(model['h'])}. The callback's kernels of that step by op type "
            f"({mlp['replicas']} replicas): {_plain_by_type(mlp)}.\n"
        )
    return text


def render_gpu_estimate(results):
    """What the default would add per step on 8 GPUs, on paper (`step_counts.gpu_estimate`),
    from the MLP's cost model and counts, with the latencies' sources."""
    figures = run_figures(results, "step_counts", "mlp")
    found = step_counts.gpu_estimate(figures["cost_model"], step_counts.GPU_VARIABLES, figures)

    def step(priced):
        return f"{number(priced['kernels'], 0)}, {priced['copies']}"

    def ms(us):
        return value(us, "ms", 0.001, 1)

    rows = [
        (name, m["variables"], step(m["plain"]), step(m["sampled"]),
         f"{ms(m['plain']['us'])} / {ms(m['sampled']['us'])} / {ms(m['mean_us'])}")
        for name, m in found["models"].items()
    ]  # fmt: skip
    header = (
        f"model ({found['replicas']} replicas)",
        "variables V",
        "plain step: kernels, copies",
        "sampled step: kernels, copies",
        "host time: plain / sampled / mean step",
    )
    model = figures["cost_model"]
    launch, copy = (
        "; ".join(f"[{label}]({url})" for label, url in sources)
        for sources in (step_counts.LAUNCH_SOURCES, step_counts.COPY_SOURCES)
    )
    leaves = ", ".join(f"{name} {n}" for name, n in step_counts.GPU_BATCH_LEAVES.items())
    return f"\n{table(header, rows)}\n" + (
        f"- Kernels a·R + b·R·V + h (a = {coefficient(model['a'])}, b = "
        f"{coefficient(model['b'])}, h = {coefficient(model['h'])}); a sampled step (1 in "
        f"{found['sampled_every']}) adds {found['sampled_extra_kernels']} more and copies each "
        f"replica's batch leaves to the host ({leaves}). Priced at "
        f"{value(found['launch_us'], 'µs', digits=0)} per launch ({launch}) and "
        f"{value(found['copy_us'], 'µs', digits=0)} per copy ({copy}).\n"
    )


def render_fit_alternated(results):
    figures = run_figures(results, "fit_alternated", "replica_callback_default")
    cpu = figures["median_cpu_per_step"]
    rows = [
        ("CPU per step, no callback / `ReplicaCallback()`",
         f"{value(cpu['no_callback'], 'ms', 1000, 1)} / "
         f"{value(cpu['replica_callback_default'], 'ms', 1000, 1)}"),
        ("ratio per step (range across rounds)", ratio(figures["ratio_per_step"])),
        ("ratio per `fit`", ratio(figures["ratio_per_fit"])),
    ]  # fmt: skip
    return block(results, "fit_alternated", ["replica_callback_default"], ("", ""), rows)


def render_loop_overhead(results):
    figures = run_figures(results, "loop_overhead", "default")
    wall = figures["ratio_to_no_probe"]
    sizes = figures["event_bytes_per_logged_step_per_replica"]
    cpu = figures.get("cpu_ratio_to_no_probe") or {}
    rows = [
        (f"{name}, {kind}", ratio(ratios[key]))
        for kind, ratios in (("CPU", cpu), ("wall", wall))
        for key, name in (
            ("probe_default", "step time with `ReplicaProbe`, default `update_freq`"),
            ("probe_every_step", "step time, every step logged"),
        )
        if key in ratios
    ]
    rows += [
        ("event bytes per replica per logged step, default", sizes["probe_default"]),
        ("the same, every step logged", sizes["probe_every_step"]),
    ]
    rows = [(name, number(v, 0) if isinstance(v, float) else v) for name, v in rows]
    return block(results, "loop_overhead", ["default"], ("figure", "value"), rows)


def render_pss_overhead(results):
    """docs/parameter-server.md's cost: CPU and wall per step of each variant of each path (the
    custom loop, tf_keras `fit`), the ratios."""
    rows = []
    for key, what in (
        ("default", "custom loop"),
        ("kept", "custom loop, results kept"),
        ("fit", "`fit`"),
    ):
        figures = run_figures(results, "pss_overhead", key)
        without, with_plugin = figures["cpu_ms_per_step"]
        for clock, unit in (("cpu", "CPU"), ("wall", "wall")):
            per_step = figures[f"{clock}_ms_per_step"]
            rows.append(
                (f"{what}: {unit} per step, `{without}` / `{with_plugin}`",
                 f"{value(per_step[without], 'ms')} / {value(per_step[with_plugin], 'ms')}")
            )  # fmt: skip
            rows.append((f"{what}: {unit} ratio (range across pairs)",
                         ratio(figures[f"{clock}_ratio"])))  # fmt: skip
        rows.insert(len(rows) - 2, (f"{what}: CPU added per step (median of the pairs)",
                                    value(figures["added_cpu_ms_per_step"], "ms")))  # fmt: skip
    keys = ["default", "kept", "fit"]
    runs = [run_figures(results, "pss_overhead", k) for k in keys]
    text = (
        f"\n{runs[0]['workers']} workers, {runs[0]['ps']} ps; steps per variant "
        f"{', '.join(str(r['steps']) for r in runs)}, alternated pairs "
        f"{', '.join(str(r['pairs']) for r in runs)} (custom loop, results kept, `fit`); "
        "medians:\n"
    )
    return text + block(results, "pss_overhead", keys, ("figure", "value"), rows)


def render_backend(results):
    figures = run_figures(results, "backend", "default")
    seconds = figures["median_seconds"]
    rows = [
        ("the tab's 3 requests, empty cache", value(seconds["replicas_tab_requests"], "s")),
        ("the same, the plugin's cache kept",
         value(seconds["replicas_tab_requests_cached"], "ms", 1000, 1)),
        ("the scalars dashboard's requests, same points",
         value(seconds["scalars_dashboard_requests"], "s")),
        ("ratio (empty cache)", ratio(figures["ratio_replicas_to_scalars"])),
    ]  # fmt: skip
    return block(results, "backend", ["default"], ("what", "time"), rows)


def render_frontend_render(results):
    figures = run_figures(results, "frontend_render", "default")
    rows = [
        ("from data to drawn (median of 5)", value(figures["median_render_ms"], "ms", digits=0)),
        ("from navigation, TensorBoard's answers included",
         value(figures["median_total_ms"], "s", 0.001, 2)),
    ]  # fmt: skip
    return block(results, "frontend_render", ["default"], ("what", "time"), rows)


def render_drift_overhead(results):
    figures = run_figures(results, "drift_overhead", "default")
    sent = figures["bytes_off_device_per_copy"]
    rows = [
        ("bytes leaving each copy's device per variable and check, default", sent["default"]),
        ("the same, exact (`variables_exact=True`): the MLP's variables",
         number(sent["exact_mlp_all_variables"], 0)),
        ("the same, exact: one 2048 × 2048 float32 variable",
         number(sent["exact_large_2048x2048"], 0)),
        ("one default check of the MLP (host call)",
         value(figures["check_ms"]["mlp_default"], "ms", digits=1)),
        ("one default check of a 2048 × 2048 variable, 4 copies",
         value(figures["check_ms"]["large_2048x2048_default"], "ms", digits=0)),
        ("`fit`, the full check at every step, CPU per step against no callback",
         ratio(figures["fit_ratio_median_cpu"]["every_stat_every_step_vs_no_callback"])),
    ]  # fmt: skip
    return block(results, "drift_overhead", ["default"], ("figure", "value"), rows)


def render_fingerprint_overhead(results):
    figures = run_figures(results, "fingerprint_overhead", "default")["ops_alone_by_batch"]
    batches = list(figures)
    rows = [
        ("example fingerprints, one replica",
         *(value(figures[b]["fingerprints_us_per_replica_step"], "µs", digits=1) for b in batches)),
        ("shared counts and sketches across 4 replicas",
         *(value(figures[b]["overlap_and_sketch_4_replicas_us_per_step"], "µs", digits=0)
           for b in batches)),
    ]  # fmt: skip
    header = ("ops alone, per replica batch of", *batches)
    return block(results, "fingerprint_overhead", ["default"], header, rows)


def render_multiworker_load(results):
    sizes = run_figures(results, "multiworker_load", "bytes")
    load = run_figures(results, "multiworker_load", "load")
    job = f"{load['workers']} × {load['replicas_per_worker']} × {number(load['steps'], 0)}"
    rows = [
        ("bytes per worker per logged step, 8 local replicas",
         number(sizes["bytes_per_worker_per_step"], 0)),
        (f"`load` of a job of {job} logged steps", value(load["load_seconds"], "s")),
        ("the same job read and analysed from TensorBoard's loaded data",
         value(load["read_and_findings_seconds"], "s")),
    ]  # fmt: skip
    keys = ["bytes", "load"]
    return block(results, "multiworker_load", keys, ("figure", "value"), rows)


def render_status_overhead(results):
    serve = run_figures(results, "status_overhead", "default")["serve"]
    write = run_figures(results, "status_overhead", "default")["write"]
    fit = run_figures(results, "status_overhead", "fit_heartbeat")
    cpu = run_figures(results, "status_overhead", "heartbeat_cpu")
    seconds = serve["median_seconds"]

    def ms(key, digits=1):
        return value(seconds[key], "ms", 1000, digits)

    rows = [
        ("MLP `fit`, CPU per step, heartbeat on / off",
         ratio(fit["steady_cpu_per_step_on_vs_off"])),
        ("CPU of one heartbeat", value(cpu["heartbeat_cpu_ms"], "ms")),
        ("CPU of a `fit`'s start and end records",
         value(cpu["fit_start_end_cpu_ms"], "ms", digits=1)),
        ("bytes per heartbeat", number(write["bytes_per_heartbeat"], 0)),
        ("bytes per hour at the default `flush_secs`",
         value(write["bytes_per_hour_default"], "KB", 0.001, 0)),
        (f"`/overview` of a {serve['workers']}-worker job and a run, an hour of heartbeats, cold",
         value(seconds["overview_cold"], "s")),
        ("the same again", ms("overview_again")),
        ("after one more heartbeat per run", ms("overview_after_heartbeat", 0)),
        ("`/status` of the job", ms("status_of_the_job")),
    ]  # fmt: skip
    keys = ["default", "fit_heartbeat", "heartbeat_cpu"]
    return block(results, "status_overhead", keys, ("figure", "value"), rows)


JOB_RUNS = {
    "default_rust": "RustBoard, read ahead",
    "default_python": "Python loader, read ahead",
    "cold_rust": "RustBoard, `--cold`",
    "cold_live_rust": "RustBoard, `--cold`, with a refresh",
    "keep_all_rust": "RustBoard, every sample kept",
    "keep_all_python": "Python loader, every sample kept",
}


def render_job_scale(results):
    rows = []
    for key, label in JOB_RUNS.items():
        f = _job(results, key)

        def cell(name, unit="s", digits=2, f=f):
            return "—" if f.get(name) is None else value(f[name], unit, digits=digits)

        report = cell("report_s", digits=1)
        if report and f.get("report_peak_rss_gb") is not None:
            report += f", {value(f['report_peak_rss_gb'], 'GB')}"
        rows.append(
            (label, cell("first_load_s"), cell("cached_load_s"), cell("refresh_load_s"),
             cell("live_first_load_s"), cell("live_load_s"),
             cell("peak_rss_gb", "GB", 2 if key.startswith(("default", "cold")) else 1), report)
        )  # fmt: skip
    header = (
        "loader, mode",
        "first load",
        "repeated",
        "refresh after 10 steps",
        "live first load",
        "live reloads (5)",
        "peak RSS",
        "report, its RSS",
    )
    job = _job(results, "default_rust")
    size = (
        f"\nThe job: {job['workers']} workers × {job['replicas']} replicas × "
        f"{number(job['steps'], 0)} logged steps, {number(job['logdir_gb'], 1)} GB of events.\n"
    )
    return size + block(results, "job_scale", list(JOB_RUNS), header, rows)


def render_memory(results):
    """Inline: TensorBoard's peak RSS on the 1.6 GB job, default sample against every sample."""
    sampled = [
        _job(results, k)["peak_rss_gb"] for k in ("cold_rust", "default_rust", "default_python")
    ]
    kept = [_job(results, k)["peak_rss_gb"] for k in ("keep_all_rust", "keep_all_python")]
    low = min(v["min"] if isinstance(v, dict) else v for v in sampled)
    return (
        f"{number(low, 1)}–{number(max(high(v) for v in sampled), 1)} GB instead of "
        f"{number(min(kept), 1)}–{number(max(kept), 1)} GB"
    )


def render_record_crc(results):
    crc = run_figures(results, "job_scale", "record_crc")
    rows = [
        ("the job's first read in one process, CPU, check off",
         value(crc["first_read_cpu_s_off"], "s")),
        ("the same, check on", value(crc["first_read_cpu_s_on"], "s")),
        ("the check's own CPU in that read", value(crc["check_cpu_s"], "s")),
        ("its share of the read", value(crc["check_share_percent"], "%", digits=1)),
    ]  # fmt: skip
    return block(results, "job_scale", ["record_crc"], ("figure", "value"), rows)


def render_heartbeat_bytes(results):
    """Inline: bytes per heartbeat."""
    write = run_figures(results, "status_overhead", "default")["write"]
    return f"{number(write['bytes_per_heartbeat'], 0)} bytes"


RENDERERS = {
    "targets": render_targets,
    "targets_more": render_targets_more,
    "fit_overhead": render_fit_overhead,
    "step_counts": render_step_counts,
    "gpu_estimate": render_gpu_estimate,
    "fit_alternated": render_fit_alternated,
    "loop_overhead": render_loop_overhead,
    "backend": render_backend,
    "pss_overhead": render_pss_overhead,
    "frontend_render": render_frontend_render,
    "drift_overhead": render_drift_overhead,
    "fingerprint_overhead": render_fingerprint_overhead,
    "multiworker_load": render_multiworker_load,
    "status_overhead": render_status_overhead,
    "job_scale": render_job_scale,
    "memory": render_memory,
    "heartbeat_bytes": render_heartbeat_bytes,
    "record_crc": render_record_crc,
}


# --- pages ---------------------------------------------------------------------------------


def pages(repo=REPO):
    """README.md and every docs/*.md."""
    return [os.path.join(repo, "README.md"), *sorted(glob.glob(os.path.join(repo, "docs", "*.md")))]


def rendered(text, results):
    """`text` with every marked block rendered from `results`.

    Raises:
      ValueError: a marker names no renderer (the known names listed).
    """

    def replace(match):
        name = match.group(1)
        if name not in RENDERERS:
            raise ValueError(f"unknown figures block {name!r}; known: {sorted(RENDERERS)}")
        return f"<!-- figures:{name} -->{RENDERERS[name](results)}<!-- /figures:{name} -->"

    return MARKER.sub(replace, text)


def stale(paths=None, results=None):
    """`[(path, block name)]` of the marked blocks whose text differs from the results."""
    results = load_results() if results is None else results
    found = []
    for path in paths or pages():
        with open(path) as handle:
            text = handle.read()
        fresh = dict(MARKER.findall(rendered(text, results)))
        for name, body in MARKER.findall(text):
            if fresh[name] != body:
                found.append((os.path.relpath(path, REPO), name))
    return found


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report stale blocks")
    args = parser.parse_args(argv)
    results = load_results()
    if args.check:
        found = stale(results=results)
        for path, name in found:
            print(f"{path}: figures:{name} differs from benchmarks/results", file=sys.stderr)
        if found:
            print("run `python -m benchmarks.tables` to render them", file=sys.stderr)
        return 1 if found else 0
    for path in pages():
        with open(path) as handle:
            text = handle.read()
        new = rendered(text, results)
        if new != text:
            with open(path, "w") as handle:
                handle.write(new)
            print(f"updated {os.path.relpath(path, REPO)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
