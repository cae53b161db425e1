"""GET /metrics in the Prometheus text format: every queue's counts and ages,
read from dq_stats at each scrape; for queues with retention, their finished
messages by outcome and histograms of their lateness and run time, read from
dq_history_minutes (HistoryMetrics); and this server process's requests,
waiting long polls and their latency (prometheus_client). The families of
every queue are written as text directly, as prometheus_client writes them:
its objects took most of a scrape of thousands of queues."""

from __future__ import annotations

import logging
import math
import time
from bisect import bisect_left
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import TYPE_CHECKING, Any

import psycopg
from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.utils import floatToGoString
from psycopg import sql
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import AsyncClient
from ..model import DeadLetterStats, QueueStats
from ._access import authorize

if TYPE_CHECKING:
    from ._group_commit import GroupCommits

log = logging.getLogger("pgdq.http")

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


def _label(value: str) -> str:
    """A label value in the text format: backslash, newline and double quote escaped (as prometheus_client)."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _gauge(name: str, doc: str, samples: Iterable[tuple[str | None, float]]) -> list[str]:
    """A gauge family in the text format, as prometheus_client writes it: HELP, TYPE, a line per
    (queue, value) (queue None: no label). Written directly: 20,000 queues' families took
    prometheus_client's objects 4.7 s, these strings a tenth of it."""
    lines = [f"# HELP {name} {doc}\n", f"# TYPE {name} gauge\n"]
    for queue, value in samples:
        labels = "" if queue is None else f'{{queue="{_label(queue)}"}}'
        lines.append(f"{name}{labels} {floatToGoString(value)}\n")  # type: ignore[no-untyped-call]
    return lines


def queue_text(
    stats: list[QueueStats], dead: list[DeadLetterStats], waiting: int, now: datetime, commits: GroupCommits
) -> bytes:
    """Gauges of every queue's counts (dead letters too), its oldest ready message's age and its next
    due time, the waiting long polls and group commit's batches, in the text format."""
    counts = {
        "ready": "Messages due now (a message held back by its channel's limits counts)",
        "delayed": "Messages not leased and due later",
        "leased": "Messages whose lease still runs",
    }
    lines = []
    for field, doc in counts.items():
        lines += _gauge(f"pgdq_queue_{field}", doc, ((s.queue, getattr(s, field)) for s in stats))
    ages = ((s.queue, (now - s.oldest_ready_at).total_seconds() if s.oldest_ready_at else 0.0) for s in stats)
    lines += _gauge("pgdq_queue_oldest_ready_age_seconds", "How long the oldest ready message has been due", ages)
    due = ((s.queue, s.next_due_at.timestamp()) for s in stats if s.next_due_at is not None)
    lines += _gauge("pgdq_queue_next_due_timestamp_seconds", "When the next delayed message falls due", due)
    dead_counts = {d.queue: d.dead for d in dead}
    names = sorted({s.queue for s in stats} | dead_counts.keys())
    lines += _gauge(
        "pgdq_queue_dead_letters", "Dead letters (dq_dead_stats)", ((n, dead_counts.get(n, 0)) for n in names)
    )
    paused = ((s.queue, float(s.paused)) for s in stats if s.paused is not None)  # None: SQL before 1.2
    lines += _gauge("pgdq_queue_paused", "1 while the queue is paused (dq_pause), else 0", paused)
    lines += _gauge("pgdq_http_waiting_polls", "Long polls of this server process waiting now", [(None, waiting)])
    lines += _gauge(
        "pgdq_http_batch_waiting",
        "Offers, polls and acks of this server process waiting for the statement of their kind and queue to end",
        [(None, commits.waiting())],
    )
    lines += _counter(
        "pgdq_http_batches", "Statements of this server process that answered more than one request", commits.batches
    )
    lines += _counter("pgdq_http_batched_requests", "The requests those statements answered", commits.batched)
    return "".join(lines).encode()


def _counter(name: str, doc: str, value: float) -> list[str]:
    """A counter family of one unlabelled sample in the text format, as prometheus_client writes it."""
    sample = floatToGoString(value)  # type: ignore[no-untyped-call]
    return [f"# HELP {name}_total {doc}\n", f"# TYPE {name}_total counter\n", f"{name}_total {sample}\n"]


# --- history -----------------------------------------------------------------------------

MINUTE = timedelta(minutes=1)
# How long after a minute ends its counts are taken as final: a message
# finishes at its transaction's start, and becomes visible at its commit.
SETTLE = timedelta(minutes=1)
# dq_history_stats reads at most 10,000 buckets: after a longer gap between
# scrapes (6.25 days), the minutes before the last 9,000 are skipped.
MAX_SPAN = timedelta(minutes=9000)
OUTCOMES = ("acked", "dead", "cancelled")

# The histograms' bucket bounds (seconds; +Inf last). A pgdq bin
# (dq__duration_bin: bin 0 below 1 ms, bin b >= 1 [1.1^(b-1), 1.1^b) ms)
# counts in the first bound at or above its upper edge (BUCKETS_OF).
BOUNDS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600, math.inf)
MEASURES = ("lateness", "run")

# The one statement of a scrape: the database's clock, and each queue with
# retention (dq_queues.retain: no function lists them; only those of names
# when given: the dashboard's page of queues) with its rows of
# dq_history_minutes from since (NULL: the current minute) on, or a row of
# NULLs for a queue without records there: per minute, a row of outcome
# counts (measure NULL) after a row per measure and bin, the bins in order
# (so that each _sum adds them alike). dq_history_minutes reads every
# queue's minute tallies and deltas at once (1.3: a call of dq_history_stats
# and dq_history_bins per queue, each scanning the deltas, took 2.5-5 s of
# SQL for 5,000 queues).
_HISTORY = """SELECT n.now_at, h.queue, h.minute_at, h.acked, h.dead, h.cancelled, h.measure, h.bin, h.n
    FROM (SELECT {now}() AS now_at) AS n
    LEFT JOIN LATERAL (
        SELECT r.queue::text AS queue, x.minute_at, x.acked, x.dead, x.cancelled, x.measure, x.bin, x.n
        FROM {queues} AS r
        LEFT JOIN {minutes}(
            greatest(
                coalesce(%(since)s::timestamptz, pg_catalog.date_bin('1 minute', n.now_at, 'epoch')),
                n.now_at - %(span)s::interval
            ),
            %(names)s::text[]
        ) AS x ON x.queue = r.queue
        WHERE r.retain IS NOT NULL AND (%(names)s::text[] IS NULL OR r.queue = ANY(%(names)s::text[]))
    ) AS h ON true
    ORDER BY h.queue, h.minute_at, h.measure, h.bin"""

# The same rows on SQL 1.2 (no dq_history_minutes): dq_history_stats (1-minute
# buckets) and dq_history_bins of each queue, called per queue.
_HISTORY_1_2 = """SELECT n.now_at, h.queue, h.bucket_at, h.acked, h.dead, h.cancelled, h.measure, h.bin, h.n
    FROM (SELECT {now}() AS now_at) AS n
    LEFT JOIN LATERAL (
        SELECT r.queue::text AS queue, b.*
        FROM {queues} AS r
        CROSS JOIN LATERAL (
            SELECT greatest(
                coalesce(%(since)s::timestamptz, pg_catalog.date_bin('1 minute', n.now_at, 'epoch')),
                n.now_at - %(span)s::interval
            ) AS since_at
        ) AS f
        LEFT JOIN LATERAL (
            SELECT s.bucket_at, s.acked, s.dead, s.cancelled, NULL::text AS measure, NULL::smallint AS bin,
                NULL::bigint AS n
            FROM {stats}(r.queue, f.since_at, interval '1 minute') AS s
            UNION ALL
            SELECT x.minute_at, NULL, NULL, NULL, x.measure, x.bin, x.n
            FROM {bins}(r.queue, f.since_at) AS x
        ) AS b ON true
        WHERE r.retain IS NOT NULL AND (%(names)s::text[] IS NULL OR r.queue = ANY(%(names)s::text[]))
    ) AS h ON true
    ORDER BY h.queue, h.bucket_at, h.measure, h.bin"""

# What the history statement may fail with where it cannot run: a PL/Proxy
# router (no dq_queues there), a role that may not read dq_queues, SQL before 1.2.
_UNAVAILABLE = (
    psycopg.errors.UndefinedTable,
    psycopg.errors.UndefinedColumn,
    psycopg.errors.UndefinedFunction,
    psycopg.errors.InsufficientPrivilege,
)


@cache
def history_statement(schema: str | None, legacy: bool = False) -> sql.Composed:
    """The history statement (_HISTORY; legacy: _HISTORY_1_2) calling pgdq in schema (None: on the
    search_path)."""

    def name(bare: str) -> sql.Identifier:
        return sql.Identifier(schema, bare) if schema else sql.Identifier(bare)

    return sql.SQL(_HISTORY_1_2 if legacy else _HISTORY).format(
        now=name("dq_now"),
        queues=name("dq_queues"),
        minutes=name("dq_history_minutes"),
        stats=name("dq_history_stats"),
        bins=name("dq_history_bins"),
    )


def _minute(at: datetime) -> datetime:
    """The start of at's minute (UTC, as date_bin from the epoch)."""
    return at.astimezone(UTC).replace(second=0, microsecond=0)


def _plus(counts: list[float], more: list[float]) -> list[float]:
    """Two lists of counts (by OUTCOMES, or a histogram's: _Histogram) added."""
    return [a + b for a, b in zip(counts, more, strict=True)]


def bucket_of(bin: int) -> int:
    """The index in BOUNDS of the bucket a pgdq bin counts in: the first
    bound at or above the bin's upper edge (bin 0: 1 ms; b: 1.1^b ms)."""
    return bisect_left(BOUNDS, 0.001 if bin <= 0 else 1.1**bin / 1000)


def bin_seconds(bin: int) -> float:
    """A pgdq bin's middle, in seconds (as dq__bin_duration)."""
    return 0.0005 if bin <= 0 else 1.1 ** (bin - 0.5) / 1000


# A minute's (or the closed minutes') histogram of one measure: the
# cumulative count of each of BOUNDS (the last is the count), then the sum.
_Histogram = list[float]


def _histogram(bins: dict[int, int]) -> _Histogram:
    """The _Histogram of a minute's bins (bin -> records)."""
    counts = [0.0] * len(BOUNDS)
    for bin, n in bins.items():
        counts[bucket_of(bin)] += n
    running = 0.0
    for i, count in enumerate(counts):
        running = counts[i] = running + count
    return [*counts, sum(n * bin_seconds(bin) for bin, n in bins.items())]


def _le(bound: float) -> str:
    """A bucket bound as its le label (as prometheus_client writes it)."""
    return "+Inf" if bound == math.inf else repr(float(bound))


def _histogram_head(name: str, doc: str) -> list[str]:
    """A histogram family's HELP and TYPE lines."""
    return [f"# HELP {name} {doc}\n", f"# TYPE {name} histogram\n"]


class _Values:
    """floatToGoString, remembered per value: a scrape writes the same few counts (0.0 most) many times."""

    def __init__(self) -> None:
        self._known: dict[float, str] = {}

    def __call__(self, value: float) -> str:
        text = self._known.get(value)
        if text is None:
            text = self._known[value] = floatToGoString(value)  # type: ignore[no-untyped-call]
        return text


async def history_rows(
    conn: psycopg.AsyncConnection[Any], schema: str | None, params: dict[str, Any]
) -> list[tuple[Any, ...]]:
    """The rows of the history statement on conn: the one of history_statement, or on SQL 1.2
    (no dq_history_minutes) the one calling dq_history_stats and dq_history_bins per queue."""
    try:
        cursor = await conn.execute(history_statement(schema), params)
    except psycopg.errors.UndefinedFunction:
        cursor = await conn.execute(history_statement(schema, legacy=True), params)
    return await cursor.fetchall()


class HistoryMetrics:
    """The history of queues with retention as Prometheus metrics, one
    statement a scrape (history_statement), kept per server process.

    pgdq_queue_finished_total{queue, outcome} counts the messages acked,
    dead-lettered or cancelled since the minute of this process's first
    scrape (purges are not counted: dq_history_stats has no column for
    them). A counter must never go down, and what dq_history_stats reports
    does (records age out after the queue's retention period), so the
    counts are kept here: each minute's count is the most any scrape read
    of it; a minute ended SETTLE ago is closed, its count added to the
    queue's total for good and not read again. A scrape reads only the
    minutes not closed, a few rows a queue. Records committed later than
    SETTLE after their minute, or aged out before a scrape read them (a
    period shorter than the scrape interval), are not counted. Each server
    process counts alike: use rate(), not a sum over servers.

    pgdq_queue_lateness_seconds and pgdq_queue_run_seconds{queue} are
    histograms of the acked and dead-lettered messages that were delivered
    (from due to delivery; from the last delivery to the finish), counted
    alike from dq_history_bins: per minute, each bucket's cumulative count
    and the sum are the most any scrape read; closed minutes are added to
    the totals. A pgdq bin [1.1^(b-1), 1.1^b) ms counts in the first of
    BOUNDS at or above 1.1^b ms (bin 0, under 1 ms: in 0.001), so a bucket
    never counts a duration above its bound but may leave out durations up
    to 10 % below it (counted in the next bucket). _sum adds each bin's
    middle (dq__bin_duration) per record: within 5 %. Times are the
    database's (dq_now)."""

    def __init__(self) -> None:
        self._mark: datetime | None = None  # minutes before it are closed
        self._closed: dict[str, list[float]] = {}  # queue -> its closed minutes' counts, by OUTCOMES
        self._open: dict[tuple[str, datetime], list[float]] = {}  # (queue, minute) -> the most read of it
        # (queue, measure) -> its closed minutes' _Histogram; (queue, minute, measure) -> the most read of it
        self._closed_histograms: dict[tuple[str, str], _Histogram] = {}
        self._open_histograms: dict[tuple[str, datetime, str], _Histogram] = {}
        self._warned = False

    async def text(self, conn: psycopg.AsyncConnection[Any], schema: str | None) -> bytes:
        """Read the history (one statement on conn) and return its families in
        the text format; none where it cannot be read (logged once)."""
        params = {"since": self._mark, "span": MAX_SPAN, "names": None}
        try:
            rows = await history_rows(conn, schema, params)
        except _UNAVAILABLE as e:
            if not self._warned:
                log.warning("no history metrics: %s", e.diag.message_primary or e)
                self._warned = True
            return b""
        now: datetime = rows[0][0]
        if self._mark is None:
            self._mark = _minute(now)
        queues: set[str] = set()  # each queue with retention
        bins: dict[tuple[str, datetime, str], dict[int, int]] = {}  # (queue, minute, measure) -> bin -> records
        for _, queue, bucket_at, acked, dead, cancelled, measure, bin, n in rows:
            if queue is None:
                continue
            queues.add(queue)
            if bucket_at is None or bucket_at < self._mark:  # none, or closed meanwhile by another scrape
                continue
            if measure is not None:
                bins.setdefault((queue, bucket_at, measure), {})[bin] = n
                continue
            seen = self._open.get((queue, bucket_at), [0] * len(OUTCOMES))
            self._open[queue, bucket_at] = [max(a, b) for a, b in zip(seen, (acked, dead, cancelled), strict=True)]
        for key, minute_bins in bins.items():
            read = _histogram(minute_bins)
            seen = self._open_histograms.get(key, [0.0] * len(read))
            self._open_histograms[key] = [max(a, b) for a, b in zip(seen, read, strict=True)]
        text = self._report(queues)
        self._close(_minute(now - SETTLE))
        return text

    def _report(self, queues: set[str]) -> bytes:
        """The families of queues (totals closed and open) in the text format, as prometheus_client
        writes a CounterMetricFamily and HistogramMetricFamilies: labels sorted by name. Written
        directly: 5,000 queues' histograms took its objects 6-7 s, these strings a tenth of it."""
        totals = {q: list(self._closed.get(q, [0] * len(OUTCOMES))) for q in queues}
        for (queue, _), counts in self._open.items():
            if queue in totals:
                totals[queue] = _plus(totals[queue], counts)
        value = _Values()
        name = "pgdq_queue_finished_total"
        lines = [
            f"# HELP {name} Messages that left a queue with retention since this server process's first scrape,"
            " by outcome\n",
            f"# TYPE {name} counter\n",
        ]
        for queue, counts in totals.items():
            label = _label(queue)
            for outcome, count in zip(OUTCOMES, counts, strict=True):
                lines.append(f'{name}{{outcome="{outcome}",queue="{label}"}} {value(count)}\n')
        empty = [0.0] * (len(BOUNDS) + 1)
        histograms = {(q, m): list(self._closed_histograms.get((q, m), empty)) for q in queues for m in MEASURES}
        for (queue, _, measure), histogram in self._open_histograms.items():
            if (queue, measure) in histograms:
                histograms[queue, measure] = _plus(histograms[queue, measure], histogram)
        families: dict[str, list[str]] = {
            "lateness": _histogram_head(
                "pgdq_queue_lateness_seconds",
                "From due to delivery, of the messages acked or dead-lettered since this server process's first scrape",
            ),
            "run": _histogram_head(
                "pgdq_queue_run_seconds",
                "From the last delivery to the finish, of the messages acked or dead-lettered"
                " since this server process's first scrape",
            ),
        }
        prefixes = {
            measure: [f'pgdq_queue_{measure}_seconds_bucket{{le="{_le(bound)}",queue="' for bound in BOUNDS]
            for measure in MEASURES
        }
        for (queue, measure), histogram in sorted(histograms.items()):
            label, out, bucket = _label(queue), families[measure], prefixes[measure]
            for prefix, count in zip(bucket, histogram, strict=False):
                out.append(f'{prefix}{label}"}} {value(count)}\n')
            family = f"pgdq_queue_{measure}_seconds"
            out.append(f'{family}_count{{queue="{label}"}} {value(histogram[-2])}\n')
            out.append(f'{family}_sum{{queue="{label}"}} {value(histogram[-1])}\n')
        return "".join(lines + families["lateness"] + families["run"]).encode()

    def _close(self, mark: datetime) -> None:
        """Add the counts of the open minutes before mark to their queues' totals, and read them no more."""
        for queue, minute in [k for k in self._open if k[1] < mark]:
            counts = self._open.pop((queue, minute))
            self._closed[queue] = _plus(self._closed.get(queue, [0] * len(OUTCOMES)), counts)
        for queue, minute, measure in [k for k in self._open_histograms if k[1] < mark]:
            histogram = self._open_histograms.pop((queue, minute, measure))
            closed = self._closed_histograms.get((queue, measure), [0.0] * len(histogram))
            self._closed_histograms[queue, measure] = _plus(closed, histogram)
        self._mark = max(mark, self._mark or mark)


router = APIRouter()


@router.get("/metrics", response_class=Response, tags=["manage"], responses={200: {"content": {"text/plain": {}}}})
async def metrics(request: Request) -> Response:
    """The Prometheus text format; with tokens, an admin token on every queue."""
    authorize(request, "admin", None)
    app: Any = request.app
    client = AsyncClient(app.state.pool, schema=app.state.settings.schema)
    stats, dead = await client.stats(), await client.dead_stats()
    async with app.state.pool.connection() as conn:
        history = await app.state.history_metrics.text(conn, app.state.settings.schema)
    body = queue_text(stats, dead, app.state.wakeups.waiting(), datetime.now(UTC), app.state.group_commits)
    body += history + generate_latest(app.state.request_metrics.registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
