"""Model-based test of offer, poll, ack, nack and extend with channels and
priority: hypothesis drives random sequences of calls (and clock steps)
against a real server and a small in-memory model of api-v1.1's rules (the
turn rule, priority, max_concurrency, min_interval, leases that expire,
dq_next_due), and every answer must match.

Every channel here has limits (a large max_concurrency stands for none), so
no channel is ever forgotten: a channel with neither messages nor limits
starts again as never leased, which tests/pgtap/42_channels.sql covers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
import pytest
from conftest import DB, dsn, recreate_database
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from pgdq import Message, OfferOutcome, Queue

START = datetime(2024, 1, 1, 12, 0, tzinfo=UTC)
LEASE = timedelta(seconds=30)
QUEUE = "model"
# channel -> (max_concurrency, min_interval); None stands for the unchanneled group
LIMITS: dict[str | None, tuple[int | None, timedelta | None]] = {
    None: (None, None),
    "one": (1, None),
    "two": (2, None),
    "paced": (1000, timedelta(seconds=10)),
    "both": (2, timedelta(seconds=5)),
    "free": (1000, None),
}
KEYS = [f"k{i}" for i in range(8)]


@dataclass
class Msg:
    """A message of the model: due is its due time, or while leased its lease end."""

    payload: int
    at: datetime
    due: datetime
    channel: str | None
    priority: int
    id: int
    token: int | None = None
    attempts: int = 0


@dataclass
class Group:
    turn: int | None = None
    last_leased_at: datetime | None = None


@dataclass
class Model:
    """api-v1.1's rules for one queue."""

    now: datetime = START
    messages: dict[str, Msg] = field(default_factory=dict)
    groups: dict[str | None, Group] = field(default_factory=lambda: {c: Group() for c in LIMITS})
    next_id: int = 0
    next_turn: int = 0

    def offer(self, key: str, payload: int, at: datetime | None, channel: str | None, priority: int) -> OfferOutcome:
        stored = self.messages.get(key)
        if stored is not None and (stored.payload, stored.channel, stored.priority) == (payload, channel, priority):
            if at is None or at == stored.at:
                return OfferOutcome.IGNORED
        self.next_id += stored is None
        when = at or self.now
        ident = stored.id if stored is not None else self.next_id
        self.messages[key] = Msg(payload, when, when, channel, priority, ident)
        return OfferOutcome.CREATED if stored is None else OfferOutcome.UPDATED

    def held(self, channel: str | None) -> int:
        """The channel's valid leases."""
        return sum(1 for m in self.messages.values() if m.channel == channel and m.token and m.due > self.now)

    def room(self, channel: str | None) -> bool:
        max_concurrency, min_interval = LIMITS[channel]
        last = self.groups[channel].last_leased_at
        if min_interval is not None and last is not None and last + min_interval > self.now:
            return False
        return max_concurrency is None or self.held(channel) < max_concurrency

    def head(self, channel: str | None) -> tuple[str, Msg] | None:
        """The group's next message: priority, then due time, then id."""
        due = [(k, m) for k, m in self.messages.items() if m.channel == channel and m.due <= self.now]
        return min(due, key=lambda km: (-km[1].priority, km[1].due, km[1].id), default=None)

    def poll(self, max_count: int) -> list[str]:
        taken = []
        while len(taken) < max_count:
            ready = [(c, h) for c in LIMITS if self.room(c) and (h := self.head(c)) is not None]
            if not ready:
                break
            channel, (key, m) = min(
                ready,
                key=lambda ch: (
                    self.groups[ch[0]].turn is not None,
                    self.groups[ch[0]].turn or 0,
                    ch[1][1].due,
                    ch[0] is not None,
                    ch[0] or "",
                ),
            )
            self.next_turn += 1
            m.attempts += 1
            m.token = self.next_turn
            m.due = self.now + LEASE
            self.groups[channel] = Group(self.next_turn, self.now)
            taken.append(key)
        return taken

    def next_due(self) -> datetime | None:
        """The earliest time a message could be eligible."""
        times = []
        for channel in LIMITS:
            dues = [m.due for m in self.messages.values() if m.channel == channel]
            if not dues:
                continue
            at = min(dues)
            max_concurrency, min_interval = LIMITS[channel]
            last = self.groups[channel].last_leased_at
            if min_interval is not None and last is not None:
                at = max(at, last + min_interval)
            if max_concurrency is not None and self.held(channel) >= max_concurrency:
                valid = [m.due for m in self.messages.values() if m.channel == channel and m.token and m.due > self.now]
                at = max(at, min(valid))  # the first of the valid leases to end
            times.append(at)
        return min(times, default=None)


@pytest.fixture(scope="module")
def model_db(database: str) -> str:
    recreate_database(f"{DB}_model")
    with psycopg.connect(dsn(f"{DB}_model"), autocommit=True) as c:
        c.execute("CREATE EXTENSION pgdq")
    return dsn(f"{DB}_model")


class Machine(RuleBasedStateMachine):
    conninfo: str = ""

    @initialize()
    def start(self) -> None:
        self.conn: psycopg.Connection[Any] = psycopg.connect(self.conninfo, autocommit=True)
        self.q = Queue(QUEUE, self.conn, lease=LEASE)
        self.conn.execute("SELECT dq_purge(%s)", (QUEUE,))
        self.conn.execute("DELETE FROM dq_groups WHERE queue = %s", (QUEUE,))
        self.model = Model()
        self.clock(START)
        for channel, (max_concurrency, min_interval) in LIMITS.items():
            if channel is not None:
                self.q.set_channel(channel, max_concurrency=max_concurrency, min_interval=min_interval)
        self.tokens: dict[str, UUID] = {}  # key -> the token of its current delivery, as the server gave it

    def teardown(self) -> None:
        self.conn.close()

    def clock(self, at: datetime) -> None:
        self.model.now = at
        self.conn.execute("SELECT set_config('dq.now', %s, false)", (at.isoformat(),))

    @rule(
        key=st.sampled_from(KEYS),
        payload=st.integers(0, 1),
        at=st.sampled_from([None, -20, 0, 15]),
        channel=st.sampled_from(list(LIMITS)),
        priority=st.sampled_from([0, 0, 1, -1]),
        batch=st.booleans(),
    )
    def offer(self, key: str, payload: int, at: int | None, channel: str | None, priority: int, batch: bool) -> None:
        when = None if at is None else self.model.now + timedelta(seconds=at)
        expected = self.model.offer(key, payload, when, channel, priority)
        if batch:
            (got,) = self.q.offer_many([Message(key, payload, when, channel, priority)])
            assert got.outcome is expected
        else:
            assert self.q.offer(key, payload, when, channel=channel, priority=priority) is expected
        if expected is not OfferOutcome.IGNORED:
            self.tokens.pop(key, None)

    @rule(max_count=st.integers(1, 4))
    def poll(self, max_count: int) -> None:
        expected = self.model.poll(max_count)
        got = self.q.poll_many(max_count)
        assert [d.key for d in got] == expected
        for d in got:
            assert (d.channel, d.priority, d.attempts) == (
                self.model.messages[d.key].channel,
                self.model.messages[d.key].priority,
                self.model.messages[d.key].attempts,
            )
            self.tokens[d.key] = d.lock_token

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data(), how=st.sampled_from(["ack", "nack", "extend"]))
    def settle(self, data: st.DataObject, how: str) -> None:
        key = data.draw(st.sampled_from(sorted(self.tokens)))
        token, m = self.tokens[key], self.model.messages[key]
        if how == "ack":
            assert self.q.ack(token) is True
            del self.model.messages[key], self.tokens[key]
        elif how == "nack":
            assert self.q.nack(token, self.model.now + timedelta(seconds=5)) is True
            m.token, m.due = None, self.model.now + timedelta(seconds=5)
            del self.tokens[key]
        else:
            max_concurrency = LIMITS[m.channel][0]
            back = m.due > self.model.now or max_concurrency is None or self.model.held(m.channel) < max_concurrency
            until = self.q.extend(token, LEASE)
            assert (until is not None) == back, "an ended lease comes back only into a free slot"
            if back:
                m.due = self.model.now + LEASE

    @rule(seconds=st.sampled_from([1, 5, 10, 31]))
    def tick(self, seconds: int) -> None:
        self.clock(self.model.now + timedelta(seconds=seconds))

    @invariant()
    def next_due_agrees(self) -> None:
        if hasattr(self, "model"):
            assert self.q.next_due() == self.model.next_due()


def test_the_server_follows_the_model(model_db: str) -> None:
    Machine.conninfo = model_db
    Machine.TestCase.settings = settings(
        max_examples=60, stateful_step_count=40, deadline=None, suppress_health_check=list(HealthCheck)
    )
    Machine.TestCase().runTest()
