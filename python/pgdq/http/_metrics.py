"""GET /metrics in the Prometheus text format (prometheus_client): every
queue's counts and ages, read from dq_stats at each scrape, and this server
process's requests, waiting long polls and their latency."""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import AsyncClient
from ..model import DeadLetterStats, QueueStats
from ._access import authorize

# The methods counted by name; any other (a client may send any token as its method) is "other",
# so that made-up methods add no series (each one a counter and a histogram kept for good).
COUNTED_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})


def method_label(method: str) -> str:
    """method as the metrics' label: itself if in COUNTED_METHODS, else "other"."""
    return method if method in COUNTED_METHODS else "other"


class RequestMetrics:
    """This process's request counts and durations, by method (method_label), route
    (its template, so queue names add no series) and status."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "pgdq_http_requests", "HTTP requests answered", ["method", "route", "status"], registry=self.registry
        )
        self.seconds = Histogram(
            "pgdq_http_request_duration_seconds",
            "HTTP request durations (a long poll's wait included)",
            ["method", "route"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=self.registry,
        )
        self._children: dict[tuple[Any, ...], Any] = {}

    def _child(self, metric: Any, *labels: str) -> Any:
        """metric.labels(*labels), kept: the labels are bounded (method_label, route templates, statuses)."""
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def middleware(self, app: ASGIApp) -> ASGIApp:
        """app, each HTTP request that reaches a route counted and timed (plain ASGI: no per-request task)."""

        async def counted(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            started, status = time.perf_counter(), "500"

            async def send_status(message: Message) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = str(message["status"])
                await send(message)

            try:
                await app(scope, receive, send_status)
            finally:
                route = getattr(scope.get("route"), "path", None)
                if route is not None:
                    method = method_label(scope["method"])
                    self._child(self.seconds, method, route).observe(time.perf_counter() - started)
                    self._child(self.requests, method, route, status).inc()

        return counted


class _Families:
    """A collector of metric families read beforehand (the queues' stats)."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self.families


def queue_families(stats: list[QueueStats], dead: list[DeadLetterStats], waiting: int, now: datetime) -> list[Metric]:
    """Gauges of every queue's counts (dead letters too), its oldest ready message's age and its next due time."""
    counts = {
        "ready": "Messages due now (a message held back by its channel's limits counts)",
        "delayed": "Messages not leased and due later",
        "leased": "Messages whose lease still runs",
    }
    families = []
    for field, doc in counts.items():
        family = GaugeMetricFamily(f"pgdq_queue_{field}", doc, labels=["queue"])
        for s in stats:
            family.add_metric([s.queue], getattr(s, field))
        families.append(family)
    age = GaugeMetricFamily(
        "pgdq_queue_oldest_ready_age_seconds", "How long the oldest ready message has been due", labels=["queue"]
    )
    due = GaugeMetricFamily(
        "pgdq_queue_next_due_timestamp_seconds", "When the next delayed message falls due", labels=["queue"]
    )
    for s in stats:
        age.add_metric([s.queue], (now - s.oldest_ready_at).total_seconds() if s.oldest_ready_at else 0.0)
        if s.next_due_at is not None:
            due.add_metric([s.queue], s.next_due_at.timestamp())
    dead_letters = GaugeMetricFamily("pgdq_queue_dead_letters", "Dead letters (dq_dead_stats)", labels=["queue"])
    dead_counts = {d.queue: d.dead for d in dead}
    for name in sorted({s.queue for s in stats} | dead_counts.keys()):
        dead_letters.add_metric([name], dead_counts.get(name, 0))
    polls = GaugeMetricFamily("pgdq_http_waiting_polls", "Long polls of this server process waiting now")
    polls.add_metric([], waiting)
    return [*families, age, due, dead_letters, polls]


router = APIRouter()


@router.get("/metrics", response_class=Response, tags=["manage"], responses={200: {"content": {"text/plain": {}}}})
async def metrics(request: Request) -> Response:
    """The Prometheus text format; with tokens, an admin token on every queue."""
    authorize(request, "admin", None)
    app: Any = request.app
    client = AsyncClient(app.state.pool, schema=app.state.settings.schema)
    stats, dead = await client.stats(), await client.dead_stats()
    queues = CollectorRegistry()
    queues.register(_Families(queue_families(stats, dead, app.state.wakeups.waiting(), datetime.now(UTC))))
    body = generate_latest(queues) + generate_latest(app.state.request_metrics.registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
