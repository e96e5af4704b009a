#!/usr/bin/env bash
# `make soak [SEEDS=N] [BROWSER_EVERY=K]`: the history checker over seeds 1..N (default 1000), a real
# client in Chromium in every K-th history (default 5; 0: native clients only), against a real
# gateway and a throwaway PostgreSQL; prints `histories: H, operations: O, faults: F, violations: V`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-tools.sh
source scripts/lib.sh
cargo build -q -p kizuna-server -p kizuna-checker
browser=()
if [ "${BROWSER_EVERY:-5}" != 0 ]; then
  scripts/package.sh --dev >/dev/null
  browser=(--browser-every "${BROWSER_EVERY:-5}" --pkg pkg)
fi
ensure_database soak
db=$(fresh_database kizuna_soak)
target/debug/kizuna-history --database-url "$db" --gateway target/debug/kizuna-server --seeds "1-${SEEDS:-1000}" "${browser[@]}"
