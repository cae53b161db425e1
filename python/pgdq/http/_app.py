"""The ASGI application: settings, the connection pool and the wake-up
listener (made at startup), errors as JSON, bearer tokens, the body limit."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from starlette.exceptions import HTTPException

from .._version import VERSION
from ..errors import InvalidArgument, PgdqError
from ._auth import Token, find_token
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


class ApiError(Exception):
    """An answer other than 200, with a message for the client."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers


# The classic protocol's one route: its failures keep that protocol's shape.
CLASSIC_PATH = "/command"


def _error(
    path: str, status: int, message: str, sqlstate: str | None = None, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """A failure answer: {"error", "sqlstate"?}, or on CLASSIC_PATH {"success": false, "error", ...}."""
    body: dict[str, Any] = {"error": message}
    if path == CLASSIC_PATH:
        body = {"success": False, "error": message, "id": None, "value": None}
    elif sqlstate is not None:
        body["sqlstate"] = sqlstate
    return JSONResponse(body, status_code=status, headers=headers)


def _validation_message(error: RequestValidationError) -> str:
    """The first validation problems in one line: where, and what."""
    parts = []
    for e in error.errors()[:5]:
        where = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {e.get('msg', 'invalid')}")
    return "; ".join(parts)


def _install_error_handlers(app: FastAPI) -> None:
    """Every failure as {"error": ...}: 400 bad input, 503 database down, never a bare 500."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError) -> JSONResponse:
        return _error(request.url.path, e.status, e.message, headers=e.headers)

    @app.exception_handler(HTTPException)
    async def framework_error(request: Request, e: HTTPException) -> JSONResponse:
        # the framework's own answers: no such route (404), a wrong method (405), an unreadable body (400)
        return _error(request.url.path, e.status_code, str(e.detail), headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, e: RequestValidationError) -> JSONResponse:
        return _error(request.url.path, 400, _validation_message(e))

    @app.exception_handler(InvalidArgument)
    async def invalid_argument(request: Request, e: InvalidArgument) -> JSONResponse:
        return _error(request.url.path, 400, str(e), e.sqlstate)

    @app.exception_handler(psycopg.DataError)
    async def invalid_data(request: Request, e: psycopg.DataError) -> JSONResponse:
        # SQLSTATE class 22 from PostgreSQL itself, e.g. a NUL character in a text or a JSON string
        return _error(request.url.path, 400, e.diag.message_primary or str(e), e.sqlstate)

    @app.exception_handler(PoolTimeout)
    @app.exception_handler(psycopg.OperationalError)
    async def database_down(request: Request, e: Exception) -> JSONResponse:
        log.warning("database unavailable: %s", e)
        return _error(request.url.path, 503, "the database is unavailable; try again", headers={"Retry-After": "5"})

    @app.exception_handler(PgdqError)
    @app.exception_handler(psycopg.Error)
    async def database_error(request: Request, e: Exception) -> JSONResponse:
        log.error("database error: %s", e)
        return _error(request.url.path, 500, "the database refused the request", getattr(e, "sqlstate", None))


# The dashboard's cookie: the token a person gave the login form (HttpOnly, SameSite=Strict).
TOKEN_COOKIE = "pgdq_token"


def presented_token(request: Request) -> Token | None:
    """The token of the request's bearer header (else the dashboard's cookie); None if none is valid."""
    tokens: list[Token] = request.app.state.settings.tokens or []
    scheme, _, secret = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        secret = request.cookies.get(TOKEN_COOKIE, "")
    return find_token(tokens, secret.strip()) if secret.strip() else None


def authorize(request: Request, scope: str, queue: str | None) -> None:
    """Raise 401 without a valid bearer token, 403 if it may not act in scope on queue."""
    if request.app.state.settings.tokens is None:
        return
    token = presented_token(request)
    if token is None:
        raise ApiError(401, "a valid bearer token is required", {"WWW-Authenticate": "Bearer"})
    if not token.allows(scope, queue):
        where = f"queue {queue!r}" if queue is not None else "every queue"
        raise ApiError(403, f"token {token.name!r} has no {scope} scope on {where}")


class BodyLimit:
    """ASGI middleware: a request body over max_body bytes gets 413, read no further."""

    def __init__(self, app: Callable[..., Awaitable[None]], max_body: int) -> None:
        self.app, self.max_body = app, max_body

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            await self._too_large(scope, receive, send)
            return
        seen = 0

        async def counted() -> Any:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_body:
                raise ApiError(413, f"the request body is over {self.max_body} bytes")
            return message

        await self.app(scope, counted, send)

    async def _too_large(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        response = _error(scope["path"], 413, f"the request body is over {self.max_body} bytes")
        await response(scope, receive, send)


def create_app(settings: Settings) -> FastAPI:
    """The service for settings: a pool of connections to settings.dsn and one LISTEN connection."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            settings.dsn,
            min_size=1,
            max_size=settings.pool_size,
            open=False,
            timeout=5,
            kwargs={"autocommit": True},
        )
        await pool.open(wait=False)  # the database may come later: requests get 503 until then
        wakeups = Wakeups(settings.dsn)
        wakeups.start()
        app.state.pool, app.state.wakeups = pool, wakeups
        try:
            yield
        finally:
            await wakeups.stop()
            await pool.close()

    # the routes import this module's helpers, so they are imported here
    from ._classic import router as classic_router  # noqa: PLC0415
    from ._dashboard import HERE  # noqa: PLC0415
    from ._dashboard import router as dashboard_router  # noqa: PLC0415
    from ._metrics import RequestMetrics  # noqa: PLC0415
    from ._metrics import router as metrics_router  # noqa: PLC0415
    from ._v1 import router  # noqa: PLC0415
    from ._v1_manage import router as manage_router  # noqa: PLC0415

    app = FastAPI(
        title="pgdq",
        version=VERSION,
        lifespan=lifespan,
        description="A delayed-message queue inside PostgreSQL, over HTTP.",
    )
    app.state.settings = settings
    _install_error_handlers(app)
    app.include_router(router)
    app.include_router(manage_router)
    app.include_router(classic_router)
    app.include_router(dashboard_router)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    app.include_router(metrics_router)
    app.state.request_metrics = RequestMetrics()
    app.add_middleware(app.state.request_metrics.middleware)
    app.add_middleware(BodyLimit, max_body=settings.max_body)
    return app
