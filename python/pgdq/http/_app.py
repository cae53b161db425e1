"""The ASGI application: settings, the connection pool and the wake-up
listener (made at startup), errors as JSON, the middleware in order. Every router is
imported here and imports nothing back (what they share is in _access)."""

from __future__ import annotations

import logging
import select
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import psycopg
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.staticfiles import StaticFiles
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from .._reconnect import describe
from .._version import VERSION
from ..errors import InvalidArgument, PgdqError
from ._access import ApiError
from ._auth import Token, session_key
from ._classic import router as classic_router
from ._dashboard import HERE
from ._dashboard import router as dashboard_router
from ._delay_queue import router as delay_queue_router
from ._docs import router as docs_router
from ._error_pages import failure
from ._group_commit import GroupCommits
from ._guard import BrowserGuard
from ._metrics import HistoryMetrics, RequestMetrics
from ._metrics import router as metrics_router
from ._middleware import BodyLimit, CancelOnDisconnect, HeadLimit, JsonOnFailure
from ._trace_context import TraceContext
from ._v1 import EndlessTimestamptzLoader, router
from ._v1_manage import router as manage_router
from ._wakeups import Wakeups

log = logging.getLogger("pgdq.http")


@dataclass(frozen=True)
class Settings:
    """How the service runs. tokens None: no authentication (loopback only, `pgdq serve` checks)."""

    dsn: str
    schema: str | None = None
    tokens: list[Token] | None = None
    max_body: int = 1 << 20  # bytes of a request body
    pool_size: int = 10
    group_commit: bool = True  # concurrent offers, polls and acks of a queue go as one statement (_group_commit)
    group_commit_lag: float = 0.005  # seconds they wait for a statement in front of them at most
    group_commit_lock_timeout: float = 0.02  # seconds a batch waits for a lock, then runs request by request
    statement_timeout: float = 30.0  # seconds a statement may run (0: no limit); a long poll waits outside SQL
    allowed_hosts: tuple[str, ...] = ()  # Host names besides the served address (name or name:port), see _guard
    docs: bool = False  # Swagger UI at /docs (loaded from a CDN); /openapi.json is always served
    # what the dashboard's sessions are signed with (_auth.session_key): random, or PGDQ_SESSION_KEY's
    session_key: bytes = field(default_factory=lambda: session_key(None), repr=False)


def _validation_message(error: RequestValidationError, content_type: str | None = None) -> str:
    """The first validation problems in one line: where, and what; a body
    that is not JSON says why and where, one not sent as JSON which
    content-type to send."""
    body = getattr(error, "body", None)
    media = (content_type or "").split(";")[0].strip().lower()
    if body and isinstance(body, bytes) and media != "application/json" and not media.endswith("+json"):
        sent = f"content-type: {media}" if media else "no content-type"
        return f"the body must be JSON, sent with `content-type: application/json` (this request had {sent})"
    parts = []
    for e in error.errors()[:5]:
        if e.get("type") == "json_invalid":
            return _json_error(str(body or ""), e)
        where = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {e.get('msg', 'invalid')}")
    return "; ".join(parts)


def _json_error(body: str, error: Any) -> str:
    """A body that is not valid JSON: the decoder's reason and where (line and column, from 1)."""
    loc = error.get("loc", ())
    at = loc[1] if len(loc) > 1 and isinstance(loc[1], int) else len(body)
    line = body.count("\n", 0, at) + 1
    column = at - (body.rfind("\n", 0, at) + 1) + 1
    reason = (error.get("ctx") or {}).get("error", "JSON decode error")
    return f"the body is not valid JSON: {reason} at line {line} column {column}"


def _install_error_handlers(app: FastAPI) -> None:
    """Every failure as {"error": ...} (a dashboard page's as an HTML page, _error_pages): 400 bad
    input, 503 database down, never a bare 500."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError) -> Response:
        return failure(request, e.status, e.message, headers=e.headers)

    @app.exception_handler(HTTPException)
    async def framework_error(request: Request, e: HTTPException) -> Response:
        # the framework's own answers: no such route (404), a wrong method (405), an unreadable body (400)
        return failure(request, e.status_code, str(e.detail), headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, e: RequestValidationError) -> Response:
        return failure(request, 400, _validation_message(e, request.headers.get("content-type")))

    @app.exception_handler(InvalidArgument)
    async def invalid_argument(request: Request, e: InvalidArgument) -> Response:
        return failure(request, 400, str(e), e.sqlstate)

    @app.exception_handler(psycopg.DataError)
    async def invalid_data(request: Request, e: psycopg.DataError) -> Response:
        # SQLSTATE class 22 from PostgreSQL itself, e.g. a NUL character in a text or a JSON string
        return failure(request, 400, e.diag.message_primary or str(e), e.sqlstate)

    @app.exception_handler(ClientDisconnect)
    async def client_gone(request: Request, e: ClientDisconnect) -> Response:
        # the body stopped: the client left, or BodyLimit answered 413 already (this answer goes nowhere)
        return failure(request, 400, "the client disconnected")

    @app.exception_handler(psycopg.errors.QueryCanceled)
    async def statement_timeout(request: Request, e: psycopg.errors.QueryCanceled) -> Response:
        # a statement over the statement timeout, or cancelled on the server (a client that left gets no answer)
        limit = request.app.state.settings.statement_timeout
        log.warning("statement cancelled: %s", e)
        message = "the statement was cancelled"
        if limit:
            message = f"the statement ran over the statement timeout ({limit:g} s)"
        return failure(request, 503, message, e.sqlstate, headers={"Retry-After": "5"})

    @app.exception_handler(PoolTimeout)
    @app.exception_handler(psycopg.OperationalError)
    async def database_down(request: Request, e: Exception) -> Response:
        log.warning("database unavailable: %s", e)
        return failure(request, 503, "the database is unavailable; try again", headers={"Retry-After": "5"})

    @app.exception_handler(PgdqError)
    @app.exception_handler(psycopg.Error)
    async def database_error(request: Request, e: Exception) -> Response:
        log.error("database error: %s", e)
        return failure(request, 500, "the database refused the request", getattr(e, "sqlstate", None))

    # anything else: _middleware.JsonOnFailure answers JSON (and logs the traceback)


async def _configure_connection(statement_timeout: float, conn: psycopg.AsyncConnection[Any]) -> None:
    """A new pooled connection: its statement timeout set, infinite times read (see INFINITY)."""
    conn.adapters.register_loader("timestamptz", EndlessTimestamptzLoader)
    timeout = f"{round(statement_timeout * 1000)}ms"
    await conn.execute("SELECT pg_catalog.set_config('statement_timeout', %s, false)", (timeout,))


async def _check_connection(conn: psycopg.AsyncConnection[Any]) -> None:
    """Before a pooled connection serves a request: a round trip (raise if it is broken) only
    if its socket has something to read, as when the server closed it (a restart); else one poll()."""
    if hasattr(select, "poll"):
        idle = select.poll()
        idle.register(conn.pgconn.socket, select.POLLIN)
        if not idle.poll(0):
            return
    await AsyncConnectionPool.check_connection(conn)


class ServicePool(AsyncConnectionPool[psycopg.AsyncConnection[Any]]):
    """The service's pool: each connection checked before use (_check_connection); a broken
    one (the database restarted) makes the pool check every idle one at once and hands out
    the next at once, where psycopg_pool's own check would wait 1, 2, 4 ... s per broken
    connection, into PoolTimeout (503) with connections to spare once the database is back."""

    async def getconn(self, timeout: float | None = None) -> psycopg.AsyncConnection[Any]:
        """A pooled connection that passed _check_connection; PoolTimeout after timeout (the pool's)."""
        started = time.monotonic()
        deadline = started + (self.timeout if timeout is None else timeout)
        while True:
            conn = await super().getconn(max(deadline - time.monotonic(), 0.001))  # 0 would refuse a ready one
            try:
                await _check_connection(conn)
            except Exception as e:
                log.info("a pooled connection was broken (%s): checking the idle ones", describe(e))
                await self.putconn(conn)  # closed: the pool replaces it
                await self.check()  # the others the same restart broke, gone before anyone takes them
                if time.monotonic() >= deadline:
                    raise PoolTimeout(f"no working connection within {deadline - started:.2f} s") from e
                continue
            return conn


def create_app(settings: Settings) -> FastAPI:
    """The service for settings: a pool of connections to settings.dsn and one LISTEN connection."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool = ServicePool(
            settings.dsn,
            min_size=1,
            max_size=settings.pool_size,
            open=False,
            timeout=5,
            kwargs={"autocommit": True},
            configure=partial(_configure_connection, settings.statement_timeout),
        )
        await pool.open(wait=False)  # the database may come later: requests get 503 until then
        wakeups = Wakeups(settings.dsn, settings.schema)
        wakeups.start()
        app.state.pool, app.state.wakeups = pool, wakeups
        app.state.group_commits = GroupCommits(
            pool,
            settings.schema,
            batching=settings.group_commit,
            max_lag=settings.group_commit_lag,
            lock_timeout=settings.group_commit_lock_timeout,
        )
        try:
            yield
        finally:
            await wakeups.stop()
            await app.state.group_commits.close()
            await pool.close()

    app = FastAPI(
        title="pgdq",
        version=VERSION,
        lifespan=lifespan,
        description="A delayed-message queue inside PostgreSQL, over HTTP.",
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    _install_error_handlers(app)
    app.include_router(router)
    app.include_router(manage_router)
    app.include_router(classic_router)
    app.include_router(delay_queue_router)
    app.include_router(dashboard_router)
    if settings.docs:
        app.include_router(docs_router)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    app.include_router(metrics_router)
    app.state.request_metrics = RequestMetrics()
    app.state.history_metrics = HistoryMetrics()
    app.add_middleware(JsonOnFailure)  # innermost: what no handler answered is JSON 500 all the same
    app.add_middleware(TraceContext)  # a request's traceparent, carried on by its offers
    app.add_middleware(CancelOnDisconnect)
    app.add_middleware(app.state.request_metrics.middleware)
    app.add_middleware(BodyLimit, max_body=settings.max_body)
    app.add_middleware(HeadLimit)
    # outermost: without tokens every Host is checked (DNS rebinding); with them, only if hosts are named
    check_host = settings.tokens is None or bool(settings.allowed_hosts)
    app.add_middleware(BrowserGuard, check_host=check_host, allowed_hosts=settings.allowed_hosts)
    return app
