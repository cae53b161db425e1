#!/usr/bin/env bash
# `make test`: lint, pgTAP and pytest against a throwaway cluster of our own,
# each suite twice: on a fresh install, and on 1.0.0 (as released) upgraded
# in place (pgTAP also on 1.1.0 upgraded in place). Runs every step, reports
# each, and exits non-zero if any failed.
#   scripts/test.sh          everything (make test, what CI runs)
#   scripts/test.sh check    the inner loop (make check): lint, pgTAP and pytest on
#                            a fresh install only, without the suites that exist to
#                            exercise other installs and deployments (QUICK_SKIPS)
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-all}
# make check leaves these to make test: routers (PL/Proxy), failover (standby
# pairs), fuzzing (schemathesis), the browser (Chromium), the chaos runs and
# Spark (its JVMs took a third of the suite's CPU on a 2-core machine).
QUICK_SKIPS=(tests/test_shard.py tests/test_http_shard.py tests/test_failover.py tests/test_http_fuzz.py
  tests/test_dashboard.py tests/chaos tests/test_spark.py)

failed=()
step() {
  local name=$1; shift
  echo "==> $name"
  if "$@"; then echo "<== $name: ok"; else echo "<== $name: FAILED"; failed+=("$name"); fi
}

make -s install >/dev/null || { echo "make install failed (run as root, or install pgdq's extension files first)"; exit 1; }
scripts/pgcluster.sh start test || { echo "could not start the test cluster; see $(scripts/pgcluster.sh dir test)/server.log"; exit 1; }
eval "$(scripts/pgcluster.sh env test)"

fresh_db() { dropdb --if-exists -f "$1" && createdb "$1"; }
# a database holding pgdq $2 (default 1.0.0) upgraded with ALTER EXTENSION pgdq UPDATE
upgraded_db() {
  fresh_db "$1" && psql -X -q -v ON_ERROR_STOP=1 -d "$1" \
    -c "CREATE EXTENSION pgdq VERSION '${2:-1.0.0}'" -c 'ALTER EXTENSION pgdq UPDATE'
}

step "lint (sqlfluff, hadolint, mypy, ruff)" make -s lint
step "generated sync code is current" .venv/bin/python python/tools/gen_sync.py --check
step "generated step script is current" .venv/bin/python python/tools/gen_upgrade.py --check
fresh_db pgdq_tap
step "pgTAP, fresh install (make installcheck)" env PGDATABASE=pgdq_tap make -s installcheck
if [ "$mode" = check ]; then
  # three workers (pytest-xdist), each file on one of them, each worker with its own databases
  step "pytest, fresh install, in parallel (without: ${QUICK_SKIPS[*]})" env PGDQ_TEST_DB=pgdq_py \
    PGDQ_TEST_EXAMPLES_SHARE=0.25 .venv/bin/pytest -q \
    -n 3 --dist loadfile -m "not restarts_server" tests "${QUICK_SKIPS[@]/#/--ignore=}"
  if [ ${#failed[@]} -gt 0 ]; then echo "FAILED: ${failed[*]}"; exit 1; fi
  echo "all check steps passed (make test runs everything)"; exit 0
fi
upgraded_db pgdq_tap_upgraded
step "pgTAP, 1.0.0 upgraded in place" env PGDATABASE=pgdq_tap_upgraded make -s installcheck
upgraded_db pgdq_tap_upgraded_1_1 1.1.0
step "pgTAP, 1.1.0 upgraded in place" env PGDATABASE=pgdq_tap_upgraded_1_1 make -s installcheck
step "pytest, fresh install" env PGDQ_TEST_DB=pgdq_py .venv/bin/pytest -q tests
step "pytest, 1.0.0 upgraded in place" env PGDQ_TEST_INSTALL=upgrade PGDQ_TEST_DB=pgdq_py_upgraded \
  .venv/bin/pytest -q tests
# The Python API's own tests through a PL/Proxy router (pgdq.shard) over 2,
# then 4, partition clusters of their own (test-shard0, ...); stopped after.
api_tests=(tests/test_queue.py tests/test_queue_async.py tests/test_browse.py tests/test_browse_async.py
  tests/test_channels.py tests/test_channels_async.py tests/test_transactional.py tests/test_transactional_async.py
  tests/test_schedules.py tests/test_cron_service.py tests/test_cron_service_async.py tests/test_worker.py
  tests/test_cli.py)
for n in 2 4; do
  step "pytest, the Python API through a router over $n partitions" env PGDQ_TEST_SHARDS=$n \
    PGDQ_TEST_DB=pgdq_py_sharded .venv/bin/pytest -q "${api_tests[@]}"
done
for n in 0 1 2 3; do scripts/pgcluster.sh stop "test-shard$n"; done

if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED: ${failed[*]}"
  exit 1
fi
echo "all test steps passed"
