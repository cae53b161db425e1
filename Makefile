# pgdq: a delayed-message queue inside PostgreSQL.
#   make demo         set everything up and run the demo on a throwaway cluster
#                     (DEMO_DSN=… [DEMO_YES=1]: on a database of yours, after asking)
#   make test         set everything up and run every test on PostgreSQL 15, 16, 17 and 18
#                     (non-zero on failure)
#   make check        the inner loop while developing (a few minutes): lint, pgTAP and pytest on a
#                     fresh install, without upgraded installs, routers, failover, fuzzing, browser
#   PG=16|17|18       demo, serve-demo, spark-demo, bench and check on that PostgreSQL (default
#                     15; scripts/pgbin.sh fetches it), test on that one alone
#   make bench        pgdq against the raw-SQL ceiling and the peers (BENCH_ARGS=...; bench/bench.py)
#   make bench-quick  a few minutes: pgdq's rows against raw SQL on W1-W3 (BENCH_ARGS='--workloads W8')
#   make serve-demo   pgdq serve on the demo cluster, busy demo queues: prints the dashboard's address
#                     (SERVE_ARGS='--port 9000'; default 8080)
#   make install      PGXS: install the extension (then CREATE EXTENSION pgdq)
#   make installcheck PGXS: pgTAP suite against the server named by PG* vars
#   make sql          plain install script (SCHEMA=public) for managed servers
#   make sync-code    regenerate the sync twins (python/pgdq/_sync_*.py, tests/test_*.py
#                     from tests/test_*_async.py) and the upgrade step script

EXTENSION = pgdq
# The version being built (pgdq.control); its full script is generated from
# sql/src by python/pgdq/_script.py. Released full scripts and the step
# scripts between versions are committed as released (sql/pgdq--1.0.0.sql,
# sql/pgdq--A--B.sql).
PGDQ_VERSION := $(shell sed -n "s/^default_version = '\(.*\)'/\1/p" pgdq.control)
DATA_built = sql/pgdq--$(PGDQ_VERSION).sql
DATA = $(filter-out $(DATA_built),$(wildcard sql/pgdq--*.sql))
NO_INSTALLCHECK = 1
EXTRA_CLEAN = build $(DATA_built).tmp

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs 2>/dev/null)
# `make check` alone is the project's inner loop (below); PGXS's own `check`
# only says it is unsupported, so PGXS is left out of that goal.
ifneq ($(PGXS),)
ifneq ($(MAKECMDGOALS),check)
include $(PGXS)
endif
endif

# PG=16|17|18 on make's command line: the PostgreSQL major version the
# throwaway clusters run (scripts/pgcluster.sh); a PG in the environment is not it
ifeq ($(origin PG),command line)
export PGDQ_PG := $(PG)
endif

SCHEMA ?= public
SQL_SOURCES := $(sort $(wildcard sql/src/*.sql))
VENV := .venv
PY := $(VENV)/bin/python

# python/pgdq/_script.py is the one assembler (plain python3, no packages):
# header, sql/src in name order, the pg_dump registrations of its TABLES.
$(DATA_built): python/pgdq/_script.py $(SQL_SOURCES)
	python3 python/pgdq/_script.py --extension > $@.tmp && mv $@.tmp $@

.PHONY: sql deps venv demo test check lint installcheck pytest cluster-stop sync-code bench bench-quick spark-demo serve-demo

# The plain install script, for servers where extensions cannot be added.
sql:
	@mkdir -p build
	python3 python/pgdq/_script.py $(SCHEMA) > build/pgdq.sql
	@echo "wrote build/pgdq.sql (schema $(SCHEMA)); apply with: psql -1 -f build/pgdq.sql"

# What each target needs: system packages (scripts/deps.sh demo|serve|spark|test)
# and the package's extras in .venv. There is one .venv: a target needing more
# extras than it holds adds them (pip upgrades it in place, never rebuilds it).
EXTRAS_demo :=
EXTRAS_serve := http
EXTRAS_spark := spark
EXTRAS_test := dev,spark,http

deps: deps-test
deps-%:
	scripts/deps.sh $*

venv: $(VENV)/.stamp-test
$(VENV)/.stamp-%: python/pyproject.toml | deps-%
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip > $(VENV)/pip.log 2>&1 || { cat $(VENV)/pip.log; exit 1; }
	$(PY) -m pip install -e 'python$(if $(EXTRAS_$*),[$(EXTRAS_$*)])' >> $(VENV)/pip.log 2>&1 || { cat $(VENV)/pip.log; exit 1; }
	touch $@

installcheck:
	psql -X -v ON_ERROR_STOP=1 -q -c 'CREATE EXTENSION IF NOT EXISTS pgtap' -c 'CREATE EXTENSION IF NOT EXISTS pgdq'
	pg_prove --ext .sql -f pgtap/

lint: venv
	$(VENV)/bin/sqlfluff lint sql/src pgtap
	$(VENV)/bin/hadolint docker/Dockerfile docker/worker.Dockerfile
	$(VENV)/bin/mypy --strict python/pgdq python/tools
	$(VENV)/bin/ruff check python tests examples bench
	$(VENV)/bin/ruff format --check python tests examples bench

test: venv
	scripts/test.sh

ifeq ($(MAKECMDGOALS),check)
check: venv
	scripts/test.sh check
endif

demo: $(VENV)/.stamp-demo
	scripts/demo.sh

serve-demo: $(VENV)/.stamp-serve
	scripts/demo.sh examples/serve_demo.py $(SERVE_ARGS)

spark-demo: $(VENV)/.stamp-spark
	scripts/demo.sh examples/spark_reminders.py $(SPARK_ARGS)

# every version's clusters that exist
cluster-stop:
	for dir in .pgdq/*/; do name=$$(basename "$$dir") v=15; \
	  case $$name in *-pg1[678]) v=$${name##*-pg} name=$${name%-pg*} ;; esac; \
	  PGDQ_PG=$$v scripts/pgcluster.sh stop "$$name"; done

sync-code: venv
	$(VENV)/bin/python python/tools/gen_sync.py
	python3 python/tools/gen_upgrade.py

bench: venv
	scripts/bench.sh $(BENCH_ARGS)

# a few minutes: the ratios a change to the hot path moves (bench/bench.py, --quick)
bench-quick: venv
	scripts/bench.sh --quick $(BENCH_ARGS)
