#!/usr/bin/env bash
# `make spark-demo`: examples/spark_reminders.py against DATABASE_URL, or a
# throwaway cluster under .pgdq/demo when no server is configured.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${DATABASE_URL:-}" ]; then
  scripts/pgcluster.sh start demo
  eval "$(scripts/pgcluster.sh env demo)"
  psql -X -q -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'pgdq_demo'" | grep -q 1 \
    || createdb pgdq_demo
  export PGDATABASE=pgdq_demo
fi
PYSPARK_PYTHON="$PWD/.venv/bin/python" exec .venv/bin/python examples/spark_reminders.py "$@"
