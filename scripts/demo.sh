#!/usr/bin/env bash
# `make demo`: builds the npm package into pkg/, starts PostgreSQL (unless DATABASE_URL is set)
# and kizuna-server serving www/ and pkg/, and prints the URL. Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-tools.sh
source scripts/lib.sh
scripts/package.sh --release
cargo build -p kizuna-server
ensure_database demo
start_gateway --www www --pkg pkg --dev-tokens --init-sql server/sql/examples/board.sql
seed_demo_board "$DATABASE_URL"
echo
echo "Kizuna demo running at $gateway_url  (two devices on one page; a second tab joins them; Ctrl-C stops everything)"
wait "${started_pids[@]}"
