#!/usr/bin/env bash
# Sets up (idempotently), trains every demo scenario on 4 logical CPU replicas into demo_logs/,
# then serves TensorBoard with the "Replicas" tab: `bash demo/run.sh [PORT]` (default 6006). The
# plugin reads demo_logs' event files itself, every sample: TensorBoard keeps its default sample.
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/setup.sh
PORT="${1:-6006}"
rm -rf demo_logs
TF_CPP_MIN_LOG_LEVEL=2 .venv/bin/python -m demo.train demo_logs --replicas 4
.venv/bin/tb-replica report demo_logs || true
echo "demo: open http://localhost:${PORT}/#replicas" >&2
exec .venv/bin/tensorboard --logdir demo_logs --port "$PORT"
