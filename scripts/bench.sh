#!/usr/bin/env bash
# `make bench`: prints figures, asserts nothing. A cluster with fsync on, so commit costs are real.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-tools.sh
source scripts/lib.sh
cargo build -q -p kizuna-server
export KIZUNA_PG_FSYNC=on
ensure_database bench
db=$(fresh_database kizuna_bench)
DATABASE_URL="$db" start_gateway --init-sql server/sql/examples/todos.sql --reap-interval 0
psql "$db" -qf bench/commits.sql >/dev/null

echo "== serialised commits: one single-row INSERT per transaction, 5 s per run (pgbench)"
for table in plain synced; do
  echo "insert into bench_$table (bucket, v) values ('x', 1);" > "target/bench-$table.sql"
  for clients in 1 4; do
    tps=$(/usr/lib/postgresql/15/bin/pgbench -n -c "$clients" -j 2 -T 5 -f "target/bench-$table.sql" "$db" 2>/dev/null \
      | awk '/^tps/ {printf "%d", $3}')
    printf '  %-13s %d clients: %6s commits/s\n' "$table" "$clients" "$tps"
  done
done

echo "== pack throughput (fsync on)"
started=$(date +%s%N)
psql "$db" -qf tests/fixtures/bulk.sql
echo "  load of 100,000 synced rows in one INSERT: $(( ($(date +%s%N) - started) / 1000000 )) ms"
for limit in 1000 5000; do
  PGOPTIONS="-c bench.limit=$limit" psql "$db" -qf bench/pull.sql 2>&1 | sed -n 's/.*NOTICE: */  /p'
done
psql "$db" -qf bench/push.sql 2>&1 | sed -n 's/.*NOTICE: */  /p'
psql "$db" -qf bench/stranger.sql 2>&1 | sed -n 's/.*NOTICE: */  /p'
# push.sql_ratio: the client's slices as kizuna_push calls against plain INSERTs of the same rows;
# the browser report below picks the figures up from target/bench/push-sql.json.
mkdir -p target/bench
psql "$db" -v ON_ERROR_STOP=1 -qf bench/push_slices.sql 2>&1 | sed -n 's/.*NOTICE: *push\.sql //p' > target/bench/push-sql.json
echo "  push of 10,000 writes in the client's slices, as SQL: $(cat target/bench/push-sql.json)"

echo "== the browser client beside its limits (release build, headless Chromium): target/bench/results.md"
scripts/package.sh --release >/dev/null
DATABASE_URL="$db" start_gateway --www bench/browser --pkg pkg --dev-tokens --reap-interval 0
KIZUNA_BENCH_URL="$gateway_url" node bench/browser/run.mjs
