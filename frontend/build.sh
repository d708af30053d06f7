#!/usr/bin/env bash
# Builds the "Replicas" tab: one minified ES module at tb_replica_plugin/static/index.js.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$here/../tb_replica_plugin/static/index.js"
cd "$here"
# npm ci installs exactly the lockfile; skipped when node_modules is already newer than it.
if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --no-audit --no-fund
fi
npx --no-install esbuild src/index.js \
  --bundle --format=esm --target=es2020 --minify --legal-comments=none \
  --loader:.css=text --outfile="$out" --log-level=warning
echo "built $out ($(wc -c <"$out") bytes, $(gzip -c "$out" | wc -c) gzipped)"
