# A pgdq worker: `pgdq worker` consuming a queue with a handler function.
# With the http extra, the same image runs `pgdq serve` (docker/compose.yaml's http service).
# Build from the repo root: docker build -f docker/worker.Dockerfile -t pgdq-worker .
# Run: docker run -e DATABASE_URL=postgresql://... pgdq-worker [--queue Q --handler module:function ...]
# The database comes from PGDQ_DSN or DATABASE_URL (else the PG* variables).
# The arguments (CMD) default to the demo queue and examples/tasks.py's
# handler, which logs each delivery; give your own arguments (or compose's
# `command:`) to pick other queues, a handler of yours (put its module in
# /app/examples or on PYTHONPATH) and settings (pgdq worker --help).
FROM python:3.11-slim

WORKDIR /app
# python/pgdq/sql and python/pgdq/upgrades are symlinks into sql/: copy all of it
COPY sql /app/sql
COPY python /app/python
RUN pip install --no-cache-dir "/app/python[http]" \
    && useradd --system --no-create-home --uid 10001 pgdq
COPY examples /app/examples

# the handler module is imported from the working directory
WORKDIR /app/examples
# an unprivileged user (numeric, so hosts and Kubernetes can tell it is not root)
USER 10001
ENTRYPOINT ["pgdq", "worker"]
CMD ["--queue", "demo", "--handler", "tasks:log_delivery"]
