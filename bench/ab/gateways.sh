# Sourced by the A/B scripts here, with their arguments: checks that the first two are built
# packages (PKG_DIR_A PKG_DIR_B), builds the release gateway and serves the bench page
# (bench/browser/) with each package from its own gateway on one fsync-on cluster, the database
# holding the todos table; AB_GATEWAY_FLAGS adds flags to both. Sets pkg_a, pkg_b, db, url_a, url_b.
[ $# -ge 2 ] || { echo "usage: $0 PKG_DIR_A PKG_DIR_B [ROUNDS] ${AB_MORE_ARGS:-}" >&2; exit 2; }
pkg_a=$(realpath "$1"); pkg_b=$(realpath "$2")
for p in "$pkg_a" "$pkg_b"; do
  [ -f "$p/kizunasync_bg.wasm" ] || { echo "$p holds no built package" >&2; exit 2; }
done
source scripts/lib.sh
cargo build -q --release -p kizuna-server
export KIZUNA_SERVER=target/release/kizuna-server KIZUNA_PG_FSYNC=on
ensure_database ab
db=$(fresh_database kizuna_ab)
# shellcheck disable=SC2086 # the flags are words
DATABASE_URL="$db" start_gateway --init-sql server/sql/examples/todos.sql --reap-interval 0 --www bench/browser --pkg "$pkg_a" --dev-tokens ${AB_GATEWAY_FLAGS:-}
url_a=$gateway_url
# shellcheck disable=SC2086
DATABASE_URL="$db" start_gateway --reap-interval 0 --www bench/browser --pkg "$pkg_b" --dev-tokens ${AB_GATEWAY_FLAGS:-}
url_b=$gateway_url
