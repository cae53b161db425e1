#!/usr/bin/env bash
# `make bench`: a throwaway cluster of its own with durable settings, then bench/bench.py.
set -euo pipefail
cd "$(dirname "$0")/.."
# the peers: procrastinate and pgqueuer from PyPI, graphile-worker 0.17 from npm
.venv/bin/python -c "import procrastinate, pgqueuer" 2>/dev/null \
  || .venv/bin/pip install -q -e 'python[bench]' >.venv/pip-bench.log 2>&1 \
  || { cat .venv/pip-bench.log; exit 1; }
# --quick (make bench-quick) runs no peer unless named: it does not wait on npm
case " $* " in
  *" --quick "*) ;;
  *) [ -d bench/graphile/node_modules ] || (cd bench/graphile && npm install --no-audit --no-fund --silent) ;;
esac
scripts/pgcluster.sh start bench
eval "$(scripts/pgcluster.sh env bench)"
psql -X -q -d postgres -c "ALTER SYSTEM SET fsync = on" -c "ALTER SYSTEM SET synchronous_commit = on" -c "SELECT pg_reload_conf()" >/dev/null
exec .venv/bin/python bench/bench.py "$@"
