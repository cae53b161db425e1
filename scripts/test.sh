#!/usr/bin/env bash
# `make test`: lint, then pgTAP and pytest against throwaway clusters of our
# own, on every supported PostgreSQL (15, 16, 17, 18; scripts/pgbin.sh). Runs
# every step, reports each, and exits non-zero if any failed.
#   scripts/test.sh          everything (make test, what CI runs)
#   scripts/test.sh check    the inner loop (make check): lint, pgTAP and pytest on
#                            a fresh install on 15 only, without the suites that exist
#                            to exercise other installs and deployments (QUICK_SKIPS)
# PGDQ_TEST_VERSIONS="15 18" runs only those versions (default: all four;
# PGDQ_PG=V, which `make test PG=V` sets, V alone; make check: 15 or PGDQ_PG).
# PGDQ_TEST_JOBS=N: how many jobs run at once (default 3; below).
#
# On 15, the version `make demo` embeds, everything runs: pgTAP on a fresh
# install and on 1.0.0, 1.1.0 and 1.2.0 upgraded in place, every pytest suite
# on 1.0.0 upgraded in place, and the Python API through PL/Proxy routers. On
# 16, 17 and 18 runs what a server version can change (README.md, "Supported
# PostgreSQL versions"): pgTAP on the four installs, and the suites of the SQL
# API, the Python API, installs (extension and plain script), upgrades,
# security, concurrency and the worker, on a fresh install. The suites left
# to 15 there test layers above SQL (HTTP, the dashboard, Spark, the README)
# or programs built for 15 only (PL/Proxy, PgBouncer's tests, the failover
# pair, the chaos runs).
#
# How it fits in 20 minutes on 2 cores (it took 24 to 47 before 1.3.0):
# - Jobs run at once (PGDQ_TEST_JOBS, the longest first): lint, each pgTAP
#   pass (a database of its own), each version's suites; every version's
#   cluster is up from the start. A job's output is printed whole when it
#   ends, its steps in order, with each step's seconds.
# - Suites that restart servers (pytest -m restarts_server) or make roles
#   (cluster-wide) run at once only on clusters of their own
#   (PGDQ_TEST_CLUSTER: test, test-restart, test-routers, each with its
#   partition clusters NAME-shard0, ...).
# - Each suite runs once on 15, in parallel (pytest-xdist), on 1.0.0 upgraded
#   in place. Until 1.2.0 every suite also ran on a fresh install there,
#   serially: the same tests on the same objects, since tests/test_upgrade.py
#   proves (on every version) that 1.0.0, 1.1.0 and 1.2.0 upgraded in place
#   equal a fresh install object for object (functions, tables, columns in
#   their order, indexes, constraints, types), and every suite starts from an
#   empty database. The fresh install stays covered on 15 by pgTAP's fresh
#   pass and by the suites that install it themselves (test_install,
#   test_upgrade, the chaos runs, the failover pair), and on 16, 17 and 18
#   by every version suite.
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-all}
versions=${PGDQ_TEST_VERSIONS:-${PGDQ_PG:-15 16 17 18}}
[ "$mode" = check ] && versions=${PGDQ_PG:-15}
# make check leaves these to make test: routers (PL/Proxy), failover (standby
# pairs), fuzzing (schemathesis), the browser (Chromium), the chaos runs and
# Spark (its JVMs took a third of the suite's CPU on a 2-core machine).
QUICK_SKIPS=(tests/test_shard.py tests/test_http_shard.py tests/test_failover.py tests/test_http_fuzz.py
  tests/test_dashboard.py tests/chaos tests/test_spark.py)
# what 16, 17 and 18 leave to 15 (above)
VERSION_SKIPS=("${QUICK_SKIPS[@]}" tests/test_http.py tests/test_http_attacks.py tests/test_http_classic.py
  tests/test_http_delay_queue.py tests/test_http_guard.py tests/test_http_limits.py tests/test_http_manage.py
  tests/test_pgbouncer.py tests/test_readme.py tests/test_channel_example.py)

JOBS=${PGDQ_TEST_JOBS:-3}
out=$(mktemp -d) # each job's output, and the names of the steps that failed
trap 'rm -rf "$out"' EXIT

# One step: its name, then the command; its result and seconds are printed,
# and a failure recorded (from any job) for the end.
step() {
  local name=$1 began=$SECONDS; shift
  echo "==> $name"
  if "$@"; then echo "<== $name: ok ($((SECONDS - began)) s)"
  else echo "<== $name: FAILED ($((SECONDS - began)) s)"; echo "$name" >>"$out/failed"; fi
}

# Jobs: `job NAME COMMAND...` runs COMMAND in the background once fewer than
# JOBS run, its output kept; `reap` waits for one to end and prints its output.
declare -A running=() # pid -> name|log
jobs_started=0
job() {
  local name=$1; shift
  while [ ${#running[@]} -ge "$JOBS" ]; do reap; done
  local log="$out/job$((jobs_started += 1)).log"
  ("$@") >"$log" 2>&1 &
  running[$!]="$name|$log"
}
reap() {
  local pid name log
  wait -n -p pid "${!running[@]}"
  IFS='|' read -r name log <<<"${running[$pid]}"
  unset "running[$pid]"
  echo "=== $name (ended at $((SECONDS / 60)) min $((SECONDS % 60)) s)"
  cat "$log"
}
reap_all() { while [ ${#running[@]} -gt 0 ]; do reap; done; }

fresh_db() { dropdb --if-exists -f "$1" && createdb "$1"; }
# a database holding pgdq $2 (default 1.0.0) upgraded with ALTER EXTENSION pgdq UPDATE
upgraded_db() {
  fresh_db "$1" && psql -X -q -v ON_ERROR_STOP=1 -d "$1" \
    -c "CREATE EXTENSION pgdq VERSION '${2:-1.0.0}'" -c 'ALTER EXTENSION pgdq UPDATE'
}
# pytest in three workers (pytest-xdist), each file on one of them (the
# longest first: tests/conftest.py), each worker with databases of its own;
# the tests that restart the server are left out
PARALLEL=(.venv/bin/pytest -q -n 3 --dist loadfile -m "not restarts_server")

PATH_BEFORE=$PATH
# Install pgdq's extension files into PostgreSQL $1 and start its test cluster.
prepare_version() {
  local bindir
  bindir=$(scripts/pgbin.sh "$1") || return 1
  make -s install PG_CONFIG="$bindir/pg_config" >/dev/null \
    || { echo "make install into PostgreSQL $1 failed (as root, or first: sudo make install PG_CONFIG=$bindir/pg_config)"; return 1; }
  PGDQ_PG=$1 scripts/pgcluster.sh start test \
    || { echo "could not start the test cluster; see $(PGDQ_PG=$1 scripts/pgcluster.sh dir test)/server.log"; return 1; }
}

# Point PG* (and PATH, for that version's client programs, no other
# version's) at cluster $2 (default test) of PostgreSQL $1, started, and the
# tests at it (PGDQ_TEST_CLUSTER).
on_cluster() {
  export PGDQ_PG=$1 PGDQ_TEST_CLUSTER=${2:-test}
  PATH=$PATH_BEFORE
  scripts/pgcluster.sh start "$PGDQ_TEST_CLUSTER" >/dev/null || {
    echo "PostgreSQL $1: could not start cluster $PGDQ_TEST_CLUSTER" | tee -a "$out/failed"
    return 1
  }
  eval "$(scripts/pgcluster.sh env "$PGDQ_TEST_CLUSTER")"
}

# make installcheck on database $1 once the set-up that follows ($2 ...)
# succeeded (a failed set-up fails the step: installcheck alone would
# install the current version in its place)
installcheck_after() {
  local db=$1
  shift
  "$@" && PGDATABASE=$db make -s installcheck
}

# One pgTAP pass on PostgreSQL $1: $2 is fresh, or the release upgraded in place.
pgtap_pass() {
  local v=$1 from=$2
  on_cluster "$v" || return
  if [ "$from" = fresh ]; then
    step "PostgreSQL $v: pgTAP, fresh install (make installcheck)" installcheck_after pgdq_tap fresh_db pgdq_tap
  else
    local db="pgdq_tap_upgraded_${from//./_}"
    step "PostgreSQL $v: pgTAP, $from upgraded in place" installcheck_after "$db" upgraded_db "$db" "$from"
  fi
}

lint() {
  step "lint (sqlfluff, hadolint, mypy, ruff)" make -s lint
  step "generated sync code is current" .venv/bin/python python/tools/gen_sync.py --check
  step "generated step script is current" .venv/bin/python python/tools/gen_upgrade.py --check
}

# make check: the quick suites on a fresh install, a quarter of each property test's examples.
suites_check() {
  on_cluster "$1" || return
  step "PostgreSQL $1: pytest, fresh install, in parallel (without: ${QUICK_SKIPS[*]})" env PGDQ_TEST_DB=pgdq_py \
    PGDQ_TEST_EXAMPLES_SHARE=0.25 "${PARALLEL[@]}" tests "${QUICK_SKIPS[@]/#/--ignore=}"
}

# 15: every suite, on 1.0.0 upgraded in place (above: why not on a fresh install too).
suites_15() {
  on_cluster 15 || return
  step "PostgreSQL 15: pytest, 1.0.0 upgraded in place, every suite in parallel" \
    env PGDQ_TEST_INSTALL=upgrade PGDQ_TEST_DB=pgdq_py_upgraded "${PARALLEL[@]}" tests
}

# The tests that restart the server, on a cluster of their own ($1: 15, or a
# version whose skips follow).
suites_restart() {
  local v=$1
  shift
  on_cluster "$v" test-restart || return
  local install=fresh
  [ "$v" = 15 ] && install=upgrade
  step "PostgreSQL $v: pytest, $install install, the tests that restart the server" \
    env PGDQ_TEST_INSTALL=$install PGDQ_TEST_DB=pgdq_py_restart .venv/bin/pytest -q -m restarts_server tests "$@"
  stop_clusters test-restart
}

# The Python API's own tests through a PL/Proxy router (pgdq.shard) over 2,
# then 4, partition clusters of their own (test-routers-shard0, ...).
suites_routers() {
  on_cluster 15 test-routers || return
  local api_tests=(tests/test_queue.py tests/test_queue_async.py tests/test_browse.py tests/test_browse_async.py
    tests/test_channels.py tests/test_channels_async.py tests/test_transactional.py tests/test_transactional_async.py
    tests/test_schedules.py tests/test_cron_service.py tests/test_cron_service_async.py tests/test_worker.py
    tests/test_cli.py tests/test_keyless.py tests/test_keyless_async.py tests/test_keyless_worker.py
    tests/test_history.py tests/test_history_async.py)
  for n in 2 4; do
    step "PostgreSQL 15: pytest, the Python API through a router over $n partitions" env PGDQ_TEST_SHARDS=$n \
      PGDQ_TEST_DB=pgdq_py_sharded .venv/bin/pytest -q "${api_tests[@]}"
  done
  stop_clusters test-routers
}

# 16, 17, 18: what a server version can change, on a fresh install.
suites_other() {
  on_cluster "$1" || return
  step "PostgreSQL $1: pytest, fresh install, in parallel (without: ${VERSION_SKIPS[*]})" env PGDQ_TEST_DB=pgdq_py \
    "${PARALLEL[@]}" tests "${VERSION_SKIPS[@]/#/--ignore=}"
}

# Stop cluster $1 of PGDQ_PG's version and its partition clusters.
stop_clusters() {
  local name
  for name in "$1" "$1"-shard{0..3}; do
    [ -e ".pgdq/$name$([ "$PGDQ_PG" = 15 ] || echo "-pg$PGDQ_PG")" ] && scripts/pgcluster.sh stop "$name" >/dev/null
  done
  return 0
}

# Everything (a function: the whole script is read before it runs, so
# editing it meanwhile cannot change a run under way).
main() {
  [ -n "${versions// /}" ] || { echo "no PostgreSQL version to test (PGDQ_TEST_VERSIONS is empty)"; exit 2; }
  echo "PostgreSQL versions: $versions; $JOBS jobs at once"
  local v ready=() from
  for v in $versions; do
    if prepare_version "$v"; then ready+=("$v"); else echo "PostgreSQL $v: set-up" >>"$out/failed"; fi
  done
  job "lint" lint
  if [ "$mode" = check ]; then
    for v in "${ready[@]}"; do
      job "PostgreSQL $v: pytest" suites_check "$v"
      job "PostgreSQL $v: pgTAP, fresh install" pgtap_pass "$v" fresh
    done
  else
    # the longest jobs first
    for v in "${ready[@]}"; do
      if [ "$v" = 15 ]; then
        job "PostgreSQL 15: pytest" suites_15
        job "PostgreSQL 15: pytest through routers" suites_routers
        job "PostgreSQL 15: pytest, the tests that restart the server" suites_restart 15
      fi
    done
    for v in "${ready[@]}"; do
      [ "$v" = 15 ] || job "PostgreSQL $v: pytest" suites_other "$v"
    done
    for from in fresh 1.0.0 1.1.0 1.2.0; do
      for v in "${ready[@]}"; do job "PostgreSQL $v: pgTAP, $from" pgtap_pass "$v" "$from"; done
    done
    for v in "${ready[@]}"; do
      [ "$v" = 15 ] || job "PostgreSQL $v: pytest, the tests that restart the server" suites_restart "$v" \
        "${VERSION_SKIPS[@]/#/--ignore=}"
    done
  fi
  reap_all
  # a version's cluster stops once make test is done with it (15's stays, as make check's do)
  if [ "$mode" != check ]; then
    for v in "${ready[@]}"; do [ "$v" = 15 ] || PGDQ_PG=$v scripts/pgcluster.sh stop test; done
  fi

  if [ -s "$out/failed" ]; then
    echo "FAILED: $(paste -sd ';' "$out/failed")"
    exit 1
  fi
  if [ "$mode" = check ]; then echo "all check steps passed on PostgreSQL $versions in $((SECONDS / 60)) min $((SECONDS % 60)) s (make test runs everything)"
  else echo "all test steps passed on PostgreSQL $versions in $((SECONDS / 60)) min $((SECONDS % 60)) s"; fi
}
main; exit # one line: bash has read it before main starts
