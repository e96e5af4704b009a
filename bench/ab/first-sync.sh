#!/usr/bin/env bash
# Alternating A/B of two builds of the package: first syncs of the bulk fixture's 100,000 rows
# (pages of 1000) in headless Chromium, each package served by its own gateway on one fsync-on
# cluster, A then B, ROUNDS times. Read the medians and how many rounds each won: on this shared
# 2-core machine one run of each moves by more than most changes.
#
#   bash bench/ab/first-sync.sh PKG_DIR_A PKG_DIR_B [ROUNDS]
#
# A package directory is what `scripts/package.sh --release` leaves in pkg/ (copy it aside before
# building the other). Needs `make bench` or `make test` to have set up the tools once.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 2 ] || { echo "usage: $0 PKG_DIR_A PKG_DIR_B [ROUNDS]" >&2; exit 2; }
pkg_a=$(realpath "$1"); pkg_b=$(realpath "$2"); rounds=${3:-5}
for p in "$pkg_a" "$pkg_b"; do
  [ -f "$p/kizunasync_bg.wasm" ] || { echo "$p holds no built package" >&2; exit 2; }
done
source scripts/lib.sh
cargo build -q --release -p kizuna-server
export KIZUNA_SERVER=target/release/kizuna-server KIZUNA_PG_FSYNC=on
ensure_database ab
db=$(fresh_database kizuna_ab)
DATABASE_URL="$db" start_gateway --init-sql server/sql/examples/todos.sql --reap-interval 0 --www bench/browser --pkg "$pkg_a" --dev-tokens
url_a=$gateway_url
DATABASE_URL="$db" start_gateway --reap-interval 0 --www bench/browser --pkg "$pkg_b" --dev-tokens
url_b=$gateway_url
psql "$db" -qf tests/fixtures/bulk.sql >/dev/null
psql "$db" -qc analyze
KIZUNA_AB_URLS="$url_a,$url_b" KIZUNA_AB_ROUNDS="$rounds" node bench/ab/first-sync.mjs
