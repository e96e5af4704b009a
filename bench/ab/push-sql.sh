#!/usr/bin/env bash
# Alternating A/B of the SQL pack: bench/push_slices.sql (10,000 writes in the client's slices,
# each kizuna_push call its own transaction, against one INSERT of the same rows) over the pack of
# COMMIT and the pack of the working tree, each installed in its own database on one fsync-on
# cluster, ROUNDS times. `push.sql_ratio` follows the host's commit latency (the calls commit 40
# times, the INSERT once), so compare packs in one run, not across runs.
#
#   bash bench/ab/push-sql.sh COMMIT [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 1 ] || { echo "usage: $0 COMMIT [ROUNDS]" >&2; exit 2; }
commit=$1; rounds=${2:-3}
source scripts/lib.sh
export KIZUNA_PG_FSYNC=on
ensure_database ab
old=$(fresh_database kizuna_ab_old)
new=$(fresh_database kizuna_ab_new)
install() {  # install DB REV: the pack and the todos example as of REV (empty: the working tree)
  local db=$1 rev=$2 f
  for f in $(ls server/sql/0*.sql) server/sql/examples/todos.sql; do
    if [ -n "$rev" ]; then git show "$rev:$f"; else cat "$f"; fi | psql -q -v ON_ERROR_STOP=1 "$db" >/dev/null
  done
}
install "$old" "$commit"
install "$new" ""
for round in $(seq 1 "$rounds"); do
  for side in "$commit:$old" "tree:$new"; do
    figures=$(psql "${side#*:}" -v ON_ERROR_STOP=1 -qf bench/push_slices.sql 2>&1 | sed -n 's/.*NOTICE: *push\.sql //p')
    echo "${side%%:*} $figures"
  done
done
