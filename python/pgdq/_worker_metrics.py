"""A worker's counts in the Prometheus format (`pgdq worker --metrics-port`):
deliveries by queue and outcome, handler durations by queue, served by
prometheus_client's own HTTP server in a thread (the `http` extra)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from ._delivery import OUTCOMES


class OutcomeRecorder(Protocol):
    """What a Worker tells about each finished delivery (Worker(metrics=...))."""

    def record(self, queue: str, outcome: str, seconds: float | None) -> None:
        """One delivery of queue ended in outcome; its handler ran seconds (None: it did not run)."""


class WorkerMetrics:
    """Counters and a histogram of a worker's deliveries, served at http://host:port/metrics."""

    def __init__(self, queues: Iterable[str], port: int, host: str = "127.0.0.1") -> None:
        try:
            from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server  # noqa: PLC0415
        except ImportError as e:  # pragma: no cover - the http extra is missing
            raise RuntimeError("--metrics-port needs prometheus-client: pip install 'pgdq[http]'") from e
        self.registry = CollectorRegistry()
        self.deliveries = Counter(
            "pgdq_worker_deliveries",
            "Deliveries by outcome: handled (acked), retried (the handler asked), failed (retried after the"
            " backoff), dead_lettered, lost (the lease was lost first)",
            ["queue", "outcome"],
            registry=self.registry,
        )
        self.seconds = Histogram(
            "pgdq_worker_handler_duration_seconds",
            "How long handlers ran, whatever their outcome",
            ["queue"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
            registry=self.registry,
        )
        for queue in queues:  # every series from the start, at 0
            self.seconds.labels(queue)
            for outcome in OUTCOMES:
                self.deliveries.labels(queue, outcome)
        self._server: Any
        self._server, self._thread = start_http_server(port, host, registry=self.registry)

    def record(self, queue: str, outcome: str, seconds: float | None) -> None:
        """Count one finished delivery and its handler's duration."""
        self.deliveries.labels(queue, outcome).inc()
        if seconds is not None:
            self.seconds.labels(queue).observe(seconds)

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()
