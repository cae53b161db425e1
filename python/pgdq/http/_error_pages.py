"""The dashboard's failures as pages: a browser asking for a page (a GET that
accepts HTML, not an htmx fragment, not the API) gets an HTML page with the
failure's status and message (templates/error.html) where the API answers
JSON; every other request keeps the JSON answer (_access.error_response)."""

from __future__ import annotations

from collections.abc import Mapping
from http import HTTPStatus

from fastapi import Request, Response

from ._access import PROTOCOL_FAILURES, error_response
from ._dashboard import _page

# paths whose answers are JSON (or text) whoever asks: the API, its documents, metrics, fragments, files
NOT_PAGES = ("/v1/", "/dashboard/", "/static/", "/metrics", "/openapi.json", "/docs")


def wants_page(request: Request) -> bool:
    """True if request is a browser's navigation to a dashboard page."""
    path = request.url.path
    return (
        request.method in ("GET", "HEAD")
        and "text/html" in request.headers.get("accept", "")
        and "hx-request" not in request.headers
        and not path.startswith(NOT_PAGES)
        and path not in PROTOCOL_FAILURES
    )


def failure(
    request: Request,
    status: int,
    message: str,
    sqlstate: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """The failure answer for request: an HTML page for a browser's page, else the JSON one."""
    if not wants_page(request):
        return error_response(request.url.path, status, message, sqlstate, headers)
    reason = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "Error"
    answer = _page(request, "error.html", {"status": status, "reason": reason, "message": message}, status)
    answer.headers.update(headers or {})
    return answer
