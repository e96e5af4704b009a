# Shared by test.sh, demo.sh and bench.sh: PATH, a free port, waiting for the gateway, and one
# cleanup that stops everything a script started, whichever way it exits.
export PATH="$HOME/.cargo/bin:$PWD/tools/node_modules/.bin:$PATH"
started_pids=()
started_pg=""
started_pg_second=""

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

cleanup() {
  for pid in "${started_pids[@]}"; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  if [ -n "$started_pg" ]; then scripts/pg.sh stop "$started_pg"; fi
  if [ -n "$started_pg_second" ]; then scripts/pg.sh stop "$started_pg_second"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Uses DATABASE_URL when set; otherwise starts a throwaway cluster under target/.
ensure_database() {
  if [ -z "${DATABASE_URL:-}" ]; then
    started_pg="target/pg-$1"
    scripts/pg.sh stop "$started_pg"
    DATABASE_URL=$(scripts/pg.sh start "$started_pg")
  fi
  export DATABASE_URL
}

# A second throwaway cluster, for what spans two (universe sync's source and target), unless
# KIZUNA_SECOND_DATABASE_URL is set; exports KIZUNA_SECOND_DATABASE_URL.
ensure_second_cluster() {
  if [ -z "${KIZUNA_SECOND_DATABASE_URL:-}" ]; then
    started_pg_second="target/pg-$1-second"
    scripts/pg.sh stop "$started_pg_second"
    KIZUNA_SECOND_DATABASE_URL=$(scripts/pg.sh start "$started_pg_second")
  fi
  export KIZUNA_SECOND_DATABASE_URL
}

# A fresh database on the same cluster, named NAME; prints its URL.
fresh_database() {
  psql "$DATABASE_URL" -qAtc "drop database if exists $1 with (force)" -c "create database $1" >/dev/null
  echo "${DATABASE_URL%/*}/$1"
}

# Starts kizuna-server with the given flags and waits until /healthz answers; sets gateway_url.
# Not to be called inside $(...): the pid must be recorded in this shell for cleanup to stop it.
start_gateway() {
  local port log
  port=$(free_port)
  log="target/kizuna-server-$port.log"
  # KIZUNA_SERVER: the gateway binary (make bench sets the release build).
  "${KIZUNA_SERVER:-target/debug/kizuna-server}" --listen "127.0.0.1:$port" "$@" >"$log" 2>&1 &
  started_pids+=($!)
  for _ in $(seq 1 300); do
    if python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$port/healthz', timeout=1)" 2>/dev/null; then
      gateway_url="http://127.0.0.1:$port"
      return 0
    fi
    sleep 0.1
  done
  echo "kizuna-server did not become healthy; its log:" >&2
  cat "$log" >&2
  return 1
}

# The demo board's cards (server/sql/examples/board_seed.sql), with an archive of 30,000 for a
# device to join (a large first sync). `make demo` and the demo tests seed the same board.
seed_demo_board() {
  psql "$1" -q -v ON_ERROR_STOP=1 -v archive_cards=30000 -f server/sql/examples/board_seed.sql
}
