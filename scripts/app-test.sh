#!/usr/bin/env bash
# The npm package in a fresh Vite + TypeScript app (tests/app): `npm pack` of the built pkg/,
# installed into a copy of the app under target/app-work, type-checked by the app's own tsc
# (strict, skipLibCheck false), bundled by `vite build`, served by kizuna-server and driven in
# headless Chromium; the row it writes must reach PostgreSQL. The steps are the node tests of
# tests/app/app.test.mjs, so a step that cannot run fails. `make test` runs it after building
# pkg/ with scripts/package.sh; on its own: scripts/package.sh && scripts/app-test.sh
# (it starts its own PostgreSQL unless DATABASE_URL is set). KIZUNA_PKG_DIR picks another pkg/.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
[ -x target/debug/kizuna-server ] || cargo build -q -p kizuna-server
ensure_database app
app_db=$(fresh_database kizuna_app)
# The gateway serves the app's bundle, which the tests build after it started.
mkdir -p target/app-work/dist
DATABASE_URL="$app_db" start_gateway --www target/app-work/dist --dev-tokens --init-sql server/sql/examples/todos.sql
KIZUNA_APP_URL="$gateway_url" KIZUNA_APP_DATABASE_URL="$app_db" node --test tests/app/
