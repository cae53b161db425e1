#!/usr/bin/env bash
# A throwaway PostgreSQL 15 cluster under the repo, for tests, demo and bench.
#   scripts/pgcluster.sh start|stop|restart|crash-restart|status|env [NAME]
# NAME (default "test") picks .pgdq/NAME and a port; `env` prints PG* exports.
# initdb refuses to run as root, so as root the cluster belongs to `postgres`.
set -euo pipefail

cmd=${1:?usage: pgcluster.sh start|stop|restart|crash-restart|status|env [NAME]}
name=${2:-test}
root=$(cd "$(dirname "$0")/.." && pwd)
bindir=${PG_BINDIR:-$(pg_config --bindir 2>/dev/null || echo /usr/lib/postgresql/15/bin)}
[ -x "$bindir/initdb" ] || bindir=/usr/lib/postgresql/15/bin
base="$root/.pgdq/$name"
data="$base/data"
sock="$base/run"
case "$name" in
  test) first_port=${PGDQ_TEST_PORT:-54329} ;;
  demo) first_port=${PGDQ_DEMO_PORT:-54340} ;;
  bench) first_port=${PGDQ_BENCH_PORT:-54350} ;;
  *) first_port=${PGDQ_PORT:-54360} ;;
esac

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# A cluster keeps the port it was created with (another checkout's cluster may
# hold the default one, so a new cluster takes the next free port).
if [ -f "$base/port" ]; then
  port=$(cat "$base/port")
else
  port=$first_port
  while port_in_use "$port"; do port=$((port + 1)); done
fi

as_owner() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

init() {
  [ -f "$data/PG_VERSION" ] && return 0
  mkdir -p "$data" "$sock"
  echo "$port" >"$base/port"
  if [ "$(id -u)" = 0 ]; then
    chown -R postgres:postgres "$base"
    # the server must be able to reach its data directory through the repo
    if ! runuser -u postgres -- test -x "$base"; then
      echo "pgcluster: user postgres cannot reach $base; clone the repo somewhere world-readable" >&2
      exit 1
    fi
  fi
  as_owner "$bindir/initdb" -D "$data" -A trust -U postgres -E UTF8 --locale=C.UTF-8 >"$base/initdb.log"
  cat >>"$data/postgresql.conf" <<CONF
# pgdq throwaway cluster ($name)
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$sock'
max_connections = 200
shared_buffers = 256MB
log_min_messages = warning
log_line_prefix = '%m [%p] '
CONF
  if [ "$name" = test ]; then
    # Test data is disposable: skip fsync (an immediate restart stays safe;
    # only an OS crash could lose committed data).
    echo "fsync = off" >>"$data/postgresql.conf"
  fi
}

running() { as_owner "$bindir/pg_ctl" -D "$data" status >/dev/null 2>&1; }

start() {
  init
  running && return 0
  as_owner "$bindir/pg_ctl" -D "$data" -l "$base/server.log" -w -t 60 start >/dev/null
}

case "$cmd" in
  start) start ;;
  stop) running && as_owner "$bindir/pg_ctl" -D "$data" -m fast -w stop >/dev/null || true ;;
  restart) start; as_owner "$bindir/pg_ctl" -D "$data" -m fast -w restart -l "$base/server.log" >/dev/null ;;
  crash-restart) as_owner "$bindir/pg_ctl" -D "$data" -m immediate -w restart -l "$base/server.log" >/dev/null ;;
  status) running && echo "running on port $port ($data)" || { echo "stopped"; exit 3; } ;;
  env) printf 'export PGHOST=%s PGPORT=%s PGUSER=postgres\n' "$sock" "$port" ;;
  *) echo "pgcluster: unknown command $cmd" >&2; exit 2 ;;
esac
