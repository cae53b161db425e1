# The demo worker: the pgdq Python package running examples/demo.py.
# Build from the repo root: docker build -f docker/worker.Dockerfile -t pgdq-demo .
FROM python:3.11-slim

WORKDIR /app
COPY python /app/python
COPY sql/src /app/sql/src
RUN pip install --no-cache-dir /app/python
COPY examples /app/examples

CMD ["python", "examples/demo.py"]
