"""The dashboard at /: pages for people, rendered with Jinja2 and kept live
with htmx (fragments re-read every few seconds), the chart drawn by
Chart.js. Every number comes from one SQL function per fragment: dq_stats
and dq_dead_stats for the overview; dq_stats, dq_due_hours, dq_channels,
dq_schedules and dq_dead_list for a queue. None of these routes is in the
OpenAPI document; they check tokens like the API (a bearer header, or the
cookie the login form sets)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from fastapi import APIRouter, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.templating import Jinja2Templates

from ..model import QueueStats
from ._access import TOKEN_COOKIE, ApiError, authorize, presented_token
from ._auth import find_token
from ._v1 import QueueName, _client, _queue

HERE = Path(__file__).parent
templates = Jinja2Templates(directory=HERE / "templates")
router = APIRouter(include_in_schema=False)
LOGIN_BODY_LIMIT = 4096  # bytes of a login form


def _needs_login(request: Request) -> bool:
    """True if the service has tokens and the request carries no valid one."""
    return request.app.state.settings.tokens is not None and presented_token(request) is None


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


@router.get("/", response_class=HTMLResponse)
async def overview(request: Request) -> Response:
    """Every queue, its counts refreshed live."""
    if _needs_login(request):
        return RedirectResponse("/login", status_code=303)
    return templates.TemplateResponse(request, "overview.html")


@router.get("/dashboard/queues", response_class=HTMLResponse)
async def overview_rows(request: Request) -> Response:
    """The overview's rows: dq_stats with dq_dead_stats, the queues this token may read."""
    if _needs_login(request):
        raise ApiError(401, "a valid bearer token is required")
    client = _client(request)
    stats = {s.queue: s for s in await client.stats()}
    dead = {d.queue: d.dead for d in await client.dead_stats()}
    token = presented_token(request)
    names = sorted(n for n in stats.keys() | dead.keys() if token is None or token.allows("consume", n))
    empty = QueueStats("", 0, 0, 0, None, None)
    rows = [(n, stats.get(n, empty), dead.get(n, 0)) for n in names]
    return templates.TemplateResponse(request, "_queues.html", {"rows": rows, **_clock()})


def _clock() -> dict[str, Any]:
    now = datetime.now(UTC)
    return {"now": now, "age": lambda t: _age(t, now)}


@router.get("/queues/{queue}", response_class=HTMLResponse)
async def queue_page(request: Request, queue: QueueName) -> Response:
    """One queue: counts, the next 24 hours, channels, schedules, dead letters."""
    if _needs_login(request):
        return RedirectResponse("/login", status_code=303)
    authorize(request, "consume", queue)
    return templates.TemplateResponse(request, "queue.html", {"queue": queue})


@router.get("/dashboard/queues/{queue}", response_class=HTMLResponse)
async def queue_summary(request: Request, queue: QueueName) -> Response:
    """A queue's live fragment (five statements, none per message)."""
    authorize(request, "consume", queue)
    q = _queue(request, queue)
    hours = await q.due_hours(24)
    context = {
        "queue": queue,
        "stats": await q.stats(),
        "hours": hours,
        "chart": json.dumps({"labels": [h.hour_start.strftime("%H:%M") for h in hours], "due": [h.due for h in hours]}),
        "channels": await q.channels(),
        "schedules": await q.schedules(),
        "dead_letters": await q.dead_letters(100),
        **_clock(),
    }
    return templates.TemplateResponse(request, "_queue.html", context)


@router.post("/dashboard/queues/{queue}/dead-letters/redrive", response_class=HTMLResponse)
async def redrive(request: Request, queue: QueueName, key: str | None = None) -> Response:
    """Offer the dead letter of key (every one without key) again, due now; admin scope."""
    authorize(request, "admin", queue)
    await _queue(request, queue).redrive(key)
    return await queue_summary(request, queue)


@router.post("/dashboard/queues/{queue}/dead-letters/purge", response_class=HTMLResponse)
async def purge(request: Request, queue: QueueName, key: str | None = None) -> Response:
    """Delete the dead letter of key (every one without key); admin scope."""
    authorize(request, "admin", queue)
    await _queue(request, queue).purge_dead_letters(key)
    return await queue_summary(request, queue)


@router.get("/login", response_class=HTMLResponse)
async def login_form(request: Request) -> Response:
    """The form asking for a token (only when the service has tokens)."""
    return templates.TemplateResponse(request, "login.html", {"error": None})


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request) -> Response:
    """Keep a valid token in an HttpOnly, SameSite=Strict cookie and go to the overview."""
    raw = await request.body()
    if len(raw) > LOGIN_BODY_LIMIT:
        raise ApiError(413, f"the login form is over {LOGIN_BODY_LIMIT} bytes")
    secret = parse_qs(raw.decode("utf-8", "replace")).get("token", [""])[0].strip()
    tokens = request.app.state.settings.tokens
    if tokens is None:
        return RedirectResponse("/", status_code=303)
    if not secret or find_token(tokens, secret) is None:
        return templates.TemplateResponse(request, "login.html", {"error": "not a valid token"}, status_code=401)
    answer = RedirectResponse("/", status_code=303)
    secure = request.url.scheme == "https"
    answer.set_cookie(TOKEN_COOKIE, secret, httponly=True, samesite="strict", secure=secure, max_age=12 * 3600)
    return answer
