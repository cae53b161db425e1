#!/usr/bin/env bash
# A throwaway PostgreSQL cluster per checkout, for tests, demo and bench.
#   scripts/pgcluster.sh start|stop|restart|crash-restart|status|env|dir [NAME]
# NAME (default "test") picks .pgdq/NAME and a port; `env` prints PG* exports
# (and PATH, for a version other than 15), `dir` the cluster's real directory
# (data, run, port, server.log, initdb.log).
# PGDQ_PG=16|17|18 (default 15) runs that major version (scripts/pgbin.sh):
# the cluster is then NAME-pgVERSION, so each version has clusters of its own.
# initdb refuses to run as root, so as root the cluster belongs to `postgres`.
# When postgres cannot reach .pgdq/NAME (a private checkout, e.g. under /root)
# or its socket path would be too long, the cluster lives in
# /var/tmp/pgdq-<sha256 of the checkout's path, 12 hex>/NAME instead, and
# .pgdq/NAME is a symlink to it.
set -euo pipefail
umask 022 # directories we create must be traversable by postgres

usage="usage: pgcluster.sh start|stop|restart|crash-restart|status|env|dir [NAME]"
cmd=${1:?$usage}
role=${2:-test}
[[ $role =~ ^[A-Za-z0-9_-]+$ ]] || { echo "pgcluster: bad NAME '$role'" >&2; exit 2; }
root=$(cd -P "$(dirname "$0")/.." && pwd)
version=${PGDQ_PG:-15}
# where this version's programs are; only start fetches them (stopping,
# say, needs no download: without them no cluster of that version runs)
bindir=$("$root/scripts/pgbin.sh" "$version" --no-fetch)
name=$role
[ "$version" = 15 ] || name="$role-pg$version"
link="$root/.pgdq/$name"
away="/var/tmp/pgdq-$(printf %s "$root" | sha256sum | cut -c1-12)/$name"

# Can the server live in $1? Its socket path must fit (107 bytes), and as root
# user postgres must reach it (checked on the nearest existing ancestor).
usable() {
  local dir=$1
  [ "$(printf %s "$dir/run/.s.PGSQL.00000" | wc -c)" -le 107 ] || return 1
  [ "$(id -u)" = 0 ] || return 0
  until [ -e "$dir" ]; do dir=$(dirname "$dir"); done
  runuser -u postgres -- test -x "$dir"
}

# The cluster's real directory (never a path through the symlink): a cluster
# stays where it is; a new one goes to .pgdq/NAME if usable, else away.
if [ -L "$link" ]; then base=$away
elif [ -f "$link/data/PG_VERSION" ] || usable "$link"; then base=$link
else base=$away; fi
data="$base/data"
sock="$base/run"
# The clusters the tests and the bench restart listen below the kernel's
# range for outgoing connections (/proc/sys/net/ipv4/ip_local_port_range,
# 32768-60999 by default): there, a client's socket (a router's connection
# to its partition, say) could take the port while the server restarts, and
# a crash-restart, which must come back on the same port, failed to bind
# ("Address already in use"). The demo keeps the port its docs show.
case "$role" in
  test) first_port=${PGDQ_TEST_PORT:-25429} ;;
  demo) first_port=${PGDQ_DEMO_PORT:-54340} ;;
  bench) first_port=${PGDQ_BENCH_PORT:-25450} ;;
  *) first_port=${PGDQ_PORT:-25460} ;;
esac
first_port=$((first_port + (version - 15) * 100)) # each version from a range of its own

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# in use, or kept by another cluster of this checkout (stopped, it listens on nothing)
port_taken() { port_in_use "$1" || cat "$root"/.pgdq/*/port 2>/dev/null | grep -qx "$1"; }

# A cluster keeps the port it was created with (another checkout's cluster may
# hold the default one, so a new cluster takes the next free port).
choose_port() {
  port=$first_port
  while port_taken "$port"; do port=$((port + 1)); done
}
if [ -f "$base/port" ]; then port=$(cat "$base/port"); else choose_port; fi

# as root, run as postgres (from /: it may not reach the current directory)
as_owner() {
  if [ "$(id -u)" = 0 ]; then (cd / && runuser -u postgres -- "$@"); else "$@"; fi
}

init() {
  if [ "$base" = "$away" ]; then
    # link .pgdq/NAME to it (replacing what a failed start left there: no cluster)
    mkdir -p "$root/.pgdq"
    [ -L "$link" ] || rm -rf "$link"
    ln -sfn "$away" "$link"
  fi
  if [ -f "$data/PG_VERSION" ]; then
    [ "$(cat "$data/PG_VERSION")" = "$version" ] && return 0
    echo "pgcluster: $data holds PostgreSQL $(cat "$data/PG_VERSION"), not $version" >&2
    exit 1
  fi
  mkdir -p "$data" "$sock"
  echo "$port" >"$base/port"
  if [ "$(id -u)" = 0 ]; then chown -R postgres:postgres "$base"; fi
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
  if [[ $name == test || $name == test-* ]]; then
    # Test data is disposable: skip fsync (an immediate restart stays safe;
    # only an OS crash could lose committed data).
    echo "fsync = off" >>"$data/postgresql.conf"
  fi
}

running() { as_owner "$bindir/pg_ctl" -D "$data" status >/dev/null 2>&1; }

# Move the cluster to the next port that nothing listens on.
move_port() {
  port=$((port + 1))
  while port_taken "$port"; do port=$((port + 1)); done
  echo "$port" >"$base/port"
  echo "port = $port" | as_owner tee -a "$data/postgresql.conf" >/dev/null
}

start() {
  "$root/scripts/pgbin.sh" "$version" >/dev/null
  init
  running && return 0
  # another checkout's cluster took our port while we were stopped: move
  port_in_use "$port" && { port=$((port - 1)); move_port; }
  # A port can still be held by something that does not answer (a client's
  # socket, where the range for outgoing connections is set otherwise; the
  # demo's port): "could not create any TCP/IP sockets", then try the next.
  local tries=0 lines
  while true; do
    lines=$( (wc -l <"$base/server.log") 2>/dev/null || echo 0)
    as_owner "$bindir/pg_ctl" -D "$data" -l "$base/server.log" -w -t 60 start >/dev/null 9>&- && return 0
    tries=$((tries + 1))
    if [ "$tries" -lt 5 ] && tail -n +"$((lines + 1))" "$base/server.log" | grep -q 'could not create any TCP/IP sockets'; then
      move_port
    else
      return 1
    fi
  done
}

# One start at a time per checkout (make test starts clusters from jobs that
# run at once): two new clusters would otherwise pick the same free port.
locked_start() {
  mkdir -p "$root/.pgdq"
  exec 9>"$root/.pgdq/.start.lock"
  flock 9 # the server started below must not hold it: pg_ctl runs with 9 closed
  [ -f "$base/port" ] || choose_port # chosen again under the lock
  start
}

case "$cmd" in
  start) locked_start ;;
  stop)
    if running; then
      as_owner "$bindir/pg_ctl" -D "$data" -m fast -w stop >/dev/null \
        || { echo "pgcluster: could not stop cluster $name; see $base/server.log" >&2; exit 1; }
      echo "stopped cluster $name (port $port, $base)"
    else
      echo "cluster $name was not running: nothing to stop"
    fi
    ;;
  restart) locked_start; as_owner "$bindir/pg_ctl" -D "$data" -m fast -w restart -l "$base/server.log" >/dev/null 9>&- ;;
  crash-restart) as_owner "$bindir/pg_ctl" -D "$data" -m immediate -w restart -l "$base/server.log" >/dev/null ;;
  status) running && echo "running on port $port ($data)" || { echo "stopped"; exit 3; } ;;
  env)
    printf 'export PGHOST=%q PGPORT=%q PGUSER=postgres PGDQ_PG=%q\n' "$sock" "$port" "$version"
    # this version's psql, pg_dump and pg_config first (Debian's serve 15 from /usr/bin)
    [ "$version" = 15 ] || printf 'export PATH=%q:"$PATH"\n' "$bindir"
    ;;
  dir) echo "$base" ;;
  *) echo "pgcluster: unknown command $cmd" >&2; echo "$usage" >&2; exit 2 ;;
esac
