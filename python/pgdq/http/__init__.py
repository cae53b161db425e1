"""pgdq over HTTP: a stateless JSON API in front of the SQL functions.

`pgdq serve` runs it on uvicorn; any ASGI server can run `pgdq.http:app`,
configured from the environment (PGDQ_DSN, PGDQ_SCHEMA, PGDQ_TOKENS, and
PGDQ_ALLOWED_HOSTS, PGDQ_DOCS as --allowed-host, comma-separated, and --docs;
PGDQ_STATEMENT_TIMEOUT as --statement-timeout; PGDQ_SESSION_KEY, the key the
dashboard's sign-in sessions are signed with, as for `pgdq serve`). Run
as many servers as you like behind a load balancer: every state is in
PostgreSQL. docs/http.md describes the API.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ._auth import Token, load_tokens, new_token, session_key

if TYPE_CHECKING:
    from ._app import Settings, create_app

__all__ = ["Settings", "Token", "app", "create_app", "load_tokens", "new_token"]


def __getattr__(name: str) -> Any:
    """`Settings` and `create_app` (FastAPI, imported on first use: `pgdq token`
    needs none of it), and `app`: the service configured from the environment,
    made on first use."""
    if name not in ("Settings", "create_app", "app"):
        raise AttributeError(name)
    from ._app import Settings, create_app

    if name != "app":
        return Settings if name == "Settings" else create_app
    tokens = os.environ.get("PGDQ_TOKENS")
    settings = Settings(
        dsn=os.environ.get("PGDQ_DSN", ""),
        schema=os.environ.get("PGDQ_SCHEMA"),
        tokens=load_tokens(tokens) if tokens else None,
        allowed_hosts=tuple(h.strip() for h in os.environ.get("PGDQ_ALLOWED_HOSTS", "").split(",") if h.strip()),
        docs=os.environ.get("PGDQ_DOCS", "") not in ("", "0"),
        statement_timeout=_seconds("PGDQ_STATEMENT_TIMEOUT", Settings.statement_timeout),
        session_key=session_key(os.environ.get("PGDQ_SESSION_KEY")),
    )
    made = globals()["app"] = create_app(settings)
    return made


def _seconds(variable: str, default: float) -> float:
    """The environment variable as seconds, 0 or more (default when unset); ValueError naming it otherwise."""
    text = os.environ.get(variable, "").strip()
    try:
        seconds = float(text) if text else default
    except ValueError:
        seconds = -1.0
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(f"{variable} must be a number of seconds, 0 or more, not {text!r}")
    return seconds
