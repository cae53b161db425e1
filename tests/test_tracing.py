"""OpenTelemetry traces (pgdq._tracing, docs/observability.md): one trace
from an offer in one process to the ack in another, the consumer span's
status from the handler's outcome, an HTTP offer carrying the request's
traceparent, and nothing imported or injected without opentelemetry.

The producers and consumers that configure a tracer provider run as
processes of their own (tracing_agents.py): a global provider, once set,
would trace every later offer of this process, and other tests expect none.
Spans made here come from a provider that is not set globally."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
from http_server import Server
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanContext
from pgdq import AsyncQueue, Message, Queue
from waiting import outstanding

AGENTS = Path(__file__).resolve().parent / "tracing_agents.py"


def agent(*args: str) -> Any:
    """Run tracing_agents.py with args; the JSON it prints."""
    command = [sys.executable, str(AGENTS), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def traceparent(context: SpanContext) -> str:
    """The W3C traceparent of a span context."""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def local_tracer() -> trace.Tracer:
    """A tracer of a provider of this test's own (the global one stays unset)."""
    return TracerProvider().get_tracer("test")


def test_one_trace_from_an_offer_to_the_ack_in_another_process(database: str, queue_name: str) -> None:
    """The producer's process offers, sends and offers a batch inside a span
    "checkout"; the Worker's process handles the four messages: each
    "process" span is a child of (and linked to) the producer span of its
    message, in the same trace, and ends OK with the ack."""
    produced = {s["name"]: s for s in agent("produce", database, queue_name)}
    checkout = produced["checkout"]
    offer, send, batch = (produced[f"{op} {queue_name}"] for op in ("offer", "send", "offer_many"))
    for span in (offer, send, batch):
        assert span["kind"] == "PRODUCER" and span["status"] == "UNSET"
        assert (span["trace_id"], span["parent_id"]) == (checkout["trace_id"], checkout["span_id"])
        assert span["attributes"]["messaging.system"] == "pgdq"
        assert span["attributes"]["messaging.destination.name"] == queue_name
        assert span["attributes"]["messaging.operation.type"] == "send"
    assert offer["attributes"]["messaging.pgdq.message.key"] == "order"
    assert offer["attributes"]["messaging.pgdq.offer.outcome"] == "created"
    assert batch["attributes"]["messaging.batch.message_count"] == 2
    with Queue(queue_name, database) as q:
        order = q.get("order")
        assert order is not None and order.headers is not None
        assert order.headers["tenant"] == "acme", "the caller's own headers are kept"
        assert order.headers["traceparent"].startswith(f"00-{checkout['trace_id']}-{offer['span_id']}-")

        processed = agent("consume", database, queue_name, "4")
        assert outstanding(q, "ready", "delayed", "leased") == 0, "all four acked"

    parents = {"order": offer, "batch-1": batch, "batch-2": batch}
    spans = [s for s in processed if s["name"] == f"process {queue_name}"]
    assert len(spans) == 4
    for span in spans:
        attributes = span["attributes"]
        producer = parents.get(attributes.get("messaging.pgdq.message.key"), send)
        if producer is send:
            assert attributes["messaging.message.id"] == send["attributes"]["messaging.message.id"]
        assert span["kind"] == "CONSUMER"
        assert span["trace_id"] == checkout["trace_id"], "one trace from the offer to the ack"
        assert span["parent_id"] == producer["span_id"] and span["links"] == [producer["span_id"]]
        assert span["status"] == "OK"
        assert attributes["messaging.system"] == "pgdq"
        assert attributes["messaging.destination.name"] == queue_name
        assert attributes["messaging.operation.type"] == attributes["messaging.operation"] == "process"
        assert attributes["messaging.pgdq.message.delivery_attempt"] == 1
        assert attributes["messaging.pgdq.outcome"] == "handled"
        assert attributes["messaging.message.id"].isdigit()


def test_an_offer_inside_the_callers_span_continues_its_trace(database: str, queue_name: str) -> None:
    """No provider configured here, so no producer span: the offer carries
    the caller's current span, which becomes the consumer span's parent."""
    with local_tracer().start_as_current_span("checkout") as checkout, Queue(queue_name, database) as q:
        q.offer("order", {"do": ["ok"]})
        order = q.get("order")
    context = checkout.get_span_context()
    assert order is not None and order.headers == {"traceparent": traceparent(context)}
    (span,) = agent("consume", database, queue_name, "1")
    assert (span["trace_id"], span["parent_id"]) == (f"{context.trace_id:032x}", f"{context.span_id:016x}")
    assert span["status"] == "OK" and span["attributes"]["messaging.pgdq.message.key"] == "order"


def test_the_consumer_span_ends_as_the_handler_did(database: str, queue_name: str) -> None:
    """A failed attempt is ERROR with the exception recorded, so is its
    dead-lettering at the last attempt; a requested retry leaves the status
    unset; the attempt after it is OK. Every attempt continues the offer's trace."""
    with local_tracer().start_as_current_span("checkout") as checkout, Queue(queue_name, database) as q:
        q.offer_many([Message("failing", {"do": ["fail", "fail"]}), Message("retried", {"do": ["retry", "ok"]})])
    spans = agent("consume", database, queue_name, "4")
    context = checkout.get_span_context()
    assert {(s["trace_id"], s["parent_id"]) for s in spans} == {(f"{context.trace_id:032x}", f"{context.span_id:016x}")}
    attempts = {
        (s["attributes"]["messaging.pgdq.message.key"], s["attributes"]["messaging.pgdq.message.delivery_attempt"]): s
        for s in spans
    }
    failed, dead = attempts["failing", 1], attempts["failing", 2]
    assert failed["status"] == dead["status"] == "ERROR"
    assert failed["description"] == "ValueError: cannot handle failing (attempt 1)"
    assert dead["description"] == "dead-lettered: ValueError: cannot handle failing (attempt 2)"
    for span, outcome in ((failed, "failed"), (dead, "dead_lettered")):
        assert span["attributes"]["messaging.pgdq.outcome"] == outcome
        assert span["attributes"]["error.type"] == "ValueError"
        (event,) = span["events"]
        assert event["name"] == "exception" and event["exception.type"] == "ValueError"
    retried, handled = attempts["retried", 1], attempts["retried", 2]
    assert retried["status"] == "UNSET" and retried["attributes"]["messaging.pgdq.outcome"] == "retried"
    assert handled["status"] == "OK" and handled["attributes"]["messaging.pgdq.outcome"] == "handled"
    with Queue(queue_name, database) as q:
        assert [d.key for d in q.dead_letters()] == ["failing"]
        q.purge_dead_letters()


def test_without_opentelemetry_nothing_is_imported_or_carried(database: str, queue_name: str) -> None:
    """A process that never imports opentelemetry (pgdq does not) offers,
    sends and handles both with a Worker: no header, no opentelemetry module."""
    seen = agent("plain", database, queue_name)
    assert seen == {"headers": [None, None], "modules": []}


def test_no_provider_and_no_span_no_trace_context(database: str, queue_name: str) -> None:
    """opentelemetry imported (here) but no provider configured and no span
    current: offers and sends, sync and async, carry no headers; the
    caller's headers go as they are."""
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    with Queue(queue_name, database) as q:
        q.offer("one", 1)
        q.offer("own", 1, headers={"x": 1})
        q.offer_many([Message("many", 1)])
        ids = [q.send(1), *q.send_many([1, 2])]

        async def offer_async() -> None:
            async with AsyncQueue(queue_name, database) as aq:
                await aq.offer("async", 1)

        asyncio.run(offer_async())
        infos = [q.get(key) for key in ("one", "own", "many", "async")] + [q.get_id(i) for i in ids]
        assert [info.headers if info else "missing" for info in infos] == [None, {"x": 1}, None, None, None, None, None]
        q.purge()


def test_an_http_offer_carries_the_requests_traceparent(server: Server, database: str, queue_name: str) -> None:
    """`pgdq serve` (no provider configured there): an offer whose request
    carries traceparent and tracestate keeps both with its message; one
    without keeps none."""
    incoming = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "shop=1"}
    with httpx.Client(base_url=server.url, timeout=30) as api, Queue(queue_name, database) as q:
        sent = api.post(f"/v1/queues/{queue_name}/messages", json={"key": "traced", "payload": 1}, headers=incoming)
        assert sent.status_code == 200, sent.text
        plain = api.post(f"/v1/queues/{queue_name}/messages", json={"key": "plain", "payload": 1})
        assert plain.status_code == 200, plain.text
        traced, untraced = q.get("traced"), q.get("plain")
        assert traced is not None and traced.headers == incoming
        assert untraced is not None and untraced.headers is None
        q.purge()


def test_the_tracing_module_imports_no_queue_module() -> None:
    """pgdq._tracing is imported by the queue modules: it imports none of them (no import cycle)."""
    import ast

    import pgdq._tracing

    tree = ast.parse(Path(pgdq._tracing.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not any("queue" in m or "delivery" in m for m in imported), imported


def test_an_http_callers_baggage_stops_at_the_service(server: Server, database: str, queue_name: str) -> None:
    """W3C baggage is the caller's say-so (tenant.id=other, user.role=admin): `pgdq
    serve` reads only traceparent and tracestate, so no baggage reaches a message."""
    incoming = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "shop=1"}
    baggage = {"baggage": "tenant.id=other-tenant,user.role=admin," + ",".join(f"k{i}={'v' * 60}" for i in range(100))}
    with httpx.Client(base_url=server.url, timeout=30) as api, Queue(queue_name, database) as q:
        sent = api.post(
            f"/v1/queues/{queue_name}/messages", json={"key": "b", "payload": 1}, headers=incoming | baggage
        )
        assert sent.status_code == 200, sent.text
        found = q.get("b")
        assert found is not None and found.headers == incoming
        q.purge()
