#!/usr/bin/env python3
"""Renders the built "Replicas" tab against the fixture server in headless Chromium and checks it.

    /work/main/.venv/bin/python frontend/dev/check_render.py [--out DIR] [--repeat N]

Checks the DOM hooks, that no console error or dialog happens, takes screenshots into --out, and
measures the time to data-state=ready for the 64 replicas x 10000 steps run. Exits 1 on a failure.
Uses Debian's Chromium (/usr/bin/chromium); it never downloads a browser.
"""

import argparse
import pathlib
import statistics
import sys

from playwright.sync_api import sync_playwright

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import fixture_server  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
UNEVEN = "uneven_batch/replicas"
BIG = fixture_server.BIG_RUN
XSS = fixture_server.XSS_RUN

results = []


def check(name, ok, detail=""):
    results.append((name, bool(ok)))
    print(f"{'ok  ' if ok else 'FAIL'} {name}{'' if ok else f'  -- {detail}'}")


def wait_ready(page, timeout=30000):
    page.wait_for_function(
        "['ready', 'error'].includes(document.body.dataset.state)", timeout=timeout
    )
    return page.evaluate("document.body.dataset.state")


def select_run(page, run):
    page.select_option("#run-select", value=run)
    return wait_ready(page)


def texts(page, selector):
    return page.eval_on_selector_all(selector, "els => els.map(e => e.textContent)")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="/tmp/replicas_screens", help="screenshot folder")
    parser.add_argument("--repeat", type=int, default=3, help="timed renders of the big run")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    server = fixture_server.serve()
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    errors, dialogs = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("console", lambda m: m.type == "error" and errors.append(m.text))
        page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))

        # First run, selected by default.
        page.goto(base)
        check("first run renders ready", wait_ready(page) == "ready")
        check("title", page.text_content("h1") == "Replicas")
        options = page.eval_on_selector_all("#run-select option", "os => os.map(o => o.value)")
        check(
            "every run is an option, first selected",
            options == list(fixture_server.RUNS) and page.input_value("#run-select") == options[0],
            options,
        )
        sev = page.eval_on_selector_all(".finding", "els => els.map(e => e.dataset.severity)")
        order = {"error": 0, "warning": 1, "info": 2}
        check(
            "findings sorted by severity", sev == sorted(sev, key=order.get) and len(sev) == 4, sev
        )
        check("finding has kind", page.locator('.finding[data-kind="empty_shard"]').count() == 1)
        legend = texts(page, 'section[data-view="batch"] .u-legend .u-label')
        check("legend lists replicas", legend[1:] == ["replica 0", "replica 1"], legend)
        notes = texts(page, 'section[data-view="batch"] [data-view="notes"] .note')
        check(
            "batch notes list the batch findings",
            len(notes) == 2 and any("got 0 examples" in n for n in notes),
            notes,
        )
        check(
            "imbalance legend marks empty replica",
            any(
                "empty replica" in t
                for t in texts(page, 'section[data-view="imbalance"] .u-legend .u-label')
            ),
        )
        check("heatmap canvas", page.locator('section[data-view="heatmap"] canvas').count() == 1)
        check(
            "heatmap legend",
            page.locator('section[data-view="heatmap"] .heatmap-legend').count() == 1,
        )
        captions = texts(page, 'section[data-view="shapes"] table caption')
        check("one table per shape event", captions == ["step 0", "step 2"], captions)
        heads = texts(page, 'section[data-view="shapes"] table:first-of-type thead th')
        check("shape columns name replica and device", "replica 1 (CPU:1)" in heads, heads)
        bad_rows = texts(page, 'table[data-step="2"] tbody tr.mismatch th')
        check("mismatching rows", bad_rows == ["features/ids", "label"], bad_rows)
        check("mismatching cells", page.locator('table[data-step="2"] td.mismatch').count() == 4)
        check("step 0 has no mismatch", page.locator('table[data-step="0"] .mismatch').count() == 0)
        page.screenshot(path=str(out / "uneven.png"), full_page=True)

        # Clicking a finding zooms the charts to its steps and scrolls to its view.
        page.click('.finding[data-kind="uneven_batch"]')
        zoom = page.eval_on_selector(
            'section[data-view="batch"]', "e => [e.dataset.zoomMin, e.dataset.zoomMax]"
        )
        check("finding click zooms to its steps", zoom == ["0", "3"], zoom)
        page.click('[data-action="reset-zoom"]')

        # Hover the batch chart and the heatmap.
        box = page.locator('section[data-view="batch"] .u-over').bounding_box()
        page.mouse.move(box["x"] + box["width"] - 5, box["y"] + box["height"] / 2)
        check(
            "batch tooltip",
            "step 2" in (page.text_content('section[data-view="batch"] .chart-tooltip') or ""),
        )
        page.locator('section[data-view="heatmap"]').scroll_into_view_if_needed()
        box = page.locator('section[data-view="heatmap"] canvas').bounding_box()
        page.mouse.move(box["x"] + box["width"] - 20, box["y"] + 30)
        tip = page.text_content('section[data-view="heatmap"] .chart-tooltip') or ""
        check(
            "heatmap tooltip",
            "step 2" in tip and "replica 1" in tip and "batch size: 0" in tip,
            tip,
        )
        page.locator('section[data-view="heatmap"]').screenshot(
            path=str(out / "uneven_heatmap_hover.png")
        )

        # HTML in names and messages renders as text.
        check("xss run renders", select_run(page, XSS) == "ready")
        check("run name shown as text", XSS in page.text_content("#run-select"))
        check(
            "input name shown as text",
            "<b>bold</b><img src=x onerror=alert(2)>"
            in page.text_content('section[data-view="shapes"]'),
        )
        check(
            "message shown as text",
            "<script>alert(3)</script>" in page.text_content(".finding .message"),
        )
        check(
            "no injected elements",
            page.locator("img, b, script:not([type]), main i, main u").count() == 0,
        )
        page.screenshot(path=str(out / "xss.png"), full_page=True)

        # Small and empty runs.
        check(
            "single replica single step", select_run(page, "single/one_replica_one_step") == "ready"
        )
        check(
            "no findings message",
            page.text_content('section[data-view="findings"]')
            .strip()
            .endswith("No problems found in this run."),
        )
        page.screenshot(path=str(out / "single.png"), full_page=True)
        check("run without steps", select_run(page, "empty/no_steps") == "ready")
        check("multi-task run", select_run(page, "multi_worker/8_replicas") == "ready")
        heads = texts(page, 'section[data-view="shapes"] thead th')
        check(
            "device names include the task when tasks differ",
            "replica 4 (worker:1/GPU:0)" in heads,
            heads,
        )
        page.screenshot(path=str(out / "multi_task.png"), full_page=True)

        # Zoom: dragging a chart zooms every view; the heatmap drags too; double-click resets.
        zoom_of = lambda: page.eval_on_selector(
            'section[data-view="batch"]', "e => [+e.dataset.zoomMin, +e.dataset.zoomMax]"
        )
        over = page.locator('section[data-view="batch"] .u-over')
        over.scroll_into_view_if_needed()
        box = over.bounding_box()
        page.mouse.move(box["x"] + box["width"] * 0.2, box["y"] + 50)
        page.mouse.down()
        page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + 60, steps=5)
        page.mouse.up()
        page.wait_for_timeout(50)
        z = zoom_of()
        check("chart drag zooms", 50 < z[0] < 70 and 140 < z[1] < 160, z)
        page.locator('section[data-view="heatmap"]').screenshot(
            path=str(out / "multi_task_heatmap_zoomed.png")
        )
        page.locator('section[data-view="imbalance"]').screenshot(
            path=str(out / "multi_task_imbalance_zoomed.png")
        )
        page.dblclick('section[data-view="heatmap"] canvas')
        check("heatmap double-click resets zoom", zoom_of() == [0, 300], zoom_of())
        canvas = page.locator('section[data-view="heatmap"] canvas')
        canvas.scroll_into_view_if_needed()
        box = canvas.bounding_box()
        page.mouse.move(box["x"] + 80 + (box["width"] - 96) * 0.5, box["y"] + 20)
        page.mouse.down()
        page.mouse.move(box["x"] + 80 + (box["width"] - 96) * 0.75, box["y"] + 30, steps=5)
        page.mouse.up()
        z = zoom_of()
        check("heatmap drag zooms", 145 < z[0] < 155 and 220 < z[1] < 230, z)
        page.click('[data-action="reset-zoom"]')
        check("reset zoom button", zoom_of() == [0, 300], zoom_of())
        page.set_viewport_size({"width": 800, "height": 900})
        page.wait_for_timeout(300)
        w = page.locator('section[data-view="batch"] .uplot').bounding_box()["width"]
        check("charts follow window resize", w < 800, w)
        page.screenshot(path=str(out / "multi_task_narrow.png"), full_page=True)
        page.set_viewport_size({"width": 1280, "height": 900})

        # Switching runs quickly: only the last one shows, once.
        for run in (BIG, UNEVEN, XSS, BIG, "multi_worker/8_replicas"):
            page.select_option("#run-select", value=run)
        wait_ready(page)
        page.wait_for_timeout(300)
        check(
            "quick switching shows the last run once",
            page.locator('section[data-view="batch"]').count() == 1
            and page.locator('section[data-view="batch"] .uplot').count() == 1
            and "replica 7" in page.text_content('section[data-view="batch"] .u-legend'),
        )

        # The big run, timed.
        render_ms, total_ms, after_response_ms = [], [], []
        for i in range(args.repeat):
            select_run(page, UNEVEN)
            page.evaluate("performance.clearResourceTimings(); window.__t0 = performance.now()")
            check(f"big run ready ({i + 1})", select_run(page, BIG) == "ready")
            t = page.evaluate("""() => {
              const res = performance.getEntriesByType('resource').filter(e => e.name.includes('/inputs?'));
              const ready = performance.getEntriesByName('replicas:ready').pop().startTime;
              const parts = {};
              for (const m of performance.getEntriesByType('measure')) if (m.name.startsWith('replicas:')) parts[m.name.slice(9)] = Math.round(m.duration);
              performance.clearMeasures();
              return {parts, render: +document.body.dataset.renderMs, total: ready - window.__t0,
                      afterResponse: ready - res[res.length - 1].responseEnd};
            }""")
            print("    view build times (ms):", t["parts"])
            render_ms.append(t["render"])
            total_ms.append(t["total"])
            after_response_ms.append(t["afterResponse"])
        legend = texts(page, 'section[data-view="batch"] .u-legend .u-label')
        check(
            "big legend lists 64 replicas",
            legend[1:] == [f"replica {r}" for r in range(64)],
            legend[:3],
        )
        page.screenshot(path=str(out / "big.png"), full_page=True)
        page.locator('section[data-view="heatmap"]').scroll_into_view_if_needed()
        box = page.locator('section[data-view="heatmap"] canvas').bounding_box()
        page.mouse.move(box["x"] + 80 + (box["width"] - 96) * 0.0999, box["y"] + 200)
        tip = page.text_content('section[data-view="heatmap"] .chart-tooltip') or ""
        check("big heatmap tooltip", "replica" in tip and "batch size" in tip, tip)
        print("    heatmap tooltip:", tip)
        page.locator('section[data-view="heatmap"]').screenshot(
            path=str(out / "big_heatmap_hover.png")
        )
        page.click('.finding[data-kind="empty_shard"]')
        page.wait_for_timeout(800)
        page.screenshot(path=str(out / "big_finding_clicked.png"))

        # Downsampled data (the page asks for 10000 points; ask for 500 instead).
        page.route(
            "**/inputs?*",
            lambda r: r.continue_(url=r.request.url.replace("max_points=10000", "max_points=500")),
        )
        select_run(page, UNEVEN)
        check("downsampled big run ready", select_run(page, BIG) == "ready")
        check(
            "downsampled is said",
            "Downsampled to 500 buckets" in page.text_content('section[data-view="batch"]'),
        )
        page.locator('section[data-view="heatmap"]').scroll_into_view_if_needed()
        box = page.locator('section[data-view="heatmap"] canvas').bounding_box()
        page.mouse.move(box["x"] + 80 + (box["width"] - 96) * 0.0999, box["y"] + 200)
        tip = page.text_content('section[data-view="heatmap"] .chart-tooltip') or ""
        check("downsampled heatmap tooltip shows the bucket range", "batch size: 0–32" in tip, tip)
        page.screenshot(path=str(out / "big_downsampled.png"), full_page=True)
        page.locator('section[data-view="imbalance"]').screenshot(
            path=str(out / "big_downsampled_imbalance.png")
        )
        page.unroute("**/inputs?*")

        # Empty state and error state (the failed request logs one expected console error).
        page.route(
            "**/runs",
            lambda r: r.fulfill(status=200, content_type="application/json", body='{"runs": []}'),
        )
        page.goto(base)
        check(
            "empty state",
            wait_ready(page) == "ready" and "No replica data yet" in page.text_content("body"),
        )
        page.screenshot(path=str(out / "empty.png"))
        page.unroute("**/runs")
        page.route(
            "**/inputs?*",
            lambda r: r.fulfill(
                status=404,
                content_type="application/json",
                body='{"error": "unknown run: <b>x</b>"}',
            ),
        )
        n_errors = len(errors)
        page.goto(base)
        check(
            "error state",
            wait_ready(page) == "error" and "unknown run: <b>x</b>" in page.text_content(".error"),
        )
        page.screenshot(path=str(out / "error.png"))
        expected = [e for e in errors[n_errors:] if "404" in e]
        del errors[n_errors : n_errors + len(expected)]
        browser.close()
    server.shutdown()

    check("no console errors", not errors, errors)
    check("no dialogs", not dialogs, dialogs)
    med = statistics.median
    print(f"\nbig run (64 replicas x 10000 steps), {args.repeat} runs, median [all]:")
    print(f"  render (data parsed -> ready): {med(render_ms):.0f} ms {render_ms}")
    print(
        f"  response end -> ready (incl. JSON parse): {med(after_response_ms):.0f} ms "
        f"{[round(x) for x in after_response_ms]}"
    )
    print(f"  select -> ready (incl. fetch): {med(total_ms):.0f} ms {[round(x) for x in total_ms]}")
    print(f"screenshots in {out}")
    failed = sum(not ok for _, ok in results)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
