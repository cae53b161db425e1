"""OpenTelemetry traces, optional (`pip install 'pgdq[otel]'`): the trace
context in the headers of each message offered or sent, a PRODUCER span
around each offer or send, and a CONSUMER span around each delivery a Worker
handles, a child of its producer's, so one trace runs from an offer in one
process to the ack in another (docs/observability.md, "Traces").

The one module of pgdq that touches opentelemetry, and only lazily. Without
the package installed, the producing methods are not even wrapped. With it,
a process that never imported opentelemetry.trace has no tracer provider and
no current span: each call looks that up in sys.modules and does nothing
more, imports nothing. Spans are made only while a tracer provider is
configured (not the API's proxy or no-op one); the context alone is carried
on whenever a valid span is current, by the global propagator
(opentelemetry.propagate), so configured propagators apply.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import json
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from ._version import VERSION

if TYPE_CHECKING:
    from contextvars import Token

    from opentelemetry.context import Context
    from opentelemetry.propagators.textmap import Getter
    from opentelemetry.trace import Span, Tracer

F = TypeVar("F", bound=Callable[..., Any])


class Delivered(Protocol):
    """What a consumer span reads of a delivery (AsyncDelivery has it; named
    here so that this module imports no queue module, which imports it)."""

    @property
    def queue(self) -> str: ...
    @property
    def key(self) -> str | None: ...
    @property
    def id(self) -> int: ...
    @property
    def attempts(self) -> int: ...
    @property
    def channel(self) -> str | None: ...
    @property
    def headers(self) -> dict[str, Any] | None: ...


# messaging.system: the semantic conventions register no value for pgdq
SYSTEM = "pgdq"
# opentelemetry can be imported (found without importing it)
INSTALLED = importlib.util.find_spec("opentelemetry") is not None

_tracers: dict[int, Tracer] = {}  # id(provider) -> pgdq's tracer of it


def _loaded() -> bool:
    """True once this process imported opentelemetry.trace: before, no span can be current, no provider set."""
    return "opentelemetry.trace" in sys.modules


def _tracer() -> Tracer | None:
    """pgdq's tracer of the global provider; None while none is configured (the API's proxy or no-op)."""
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    tracer = _tracers.get(id(provider))
    if tracer is None:
        tracer = _tracers[id(provider)] = provider.get_tracer("pgdq", VERSION)
    return tracer


# --- producing ----------------------------------------------------------------


def producer(method: F) -> F:
    """Wrap a producing method of a queue (offer, offer_many, send, send_many;
    sync or async) in a PRODUCER span "<method> <queue>" while a provider is
    configured; the method itself when opentelemetry is not installed."""
    if not INSTALLED:
        return method
    operation = method.__name__

    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def traced_async(self: Any, *args: Any, **kwargs: Any) -> Any:
            span = _producer_span(self.name, operation, args, kwargs)
            if span is None:
                return await method(self, *args, **kwargs)
            with _current(span):
                result = await method(self, *args, **kwargs)
                _produced(span, operation, result)
                return result

        return cast(F, traced_async)

    @functools.wraps(method)
    def traced(self: Any, *args: Any, **kwargs: Any) -> Any:
        span = _producer_span(self.name, operation, args, kwargs)
        if span is None:
            return method(self, *args, **kwargs)
        with _current(span):
            result = method(self, *args, **kwargs)
            _produced(span, operation, result)
            return result

    return cast(F, traced)


def _producer_span(queue: str, operation: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Span | None:
    """A started PRODUCER span for operation on queue (offer: its key), or None when not tracing."""
    if not _loaded() or (tracer := _tracer()) is None:
        return None
    from opentelemetry.trace import SpanKind

    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": queue,
        "messaging.operation.type": "send",
        "messaging.operation.name": operation,
        "messaging.operation": "publish",  # before semconv 1.26
    }
    key = (args[0] if args else kwargs.get("key")) if operation == "offer" else None
    if isinstance(key, str):
        attributes["messaging.pgdq.message.key"] = key
    return tracer.start_span(f"{operation} {queue}", kind=SpanKind.PRODUCER, attributes=attributes)


def _current(span: Span) -> Any:
    """span current inside (a context manager), ended on exit; an exception is recorded and sets ERROR."""
    from opentelemetry import trace

    return trace.use_span(span, end_on_exit=True)


def _produced(span: Span, operation: str, result: Any) -> None:
    """What the producing call answered, as span attributes: the id of a send,
    the outcome of an offer, the size of a batch."""
    if operation == "send":
        span.set_attribute("messaging.message.id", str(result))
    elif operation == "offer":
        span.set_attribute("messaging.pgdq.offer.outcome", str(result))
    elif isinstance(result, list):
        span.set_attribute("messaging.batch.message_count", len(result))


def _context_headers() -> dict[str, str]:
    """The current trace context as the global propagator writes it
    (traceparent, tracestate, ...); empty when no valid span is current."""
    from opentelemetry import propagate, trace

    if not trace.get_current_span().get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def inject(headers: Any) -> Any:
    """A message's headers with the current trace context added, the
    caller's own keys kept over it; headers itself (None stays None) when no
    valid span is current, opentelemetry is not loaded, or headers is no mapping."""
    if not _loaded() or (headers is not None and not isinstance(headers, Mapping)):
        return headers
    context = _context_headers()
    if not context:
        return headers
    return {**context, **headers} if headers else context


def inject_document(document: str | None, count: int) -> str | None:
    """A batch's headers document (a JSON array of count elements, null for
    one without; None: no element has any) with the current trace context
    added to each element, its own keys kept over it; document itself when
    no valid span is current or opentelemetry is not loaded."""
    if not _loaded() or count == 0:
        return document
    context = _context_headers()
    if not context:
        return document
    elements: list[dict[str, Any] | None] = [None] * count if document is None else json.loads(document)
    return json.dumps([{**context, **(e or {})} for e in elements], separators=(",", ":"))


# --- consuming ----------------------------------------------------------------


@functools.cache
def _header_getter() -> Getter[Mapping[str, Any]]:
    """Reads a propagator's fields from a message's headers: string values only (headers are any JSON)."""
    from opentelemetry.propagators.textmap import Getter

    class Headers(Getter[Mapping[str, Any]]):
        def get(self, carrier: Mapping[str, Any], key: str) -> list[str] | None:
            value = carrier.get(key)
            return [value] if isinstance(value, str) else None

        def keys(self, carrier: Mapping[str, Any]) -> list[str]:
            return [k for k, v in carrier.items() if isinstance(v, str)]

    return Headers()


class Consuming:
    """A delivery being handled under its producer's trace: the CONSUMER
    span (None: no provider configured, the producer's context current all
    the same) and the token that made it current."""

    def __init__(self, span: Span | None, token: Token[Context]) -> None:
        self.span = span
        self.token = token

    def finish(self, outcome: str | None, error: BaseException | None, why: str | None) -> None:
        """End the span with the delivery's outcome as its status (None: error
        escaped), error recorded; then restore the context from before consuming()."""
        from opentelemetry import context

        try:
            if self.span is not None:
                _settled(self.span, outcome, error, why)
        finally:
            context.detach(self.token)


def consuming(delivery: Delivered) -> Consuming | None:
    """For a Worker handling delivery: its CONSUMER span "process <queue>", a
    child of (and linked to) the context its headers carry, made current for
    the handler; None when opentelemetry is not loaded, or when no provider is
    configured and the headers carry no context (nothing to carry on)."""
    if not _loaded():
        return None
    from opentelemetry import context, propagate, trace

    parent = propagate.extract(delivery.headers, getter=_header_getter()) if delivery.headers else None
    found = trace.get_current_span(parent).get_span_context()
    tracer = _tracer()
    if tracer is None:
        return Consuming(None, context.attach(parent)) if parent is not None and found.is_valid else None
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": delivery.queue,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.operation": "process",  # before semconv 1.26
        "messaging.message.id": str(delivery.id),
        "messaging.pgdq.message.delivery_attempt": delivery.attempts,
    }
    if delivery.key is not None:
        attributes["messaging.pgdq.message.key"] = delivery.key
    if delivery.channel is not None:
        attributes["messaging.pgdq.message.channel"] = delivery.channel
    span = tracer.start_span(
        f"process {delivery.queue}",
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        attributes=attributes,
        links=[trace.Link(found)] if found.is_valid else None,
    )
    return Consuming(span, context.attach(trace.set_span_in_context(span, parent)))


def _settled(span: Span, outcome: str | None, error: BaseException | None, why: str | None) -> None:
    """A consumer span's status from the outcome: OK once acked, unset when
    the handler asked for a retry, ERROR (with why, the error recorded) for
    the rest; then end it."""
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("messaging.pgdq.outcome", outcome or "error")
    if outcome == "handled":
        span.set_status(Status(StatusCode.OK))
    elif outcome != "retried":
        if error is not None:
            span.record_exception(error)
        span.set_attribute("error.type", type(error).__qualname__ if error is not None else str(outcome))
        if outcome is None:
            why = f"{type(error).__name__}: {error}"
        elif outcome == "dead_lettered":
            why = f"dead-lettered: {why}"
        elif outcome == "lost":
            why = "the lease was lost: the outcome was left to whoever holds the message now"
        span.set_status(Status(StatusCode.ERROR, why))
    span.end()


# --- pgdq serve -----------------------------------------------------------------


def attach_incoming(headers: Mapping[str, str]) -> Token[Context] | None:
    """Make current the trace context an incoming request's headers carry
    (global propagator), unless a valid span already is (an instrumented
    server's own); the token for detach, or None when nothing was attached."""
    if not INSTALLED:
        return None
    try:
        from opentelemetry import context, propagate, trace
    except ImportError:  # a namespace "opentelemetry" without the API
        return None
    if trace.get_current_span().get_span_context().is_valid:
        return None
    extracted = propagate.extract(headers)
    if not trace.get_current_span(extracted).get_span_context().is_valid:
        return None
    return context.attach(extracted)


def detach(token: Token[Context]) -> None:
    """Undo an attach_incoming (its token): the context before it current again."""
    from opentelemetry import context

    context.detach(token)
