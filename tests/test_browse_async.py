"""Browsing and tokens against a real server: AsyncQueue.peek, nack(error=)
kept as last_error, and AsyncClient (what belongs to no one queue: lock
tokens, every queue's stats and schedules). tests/test_browse.py is the
generated sync twin."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest
from pgdq import AsyncClient, AsyncQueue, InvalidArgument, PayloadDecodeError, StaleToken


@dataclass
class Job:
    n: int


@pytest.fixture
async def other(database: str, queue_name: str) -> AsyncIterator[AsyncQueue]:
    """A second queue of the test's own, purged before and after."""
    async with AsyncQueue(queue_name[:90] + "_other", database) as queue:
        await queue.purge()
        yield queue
        await queue.purge()
        for schedule in await queue.schedules():
            await queue.unschedule(schedule.name)


def later(hours: float = 1) -> datetime:
    return datetime.now(UTC) + timedelta(hours=hours)


async def test_nack_keeps_the_error_as_last_error(aq: AsyncQueue) -> None:
    await aq.offer_many([("a", 1), ("b", 2)])
    first, second = await aq.poll_many(2)
    assert await aq.nack(first.lock_token, later(), error="Traceback ...\nValueError: a broke")
    await second.nack(later(2), {"tries": 1}, error="b broke")
    peeked = {m.key: m for m in await aq.peek()}
    assert peeked["a"].last_error == "Traceback ...\nValueError: a broke"
    assert peeked["b"].last_error == "b broke" and peeked["b"].state == {"tries": 1}
    assert await aq.poll() is None, "both wait an hour or more"
    with pytest.raises(StaleToken):
        await second.nack(error="too late")


async def test_a_nack_without_error_clears_the_last_one(aq: AsyncQueue) -> None:
    await aq.offer("a", 1)
    delivery = await aq.poll()
    assert delivery is not None
    await delivery.nack(error="first try failed")
    delivery = await aq.poll()
    assert delivery is not None
    await delivery.nack()
    (peeked,) = await aq.peek()
    assert peeked.last_error is None and peeked.attempts == 2


async def test_peek_shows_each_condition_without_changing_anything(aq: AsyncQueue) -> None:
    await aq.offer("leased", 1)
    delivery = await aq.poll(timedelta(minutes=5))
    assert delivery is not None
    await aq.offer_many([("due", 2), ("delayed", 3, later())])
    everything = await aq.peek()
    assert [m.key for m in everything] == ["due", "leased", "delayed"], "by due time (a lease's end)"
    due, leased, delayed = everything
    assert (due.payload, due.raw_payload, due.leased, due.lease_until, due.attempts) == (2, 2, False, None, 0)
    assert leased.leased and leased.lease_until == delivery.lease_until == leased.due_at and leased.attempts == 1
    assert not delayed.leased and delayed.due_at == delayed.scheduled_at > datetime.now(UTC)
    assert await aq.peek("due") == [due]
    assert await aq.peek("leased") == [leased]
    assert await aq.peek("delayed") == [delayed]
    assert await aq.peek(max_count=2) == [due, leased]
    assert await aq.peek() == everything, "peeking changes nothing"
    assert await aq.ack(delivery.lock_token), "peeking leaves the lease alone"


async def test_peek_refuses_bad_arguments(aq: AsyncQueue) -> None:
    with pytest.raises(InvalidArgument, match="which"):
        await aq.peek("ready")
    with pytest.raises(InvalidArgument, match="max_count"):
        await aq.peek(max_count=0)


async def test_peek_keeps_a_payload_the_codec_cannot_decode(database: str, aq: AsyncQueue) -> None:
    await aq.offer_many([("good", {"n": 1}), ("bad", [1, 2])])
    async with AsyncQueue(aq.name, database, payload_type=Job) as typed:
        peeked = {m.key: m for m in await typed.peek()}
    assert peeked["good"].payload == Job(1) and peeked["good"].decode_error is None
    assert peeked["bad"].raw_payload == [1, 2] and isinstance(peeked["bad"].decode_error, PayloadDecodeError)
    with pytest.raises(PayloadDecodeError, match="'bad'"):
        _ = peeked["bad"].payload


async def test_client_tokens_of_any_queue(database: str, aq: AsyncQueue, other: AsyncQueue) -> None:
    await aq.offer_many([("a", 1), ("b", 2), ("c", 3)])
    await other.offer_many([("x", 1), ("y", 2)])
    a, b, c = await aq.poll_many(3)
    x, y = await other.poll_many(2)
    async with AsyncClient(database) as client:
        assert await client.ack_many([a.lock_token, x.lock_token, uuid4()]) == 2
        assert not await client.ack(a.lock_token), "stale"
        until = await client.extend(b.lock_token, timedelta(minutes=10))
        assert until is not None and until > b.lease_until
        assert await client.extend(a.lock_token, 60) is None
        assert await client.nack(y.lock_token, later(), {"s": 1}, error="y broke")
        assert await client.dead_letter(c.lock_token, "c broke")
        assert await client.version() == await aq.version()
    (y_now,) = await other.peek()
    assert (y_now.key, y_now.state, y_now.last_error, y_now.leased) == ("y", {"s": 1}, "y broke", False)
    assert [d.key for d in await aq.dead_letters()] == ["c"]
    assert await b.extend(60) > datetime.now(UTC), "b is still leased"


async def test_client_stats_and_schedules_of_every_queue(database: str, aq: AsyncQueue, other: AsyncQueue) -> None:
    await aq.offer_many([("a", 1), ("b", 2, later())])
    await other.offer("x", 1)
    await aq.schedule("hourly", "0 * * * *", payload={"p": 1})
    await other.schedule("daily", "0 9 * * *", "Europe/Paris")
    async with AsyncClient(database) as client:
        stats = {s.queue: s for s in await client.stats()}
        assert (stats[aq.name].ready, stats[aq.name].delayed) == (1, 1)
        assert stats[other.name].ready == 1
        assert [s.queue for s in await client.stats(aq.name)] == [aq.name]
        schedules = {(s.queue, s.name): s for s in await client.schedules()}
        assert schedules[(aq.name, "hourly")].payload == {"p": 1}
        assert schedules[(other.name, "daily")].timezone == "Europe/Paris"
        assert [s.name for s in await client.schedules(other.name)] == ["daily"]
    assert await aq.stats() == stats[aq.name]
    assert await aq.schedules() == [schedules[(aq.name, "hourly")]]
    await aq.unschedule("hourly")
