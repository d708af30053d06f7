#!/usr/bin/env bash
# Sets up (idempotently) and runs the whole test suite: `bash tests/run.sh [pytest args]`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
exec .venv/bin/python -m pytest tests "$@"
