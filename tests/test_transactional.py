"""Transactional enqueue: a message is offered atomically with the caller's
own writes, on the caller's connection."""

from __future__ import annotations

import psycopg
from pgdq import OfferOutcome, Queue


def test_rollback_leaves_no_message(database: str, queue_name: str) -> None:
    q = Queue(queue_name, database)
    with psycopg.connect(database) as conn:  # not autocommit: one transaction
        conn.execute("CREATE TEMP TABLE orders (id int)")
        conn.execute("INSERT INTO orders VALUES (1)")
        assert q.offer("close-order-1", {"order": 1}, conn=conn) is OfferOutcome.CREATED
        q.offer_many([("close-order-2", {"order": 2})], conn=conn)
        assert q.get("close-order-1", conn=conn) is not None, "visible inside the transaction"
        assert q.get("close-order-1") is None, "invisible outside it before commit"
        conn.rollback()
    assert q.get("close-order-1") is None and q.get("close-order-2") is None
    assert q.stats().ready == 0


def test_commit_publishes_with_the_callers_writes(database: str, queue_name: str) -> None:
    q = Queue(queue_name, database)
    with psycopg.connect(database) as conn:
        with conn.transaction():
            conn.execute("CREATE TABLE IF NOT EXISTS tx_orders (id int)")
            conn.execute("INSERT INTO tx_orders VALUES (1)")
            q.offer("close-order-1", {"order": 1}, conn=conn)
        assert q.get("close-order-1") is not None
        conn.execute("DROP TABLE tx_orders")
        conn.commit()


def test_ack_in_the_callers_transaction(database: str, queue_name: str) -> None:
    q = Queue(queue_name, database)
    q.offer("k", 1)
    d = q.poll()
    assert d is not None
    with psycopg.connect(database) as conn:
        d.ack(conn=conn)
        conn.rollback()
    assert q.get("k") is not None, "a rolled-back ack leaves the message"
    d.ack()
    assert q.get("k") is None
