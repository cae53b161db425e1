"""The tracing test's processes, each with a tracer provider of its own
(set globally, as an application would) and an in-memory span exporter:

    python tracing_agents.py produce DSN QUEUE   inside a span "checkout": offer
        "order" (Queue), send one keyless message (AsyncQueue), offer_many
        "batch-1" and "batch-2"
    python tracing_agents.py consume DSN QUEUE COUNT   a Worker (max_attempts
        2, backoff 0.05 s) until COUNT "process" spans have ended; its handler
        does what the payload's "do" lists for the attempt: "ok", "fail"
        (raises ValueError) or "retry" (raises Retry)
    python tracing_agents.py plain DSN QUEUE   without opentelemetry: offer one
        message and send one, a Worker handles both; prints their headers and
        the opentelemetry modules imported (none expected)

Each prints one JSON document on stdout: the finished spans (span()), or for
plain what it saw.
"""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import timedelta
from typing import Any


def span(s: Any) -> dict[str, Any]:
    """A finished span as JSON: names, ids in hex, attributes, status, events, links."""
    return {
        "name": s.name,
        "kind": s.kind.name,
        "trace_id": format(s.context.trace_id, "032x"),
        "span_id": format(s.context.span_id, "016x"),
        "parent_id": format(s.parent.span_id, "016x") if s.parent is not None else None,
        "attributes": dict(s.attributes),
        "status": s.status.status_code.name,
        "description": s.status.description,
        "events": [{"name": e.name, **dict(e.attributes)} for e in s.events],
        "links": [format(link.context.span_id, "016x") for link in s.links],
    }


def provider() -> Any:
    """A global SDK tracer provider exporting to memory; the exporter."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(tracer_provider)
    return exporter


def produce(dsn: str, queue: str) -> None:
    from opentelemetry import trace
    from pgdq import AsyncQueue, Message, Queue

    exporter = provider()

    async def send_one() -> None:
        async with AsyncQueue(queue, dsn) as aq:
            await aq.send({"do": ["ok"]})

    with trace.get_tracer("shop").start_as_current_span("checkout"), Queue(queue, dsn) as q:
        q.offer("order", {"do": ["ok"]}, headers={"tenant": "acme"})
        asyncio.run(send_one())
        q.offer_many([Message("batch-1", {"do": ["ok"]}), Message("batch-2", {"do": ["ok"]})])
    print(json.dumps([span(s) for s in exporter.get_finished_spans()]))


def consume(dsn: str, queue: str, count: int) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import SpanProcessor
    from pgdq import AsyncDelivery
    from pgdq.worker import Backoff, Retry, Worker

    exporter = provider()

    def handler(d: AsyncDelivery) -> None:
        action = d.payload["do"][d.attempts - 1]
        if action == "fail":
            raise ValueError(f"cannot handle {d.key} (attempt {d.attempts})")
        if action == "retry":
            raise Retry()

    backoff = Backoff(base=timedelta(seconds=0.05), jitter=0)
    worker = Worker(queue, handler, dsn=dsn, max_attempts=2, backoff=backoff)

    class StopAfter(SpanProcessor):
        """Stops the worker once count process spans have ended."""

        ended = 0

        def on_end(self, s: Any) -> None:
            if s.name.startswith("process "):
                self.ended += 1
                if self.ended == count:
                    worker.stop()

    tracer_provider: Any = trace.get_tracer_provider()
    tracer_provider.add_span_processor(StopAfter())
    assert asyncio.run(worker.run_async()) == 0
    print(json.dumps([span(s) for s in exporter.get_finished_spans()]))


def plain(dsn: str, queue: str) -> None:
    from pgdq import AsyncDelivery, Queue
    from pgdq.worker import Worker

    seen: list[Any] = []

    def handler(d: AsyncDelivery) -> None:
        seen.append(d.headers)
        if len(seen) == 2:
            worker.stop()

    worker = Worker(queue, handler, dsn=dsn)
    with Queue(queue, dsn) as q:
        q.offer("plain", 1)
        q.send(2)
    asyncio.run(worker.run_async())
    otel = sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")
    print(json.dumps({"headers": seen, "modules": otel}))


if __name__ == "__main__":
    role, dsn, queue, *rest = sys.argv[1:]
    if role == "produce":
        produce(dsn, queue)
    elif role == "consume":
        consume(dsn, queue, int(rest[0]))
    else:
        plain(dsn, queue)
