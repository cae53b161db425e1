#!/usr/bin/env bash
# `make demo` / `make spark-demo`: run an example (default examples/demo.py)
# on the project's own throwaway cluster (.pgdq/demo, database pgdq_demo;
# PostgreSQL 15, or the version PGDQ_PG names: `make demo PG=18`), then print
# its DSN and what to try next.
#   scripts/demo.sh [EXAMPLE.py [ARGS...]]
# DATABASE_URL, PGDQ_DSN and the PG* variables of your shell are ignored: the
# demo installs pgdq into, and purges a queue of, only a database it was
# given explicitly, after saying so and asking:
#   make demo DEMO_DSN=postgresql://…        (DEMO_YES=1 answers yes: no terminal needed)
#   scripts/demo.sh --next-steps DSN   only print the next steps for DSN
set -euo pipefail
cd "$(dirname "$0")/.."

# What to try after the demo, from the checkout. They touch only the demo's
# own queue (pgdq_demo), never the queues README.md's walk-through uses.
# tests/test_readme.py runs them (but the export and source lines, which it
# sets up itself, and those that run until Ctrl-C) before the README's blocks.
next_steps() {
  cat <<STEPS
Next steps, from this directory (then every snippet of README.md runs as shown):
  export DATABASE_URL=$1
  source .venv/bin/activate                               # python with pgdq, and the pgdq command
  psql "\$DATABASE_URL" -c 'SELECT * FROM dq_stats()'     # the SQL API
  python -c 'import os; from pgdq import Queue; print(Queue("pgdq_demo", os.environ["DATABASE_URL"]).offer("hello", {"hi": 1}).value)'
  pgdq worker --queue pgdq_demo --handler examples/tasks.py:log_delivery   # logs each delivery; Ctrl-C stops it
  make serve-demo${PGDQ_PG:+ PG=$PGDQ_PG}                                          # the queue over HTTP: prints the dashboard's address; Ctrl-C stops it
STEPS
}
if [ "${1:-}" = --next-steps ]; then
  next_steps "${2:?usage: scripts/demo.sh --next-steps DSN}"
  exit 0
fi

example=${1:-examples/demo.py}
case "$example" in
  *spark_reminders.py) queue=pgdq_demo_reminders ;; # the examples' own queues: names no one else uses
  *serve_demo.py) queue="pgdq_demo_orders, pgdq_demo_webhooks, pgdq_demo_reports" ;;
  *) queue=pgdq_demo ;;
esac

# forget the shell's database settings (libpq's PG* variables, not PGDQ_*_PORT)
for var in $(compgen -e); do
  if [[ $var =~ ^PG[A-Z]+$ ]]; then unset "$var"; fi
done
unset DATABASE_URL PGDQ_DSN PGDQ_SCHEMA

# Ask before touching a database of the user's; false when the answer is no.
confirm() {
  local shown=$1 answer
  echo "The demo will install pgdq (if missing) into schema public of $shown"
  echo "and purge that database's queues $queue (their messages are deleted)."
  [ "${DEMO_YES:-}" = 1 ] && return 0
  if [ ! -t 0 ]; then
    echo "demo: no terminal to ask on; run with DEMO_YES=1 to go ahead" >&2
    return 1
  fi
  read -r -p "Go ahead? [y/N] " answer
  [[ $answer =~ ^[Yy]([Ee][Ss])?$ ]]
}

if [ -n "${DEMO_DSN:-}" ]; then
  # a password in the DSN is not echoed
  shown=$(printf %s "$DEMO_DSN" | sed -E 's#(://[^:/@]*):[^@]*@#\1:***@#; s#(password=)[^ ]*#\1***#')
  confirm "$shown" || { echo "demo: nothing done"; exit 1; }
  dsn=$DEMO_DSN
else
  scripts/pgcluster.sh start demo
  port=$(cat "$(scripts/pgcluster.sh dir demo)/port")
  # over TCP as the cluster's superuser: works for any user, from any directory
  dsn="postgresql://postgres@127.0.0.1:$port/pgdq_demo"
  admin="postgresql://postgres@127.0.0.1:$port/postgres"
  psql -X -q "$admin" -tAc "SELECT 1 FROM pg_database WHERE datname = 'pgdq_demo'" | grep -q 1 \
    || psql -X -q "$admin" -c 'CREATE DATABASE pgdq_demo'
  shown=$dsn
fi

export DATABASE_URL=$dsn
export PYSPARK_PYTHON="$PWD/.venv/bin/python" # Spark's executors run the same Python
.venv/bin/python "$example" "${@:2}"

if [ "$example" != examples/demo.py ]; then
  # serve-demo ends with Ctrl-C, spark-demo by itself: a line, not the whole banner again
  echo "Demo database: $shown"
elif [ -n "${DEMO_DSN:-}" ]; then
  printf '\nDemo database: %s\n' "$shown"
  next_steps "'<the DEMO_DSN you gave>'" # not echoed: it may hold a password
else
  printf '\nDemo database: %s\n' "$shown"
  next_steps "$dsn"
fi
if [ -z "${DEMO_DSN:-}" ]; then
  prefix=${PGDQ_PG:+PGDQ_PG=$PGDQ_PG }
  echo "The demo cluster keeps running; stop it with: ${prefix}scripts/pgcluster.sh stop demo (or make cluster-stop)"
fi
