"""Chaos agents, run as separate processes by test_chaos.py.

    python agents.py producer DSN QUEUE FIRST COUNT
    python agents.py consumer DSN QUEUE

Both reconnect by themselves after any connection error (a server restart,
a killed backend), with a short backoff. Producers log each committed batch
in chaos_batches in the same transaction as the offers (an outbox), so a
retried batch is never offered twice. Consumers log every delivery in
chaos_deliveries and each ack in chaos_acks in the ack's own transaction, so
the logs are exactly what happened in the queue.

With PGDQ_CHAOS_ROUTER=1, DSN is a pgdq.shard router (the logs are tables of
the router's database) and a call there commits on its partition by itself,
so no outbox: a producer offers a batch again after an error and logs it in
chaos_retried; a consumer logs each ack it begins in chaos_unsure_acks (the
partition commits it even if the consumer is killed before logging it).
"""

from __future__ import annotations

import os
import random
import sys
import time
from datetime import timedelta
from typing import Any

import psycopg
from pgdq import Queue
from stopping import until_sigterm

LEASE = timedelta(seconds=2)
BATCH = 25


def connect(dsn: str, autocommit: bool) -> psycopg.Connection[Any]:
    """Connect, retrying until the server answers (it may be restarting)."""
    delay = 0.05
    while True:
        try:
            return psycopg.connect(dsn, autocommit=autocommit, connect_timeout=3)
        except psycopg.OperationalError:
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


ROUTER = os.environ.get("PGDQ_CHAOS_ROUTER") == "1"
# What a call may fail with while a server restarts: through a router, a
# partition's failure comes back as the router's error of any class.
LOST = (psycopg.Error,) if ROUTER else (psycopg.OperationalError, psycopg.InterfaceError)


def produce(dsn: str, queue: str, first: int, count: int) -> None:
    """Offer keys first..first+count-1 in batches, due now or within 5 s."""
    rng = random.Random(first)
    batches = [range(i, min(i + BATCH, first + count)) for i in range(first, first + count, BATCH)]
    conn = connect(dsn, autocommit=ROUTER)
    for batch_no, keys in enumerate(batches):
        batch_id = f"{first}:{batch_no}"
        while True:
            try:
                with conn.transaction():
                    if conn.execute("SELECT 1 FROM chaos_batches WHERE id = %s", (batch_id,)).fetchone():
                        break  # committed before the connection broke
                    rows = conn.execute("SELECT now()").fetchone()
                    assert rows is not None
                    messages = [
                        (f"key-{k:05d}", {"k": k}, rows[0] + timedelta(seconds=rng.choice([0, 0, 1, 3, 5])))
                        for k in keys
                    ]
                    Queue(queue, conn).offer_many(messages, conn=conn)
                    conn.execute("INSERT INTO chaos_batches (id, n) VALUES (%s, %s)", (batch_id, len(messages)))
                break
            except LOST:
                conn.close()
                conn = connect(dsn, autocommit=ROUTER)
                if ROUTER:  # the offers may have committed on the partition
                    conn.execute(
                        "INSERT INTO chaos_retried (id, first, n) VALUES (%s, %s, %s)", (batch_id, keys[0], len(keys))
                    )
        time.sleep(rng.uniform(0.05, 0.25))
    conn.close()


def consume(dsn: str, queue: str) -> None:
    """Poll with a 2 s lease, work a little, ack; until SIGTERM."""
    stopped = until_sigterm()
    rng = random.Random(os.getpid())
    # PGDQ_CHAOS_BREAK_ACK=N: every Nth ack is logged but never sent (a broken
    # consumer), so the test can show that the checks catch it
    break_every = int(os.environ.get("PGDQ_CHAOS_BREAK_ACK", "0"))
    handled = 0
    conn = connect(dsn, autocommit=True)
    while not stopped():
        try:
            q = Queue(queue, conn)
            d = q.poll(LEASE)
            if d is None:
                time.sleep(0.02)
                continue
            conn.execute(
                "INSERT INTO chaos_deliveries (key, attempt, pid, polled_at, lease_until) VALUES (%s, %s, %s, %s, %s)",
                (d.key, d.attempts, os.getpid(), d.lease_until - LEASE, d.lease_until),
            )
            time.sleep(rng.uniform(0, 0.01))  # the "work"
            handled += 1
            broken = break_every > 0 and handled % break_every == 0
            if ROUTER:  # the ack commits on its partition by itself: what if we die before logging it?
                conn.execute("INSERT INTO chaos_unsure_acks (key, attempt) VALUES (%s, %s)", (d.key, d.attempts))
            with conn.transaction():
                if broken or q.ack(d.lock_token, conn=conn):
                    conn.execute(
                        "INSERT INTO chaos_acks (key, attempt, pid) VALUES (%s, %s, %s)",
                        (d.key, d.attempts, os.getpid()),
                    )
        except LOST:
            conn.close()
            conn = connect(dsn, autocommit=True)
    conn.close()


if __name__ == "__main__":
    role, dsn, queue, *rest = sys.argv[1:]
    if role == "producer":
        produce(dsn, queue, int(rest[0]), int(rest[1]))
    else:
        consume(dsn, queue)
