"""The README's overview picture: `python -m demo.overview_shot LOGDIR [OUT.png]`.

Serves LOGDIR with a real `tensorboard`, opens the Replicas tab in headless Debian Chromium
(Playwright, `/usr/bin/chromium`) and saves TensorBoard's window, overview shown, to OUT.png
(default `demo/overview.png`). demo/overview.png shows a log dir holding a few finished demo runs
(`python -m demo.train`), the `crash` scenario, and a `mw_stall` job whose worker 1 waits 660 s
(`TB_REPLICA_DEMO_STALL_SECONDS=660`, launched with `multiworker.launch(LOGDIR,
scenarios=["mw_stall"], allow_failure=True, timeout=1000)`), taken while the job is stalled:
more than 300 s (`Thresholds.stall_seconds`) without progress, heartbeats still coming.
"""

import argparse
import os
import subprocess
import sys
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_BIN = os.path.dirname(sys.executable)


def _serve(logdir, port):
    """A `tensorboard` process on `port`, once its Replicas tab lists a run."""
    command = [os.path.join(VENV_BIN, "tensorboard"), "--logdir", logdir, "--port", str(port)]
    command += ["--host", "127.0.0.1"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            url = f"http://127.0.0.1:{port}/data/plugin/replicas/runs"
            with urllib.request.urlopen(url, timeout=5) as response:
                if b'"run"' in response.read():
                    return process
        except OSError:
            pass
        time.sleep(0.5)
    process.kill()
    raise TimeoutError(f"tensorboard on port {port} did not list a run in 120 s")


def shoot(logdir, out, port=6123, width=1200, height=760):
    """Saves TensorBoard's window with the Replicas tab's overview of `logdir` to `out`."""
    from playwright.sync_api import sync_playwright

    process = _serve(logdir, port)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"]
            )
            page = browser.new_page(viewport={"width": width, "height": height})
            page.goto(f"http://127.0.0.1:{port}/#replicas", wait_until="load")
            frame = None
            for _ in range(300):
                frame = next((f for f in page.frames if "name=replicas" in f.url), None)
                if frame:
                    break
                page.wait_for_timeout(100)
            if frame is None:
                raise RuntimeError("the Replicas tab's frame did not appear")
            frame.wait_for_function("document.body.dataset.state === 'ready'", timeout=60_000)
            page.wait_for_timeout(500)
            page.screenshot(path=out)
            browser.close()
    finally:
        process.terminate()
        process.wait(timeout=30)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logdir")
    parser.add_argument("out", nargs="?", default=os.path.join(REPO, "demo", "overview.png"))
    args = parser.parse_args()
    shoot(args.logdir, args.out)
    print(f"overview_shot: {args.out}")


if __name__ == "__main__":
    main()
