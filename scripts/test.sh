#!/usr/bin/env bash
# `make test`: every test, on real parts. Native unit tests; the server's tests against a real
# PostgreSQL; the browser tests in headless Chromium against a running kizuna-server.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-tools.sh
source scripts/lib.sh
ensure_database test
log=target/test-output.log
: >"$log"

echo "== native and server tests"
cargo test -p kizuna-protocol -p kizuna-engine -p kizuna-server 2>&1 | tee -a "$log"

echo "== browser tests (headless Chromium, real gateway, real PostgreSQL)"
secret="kizuna-browser-test-secret"
browser_db=$(fresh_database kizuna_browser)
DATABASE_URL="$browser_db" start_gateway --jwt-secret "$secret" --reap-interval 0 \
  --init-sql server/sql/examples/todos.sql
psql "$browser_db" -qf tests/fixtures/bulk.sql
KIZUNA_TEST_URL="$gateway_url" KIZUNA_TEST_JWT_SECRET="$secret" CHROMEDRIVER=/usr/bin/chromedriver \
  WASM_BINDGEN_TEST_TIMEOUT=600 wasm-pack test --headless --chrome -- --test browser 2>&1 | tee -a "$log"

echo "== demo page (the npm package in a page, headless Chromium via Playwright)"
wasm-pack build --dev --target web --out-dir pkg
demo_db=$(fresh_database kizuna_demo_test)
DATABASE_URL="$demo_db" start_gateway --www www --pkg pkg --dev-tokens --init-sql server/sql/examples/todos.sql
KIZUNA_DEMO_URL="$gateway_url" node --test tests/demo/ 2>&1 | tee -a "$log"

# One closing line over every runner: Rust's harnesses and node's.
count() { grep -hoE "$1" "$log" | grep -oE '[0-9]+' | awk '{s += $1} END {print s + 0}'; }
passed=$(( $(count 'test result: [a-zA-Z]+\. [0-9]+ passed') + $(count '^# pass [0-9]+') ))
failed=$(( $(count '[0-9]+ failed;') + $(count '^# fail [0-9]+') ))
echo
echo "make test: $passed passed, $failed failed"
