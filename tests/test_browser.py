"""The "Replicas" tab in headless Debian Chromium, on TensorBoard serving the demo log dir.

Playwright drives `/usr/bin/chromium` (Debian package; no browser download). The test fails on
any console error of the page or the tab's iframe, and saves a screenshot to tests/artifacts/
(`UPDATE_SCREENSHOT=1` also copies it to demo/screenshot.png for the README).
"""

import json
import os
import re
import shutil

from browser_tab import ARTIFACTS, open_tab, wait_ready
from conftest import REPO, TensorBoardServer


def test_tab_shows_every_replica_and_the_imbalance_note(demo_server, browser, tmp_path):
    page, frame, errors = open_tab(demo_server, browser)

    runs = frame.eval_on_selector_all("#run-select option", "els => els.map(e => e.value)")
    assert {
        "balanced/replicas",
        "batch_not_divisible/inspect_dataset",
        "batch_not_divisible/replicas",
        "empty_last_shard/replicas",
        "gradient_outlier/clean",
        "gradient_outlier/replicas",
        "nan_replica/clean",
        "nan_replica/replicas",
        "shape_mismatch/replicas",
        "mw_clean/replicas",
        "mw_drift/replicas",
        "mw_fit_tf_keras/replicas",
        "mw_straggler/replicas",
        "mw_uneven_shard/replicas",
        "mw_unsharded/replicas",
        "weight_drift/batchnorm_fit",
        "weight_drift/skipped_allreduce",
        "weight_drift/synchronized",
    } <= set(runs)
    assert not [run for run in runs if "/worker_" in run]

    frame.select_option("#run-select", "batch_not_divisible/replicas")
    wait_ready(frame)
    legend = frame.inner_text('[data-view="batch"]')
    for replica in range(4):
        assert f"replica {replica}" in legend
    notes = frame.inner_text('[data-view="notes"]')
    assert "global batch 30 is not divisible by 4 replicas" in notes
    assert "Replica 3 got 6 examples, replica 0 got 8" in notes
    severities = frame.eval_on_selector_all(
        '[data-view="findings"] .finding', "els => els.map(e => e.dataset.severity)"
    )
    assert severities == ["error", "warning"]
    assert frame.is_visible('[data-view="heatmap"] canvas')

    frame.select_option("#run-select", "shape_mismatch/replicas")
    wait_ready(frame)
    mismatched = frame.eval_on_selector_all(
        '[data-view="shapes"] tr.mismatch', "els => els.map(e => e.textContent)"
    )
    assert len(mismatched) == 1 and "image" in mismatched[0]
    assert (
        "[4, 24, 24, 3]" in mismatched[0] or "4×24×24×3" in mismatched[0] or "24" in mismatched[0]
    )

    frame.select_option("#run-select", "empty_last_shard/replicas")
    wait_ready(frame)
    assert "Replicas 2, 3 got 0 examples" in frame.inner_text('[data-view="notes"]')

    os.makedirs(ARTIFACTS, exist_ok=True)
    shot = os.path.join(ARTIFACTS, "replicas_tab.png")
    page.set_viewport_size({"width": 1400, "height": 2000})
    wait_ready(frame)
    page.wait_for_timeout(300)
    page.screenshot(path=shot, full_page=True)
    if os.environ.get("UPDATE_SCREENSHOT"):
        shutil.copy(shot, os.path.join(REPO, "demo", "screenshot.png"))
    assert errors == []

    frame.select_option("#run-select", "balanced/replicas")
    wait_ready(frame)
    assert "No problems found in this run." in frame.inner_text('[data-view="findings"]')
    assert errors == []
    page.close()


def test_clicking_a_finding_zooms_the_charts_to_its_steps(demo_server, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.goto(demo_server.url + "/data/plugin_entry.html?name=replicas", wait_until="load")
    wait_ready(page.main_frame)
    page.select_option("#run-select", "batch_not_divisible/replicas")
    wait_ready(page.main_frame)
    batch = page.locator('section[data-view="batch"]')
    # Before the click the charts show the whole run: steps 0..11 (3 epochs of 4 steps).
    assert float(batch.get_attribute("data-zoom-max")) >= 11
    finding = page.locator('[data-view="findings"] .finding[data-kind="first_batch_uneven"]')
    assert "The first batch splits unevenly" in finding.inner_text()
    finding.click()
    page.wait_for_function(
        "document.querySelector('section[data-view=\"batch\"]').dataset.zoomMax < 11"
    )
    # The finding is at step 0 only: the zoom frames it with a margin of 2 steps.
    assert float(batch.get_attribute("data-zoom-min")) == 0
    assert float(batch.get_attribute("data-zoom-max")) == 3
    assert "flash" in batch.get_attribute("class")


def matrix_cells(frame, section):
    return frame.eval_on_selector_all(
        f'[data-view="{section}"] table.match-matrix td',
        "els => els.map(e => [Number(e.dataset.r), Number(e.dataset.q), Number(e.dataset.share)])",
    )


def test_rng_and_data_sections(demo_server, browser):
    page, frame, errors = open_tab(demo_server, browser)

    frame.select_option("#run-select", "dropout_fit/replicas")
    wait_ready(frame)
    kinds = frame.eval_on_selector_all(
        '[data-view="findings"] .finding', "els => els.map(e => e.dataset.kind)"
    )
    assert "identical_rng_streams" in kinds
    assert frame.is_visible('[data-view="rng"] [data-generator="dropout"] table.match-matrix')
    cells = matrix_cells(frame, "rng")
    assert len(cells) == 16
    assert all(share == 1.0 for r, q, share in cells if r != q)
    # text_content: tables below the fold are not rendered (content-visibility: auto), and
    # inner_text of an unrendered element is empty.
    caption = frame.text_content('[data-view="rng"] table.rng-states caption')
    assert "replicas 0, 1, 2, 3 draw the same numbers" in caption
    frame.click('[data-view="findings"] .finding[data-kind="identical_rng_streams"]')
    frame.wait_for_selector('section[data-view="rng"].flash')

    frame.select_option("#run-select", "generator_loop/replicas")
    wait_ready(frame)
    assert "No problems found" in frame.inner_text('[data-view="findings"]')
    cells = matrix_cells(frame, "rng")
    assert all(share == 0.0 for r, q, share in cells if r != q)
    assert "every replica draws its own numbers" in frame.text_content('[data-view="rng"]')

    frame.select_option("#run-select", "unsharded_pipeline/replicas")
    wait_ready(frame)
    cells = matrix_cells(frame, "data")
    assert all(share == 1.0 for r, q, share in cells if r != q)
    assert "duplicate_examples" in frame.inner_text('[data-view="findings"]')
    os.makedirs(ARTIFACTS, exist_ok=True)
    page.set_viewport_size({"width": 1400, "height": 2400})
    page.wait_for_timeout(300)
    page.screenshot(path=os.path.join(ARTIFACTS, "rng_data_sections.png"), full_page=True)

    frame.select_option("#run-select", "sharded_pipeline/replicas")
    wait_ready(frame)
    cells = matrix_cells(frame, "data")
    assert len(cells) == 16 and all(share == 0.0 for r, q, share in cells if r != q)
    assert errors == []
    page.close()


def test_watched_values_section(demo_server, browser):
    page, frame, errors = open_tab(demo_server, browser)
    frame.select_option("#run-select", "gather_mismatch/replicas")
    wait_ready(frame)
    kinds = frame.eval_on_selector_all(
        '[data-view="findings"] .finding', "els => els.map(e => e.dataset.kind)"
    )
    assert kinds == ["gather_would_fail", "gather_would_fail", "per_replica_result"]
    # text_content: sections below the fold are not rendered (content-visibility: auto).
    logits = '[data-view="watch"] [data-watched="logits"]'
    mismatch = frame.eval_on_selector_all(
        f"{logits} table.shapes tr.mismatch td", "els => els.map(e => e.textContent)"
    )
    assert mismatch == ["[4, 12] float32", "[4, 10] float32"] * 2
    stats = frame.eval_on_selector_all(
        f'{logits} table.watch-stats tr[data-stat="nrows"] td',
        "els => els.map(e => e.textContent)",
    )
    assert stats == ["nrows", "4", "4", "4", "4"]
    frame.click('[data-view="findings"] .finding[data-kind="gather_would_fail"]')
    frame.wait_for_selector('section[data-view="watch"].flash')

    frame.select_option("#run-select", "ragged_text/replicas")
    wait_ready(frame)
    shapes = frame.eval_on_selector_all(
        '[data-view="shapes"] table.shapes[data-step="1"] tbody tr:first-child td',
        "els => els.map(e => e.textContent)",
    )
    assert shapes == ["[1, None] int32", "[1, None] int32", "[0, None] int32", "[0, None] int32"]
    assert errors == []
    page.close()


def test_series_of_many_replicas_are_drawn_in_blocks(demo_server, browser):
    """Beyond 64 replicas the per-replica drift and gradient charts draw the blocks /variables
    and /gradients send (`replica_blocks=64`), one line each, labelled with its replicas.
    skipped_allreduce's and gradient_outlier's answers are widened to 100 replicas (25 copies of
    their 4) and cut as the server cuts them."""
    import numpy as np

    from tb_replica_plugin.core.downsample import floats, pool_replicas

    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    asked = []
    _, blocks = pool_replicas([np.zeros((1, 100))], 64)  # {"pooled": {"blocks": [...]}}

    def widened(values, size):  # 100 replicas: 25 copies of the `size` answered
        return [values[r % size] for r in range(100)]

    def in_blocks(rows, size):  # widened, then cut as the server cuts
        (cut,), _ = pool_replicas([np.array([widened(row, size) for row in rows], float)], 64)
        return floats(cut)

    def answer(route, widen):  # the route's real answer, of 100 replicas in 64 blocks
        asked.append(route.request.url)
        body = route.fetch().json()
        widen(body, len(body["replicas"]))
        body["replicas"] = list(range(100))
        route.fulfill(json={**body, **blocks})

    def variables(body, size):
        body["devices"] = widened(body["devices"], size)
        for variable in body["variables"]:
            variable["present"] = widened(variable["present"], size)
        for top in body["top"]:
            top["rel_l2"], top["max_abs"] = (in_blocks(top[k], size) for k in ("rel_l2", "max_abs"))

    def inputs(body, size):  # batch sizes: the smallest of a block (the largest for _max)
        body["devices"] = widened(body["devices"], size)
        for key in ("batch_size", "batch_size_min", "batch_size_max"):
            wide = np.array([widened(row, size) for row in body[key]])
            (cut,), _ = pool_replicas([wide], 64, smallest=() if key.endswith("max") else (0,))
            body[key] = cut.tolist()

    def gradients(body, size):
        for key in ("global_norm", "ratio", "loss", "layer_norms", "layer_ratio"):
            body[key] = in_blocks(body[key], size)
        for event in body["nonfinite"]:
            for key in ("grad_nan", "grad_inf", "loss_nan", "loss_inf"):
                event[key] = widened(event[key], size)

    widening = []

    def open_widened(run, route, widen):  # the run's view, `route`'s answers widened
        asked.clear()
        for pattern in widening:
            page.unroute(pattern)
        widening[:] = [f"**/data/plugin/replicas/{route}?*"]
        page.route(widening[0], lambda request: answer(request, widen))
        entry = "/data/plugin_entry.html?name=replicas#run="
        page.goto(demo_server.url + entry + run.replace("/", "%2F"), wait_until="load")
        wait_ready(page.main_frame)
        assert asked and all("replica_blocks=64" in url for url in asked)

    open_widened("weight_drift/skipped_allreduce", "variables", variables)
    chart = page.query_selector('[data-view="deviation"] .chart')
    assert chart.get_attribute("data-lines") == "64"  # 100 replicas: blocks of 1 or 2
    legend = page.inner_text('[data-view="deviation"]')
    assert "replicas 0–1" in legend and "replicas 97–98" in legend and "replica 99" in legend
    assert "100 replicas in 64 blocks" in legend

    open_widened("gradient_outlier/replicas", "gradients", gradients)
    section = page.inner_text('[data-view="gradients"]')
    # Replica 2 (the outlier) and 3 are block 1; the largest ratio names the block.
    assert "Largest ratio to the median of the other replicas: replicas 2–3, ×" in section
    assert "100 replicas in 64 blocks" in section
    norm = page.inner_text('[data-view="gradients"] [data-part="norm"]')
    assert "replicas 0–1" in norm and "replicas 2–3" in norm and "replica 99" in norm

    open_widened("empty_last_shard/replicas", "inputs", inputs)
    batch = page.inner_text('[data-view="batch"]')
    assert "replicas 0–1" in batch and "replicas 2–3" in batch and "replica 99" in batch
    assert errors == []
    page.close()


def test_weight_drift_and_placement_sections(demo_server, browser):
    page, frame, errors = open_tab(demo_server, browser)

    frame.select_option("#run-select", "weight_drift/skipped_allreduce")
    wait_ready(frame)
    drift = frame.inner_text('[data-view="drift"]')
    assert "Most divergent variables" in drift
    assert frame.is_visible('[data-view="drift"] canvas')
    assert frame.get_attribute('[data-view="drift"] .note', "data-drift") == "some"
    legend = frame.inner_text('[data-view="deviation"]')
    for replica in (1, 2, 3):
        assert f"replica {replica}" in legend
    rows = frame.eval_on_selector_all(
        '[data-view="placement"] tbody tr',
        "els => els.map(e => [e.dataset.variable, e.dataset.mirrored, e.className])",
    )
    assert len(rows) == 4 and all(m == "true" and "drift" in c for _, m, c in rows)
    kinds = frame.eval_on_selector_all(
        '[data-view="findings"] .finding', "els => els.map(e => e.dataset.kind)"
    )
    assert kinds == ["variable_drift"]  # one cause (no all-reduce): one finding for 4 variables
    finding = '[data-view="findings"] .finding[data-kind="variable_drift"]'
    assert "4 items" in frame.inner_text(f"{finding} .finding-head")
    assert not frame.is_visible(f"{finding} .finding-item")  # collapsed
    frame.click(f"{finding} .finding-items summary")
    items = frame.eval_on_selector_all(
        f"{finding} .finding-item",
        "els => els.map(e => [e.querySelector('.item-name').textContent, e.dataset.severity])",
    )
    assert [severity for _, severity in items] == ["error"] * 4
    assert [name.rsplit("/", 1)[-1] for name, _ in items] == ["kernel", "bias"] * 2
    assert frame.is_visible(f"{finding} .finding-item")
    assert "replicas 1, 2, 3" in frame.inner_text(f"{finding} .finding-item")
    assert frame.query_selector('[data-view="drift"].flash') is None  # expanding is not selecting
    frame.click(f"{finding} .message")
    frame.wait_for_selector('[data-view="drift"].flash', timeout=5_000)

    frame.select_option("#run-select", "weight_drift/synchronized")
    wait_ready(frame)
    assert frame.get_attribute('[data-view="drift"] .note', "data-drift") == "none"
    assert "bit-identical" in frame.inner_text('[data-view="drift"]')
    assert "0 (bit-identical)" in frame.inner_text('[data-view="placement"]')

    frame.select_option("#run-select", "weight_drift/batchnorm_fit")
    wait_ready(frame)
    drifting = frame.eval_on_selector_all(
        '[data-view="placement"] tbody tr.drift', "els => els.map(e => e.dataset.variable)"
    )
    assert sorted(name.rsplit("/", 1)[-1] for name in drifting) == [
        "moving_mean",
        "moving_variance",
    ]
    os.makedirs(ARTIFACTS, exist_ok=True)
    frame.select_option("#run-select", "weight_drift/skipped_allreduce")
    wait_ready(frame)
    frame.eval_on_selector('[data-view="drift"]', "el => el.scrollIntoView()")
    page.wait_for_timeout(300)
    page.screenshot(path=os.path.join(ARTIFACTS, "weight_drift_tab.png"), full_page=False)
    assert errors == []
    page.close()


def test_multi_worker_job_grouped_by_worker(demo_server, browser):
    """A 2-worker job: one view, replicas labelled by worker, the straggler in its own table."""
    page, frame, errors = open_tab(demo_server, browser)

    frame.select_option("#run-select", "mw_straggler/replicas")
    wait_ready(frame)
    assert "2 workers" in frame.inner_text(".run-summary")
    rows = frame.eval_on_selector_all(
        '[data-view="step_time"] table.step-time tbody tr',
        "els => els.map(e => [e.dataset.worker, e.className, e.textContent])",
    )
    assert [(name, cls) for name, cls, _ in rows] == [("worker_0", ""), ("worker_1", "straggler")]
    finding = frame.inner_text('[data-view="findings"] .finding[data-kind="straggler"]')
    assert "replica 1 on worker_1" in finding and "straggler" in finding
    legend = frame.inner_text('[data-view="batch"]')
    assert "replica 0 · worker_0" in legend and "replica 1 · worker_1" in legend
    # Clicking the finding scrolls to the step-time view.
    frame.click('[data-view="findings"] .finding[data-kind="straggler"]')
    frame.wait_for_function(
        "document.querySelector('section[data-view=\"step_time\"]').classList.contains('flash')"
    )

    frame.select_option("#run-select", "mw_uneven_shard/replicas")
    wait_ready(frame)
    workers = frame.eval_on_selector_all(
        '[data-view="shapes"] table.shapes:first-of-type tr.worker-row th[data-worker]',
        "els => els.map(e => e.textContent)",
    )
    assert workers[:2] == ["worker_0", "worker_1"]
    cells = frame.eval_on_selector_all(
        '[data-view="shapes"] tbody tr:first-child td', "els => els.map(e => e.textContent)"
    )
    assert cells[:2] == ["[4, 4] float32", "[3, 4] float32"]

    # Both workers fed the same examples: the data matrix shows the cross-worker pair, grouped
    # by worker, and the gradients legend names each replica's worker.
    frame.select_option("#run-select", "mw_unsharded/replicas")
    wait_ready(frame)
    matrix = '[data-view="data"] table.match-matrix'
    assert frame.eval_on_selector_all(
        matrix + " tr.worker-row th[data-worker]", "els => els.map(e => e.textContent)"
    ) == ["worker_0", "worker_1"]
    cross = frame.eval_on_selector_all(
        matrix + " td.cross-worker",
        "els => els.map(e => [e.dataset.r, e.dataset.q, e.dataset.share, e.className])",
    )
    assert cross == [["0", "1", "1", "match cross-worker"], ["1", "0", "1", "match cross-worker"]]
    rows = frame.eval_on_selector_all(matrix + " tbody th", "els => els.map(e => e.textContent)")
    assert rows == ["replica 0 · worker_0", "replica 1 · worker_1"]
    finding = frame.inner_text('[data-view="findings"] .finding[data-kind="duplicate_examples"]')
    assert "worker_0" in finding and "worker_1" in finding
    legend = frame.inner_text('[data-view="gradients"]')
    assert "replica 0 · worker_0" in legend and "replica 1 · worker_1" in legend
    assert errors == []
    page.close()


def test_gradients_tab_shows_the_outlier_replica_and_the_nan_step(demo_server, browser):
    page, frame, errors = open_tab(demo_server, browser)
    frame.select_option("#run-select", "gradient_outlier/replicas")
    wait_ready(frame)
    section = '[data-view="gradients"]'
    assert frame.get_attribute(f"{section} [data-peak-replica]", "data-peak-replica") == "2"
    text = frame.inner_text(section)
    assert "Largest ratio to the median of the other replicas: replica 2" in text
    for part in ("norm", "ratio", "loss", "layers"):
        assert frame.is_visible(f'{section} [data-part="{part}"]'), part
    for replica in range(4):
        assert f"replica {replica}" in frame.inner_text(f'{section} [data-part="norm"]')
    kinds = frame.eval_on_selector_all(
        '[data-view="findings"] .finding', "els => els.map(e => e.dataset.kind)"
    )
    assert kinds == ["gradient_norm_outlier"]
    assert "Replica 2's local gradient norm" in frame.inner_text('[data-view="findings"]')
    # The layer × replica heatmap follows the chosen step.
    steps = frame.eval_on_selector_all("#layer-step option", "els => els.map(e => e.value)")
    assert steps == ["0", "4", "8", "12"]
    frame.select_option("#layer-step", "4")
    frame.wait_for_function(
        "document.querySelector('canvas.layer-heatmap')?.dataset.step === '4'", timeout=30_000
    )
    wait_ready(frame)

    frame.select_option("#run-select", "gradient_outlier/clean")
    wait_ready(frame)
    assert "No problems found in this run." in frame.inner_text('[data-view="findings"]')

    frame.select_option("#run-select", "nan_replica/replicas")
    wait_ready(frame)
    row = frame.inner_text(f'{section} [data-part="nonfinite"] tr[data-step="5"]')
    assert "replica 1" in row and "loss NaN" in row
    assert "replica 0" not in row
    # The culprit batch of replica 1 was captured: its label example 1 is the NaN.
    cell = f'{section} [data-part="nonfinite"] tr[data-step="5"] [data-part="captured"]'
    assert frame.get_attribute(cell, "data-replica") == "1"
    assert "y: example 1" in frame.inner_text(cell)
    head = frame.eval_on_selector(
        f"{cell} a",
        "a => fetch(a.href).then(r => r.arrayBuffer()).then(b => [...new Uint8Array(b, 0, 2)])",
    )
    assert bytes(head) == b"PK"  # a .npz (zip) file
    finding = frame.inner_text('[data-view="findings"] .finding[data-kind="nonfinite_gradients"]')
    assert "Replica 1" in finding and "step 5" in finding
    os.makedirs(ARTIFACTS, exist_ok=True)
    frame.select_option("#run-select", "gradient_outlier/replicas")
    wait_ready(frame)
    frame.eval_on_selector(section, "el => el.scrollIntoView()")
    page.screenshot(path=os.path.join(ARTIFACTS, "gradients_tab.png"))
    assert errors == []
    page.close()


def test_a_run_of_many_replicas_is_asked_for_fewer_steps(demo_server, browser):
    """The run view asks at most 2^18 step × replica values per series (plugin.run_view_query):
    a 2,048-replica entry gets `max_points=128`, a 4-replica run every step up to 10,000."""
    from tb_replica_plugin.plugin import run_view_query

    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    asked = []
    page.on("request", lambda r: asked.append(r.url) if "max_points=" in r.url else None)

    def many_replicas(route):  # the overview says balanced/replicas has 2,048 replicas
        body = route.fetch().json()
        for entry in body["runs"]:
            if entry["run"] == "balanced/replicas":
                entry["replicas"] = list(range(2048))
        route.fulfill(json=body)

    page.route("**/data/plugin/replicas/overview", many_replicas)
    entry = demo_server.url + "/data/plugin_entry.html?name=replicas#run="
    page.goto(entry + "balanced%2Freplicas", wait_until="load")
    page.wait_for_function("['ready', 'error'].includes(document.body.dataset.state)")
    routes = {url.split("/replicas/")[1].split("?")[0]: url for url in asked}
    assert {"inputs", "gradients", "rng", "data", "variables"} <= set(routes)
    # The rng view draws the last step's groups only: it asks 2 steps.
    assert "max_points=2&" in routes["rng"] and run_view_query(2048, "rng")["max_points"] == "2"
    others = [url for url in asked if "/rng?" not in url]
    assert all("max_points=128&" in url or url.endswith("max_points=128") for url in others)
    assert run_view_query(2048)["max_points"] == "128"
    assert "matrix_side=640" in routes["rng"] and "matrix_side=640" in routes["data"]
    for route in ("inputs", "gradients", "variables"):
        assert "replica_blocks=64" in routes[route], route

    asked.clear()
    page.unroute("**/data/plugin/replicas/overview")
    page.goto(entry + "gradient_outlier%2Freplicas", wait_until="load")
    wait_ready(page.main_frame)
    assert asked and all("max_points=10000" in url for url in asked if "/rng?" not in url)
    page.close()


def test_the_match_matrix_of_many_replicas_is_a_canvas(demo_server, browser):
    """Beyond 64 replicas (a job of many workers) the rng matrix is drawn on a canvas, not as a
    table of R² cells. dropout_fit's /rng answer is widened to 100 replicas: 25 copies of its 4
    replicas, each copy drawing the same numbers within itself (4 × 3 ordered pairs each)."""
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))

    def widened(route):
        body = route.fetch().json()
        size = len(body["replicas"])
        pick = [r % size for r in range(100)]
        body["replicas"] = list(range(100))
        for gen in body["generators"]:
            gen["match"] = [
                [
                    gen["match"][a % size][b % size] if a // size == b // size else 0.0
                    for b in range(100)
                ]
                for a in range(100)
            ]
            for key in ("last_state", "last_fingerprint"):
                gen[key] = [gen[key][r] for r in pick]
            for key in ("stream_groups", "state_groups"):
                gen[key] = [[groups[r] for r in pick] for groups in gen[key]]
        route.fulfill(json=body)

    page.route("**/data/plugin/replicas/rng?*", widened)
    page.goto(
        demo_server.url + "/data/plugin_entry.html?name=replicas#run=dropout_fit%2Freplicas",
        wait_until="load",
    )
    wait_ready(page.main_frame)
    block = '[data-view="rng"] [data-generator="dropout"]'
    canvas = page.query_selector(block + " canvas.match-canvas")
    assert canvas is not None and not page.query_selector(block + " table.match-matrix")
    assert canvas.get_attribute("data-replicas") == "100"
    assert canvas.get_attribute("data-matches") == str(25 * 4 * 3)
    assert "150 pairs above 0" in page.text_content(block + " figcaption")

    # 1,000 replicas (250 copies): the tab asks matrix_side=640 and draws the blocks /rng sends.
    import numpy as np

    from tb_replica_plugin.core.downsample import pool_pairs

    asked, blocks = [], {}  # the blocks sent, per generator

    def pooled(route):
        asked.append(route.request.url)
        body = route.fetch().json()
        size = len(body["replicas"])
        body["replicas"] = list(range(1000))
        for gen in body["generators"]:
            copy = np.kron(np.eye(1000 // size), np.array(gen["match"]))  # within each copy
            gen["match"] = pool_pairs(copy, 640).tolist()
            blocks[gen["name"]] = gen["match"]
            gen["pooled"] = {"side": 640, "pairs_above_0": 250 * 6}
            for key in ("last_state", "last_fingerprint"):
                gen[key] = [gen[key][r % size] for r in range(1000)]
            for key in ("stream_groups", "state_groups"):
                gen[key] = [[groups[r % size] for r in range(1000)] for groups in gen[key]]
        route.fulfill(json=body)

    page.unroute("**/data/plugin/replicas/rng?*")
    page.route("**/data/plugin/replicas/rng?*", pooled)
    page.reload(wait_until="load")
    wait_ready(page.main_frame)
    assert asked and all("matrix_side=640" in url for url in asked)
    canvas = page.query_selector(block + " canvas.match-canvas")
    assert canvas.get_attribute("data-replicas") == "1000"
    assert canvas.get_attribute("data-blocks") == "640"
    assert canvas.get_attribute("data-matches") == str(2 * 1500)
    assert "1500 pairs above 0" in page.text_content(block + " figcaption")
    canvas.scroll_into_view_if_needed()
    box = canvas.bounding_box()  # 640 blocks across its CSS width (and a 1-px border)
    # Blocks of 1 CSS pixel: the pointer lands on block 0 or 1 (replicas 0–1 or 2–3) of each
    # axis; the tooltip names the blocks under it and their cell's largest share.
    page.mouse.move(box["x"] + 1.5, box["y"] + 1.5)
    # The tooltip follows the pointer's event: wait for it (bounded) rather than read it at once.
    page.wait_for_function(
        "sel => (document.querySelector(sel)?.textContent || '').startsWith('replicas ')",
        arg=block + " .chart-tooltip",
        timeout=10_000,
    )
    tooltip = page.text_content(block + " .chart-tooltip")
    found = re.fullmatch(r"replicas (\d+)–(\d+) and replicas (\d+)–(\d+): up to (\d+)%", tooltip)
    assert found, tooltip
    first_i, last_i, first_j, last_j, share = map(int, found.groups())
    i, j = first_i // 2, first_j // 2  # 1,000 replicas in 640 blocks: 0–1, 2–3, 4, 5–6, ...
    assert i in (0, 1) and j in (0, 1) and (last_i, last_j) == (2 * i + 1, 2 * j + 1), tooltip
    assert share == round(100 * blocks["dropout"][i][j]), (tooltip, blocks["dropout"][i][j])
    assert errors == []
    page.close()


def test_replica_ready_times_of_a_run_and_a_job(browser, tmp_path):
    """The step-time section of a single run and of a job (synthetic event files, no training):
    each replica's ready time listed, the slow replica highlighted and named, and the chart's
    lines at the last logged step (read from its legend under the cursor)."""
    from replica_time_logs import write_logdir

    logdir = write_logdir(str(tmp_path))
    server = TensorBoardServer(logdir)
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    errors = []

    def console(message):  # the tab's page opened alone asks the server for a favicon (404)
        if message.type == "error" and not message.location["url"].endswith("/favicon.ico"):
            errors.append(message.text)

    page.on("console", console)
    page.on("pageerror", lambda e: errors.append(str(e)))
    section = '[data-view="step_time"]'

    def open_run(run):
        entry = "/data/plugin_entry.html?name=replicas#run="
        page.goto(server.url + entry + run.replace("/", "%2F"), wait_until="load")
        wait_ready(page.main_frame)
        return page.eval_on_selector_all(
            f"{section} table.ready-times tbody tr",
            "els => els.map(e => [e.dataset.replica, e.className,"
            " [...e.children].map(c => c.textContent)])",
        )

    def legend_at_last_step():  # the chart's values under the cursor at step 30
        over = page.query_selector(f"{section} [data-part='ready-chart'] .u-over")
        over.scroll_into_view_if_needed()
        box = over.bounding_box()
        page.mouse.move(box["x"] + box["width"] * 30.2 / 31, box["y"] + box["height"] / 2)
        return page.eval_on_selector_all(
            f"{section} [data-part='ready-chart'] .u-legend .u-series",
            "els => els.map(e => [e.querySelector('.u-label').textContent,"
            " e.querySelector('.u-value').textContent])",
        )

    try:
        server.wait_for(
            "/data/plugin/replicas/runs",
            lambda status, body: status == 200 and len(json.loads(body)["runs"]) == 3,
        )
        rows = open_run("slow_gpu")
        assert rows == [
            ["0", "", ["replica 0", "GPU:0", "20 ms", "25 ms", "10 ms", ""]],
            ["1", "slow", ["replica 1", "GPU:1", "30 ms", "35 ms", "0 ms", "slow replica"]],
            ["2", "", ["replica 2", "GPU:2", "20 ms", "25 ms", "10 ms", ""]],
            ["3", "", ["replica 3", "GPU:3", "20 ms", "25 ms", "10 ms", ""]],
        ]
        assert page.inner_text(f"{section} [data-part='ready-summary']") == (
            "Replica 1 (GPU:1) is slow: ready 30 ms after the step starts against 20 ms for "
            "the other replicas, which wait 10 ms per step for it."
        )
        assert not page.query_selector(f"{section} table.step-time")  # not a job
        assert page.get_attribute(f"{section} [data-part='ready-chart']", "data-lines") == "4"
        assert page.inner_text(f"{section} [data-part='warm-up']") == (
            "The first logged window, step 0, holds one step only: a warm-up (500 ms: above the "
            "chart), left out of the table's figures."
        )
        assert legend_at_last_step() == [
            ["step", "step 30"],
            ["replica 0", "20 ms"],
            ["replica 1 (slow)", "30 ms"],
            ["replica 2", "20 ms"],
            ["replica 3", "20 ms"],
        ]
        # The finding scrolls to the section.
        finding = page.inner_text('[data-view="findings"] .finding[data-kind="slow_replica"]')
        assert "Replica 1 (GPU:1) is slow" in finding
        page.click('[data-view="findings"] .finding[data-kind="slow_replica"]')
        page.wait_for_function(
            "document.querySelector('section[data-view=\"step_time\"]').classList.contains('flash')"
        )

        rows = open_run("even_gpus")
        assert [(r[0], r[1], r[2][2]) for r in rows] == [(str(i), "", "20 ms") for i in range(4)]
        assert page.inner_text(f"{section} [data-part='ready-summary']") == (
            "No replica is slower than the others of its worker."
        )

        rows = open_run("job")
        assert [(r[0], r[1], r[2][1], r[2][2]) for r in rows] == [
            ("0", "", "GPU:0 · worker_0", "20 ms"),
            ("1", "", "GPU:1 · worker_0", "21 ms"),
            ("2", "", "GPU:0 · worker_1", "20 ms"),
            ("3", "slow", "GPU:1 · worker_1", "30 ms"),
        ]
        assert page.inner_text(f"{section} [data-part='ready-summary']") == (
            "Replica 3 (GPU:1 on worker_1) is slow: ready 30 ms after the step starts against "
            "20 ms for the other replicas of worker_1, which wait 10 ms per step for it."
        )
        assert [label for label, _ in legend_at_last_step()][1:] == [
            "replica 0 · worker_0",
            "replica 1 · worker_0",
            "replica 2 · worker_1",
            "replica 3 · worker_1 (slow)",
        ]
        assert errors == []
    finally:
        page.close()
        server.stop()


def test_parameter_server_run_names_workers_and_its_servers(browser, tmp_path):
    """A ParameterServerStrategy run (tests/pss_child.py's unpartitioned embedding on a 2-worker,
    2-ps cluster, in a child process): its replicas are named workers, and the parameter
    servers' table stands where the drift charts would."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, os.path.join(REPO, "tests", "pss_child.py"), str(tmp_path),
         str(tmp_path / "results.json"), "ps_unbalanced"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    results = json.loads((tmp_path / "results.json").read_text())
    assert done.returncode == 0 and "error" not in results["ps_unbalanced"], done.stderr[-3000:]
    server = TensorBoardServer(str(tmp_path))
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    errors = []

    def console(message):  # the tab's page opened alone asks the server for a favicon (404)
        if message.type == "error" and not message.location["url"].endswith("/favicon.ico"):
            errors.append(message.text)

    page.on("console", console)
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        server.wait_for(
            "/data/plugin/replicas/runs",
            lambda status, body: status == 200 and len(json.loads(body)["runs"]) == 1,
        )
        entry = "/data/plugin_entry.html?name=replicas#run=ps_unbalanced"
        page.goto(server.url + entry, wait_until="load")
        wait_ready(page.main_frame)
        # 4 steps scheduled; step k is written once both workers ran their k-th.
        assert page.inner_text(".run-summary").startswith(
            "2 workers (ParameterServerStrategy) · steps 0–"
        )
        titles = page.eval_on_selector_all("section h2", "els => els.map(e => e.firstChild.data)")
        assert titles == [
            "Status", "Findings", "Step time", "Batch size per worker", "Imbalance",
            "Batch size heatmap", "Input shapes", "Parameter servers", "Variable placement",
        ]  # fmt: skip
        # Step time: each worker's totals over the steps it ran (4 scheduled in all).
        totals = page.eval_on_selector_all(
            '[data-view="step_time"] [data-part="pss-workers"] tbody tr',
            "els => els.map(e => [...e.children].map(c => c.textContent))",
        )
        assert [row[0] for row in totals] == ["worker 0", "worker 1"], page.inner_text(
            '[data-view="step_time"]'
        )
        assert sum(int(row[1]) for row in totals) == 4
        assert all(row[3].endswith(" s") and row[4].endswith("/s") for row in totals), totals
        heads = page.eval_on_selector_all(
            '[data-view="step_time"] h3', "els => els.map(e => e.textContent)"
        )
        assert heads == ["Steps each worker ran", "Step time per worker"]
        first = page.inner_text('[data-view="step_time"] [data-part="replicas"] tbody th')
        assert first == "worker 0"
        columns = page.eval_on_selector_all(
            '[data-view="step_time"] [data-part="replicas"] thead th',
            "els => els.map(e => e.textContent)",
        )
        assert columns[:4] == ["worker", "device", "step (median)", "step (max)"]
        heads = page.eval_on_selector_all(
            '[data-view="shapes"] th', "els => els.map(e => e.textContent)"
        )
        assert heads == ["input", "worker 0 (worker:0/CPU:0)", "worker 1 (worker:1/CPU:0)", "ids"]
        servers = page.eval_on_selector_all(
            '[data-view="parameter_servers"] tbody tr',
            "els => els.map(e => [e.className, [...e.children].map(c => c.textContent)])",
        )
        device = "/job:ps/replica:0/task:{}/device:CPU:0"
        assert servers == [
            ["mismatch", ["ps 0", device.format(0), "250 KiB", "100.0 %", "2",
                          "embeddings (250 KiB)"]],
            ["", ["ps 1", device.format(1), "64 B", "0.0 %", "1", "kernel (64 B)"]],
        ]  # fmt: skip
        assert page.inner_text('[data-part="ps-total"]') == (
            "250 KiB on 2 parameter servers, fair share 50.0 %."
        )
        assert page.inner_text('[data-part="ps-notes"]').startswith(
            "Parameter server 0 (/job:ps/replica:0/task:0/device:CPU:0) holds 100.0 %"
        )
        placement = page.eval_on_selector_all(
            '[data-view="placement"] tbody tr',
            "els => els.map(e => [...e.children].map(c => c.textContent).slice(-2))",
        )
        assert placement == [["ps 0", "250 KiB"], ["ps 1", "64 B"], ["ps 0", "4 B"]]
        assert errors == []
    finally:
        page.close()
        server.stop()
