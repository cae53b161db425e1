"""The Worker and `pgdq worker` against a real server: handling, retries with
backoff, dead letters (raised and crashed), heartbeats, lost leases, SIGTERM,
and a server restart."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import CLUSTER, ROOT, JsonText, own_cluster, owner
from http_server import free_port
from pgdq import AsyncDelivery, AsyncQueue, Message, Queue
from pgdq._reconnect import RetryDelays
from pgdq.worker import Backoff, Retry, Route, Worker, _Pause, handler, lease_lost, without_password
from waiting import PATIENCE, outstanding, wait_for

NOW = datetime(2020, 1, 1, tzinfo=UTC)  # offered in the past: due at once


@contextmanager
def running(worker: Worker) -> Iterator[Worker]:
    """Run the worker in a thread of its own; stop it cleanly at the end."""
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(asyncio.run(worker.run_async())))
    thread.start()
    try:
        wait_for(lambda: worker._loop is not None, "the worker to start")
        yield worker
    finally:
        worker.stop()
        thread.join(30)
    assert not thread.is_alive() and codes == [0], "the worker stops cleanly with 0"


def hour_idle(worker: Worker) -> Worker:
    """worker, its idle sleep ended by nothing but a wake-up, a due time or a
    finished handler before a test's deadline (waiting.PATIENCE): idle_cap
    and the waiting line an hour away. A test that sees it act in time knows
    what woke it, with no bound on how fast a busy machine is."""
    worker.idle_cap = worker.report_every = timedelta(hours=1)
    return worker


@pytest.fixture
def worker_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """caplog with the worker's lines from INFO up."""
    caplog.set_level(logging.INFO, logger="pgdq.worker")
    return caplog


def test_sync_and_async_handlers(database: str, queue_name: str) -> None:
    seen: list[tuple[str, Any]] = []

    def sync_handler(d: AsyncDelivery) -> None:
        seen.append(("sync", d.payload))

    async def async_handler(d: AsyncDelivery) -> None:
        await asyncio.sleep(0.01)
        seen.append(("async", d.payload))

    other = queue_name + "_async"
    with Queue(queue_name, database) as q, Queue(other, database) as q2:
        q.offer_many([(f"k{i}", {"n": i}) for i in range(20)])
        with running(Worker({queue_name: sync_handler, other: async_handler}, dsn=database, concurrency=4)):
            q2.offer_many([(f"k{i}", {"n": i}) for i in range(20)])  # offered while it runs: a wake-up
            wait_for(lambda: len(seen) >= 40, "40 deliveries")
            wait_for(lambda: outstanding(q, "ready", "leased") + outstanding(q2, "leased") == 0, "the acks")
        assert sorted(seen, key=str) == sorted(
            [("sync", {"n": i}) for i in range(20)] + [("async", {"n": i}) for i in range(20)], key=str
        )
        q2.purge()


def test_delayed_message_is_handled_on_time(database: str, queue_name: str) -> None:
    late: list[float] = []

    def handler(d: AsyncDelivery) -> None:
        late.append((datetime.now(UTC) - d.scheduled_at).total_seconds())

    with Queue(queue_name, database) as q, running(hour_idle(Worker(queue_name, handler, dsn=database))):
        time.sleep(0.3)  # idle first: the worker sleeps until something is due
        q.offer("soon", 1, datetime.now(UTC) + timedelta(seconds=1))
        # woken at its due time: nothing else ends its sleep before the deadline
        wait_for(lambda: late, "the delayed message, at its due time")
    assert late[0] >= 0, "not before its due time"


def test_a_rate_limited_channel_is_worked_at_its_pace(database: str, queue_name: str) -> None:
    """The database holds the channel to its min_interval; the idle worker
    sleeps until the next message may go (dq_next_due), not a poll interval."""
    leased: list[datetime] = []  # by the database's clock: each lease's end, all leases alike long

    def handler(d: AsyncDelivery) -> None:
        leased.append(d.lease_until)

    with Queue(queue_name, database) as q:
        q.set_channel("partner", min_interval=0.4)
        q.offer_many([Message(f"k{i}", i, channel="partner") for i in range(4)])
        with running(hour_idle(Worker(queue_name, handler, dsn=database, concurrency=4))):
            # the idle worker wakes when the next message may go (dq_next_due):
            # nothing else ends its sleep before the deadline
            wait_for(lambda: len(leased) == 4, "four deliveries, each when the channel allows it")
    gaps = [(b - a).total_seconds() for a, b in zip(sorted(leased), sorted(leased)[1:], strict=False)]
    assert all(gap >= 0.4 for gap in gaps), f"never sooner than one every 0.4 s: {gaps}"


def test_an_ack_that_frees_a_slot_wakes_the_idle_worker(database: str, queue_name: str) -> None:
    """max_concurrency 1: the message behind a long lease (held here, by hand)
    goes as soon as that lease is acked: the ack notifies dq_wakeup."""
    handled: list[float] = []
    with Queue(queue_name, database) as q:
        q.set_channel("ordered", max_concurrency=1)
        q.offer_many([Message("first", 1, channel="ordered"), Message("second", 2, channel="ordered")])
        (held,) = q.poll_many(2, timedelta(minutes=10))
        with running(hour_idle(Worker(queue_name, lambda d: handled.append(time.monotonic()), dsn=database))):
            time.sleep(0.5)  # idle: the channel's slot is taken for ten minutes
            assert handled == []
            held.ack()
            # the lease's end and the idle cap are minutes away: only the ack's wake-up explains it
            wait_for(lambda: handled, "the second message, woken by the ack")


def test_a_worker_on_a_paused_queue_idles_and_picks_up_on_resume(
    database: str, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dq_pause (1.2): the idle worker sleeps (dq_next_due is NULL) instead of
    polling in a loop; dq_resume's wake-up starts it at once, long before its
    idle_cap (an hour here) would."""
    polls: list[str] = []
    original = AsyncQueue.poll_many

    async def counted(self: AsyncQueue, *args: Any, **kwargs: Any) -> list[AsyncDelivery]:
        polls.append(self.name)
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(AsyncQueue, "poll_many", counted)
    handled: list[Any] = []
    with Queue(queue_name, database) as q:
        q.pause()
        q.offer("waiting", 1)
        worker = Worker(queue_name, lambda d: handled.append(d.payload), dsn=database, idle_cap=timedelta(hours=1))
        with running(worker):
            wait_for(lambda: polls, "the worker's first poll")
            q.offer("woken", 2)  # a wake-up: the worker polls once more, finds the queue paused
            time.sleep(1.0)  # a window to watch: a polling loop would poll several times in it
            assert handled == [] and len(polls) <= 3, f"paused: nothing handled, no poll loop ({len(polls)} polls)"
            q.resume()
            wait_for(lambda: len(handled) == 2, "both messages after the resume's wake-up")
    assert sorted(handled) == [1, 2]


def test_failures_back_off_then_dead_letter(
    database: str, queue_name: str, worker_log: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    tries: list[tuple[int, float]] = []
    failed_at: list[datetime] = []  # when each handler call raised
    nacks: list[tuple[datetime, datetime | None]] = []  # (when nack was called, its retry_at)
    original = AsyncQueue.nack

    async def nack(self: AsyncQueue, lock_token: Any, retry_at: datetime | None = None, *args: Any, **kw: Any) -> Any:
        nacks.append((datetime.now(UTC), retry_at))
        return await original(self, lock_token, retry_at, *args, **kw)

    monkeypatch.setattr(AsyncQueue, "nack", nack)

    def failing(d: AsyncDelivery) -> None:
        tries.append((d.attempts, time.monotonic()))
        failed_at.append(datetime.now(UTC))
        raise ValueError(f"nope {d.attempts}")

    backoff = Backoff(base=timedelta(seconds=0.3), factor=2, jitter=0)
    worker = Worker(queue_name, failing, dsn=database, max_attempts=3, backoff=backoff)
    with Queue(queue_name, database) as q, running(worker):
        q.offer("f", {"x": 1})
        dead = wait_for(q.dead_letters, "the dead letter")
    assert [a for a, _ in tries] == [1, 2, 3]
    lines = [(r.levelname, r.getMessage()) for r in worker_log.records if f"{queue_name}/f" in r.getMessage()]
    assert [level for level, _ in lines] == ["INFO", "INFO", "WARNING"], "a line per retry, one per dead letter"
    assert f"{queue_name}/f failed (attempt 1 of 3): ValueError: nope 1; next try at 20" in lines[0][1]
    assert f"{queue_name}/f failed (attempt 2 of 3): ValueError: nope 2; next try at 20" in lines[1][1]
    assert f"{queue_name}/f dead-lettered (attempt 3 of 3): ValueError: nope 3" in lines[2][1]
    gaps = [later - earlier for (_, earlier), (_, later) in zip(tries, tries[1:], strict=False)]
    assert gaps[0] >= 0.3 and gaps[1] >= 0.6, f"each retry held back by its backoff, got {gaps}"
    # exponential backoff: each retry_at is the time it was chosen, between
    # the failure and the nack, plus 0.3 s, then 0.6 s (however long that took)
    assert len(nacks) == 2, nacks
    for (nacked_at, retry_at), failed, backoff in zip(nacks, failed_at, (0.3, 0.6), strict=False):
        assert retry_at is not None
        chosen = (retry_at - nacked_at).total_seconds(), (retry_at - failed).total_seconds()
        assert chosen[0] <= backoff <= chosen[1], f"a retry {backoff} s after its failure, got {chosen}"
    assert dead[0].key == "f" and dead[0].attempts == 3 and dead[0].payload == {"x": 1}
    assert dead[0].error is not None and "ValueError: nope 3" in dead[0].error
    with Queue(queue_name, database) as q:
        assert outstanding(q, "ready", "delayed") == 0, "no longer in the queue"
        assert q.redrive() == 1 and q.get("f") is not None and q.dead_letters() == []


def test_a_retried_error_is_kept_for_a_burying_poll(database: str, queue_name: str) -> None:
    """The worker nacks a failed delivery with its error; a poll that later
    dead-letters the message (max_attempts lowered meanwhile) reports it."""

    def failing(d: AsyncDelivery) -> None:
        raise ValueError("the printer is on fire")

    backoff = Backoff(base=timedelta(seconds=0.3), jitter=0)
    with Queue(queue_name, database) as q:
        with running(Worker(queue_name, failing, dsn=database, max_attempts=5, backoff=backoff)):
            q.offer("e", 1)
            wait_for(lambda: (info := q.get("e")) is not None and info.attempts == 1 and not info.leased, "the nack")
        [kept] = q.peek()
        q.configure(max_attempts=1)
        wait_for(lambda: q.poll() is None and q.dead_letters(), "the poll to bury it")
        dead = q.dead_letters()
        q.purge_dead_letters()
    assert "ValueError: the printer is on fire" in (kept.last_error or ""), "kept by the nack"
    assert dead[0].key == "e" and dead[0].attempts == 1
    assert "ValueError: the printer is on fire" in (dead[0].error or ""), dead[0].error


def test_route_and_handler_overrides(database: str, queue_name: str) -> None:
    tries: dict[str, list[int]] = {"route": [], "marked": []}

    def by_route(d: AsyncDelivery) -> None:
        tries["route"].append(d.attempts)
        raise RuntimeError("route")

    @handler(max_attempts=2, backoff=Backoff(base=timedelta(seconds=0.05), jitter=0))
    def marked(d: AsyncDelivery) -> None:
        tries["marked"].append(d.attempts)
        raise RuntimeError("marked")

    other = queue_name + "_marked"
    routes = {queue_name: Route(by_route, max_attempts=1), other: marked}
    with (
        Queue(queue_name, database) as q,
        Queue(other, database) as q2,
        running(Worker(routes, dsn=database, max_attempts=5, backoff=Backoff(base=timedelta(seconds=0.05)))),
    ):
        q.offer("r", 1)
        q2.offer("m", 1)
        wait_for(lambda: q.dead_letters() and q2.dead_letters(), "both dead letters")
        q2.purge_dead_letters()
    assert tries == {"route": [1], "marked": [1, 2]}, "Route beats @handler beats the worker's default"


def test_retry_chooses_time_and_checkpoint(
    database: str, queue_name: str, worker_log: pytest.LogCaptureFixture
) -> None:
    states: list[Any] = []

    async def stepper(d: AsyncDelivery) -> None:
        states.append(d.state)
        if d.state is None:
            raise Retry(at=timedelta(seconds=0.2), state={"step": 1})

    with Queue(queue_name, database) as q, running(Worker(queue_name, stepper, dsn=database)):
        q.offer("s", 1)
        wait_for(lambda: len(states) == 2 and q.get("s") is None, "the second delivery and its ack")
    assert states == [None, {"step": 1}]
    retried = [
        r for r in worker_log.records if r.name == "pgdq.worker.delivery" and "retry requested" in r.getMessage()
    ]
    assert [r.levelno for r in retried] == [logging.INFO], "a Retry is logged at INFO, as the README says"
    assert f"{queue_name}/s: retry requested (attempt 1 of 10); next try at " in retried[0].getMessage()


def test_a_retry_past_max_attempts_is_dead_lettered_saying_so(database: str, queue_name: str) -> None:
    def always_retry(d: AsyncDelivery) -> None:
        raise Retry(at=timedelta(0))

    with Queue(queue_name, database) as q, running(Worker(queue_name, always_retry, dsn=database, max_attempts=1)):
        q.offer("once", 1)
        dead = wait_for(q.dead_letters, "the dead letter")
    assert [(d.key, d.error) for d in dead] == [("once", "Retry requested after 1 attempt")]


def test_handler_longer_than_its_lease_keeps_it(database: str, queue_name: str) -> None:
    calls: list[tuple[int, float]] = []
    watched = threading.Event()
    lease = 1.5  # a heartbeat every 0.5 s: one may come a second late on a busy machine

    def slow(d: AsyncDelivery) -> None:
        calls.append((d.attempts, time.monotonic()))
        watched.wait(60)  # until the test watched it for more than 3 leases

    with (
        Queue(queue_name, database) as q,
        running(Worker(queue_name, slow, dsn=database, lease=timedelta(seconds=lease))),
    ):
        q.offer("slow", 1)
        wait_for(lambda: calls, "the handler to start")
        while time.monotonic() < calls[0][1] + 3 * lease + 0.2:
            assert q.poll(timedelta(seconds=0.6)) is None, "the heartbeat keeps the lease"
            time.sleep(0.1)
        watched.set()
        wait_for(lambda: q.get("slow") is None, "the ack")
    assert [attempts for attempts, _ in calls] == [1]


def test_lost_lease_is_detected_and_not_acked(database: str, queue_name: str) -> None:
    events: list[str] = []

    async def cancelled_when_lost(d: AsyncDelivery) -> None:
        if d.payload == "v2":
            events.append("v2 handled")
            return
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            events.append(f"cancelled, lease_lost={lease_lost()}")
            raise

    with (
        Queue(queue_name, database) as q,
        running(Worker(queue_name, cancelled_when_lost, dsn=database, lease=timedelta(seconds=0.6))),
    ):
        q.offer("k", "v1")
        wait_for(lambda: q.stats().leased == 1, "the delivery")
        q.offer("k", "v2")  # an update: the running delivery's token is stale now
        wait_for(lambda: len(events) == 2, "the heartbeat to notice, and the new version")
        wait_for(lambda: q.get("k") is None, "the new version's ack")
    # the new version may run before the old one's heartbeat notices
    assert sorted(events) == ["cancelled, lease_lost=True", "v2 handled"]


def test_sync_handler_sees_the_flag(database: str, queue_name: str) -> None:
    saw: list[bool] = []

    def polite(d: AsyncDelivery) -> None:
        deadline = time.monotonic() + 10
        while not lease_lost() and time.monotonic() < deadline:
            time.sleep(0.02)
        saw.append(lease_lost())

    with (
        Queue(queue_name, database) as q,
        running(Worker(queue_name, polite, dsn=database, lease=timedelta(seconds=0.6))),
    ):
        q.offer("k", 1)
        wait_for(lambda: q.stats().leased == 1, "the delivery")
        q.cancel("k")
        wait_for(lambda: saw, "the handler to notice")
    assert saw == [True]


@dataclass
class Reminder:
    user: int


def test_an_undecodable_payload_is_dead_lettered_alone(database: str, queue_name: str) -> None:
    seen: list[Any] = []
    worker = Worker(queue_name, lambda d: seen.append(d.payload), dsn=database, concurrency=8, payload_type=Reminder)
    with Queue(queue_name, database) as q:
        q.offer_many([("a", {"user": 1}), ("b", {"user": 2, "extra": 0}), ("c", {"user": 3}), ("d", [4])])
        with running(worker):  # one batch: two good deliveries, two that do not fit Reminder
            wait_for(lambda: len(q.dead_letters()) == 2, "the two dead letters")
            dead = sorted(q.dead_letters(), key=lambda d: d.key)
            wait_for(lambda: outstanding(q, "leased", "ready") == 0, "the acks")
            q.offer("e", {"user": 5})
            wait_for(lambda: len(seen) == 3, "a later message: the worker still runs")
        q.purge_dead_letters()
    assert sorted(seen, key=lambda r: r.user) == [Reminder(1), Reminder(3), Reminder(5)]
    assert [(d.key, d.attempts) for d in dead] == [("b", 1), ("d", 1)], "dead-lettered at once, not retried"
    errors = [d.error or "" for d in dead]
    assert "PayloadDecodeError" in errors[0] and "unexpected keyword argument 'extra'" in errors[0]
    assert "Reminder needs a JSON object, got list" in errors[1]


def test_json_python_cannot_read_is_dead_lettered_and_the_rest_handled(database: str, queue_name: str) -> None:
    seen: list[Any] = []
    worker = Worker(queue_name, lambda d: seen.append(d.payload), dsn=database, concurrency=8)
    with Queue(queue_name, database) as q, Queue(queue_name, database, codec=JsonText()) as raw:
        q.offer("a", 1)
        raw.offer("huge", '{"n": 1e5000}')  # 5001 digits: more than Python's int() reads
        q.offer_many([("b", 2), ("c", 3)])
        with running(worker):  # one batch of four
            wait_for(lambda: len(seen) == 3 and len(q.dead_letters()) == 1, "three handled, one dead letter")
            wait_for(lambda: outstanding(q, "leased", "ready") == 0, "the acks")
        (dead,) = q.dead_letters()
        q.purge_dead_letters()
    assert sorted(seen) == [1, 2, 3]
    assert dead.key == "huge" and dead.attempts == 1, "dead-lettered at once, not retried"
    assert "cannot read the payload of 'huge'" in (dead.error or "") and "4300 digits" in (dead.error or "")


def test_a_pause_that_ends_before_the_worker_idles_is_not_waited_out(database: str, queue_name: str) -> None:
    """The fetch loop skips a queue whose failing poll is paused; when that
    pause ends before the loop goes idle, the idle wait ends at once and the
    poll is tried again, instead of after idle_cap (or the next waiting
    line): a race that held test_a_failing_queue_is_paused_not_the_worker's
    retries back for 20 s on a busy machine."""
    worker = hour_idle(Worker({queue_name: lambda d: None}, dsn=database))

    async def go_idle() -> None:
        async with AsyncQueue(queue_name, database) as q:
            worker._pauses[(queue_name, "poll")] = _Pause(RetryDelays(), until=time.monotonic() - 1)  # just ended
            await asyncio.wait_for(worker._idle({queue_name: q}, slots_free=True), timeout=PATIENCE)

    asyncio.run(go_idle())


def test_a_failing_queue_is_paused_not_the_worker(
    database: str, queue_name: str, worker_log: pytest.LogCaptureFixture
) -> None:
    handled: list[str] = []
    broken = queue_name + "_broken"  # its lease ends beyond the timestamp range: every poll is 22023
    routes = {
        broken: Route(lambda d: None, lease=timedelta(days=999_999_999)),
        queue_name: lambda d: handled.append(d.key),
    }

    def failures() -> list[logging.LogRecord]:
        return [r for r in worker_log.records if f"poll of queue {broken} failed" in r.getMessage()]

    with Queue(queue_name, database) as q, running(Worker(routes, dsn=database)):
        time.sleep(0.3)  # the broken queue failed its first polls
        q.offer("k", 1)
        wait_for(lambda: handled == ["k"], "the other queue's message")
        assert "InvalidArgument [22023]" in failures()[0].getMessage()
        wait_for(lambda: len(failures()) >= 4, "the broken queue's retries")
    times = [r.created for r in failures()]
    gaps = [later - earlier for earlier, later in zip(times, times[1:], strict=False)]
    assert all(gap >= 0.09 * 2**i for i, gap in enumerate(gaps)), f"backoff from 0.1 s, doubling: {gaps}"


def test_a_hung_async_handler_times_out(database: str, queue_name: str) -> None:
    events: list[tuple[int, str]] = []

    async def hangs(d: AsyncDelivery) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            events.append((d.attempts, f"cancelled, lease_lost={lease_lost()}"))
            raise

    backoff = Backoff(base=timedelta(seconds=0.05), jitter=0)
    worker = Worker(queue_name, hangs, dsn=database, timeout=timedelta(seconds=0.3), max_attempts=2, backoff=backoff)
    with Queue(queue_name, database) as q, running(worker):
        q.offer("h", 1)
        dead = wait_for(q.dead_letters, "the dead letter after two timeouts")
        q.purge_dead_letters()
    assert events == [(1, "cancelled, lease_lost=True"), (2, "cancelled, lease_lost=True")]
    assert dead[0].attempts == 2 and "HandlerTimeout: the handler ran past its timeout of 0.3 s" in str(dead[0].error)


def test_a_hung_sync_handler_is_abandoned_and_frees_its_slot(
    database: str, queue_name: str, worker_log: pytest.LogCaptureFixture
) -> None:
    events: list[str] = []
    next_handled = threading.Event()

    @handler(timeout=timedelta(seconds=0.3), max_attempts=1)
    def stuck(d: AsyncDelivery) -> None:
        if d.key == "stuck":
            # hangs past its timeout, ignoring lease_lost() (Python cannot
            # stop it), until the next message was handled in its slot
            next_handled.wait(60)
            events.append(f"stuck returned, lease_lost={lease_lost()}")
        else:
            events.append(f"{d.key} handled")
            next_handled.set()

    with Queue(queue_name, database) as q, running(Worker(queue_name, stuck, dsn=database, concurrency=1)):
        q.offer("stuck", 1, NOW)
        q.offer("next", 1, NOW + timedelta(seconds=1))
        wait_for(lambda: events, "the next message, in the freed slot")
        dead = q.dead_letters()
        wait_for(lambda: len(events) == 2, "the abandoned thread to return")
        q.purge_dead_letters()
    assert events == ["next handled", "stuck returned, lease_lost=True"]
    assert [d.key for d in dead] == ["stuck"] and "HandlerTimeout" in (dead[0].error or "")
    assert any(f"{queue_name}/stuck ran past its timeout" in r.getMessage() for r in worker_log.records)


def test_start_and_stop_lines_name_the_settings_not_the_password(
    database: str, queue_name: str, worker_log: pytest.LogCaptureFixture
) -> None:
    secret = "s3cret-pw"  # the test cluster trusts local connections: the password is not checked
    dsn = psycopg.conninfo.make_conninfo(database, password=secret)
    routes = {queue_name: Route(print, lease=timedelta(seconds=5), max_attempts=3, timeout=timedelta(seconds=2))}
    with running(Worker(routes, dsn=dsn, concurrency=3, schema="public")):
        pass
    messages = [r.getMessage() for r in worker_log.records if r.name == "pgdq.worker"]
    assert not any(secret in m for m in messages)
    start = next(m for m in messages if m.startswith("pgdq worker starting"))
    assert f"queues {queue_name} (lease 5 s, max_attempts 3, timeout 2 s); concurrency 3; schema public" in start
    assert f"dbname={psycopg.conninfo.conninfo_to_dict(database)['dbname']}" in start
    assert any(m.startswith("pgdq worker stopped cleanly after") and "0 handled, 0 failed" in m for m in messages)
    url = without_password("postgresql://app:s3cret@db.example:5433/app?sslpassword=s3cret2&application_name=w")
    assert "s3cret" not in url and "host=db.example" in url and "user=app" in url and "port=5433" in url


def test_a_waiting_worker_says_so_at_most_once_an_interval(
    database: str, queue_name: str, worker_log: pytest.LogCaptureFixture
) -> None:

    def fails_on_b(d: AsyncDelivery) -> None:
        if d.key == "b":
            raise RuntimeError("b")

    worker = Worker(queue_name, fails_on_b, dsn=database, max_attempts=1)
    worker.report_every = timedelta(seconds=0.4)

    def waiting() -> list[str]:
        return [r.getMessage() for r in worker_log.records if r.getMessage().startswith("waiting for work")]

    def counted(what: str) -> int:
        return sum(int(found.group(1)) for m in waiting() if (found := re.search(rf"(\d+) {what}", m)))

    later = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=5)
    with Queue(queue_name, database) as q, running(worker):
        wait_for(waiting, "the first waiting line")
        assert "0 of 8 handlers running, nothing due; since the last report 0 handled, 0 failed" in waiting()[0]
        q.offer_many([("a", 1), ("b", 1), ("c", 1, later)])
        wait_for(lambda: any(f"next due at {later.isoformat()}" in m for m in waiting()), "the next due time")
        q.purge()
        q.purge_dead_letters()
    assert counted("handled") == 1 and counted("dead-lettered") == 1, waiting()
    times = [r.created for r in worker_log.records if r.getMessage().startswith("waiting for work")]
    assert all(b - a >= 0.39 for a, b in zip(times, times[1:], strict=False)), f"one line an interval: {times}"
    about_a = [r for r in worker_log.records if f"{queue_name}/a " in r.getMessage() and r.levelno >= logging.INFO]
    assert about_a == [], "no INFO line for a message handled"


def test_a_lost_wake_up_connection_is_opened_again(
    database: str, queue_name: str, worker_log: pytest.LogCaptureFixture
) -> None:
    handled: list[str] = []
    listening = "SELECT pid FROM pg_stat_activity WHERE query = 'LISTEN dq_wakeup' AND datname = current_database()"
    # the server where the queue's wake-ups are raised (through a router: its partition)
    conn = psycopg.connect(owner(database, queue_name), autocommit=True)

    def listener() -> int | None:
        row = conn.execute(listening).fetchone()
        return None if row is None else int(row[0])

    worker = hour_idle(Worker(queue_name, lambda d: handled.append(d.key), dsn=database))
    with Queue(queue_name, database) as q, running(worker):
        first = wait_for(listener, "the LISTEN connection")
        conn.execute("SELECT pg_terminate_backend(%s)", (first,))
        wait_for(lambda: listener() not in (None, first), "a LISTEN on a new connection")
        time.sleep(0.3)  # idle again: with idle_cap an hour, only a wake-up brings it back before the deadline
        q.offer("k", 1)
        wait_for(lambda: handled == ["k"], "the wake-up")
    conn.close()
    lost = [r for r in worker_log.records if r.getMessage().startswith("LISTEN dq_wakeup failed")]
    assert lost and lost[0].levelno == logging.WARNING and "trying again in 0.1 s" in lost[0].getMessage()


# --- the command, in processes of its own -----------------------------------


def worker_process(
    tmp_path: Path, database: str, queue: str, body: str, *args: str, stderr: Any = subprocess.PIPE
) -> subprocess.Popen[bytes]:
    """`pgdq worker` running handler(d) defined by body in tmp_path/handlers.py."""
    (tmp_path / "handlers.py").write_text(textwrap.dedent(body))
    command = [sys.executable, "-m", "pgdq", "worker", "--dsn", database, "--queue", queue]
    command += ["--handler", "handlers:handler", *args]
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    return subprocess.Popen(command, cwd=tmp_path, env=env, stderr=stderr)


SLOW = """
    import pathlib, time
    def handler(d):
        pathlib.Path("started").touch()
        time.sleep(float(d.payload))
        pathlib.Path("finished").touch()
"""


def terminated_while_busy(tmp_path: Path, database: str, q: Queue, seconds: float, *args: str) -> int:
    """Offer a message the SLOW handler works on for seconds, SIGTERM `pgdq
    worker *args` once the handler started; its exit code."""
    q.offer("w", seconds)
    proc = worker_process(tmp_path, database, q.name, SLOW, *args)
    wait_for(lambda: (tmp_path / "started").exists(), "the handler to start")
    proc.send_signal(signal.SIGTERM)
    return proc.wait(PATIENCE)


def test_sigterm_lets_running_work_finish(tmp_path: Path, database: str, queue_name: str) -> None:
    with Queue(queue_name, database) as q:
        assert terminated_while_busy(tmp_path, database, q, 1.5, "--grace", "10") == 0
        assert (tmp_path / "finished").exists() and q.get("w") is None, "finished and acked"


def test_sigterm_hands_back_what_outlives_the_grace(tmp_path: Path, database: str, queue_name: str) -> None:
    with Queue(queue_name, database) as q:
        assert terminated_while_busy(tmp_path, database, q, 60, "--grace", "0.3", "--lease", "30") == 0
        info = q.get("w")
        assert info is not None and not info.leased and info.attempts == 1, "handed back, due at once"
        assert info.due_at <= datetime.now(UTC)


def test_a_second_signal_exits_at_once(tmp_path: Path, database: str, queue_name: str) -> None:
    with Queue(queue_name, database) as q, (tmp_path / "log").open("w") as log:
        q.offer("w", 3600)  # the handler's seconds, and the grace: only the second signal ends it in time
        proc = worker_process(tmp_path, database, queue_name, SLOW, "--grace", "3600", stderr=log)
        wait_for(lambda: (tmp_path / "started").exists(), "the handler to start")
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: "SIGTERM, finishing running handlers" in (tmp_path / "log").read_text(), "the first signal")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(PATIENCE) == 128 + signal.SIGTERM
        info = q.get("w")
        assert info is not None and info.leased, "nothing was settled: the lease will bring it back"


def test_one_sigterm_stops_a_worker_whose_database_is_unreachable(tmp_path: Path, queue_name: str) -> None:
    """No DSN given, and nothing listens where the PG* variables point: the
    start line says where it connects and why, each failure is logged once
    (not by psycopg.pool too), and one SIGTERM stops it within seconds."""
    (tmp_path / "handlers.py").write_text("def handler(d):\n    pass\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG") and k not in ("DATABASE_URL", "PGDQ_DSN")}
    env.update(PGHOST="127.0.0.1", PGPORT=str(free_port()), PYTHONPATH=str(tmp_path))
    command = [sys.executable, "-m", "pgdq", "worker", "--queue", queue_name, "--handler", "handlers:handler"]
    with (tmp_path / "log").open("w") as log:
        proc = subprocess.Popen(command, cwd=tmp_path, env=env, stderr=log)

    def lines() -> str:
        return (tmp_path / "log").read_text()

    try:
        wait_for(lambda: "failed (OperationalError" in lines(), "a failed connection, logged")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(PATIENCE) == 0, "stopped, not retrying on"
    finally:
        proc.kill()  # no-op once it exited
    start = next(line for line in lines().splitlines() if "pgdq worker starting" in line)
    assert f"dsn host=127.0.0.1 port={env['PGPORT']} " in start and "(no DSN given:" in start and "PGPORT" in start
    assert "psycopg.pool" not in lines(), "each failure logged once, by the worker"
    assert "stopped cleanly" in lines().splitlines()[-1]


def test_the_command_explains_what_it_cannot_do(tmp_path: Path, database: str, queue_name: str) -> None:
    missing = worker_process(tmp_path, database, queue_name, "def other(d): pass\n")
    assert missing.wait(PATIENCE) == 2 and b"cannot load handlers:handler" in missing.communicate()[1]
    elsewhere = psycopg.conninfo.make_conninfo(database, dbname="postgres")  # no pgdq there
    proc = worker_process(tmp_path, elsewhere, queue_name, "def handler(d): pass\n")
    assert proc.wait(PATIENCE) == 3 and b"pgdq is not installed" in proc.communicate()[1]


def test_crashing_consumers_end_in_the_dead_letters(tmp_path: Path, database: str, queue_name: str) -> None:
    crash = """
        import os, pathlib
        def handler(d):
            pathlib.Path(f"run{d.attempts}").touch()
            os._exit(9)  # the process dies mid-message, every time
    """
    with Queue(queue_name, database) as q:
        q.offer("poison", 1)
        for attempt in (1, 2):
            proc = worker_process(tmp_path, database, queue_name, crash, "--lease", "0.5", "--max-attempts", "2")
            assert proc.wait(PATIENCE) == 9, f"crash {attempt}"
            assert (tmp_path / f"run{attempt}").exists()
            time.sleep(0.6)  # the lease runs out
        proc = worker_process(tmp_path, database, queue_name, crash, "--lease", "0.5", "--max-attempts", "2")
        dead = wait_for(q.dead_letters, "the poll to dead-letter it")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(PATIENCE) == 0, "the third worker never ran the poison message"
    assert dead[0].key == "poison" and dead[0].attempts == 2 and "max_attempts" in (dead[0].error or "")


@pytest.mark.restarts_server
@pytest.mark.skipif(not own_cluster(), reason="restarts the server: only on the repo's throwaway test cluster")
def test_worker_survives_a_server_restart(database: str) -> None:
    queue_name = "worker_restart"  # not the fixture: its connection would not survive the restart
    handled: set[str] = set()

    def handler(d: AsyncDelivery) -> None:
        handled.add(d.key)

    with running(Worker(queue_name, handler, dsn=database)):
        with Queue(queue_name, database) as q:
            q.offer_many([(f"a{i}", i) for i in range(10)])
            wait_for(lambda: len(handled) == 10, "the first batch")
        subprocess.run([str(ROOT / "scripts/pgcluster.sh"), "crash-restart", CLUSTER], check=True)
        with Queue(queue_name, database) as q:
            q.offer_many([(f"b{i}", i) for i in range(10)])
            wait_for(lambda: len(handled) == 20, "the batch after the restart")
            wait_for(lambda: outstanding(q, "leased", "ready") == 0, "the acks")
            q.purge()


def test_zero_overrides_are_refused_not_replaced_by_defaults(database: str) -> None:
    """1.0.0 read Route(lease=timedelta(0)) as 'no override' and used the worker's lease."""
    with pytest.raises(ValueError, match="positive lease"):
        Worker({"q": Route(print, lease=timedelta(0))}, dsn=database)
    with pytest.raises(ValueError, match="max_attempts"):
        Worker({"q": Route(print, max_attempts=0)}, dsn=database)
