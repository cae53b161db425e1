"""Transactional enqueue: a message is offered atomically with the caller's
own writes, on the caller's connection. (tests/test_transactional.py is
generated from tests/test_transactional_async.py: each test runs against
both APIs.)"""

from __future__ import annotations

import psycopg
from conftest import IN_YOUR_TRANSACTION, unsharded
from pgdq import AsyncQueue, OfferOutcome

pytestmark = unsharded(IN_YOUR_TRANSACTION)


async def test_rollback_leaves_no_message(aq: AsyncQueue, database: str) -> None:
    async with await psycopg.AsyncConnection.connect(database) as conn:  # not autocommit: one transaction
        await conn.execute("CREATE TEMP TABLE orders (id int)")
        await conn.execute("INSERT INTO orders VALUES (1)")
        assert await aq.offer("close-order-1", {"order": 1}, conn=conn) is OfferOutcome.CREATED
        await aq.offer_many([("close-order-2", {"order": 2})], conn=conn)
        assert await aq.get("close-order-1", conn=conn) is not None, "visible inside the transaction"
        assert await aq.get("close-order-1") is None, "invisible outside it before commit"
        await conn.rollback()
    assert await aq.get("close-order-1") is None and await aq.get("close-order-2") is None
    assert (await aq.stats()).ready == 0


async def test_commit_publishes_with_the_callers_writes(aq: AsyncQueue, database: str) -> None:
    async with await psycopg.AsyncConnection.connect(database) as conn:
        async with conn.transaction():
            await conn.execute("CREATE TEMP TABLE tx_orders (id int)")
            await conn.execute("INSERT INTO tx_orders VALUES (1)")
            await aq.offer("close-order-1", {"order": 1}, conn=conn)
            assert await aq.get("close-order-1") is None, "invisible outside the transaction before commit"
        assert await aq.get("close-order-1") is not None


async def test_ack_in_the_callers_transaction(aq: AsyncQueue, database: str) -> None:
    await aq.offer("k", 1)
    d = await aq.poll()
    assert d is not None
    async with await psycopg.AsyncConnection.connect(database) as conn:
        await d.ack(conn=conn)
        await conn.rollback()
    assert await aq.get("k") is not None, "a rolled-back ack leaves the message"
    await d.ack()
    assert await aq.get("k") is None
