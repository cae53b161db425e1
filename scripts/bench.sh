#!/usr/bin/env bash
# `make bench`: a throwaway cluster of its own with durable settings, then bench/bench.py.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/pgcluster.sh start bench
eval "$(scripts/pgcluster.sh env bench)"
psql -X -q -d postgres -c "ALTER SYSTEM SET fsync = on" -c "ALTER SYSTEM SET synchronous_commit = on" -c "SELECT pg_reload_conf()" >/dev/null
exec .venv/bin/python bench/bench.py "$@"
