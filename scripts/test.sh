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
#
# On 15, the version `make demo` embeds, everything runs: pgTAP on a fresh
# install and on 1.0.0, 1.1.0 and 1.2.0 upgraded in place, every pytest suite on a
# fresh install and again on 1.0.0 upgraded in place, and the Python API
# through PL/Proxy routers. On 16, 17 and 18 runs what a server version can
# change (README.md, "Supported PostgreSQL versions"): pgTAP on the three
# installs, and the suites of the SQL API, the Python API, installs (extension
# and plain script), upgrades, security, concurrency and the worker, on a
# fresh install. The suites left to 15 there test layers above SQL (HTTP,
# the dashboard, Spark, the README) or programs built for 15 only (PL/Proxy,
# PgBouncer's tests, the failover pair, the chaos runs).
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

failed=()
step() {
  local name=$1 began=$SECONDS; shift
  echo "==> $name"
  if "$@"; then echo "<== $name: ok ($((SECONDS - began)) s)"
  else echo "<== $name: FAILED ($((SECONDS - began)) s)"; failed+=("$name"); fi
}

fresh_db() { dropdb --if-exists -f "$1" && createdb "$1"; }
# a database holding pgdq $2 (default 1.0.0) upgraded with ALTER EXTENSION pgdq UPDATE
upgraded_db() {
  fresh_db "$1" && psql -X -q -v ON_ERROR_STOP=1 -d "$1" \
    -c "CREATE EXTENSION pgdq VERSION '${2:-1.0.0}'" -c 'ALTER EXTENSION pgdq UPDATE'
}
# pytest in three workers (pytest-xdist), each file on one of them, each worker
# with databases of its own; the tests that restart the server are left out
PARALLEL=(.venv/bin/pytest -q -n 3 --dist loadfile -m "not restarts_server")

# Install pgdq's extension files into PostgreSQL $1 and start its test
# cluster; PG* (and PATH, for that version's client programs) point at it.
use_version() {
  local bindir
  export PGDQ_PG=$1
  PATH=$PATH_BEFORE # no other version's programs
  bindir=$(scripts/pgbin.sh "$1") || return 1
  make -s install PG_CONFIG="$bindir/pg_config" >/dev/null \
    || { echo "make install into PostgreSQL $1 failed (as root, or first: sudo make install PG_CONFIG=$bindir/pg_config)"; return 1; }
  scripts/pgcluster.sh start test || { echo "could not start the test cluster; see $(scripts/pgcluster.sh dir test)/server.log"; return 1; }
  eval "$(scripts/pgcluster.sh env test)"
}
PATH_BEFORE=$PATH

# make installcheck on database $1 once the set-up that follows ($2 ...)
# succeeded (a failed set-up fails the step: installcheck alone would
# install the current version in its place)
installcheck_after() {
  local db=$1
  shift
  "$@" && PGDATABASE=$db make -s installcheck
}

# pgTAP on a fresh install, and on 1.0.0, 1.1.0 and 1.2.0 upgraded in place.
pgtap_passes() {
  local v=$1
  step "PostgreSQL $v: pgTAP, fresh install (make installcheck)" installcheck_after pgdq_tap fresh_db pgdq_tap
  [ "$mode" = check ] && return
  step "PostgreSQL $v: pgTAP, 1.0.0 upgraded in place" \
    installcheck_after pgdq_tap_upgraded upgraded_db pgdq_tap_upgraded
  step "PostgreSQL $v: pgTAP, 1.1.0 upgraded in place" \
    installcheck_after pgdq_tap_upgraded_1_1 upgraded_db pgdq_tap_upgraded_1_1 1.1.0
  step "PostgreSQL $v: pgTAP, 1.2.0 upgraded in place" \
    installcheck_after pgdq_tap_upgraded_1_2 upgraded_db pgdq_tap_upgraded_1_2 1.2.0
}

# make check: the quick suites on a fresh install, a quarter of each property test's examples.
suites_check() {
  step "PostgreSQL $1: pytest, fresh install, in parallel (without: ${QUICK_SKIPS[*]})" env PGDQ_TEST_DB=pgdq_py \
    PGDQ_TEST_EXAMPLES_SHARE=0.25 "${PARALLEL[@]}" tests "${QUICK_SKIPS[@]/#/--ignore=}"
}

# 15: every suite.
suites_15() {
  step "PostgreSQL 15: pytest, fresh install" env PGDQ_TEST_DB=pgdq_py .venv/bin/pytest -q tests
  # what make check runs, on 1.0.0 upgraded in place
  step "PostgreSQL 15: pytest, 1.0.0 upgraded in place, in parallel (without: ${QUICK_SKIPS[*]})" \
    env PGDQ_TEST_INSTALL=upgrade PGDQ_TEST_DB=pgdq_py_upgraded "${PARALLEL[@]}" tests "${QUICK_SKIPS[@]/#/--ignore=}"
  step "PostgreSQL 15: pytest, 1.0.0 upgraded in place, the tests that restart the server" \
    env PGDQ_TEST_INSTALL=upgrade PGDQ_TEST_DB=pgdq_py_upgraded .venv/bin/pytest -q -m restarts_server tests \
    "${QUICK_SKIPS[@]/#/--ignore=}"
  # The Python API's own tests through a PL/Proxy router (pgdq.shard) over 2,
  # then 4, partition clusters of their own (test-shard0, ...); stopped after.
  local api_tests=(tests/test_queue.py tests/test_queue_async.py tests/test_browse.py tests/test_browse_async.py
    tests/test_channels.py tests/test_channels_async.py tests/test_transactional.py tests/test_transactional_async.py
    tests/test_schedules.py tests/test_cron_service.py tests/test_cron_service_async.py tests/test_worker.py
    tests/test_cli.py tests/test_keyless.py tests/test_keyless_async.py tests/test_keyless_worker.py
    tests/test_history.py tests/test_history_async.py)
  for n in 2 4; do
    step "PostgreSQL 15: pytest, the Python API through a router over $n partitions" env PGDQ_TEST_SHARDS=$n \
      PGDQ_TEST_DB=pgdq_py_sharded .venv/bin/pytest -q "${api_tests[@]}"
  done
  for n in 0 1 2 3; do scripts/pgcluster.sh stop "test-shard$n"; done
}

# 16, 17, 18: what a server version can change, on a fresh install.
suites_other() {
  local v=$1
  step "PostgreSQL $v: pytest, fresh install, in parallel (without: ${VERSION_SKIPS[*]})" env PGDQ_TEST_DB=pgdq_py \
    "${PARALLEL[@]}" tests "${VERSION_SKIPS[@]/#/--ignore=}"
  step "PostgreSQL $v: pytest, the tests that restart the server" env PGDQ_TEST_DB=pgdq_py \
    .venv/bin/pytest -q -m restarts_server tests "${VERSION_SKIPS[@]/#/--ignore=}"
}

# Everything, in order (a function: the whole script is read before it runs,
# so editing it meanwhile cannot change a run under way).
main() {
  [ -n "${versions// /}" ] || { echo "no PostgreSQL version to test (PGDQ_TEST_VERSIONS is empty)"; exit 2; }
  echo "PostgreSQL versions: $versions"
  step "lint (sqlfluff, hadolint, mypy, ruff)" make -s lint
  step "generated sync code is current" .venv/bin/python python/tools/gen_sync.py --check
  step "generated step script is current" .venv/bin/python python/tools/gen_upgrade.py --check
  for v in $versions; do
    echo "=== PostgreSQL $v (at $((SECONDS / 60)) min)"
    if ! use_version "$v"; then failed+=("PostgreSQL $v: set-up"); continue; fi
    pgtap_passes "$v"
    if [ "$mode" = check ]; then suites_check "$v"; elif [ "$v" = 15 ]; then suites_15; else suites_other "$v"; fi
    # a version's cluster stops once make test is done with it (15's stays, as make check's do)
    [ "$v" = 15 ] || [ "$mode" = check ] || scripts/pgcluster.sh stop test
  done

  if [ ${#failed[@]} -gt 0 ]; then
    echo "FAILED: ${failed[*]}"
    exit 1
  fi
  if [ "$mode" = check ]; then echo "all check steps passed on PostgreSQL $versions (make test runs everything)"
  else echo "all test steps passed on PostgreSQL $versions in $((SECONDS / 60)) min"; fi
}
main; exit # one line: bash has read it before main starts
