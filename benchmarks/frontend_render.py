"""Frontend speed: time to the first complete render of the tab in headless Chromium.

Writes a synthetic run of R replicas × S steps (this plugin's series at every step, see
`benchmarks.backend`), serves it with a real `tensorboard --samples_per_plugin replicas=0`, and
opens the tab's page (`/data/plugin_entry.html?name=replicas`) in Debian's headless Chromium,
`--repeats` times. For each load it reads two marks the tab sets:

- `render_ms`: from the moment the run's data arrived to the views drawn (`data-render-ms`);
- `total_ms`: from navigation start to `data-state=ready` (includes the backend requests).

Prints one JSON document with the medians.

    python -m benchmarks.frontend_render [--replicas 64] [--steps 10000] [--repeats 5]
"""

import argparse
import json
import statistics
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request

from benchmarks import common

CHROMIUM = "/usr/bin/chromium"


def _wait_http(url, process, timeout=180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"tensorboard exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                body = json.loads(response.read())
                if body.get("runs"):
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} not ready after {timeout}s")


def _time_loads(page, entry, repeats, render_ms, total_ms):
    """Opens the tab's run view `repeats` times; appends each load's two marks (ms)."""
    for _ in range(repeats):
        page.goto("about:blank")
        page.goto(entry, wait_until="load")
        page.wait_for_function(
            "document.body && ['ready', 'error'].includes(document.body.dataset.state)"
            " && performance.getEntriesByName('replicas:ready').length > 0"
            " || document.body.dataset.state === 'error'",
            timeout=120_000,
        )
        state = page.evaluate("document.body.dataset.state")
        if state != "ready":
            raise RuntimeError(f"the tab ended in state {state!r}")
        marks = page.evaluate(
            "({render: +document.body.dataset.renderMs,"
            " total: performance.getEntriesByName('replicas:ready').pop().startTime})"
        )
        render_ms.append(marks["render"])
        total_ms.append(marks["total"])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    common.add_record_argument(parser)
    args = parser.parse_args(argv)

    from playwright.sync_api import sync_playwright

    from benchmarks.backend import write_synthetic_logdir

    logdir = tempfile.mkdtemp(prefix="tb_replica_frontend_")
    write_synthetic_logdir(logdir, args.replicas, args.steps, scalars=False)
    # The Python loader, every sample of the plugin.
    process, url = common.start_tensorboard(
        logdir, "--load_fast=false", "--samples_per_plugin", "replicas=0"
    )
    render_ms, total_ms = [], []
    try:
        _wait_http(url + "/data/plugin/replicas/runs", process)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"]
            )
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            # The tab lands on the runs overview; the run view is what is timed, opened by its
            # link (#run=NAME), as a user opening a shared link would.
            with urllib.request.urlopen(url + "/data/plugin/replicas/runs") as answer:
                run = json.load(answer)["runs"][0]["run"]
            entry = f"{url}/data/plugin_entry.html?name=replicas#run={urllib.parse.quote(run)}"
            _time_loads(page, entry, args.repeats, render_ms, total_ms)
            browser.close()
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
    result = {
        "benchmark": "frontend_render",
        "machine": common.machine(),
        "replicas": args.replicas,
        "steps": args.steps,
        "repeats": args.repeats,
        "median_render_ms": round(statistics.median(render_ms), 1),
        "median_total_ms": round(statistics.median(total_ms), 1),
    }
    print(json.dumps(result, indent=1))
    if args.record:
        keys = ("replicas", "steps", "median_render_ms", "median_total_ms")
        figures = {"runs": 1, **{k: result[k] for k in keys}}
        common.record_results("frontend_render", {"default": figures}, argv)
    return result


if __name__ == "__main__":
    main()
