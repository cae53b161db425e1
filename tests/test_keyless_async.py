"""Keyless messages (1.2) through the queue API against a real server:
send and send_many, key None in every result, the by-id methods (get_id,
cancel_id, redrive_id, purge_dead_letter_id), typed errors for bad input.
(tests/test_keyless.py is generated from this file: each test runs against
both APIs.)
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from conftest import owner
from pgdq import AsyncQueue, InvalidArgument, NullArgument, StaleToken
from pgdq.errors import PayloadDecodeError
from test_queue_async import CountingCursor, future


def stored(database: str, queue: str) -> list[tuple[Any, ...]]:
    """(id, key, payload, scheduled_at, channel, priority, headers) of queue's
    messages as stored, by id: what no read of the API returns (headers)."""
    with psycopg.connect(owner(database, queue), autocommit=True) as c:
        return c.execute(
            "SELECT id, key, payload, scheduled_at, channel, priority, headers FROM dq_messages"
            + " WHERE queue = %s ORDER BY id",
            (queue,),
        ).fetchall()


@dataclasses.dataclass
class Reminder:
    user: int


async def test_send_round_trip(aq: AsyncQueue, database: str) -> None:
    at = future(3600)
    first = await aq.send({"n": 1})
    second = await aq.send([2], scheduled_at=at, channel="partner", priority=5, headers={"trace": "t-1"})
    again = await aq.send({"n": 1})
    assert first < second < again, "never deduplicated: each send is a new message, ids ascending"
    info = await aq.get_id(second)
    assert info is not None and info.key is None and info.payload == [2] and info.scheduled_at == at
    assert (info.queue, info.channel, info.priority, info.attempts, info.leased) == (aq.name, "partner", 5, 0, False)
    rows = stored(database, aq.name)
    assert [(r[0], r[1], r[6]) for r in rows] == [
        (first, None, None),
        (second, None, {"trace": "t-1"}),
        (again, None, None),
    ]
    peeked = await aq.peek()
    assert [(p.id, p.key, p.payload) for p in peeked] == [
        (first, None, {"n": 1}),
        (again, None, {"n": 1}),
        (second, None, [2]),
    ]
    d = await aq.poll(timedelta(seconds=30))
    assert d is not None and (d.id, d.key, d.payload, d.attempts) == (first, None, {"n": 1}, 1)
    await d.ack()
    assert await aq.get_id(first) is None
    assert (await aq.stats()).ready == 1 and (await aq.stats()).delayed == 1


async def test_send_many_ids_in_input_order(aq: AsyncQueue, database: str) -> None:
    soon, later = future(600), future(1200)
    payloads = [{"n": n} for n in range(5)]
    ids = await aq.send_many(
        payloads,
        scheduled_ats=[later, None, soon, None, None],
        channels=[None, "c1", None, None, None],
        priorities=[0, 0, 7, None, 0],
        headers=[None, {"a": 1}, None, None, {"b": [2]}],
    )
    assert len(ids) == 5 and ids == sorted(ids) and len(set(ids)) == 5, "ascending ids, one per payload"
    rows = stored(database, aq.name)
    assert [r[0] for r in rows] == ids and all(r[1] is None for r in rows)
    assert [r[2] for r in rows] == payloads, "the ids in input order"
    assert rows[0][3] == later and rows[2][3] == soon and rows[1][3] == rows[3][3] == rows[4][3], "None: now"
    assert [(r[4], r[5], r[6]) for r in rows] == [
        ("", 0, None),
        ("c1", 0, {"a": 1}),
        ("", 7, None),
        ("", 0, None),
        ("", 0, {"b": [2]}),
    ]
    for id_, payload in zip(ids, payloads, strict=True):
        info = await aq.get_id(id_)
        assert info is not None and info.key is None and info.payload == payload
    plain = await aq.send_many(["x", "y", None])  # no columns: the plain path
    assert plain == sorted(plain) and plain[0] > ids[-1]
    due = [(p.id, p.raw_payload) for p in await aq.peek("due") if p.id in plain]
    assert due == [(plain[0], "x"), (plain[1], "y"), (plain[2], None)], "by due time, then id"
    assert await aq.send_many([]) == []
    batch = await aq.poll_many(10)
    assert {d.id for d in batch} == {ids[1], ids[3], ids[4], *plain} and all(d.key is None for d in batch)


async def test_a_keyless_delivery_is_acked_nacked_extended_and_dead_lettered(aq: AsyncQueue) -> None:
    a, b, c = await aq.send_many([1, 2, 3])
    first, second, third = await aq.poll_many(3, timedelta(seconds=30))
    assert [(d.id, d.key) for d in (first, second, third)] == [(a, None), (b, None), (c, None)]
    assert await first.extend(600) > first.lease_until
    await first.nack(state={"step": 2}, error="later")
    with pytest.raises(StaleToken, match=f"cannot extend message {a}:"):
        await first.extend(60)
    again = await aq.poll()
    assert again is not None and (again.id, again.attempts, again.redelivery, again.state) == (a, 2, True, {"step": 2})
    await again.ack()
    with pytest.raises(StaleToken, match=f"cannot ack message {a}:"):
        await again.ack()
    await second.dead_letter("broken")
    with pytest.raises(StaleToken, match=f"cannot dead-letter message {b}:"):
        await second.dead_letter("again")
    assert await aq.dead_letter(third.lock_token, "also broken") is True
    with pytest.raises(StaleToken, match=f"cannot nack message {c}:"):
        await third.nack()
    dead = await aq.dead_letters()
    assert [(d.key, d.id, d.payload, d.attempts, d.error) for d in dead] == [
        (None, b, 2, 1, "broken"),
        (None, c, 3, 1, "also broken"),
    ]
    assert (await aq.stats()).ready + (await aq.stats()).leased == 0
    await aq.purge_dead_letters()


async def test_redrive_id_makes_a_new_message_that_get_id_finds(aq: AsyncQueue) -> None:
    await aq.send_many([{"n": 1}, {"n": 2}], channels=["c", None], priorities=[3, None])
    for d in await aq.poll_many(2):
        await d.dead_letter("broken")
    one, two = sorted(await aq.dead_letters(), key=lambda d: d.id or 0)
    assert one.id is not None and two.id is not None and one.payload == {"n": 1}
    at = future(600)
    new = await aq.redrive_id(one.id, at)
    assert new is not None and new > two.id, "a new message, under a new id"
    info = await aq.get_id(new)
    assert info is not None and info.key is None and info.payload == {"n": 1} and info.scheduled_at == at
    assert (info.channel, info.priority, info.attempts) == ("c", 3, 0), "back to its channel and priority"
    assert await aq.get_id(one.id) is None, "the old id is gone"
    assert await aq.redrive_id(one.id) is None, "no such dead letter any more"
    assert [d.id for d in await aq.dead_letters()] == [two.id]
    assert await aq.redrive() == 1, "redrive of every dead letter takes keyless ones too"
    assert await aq.dead_letters() == [] and (await aq.stats()).ready == 1


async def test_redrive_id_of_a_keyed_dead_letter(aq: AsyncQueue) -> None:
    await aq.offer("k", 1)
    d = await aq.poll()
    assert d is not None
    await d.dead_letter("broken")
    (dead,) = await aq.dead_letters()
    assert dead.key == "k" and dead.id == d.id
    await aq.offer("k", 2)
    assert dead.id is not None and await aq.redrive_id(dead.id) is None, "its key has a live message again"
    assert [x.key for x in await aq.dead_letters()] == ["k"], "the dead letter stays"
    assert await aq.cancel("k") is True
    new = await aq.redrive_id(dead.id)
    info = await aq.get("k")
    assert new is not None and info is not None and info.payload == 1 and await aq.get_id(new) == info
    assert await aq.dead_letters() == []


async def test_purge_dead_letter_id(aq: AsyncQueue) -> None:
    await aq.send_many([1, 2])
    await aq.offer("k", 3)
    for d in await aq.poll_many(3):
        await d.dead_letter("broken")
    one, two, keyed = sorted(await aq.dead_letters(), key=lambda x: x.id or 0)
    assert (one.key, two.key, keyed.key) == (None, None, "k")
    assert one.id is not None and keyed.id is not None
    assert await aq.purge_dead_letter_id(one.id) == 1
    assert await aq.purge_dead_letter_id(one.id) == 0
    assert await aq.purge_dead_letter_id(keyed.id) == 1, "a keyed dead letter by its id too"
    assert [d.id for d in await aq.dead_letters()] == [two.id]
    await aq.purge_dead_letters()


async def test_cancel_id(aq: AsyncQueue) -> None:
    waiting, leased = await aq.send_many([1, 2], scheduled_ats=[future(600), None])
    await aq.offer("k", 3, future(900))
    d = await aq.poll()
    assert d is not None and d.id == leased
    assert await aq.cancel_id(leased) is True, "leased or not"
    assert await aq.cancel_id(leased) is False
    with pytest.raises(StaleToken):
        await d.ack()
    assert await aq.cancel_id(waiting) is True and await aq.get_id(waiting) is None
    (keyed,) = await aq.peek()
    assert keyed.key == "k" and keyed.id is not None
    info = await aq.get_id(keyed.id)
    assert info is not None and info.key == "k", "a keyed message by its id too"
    assert await aq.cancel_id(keyed.id) is True and await aq.get("k") is None
    assert (await aq.stats()).leased == 0


async def test_another_queues_ids_are_not_found(aq: AsyncQueue, database: str) -> None:
    async with AsyncQueue(f"{aq.name}_b", database) as other:
        await other.purge()
        await other.purge_dead_letters()
        try:
            dies, live = await other.send_many(["dies", "live"])
            (d,) = await other.poll_many(1, 600)
            await d.dead_letter("broken")
            assert d.id == dies
            assert await aq.get_id(live) is None and await aq.get_id(dies) is None
            assert await aq.cancel_id(live) is False
            assert await aq.redrive_id(dies) is None and await aq.purge_dead_letter_id(dies) == 0
            info = await other.get_id(live)
            assert info is not None and info.payload == "live", "untouched in its own queue"
            assert [x.id for x in await other.dead_letters()] == [dies]
            assert await aq.get_id(2**63 - 1) is None, "no such id at all"
        finally:
            await other.purge()
            await other.purge_dead_letters()


async def test_bad_input_is_typed_and_writes_nothing(aq: AsyncQueue, database: str) -> None:
    naive = datetime(2030, 1, 1)
    bad_sends = [
        (InvalidArgument, "scheduled_at must be timezone-aware", lambda: aq.send(1, scheduled_at=naive)),
        (InvalidArgument, "payload is not JSON serialisable", lambda: aq.send(object())),
        (InvalidArgument, "priority must be an int", lambda: aq.send(1, priority=True)),
        (InvalidArgument, "priority must be between", lambda: aq.send(1, priority=2**31)),
        (InvalidArgument, "headers must be a dict", lambda: aq.send(1, headers=[1])),
        (InvalidArgument, "headers is not JSON serialisable", lambda: aq.send(1, headers={"x": object()})),
        (InvalidArgument, "channel", lambda: aq.send(1, channel="")),  # the server's check
        (InvalidArgument, "payloads must be a sequence", lambda: aq.send_many("abc")),
        (
            InvalidArgument,
            r"scheduled_ats must be None or have as many elements as payloads \(2\), got 1",
            lambda: aq.send_many([1, 2], scheduled_ats=[None]),
        ),
        (InvalidArgument, "channels must be None or have as many", lambda: aq.send_many([1], channels=[None, None])),
        (InvalidArgument, "priorities must be a sequence", lambda: aq.send_many([1], priorities=3)),
        (
            InvalidArgument,
            r"scheduled_ats\[1\] must be timezone-aware",
            lambda: aq.send_many([1, 2], scheduled_ats=[None, naive]),
        ),
        (InvalidArgument, r"priorities\[0\] must be an int", lambda: aq.send_many([1], priorities=["1"])),
        (InvalidArgument, r"headers\[1\] must be a dict", lambda: aq.send_many([1, 2], headers=[None, "x"])),
        (InvalidArgument, r"channels\[2\]", lambda: aq.send_many([1, 2], channels=["ok", ""])),  # the server's
        (InvalidArgument, "payload is not JSON serialisable", lambda: aq.send_many([1, object()])),
        (InvalidArgument, "id must be an int", lambda: aq.get_id("1")),
        (InvalidArgument, "id must be between", lambda: aq.cancel_id(2**63)),
        (InvalidArgument, "scheduled_at must be timezone-aware", lambda: aq.redrive_id(1, naive)),
        (InvalidArgument, "id must be an int", lambda: aq.purge_dead_letter_id(1.0)),
    ]
    for error, message, call in bad_sends:
        with pytest.raises(error, match=message) as caught:
            await call()
        assert type(caught.value) is error and caught.value.sqlstate == "22023"
    for null_call in (
        lambda: aq.get_id(None),
        lambda: aq.cancel_id(None),
        lambda: aq.redrive_id(None),
        lambda: aq.purge_dead_letter_id(None),
    ):
        with pytest.raises(NullArgument, match="id must not be NULL") as null:
            await null_call()
        assert null.value.sqlstate == "22004"
    async with AsyncQueue("x" * 101, database) as too_long:
        with pytest.raises(InvalidArgument, match="queue must be 1 to 100"):
            await too_long.send(1)
        with pytest.raises(InvalidArgument, match="queue must be 1 to 100"):
            await too_long.send_many([1])
    assert stored(database, aq.name) == [] and await aq.peek() == []


async def test_an_undecodable_keyless_payload_is_named_by_its_id(aq: AsyncQueue, database: str) -> None:
    async with AsyncQueue(aq.name, database, payload_type=Reminder) as typed:
        good, bad = await typed.send_many([Reminder(1), "text"])
        info = await typed.get_id(bad)
        assert info is not None and isinstance(info.decode_error, PayloadDecodeError)
        assert f"payload of message {bad} in queue '{aq.name}'" in str(info.decode_error)
        peeked = {p.id: p for p in await typed.peek()}
        assert peeked[good].payload == Reminder(1)
        with pytest.raises(PayloadDecodeError, match=f"payload of message {bad} "):
            _ = peeked[bad].payload
        batch = {d.id: d for d in await typed.poll_many(2)}
        with pytest.raises(PayloadDecodeError, match=f"payload of message {bad} "):
            _ = batch[bad].payload
        for d in batch.values():
            await d.dead_letter("given up")
        dead = {d.id: d for d in await typed.dead_letters()}
        assert dead[good].payload == Reminder(1)
        with pytest.raises(PayloadDecodeError, match=f"payload of message {bad} "):
            _ = dead[bad].payload
    await aq.purge_dead_letters()


async def test_each_keyless_method_is_one_statement(database: str, queue_name: str) -> None:
    async with await psycopg.AsyncConnection.connect(database, autocommit=True, cursor_factory=CountingCursor) as c:
        aq = AsyncQueue(queue_name, c)
        calls = [
            lambda: aq.send(1),
            lambda: aq.send(1, scheduled_at=future(60), channel="c", priority=1, headers={"h": 1}),
            lambda: aq.send_many([1, 2]),
            lambda: aq.send_many([1], scheduled_ats=[future(60)], channels=["c"], priorities=[1], headers=[{"h": 1}]),
            lambda: aq.get_id(1),
            lambda: aq.cancel_id(1),
            lambda: aq.redrive_id(1),
            lambda: aq.purge_dead_letter_id(1),
        ]
        for call in calls:
            CountingCursor.statements.clear()
            await call()
            assert len(CountingCursor.statements) == 1
            text = bytes(CountingCursor.statements[0]).decode()
            assert text.startswith("SELECT") and "dq_" in text
        await aq.purge()
