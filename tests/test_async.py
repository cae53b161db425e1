"""AsyncQueue against a real server (the sync Queue is generated from it)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pgdq
import psycopg
import pydantic
import pytest
from pgdq import AsyncDelivery, AsyncQueue, InvalidArgument, OfferOutcome, StaleToken
from pgdq.errors import PayloadDecodeError
from psycopg_pool import AsyncConnectionPool


def test_async_round_trip(database: str, queue_name: str) -> None:
    async def main() -> None:
        async with AsyncQueue(queue_name, database) as q:
            assert await q.offer("a", {"n": 1}) is OfferOutcome.CREATED
            results = await q.offer_many([("b", 2), ("a", {"n": 1})])
            assert [r.outcome for r in results] == [
                OfferOutcome.CREATED,
                OfferOutcome.IGNORED,
            ]
            batch = await q.poll_many(10, timedelta(seconds=30))
            assert [d.key for d in batch] == ["a", "b"]
            assert all(isinstance(d, AsyncDelivery) for d in batch)
            await batch[0].ack()
            await batch[1].nack(datetime.now(UTC) + timedelta(hours=1), state=[1, 2])
            with pytest.raises(StaleToken):
                await batch[1].extend(10)
            info = await q.get("b")
            assert info is not None and info.state == [1, 2] and not info.leased
            assert (await q.stats()).delayed == 1
            assert await q.next_due() == info.due_at
            with pytest.raises(InvalidArgument):
                await q.poll_many(1, -1)
            assert await q.version() == pgdq.__version__

    asyncio.run(main())


def test_async_pool_and_transaction(database: str, queue_name: str) -> None:
    async def main() -> None:
        async with AsyncConnectionPool(database, min_size=1, max_size=2, open=False) as pool:
            q = AsyncQueue(queue_name, pool)
            async with await psycopg.AsyncConnection.connect(database) as conn:
                await q.offer("tx", 1, conn=conn)
                await conn.rollback()
            assert await q.get("tx") is None
            await q.offer("p", 1)
            d = await q.poll()
            assert d is not None
            assert await d.extend(600) > d.lease_until, "extend moves the lease end"
            await d.ack()

    asyncio.run(main())


class Order(pydantic.BaseModel):
    number: int


def test_async_poll_keeps_a_batch_with_an_undecodable_payload(database: str, queue_name: str) -> None:
    async def main() -> None:
        async with AsyncQueue(queue_name, database, payload_type=Order) as q:
            await q.offer_many([("good", Order(number=1)), ("bad", {"number": "not a number"})])
            good, bad = sorted(await q.poll_many(10), key=lambda d: d.key != "good")
            assert good.payload == Order(number=1) and good.decode_error is None
            assert isinstance(bad.decode_error, PayloadDecodeError) and bad.raw_payload == {"number": "not a number"}
            assert isinstance(bad.decode_error.__cause__, pydantic.ValidationError)
            with pytest.raises(PayloadDecodeError):
                _ = bad.payload
            await bad.nack(datetime.now(UTC) + timedelta(hours=1))
            await good.ack()
            single = await q.poll()  # nothing due: "bad" waits an hour
            assert single is None and (await q.stats()).delayed == 1

    asyncio.run(main())
