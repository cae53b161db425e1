#!/usr/bin/env bash
# `make demo` / `make spark-demo`: run an example (default examples/demo.py)
# against DATABASE_URL, or against a throwaway cluster under .pgdq/demo when
# no server is configured.   scripts/demo.sh [EXAMPLE.py [ARGS...]]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${DATABASE_URL:-}" ]; then
  scripts/pgcluster.sh start demo
  eval "$(scripts/pgcluster.sh env demo)"
  psql -X -q -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'pgdq_demo'" | grep -q 1 \
    || createdb pgdq_demo
  export PGDATABASE=pgdq_demo
  echo "demo database: $PGHOST port $PGPORT, database pgdq_demo (stop it with: make cluster-stop)"
fi
export PYSPARK_PYTHON="$PWD/.venv/bin/python"  # Spark's executors run the same Python
exec .venv/bin/python "${1:-examples/demo.py}" "${@:2}"
