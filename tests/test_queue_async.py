"""The queue API against a real server: every method, typed results and
errors, payload codecs, sources (conninfo, connection, pool, your own
transaction), and one statement per call. (tests/test_queue.py is generated
from tests/test_queue_async.py: each test runs against both APIs.)
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import pgdq
import psycopg
import pydantic
import pytest
from conftest import IN_YOUR_TRANSACTION, JsonText, unsharded
from pgdq import (
    AsyncClient,
    AsyncDelivery,
    AsyncQueue,
    InvalidArgument,
    Message,
    NullArgument,
    OfferOutcome,
    QueueStats,
    StaleToken,
)
from pgdq.codec import UnreadableJson
from pgdq.errors import PayloadDecodeError
from psycopg_pool import AsyncConnectionPool


class CountingCursor(psycopg.AsyncCursor[Any]):
    """Counts the statements a connection sends."""

    statements: ClassVar[list[bytes | str]] = []

    async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> CountingCursor:  # type: ignore[override]
        CountingCursor.statements.append(query)
        await super().execute(query, params, **kwargs)
        return self


def future(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


async def test_offer_outcomes(aq: AsyncQueue) -> None:
    assert await aq.offer("a", {"n": 1}) is OfferOutcome.CREATED
    assert await aq.offer("a", {"n": 1}) is OfferOutcome.IGNORED
    assert await aq.offer("a", {"n": 2}) is OfferOutcome.UPDATED
    assert await aq.offer("a", {"n": 3}, can_update=False) is OfferOutcome.IGNORED
    info = await aq.get("a")
    assert info is not None and info.payload == {"n": 2} and info.attempts == 0 and not info.leased


async def test_offer_many_in_order(aq: AsyncQueue) -> None:
    at = future(60)
    results = await aq.offer_many([("a", 1), Message("b", 2, at), ("a", 1), ("a", 5)])
    assert [(r.key, r.outcome.value) for r in results] == [
        ("a", "created"),
        ("b", "created"),
        ("a", "ignored"),
        ("a", "updated"),
    ]
    info = await aq.get("b")
    assert info is not None and info.scheduled_at == at


async def test_poll_ack_cycle(aq: AsyncQueue) -> None:
    await aq.offer("later", "x", future(3600))
    await aq.offer("now", {"hello": "world"})
    d = await aq.poll(timedelta(seconds=30))
    assert isinstance(d, AsyncDelivery)
    assert d.key == "now" and d.payload == {"hello": "world"} and d.attempts == 1 and not d.redelivery
    assert d.queue == aq.name and d.state is None
    assert timedelta(seconds=25) < d.lease_until - datetime.now(UTC) <= timedelta(seconds=30)
    assert await aq.poll() is None, "the other message is not due yet"
    await d.ack()
    with pytest.raises(StaleToken):
        await d.ack()
    assert await aq.get("now") is None
    later = await aq.get("later")
    assert later is not None
    assert await aq.stats() == QueueStats(aq.name, 0, 1, 0, None, later.scheduled_at, False)


async def test_nack_extend_and_stale(aq: AsyncQueue) -> None:
    await aq.offer("k", 1)
    d = await aq.poll(5)
    assert d is not None
    until = await d.extend(timedelta(minutes=10))
    assert until > d.lease_until
    await d.nack(state={"step": 2})
    with pytest.raises(StaleToken):
        await d.extend(60)
    with pytest.raises(StaleToken):
        await d.nack()
    again = await aq.poll()
    assert again is not None and again.attempts == 2 and again.redelivery and again.state == {"step": 2}
    assert again.id == d.id
    assert await aq.offer("k", 99) is OfferOutcome.UPDATED
    with pytest.raises(StaleToken):
        await again.ack()
    assert await aq.ack(None) is False and await aq.nack(None) is False and await aq.extend(None, 5) is None
    assert await aq.ack_many(None) == 0


async def test_a_queue_takes_only_its_own_lock_tokens(aq: AsyncQueue, database: str) -> None:
    """Tokens in their queue (1.2): a queue's token methods and its deliveries
    pass its name, so another queue's token is stale there and its message is
    untouched; a Client takes a token of any queue."""
    async with AsyncQueue(f"{aq.name}_b", database) as other, AsyncClient(database) as client:
        await other.purge()
        try:
            await other.offer_many([("b1", 1), ("b2", 2)])
            b1, b2 = await other.poll_many(2, 600)
            theirs = dataclasses.replace(b1, source=aq)  # b1's token, acked through aq
            assert await aq.ack(b1.lock_token) is False
            assert await aq.ack_many([b1.lock_token, b2.lock_token]) == 0
            assert await aq.nack(b1.lock_token, state={"x": 1}, error="boom") is False
            assert await aq.extend(b1.lock_token, 1) is None
            assert await aq.dead_letter(b1.lock_token, "boom") is False
            for call in (theirs.ack, theirs.nack, lambda: theirs.extend(1), theirs.dead_letter):
                with pytest.raises(StaleToken):
                    await call()
            for d in (b1, b2):
                info = await other.get(d.key)
                assert info is not None and info.leased and info.attempts == 1 and info.due_at == d.lease_until
                assert info.state is None
            assert await other.extend(b1.lock_token, 600) is not None, "its own queue takes it"
            await b1.ack()
            assert await client.ack(b2.lock_token) is True, "a Client takes a token of any queue"
        finally:
            await other.purge()


async def test_a_nack_later_keeps_state_and_waits(aq: AsyncQueue) -> None:
    await aq.offer_many([("a", {"n": 1}), ("b", 2)])
    a, b = await aq.poll_many(10, timedelta(seconds=30))
    await a.ack()
    await b.nack(future(3600), state=[1, 2])
    with pytest.raises(StaleToken):
        await b.extend(10)
    info = await aq.get("b")
    assert info is not None and info.state == [1, 2] and not info.leased
    assert (await aq.stats()).delayed == 1
    assert await aq.next_due() == info.due_at


async def test_poll_many_and_ack_many(aq: AsyncQueue) -> None:
    await aq.offer_many([(f"k{i}", i, datetime(2020, 1, 1, tzinfo=UTC) + timedelta(seconds=i)) for i in range(10)])
    batch = await aq.poll_many(4)
    assert [d.key for d in batch] == ["k0", "k1", "k2", "k3"]
    assert await aq.ack_many([d.lock_token for d in batch] + [None, batch[0].lock_token]) == 4
    assert await aq.poll_many(0) == []
    assert len(await aq.poll_many(100)) == 6


async def test_poll_many_with_acks(aq: AsyncQueue) -> None:
    await aq.offer_many([(f"k{i}", i, datetime(2020, 1, 1, tzinfo=UTC) + timedelta(seconds=i)) for i in range(5)])
    first = await aq.poll_many(2, ack=[])
    second = await aq.poll_many(2, ack=[d.lock_token for d in first] + [None])
    assert [d.key for d in first] == ["k0", "k1"] and [d.key for d in second] == ["k2", "k3"]
    assert await aq.get("k0") is None and await aq.get("k1") is None, "the first batch was acked"
    with pytest.raises(InvalidArgument):
        await aq.poll_many(2, lease=-1, ack=[d.lock_token for d in second])
    assert (await aq.stats()).leased == 2, "a failed call acks nothing"
    assert await aq.poll_many(0, ack=[d.lock_token for d in second]) == []
    assert (await aq.stats()).leased == 0


async def test_dead_letters_and_settings(aq: AsyncQueue) -> None:
    await aq.offer_many([("a", 1), ("b", 2)])
    a, b = await aq.poll_many(2)
    await a.dead_letter("broken")
    with pytest.raises(StaleToken):
        await a.dead_letter("again")
    assert await aq.dead_letter(b.lock_token) is True and await aq.dead_letter(None) is False
    dead = await aq.dead_letters()
    assert [(d.key, d.payload, d.attempts, d.error) for d in dead] == [("a", 1, 1, "broken"), ("b", 2, 1, None)]
    assert await aq.redrive("a") == 1 and await aq.get("a") is not None
    assert await aq.purge_dead_letters() == 1 and await aq.dead_letters() == []
    with pytest.raises(InvalidArgument):
        await aq.configure(max_attempts=0)
    await aq.configure(max_attempts=1)
    assert await aq.poll(timedelta(microseconds=1)) is not None
    assert await aq.poll() is None, "the second delivery is refused"
    assert [d.key for d in await aq.dead_letters()] == ["a"]
    await aq.configure(max_attempts=None)
    await aq.purge_dead_letters()


async def test_overviews(aq: AsyncQueue, database: str) -> None:
    await aq.offer_many([("now", 0), Message("soon", 1, future(60)), Message("later", 2, future(3 * 3600 + 60))])
    hours = await aq.due_hours(4)
    assert [h.due for h in hours] == [1, 0, 0, 1]
    assert hours[1].hour_start - hours[0].hour_start == timedelta(hours=1)
    (now,) = await aq.poll_many(1)
    await now.dead_letter("broken")
    async with AsyncClient(database) as client:
        (dead,) = await client.dead_stats(aq.name)
        assert (dead.queue, dead.dead) == (aq.name, 1)
        assert await client.key_queues("soon") == [aq.name]
        assert await client.key_queues("now") == [], "a dead letter is no live message"
        with pytest.raises(InvalidArgument):
            await aq.due_hours(0)


async def test_overviews_of_every_queue(aq: AsyncQueue, database: str) -> None:
    """A Client's overviews with no queue read every queue: the check of a
    queue is skipped when it is NULL (issue 27: PostgreSQL 18 ran the
    skipped check ahead of time and raised "queue must not be NULL")."""
    await aq.offer_many([("dead", 0), ("live", 1)])
    await aq.schedule("hourly", "0 * * * *")
    try:
        (d,) = await aq.poll_many(1)
        await d.dead_letter("broken")
        async with AsyncClient(database) as client:
            assert aq.name in {s.queue for s in await client.stats()}
            assert aq.name in {s.queue for s in await client.dead_stats()}
            assert (aq.name, "hourly") in {(s.queue, s.name) for s in await client.schedules()}
    finally:
        await aq.unschedule("hourly")
        await aq.purge_dead_letters()


async def test_cancel_purge_next_due_version(aq: AsyncQueue) -> None:
    at = future(600)
    await aq.offer("a", 1, at)
    await aq.offer("b", 1, future(1200))
    assert await aq.next_due() == at
    assert await aq.cancel("a") is True and await aq.cancel("a") is False
    assert await aq.purge() == 1
    assert await aq.next_due() is None
    assert await aq.version() == pgdq.__version__


async def test_cron_install_uninstall(aq: AsyncQueue) -> None:
    t1, t2 = future(3600), future(7200)
    assert await aq.cron_install("rep", "h1", [(t1, {"n": 1}), (t2, {"n": 2})]) == 2
    assert await aq.cron_install("rep", "h1", [(t1, {"n": 1})]) == 0
    assert await aq.cron_install("rep", "h2", [(t2, {})]) == 1
    assert (await aq.stats()).delayed == 1
    key = f"rep/h2/{t2.astimezone(UTC):%Y%m%dT%H%M%S.%fZ}"
    assert await aq.get(key) is not None
    assert await aq.cron_uninstall("rep", "h1") == 0
    assert await aq.cron_uninstall("rep") == 1


async def test_bad_input_is_typed_and_writes_nothing(aq: AsyncQueue, database: str) -> None:
    with pytest.raises(InvalidArgument) as bad:
        await aq.offer("", 1)
    assert bad.value.sqlstate == "22023" and "key must be 1 to 200 characters" in str(bad.value)
    with pytest.raises(NullArgument) as null:
        await aq.offer_many([("a", 1), (None, 2)])
    assert null.value.sqlstate == "22004" and "keys[2]" in str(null.value)
    with pytest.raises(InvalidArgument, match="lease must be positive"):
        await aq.poll(timedelta(0))
    with pytest.raises(InvalidArgument):
        await aq.poll_many(1, -1)
    with pytest.raises(InvalidArgument, match="timezone-aware"):
        await aq.offer("a", 1, datetime(2030, 1, 1))
    with pytest.raises(InvalidArgument, match="timezone-aware"):
        await aq.offer_many([("a", 1, datetime(2030, 1, 1))])
    with pytest.raises(InvalidArgument, match="not JSON serialisable"):
        await aq.offer("a", object())
    async with AsyncQueue("x" * 101, database) as too_long:
        with pytest.raises(InvalidArgument, match="queue must be 1 to 100"):
            await too_long.offer("a", 1)
    assert (await aq.stats()).ready == 0 and await aq.get("a") is None


@dataclasses.dataclass
class Reminder:
    user: int
    text: str


class Invoice(pydantic.BaseModel):
    number: str
    amount_cents: int


async def test_dataclass_and_pydantic_payloads(aq: AsyncQueue, database: str) -> None:
    await aq.offer("r", Reminder(7, "hi"))
    plain = await aq.get("r")
    assert plain is not None and plain.payload == {"user": 7, "text": "hi"}
    async with AsyncQueue(aq.name, database, payload_type=Reminder) as typed:
        d = await typed.poll()
        assert d is not None and d.payload == Reminder(7, "hi")
        await d.ack()
    async with AsyncQueue(aq.name, database, payload_type=Invoice) as invoices:
        await invoices.offer("i", Invoice(number="A-1", amount_cents=500))
        got = await invoices.poll()
        assert got is not None and got.payload == Invoice(number="A-1", amount_cents=500)
    assert await aq.offer("n", None) is OfferOutcome.CREATED, "None is the JSON null payload"


async def test_an_undecodable_payload_spoils_only_its_delivery(aq: AsyncQueue, database: str) -> None:
    await aq.offer_many(
        [("a", Reminder(1, "x")), ("b", {"user": 2, "wrong": "y"}), ("c", "text"), ("d", Reminder(4, "z"))]
    )
    async with AsyncQueue(aq.name, database, payload_type=Reminder) as typed:
        batch = await typed.poll_many(10)
        assert [d.key for d in batch] == ["a", "b", "c", "d"], "the whole batch comes back, leased"
        good, bad = [d for d in batch if d.decode_error is None], [d for d in batch if d.decode_error is not None]
        assert [d.payload for d in good] == [Reminder(1, "x"), Reminder(4, "z")]
        assert [d.raw_payload for d in bad] == [{"user": 2, "wrong": "y"}, "text"]
        for d in bad:
            with pytest.raises(PayloadDecodeError, match=f"payload of '{d.key}'") as caught:
                _ = d.payload
            assert isinstance(caught.value.__cause__, TypeError) and caught.value.sqlstate is None
            await d.dead_letter(str(d.decode_error))
        assert await typed.ack_many([d.lock_token for d in good]) == 2 and (await aq.stats()).leased == 0
    assert sorted(dead.key for dead in await aq.dead_letters()) == ["b", "c"]
    await aq.purge_dead_letters()


async def test_reads_survive_an_undecodable_payload(aq: AsyncQueue, database: str) -> None:
    """get, dead_letters and schedules return a payload the codec rejects
    with decode_error set, as poll does: one bad row never fails the read."""
    await aq.offer_many([("ok", Reminder(1, "x")), ("bad", "text")])
    await aq.schedule("nightly", "0 2 * * *", payload="text")
    async with AsyncQueue(aq.name, database, payload_type=Reminder) as typed:
        info = await typed.get("bad")
        assert info is not None and info.raw_payload == "text" and isinstance(info.decode_error, PayloadDecodeError)
        with pytest.raises(PayloadDecodeError, match="payload of 'bad'"):
            _ = info.payload
        ok = await typed.get("ok")
        assert ok is not None and ok.payload == Reminder(1, "x") and ok.decode_error is None
        for d in await typed.poll_many(10):
            await d.dead_letter("given up")
        dead = {d.key: d for d in await typed.dead_letters()}
        assert dead["ok"].payload == Reminder(1, "x") and dead["bad"].raw_payload == "text"
        assert isinstance(dead["bad"].decode_error, PayloadDecodeError)
        (nightly,) = await typed.schedules()
        assert nightly.raw_payload == "text" and isinstance(nightly.decode_error, PayloadDecodeError)
    await aq.unschedule("nightly")
    await aq.purge_dead_letters()


# jsonb keeps this number whole: 5001 digits, more than Python's int() reads (4300)
HUGE = '{"n": 1e5000}'


async def test_json_python_cannot_read_spoils_only_its_own_message(aq: AsyncQueue, database: str) -> None:
    """A payload, state or headers Python's json cannot read comes back as
    UnreadableJson with decode_error set: every read returns the rest."""
    async with AsyncQueue(aq.name, database, codec=JsonText()) as raw:
        await raw.offer("stateful", "1")
        (first,) = await raw.poll_many(10)
        assert await raw.nack(first.lock_token, None, HUGE), "state saved"
        await raw.offer("huge", HUGE)
    async with await psycopg.AsyncConnection.connect(database, autocommit=True) as c:
        await c.execute("SELECT dq_offer(%s, 'headed', '2', NULL, true, NULL, 0, %s::jsonb)", (aq.name, HUGE))
    await aq.offer("fine", {"a": 1})
    peeked = {m.key: m for m in await aq.peek()}
    assert set(peeked) == {"stateful", "huge", "headed", "fine"}, "peek reads them all"
    assert isinstance(peeked["huge"].raw_payload, UnreadableJson) and peeked["huge"].raw_payload.startswith(
        '{"n": 1000'
    )
    info = await aq.get("huge")
    assert info is not None and isinstance(info.decode_error, PayloadDecodeError)
    batch = {d.key: d for d in await aq.poll_many(10)}
    assert set(batch) == {"stateful", "huge", "headed", "fine"}, "the whole batch comes back"
    assert batch["fine"].payload == {"a": 1} and batch["fine"].decode_error is None
    for key, part in (("stateful", "state"), ("huge", "payload"), ("headed", "headers")):
        with pytest.raises(PayloadDecodeError, match=f"the {part} of '{key}'.*4300 digits") as caught:
            _ = batch[key].payload
        assert isinstance(caught.value.__cause__, ValueError)
        await batch[key].dead_letter(str(batch[key].decode_error))
    await batch["fine"].ack()
    dead = {d.key: d for d in await aq.dead_letters()}
    assert set(dead) == {"stateful", "huge", "headed"} and isinstance(dead["huge"].decode_error, PayloadDecodeError)
    await aq.purge_dead_letters()


class Order(pydantic.BaseModel):
    number: int


async def test_a_pydantic_decode_error_keeps_its_cause(database: str, queue_name: str) -> None:
    async with AsyncQueue(queue_name, database, payload_type=Order) as orders:
        await orders.offer_many([("good", Order(number=1)), ("bad", {"number": "not a number"})])
        good, bad = sorted(await orders.poll_many(10), key=lambda d: d.key != "good")
        assert good.payload == Order(number=1) and good.decode_error is None
        assert isinstance(bad.decode_error, PayloadDecodeError) and bad.raw_payload == {"number": "not a number"}
        assert isinstance(bad.decode_error.__cause__, pydantic.ValidationError)
        with pytest.raises(PayloadDecodeError):
            _ = bad.payload
        await bad.nack(future(3600))
        await good.ack()
        assert await orders.poll() is None, "nothing due: 'bad' waits an hour"
        assert (await orders.stats()).delayed == 1


async def test_each_method_is_one_statement(database: str, queue_name: str) -> None:
    async with await psycopg.AsyncConnection.connect(database, autocommit=True, cursor_factory=CountingCursor) as c:
        aq = AsyncQueue(queue_name, c)
        calls = [
            lambda: aq.offer("a", 1),
            lambda: aq.offer_many([("b", 1), ("c", 2)]),
            lambda: aq.poll(),
            lambda: aq.poll_many(5),
            lambda: aq.poll_many(5, ack=[None]),
            lambda: aq.ack(None),
            lambda: aq.ack_many([]),
            lambda: aq.nack(None),
            lambda: aq.extend(None, 5),
            lambda: aq.cancel("a"),
            lambda: aq.get("b"),
            lambda: aq.purge(),
            lambda: aq.stats(),
            lambda: aq.next_due(),
            lambda: aq.cron_install("p", "h", [(future(60), 1)]),
            lambda: aq.cron_uninstall("p"),
            lambda: aq.version(),
            lambda: aq.configure(max_attempts=None),
            lambda: aq.dead_letter(None),
            lambda: aq.dead_letters(),
            lambda: aq.redrive(),
            lambda: aq.purge_dead_letters(),
        ]
        for call in calls:
            CountingCursor.statements.clear()
            await call()
            assert len(CountingCursor.statements) == 1
            text = bytes(CountingCursor.statements[0]).decode()
            assert text.startswith("SELECT") and "dq_" in text


async def test_pool_connection_and_conninfo_sources(database: str, queue_name: str) -> None:
    async with AsyncConnectionPool(database, min_size=1, max_size=2, open=False) as pool:
        assert await AsyncQueue(queue_name, pool).offer("a", 1) is OfferOutcome.CREATED
    async with await psycopg.AsyncConnection.connect(database, autocommit=True) as c:
        assert await AsyncQueue(queue_name, c).get("a") is not None
    async with AsyncQueue(queue_name, database) as own:
        assert await own.purge() == 1


@unsharded(IN_YOUR_TRANSACTION)
async def test_a_call_in_your_transaction_is_yours_to_roll_back(database: str, queue_name: str) -> None:
    async with AsyncConnectionPool(database, min_size=1, max_size=2, open=False) as pool:
        aq = AsyncQueue(queue_name, pool)
        async with await psycopg.AsyncConnection.connect(database) as conn:
            await aq.offer("tx", 1, conn=conn)
            await conn.rollback()
        assert await aq.get("tx") is None
        await aq.offer("p", 1)
        d = await aq.poll()
        assert d is not None
        assert await d.extend(600) > d.lease_until, "extend moves the lease end"
        await d.ack()


async def test_schema_qualified_calls(database: str) -> None:
    async with await psycopg.AsyncConnection.connect(database, autocommit=True) as c:
        await c.execute("SET search_path = pg_catalog")  # pgdq's schema is not on the path
        aq = AsyncQueue("schema_q", c, schema="public")
        assert await aq.offer("a", 1) is OfferOutcome.CREATED
        assert await aq.purge() == 1
