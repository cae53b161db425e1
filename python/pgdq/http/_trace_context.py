"""The trace context of an HTTP request carried on by its offers: a request
with a `traceparent` header runs in the context it names, so the messages it
offers carry that traceparent on to their consumers (pgdq._tracing,
docs/observability.md, "Traces"). Needs opentelemetry-api (the otel extra);
without it, or when a span is current already (a server instrumented with a
tracer provider of its own makes its server span current), it does nothing.

Only the trace context's own headers (TRACE_HEADERS) are read: W3C `baggage`
is whatever the caller claims (tenant.id=..., user.role=admin, kilobytes of
it), so it stops here and reaches no handler and no message."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from .. import _tracing

# the headers of W3C Trace Context: what a request's trace context is read from (baggage is not)
TRACE_HEADERS = frozenset({b"traceparent", b"tracestate"})


class TraceContext:
    """ASGI middleware: a request carrying a traceparent header is handled in
    the trace context its headers carry (read by the global propagator)."""

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        token = None
        if _tracing.INSTALLED and scope["type"] == "http" and any(k == b"traceparent" for k, _ in scope["headers"]):
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"] if k in TRACE_HEADERS}
            token = _tracing.attach_incoming(headers)
        if token is None:
            await self.app(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            _tracing.detach(token)
