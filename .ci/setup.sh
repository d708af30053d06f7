#!/usr/bin/env bash
# Idempotent set-up of everything the project needs on a fresh Debian machine:
# Debian Chromium (browser tests), a Python 3.11 venv in .venv with the package (editable), the
# newest TensorFlow of the supported window (the `tf` extra) and the test tools. Safe to run
# again: each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"

if ! command -v chromium >/dev/null 2>&1; then
  echo "setup: installing Debian chromium" >&2
  SUDO=""
  if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv" >&2
  "$PYTHON" -m venv .venv
fi

stamp=.venv/.tb_replica_setup
want="$(cat setup.py | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] || ! .venv/bin/python -c "import tb_replica_plugin, tensorflow, playwright" 2>/dev/null; then
  echo "setup: installing Python packages into .venv (first time: a few minutes)" >&2
  .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
  .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[tf,test]"
  echo "$want" > "$stamp"
fi
