"""`pgdq serve` (the HTTP service) and `pgdq token new` (a bearer token for it)."""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import re
import signal
import socket
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from ._base import BadInput, dsn_option, parse_span, schema_option
from ._setup import _check_worker_database, _configure_logging


def is_loopback(host: str) -> bool:
    """True if host names only this machine (so no token is needed)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# --allowed-host: a DNS name or IPv4 address, or an IPv6 address in brackets; then :port if any
ALLOWED_HOST = re.compile(r"([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?")


@click.command()
@dsn_option
@schema_option
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535))
@click.option("--tokens", "tokens_file", type=click.Path(dir_okay=False), help="bearer tokens (pgdq token new)")
@click.option("--max-body", default=1 << 20, show_default=True, type=click.IntRange(1), help="largest body, bytes")
@click.option("--pool-size", default=10, show_default=True, type=click.IntRange(1), help="database connections")
@click.option(
    "--log-level", default="INFO", show_default=True, type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"])
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    help="a Host name (or name:port) browsers may use besides the served address, e.g. behind a proxy; repeat",
)
@click.option("--docs", is_flag=True, help="serve Swagger UI at /docs (it loads from a CDN)")
@click.option(
    "--statement-timeout",
    default=30.0,
    show_default=True,
    type=click.FloatRange(0),
    help="seconds a statement may run, then 503 (0: no limit); a long poll waits outside SQL",
)
@click.option(
    "--timeout-keep-alive",
    default=5,
    show_default=True,
    type=click.IntRange(1),
    help="seconds an idle connection stays",
)
@click.option(
    "--limit-concurrency",
    default=1000,
    show_default=True,
    type=click.IntRange(1),
    help="open connections (long polls included) before new requests get 503",
)
@click.option(
    "--group-commit/--no-group-commit",
    default=True,
    show_default=True,
    help="send concurrent offers, polls and acks of a queue to the database together, each request answered alone",
)
@click.option(
    "--group-commit-lag",
    default=0.005,
    show_default=True,
    type=click.FloatRange(0, 60),
    help="seconds a request waits for the statement of its kind in front of it before it goes anyway",
)
@click.option(
    "--group-commit-lock-timeout",
    default=0.02,
    show_default=True,
    type=click.FloatRange(0.001, 3600),
    help="seconds a batch's statement waits for a lock before its requests run one by one",
)
@click.option(
    "--http",
    "parser",
    default="httptools",
    show_default=True,
    type=click.Choice(["httptools", "h11"]),
    help="HTTP parser: both refuse a request head over 16 KiB; httptools takes about a third less CPU a request",
)
def serve(
    dsn: str | None,
    schema: str,
    host: str,
    port: int,
    tokens_file: str | None,
    max_body: int,
    pool_size: int,
    log_level: str,
    allowed_hosts: tuple[str, ...],
    docs: bool,
    statement_timeout: float,
    timeout_keep_alive: int,
    limit_concurrency: int,
    group_commit: bool,
    group_commit_lag: float,
    group_commit_lock_timeout: float,
    parser: str,
) -> None:
    """Serve the queues over HTTP until SIGINT / SIGTERM: the dashboard at /, the JSON API under /v1
    (OpenAPI at /openapi.json), Prometheus metrics at /metrics. Without --tokens it listens on loopback only.
    PGDQ_SESSION_KEY (32 bytes or more): the key the dashboard's sign-ins are signed with, the same for
    every server behind one address (without it, a random key: a restart signs everyone out)."""
    try:
        import uvicorn

        from ..http import Settings, create_app, load_tokens
        from ..http._auth import session_key
        from ..http._middleware import MAX_HEAD
        from ..http._server import BoundedH11Protocol, BoundedHttpToolsProtocol
    except ModuleNotFoundError as e:
        raise click.ClickException(
            f"pgdq serve needs the http extra (no module {e.name}): pip install 'pgdq[http]'"
        ) from e

    if tokens_file is None and not is_loopback(host):
        raise BadInput(f"refusing to serve on {host} without --tokens: anyone who can reach it could use every queue")
    try:
        tokens = load_tokens(tokens_file) if tokens_file is not None else None
        key = session_key(os.environ.get("PGDQ_SESSION_KEY"))
    except ValueError as e:
        raise BadInput(str(e)) from e
    for name in allowed_hosts:
        if not ALLOWED_HOST.fullmatch(name):
            raise BadInput(f"--allowed-host {name!r} must be a host name or address, optionally with :port")
    _check_worker_database(dsn, schema)
    _configure_logging(log_level, False)
    settings = Settings(
        dsn=dsn or os.environ.get("DATABASE_URL", ""),
        schema=schema,
        tokens=tokens,
        max_body=max_body,
        pool_size=pool_size,
        group_commit=group_commit,
        group_commit_lag=group_commit_lag,
        group_commit_lock_timeout=group_commit_lock_timeout,
        allowed_hosts=allowed_hosts,
        docs=docs,
        statement_timeout=statement_timeout,
        session_key=key,
    )
    listening = _listen(host, port)
    config = uvicorn.Config(
        create_app(settings),
        log_level=log_level.lower(),
        # both parsers refuse a request head still unparsed after MAX_HEAD bytes (uvicorn's httptools alone reads
        # on) with the JSON 431 a whole one gets (uvicorn's: 400 text/plain)
        http=BoundedHttpToolsProtocol if parser == "httptools" else BoundedH11Protocol,
        h11_max_incomplete_event_size=MAX_HEAD,
        timeout_keep_alive=timeout_keep_alive,
        limit_concurrency=limit_concurrency,
    )
    server = uvicorn.Server(config)
    # uvicorn names no address when handed a socket: say where to point a browser
    base = _base_url(listening)
    click.echo(f"pgdq serve: the dashboard at {base}/, the API under {base}/v1 (Ctrl-C stops it)", err=True)
    _run_until_signalled(server, listening)
    if not server.started:
        raise click.ClickException("the server did not start (see the log above)")


def _run_until_signalled(server: Any, listening: socket.socket) -> None:
    """Run server on listening until SIGINT or SIGTERM stops it gracefully, then return (exit 0):
    uvicorn raises the signal again once stopped, which the handlers kept here only note."""
    stops = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in stops}
    try:
        server.run(sockets=[listening])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _base_url(listening: socket.socket) -> str:
    """http://host:port of a listening socket (the port it really got; an IPv6 address in brackets)."""
    host, port = listening.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _listen(host: str, port: int) -> socket.socket:
    """A socket listening on host:port; exit 1 saying why if it cannot (the port is in use, ...)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise click.ClickException(f"port {port} is in use on {host}") from e
        raise click.ClickException(f"cannot listen on {host}:{port}: {e.strerror or e}") from e


def expiry(text: str) -> datetime:
    """--expires as a time: N followed by m/h/d/w from now, or an ISO 8601 time; BadInput if not in the future."""
    from ..http._auth import parse_expiry

    now = datetime.now(UTC)
    span = parse_span(text, "mhdw")
    try:
        when = now + span if span is not None else parse_expiry(text, "--expires")
    except ValueError as e:
        raise BadInput(f"{e} (or a span such as 30d)") from e
    if when is None or when <= now:
        raise BadInput(f"--expires {text!r} is not in the future")
    return when


@click.group()
def token() -> None:
    """Bearer tokens for `pgdq serve --tokens FILE`."""


@token.command("new")
@click.argument("tokens_file", type=click.Path(dir_okay=False))
@click.option("--name", required=True, help="whose token (shown in 403 answers and logs)")
@click.option("--scope", "scopes", multiple=True, required=True, type=click.Choice(["produce", "consume", "admin"]))
@click.option("--queue", "queues", multiple=True, help="a queue it may touch; repeat; default every queue")
@click.option("--expires", help="when it stops working: a span from now (90m, 12h, 30d, 8w) or an ISO 8601 time")
def token_new(
    tokens_file: str, name: str, scopes: tuple[str, ...], queues: tuple[str, ...], expires: str | None
) -> None:
    """Add a token to TOKENS_FILE (which keeps only its SHA-256) and print it, once."""
    from ..http import new_token
    from ..http._auth import save_tokens

    path = Path(tokens_file)
    data = json.loads(path.read_text()) if path.exists() else {"tokens": []}
    if any(t.get("name") == name for t in data["tokens"]):
        raise BadInput(f"{tokens_file} already has a token named {name!r}")
    secret, entry = new_token(name, list(scopes), list(queues), expiry(expires) if expires else None)
    data["tokens"].append(entry)
    save_tokens(path, data)
    click.echo(secret)
