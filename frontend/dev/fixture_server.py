#!/usr/bin/env python3
"""Serves the built "Replicas" tab with fixture data, for development and browser checks.

    python frontend/dev/fixture_server.py [--port 8765]

Routes follow tb_replica_plugin/http_api.md: `/` is a page that imports `./index.js` and calls
render(); `/runs`, `/inputs?run=&max_points=`, `/findings?run=` answer fixture JSON, with
non-finite floats written as "NaN"/"Infinity"/"-Infinity" like TensorBoard's http_util.
"""

import argparse
import json
import math
import pathlib
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUNDLE = ROOT / "tb_replica_plugin" / "static" / "index.js"
XSS_RUN = "xss/<img src=x onerror=alert(1)>"
BIG_RUN = "big/64x10000"

PAGE = b"""<!doctype html>
<html><head><meta charset="utf-8"><title>Replicas (fixtures)</title></head>
<body><script type="module">import('./index.js').then((m) => m.render());</script></body></html>
"""


def cpu(n, task=0, job="localhost"):
    return [f"/job:{job}/replica:0/task:{task}/device:CPU:{i}" for i in range(n)]


def inp(name, shapes, dtypes, mismatch_dims=()):
    return {
        "name": name,
        "dtypes": list(dtypes),
        "shapes": shapes,
        "mismatch": bool(mismatch_dims),
        "mismatch_dims": list(mismatch_dims),
    }


def finding(kind, severity, run, first, last, count, replicas, message, view="batch", **kw):
    f = {
        "kind": kind,
        "severity": severity,
        "run": run,
        "first_step": first,
        "last_step": last,
        "count": count,
        "replicas": replicas,
        "name": None,
        "value": None,
        "threshold": None,
        "message": message,
        "view": view,
    }
    f.update(kw)
    return f


def uneven_run():
    run = "uneven_batch/replicas"
    ev0 = {
        "step": 0,
        "inputs": [
            inp("features/image", [[4, 28, 28, 1], [4, 28, 28, 1]], ["float32"] * 2),
            inp("features/ids", [[4, 16], [4, 16]], ["int64"] * 2),
            inp("label", [[4], [4]], ["int32"] * 2),
        ],
    }
    ev2 = {
        "step": 2,
        "inputs": [
            inp("features/image", [[1, 28, 28, 1], [0, 28, 28, 1]], ["float32"] * 2),
            inp("features/ids", [[1, 16], [0, 12]], ["int64"] * 2, [1]),
            inp("label", [[1], [0]], ["int32", "int64"], ["dtype"]),
        ],
    }
    return {
        "run": run,
        "replicas": [0, 1],
        "devices": cpu(2),
        "source": "fit",
        "steps": [0, 1, 2],
        "batch": [[4, 4], [4, 4], [1, 0]],
        "shape_events": [ev0, ev2],
        "findings": [
            finding(
                "empty_shard",
                "warning",
                run,
                2,
                2,
                1,
                [1],
                "Replica 1 got 0 examples at step 2 (global batch 1 over 2 replicas): "
                "the last batch of the dataset is smaller than the number of replicas.",
                value=0,
                threshold=0,
            ),
            finding(
                "shape_mismatch",
                "error",
                run,
                2,
                2,
                1,
                [0, 1],
                "Replicas disagree on input features/ids at step 2 (dimension 1: 16 vs 12); "
                "strategy.gather would fail.",
                view="shapes",
                name="features/ids",
            ),
            finding(
                "uneven_batch",
                "warning",
                run,
                2,
                2,
                1,
                [0, 1],
                "At step 2 the replicas got uneven batches (1 vs 0 examples); gradients average over "
                "different numbers of examples.",
                value=float("inf"),
                threshold=1.5,
            ),
            finding(
                "dtype_mismatch",
                "error",
                run,
                2,
                2,
                1,
                [0, 1],
                "Replicas disagree on the dtype of input label at step 2 (int32 vs int64).",
                view="shapes",
                name="label",
            ),
        ],
        "notes": [],
    }


def xss_run():
    run = XSS_RUN
    evil = "<b>bold</b><img src=x onerror=alert(2)>"
    return {
        "run": run,
        "replicas": [0, 1],
        "devices": ["<i>dev0</i>", "/job:w/replica:0/task:0/device:GPU:<u>1</u>"],
        "source": "custom_loop",
        "steps": [0, 1, 2, 3, 4],
        "batch": [[8, 8], [8, 8], [8, 8], [8, 8], [8, 6]],
        "shape_events": [
            {"step": 0, "inputs": [inp(evil, [[8, 3], [8, 4]], ["float32", "float32"], [1])]}
        ],
        "findings": [
            finding(
                "uneven_batch",
                "warning",
                run,
                4,
                4,
                1,
                [1],
                "<script>alert(3)</script> replica 1 got 6 examples & replica 0 got 8 at step 4.",
            )
        ],
        "notes": ["<img src=x onerror=alert(4)> a note with HTML in it"],
    }


def single_run():
    return {
        "run": "single/one_replica_one_step",
        "replicas": [0],
        "devices": cpu(1),
        "source": "inspect_dataset",
        "steps": [7],
        "batch": [[32]],
        "shape_events": [{"step": 7, "inputs": [inp("x", [[32, 10]], ["float32"])]}],
        "findings": [],
        "notes": [],
    }


def empty_run():
    return {
        "run": "empty/no_steps",
        "replicas": [0, 1],
        "devices": cpu(2),
        "source": "fit",
        "steps": [],
        "batch": [],
        "shape_events": [],
        "findings": [],
        "notes": [],
    }


def multi_task_run():
    run = "multi_worker/8_replicas"
    devices = [f"/job:worker/replica:0/task:{t}/device:GPU:{g}" for t in range(2) for g in range(4)]
    steps = list(range(300))
    batch = []
    for s in steps:
        if s == 0:
            batch.append([16, 16, 16, 16, 16, 16, 12, 12])
        elif s % 100 == 99:
            batch.append([10, 10, 10, 10, 10, 8, 8, 8])
        else:
            batch.append([16] * 8)
    ev = {
        "step": 0,
        "inputs": [inp("image", [[16, 224, 224, 3]] * 6 + [[12, 224, 224, 3]] * 2, ["uint8"] * 8)],
    }
    return {
        "run": run,
        "replicas": list(range(8)),
        "devices": devices,
        "source": "custom_loop",
        "steps": steps,
        "batch": batch,
        "shape_events": [ev],
        "findings": [
            finding(
                "first_batch_uneven",
                "info",
                run,
                0,
                0,
                1,
                [6, 7],
                "The first batch was split unevenly: replicas 6 and 7 got 12 examples, the others 16.",
            ),
            finding(
                "uneven_batch",
                "warning",
                run,
                99,
                299,
                3,
                [5, 6, 7],
                "The last step of each epoch (3 times) gives replicas 5-7 8 examples and the others 10.",
            ),
        ],
        "notes": [],
    }


def big_run(replicas=64, steps=10000, per_replica=32, epoch=1000, examples_per_epoch=2001000):
    run = BIG_RUN
    full = [per_replica] * replicas
    batch, events, uneven = [], [], []
    for s in range(steps):
        if s % epoch == epoch - 1:  # the last, partial batch of each epoch
            left = examples_per_epoch % (per_replica * replicas)
            row = [max(0, min(per_replica, left - per_replica * r)) for r in range(replicas)]
            batch.append(row)
            uneven.append(s)
            events.append(
                {
                    "step": s,
                    "inputs": [
                        inp("image", [[b, 32, 32, 3] for b in row], ["float32"] * replicas),
                        inp("label", [[b] for b in row], ["int64"] * replicas),
                    ],
                }
            )
        else:
            batch.append(full)
            if s == 0 or s % epoch == 0:
                events.append(
                    {
                        "step": s,
                        "inputs": [
                            inp(
                                "image",
                                [[per_replica, 32, 32, 3]] * replicas,
                                ["float32"] * replicas,
                            ),
                            inp("label", [[per_replica]] * replicas, ["int64"] * replicas),
                        ],
                    }
                )
    empty = [r for r in range(replicas) if batch[uneven[0]][r] == 0]
    return {
        "run": run,
        "replicas": list(range(replicas)),
        "devices": cpu(replicas),
        "source": "fit",
        "steps": list(range(steps)),
        "batch": batch,
        "shape_events": events,
        "findings": [
            finding(
                "empty_shard",
                "warning",
                run,
                uneven[0],
                uneven[-1],
                len(uneven),
                empty,
                f"{len(empty)} replicas got 0 examples at the last step of each epoch.",
            ),
            finding(
                "uneven_batch",
                "warning",
                run,
                uneven[0],
                uneven[-1],
                len(uneven),
                list(range(replicas)),
                "The last batch of each epoch is split unevenly over the replicas.",
            ),
        ],
        "notes": ["Fixture: 64 replicas x 10000 steps."],
    }


def imbalance_of(row):
    if not row:
        return float("nan")
    lo, hi = min(row), max(row)
    if hi == 0:
        return 1.0
    return float("inf") if lo == 0 else hi / lo


RUNS = {
    r["run"]: r
    for r in (uneven_run(), multi_task_run(), xss_run(), single_run(), empty_run(), big_run())
}


def runs_body():
    out = []
    for r in RUNS.values():
        counts = {"error": 0, "warning": 0, "info": 0}
        for f in r["findings"]:
            counts[f["severity"]] += 1
        out.append(
            {
                "run": r["run"],
                "replicas": r["replicas"],
                "devices": r["devices"],
                "source": r["source"],
                "first_step": r["steps"][0] if r["steps"] else None,
                "last_step": r["steps"][-1] if r["steps"] else None,
                "findings": counts,
                "notes": r["notes"],
            }
        )
    return {"runs": out}


def inputs_body(r, max_points):
    steps, batch = r["steps"], r["batch"]
    n = len(steps)
    k = max(1, math.ceil(n / max_points)) if n else 1
    out_steps, first, lo, hi = [], [], [], []
    for i in range(0, n, k):
        chunk = batch[i : i + k]
        out_steps.append(steps[i])
        first.append(chunk[0])
        lo.append([min(c[j] for c in chunk) for j in range(len(chunk[0]))])
        hi.append([max(c[j] for c in chunk) for j in range(len(chunk[0]))])
    return {
        "run": r["run"],
        "replicas": r["replicas"],
        "devices": r["devices"],
        "steps": out_steps,
        "batch_size": first,
        "batch_size_min": lo,
        "batch_size_max": hi,
        "imbalance": [imbalance_of(row) for row in first],
        "downsampled": k > 1,
        "shape_events": r["shape_events"],
        "notes": r["notes"],
    }


def _finite(obj):
    """Non-finite floats as TensorBoard's http_util writes them."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "NaN" if math.isnan(obj) else ("Infinity" if obj > 0 else "-Infinity")
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


_cache = {}
_lock = threading.Lock()


def cached_json(key, make):
    with _lock:
        if key not in _cache:
            _cache[key] = json.dumps(_finite(make()), separators=(",", ":")).encode()
        return _cache[key]


class Handler(BaseHTTPRequestHandler):
    def log_message(self, fmt, *args):  # quiet
        pass

    def send(self, status, body, ctype="application/json"):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the page aborted the request (it switched runs)

    def error(self, status, message):
        self.send(status, json.dumps({"error": message}).encode())

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        args = dict(urllib.parse.parse_qsl(url.query))
        if url.path == "/":
            return self.send(200, PAGE, "text/html; charset=utf-8")
        if url.path == "/favicon.ico":
            return self.send(204, b"", "image/x-icon")
        if url.path == "/index.js":
            if not BUNDLE.exists():
                return self.error(404, "bundle not built: run frontend/build.sh")
            return self.send(200, BUNDLE.read_bytes(), "text/javascript; charset=utf-8")
        if url.path == "/runs":
            return self.send(200, cached_json("runs", runs_body))
        if url.path in ("/inputs", "/findings"):
            run = args.get("run")
            if run is None:
                return self.error(400, "missing argument: run")
            if run not in RUNS:
                return self.error(404, f"unknown run: {run}")
            if url.path == "/findings":
                return self.send(
                    200, cached_json(("findings", run), lambda: {"findings": RUNS[run]["findings"]})
                )
            try:
                max_points = int(args.get("max_points", "2000"))
            except ValueError:
                return self.error(400, "max_points must be an integer")
            if not 2 <= max_points <= 100000:
                return self.error(400, "max_points must be in 2..100000")
            return self.send(
                200,
                cached_json(
                    ("inputs", run, max_points), lambda: inputs_body(RUNS[run], max_points)
                ),
            )
        return self.error(404, "not found")


def serve(port=0):
    """Starts the server in a thread; returns it (its port: server.server_address[1])."""
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8765)
    port = parser.parse_args().port
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print(f"Replicas fixtures on http://127.0.0.1:{port}/")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
