"""The overview and the status panel in headless Debian Chromium, on TensorBoard serving the
demo log dir: every run and job with its severity and status, the filter and links, a crash's and
a stall's panel, and TensorBoard's reload refreshing the overview and an open run.
"""

import json
import time

from browser_tab import DEMO_JOBS, open_tab, wait_ready
from conftest import TensorBoardServer


def test_overview_lists_every_demo_run_and_job_with_its_severity_counts(demo_server, demo_logs):
    from conftest import http_get

    from tb_replica_plugin import analysis, group
    from tb_replica_plugin.read import judge

    status, body, _ = http_get(demo_server.url + "/data/plugin/replicas/overview")
    assert status == 200
    rows = json.loads(body)["runs"]
    # The same counts as the report's own read of the log dir (every run, jobs merged).
    expected = {
        name: analysis.severity_counts(judge.find_run(run_data))
        for name, run_data in group.read_log_dir(demo_logs).items()
    }
    assert {row["run"]: row["findings"] for row in rows} == expected
    assert len(rows) >= 22
    assert sum(len(row["workers"]) == 2 for row in rows) == len(DEMO_JOBS)
    counts = {row["run"]: row["findings"] for row in rows}
    assert counts["batch_not_divisible/replicas"] == {"error": 1, "warning": 1, "info": 0}
    assert counts["balanced/replicas"] == {"error": 0, "warning": 0, "info": 0}
    worst = [(-c["error"], -c["warning"], -c["info"]) for c in (row["findings"] for row in rows)]
    assert worst == sorted(worst)


def test_overview_filter_click_and_link_open_the_run(demo_server, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    errors = []
    # The page itself (no TensorBoard around it) has no favicon: only the plugin's answers count.
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on(
        "response",
        lambda r: (
            errors.append(f"{r.status} {r.url}")
            if r.status >= 400 and "/data/plugin/replicas/" in r.url
            else None
        ),
    )
    page.goto(demo_server.url + "/data/plugin_entry.html?name=replicas", wait_until="load")
    wait_ready(page.main_frame)
    rows = "table.overview tbody tr"
    listed = page.eval_on_selector_all(rows, "els => els.map(e => e.dataset.run)")
    assert len(listed) >= 22 and "balanced/replicas" in listed
    assert page.is_visible("#overview") and not page.query_selector('section[data-view="batch"]')
    # The worst runs come first: the first row has an error, a clean run comes after it.
    assert page.get_attribute(f"{rows}:first-child", "data-severity") == "error"
    assert listed.index("balanced/replicas") > 0

    page.fill("#overview-filter", "^MW_")  # case-insensitive, like TensorBoard's run filter
    shown = page.eval_on_selector_all(rows, "els => els.map(e => e.dataset.run)")
    assert sorted(shown) == sorted(r for r in listed if r.startswith("mw_"))
    assert len(shown) == len(DEMO_JOBS)
    assert f"{len(shown)} of {len(listed)} runs" in page.inner_text(".overview-count")
    page.fill("#overview-filter", "(")
    assert "Not a regular expression" in page.inner_text(".overview-count")
    assert page.eval_on_selector_all(rows, "els => els.length") == 0
    page.fill("#overview-filter", "straggler")

    page.click('table.overview tr[data-run="mw_straggler/replicas"]')
    wait_ready(page.main_frame)
    assert "2 workers" in page.inner_text(".run-summary")
    assert page.is_hidden("#overview")
    assert page.url.endswith("#run=mw_straggler%2Freplicas")
    assert page.is_visible('section[data-view="step_time"]')

    # The URL keeps the run: reloading it opens the same run, not the overview.
    page.reload(wait_until="load")
    wait_ready(page.main_frame)
    assert page.input_value("#run-select") == "mw_straggler/replicas"
    assert page.is_hidden("#overview")
    assert "2 workers" in page.inner_text(".run-summary")
    # Back to the overview from the run picker.
    page.select_option("#run-select", "")
    wait_ready(page.main_frame)
    assert page.is_visible("#overview") and "#run=" not in page.url
    assert errors == []
    page.close()


def status_rows(page):
    """The status panel's worker rows: `(name, state, last step entered, completed)` each."""
    return page.eval_on_selector_all(
        '[data-view="status"] table.status-workers tbody tr',
        """els => els.map(e => [e.dataset.worker, e.dataset.state,
            e.querySelector('[data-part=step]').textContent,
            e.querySelector('[data-part=completed]').textContent])""",
    )


def _crash_line():
    """The line of the demo crash's assertion (demo/status_scenarios.py), the frame it names."""
    from demo import status_scenarios

    with open(status_scenarios.__file__, encoding="utf-8") as source:
        lines = source.read().splitlines()
    return 1 + next(i for i, line in enumerate(lines) if "assert_all_finite(inputs" in line)


def test_overview_status_column_and_the_status_panel_of_a_crash_and_a_stall(demo_server, browser):
    """The overview says how each run ended (a zero count is never red); a run opens on its
    status panel: the crash's exception, step and replica, the stalled job's workers and the
    stack of the one that stopped."""
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(demo_server.url + "/data/plugin_entry.html?name=replicas", wait_until="load")
    wait_ready(page.main_frame)

    def status_of(run):
        cell = f'table.overview tr[data-run="{run}"] td.status-cell'
        worst = page.query_selector(f"{cell} .status-worst")
        return (
            page.inner_text(f"{cell} .state-badge"),
            worst and worst.inner_text(),
            worst and worst.get_attribute("title"),
        )

    assert status_of("balanced/replicas") == ("finished", None, None)
    state, worst, full = status_of("crash/replicas")
    assert state == "crashed"
    assert worst == (
        "Training crashed at step 3 with InvalidArgumentError: an input is not finite : "
        "Tensor had NaN values."
    )
    assert full.startswith(worst) and "names replica 1" in full
    # worker_1 stalled before step 5, then was lost; worker_0 crashed: the stall is the cause.
    state, worst, full = status_of("mw_stall/replicas")
    assert state == "crashed"
    assert worst.startswith("Root cause: No progress for ")
    assert " s in step 5; then worker_1 stopped sending heartbeats" in worst
    assert worst.endswith("…") and full.startswith("Root cause (first observed failure): ")
    # Colour follows the count: zeros grey, non-zero errors red, non-zero warnings amber.
    colours = page.eval_on_selector_all(
        "table.overview td.count[data-severity]",
        "els => els.map(e => [e.dataset.severity, e.textContent, getComputedStyle(e).color])",
    )
    red, amber, grey = "rgb(198, 40, 40)", "rgb(230, 81, 0)", "rgb(158, 158, 158)"
    assert {colour for _, text, colour in colours if text == "0"} == {grey}
    assert {c for severity, text, c in colours if severity == "error" and text != "0"} == {red}
    assert {c for severity, text, c in colours if severity == "warning" and text != "0"} == {amber}

    page.click('table.overview tr[data-run="crash/replicas"]')
    wait_ready(page.main_frame)
    sections = page.eval_on_selector_all("#run-view section", "els => els.map(e => e.dataset.view)")
    assert sections[:2] == ["status", "findings"]
    panel = '[data-view="status"]'
    assert page.inner_text(f"{panel} .status-headline .state-badge") == "crashed"
    assert status_rows(page) == [["crash/replicas", "crashed", "3", "2"]]
    assert page.inner_text(f"{panel} .exception-class") == "InvalidArgumentError"
    assert page.inner_text(f"{panel} .exception-head") == (
        "InvalidArgumentError: an input is not finite : Tensor had NaN values"
    )
    assert page.inner_text(f"{panel} .exception-facts") == (
        f"step 3 · replica 1 · in your code at status_scenarios.py:{_crash_line()} in call"
    )
    assert "Training crashed at step 3" in page.inner_text(f"{panel} .root-cause")
    # The crash is in the findings list too; clicking it brings the status panel into view.
    page.click('[data-view="findings"] .finding[data-kind="training_crashed"]')
    page.wait_for_selector('section[data-view="status"].flash')

    page.select_option("#run-select", "mw_stall/replicas")
    wait_ready(page.main_frame)
    assert status_rows(page) == [
        ["worker_0", "crashed", "5", "—"],
        ["worker_1", "silent", "4", "—"],
    ]
    assert page.get_attribute(f"{panel} .root-cause", "data-worker") == "worker_1"
    worker_0 = f'{panel} .worker-detail[data-worker="worker_0"]'
    assert page.inner_text(f"{worker_0} .exception-class") == "UnavailableError"
    assert "worker_1 stopped sending heartbeats" in page.inner_text(f"{worker_0} .exception-facts")
    # worker_1's main thread, your frames shown, the library's collapsed: it waits in the demo's
    # wait_for_a_lock (multiworker.py), inside threading's wait.
    stack = f'{panel} .worker-detail[data-worker="worker_1"] .main-stack ol.stack'
    user = page.eval_on_selector_all(
        f"{stack} > li.frame.user", "els => els.map(e => e.textContent)"
    )
    assert user[-1].startswith("multiworker.py:") and user[-1].endswith(" in wait_for_a_lock")
    collapsed = page.eval_on_selector_all(
        f"{stack} > li.library-frames > details", "els => els.map(e => e.open)"
    )
    assert collapsed and not any(collapsed)
    assert "in wait" in page.text_content(f"{stack} > li.library-frames:last-child")
    assert not page.eval_on_selector(f"{panel} details.status-events", "e => e.open")
    assert errors == []
    page.close()


def test_tensorboard_reload_refreshes_the_overview(demo_server, browser):
    """Live: TensorBoard's reload (button or auto-reload) asks the tab to fetch fresh counts."""
    page, frame, errors = open_tab(demo_server, browser)
    assert frame.is_visible("#overview")
    fetched = []
    page.on("request", lambda r: fetched.append(r.url) if "/replicas/overview" in r.url else None)
    page.click("button.reload-button, [aria-label*='eload']")
    page.wait_for_timeout(2000)
    assert len(fetched) >= 1
    assert frame.eval_on_selector_all("table.overview tbody tr", "els => els.length") >= 22
    # An open run whose data did not change: only its status panel is asked again and redrawn
    # (a state changes with time: a running run's heartbeat ages, it may stall).
    frame.click('table.overview tr[data-run="mw_stall/replicas"]')
    wait_ready(frame)
    table = '[data-view="status"] table.status-workers'
    frame.eval_on_selector(table, "e => (e.dataset.marker = 'old')")
    fetched.clear()
    page.on(
        "request", lambda r: fetched.append(r.url) if "/data/plugin/replicas/" in r.url else None
    )
    page.click("button.reload-button, [aria-label*='eload']")
    frame.wait_for_selector(f"{table}:not([data-marker])", timeout=20_000)
    asked = sorted({url.split("/replicas/")[1].split("?")[0] for url in fetched})
    assert asked == ["overview", "status"]
    assert len(status_rows(frame)) == 2
    assert errors == []
    page.close()


def _write_steps(run_dir, first, count):
    """Writes `count` inputs steps from `first` on (2 replicas, batches of 4 and 3)."""
    import tensorflow as tf
    from conftest import mirrored

    from tb_replica_plugin import ReplicaProbe

    strategy = mirrored(2)
    probe = ReplicaProbe(run_dir, strategy, update_freq=1)
    for step in range(first, first + count):
        batch = strategy.experimental_distribute_values_from_function(
            lambda context: tf.zeros([4 - context.replica_id_in_sync_group, 3])
        )
        probe.observe_inputs(batch, step=step)
    probe.close()


def test_tensorboard_reload_redraws_the_open_run_when_it_has_new_steps(browser, tmp_path):
    """Live: a run still training is redrawn at TensorBoard's reload, without a page reload."""
    logdir = tmp_path / "live"
    run_dir = str(logdir / "training")
    _write_steps(run_dir, 0, 5)
    server = TensorBoardServer(str(logdir))
    try:
        server.wait_for("/data/plugin/replicas/runs", lambda status, body: b"training" in body)
        page, frame, errors = open_tab(server, browser)
        frame.click("a.overview-run")
        frame.wait_for_selector("#run-view[data-last-step='4']")
        assert "steps 0–4" in frame.inner_text(".run-summary")
        frame.evaluate("document.querySelector('#run-view').dataset.marker = 'old'")
        time.sleep(1.1)  # a later event file name
        _write_steps(run_dir, 5, 5)
        server.wait_for(
            "/data/plugin/replicas/overview", lambda status, body: b'"last_step": 9' in body
        )
        page.click("button.reload-button, [aria-label*='eload']")
        frame.wait_for_selector("#run-view[data-last-step='9']", timeout=20000)
        # Redrawn in place: the same page (the marker is still there), the new steps in the summary.
        assert frame.evaluate("document.querySelector('#run-view').dataset.marker") == "old"
        assert "steps 0–9" in frame.inner_text(".run-summary")
        assert errors == []
        page.close()
    finally:
        server.stop()
