#!/usr/bin/env bash
# The row store's layout against a first sync's limit, in raw IndexedDB (layout.js says what each
# figure is): serves this folder on a free port and runs it ROUNDS times in headless Chromium.
#
#   bash bench/layout/layout.sh [ROUNDS]
#
# Needs `make bench` or `make test` to have set up the tools once.
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/lib.sh
port=$(free_port)
python3 -m http.server --bind 127.0.0.1 --directory bench/layout "$port" >/dev/null 2>&1 &
started_pids+=($!)
for _ in $(seq 1 50); do
  python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/', timeout=1)" 2>/dev/null && break
  sleep 0.1
done
node bench/layout/run.mjs "http://127.0.0.1:$port/index.html" "${1:-2}"
