"""Swagger UI at /docs, only with `pgdq serve --docs`: FastAPI's page loads
Swagger UI from a CDN, so it gets a policy of its own that lets in that CDN
and the page's own inline scripts (by their hashes), still in no frame."""

from __future__ import annotations

import base64
import hashlib
import re

from fastapi import APIRouter
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse

from .._version import VERSION

router = APIRouter(include_in_schema=False)
CDN = "https://cdn.jsdelivr.net"  # where FastAPI's page takes swagger-ui-dist from
FAVICON = "https://fastapi.tiangolo.com"
INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.S)


def with_policy(page: HTMLResponse) -> HTMLResponse:
    """page with a Content-Security-Policy allowing the CDN and exactly its inline scripts."""
    body = bytes(page.body).decode()
    hashes = " ".join(
        f"'sha256-{base64.b64encode(hashlib.sha256(s.encode()).digest()).decode()}'"
        for s in INLINE_SCRIPT.findall(body)
    )
    page.headers["content-security-policy"] = (
        f"default-src 'self'; script-src 'self' {CDN} {hashes}; style-src 'self' 'unsafe-inline' {CDN}; "
        f"img-src 'self' data: {FAVICON}; connect-src 'self'; object-src 'none'; base-uri 'none'; "
        "form-action 'self'; frame-ancestors 'none'"
    )
    return page


@router.get("/docs", response_class=HTMLResponse)
async def swagger_ui() -> HTMLResponse:
    """Swagger UI on /openapi.json."""
    return with_policy(
        get_swagger_ui_html(
            openapi_url="/openapi.json", title=f"pgdq {VERSION}", oauth2_redirect_url="/docs/oauth2-redirect"
        )
    )


@router.get("/docs/oauth2-redirect", response_class=HTMLResponse)
async def swagger_ui_redirect() -> HTMLResponse:
    """Swagger UI's OAuth2 redirect page (FastAPI's)."""
    return with_policy(get_swagger_ui_oauth2_redirect_html())
