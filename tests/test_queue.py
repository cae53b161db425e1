"""The sync Queue against a real server: every method, typed results and
errors, payload codecs, and one statement per call."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import pgdq
import psycopg
import pydantic
import pytest
from pgdq import (
    Delivery,
    InvalidArgument,
    Message,
    NullArgument,
    OfferOutcome,
    Queue,
    QueueStats,
    StaleToken,
)
from pgdq.errors import PayloadDecodeError
from psycopg_pool import ConnectionPool


class CountingCursor(psycopg.Cursor[Any]):
    """Counts the statements a connection sends."""

    statements: ClassVar[list[bytes | str]] = []

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> CountingCursor:  # type: ignore[override]
        CountingCursor.statements.append(query)
        super().execute(query, params, **kwargs)
        return self


@pytest.fixture
def q(database: str, queue_name: str) -> Queue:
    return Queue(queue_name, database)


def future(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


def test_offer_outcomes(q: Queue) -> None:
    assert q.offer("a", {"n": 1}) is OfferOutcome.CREATED
    assert q.offer("a", {"n": 1}) is OfferOutcome.IGNORED
    assert q.offer("a", {"n": 2}) is OfferOutcome.UPDATED
    assert q.offer("a", {"n": 3}, can_update=False) is OfferOutcome.IGNORED
    info = q.get("a")
    assert info is not None and info.payload == {"n": 2} and info.attempts == 0 and not info.leased


def test_offer_many_in_order(q: Queue) -> None:
    at = future(60)
    results = q.offer_many([("a", 1), Message("b", 2, at), ("a", 1), ("a", 5)])
    assert [(r.key, r.outcome.value) for r in results] == [
        ("a", "created"),
        ("b", "created"),
        ("a", "ignored"),
        ("a", "updated"),
    ]
    info = q.get("b")
    assert info is not None and info.scheduled_at == at


def test_poll_ack_cycle(q: Queue) -> None:
    q.offer("later", "x", future(3600))
    q.offer("now", {"hello": "world"})
    d = q.poll(timedelta(seconds=30))
    assert isinstance(d, Delivery)
    assert d.key == "now" and d.payload == {"hello": "world"} and d.attempts == 1 and not d.redelivery
    assert d.queue == q.name and d.state is None
    assert timedelta(seconds=25) < d.lease_until - datetime.now(UTC) <= timedelta(seconds=30)
    assert q.poll() is None, "the other message is not due yet"
    d.ack()
    with pytest.raises(StaleToken):
        d.ack()
    assert q.get("now") is None
    assert q.stats() == QueueStats(q.name, 0, 1, 0, None, q.get("later").scheduled_at)  # type: ignore[union-attr]


def test_nack_extend_and_stale(q: Queue) -> None:
    q.offer("k", 1)
    d = q.poll(5)
    assert d is not None
    until = d.extend(timedelta(minutes=10))
    assert until > d.lease_until
    d.nack(state={"step": 2})
    with pytest.raises(StaleToken):
        d.extend(60)
    with pytest.raises(StaleToken):
        d.nack()
    again = q.poll()
    assert again is not None and again.attempts == 2 and again.redelivery and again.state == {"step": 2}
    assert again.id == d.id
    assert q.offer("k", 99) is OfferOutcome.UPDATED
    with pytest.raises(StaleToken):
        again.ack()
    assert q.ack(None) is False and q.nack(None) is False and q.extend(None, 5) is None
    assert q.ack_many(None) == 0


def test_poll_many_and_ack_many(q: Queue) -> None:
    q.offer_many([(f"k{i}", i, datetime(2020, 1, 1, tzinfo=UTC) + timedelta(seconds=i)) for i in range(10)])
    batch = q.poll_many(4)
    assert [d.key for d in batch] == ["k0", "k1", "k2", "k3"]
    assert q.ack_many([d.lock_token for d in batch] + [None, batch[0].lock_token]) == 4
    assert q.poll_many(0) == []
    assert len(q.poll_many(100)) == 6


def test_poll_many_with_acks(q: Queue) -> None:
    q.offer_many([(f"k{i}", i, datetime(2020, 1, 1, tzinfo=UTC) + timedelta(seconds=i)) for i in range(5)])
    first = q.poll_many(2, ack=[])
    second = q.poll_many(2, ack=[d.lock_token for d in first] + [None])
    assert [d.key for d in first] == ["k0", "k1"] and [d.key for d in second] == ["k2", "k3"]
    assert q.get("k0") is None and q.get("k1") is None, "the first batch was acked"
    with pytest.raises(InvalidArgument):
        q.poll_many(2, lease=-1, ack=[d.lock_token for d in second])
    assert q.stats().leased == 2, "a failed call acks nothing"
    assert q.poll_many(0, ack=[d.lock_token for d in second]) == []
    assert q.stats().leased == 0


def test_dead_letters_and_settings(q: Queue) -> None:
    q.offer_many([("a", 1), ("b", 2)])
    a, b = q.poll_many(2)
    a.dead_letter("broken")
    with pytest.raises(StaleToken):
        a.dead_letter("again")
    assert q.dead_letter(b.lock_token) is True and q.dead_letter(None) is False
    dead = q.dead_letters()
    assert [(d.key, d.payload, d.attempts, d.error) for d in dead] == [("a", 1, 1, "broken"), ("b", 2, 1, None)]
    assert q.redrive("a") == 1 and q.get("a") is not None
    assert q.purge_dead_letters() == 1 and q.dead_letters() == []
    with pytest.raises(InvalidArgument):
        q.configure(max_attempts=0)
    q.configure(max_attempts=1)
    assert q.poll(timedelta(microseconds=1)) is not None
    assert q.poll() is None and [d.key for d in q.dead_letters()] == ["a"], "the second delivery is refused"
    q.configure(max_attempts=None)
    q.purge_dead_letters()


def test_cancel_purge_next_due_version(q: Queue) -> None:
    at = future(600)
    q.offer("a", 1, at)
    q.offer("b", 1, future(1200))
    assert q.next_due() == at
    assert q.cancel("a") is True and q.cancel("a") is False
    assert q.purge() == 1
    assert q.next_due() is None
    assert q.version() == pgdq.__version__


def test_cron_install_uninstall(q: Queue) -> None:
    t1, t2 = future(3600), future(7200)
    assert q.cron_install("rep", "h1", [(t1, {"n": 1}), (t2, {"n": 2})]) == 2
    assert q.cron_install("rep", "h1", [(t1, {"n": 1})]) == 0
    assert q.cron_install("rep", "h2", [(t2, {})]) == 1
    assert q.stats().delayed == 1
    key = f"rep/h2/{t2.astimezone(UTC):%Y%m%dT%H%M%S.%fZ}"
    assert q.get(key) is not None
    assert q.cron_uninstall("rep", "h1") == 0
    assert q.cron_uninstall("rep") == 1


def test_bad_input_is_typed_and_writes_nothing(q: Queue) -> None:
    with pytest.raises(InvalidArgument) as bad:
        q.offer("", 1)
    assert bad.value.sqlstate == "22023" and "key must be 1 to 200 characters" in str(bad.value)
    with pytest.raises(NullArgument) as null:
        q.offer_many([("a", 1), (None, 2)])
    assert null.value.sqlstate == "22004" and "keys[2]" in str(null.value)
    with pytest.raises(InvalidArgument, match="lease must be positive"):
        q.poll(timedelta(0))
    with pytest.raises(InvalidArgument, match="timezone-aware"):
        q.offer("a", 1, datetime(2030, 1, 1))
    with pytest.raises(InvalidArgument, match="timezone-aware"):
        q.offer_many([("a", 1, datetime(2030, 1, 1))])
    with pytest.raises(InvalidArgument, match="not JSON serialisable"):
        q.offer("a", object())
    with pytest.raises(InvalidArgument, match="queue must be 1 to 100"):
        Queue("x" * 101, q._source).offer("a", 1)
    assert q.stats().ready == 0 and q.get("a") is None


@dataclasses.dataclass
class Reminder:
    user: int
    text: str


class Invoice(pydantic.BaseModel):
    number: str
    amount_cents: int


def test_dataclass_and_pydantic_payloads(database: str, queue_name: str) -> None:
    plain = Queue(queue_name, database)
    plain.offer("r", Reminder(7, "hi"))
    assert plain.get("r").payload == {"user": 7, "text": "hi"}  # type: ignore[union-attr]
    typed = Queue(queue_name, database, payload_type=Reminder)
    d = typed.poll()
    assert d is not None and d.payload == Reminder(7, "hi")
    d.ack()
    invoices = Queue(queue_name, database, payload_type=Invoice)
    invoices.offer("i", Invoice(number="A-1", amount_cents=500))
    got = invoices.poll()
    assert got is not None and got.payload == Invoice(number="A-1", amount_cents=500)
    assert plain.offer("n", None) is OfferOutcome.CREATED, "None is the JSON null payload"


def test_an_undecodable_payload_spoils_only_its_delivery(database: str, queue_name: str) -> None:
    plain = Queue(queue_name, database)
    plain.offer_many(
        [("a", Reminder(1, "x")), ("b", {"user": 2, "wrong": "y"}), ("c", "text"), ("d", Reminder(4, "z"))]
    )
    typed = Queue(queue_name, database, payload_type=Reminder)
    batch = typed.poll_many(10)
    assert [d.key for d in batch] == ["a", "b", "c", "d"], "the whole batch comes back, leased"
    good, bad = [d for d in batch if d.decode_error is None], [d for d in batch if d.decode_error is not None]
    assert [d.payload for d in good] == [Reminder(1, "x"), Reminder(4, "z")]
    assert [d.raw_payload for d in bad] == [{"user": 2, "wrong": "y"}, "text"]
    for d in bad:
        with pytest.raises(PayloadDecodeError, match=f"payload of '{d.key}'") as caught:
            _ = d.payload
        assert isinstance(caught.value.__cause__, TypeError) and caught.value.sqlstate is None
        d.dead_letter(str(d.decode_error))
    assert typed.ack_many([d.lock_token for d in good]) == 2 and plain.stats().leased == 0
    assert sorted(dead.key for dead in plain.dead_letters()) == ["b", "c"]
    plain.purge_dead_letters()


def test_each_method_is_one_statement(database: str, queue_name: str) -> None:
    with psycopg.connect(database, autocommit=True, cursor_factory=CountingCursor) as c:
        q = Queue(queue_name, c)
        calls = [
            lambda: q.offer("a", 1),
            lambda: q.offer_many([("b", 1), ("c", 2)]),
            lambda: q.poll(),
            lambda: q.poll_many(5),
            lambda: q.poll_many(5, ack=[None]),
            lambda: q.ack(None),
            lambda: q.ack_many([]),
            lambda: q.nack(None),
            lambda: q.extend(None, 5),
            lambda: q.cancel("a"),
            lambda: q.get("b"),
            lambda: q.purge(),
            lambda: q.stats(),
            lambda: q.next_due(),
            lambda: q.cron_install("p", "h", [(future(60), 1)]),
            lambda: q.cron_uninstall("p"),
            lambda: q.version(),
            lambda: q.configure(max_attempts=None),
            lambda: q.dead_letter(None),
            lambda: q.dead_letters(),
            lambda: q.redrive(),
            lambda: q.purge_dead_letters(),
        ]
        for call in calls:
            CountingCursor.statements.clear()
            call()
            assert len(CountingCursor.statements) == 1
            text = bytes(CountingCursor.statements[0]).decode()
            assert text.startswith("SELECT") and "dq_" in text


def test_pool_and_connection_sources(database: str, queue_name: str) -> None:
    with ConnectionPool(database, min_size=1, max_size=2) as pool:
        pq = Queue(queue_name, pool)
        assert pq.offer("a", 1) is OfferOutcome.CREATED
    with psycopg.connect(database, autocommit=True) as c:
        assert Queue(queue_name, c).get("a") is not None
    with Queue(queue_name, database) as own:
        assert own.purge() == 1


def test_schema_qualified_calls(database: str) -> None:
    with psycopg.connect(database, autocommit=True) as c:
        c.execute("SET search_path = pg_catalog")  # pgdq's schema is not on the path
        q = Queue("schema_q", c, schema="public")
        assert q.offer("a", 1) is OfferOutcome.CREATED
        assert q.purge() == 1
