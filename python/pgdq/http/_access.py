"""What every route shares: the failure answer (ApiError and its JSON shape)
and who may do what (bearer tokens, the dashboard's cookie)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from ._auth import Token, find_token


class ApiError(Exception):
    """An answer other than 200, with a message for the client."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers


# The classic protocol's one route: its failures keep that protocol's shape.
CLASSIC_PATH = "/command"


def error_response(
    path: str, status: int, message: str, sqlstate: str | None = None, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """A failure answer: {"error", "sqlstate"?}, or on CLASSIC_PATH {"success": false, "error", ...}."""
    body: dict[str, Any] = {"error": message}
    if path == CLASSIC_PATH:
        body = {"success": False, "error": message, "id": None, "value": None}
    elif sqlstate is not None:
        body["sqlstate"] = sqlstate
    return JSONResponse(body, status_code=status, headers=headers)


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
