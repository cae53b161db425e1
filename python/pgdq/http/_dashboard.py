"""The dashboard at /: pages for people, rendered with Jinja2 on the server
(the first answer holds the numbers: nothing waits for a script), kept live
with htmx (fragments re-read every few seconds), the charts drawn by
Chart.js from each canvas's data-chart.

The pages: the overview (totals, the last hour's throughput of the queues
that keep history, every queue: those with messages, dead letters,
schedules or history); a queue (counts, pause and resume, its history per
minute and per hour with lateness and run-time percentiles, the next 24
hours, channels, schedules, dead letters, its latest records); its
messages (by state, by key prefix, a page at a time in due order); one
message (payload, headers, history; run now, cancel, redrive). Each
fragment is a few statements, none per message.

None of these routes is in the OpenAPI document; they check tokens like
the API (a bearer header, or the cookie the login form sets, which POST
/logout clears): reading needs consume on the queue, acting admin. Every
action (a POST but sign in and out) must also carry the page's CSRF token
(check_csrf); what a page on another site may not do (CSRF by Origin,
DNS rebinding, frames) is _guard's."""

from __future__ import annotations

import functools
import hmac
import json
import re
import secrets
from collections import Counter
from collections.abc import Awaitable, Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple, TypeVar
from urllib.parse import parse_qs, quote, urlencode

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.templating import Jinja2Templates
from psycopg import sql
from psycopg.abc import Buffer
from psycopg.adapt import PyFormat
from psycopg.types.datetime import DatetimeDumper

from .. import AsyncQueue
from ..codec import UnreadableJson
from ..errors import SqlMissing
from ..model import DeadLetter, DeliveryInfo, HistoryBucket, HistoryRecord, MessageInfo, PeekedMessage, QueueStats
from ._access import TOKEN_COOKIE, ApiError, authorize, presented_token
from ._auth import Token, find_token, new_session
from ._guard import SAFE_METHODS
from ._metrics import _UNAVAILABLE, history_rows
from ._v1 import INFINITY, MINUS_INFINITY, QueueName, SegmentRoute, _client, _queue

HERE = Path(__file__).parent
MessageId = Annotated[int, PathParam(ge=1, le=2**63 - 1, description="the message's (or dead letter's) id")]
LOGIN_BODY_LIMIT = 4096  # bytes of a login form
COOKIE_HOURS = 12  # how long the login cookie lasts (less if the token expires sooner)
PAGE_SIZE = 50  # messages on a page of /queues/{queue}/messages (limit= up to MAX_PAGE)
MAX_PAGE = 500
SCAN = 1000  # dead letters (oldest first) or records (newest first) searched for one id
RECENT = 10  # records on a queue's page
WORKING = 20  # running and retrying messages listed on a queue's page (oldest first)
DEAD_SHOWN = 100  # dead letters listed on a queue's page (oldest first)
OVERVIEW_PAGE = 100  # queues on a page of the overview (the totals count every queue)
ERROR_LINE = 160  # characters of an error's last line shown before "more"
MINUTE, HOUR = timedelta(minutes=1), timedelta(hours=1)
_T = TypeVar("_T")

# The CSRF token: a random value per browser session in an HttpOnly,
# SameSite=Strict cookie, written into every page (the body's hx-headers),
# sent back by htmx in CSRF_HEADER; an action whose header does not match
# the cookie is refused. A bearer header needs none (no page can add one).
CSRF_COOKIE = "pgdq_csrf"
CSRF_HEADER = "x-csrf-token"
_CSRF_SHAPE = re.compile(r"[A-Za-z0-9_-]{43}")
CSRF_FREE = frozenset({"/login", "/logout"})  # no session to act for (sign in), or only ends one: _guard's alone


async def check_csrf(request: Request) -> None:
    """Refuse (403) a dashboard action without the page's CSRF token: its header must equal the cookie."""
    if request.method in SAFE_METHODS or request.url.path in CSRF_FREE:
        return
    if request.headers.get("authorization", "").lower().startswith("bearer "):
        return
    cookie, sent = request.cookies.get(CSRF_COOKIE, ""), request.headers.get(CSRF_HEADER, "")
    if not _CSRF_SHAPE.fullmatch(cookie) or not hmac.compare_digest(cookie.encode(), sent.encode()):
        raise ApiError(403, "the dashboard's CSRF token is missing or wrong: reload the page and try again")


router = APIRouter(include_in_schema=False, route_class=SegmentRoute, dependencies=[Depends(check_csrf)])


def _csrf(request: Request) -> str:
    """This request's CSRF token: the browser's cookie, or a new one (that _page sets)."""
    token: str | None = getattr(request.state, "csrf", None)
    if token is None:
        sent = request.cookies.get(CSRF_COOKIE, "")
        token = sent if _CSRF_SHAPE.fullmatch(sent) else secrets.token_urlsafe(32)
        request.state.csrf = token
    return token


def _page_context(request: Request) -> dict[str, Any]:
    """What base.html needs on every page: who is signed in, whether /docs is served, the CSRF token."""
    settings = request.app.state.settings
    signed_in = settings.tokens is not None and bool(request.cookies.get(TOKEN_COOKIE))
    return {
        "signed_in": signed_in and presented_token(request) is not None,
        "docs": settings.docs,
        "csrf": _csrf(request),
    }


templates = Jinja2Templates(directory=HERE / "templates", context_processors=[_page_context])


def _page(request: Request, name: str, context: dict[str, Any], status_code: int = 200) -> Response:
    """A whole page: template name rendered, the CSRF cookie set when the browser had none."""
    answer = templates.TemplateResponse(request, name, context, status_code=status_code)
    token = _csrf(request)
    if request.cookies.get(CSRF_COOKIE) != token:
        secure = request.url.scheme == "https"
        answer.set_cookie(CSRF_COOKIE, token, httponly=True, samesite="strict", secure=secure)
    return answer


def _needs_login(request: Request) -> bool:
    """True if the service has tokens and the request carries no valid one."""
    return request.app.state.settings.tokens is not None and presented_token(request) is None


# --- how numbers and times read --------------------------------------------------------


def _age(since: datetime | None, now: datetime) -> str:
    """A short human span between since and now ("3m 20s"), "" for None."""
    if since is None:
        return ""
    s = int(abs((now - since).total_seconds()))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def _relative(at: datetime | None, now: datetime) -> str:
    """at from now for people: "in 5m 2s", "3m ago", "now"; "never" / "long ago" for the infinities; "–" for None."""
    if at is None:
        return "–"
    if at in (INFINITY, MINUS_INFINITY):
        return "never" if at == INFINITY else "long ago"
    if abs((at - now).total_seconds()) < 1:
        return "now"
    return f"in {_age(at, now)}" if at > now else f"{_age(at, now)} ago"


def _absolute(at: datetime | None) -> str:
    """at in UTC to the second ("2025-01-31 09:30:00 UTC"); "" for None."""
    if at is None:
        return ""
    if at in (INFINITY, MINUS_INFINITY):
        return "infinity" if at == INFINITY else "-infinity"
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _next_time(at: datetime | None, now: datetime) -> str:
    """A schedule's next time for people: "ended", "never" (infinity), "long ago" (-infinity), or when and how soon."""
    if at is None:
        return "ended"
    if at in (INFINITY, MINUS_INFINITY):
        return _relative(at, now)
    return f"{_absolute(at)} ({_relative(at, now)})"


def _clock() -> dict[str, Any]:
    """The template helpers that need the time of this answer."""
    now = datetime.now(UTC)
    return {
        "now": now,
        "age": lambda t: _age(t, now),
        "relative": lambda t: _relative(t, now),
        "next_time": lambda t: _next_time(t, now),
    }


def _number(n: int | None) -> str:
    """n with thousands separated ("12,345"); "–" for None."""
    return "–" if n is None else f"{n:,}"


def _duration(span: timedelta | None) -> str:
    """A percentile for people: "850 ms", "4.2 s", "3.5 min", "2.0 h"; "–" for None (none delivered)."""
    if span is None:
        return "–"
    s = span.total_seconds()
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 60:
        return f"{s:.1f} s"
    return f"{s / 60:.1f} min" if s < 3600 else f"{s / 3600:.1f} h"


def _period(span: timedelta | None) -> str:
    """A retention period for people, in its largest whole unit: "7 days", "12 hours", "90 minutes"."""
    if span is None:
        return "–"
    s = int(span.total_seconds())
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1)):
        if s % size == 0 and s >= size:
            return f"{s // size} {unit}{'' if s == size else 's'}"
    return f"{span.total_seconds():g} seconds"


def _pretty(value: Any) -> str:
    """A JSON value indented for a <pre>; one Python could not read (UnreadableJson) as stored."""
    if isinstance(value, UnreadableJson):
        return str(value)
    return json.dumps(value, indent=2, ensure_ascii=False)


def _last_line(text: str | None) -> str:
    """An error's last non-blank line (a traceback's exception), cut at ERROR_LINE characters."""
    lines = [line for line in (text or "").splitlines() if line.strip()]
    last = lines[-1].strip() if lines else ""
    return last if len(last) <= ERROR_LINE else last[: ERROR_LINE - 1] + "…"


def _segment(name: str) -> str:
    """name as one segment of a URL path ("/" encoded as %2F, see SegmentRoute)."""
    return quote(name, safe="")


templates.env.filters.update(
    segment=_segment,
    num=_number,
    duration=_duration,
    period=_period,
    pretty=_pretty,
    absolute=_absolute,
    last_line=_last_line,
)


# --- history: per minute and per hour ---------------------------------------------------


def _grid(now: datetime, step: timedelta, count: int) -> list[datetime]:
    """The starts of the count buckets of step up to the one holding now, oldest first (as date_bin from the epoch)."""
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    last = epoch + (now - epoch) // step * step
    return [last - step * (count - 1 - i) for i in range(count)]


def _counts(buckets: Iterable[HistoryBucket]) -> dict[datetime, tuple[int, int, int]]:
    """Acked, dead and cancelled by bucket start, summed over buckets (of several queues)."""
    summed: dict[datetime, tuple[int, int, int]] = {}
    for b in buckets:
        a, d, c = summed.get(b.bucket_at, (0, 0, 0))
        summed[b.bucket_at] = (a + b.acked, d + b.dead, c + b.cancelled)
    return summed


def _chart(kind: str, labels: list[str], datasets: list[tuple[str, str, list[Any]]], **options: Any) -> str:
    """A canvas's data-chart, which dashboard.js draws: kind (bar, line), datasets as (label, color, values),
    options (stacked, unit)."""
    drawn = [{"label": name, "color": color, "data": values} for name, color, values in datasets]
    return json.dumps({"type": kind, "labels": labels, "datasets": drawn, **options})


def _counts_chart(buckets: Iterable[HistoryBucket], grid: list[datetime], label: str) -> str:
    """Stacked bars: acked, dead-lettered and cancelled per bucket of grid (labelled by strftime label)."""
    counts = _counts(buckets)
    series = [[counts.get(at, (0, 0, 0))[i] for at in grid] for i in range(3)]
    names = [("acked", "#4f7fd9"), ("dead-lettered", "#b3261e"), ("cancelled", "#9aa3b5")]
    labels = [at.strftime(label) for at in grid]
    return _chart("bar", labels, [(n, c, s) for (n, c), s in zip(names, series, strict=True)], stacked=True)


def _timing_chart(buckets: Iterable[HistoryBucket], grid: list[datetime], label: str) -> str:
    """Lines: lateness and run time p50 and p99 per bucket of grid, in seconds (null: none delivered)."""
    found = {b.bucket_at: b for b in buckets}
    fields = [
        ("lateness p50", "#4f7fd9", "lateness_p50"),
        ("lateness p99", "#1d3f8f", "lateness_p99"),
        ("run time p50", "#3a9a5b", "run_p50"),
        ("run time p99", "#1f5c33", "run_p99"),
    ]

    def seconds(at: datetime, attribute: str) -> float | None:
        """The percentile attribute of the bucket at, in seconds; None without one."""
        span = getattr(found[at], attribute) if at in found else None
        return None if span is None else span.total_seconds()

    datasets = [(n, c, [seconds(at, a) for at in grid]) for n, c, a in fields]
    return _chart("line", [at.strftime(label) for at in grid], datasets, unit="seconds")


def _totals(buckets: Iterable[HistoryBucket]) -> tuple[int, int, int]:
    """Acked, dead and cancelled over all buckets."""
    counts = list(_counts(buckets).values())
    return (sum(c[0] for c in counts), sum(c[1] for c in counts), sum(c[2] for c in counts))


async def _retained_minutes(request: Request, since: datetime, names: list[str]) -> dict[str, list[HistoryBucket]]:
    """Each queue of names with retention on and its minute buckets from since on (their counts; no
    percentiles), in one statement (the one /metrics reads); none where this role or database
    cannot tell (a router, SQL before 1.2)."""
    settings = request.app.state.settings
    params = {"since": since, "span": 2 * HOUR, "names": names}
    async with request.app.state.pool.connection() as conn:
        try:
            rows = await history_rows(conn, settings.schema, params)
        except _UNAVAILABLE:
            return {}
    found: dict[str, list[HistoryBucket]] = {}
    for _, queue, bucket_at, acked, dead, cancelled, measure, *_bins in rows:
        if queue is not None:
            found.setdefault(queue, [])
            if bucket_at is not None and measure is None:  # a minute's counts (the others: its histogram bins)
                found[queue].append(HistoryBucket(bucket_at, acked, dead, cancelled, None, None, None, None))
    return found


_RETENTION = "SELECT retain, history_keep FROM {} WHERE queue = %s"
_SETTLED = "SELECT queue::text, paused_at IS NOT NULL FROM {} WHERE retain IS NOT NULL OR paused_at IS NOT NULL"


def _queues_table(request: Request) -> sql.Identifier:
    """dq_queues in the service's schema (no function lists what it keeps)."""
    schema = request.app.state.settings.schema
    return sql.Identifier(schema, "dq_queues") if schema else sql.Identifier("dq_queues")


async def _settled(request: Request) -> dict[str, bool]:
    """The queues that keep history or are paused, and whether paused (dq_queues: listed in the
    overview even without messages); none where they cannot be read (a router, a role that may not)."""
    async with request.app.state.pool.connection() as conn:
        try:
            cursor = await conn.execute(sql.SQL(_SETTLED).format(_queues_table(request)))
            return dict(await cursor.fetchall())
        except _UNAVAILABLE:
            return {}


class Retention(NamedTuple):
    """A queue's history settings (dq_queues): keep is its retention (None: off), kept the
    period its records age out by (None: it never kept any); known False where they cannot be
    read (both None then)."""

    keep: timedelta | None
    kept: timedelta | None
    known: bool = True


async def _retention(request: Request, queue: str) -> Retention:
    """queue's retention and the period its records age out by (dq_queues: no function reads them)."""
    async with request.app.state.pool.connection() as conn:
        try:
            cursor = await conn.execute(sql.SQL(_RETENTION).format(_queues_table(request)), (queue,))
            row = await cursor.fetchone()
        except _UNAVAILABLE:
            return Retention(None, None, known=False)
    return Retention(*row) if row is not None else Retention(None, None)


async def _history_context(request: Request, q: AsyncQueue, now: datetime) -> dict[str, Any]:
    """A queue's history section: per minute over the last hour, per hour over the last day, its latest records."""
    retention = await _retention(request, q.name)
    if retention.kept is None:  # never kept any, or cannot tell (a router, a role that may not read dq_queues)
        return {"retention": retention}
    minutes, hours = _grid(now, MINUTE, 60), _grid(now, HOUR, 24)
    per_minute = await q.history_stats(minutes[0], MINUTE)
    per_hour = await q.history_stats(hours[0], HOUR)
    return {
        "retention": retention,
        "last_hour": _totals(per_minute),
        "last_day": _totals(per_hour),
        "minute_chart": _counts_chart(per_minute, minutes, "%H:%M"),
        "hour_chart": _counts_chart(per_hour, hours, "%H:00"),
        "timing_chart": _timing_chart(per_minute, minutes, "%H:%M"),
        "hourly": list(reversed(per_hour)),
        "recent": await q.history(None, RECENT),
    }


# --- the overview --------------------------------------------------------------------


class QueueRow(NamedTuple):
    """One queue of the overview: its counts, dead letters, schedules, the dead letters that failed
    in the last 24 hours, and the last hour's acked, dead and cancelled (None: it keeps no history)."""

    name: str
    stats: QueueStats
    dead: int
    schedules: int
    failed_day: int
    last_hour: tuple[int, int, int] | None


class OverviewPage(NamedTuple):
    """Which queues the overview shows: those whose name contains search, OVERVIEW_PAGE of them
    from start (both from the address: ?search=&start=)."""

    search: str
    start: int

    def link(self, start: int) -> str:
        """The address of the overview from start on, with this search."""
        shown = {k: v for k, v in (("search", self.search), ("start", start)) if v}
        return f"/?{urlencode(shown)}" if shown else "/"


async def _overview_context(request: Request, shown: OverviewPage) -> dict[str, Any]:
    """Every queue this token may read (with messages, dead letters, schedules or history; paused), the totals,
    and a page of them (OverviewPage) with the last hour's throughput of those that keep history and
    every shown queue's failures by the dead letters' times: seven statements, the history of the
    page's queues only."""
    client = _client(request)
    stats = {s.queue: s for s in await client.stats()}
    dead = {d.queue: d.dead for d in await client.dead_stats()}
    schedules = Counter(s.queue for s in await client.schedules())
    settled = await _settled(request)
    for name, paused in settled.items():
        stats.setdefault(name, QueueStats(name, 0, 0, 0, None, None, paused))
    token = presented_token(request)
    names = sorted(n for n in stats.keys() | dead.keys() | schedules.keys() if _may_read(token, n))
    found = [n for n in names if shown.search.casefold() in n.casefold()]
    page = found[shown.start : shown.start + OVERVIEW_PAGE]
    now = datetime.now(UTC)
    grid = _grid(now, MINUTE, 60)
    history = await _retained_minutes(request, grid[0], page)
    failures = await _failures_context(request, names, now)
    empty = QueueStats("", 0, 0, 0, None, None)
    rows = [
        QueueRow(
            n,
            stats.get(n, empty),
            dead.get(n, 0),
            schedules[n],
            failures["failed_by"][n],
            _totals(history[n]) if n in history else None,
        )
        for n in page
    ]
    kept = [b for r in rows if r.last_hour is not None for b in history[r.name]]
    every = [stats.get(n, empty) for n in names]
    totals = {
        "queues": len(names),
        "ready": sum(s.ready for s in every),
        "delayed": sum(s.delayed for s in every),
        "leased": sum(s.leased for s in every),
        "dead": sum(dead.get(n, 0) for n in names),
        "schedules": sum(schedules[n] for n in names),
        "paused": sum(1 for s in every if s.paused),
    }
    return {
        "rows": rows,
        "totals": totals,
        "keeping": sum(1 for r in rows if r.last_hour is not None),
        "last_hour": _totals(kept),
        "throughput": _counts_chart(kept, grid, "%H:%M"),
        "found": len(found),
        "shown": shown,
        "paged": len(found) > len(page),
        "previous": shown.link(max(shown.start - OVERVIEW_PAGE, 0)) if shown.start > 0 else None,
        "next": shown.link(shown.start + OVERVIEW_PAGE) if shown.start + OVERVIEW_PAGE < len(found) else None,
        "refresh": "/dashboard/queues" + shown.link(shown.start).removeprefix("/"),
        **{k: v for k, v in failures.items() if k != "failed_by"},
        **_clock(),
    }


def _may_read(token: Token | None, queue: str) -> bool:
    """True if token (None: the service has no tokens) may read queue."""
    return token is None or token.allows("consume", queue)


def _overview_page(
    search: str = Query("", max_length=100, description="only queues whose name contains it (any case)"),
    start: int = Query(0, ge=0, le=10**9, description="the first queue shown, counted from 0 in name order"),
) -> OverviewPage:
    """The overview's page from its address."""
    return OverviewPage(search, start)


@router.get("/", response_class=HTMLResponse)
async def overview(request: Request, shown: Annotated[OverviewPage, Depends(_overview_page)]) -> Response:
    """Totals, failures and throughput, a page of the queues; refreshed live."""
    if _needs_login(request):
        return RedirectResponse("/login", status_code=303)
    return _page(request, "overview.html", await _overview_context(request, shown))


@router.get("/dashboard/queues", response_class=HTMLResponse)
async def overview_fragment(request: Request, shown: Annotated[OverviewPage, Depends(_overview_page)]) -> Response:
    """The overview's live fragment: totals, charts, a page of the queues this token may read."""
    if _needs_login(request):
        raise ApiError(401, "a valid bearer token is required")
    return templates.TemplateResponse(request, "_overview.html", await _overview_context(request, shown))


# --- a queue ---------------------------------------------------------------------------


async def _summary_context(request: Request, queue: str, notice: str = "") -> dict[str, Any]:
    """A queue's live fragment: counts and pause state, what runs and what is retried now, history,
    failures over time, the next 24 hours, channels, schedules, dead letters (fourteen statements at
    most, none per message); notice: what the action that answers with it did."""
    q = _queue(request, queue)
    clock = _clock()
    hours = await q.due_hours(24)
    dead = await _client(request).dead_stats(queue)
    return {
        "queue": queue,
        "notice": notice,
        "stats": await q.stats(),
        "due_chart": _chart(
            "bar",
            [h.hour_start.strftime("%H:%M") for h in hours],
            [("messages falling due", "#4f7fd9", [h.due for h in hours])],
        ),
        "working": WORKING,
        "running": await _unless_missing(q.deliveries("running", WORKING)),
        "retrying": await _unless_missing(q.deliveries("retrying", WORKING)),
        **await _failures_context(request, [queue], clock["now"]),
        "channels": await q.channels(),
        "schedules": await q.schedules(),
        "dead_count": dead[0].dead if dead else 0,
        "dead_letters": await q.dead_letters(DEAD_SHOWN),
        **await _history_context(request, q, clock["now"]),
        **clock,
    }


async def _unless_missing(read: Awaitable[_T]) -> _T | None:
    """read's result; None where the database lacks the SQL it calls (1.3's: a PL/Proxy router, older SQL)."""
    try:
        return await read
    except SqlMissing:
        return None


async def _failures_context(request: Request, queues: list[str], now: datetime) -> dict[str, Any]:
    """Failures over time by the dead letters' own times (history kept or not): of queues (those this
    token may read), those kept that failed in each hour of the last 24 (a chart), in the last hour and
    the last 24 hours (in all, and by queue: failed_by); failure_chart None where the database cannot
    count them (SQL before 1.3, a router)."""
    hours = _grid(now, HOUR, 24)
    client = _client(request)
    one = queues[0] if len(queues) == 1 else None
    counts = await _unless_missing(client.dead_counts(hours[0], HOUR, one))
    readable = set(queues)
    per_hour: Counter[datetime] = Counter()
    failed_by: Counter[str] = Counter()
    for c in counts or []:
        if c.queue in readable:
            per_hour[c.bucket_at] += c.dead
            failed_by[c.queue] += c.dead
    chart = _chart(
        "bar", [at.strftime("%H:00") for at in hours], [("dead-lettered", "#b3261e", [per_hour[at] for at in hours])]
    )
    return {
        "failure_chart": None if counts is None else chart,
        "failed_hour": per_hour[hours[-1]],
        "failed_day": sum(per_hour.values()),
        "failed_by": failed_by,
    }


@router.get("/queues/{queue}", response_class=HTMLResponse)
async def queue_page(request: Request, queue: QueueName) -> Response:
    """One queue: counts, pause, history, the next 24 hours, channels, schedules, dead letters."""
    if _needs_login(request):
        return RedirectResponse("/login", status_code=303)
    _readable(request, queue)
    context = await _summary_context(request, queue)
    if not _exists(context):
        raise _no_such_queue()
    return _page(request, "queue.html", context)


def _no_such_queue() -> ApiError:
    """The 404 of a queue that does not exist, and of one the caller may not read (so as not to tell them apart)."""
    # the queue is not named: the answer for one the caller may not read must be the same, whatever it is called
    return ApiError(
        404, "No such queue: none of that name has messages, dead letters, schedules, channels or settings."
    )


def _readable(request: Request, queue: str) -> None:
    """Refuse a page of queue as _no_such_queue (401 as ever) unless the caller may read it."""
    try:
        authorize(request, "consume", queue)
    except ApiError as e:
        if e.status != 403:
            raise
        raise _no_such_queue() from None


def _exists(summary: dict[str, Any]) -> bool:
    """True if a queue's summary (_summary_context) shows it exists: messages, a setting
    (paused, history), channels, schedules or dead letters."""
    stats, retention = summary["stats"], summary["retention"]
    settings = stats.paused or retention.keep is not None or retention.kept is not None
    held = stats.ready or stats.delayed or stats.leased or summary["dead_letters"]
    return bool(held or settings or summary["channels"] or summary["schedules"])


@router.get("/dashboard/queues/{queue}", response_class=HTMLResponse)
async def queue_summary(request: Request, queue: QueueName) -> Response:
    """A queue's live fragment."""
    authorize(request, "consume", queue)
    return templates.TemplateResponse(request, "_queue.html", await _summary_context(request, queue))


async def _acted(request: Request, queue: str, notice: str) -> Response:
    """A queue's fragment after an action, with its notice (swapped out of band into the page's
    #notice, so the next refresh leaves it)."""
    context = await _summary_context(request, queue, notice)
    return templates.TemplateResponse(request, "_queue.html", context)


def _plural(n: int, one: str, many: str | None = None) -> str:
    """n and the noun for it: "1 dead letter", "3 dead letters"."""
    return f"{n:,} {one if n == 1 else many or one + 's'}"


@router.post("/dashboard/queues/{queue}/pause", response_class=HTMLResponse)
async def pause(request: Request, queue: QueueName) -> Response:
    """Pause the queue (consumers lease nothing until resumed); admin scope."""
    authorize(request, "admin", queue)
    done = await _queue(request, queue).pause()
    return await _acted(request, queue, f"Paused {queue}." if done else f"{queue} was paused already.")


@router.post("/dashboard/queues/{queue}/resume", response_class=HTMLResponse)
async def resume(request: Request, queue: QueueName) -> Response:
    """Resume a paused queue; admin scope."""
    authorize(request, "admin", queue)
    done = await _queue(request, queue).resume()
    return await _acted(request, queue, f"Resumed {queue}." if done else f"{queue} was not paused.")


@router.post("/dashboard/queues/{queue}/dead-letters/redrive", response_class=HTMLResponse)
async def redrive(request: Request, queue: QueueName, key: str | None = None) -> Response:
    """Offer the dead letter of key (every one without key) again, due now; admin scope."""
    authorize(request, "admin", queue)
    n = await _queue(request, queue).redrive(key)
    said = f"Redriven: {_plural(n, 'dead letter')} offered again, due now."
    if key is not None and n == 0:
        said = f"Not redriven: {key} is no dead letter, or has a live message again."
    return await _acted(request, queue, said)


@router.post("/dashboard/queues/{queue}/dead-letters/purge", response_class=HTMLResponse)
async def purge(
    request: Request, queue: QueueName, key: str | None = None, every: bool = Query(False, alias="all")
) -> Response:
    """Delete the dead letter of key, or every one with all=true (400 with neither); admin scope."""
    authorize(request, "admin", queue)
    if key is None and not every:
        raise ApiError(400, "purge needs key (one dead letter) or all=true (every one)")
    n = await _queue(request, queue).purge_dead_letters(key)
    return await _acted(request, queue, f"Purged: {_plural(n, 'dead letter')} deleted.")


@router.post("/dashboard/queues/{queue}/dead-letters/by-id/{id}/redrive", response_class=HTMLResponse)
async def redrive_id(request: Request, queue: QueueName, id: MessageId) -> Response:
    """Offer the dead letter of id (keyless ones have only an id) again, due now; admin scope."""
    authorize(request, "admin", queue)
    became = await _queue(request, queue).redrive_id(id)
    said = f"Redriven: dead letter {id} is message {became}, due now."
    return await _acted(
        request,
        queue,
        said if became is not None else f"Not redriven: no dead letter {id} here, or its key has a live message again.",
    )


@router.post("/dashboard/queues/{queue}/dead-letters/by-id/{id}/purge", response_class=HTMLResponse)
async def purge_id(request: Request, queue: QueueName, id: MessageId) -> Response:
    """Delete the dead letter of id (keyless ones have only an id); admin scope."""
    authorize(request, "admin", queue)
    n = await _queue(request, queue).purge_dead_letter_id(id)
    return await _acted(request, queue, f"Purged: dead letter {id} deleted." if n else f"No dead letter {id} here.")


@router.post("/dashboard/queues/{queue}/running/{id}/release", response_class=HTMLResponse)
async def release_running(request: Request, queue: QueueName, id: MessageId) -> Response:
    """End the running lease of message id now (due again, its holder's ack fails); admin scope."""
    authorize(request, "admin", queue)
    done = await _queue(request, queue).release(id)
    return await _acted(request, queue, _released(id, done))


@router.post("/dashboard/queues/{queue}/running/{id}/cancel", response_class=HTMLResponse)
async def cancel_running(request: Request, queue: QueueName, id: MessageId) -> Response:
    """Delete the message id, leased or not; admin scope."""
    authorize(request, "admin", queue)
    done = await _queue(request, queue).cancel_id(id)
    return await _acted(request, queue, f"Cancelled message {id}." if done else f"No live message {id} here.")


def _released(id: int, done: bool) -> str:
    """What releasing message id's lease did."""
    if done:
        return f"Released message {id}: due now, the next poll may lease it; its holder's ack will fail."
    return f"Message {id} is not leased now (acked, released, or its lease ended): nothing changed."


# --- a queue's messages, a page at a time ----------------------------------------------------

State = Literal["all", "due", "delayed", "leased"]


def _messages_link(queue: str, **params: Any) -> str:
    """The URL of a page of queue's messages, its defaults (state all, no prefix, PAGE_SIZE) left out."""
    defaults = {"state": "all", "prefix": "", "limit": PAGE_SIZE}
    shown = {k: v for k, v in params.items() if v is not None and v != defaults.get(k)}
    path = f"/queues/{_segment(queue)}/messages"
    return f"{path}?{urlencode(shown)}" if shown else path


def _after(queue: str, due_at: datetime, id: int) -> PeekedMessage:
    """The last message of the page before, as browse reads it (its due time and id only)."""
    return PeekedMessage(queue, None, None, None, due_at, due_at, 0, False, None, None, id)


class _EndlessDumper(DatetimeDumper):
    """timestamptz as psycopg writes it, but INFINITY and MINUS_INFINITY themselves (the objects the
    service reads 'infinity' and '-infinity' as, not times equal to them) as those words: a page after
    a message due at infinity starts after it, one after 0001-01-01 00:00 UTC after that time."""

    def dump(self, obj: datetime) -> Buffer | None:
        """obj's text: 'infinity', '-infinity', or as psycopg writes it."""
        if obj is INFINITY or obj is MINUS_INFINITY:
            return b"infinity" if obj is INFINITY else b"-infinity"
        return super().dump(obj)


def _after_due_text(at: datetime) -> str:
    """A due time in the Next link: the infinite ones (as read) as 'infinity' and '-infinity', any
    other in ISO 8601, so that 0001-01-01 00:00 UTC is not taken for -infinity (its page looped)."""
    return "infinity" if at is INFINITY else "-infinity" if at is MINUS_INFINITY else at.isoformat()


def _after_due(text: str) -> datetime:
    """The due time of the Next link's after_due (see _after_due_text); 400 for one without its zone."""
    endless = {"infinity": INFINITY, "-infinity": MINUS_INFINITY}.get(text)
    if endless is not None:
        return endless
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise ApiError(
            400, "after_due must be a time with its zone, or infinity, as the page's Next link gives"
        ) from None
    if at.utcoffset() is None:
        raise ApiError(400, "after_due must name its time zone (as the page's Next link does)")
    return at


async def _browse(
    request: Request, queue: str, state: str, prefix: str, after: PeekedMessage | None, count: int
) -> list[PeekedMessage]:
    """A page of queue's messages (dq_browse), after (the last of the page before) written as the
    database has it: the infinite times as themselves, on this statement only."""
    async with request.app.state.pool.connection() as conn:
        written = conn.adapters.get_dumper(datetime, PyFormat.TEXT)
        conn.adapters.register_dumper(datetime, _EndlessDumper)
        try:
            which = None if state == "all" else state
            return await _queue(request, queue).browse(
                which, key_prefix=prefix or None, after=after, max_count=count, conn=conn
            )
        finally:
            conn.adapters.register_dumper(datetime, written)


@router.get("/queues/{queue}/messages", response_class=HTMLResponse)
async def messages_page(
    request: Request,
    queue: QueueName,
    state: State = "all",
    prefix: str = Query("", max_length=200),
    after_due: str | None = Query(None, max_length=40),
    after_id: int | None = Query(None, ge=1, le=2**63 - 1),
    limit: int = Query(PAGE_SIZE, ge=1, le=MAX_PAGE),
) -> Response:
    """A page of the queue's messages in due order: of one state, with keys starting with prefix, after
    (after_due, after_id) (the last of the page before; both or neither, a time with its zone)."""
    if _needs_login(request):
        return RedirectResponse("/login", status_code=303)
    authorize(request, "consume", queue)
    if (after_due is None) != (after_id is None):
        raise ApiError(400, "after_due and after_id go together (the last message of the page before)")
    q = _queue(request, queue)
    # bad input is 400 whether the queue exists or not
    after = _after(queue, _after_due(after_due), after_id) if after_due is not None and after_id is not None else None
    stats = await q.stats()
    # a queue with no message may be a typo: 404 as its queue page (asked only then: one small summary)
    if not (stats.ready or stats.delayed or stats.leased) and not _exists(await _summary_context(request, queue)):
        raise _no_such_queue()
    found = await _browse(request, queue, state, prefix, after, limit + 1)
    page, more = found[:limit], len(found) > limit
    link = functools.partial(_messages_link, queue, state=state, prefix=prefix, limit=limit)
    context = {
        "queue": queue,
        "stats": stats,
        "messages": page,
        "state": state,
        "prefix": prefix,
        "limit": limit,
        "page_size": PAGE_SIZE,
        "paged": after is not None,
        "first": link(),
        "tab": lambda s: link(state=s),
        "clear": link(prefix=""),
        "next": link(after_due=_after_due_text(page[-1].due_at), after_id=page[-1].id) if more else None,
        **_clock(),
    }
    return _page(request, "messages.html", context)


# --- one message -------------------------------------------------------------------------


class Found(NamedTuple):
    """What a message id names in a queue: the live message (with its deliveries: attempts, last
    delivery, last error), the dead letter or its latest record (at most one of them), and the
    history of its key (of its id, for a keyless one)."""

    live: MessageInfo | None
    dead: DeadLetter | None
    record: HistoryRecord | None
    history: list[HistoryRecord]
    delivery: DeliveryInfo | None = None

    @property
    def key(self) -> str | None:
        """The message's key (None: keyless)."""
        held = self.live or self.dead or self.record
        return held.key if held is not None else None


async def _records(q: AsyncQueue, key: str | None, id: int) -> list[HistoryRecord]:
    """The records of key, newest first; without a key, those of id among the queue's newest SCAN."""
    if key is not None:
        return await q.history(key)
    return [r for r in await q.history(None, SCAN) if r.id == id]


async def _find(q: AsyncQueue, id: int, key: str | None) -> Found | None:
    """Message id of q: live (dq_get_id), else among the oldest SCAN dead letters, else in its
    history (key's records when key is given and holds it, else the newest SCAN records); None if none has it."""
    live = await q.get_id(id)
    if live is not None:  # a live keyless message has no record yet
        history = await q.history(live.key) if live.key is not None else []
        return Found(live, None, None, history, await _unless_missing(q.delivery_of(id)))
    dead = next((d for d in await q.dead_letters(SCAN) if d.id == id), None)
    if dead is not None:
        return Found(None, dead, None, await _records(q, dead.key, id))
    records = await _records(q, key, id)
    record = next((r for r in records if r.id == id), None)
    if record is None and key is not None:
        records = await _records(q, None, id)
        record = next((r for r in records if r.id == id), None)
    if record is None:
        return None
    return Found(None, None, record, await _records(q, record.key, id) if record.key != key else records)


def _status(found: Found, now: datetime) -> str:
    """Where the message is: due, delayed, leased, dead (a dead letter), or its record's outcome."""
    if found.live is not None:
        return "leased" if found.live.leased else "delayed" if found.live.due_at > now else "due"
    return "dead" if found.dead is not None else found.record.outcome if found.record is not None else "gone"


async def _message_context(request: Request, queue: str, id: int, key: str | None, notice: str = "") -> dict[str, Any]:
    """The message page's fragment for id (404 when the queue has no such message or record of it)."""
    found = await _find(_queue(request, queue), id, key)
    if found is None:
        raise ApiError(404, f"no message {id} here: not live, not among the oldest {SCAN} dead letters, no record")
    clock = _clock()
    return {"queue": queue, "id": id, "m": found, "status": _status(found, clock["now"]), "notice": notice, **clock}


@router.get("/queues/{queue}/messages/{id}", response_class=HTMLResponse)
async def message_page(
    request: Request, queue: QueueName, id: MessageId, key: str | None = Query(None, min_length=1, max_length=200)
) -> Response:
    """One message: its payload, headers, state and history, with what may be done to it
    (key: where to look for the records of one that left the queue)."""
    if _needs_login(request):
        return RedirectResponse("/login", status_code=303)
    authorize(request, "consume", queue)
    try:
        context = await _message_context(request, queue, id, key)
    except ApiError as e:
        if e.status != 404:
            raise
        return _page(request, "message.html", {"queue": queue, "id": id, "missing": e.message}, status_code=404)
    return _page(request, "message.html", context)


async def _after_action(request: Request, queue: str, id: int, notice: str, key: str | None = None) -> Response:
    """The message's fragment after an action, saying what it did."""
    context = await _message_context(request, queue, id, key, notice)
    return templates.TemplateResponse(request, "_message.html", context)


@router.post("/dashboard/queues/{queue}/messages/{id}/run-now", response_class=HTMLResponse)
async def run_now(request: Request, queue: QueueName, id: MessageId) -> Response:
    """Make the delayed message id due now (a due or leased one stays as it is); admin scope."""
    authorize(request, "admin", queue)
    done = await _queue(request, queue).run_now(id)
    said = "Due now: the next poll may lease it." if done else "Not delayed (due or leased): nothing changed."
    return await _after_action(request, queue, id, said)


@router.post("/dashboard/queues/{queue}/messages/{id}/cancel", response_class=HTMLResponse)
async def cancel(request: Request, queue: QueueName, id: MessageId) -> Response:
    """Delete the message id, leased or not (404 when there is none); admin scope."""
    authorize(request, "admin", queue)
    q = _queue(request, queue)
    before = await q.get_id(id)
    if before is None or not await q.cancel_id(id):
        raise ApiError(404, f"no live message {id} here to cancel")
    try:
        return await _after_action(request, queue, id, "Cancelled.", before.key)
    except ApiError:  # no record kept: the queue keeps no history
        return templates.TemplateResponse(request, "_message.html", {"queue": queue, "id": id, "cancelled": True})


@router.post("/dashboard/queues/{queue}/messages/{id}/release", response_class=HTMLResponse)
async def release(request: Request, queue: QueueName, id: MessageId) -> Response:
    """End the running lease of message id now, without its token (due now, its holder's ack
    fails; a lease that is not running is left as it is); admin scope."""
    authorize(request, "admin", queue)
    done = await _queue(request, queue).release(id)
    return await _after_action(request, queue, id, _released(id, done))


@router.post("/dashboard/queues/{queue}/messages/{id}/redrive", response_class=HTMLResponse)
async def redrive_message(request: Request, queue: QueueName, id: MessageId) -> Response:
    """Offer the dead letter id again, due now, and show the message it became; admin scope."""
    authorize(request, "admin", queue)
    became = await _queue(request, queue).redrive_id(id)
    if became is None:
        still = await _find(_queue(request, queue), id, None)
        if still is None or still.dead is None:
            raise ApiError(404, f"no dead letter {id} here to redrive")
        raise ApiError(409, f"not redriven: {still.key} has a live message again; the dead letter stays")
    answer = await _after_action(request, queue, became, f"Redriven: dead letter {id} is message {became}, due now.")
    answer.headers["HX-Push-Url"] = f"/queues/{_segment(queue)}/messages/{became}"
    return answer


# --- signing in and out ----------------------------------------------------------------------


@router.get("/login", response_class=HTMLResponse)
async def login_form(request: Request) -> Response:
    """The form asking for a token (only when the service has tokens); no CSRF cookie: nothing to act on yet."""
    return templates.TemplateResponse(request, "login.html", {"error": None})


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request) -> Response:
    """Keep a session of a valid token (not the token) in an HttpOnly, SameSite=Strict cookie; go to the overview."""
    raw = await request.body()
    if len(raw) > LOGIN_BODY_LIMIT:
        raise ApiError(413, f"the login form is over {LOGIN_BODY_LIMIT} bytes")
    secret = parse_qs(raw.decode("utf-8", "replace")).get("token", [""])[0].strip()
    tokens = request.app.state.settings.tokens
    if tokens is None:
        return RedirectResponse("/", status_code=303)
    token = find_token(tokens, secret) if secret else None
    if token is None:
        context = {"error": "not a valid token (unknown or expired)"}
        return templates.TemplateResponse(request, "login.html", context, status_code=401)
    answer = RedirectResponse("/", status_code=303)
    secure = request.url.scheme == "https"
    age = _cookie_age(token)
    session = new_session(request.app.state.settings.session_key, token, datetime.now(UTC) + timedelta(seconds=age))
    answer.set_cookie(TOKEN_COOKIE, session, httponly=True, samesite="strict", secure=secure, max_age=age)
    # a new session, a new CSRF token
    answer.set_cookie(CSRF_COOKIE, secrets.token_urlsafe(32), httponly=True, samesite="strict", secure=secure)
    return answer


def _cookie_age(token: Token) -> int:
    """Seconds the login cookie lasts: COOKIE_HOURS, or until the token expires if sooner."""
    age = COOKIE_HOURS * 3600
    if token.expires is not None:
        age = min(age, int((token.expires - datetime.now(UTC)).total_seconds()))
    return max(age, 1)


@router.post("/logout")
async def logout(request: Request) -> Response:
    """Clear the login and CSRF cookies and go to the login form (or the overview without tokens)."""
    answer = RedirectResponse("/login" if request.app.state.settings.tokens is not None else "/", status_code=303)
    for cookie in (TOKEN_COOKIE, CSRF_COOKIE):
        answer.delete_cookie(cookie, httponly=True, samesite="strict", secure=request.url.scheme == "https")
    return answer
