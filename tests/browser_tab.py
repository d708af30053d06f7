"""What the browser tests share: headless Debian Chromium through Playwright (no browser
download), TensorBoard serving the demo log dir, and the tab opened in a page with its console
errors collected (the fixtures `demo_server` and `browser` are conftest's).
"""

import os

from conftest import REPO

from demo import multiworker

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = os.path.join(REPO, "tests", "artifacts")
# The demo's multi-worker jobs: its scenarios, and the stall job demo/train.py runs on its own.
DEMO_JOBS = (*multiworker.SCENARIOS, "mw_stall")


def tab_frame(page):
    for frame in page.frames:
        if "plugin_entry.html" in frame.url and "name=replicas" in frame.url:
            return frame
    return None


def wait_ready(frame):
    frame.wait_for_function(
        "document.body && ['ready', 'error'].includes(document.body.dataset.state)",
        timeout=30_000,
    )
    assert frame.evaluate("document.body.dataset.state") == "ready"


def open_tab(demo_server, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    errors = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(demo_server.url + "/#replicas", wait_until="load")
    frame = None
    for _ in range(300):
        frame = tab_frame(page)
        if frame:
            break
        page.wait_for_timeout(100)
    assert frame is not None, [f.url for f in page.frames]
    wait_ready(frame)
    return page, frame, errors
