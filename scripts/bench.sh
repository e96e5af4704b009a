#!/usr/bin/env bash
# `make bench`: prints figures, asserts nothing. A cluster with fsync on, so commit costs are real.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup-tools.sh
source scripts/lib.sh
# Release builds, as an app would deploy them: the gateway here, the package below.
cargo build -q --release -p kizuna-server
export KIZUNA_SERVER=target/release/kizuna-server
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
# A pull run right after the load, before the statistics count the loaded rows (as a new app's
# first sync may run before autovacuum catches up): a plan that depends on them shows here.
PGOPTIONS="-c bench.limit=1000" psql "$db" -qf bench/pull.sql 2>&1 | sed -n 's/.*NOTICE: *\(.*\)/  \1 (before the rows are analyzed)/p'
# Statistics of the loaded rows before anything else is timed on them: whether autovacuum had
# analyzed them yet when a figure started moved the pull figures up to 5 times from one run to the next.
psql "$db" -qc analyze
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
# The same in slices of 64, the client's default before 2026-12-04, for comparison with older runs.
echo "  the same in slices of 64: $(PGOPTIONS="-c bench.slice=64" psql "$db" -v ON_ERROR_STOP=1 -qf bench/push_slices.sql 2>&1 | sed -n 's/.*NOTICE: *push\.sql //p')"
# Loaded after the push figures: its million rows leave the disk busy writing them back for a while,
# which had halved the push figures measured right after it.
started=$(date +%s%N)
psql "$db" -qf bench/million.sql
echo "  load of 1,000,000 synced rows in one INSERT (the memory figure's data): $(( ($(date +%s%N) - started) / 1000000 )) ms"
psql "$db" -qc analyze

echo "== universe sync: a source database's outbox into a target gateway on another cluster (fsync on)"
ensure_second_cluster bench
n=20000
secret="kizuna-bench-universe-secret"
target_db=$(DATABASE_URL="$KIZUNA_SECOND_DATABASE_URL" fresh_database kizuna_bench_target)
source_db=$(fresh_database kizuna_bench_source)
for f in server/sql/0*.sql; do psql "$source_db" -q -v ON_ERROR_STOP=1 -f "$f" >/dev/null 2>&1; done
psql "$source_db" -q -v ON_ERROR_STOP=1 -v n=$n -f bench/universe-source.sql | sed -n -e '/^Time: /{s//    /;p;b' -e '}' -e '/^  /p'
DATABASE_URL="$target_db" start_gateway --init-sql bench/universe-target.sql --reap-interval 0 --jwt-secret "$secret"
started=$(date +%s%N)
report=$("$KIZUNA_SERVER" universe-sync --source "$source_db" --target "$gateway_url" \
  --target-jwt-secret "$secret" --once --batch-size 500)
sync_ms=$(( ($(date +%s%N) - started) / 1000000 ))
echo "  universe-sync --once --batch-size 500: $report"
# The limit: the same rows copied straight into an identical synced table on the target cluster.
psql "$source_db" -qc "\copy (select * from bench_items order by id) to 'target/bench-universe.csv' csv"
psql "$target_db" -qc "\copy bench_items_staging from 'target/bench-universe.csv' csv"
started=$(date +%s%N)
psql "$target_db" -qc "insert into bench_items_copy select * from bench_items_staging"
copy_ms=$(( ($(date +%s%N) - started) / 1000000 ))
delivered=$(psql "$target_db" -Atc "select count(*) from bench_items")
awk -v n="$n" -v d="$delivered" -v s="$sync_ms" -v c="$copy_ms" 'BEGIN {
  printf "  %d events delivered in %d ms: %.0f events/s; INSERT ... SELECT of the same rows: %d ms, %.0f rows/s; ratio %.3f\n",
    d, s, d / (s / 1000), c, n / (c / 1000), (d / (s / 1000)) / (n / (c / 1000)) }'

echo "== the browser client beside its limits (release build, headless Chromium): target/bench/results.md"
scripts/package.sh --release >/dev/null
DATABASE_URL="$db" start_gateway --www bench/browser --pkg pkg --dev-tokens --reap-interval 0 --cross-origin-isolated
KIZUNA_BENCH_URL="$gateway_url" node bench/browser/run.mjs
