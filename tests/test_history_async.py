"""Pause and resume, headers and history (1.2) through the queue API against
a real server: pause, resume, offer(headers=), retain, history,
history_stats, typed errors for bad input. (tests/test_history.py is
generated from this file: each test runs against both APIs.)
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from conftest import unsharded
from pgdq import AsyncQueue, InvalidArgument, Message, NullArgument
from test_queue_async import future


async def test_pause_and_resume(aq: AsyncQueue) -> None:
    await aq.offer("a", 1)
    assert await aq.pause() is True
    assert await aq.pause() is False, "already paused"
    assert await aq.poll() is None and await aq.poll_many(10) == [], "a paused queue leases nothing"
    assert await aq.next_due() is None
    assert (await aq.stats()).paused is True
    assert await aq.offer("b", 2) == "created", "offers still work"
    assert await aq.cancel("b") is True
    assert await aq.resume() is True
    assert await aq.resume() is False, "already running"
    assert (await aq.stats()).paused is False
    d = await aq.poll()
    assert d is not None and d.key == "a"
    await d.ack()


async def test_headers_travel_with_the_message(aq: AsyncQueue) -> None:
    assert await aq.offer("a", 1, headers={"traceparent": "00-1"}) == "created"
    assert await aq.offer("a", 1, headers={"traceparent": "00-2"}) == "ignored", "headers decide nothing"
    info = await aq.get("a")
    assert info is not None and info.headers == {"traceparent": "00-1"}, "an ignored offer keeps the old ones"
    assert await aq.offer("a", 2, headers={"x": "y"}) == "updated"
    results = await aq.offer_many([Message("b", 1, headers={"n": 1}), ("c", 1, None, None, 0, {"n": 2}), ("d", 1)])
    assert [r.outcome for r in results] == ["created"] * 3
    peeked = {p.key: p.headers for p in await aq.peek()}
    assert peeked == {"a": {"x": "y"}, "b": {"n": 1}, "c": {"n": 2}, "d": None}
    deliveries = {d.key: d.headers for d in await aq.poll_many(10)}
    assert deliveries == peeked, "each delivery carries its message's headers"


async def test_bad_headers_are_refused_before_anything_is_written(aq: AsyncQueue) -> None:
    with pytest.raises(InvalidArgument, match="headers must be a dict"):
        await aq.offer("a", 1, headers=["not", "an", "object"])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=r"messages\[1\].headers must be a dict"):
        await aq.offer_many([Message("a", 1), Message("b", 1, headers="x")])  # type: ignore[arg-type]
    assert await aq.peek() == []


async def test_history_of_a_queue(aq: AsyncQueue) -> None:
    await aq.offer("before", 0)
    d = await aq.poll()
    assert d is not None
    await d.ack()
    assert await aq.history() == [], "nothing is kept before retain"
    await aq.retain(timedelta(days=1))
    await aq.offer("a", {"n": 1}, headers={"h": 1})
    await aq.offer("b", {"n": 2}, future(3600))
    sent = await aq.send({"n": 3}, scheduled_at=future(3600))
    first = await aq.poll_many(1)
    await first[0].nack(error="boom")
    (again,) = await aq.poll_many(1)
    await again.ack()
    await aq.cancel("b")
    await aq.cancel_id(sent)
    records = await aq.history()
    assert [(r.key, r.outcome) for r in records] == [(None, "cancelled"), ("b", "cancelled"), ("a", "acked")]
    a = records[-1]
    assert (a.payload, a.headers, a.attempts, a.last_error, a.queue) == ({"n": 1}, {"h": 1}, 2, "boom", aq.name)
    assert a.last_leased_at is not None and a.last_leased_at <= a.finished_at
    assert records[0].id == sent and records[0].last_leased_at is None
    assert [r.outcome for r in await aq.history("a")] == ["acked"]
    assert len(await aq.history(max_count=1)) == 1
    (bucket,) = await aq.history_stats(datetime.now(UTC) - timedelta(minutes=5), timedelta(hours=1))
    assert (bucket.acked, bucket.dead, bucket.cancelled) == (1, 0, 2)
    assert bucket.run_p50 is not None and bucket.lateness_p99 is not None
    await aq.retain(None)
    await aq.offer("c", 1)
    await aq.cancel("c")
    assert len(await aq.history()) == 3, "off: no new record, the old ones stay"


async def test_history_arguments_are_checked(aq: AsyncQueue) -> None:
    with pytest.raises(InvalidArgument, match="keep must be positive"):
        await aq.retain(timedelta(0))
    with pytest.raises(InvalidArgument, match="keep must be positive"):
        await aq.retain(timedelta(days=3651))
    with pytest.raises(InvalidArgument, match="keep must be a timedelta"):
        await aq.retain("1 day")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="bucket must be from 1 second to 1 day"):
        await aq.history_stats(future(-60), 0.5)
    with pytest.raises(InvalidArgument, match="bucket must be whole seconds, got 23:59:59.5"):
        await aq.history_stats(future(-3600), 86399.5)  # 1.3: it read every record of the range
    with pytest.raises(InvalidArgument, match="since must be timezone-aware"):
        await aq.history_stats(datetime(2024, 1, 1), 60)  # noqa: DTZ001
    with pytest.raises(NullArgument, match="max_count must not be NULL"):
        await aq.history(max_count=None)  # type: ignore[arg-type]
    assert await aq.history(max_count=0) == []


async def test_finish_records_the_message_acked(aq: AsyncQueue) -> None:
    """finish (dq_finish, 1.3) deletes a message by key as done: its record
    says acked, where cancel's says cancelled."""
    await aq.retain(timedelta(days=1))
    await aq.offer("done", 1)
    assert await aq.poll() is not None
    assert await aq.finish("done") is True
    assert await aq.finish("done") is False, "none left"
    await aq.offer("dropped", 2)
    assert await aq.cancel("dropped") is True
    records = [(r.key, r.outcome, r.attempts) for r in await aq.history()]
    assert records == [("dropped", "cancelled", 0), ("done", "acked", 1)]


@unsharded("writes a backlog of records into dq_history, which lives on the partitions")
async def test_expiry_does_a_bounded_part_of_a_backlog(database: str, aq: AsyncQueue) -> None:
    """A statement that records n records expires at most max(1024, 2 n) of
    its queue's aged-out ones (1.3: an ack of 600 deleted all of a backlog,
    up to 100,000, 0.5 s instead of 36 ms); 600 records: exactly 1,200."""
    await aq.retain(timedelta(days=1))
    async with await psycopg.AsyncConnection.connect(database, autocommit=True) as admin:
        await admin.execute(
            "INSERT INTO dq_history (queue, id, outcome, payload, channel, priority, created_at, scheduled_at,"
            + " finished_at, attempts) SELECT %s, -i, 'acked', '1', '', 0, t, t, t, 1"
            + " FROM generate_series(1, 5000) AS i,"
            + " LATERAL (SELECT now() - interval '2 days' - i * interval '1 ms') AS n (t)",
            (aq.name,),
        )
        await aq.send_many([1] * 600)
        assert await aq.ack_many([d.lock_token for d in await aq.poll_many(600)]) == 600
        cur = await admin.execute("SELECT count(*) FROM dq_history WHERE queue = %s AND id < 0", (aq.name,))
        assert await cur.fetchone() == (3800,), "the oldest 1,200 aged-out records, no more"


async def test_browse_pages_and_run_now(aq: AsyncQueue) -> None:
    for i in range(1, 8):
        await aq.offer(f"order-{i}", i, future(60 * i))
    await aq.offer("user-1", 0, future(30))
    first = await aq.browse(max_count=3)
    assert [m.key for m in first] == ["user-1", "order-1", "order-2"]
    second = await aq.browse(after=first[-1], max_count=3)
    assert [m.key for m in second] == ["order-3", "order-4", "order-5"]
    after_third = await aq.browse(key_prefix="order-", after=second[0])
    assert [m.key for m in after_third] == [f"order-{i}" for i in (4, 5, 6, 7)]
    seventh = (await aq.browse(key_prefix="order-7"))[0]
    assert seventh.id is not None and await aq.run_now(seventh.id) is True
    assert await aq.run_now(seventh.id) is False, "already due"
    d = await aq.poll()
    assert d is not None and d.key == "order-7"
    with pytest.raises(InvalidArgument, match="key_prefix must be 1 to 200 characters long"):
        await aq.browse(key_prefix="")
