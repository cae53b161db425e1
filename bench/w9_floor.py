"""W9's floor: the least an HTTP server in Python can do for W9's jobs.

A bare ASGI app under uvicorn (httptools, as `pgdq serve` runs) that answers
W9's four routes (offer, batch offer, poll, ack: bench/over_http.py's
`_http_jobs`) with one pooled statement each and nothing else: no checks,
no authorization, no limits, no metrics, no group commit; a poll of more
than one message answers PostgreSQL's JSON as it comes. What it reaches
against the same jobs through SQL is about the most a Python server of this
kind (uvicorn, psycopg) sharing the machine's cores with its clients and
PostgreSQL can reach (bench/RESULTS.md, "W9's floor").

    PGDQ_FLOOR_DSN="host=... dbname=..." .venv/bin/uvicorn --app-dir bench \\
        w9_floor:app --http httptools --port 18091 --log-level warning

Not a service: it trusts every request.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

pool = AsyncConnectionPool(
    os.environ.get("PGDQ_FLOOR_DSN", ""), min_size=4, max_size=10, open=False, kwargs={"autocommit": True}
)
POLL_MANY = (
    "SELECT coalesce(json_agg(json_build_object('id', id, 'key', key, 'payload', payload,"
    " 'lock_token', lock_token, 'scheduled_at', scheduled_at)), '[]')::text"
    " FROM dq_poll_many(%s, %s, make_interval(secs => %s))"
)


async def _body(receive: Receive) -> Any:
    """The request's JSON body."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return json.loads(body)


async def _answer(c: AsyncConnection[Any], queue: str, route: str, body: Any) -> bytes:
    """The answer to one of W9's routes, from one statement."""
    if route == "messages":
        cur = await c.execute("SELECT dq_offer(%s, %s, %s::jsonb)", (queue, body["key"], json.dumps(body["payload"])))
        return json.dumps({"key": body["key"], "outcome": (await cur.fetchone() or [None])[0]}).encode()
    if route == "messages/batch":
        keys = [m["key"] for m in body["messages"]]
        payloads = [json.dumps(m["payload"]) for m in body["messages"]]
        statement = "SELECT key, outcome FROM dq_offer_many(%s, %s::text[], %s::jsonb[])"
        cur = await c.execute(statement, (queue, keys, payloads))
        return json.dumps({"results": [{"key": k, "outcome": o} for k, o in await cur.fetchall()]}).encode()
    if route == "poll":
        cur = await c.execute(POLL_MANY, (queue, body["max"], body["lease"]))
        return b'{"deliveries": ' + (await cur.fetchone() or ["[]"])[0].encode() + b"}"
    cur = await c.execute("SELECT dq_ack_many(%s::uuid[])", (body["lock_tokens"],))
    return json.dumps({"acked": (await cur.fetchone() or [0])[0]}).encode()


async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    """POST /v1/queues/{queue}/{route}; the pool opens and closes with the server."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await pool.open()
            await send({"type": "lifespan.startup.complete"})
        await pool.close()
        await send({"type": "lifespan.shutdown.complete"})
        return
    _, _, _, queue, route = scope["path"].split("/", 4)
    body = await _body(receive)
    async with pool.connection() as c:
        data = await _answer(c, queue, route, body)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": data})
