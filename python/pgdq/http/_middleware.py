"""The service's own ASGI middleware: the head (431) and body (413) limits, cancelling a
request whose client went away (so its statement stops on the server), and
the last resort for a failure no handler answers (a JSON 500, logged)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

from ._access import error_response

log = logging.getLogger("pgdq.http")


class _HttpMiddleware:
    """ASGI middleware that handles HTTP requests (handle) and passes anything else on untouched."""

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.handle(scope, receive, send)

    async def handle(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        """Handle one HTTP request."""
        raise NotImplementedError


MAX_HEAD = 16 * 1024  # bytes of a request head (request line and headers): over it, 431 (or 400, _server)


class HeadLimit(_HttpMiddleware):
    """ASGI middleware: a request whose head (request line and headers, as sent)
    is over MAX_HEAD bytes gets 431, whatever the HTTP parser let through
    (a whole head read in one piece is never counted against its bound)."""

    async def handle(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if head_size(scope) > MAX_HEAD:
            response = error_response(scope["path"], 431, f"the request head is over {MAX_HEAD} bytes")
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def head_size(scope: dict[str, Any]) -> int:
    """The bytes of a request's head as sent: "METHOD TARGET HTTP/1.1", each "name: value", CRLFs."""
    target = len(scope.get("raw_path") or scope["path"].encode()) + len(scope.get("query_string", b""))
    line = len(scope["method"]) + 1 + target + (1 if scope.get("query_string") else 0) + 11
    return line + sum(len(name) + len(value) + 4 for name, value in scope["headers"]) + 2


class BodyLimit:
    """ASGI middleware: a request body over max_body bytes gets 413, read no
    further (declared by Content-Length, or counted as a chunked body arrives)."""

    def __init__(self, app: Callable[..., Awaitable[None]], max_body: int) -> None:
        self.app, self.max_body = app, max_body

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            await self._too_large(scope, send)
            return
        seen, started, refused = 0, False, False

        async def counted() -> Any:
            # over the limit: answer 413 here, and the app reads a disconnect (its own answer is dropped)
            nonlocal seen, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            seen += len(message.get("body", b""))
            if seen <= self.max_body:
                return message
            refused = True
            if not started:
                await self._too_large(scope, send)
            return {"type": "http.disconnect"}

        async def unless_refused(message: dict[str, Any]) -> None:
            nonlocal started
            if not refused:
                started = True
                await send(message)

        await self.app(scope, counted, unless_refused)

    async def _too_large(self, scope: dict[str, Any], send: Callable[..., Any]) -> None:
        """Send the 413 answer."""
        response = error_response(scope["path"], 413, f"the request body is over {self.max_body} bytes")
        await response(scope, _no_body, send)


class JsonOnFailure(_HttpMiddleware):
    """ASGI middleware: an exception no handler answered (a bug, an answer that
    cannot be serialised) is logged with its traceback and answered as JSON 500
    {"error"} (in the protocol's shape on its paths), never as bare text; once
    an answer has started, it can only be cut short (the client sees the close)."""

    async def handle(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        started = False

        async def noting(message: dict[str, Any]) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await self.app(scope, receive, noting)
        except Exception:
            log.exception("%s %s failed", scope["method"], quote(scope["path"]))
            if started:
                raise
            response = error_response(scope["path"], 500, "the server failed to answer this request; see its log")
            await response(scope, receive, send)


async def _no_body() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


# The status a request whose client went away is counted with (as nginx logs it); no one receives it.
CLIENT_GONE = 499
# Seconds a request runs before CancelOnDisconnect watches for its client leaving.
WATCH_AFTER = 0.05


class CancelOnDisconnect(_HttpMiddleware):
    """ASGI middleware: a client that goes away before its answer is complete
    has its request cancelled (psycopg then cancels the running statement on
    the server, so the pooled connection comes back idle); the middleware
    around it (metrics) sees CLIENT_GONE."""

    async def handle(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        exchange = _Exchange(receive, send)
        if not _has_body(scope):  # the app may never read it: read it here, so the watch can start
            exchange.pending.append(await receive())
            exchange.body_read.set()
        handler = asyncio.ensure_future(self.app(scope, exchange.receive, exchange.send))
        # the watch starts only if the request runs on past WATCH_AFTER: most are done by then, and a
        # timer costs far less than a task (a third of this middleware's time in issue 28's profile)
        watching: list[asyncio.Future[None]] = []
        timer = asyncio.get_running_loop().call_later(
            WATCH_AFTER, lambda: watching.append(asyncio.ensure_future(exchange.watch(handler)))
        )
        try:
            await handler
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if (current is not None and current.cancelling()) or not exchange.disconnected.is_set():
                raise
            # the path percent-encoded (as uvicorn's access log has it): a %0A in it starts no line of the log
            path = quote(scope["path"])
            log.info("%s %s: the client went away; its request was cancelled", scope["method"], path)
            if not exchange.started:
                await send({"type": "http.response.start", "status": CLIENT_GONE, "headers": []})
        finally:
            handler.cancel()
            timer.cancel()
            for watch in watching:
                watch.cancel()


def _has_body(scope: dict[str, Any]) -> bool:
    """True if the request declares a body (a Content-Length above 0, or a Transfer-Encoding)."""
    headers = dict(scope["headers"])
    return b"transfer-encoding" in headers or headers.get(b"content-length", b"0") not in (b"0", b"")


class _Exchange:
    """One request's receive and send as the app sees them: once its body is
    read, only watch() reads the client's channel, and a disconnect cancels the
    handler unless the answer is complete."""

    def __init__(self, receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        self._receive, self._send = receive, send
        self.pending: list[dict[str, Any]] = []
        self.body_read, self.disconnected = asyncio.Event(), asyncio.Event()
        self.started = self.complete = False

    async def receive(self) -> dict[str, Any]:
        """The next message for the app: the body's, then (waiting) the disconnect."""
        if self.pending:
            return self.pending.pop(0)
        if self.body_read.is_set():
            await self.disconnected.wait()
            return {"type": "http.disconnect"}
        message: dict[str, Any] = await self._receive()
        if message["type"] == "http.disconnect":
            self.disconnected.set()
        if message["type"] != "http.request" or not message.get("more_body", False):
            self.body_read.set()
        return message

    async def send(self, message: dict[str, Any]) -> None:
        """Send message, noting when the answer starts and when it is complete."""
        self.started = True
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.complete = True
        await self._send(message)

    async def watch(self, handler: asyncio.Future[None]) -> None:
        """After the body, wait for the client's disconnect; cancel handler if it comes first."""
        await self.body_read.wait()
        if not self.disconnected.is_set():
            while (await self._receive())["type"] != "http.disconnect":
                pass
            self.disconnected.set()
        if not self.complete:
            handler.cancel()
