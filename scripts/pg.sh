#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for tests and the demo.
#   scripts/pg.sh start DIR   initdb + start on a free port; prints the DATABASE_URL
#   scripts/pg.sh stop DIR    stops it and removes DIR
# initdb and postgres refuse root, so both run as the postgres user on a folder it owns. When the
# postgres user cannot reach DIR (a checkout under a private home, say), a folder in /tmp is used
# and DIR records where it went.
set -euo pipefail
PGBIN=/usr/lib/postgresql/15/bin
cmd=${1:?start|stop}; dir=$(realpath -m "${2:?folder}")

# The postmaster outlives this script: it must not keep what the caller had open. A build lock's
# descriptor (`flock LOCK make test` hands it down) would otherwise stay held by the server and its
# children after the caller ended, and here a server holding a lock others wait on was seen to die
# with "select() failed in postmaster". Everything but stdin, stdout, stderr and the script itself
# is closed.
close_inherited() {
  local fd
  for fd in $(ls /proc/$$/fd); do
    case $fd in 0|1|2|255) ;; *) eval "exec $fd>&-" 2>/dev/null || true ;; esac
  done
}

cluster_dir() {
  if [ -f "$dir/location" ]; then cat "$dir/location"; else echo "$dir"; fi
}

case "$cmd" in
start)
  close_inherited
  mkdir -p "$dir"
  chown postgres "$dir" 2>/dev/null || true
  if ! runuser -u postgres -- test -w "$dir" 2>/dev/null; then
    where=$(mktemp -d /tmp/kizuna-pg.XXXXXX)
    chown postgres "$where"
    echo "$where" > "$dir/location"
  fi
  where=$(cluster_dir)
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  runuser -u postgres -- "$PGBIN/initdb" -D "$where/data" -A trust -U postgres --no-sync >/dev/null
  # fsync off by default: a throwaway cluster trades durability it does not need for speed.
  # Benchmarks of commit cost set KIZUNA_PG_FSYNC=on.
  # The server outlives this script: it must not keep what the caller had open (a pipe that a
  # `| tee` waits on, a lock a build holds with flock), so descriptors above 2 are closed first.
  (
    for fd in /proc/$BASHPID/fd/*; do fd=${fd##*/}; [ "$fd" -gt 2 ] && eval "exec $fd>&-" 2>/dev/null; done
    runuser -u postgres -- "$PGBIN/pg_ctl" -D "$where/data" -w -l "$where/log" \
      -o "-p $port -k '' -c listen_addresses=127.0.0.1 -c fsync=${KIZUNA_PG_FSYNC:-off} -c max_connections=200" start >/dev/null
  )
  echo "postgres://postgres@127.0.0.1:$port/postgres"
  ;;
stop)
  where=$(cluster_dir)
  if [ -f "$where/data/postmaster.pid" ]; then
    runuser -u postgres -- "$PGBIN/pg_ctl" -D "$where/data" -m immediate stop >/dev/null 2>&1 || true
  fi
  rm -rf "$where" "$dir"
  ;;
*) echo "usage: $0 start|stop DIR" >&2; exit 2 ;;
esac
