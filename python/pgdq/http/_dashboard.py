"""The dashboard at /: pages for people, rendered with Jinja2 and kept live
with htmx (fragments re-read every few seconds), the chart drawn by
Chart.js. Every number comes from one SQL function per fragment: dq_stats
and dq_dead_stats for the overview; dq_stats, dq_due_hours, dq_channels,
dq_schedules and dq_dead_list for a queue. A dead letter's buttons name it
by key, a keyless one's (1.2) by id. None of these routes is in the
OpenAPI document; they check tokens like the API (a bearer header, or the
cookie the login form sets, which POST /logout clears). What a page on
another site may not do to them (CSRF, DNS rebinding, frames) is _guard's."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.templating import Jinja2Templates

from ..model import QueueStats
from ._access import TOKEN_COOKIE, ApiError, authorize, presented_token
from ._auth import Token, find_token
from ._v1 import INFINITY, MINUS_INFINITY, QueueName, SegmentRoute, _client, _queue

HERE = Path(__file__).parent
DeadLetterId = Annotated[int, PathParam(ge=1, le=2**63 - 1, description="the dead letter's id (dq_dead_list)")]
router = APIRouter(include_in_schema=False, route_class=SegmentRoute)
LOGIN_BODY_LIMIT = 4096  # bytes of a login form
COOKIE_HOURS = 12  # how long the login cookie lasts (less if the token expires sooner)


def _page_context(request: Request) -> dict[str, Any]:
    """What base.html needs on every page: whether a cookie signs someone in, and whether /docs is served."""
    settings = request.app.state.settings
    signed_in = settings.tokens is not None and bool(request.cookies.get(TOKEN_COOKIE))
    return {"signed_in": signed_in and presented_token(request) is not None, "docs": settings.docs}


templates = Jinja2Templates(directory=HERE / "templates", context_processors=[_page_context])


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
    return {"now": now, "age": lambda t: _age(t, now), "next_time": lambda t: _next_time(t, now)}


def _next_time(at: datetime | None, now: datetime) -> str:
    """A schedule's next time for people: "ended", "never" (infinity), "long ago" (-infinity), or when and how soon."""
    if at is None:
        return "ended"
    if at in (INFINITY, MINUS_INFINITY):
        return "never" if at == INFINITY else "long ago"
    return f"{at.strftime('%Y-%m-%d %H:%M:%S %Z')} (in {_age(at, now)})"


def _segment(name: str) -> str:
    """name as one segment of a URL path ("/" encoded as %2F, see SegmentRoute)."""
    return quote(name, safe="")


templates.env.filters["segment"] = _segment


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
async def purge(
    request: Request, queue: QueueName, key: str | None = None, every: bool = Query(False, alias="all")
) -> Response:
    """Delete the dead letter of key, or every one with all=true (400 with neither); admin scope."""
    authorize(request, "admin", queue)
    if key is None and not every:
        raise ApiError(400, "purge needs key (one dead letter) or all=true (every one)")
    await _queue(request, queue).purge_dead_letters(key)
    return await queue_summary(request, queue)


@router.post("/dashboard/queues/{queue}/dead-letters/by-id/{id}/redrive", response_class=HTMLResponse)
async def redrive_id(request: Request, queue: QueueName, id: DeadLetterId) -> Response:
    """Offer the dead letter of id (keyless ones have only an id) again, due now; admin scope."""
    authorize(request, "admin", queue)
    await _queue(request, queue).redrive_id(id)
    return await queue_summary(request, queue)


@router.post("/dashboard/queues/{queue}/dead-letters/by-id/{id}/purge", response_class=HTMLResponse)
async def purge_id(request: Request, queue: QueueName, id: DeadLetterId) -> Response:
    """Delete the dead letter of id (keyless ones have only an id); admin scope."""
    authorize(request, "admin", queue)
    await _queue(request, queue).purge_dead_letter_id(id)
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
    token = find_token(tokens, secret) if secret else None
    if token is None:
        return templates.TemplateResponse(
            request, "login.html", {"error": "not a valid token (unknown or expired)"}, status_code=401
        )
    answer = RedirectResponse("/", status_code=303)
    secure = request.url.scheme == "https"
    answer.set_cookie(TOKEN_COOKIE, secret, httponly=True, samesite="strict", secure=secure, max_age=_cookie_age(token))
    return answer


def _cookie_age(token: Token) -> int:
    """Seconds the login cookie lasts: COOKIE_HOURS, or until the token expires if sooner."""
    age = COOKIE_HOURS * 3600
    if token.expires is not None:
        age = min(age, int((token.expires - datetime.now(UTC)).total_seconds()))
    return max(age, 1)


@router.post("/logout")
async def logout(request: Request) -> Response:
    """Clear the login cookie and go to the login form (or the overview without tokens)."""
    answer = RedirectResponse("/login" if request.app.state.settings.tokens is not None else "/", status_code=303)
    answer.delete_cookie(TOKEN_COOKIE, httponly=True, samesite="strict", secure=request.url.scheme == "https")
    return answer
