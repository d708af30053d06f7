#!/usr/bin/env bash
# Idempotent set-up of everything the project needs on a fresh Debian machine:
# Debian Chromium (browser tests), a venv in .venv with the package (editable), the newest
# TensorFlow of the supported window (the `tf` extra) and the test tools. The venv's Python is
# `$PYTHON` (default `python3`), which must be 3.10-3.13 (the supported window; CI uses 3.11).
# Safe to run again: each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
# The Python that runs everything: the kept venv's, else the one the venv will be made with.
check="$PYTHON"
if [ -x .venv/bin/python ]; then check=.venv/bin/python; fi
if ! command -v "$check" >/dev/null 2>&1; then
  echo "setup: no '$check' on PATH: install Python 3.10-3.13 or set PYTHON=/path/to/python3.X" >&2
  exit 1
fi
version="$("$check" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
case "$version" in
  3.10 | 3.11 | 3.12 | 3.13) ;;
  *)
    echo "setup: '$check' is Python $version; TensorFlow 2.16-2.21 and this package need" \
      "Python 3.10-3.13: install one and run again with PYTHON=/path/to/python3.X" \
      "(and remove .venv if it was made with Python $version)" >&2
    exit 1
    ;;
esac

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
