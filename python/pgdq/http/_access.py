"""What every route shares: the failure answer (ApiError and its JSON shape)
and who may do what (bearer tokens, the dashboard's cookie)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from ._auth import Token, find_session, find_token


class ApiError(Exception):
    """An answer other than 200, with a message for the client."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers


# The classic protocol's one route and the delay-queue (ouqiang) dialect's
# routes: their failures keep their protocol's shape (PROTOCOL_FAILURES).
CLASSIC_PATH = "/command"
DELAY_QUEUE_PATHS = ("/push", "/pop", "/finish", "/delete")


def _classic_failure(message: str) -> dict[str, Any]:
    return {"success": False, "error": message, "id": None, "value": None}


def _delay_queue_failure(message: str) -> dict[str, Any]:
    return {"code": 1, "message": message, "data": None}


PROTOCOL_FAILURES: dict[str, Callable[[str], dict[str, Any]]] = {
    CLASSIC_PATH: _classic_failure,
    **dict.fromkeys(DELAY_QUEUE_PATHS, _delay_queue_failure),
}


def error_response(
    path: str, status: int, message: str, sqlstate: str | None = None, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """A failure answer: {"error", "sqlstate"?}, or on a path of PROTOCOL_FAILURES that protocol's shape."""
    body: dict[str, Any] = {"error": message}
    if path in PROTOCOL_FAILURES:
        body = PROTOCOL_FAILURES[path](message)
    elif sqlstate is not None:
        body["sqlstate"] = sqlstate
    return JSONResponse(body, status_code=status, headers=headers)


# The dashboard's cookie: a session the login form made of a valid token (_auth.new_session), never
# the token itself (HttpOnly, SameSite=Strict). It signs in the dashboard (and /metrics), not the API.
TOKEN_COOKIE = "pgdq_token"


def is_api(path: str) -> bool:
    """True for a path of the API (/v1, the classic protocol and its dialect), which only bearer tokens open."""
    return path.startswith("/v1/") or path in PROTOCOL_FAILURES


def presented_token(request: Request) -> Token | None:
    """The token of the request's bearer header (else, but on the API, of the dashboard's
    session cookie); None if none is valid."""
    settings = request.app.state.settings
    tokens: list[Token] = settings.tokens or []
    scheme, _, secret = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        return find_token(tokens, secret.strip()) if secret.strip() else None
    session = request.cookies.get(TOKEN_COOKIE, "")
    if not session or is_api(request.url.path):
        return None
    return find_session(tokens, settings.session_key, session)


def authenticate(request: Request) -> Token | None:
    """The request's valid token; None when the service has no tokens; 401 without one."""
    if request.app.state.settings.tokens is None:
        return None
    token = presented_token(request)
    if token is None:
        raise ApiError(401, "a valid bearer token is required", {"WWW-Authenticate": "Bearer"})
    return token


def authorize(request: Request, scope: str, queue: str | None) -> None:
    """Raise 401 without a valid bearer token, 403 if it may not act in scope on queue (never named)."""
    token = authenticate(request)
    if token is not None and not token.allows(scope, queue):
        where = "this queue" if queue is not None else "every queue"
        raise ApiError(403, f"token {token.name!r} has no {scope} scope on {where}")
