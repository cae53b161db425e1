"""The queues under test, each driven through its public API the same way.

A system prepares its own fresh database and offers five operations:
enqueue a batch, offer one, poll a batch, ack a batch, poll one, ack one.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any, Protocol

import psycopg
from pgdq import Queue, install

QUEUE = "bench"
LEASE = timedelta(seconds=60)


class System(Protocol):
    name: str

    def setup(self, conn: psycopg.Connection[Any]) -> None: ...
    def enqueue_batch(self, conn: psycopg.Connection[Any], keys: list[str], payloads: list[Any]) -> None: ...
    def offer_one(self, conn: psycopg.Connection[Any], key: str, payload: Any) -> None: ...
    def poll_batch(self, conn: psycopg.Connection[Any], n: int) -> list[Any]: ...
    def ack_batch(self, conn: psycopg.Connection[Any], tokens: list[Any]) -> None: ...
    def poll_one(self, conn: psycopg.Connection[Any]) -> Any | None: ...
    def ack_one(self, conn: psycopg.Connection[Any], token: Any) -> None: ...


class RawSql:
    """The smallest hand-written queue: one table, FOR UPDATE SKIP LOCKED,
    two round trips per drained batch. The practical ceiling of the machine."""

    name = "raw SQL"

    def setup(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(
            """CREATE TABLE raw_jobs (
                   id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                   queue text NOT NULL, key text NOT NULL, payload jsonb NOT NULL,
                   run_at timestamptz NOT NULL DEFAULT now(),
                   UNIQUE (queue, key))"""
        )
        conn.execute("CREATE INDEX ON raw_jobs (queue, run_at, id)")

    def enqueue_batch(self, conn: psycopg.Connection[Any], keys: list[str], payloads: list[Any]) -> None:
        conn.execute(
            "INSERT INTO raw_jobs (queue, key, payload) SELECT %s, k, p::jsonb"
            " FROM unnest(%s::text[], %s::text[]) AS u (k, p) ON CONFLICT DO NOTHING",
            (QUEUE, keys, [json.dumps(p) for p in payloads]),
        )

    def offer_one(self, conn: psycopg.Connection[Any], key: str, payload: Any) -> None:
        conn.execute(
            "INSERT INTO raw_jobs (queue, key, payload) VALUES (%s, %s, %s::jsonb) ON CONFLICT DO NOTHING",
            (QUEUE, key, json.dumps(payload)),
        )

    def poll_batch(self, conn: psycopg.Connection[Any], n: int) -> list[Any]:
        rows = conn.execute(
            "UPDATE raw_jobs SET run_at = now() + %s WHERE id IN ("
            " SELECT id FROM raw_jobs WHERE queue = %s AND run_at <= now()"
            " ORDER BY run_at, id LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING id, key, payload",
            (LEASE, QUEUE, n),
        ).fetchall()
        return [r[0] for r in rows]

    def ack_batch(self, conn: psycopg.Connection[Any], tokens: list[Any]) -> None:
        conn.execute("DELETE FROM raw_jobs WHERE id = ANY(%s)", (tokens,))

    def poll_one(self, conn: psycopg.Connection[Any]) -> Any | None:
        got = self.poll_batch(conn, 1)
        return got[0] if got else None

    def ack_one(self, conn: psycopg.Connection[Any], token: Any) -> None:
        conn.execute("DELETE FROM raw_jobs WHERE id = %s", (token,))


class Pgdq:
    """pgdq through its Python wrapper."""

    name = "pgdq"

    def setup(self, conn: psycopg.Connection[Any]) -> None:
        install(conn)

    def __init__(self) -> None:
        self._queues: dict[int, Queue] = {}

    def _q(self, conn: psycopg.Connection[Any]) -> Queue:
        """One Queue per connection, as an application would hold it."""
        if id(conn) not in self._queues:
            self._queues[id(conn)] = Queue(QUEUE, conn, lease=LEASE)
        return self._queues[id(conn)]

    def enqueue_batch(self, conn: psycopg.Connection[Any], keys: list[str], payloads: list[Any]) -> None:
        self._q(conn).offer_many(list(zip(keys, payloads, strict=True)))

    def offer_one(self, conn: psycopg.Connection[Any], key: str, payload: Any) -> None:
        self._q(conn).offer(key, payload)

    def poll_batch(self, conn: psycopg.Connection[Any], n: int) -> list[Any]:
        return [d.lock_token for d in self._q(conn).poll_many(n)]

    def ack_batch(self, conn: psycopg.Connection[Any], tokens: list[Any]) -> None:
        self._q(conn).ack_many(tokens)

    def poll_one(self, conn: psycopg.Connection[Any]) -> Any | None:
        d = self._q(conn).poll()
        return None if d is None else d.lock_token

    def ack_one(self, conn: psycopg.Connection[Any], token: Any) -> None:
        self._q(conn).ack(token)


SYSTEMS: dict[str, System] = {s.name: s for s in (RawSql(), Pgdq())}
