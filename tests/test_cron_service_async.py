"""The Python cron services against a real server: periodic, daily and cron
schedules deliver each occurrence once to 5 competing consumers; a changed
configuration replaces pending occurrences and keeps leased ones;
restarting with the same configuration creates nothing; a failing run is
logged and retried with back-off; stop() stops. (tests/test_cron_service.py
is generated from tests/test_cron_service_async.py: each test runs against
both services. The plans themselves: test_cron_plans.py.)
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from datetime import time as clock
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
from pgdq import AsyncQueue, InvalidArgument
from pgdq._compat import agather, asleep, aspawn
from pgdq.cron import AsyncCronService, daily_plan


async def consume(database: str, queue: str, enough: Callable[[Counter[str]], bool], workers: int = 5) -> Counter[str]:
    """Keys delivered (and acked) by `workers` competing consumers, polling
    until enough(keys so far) holds (the test fails after 60 s without)."""
    keys: list[str] = []  # appended to by every consumer (atomic in threads too)
    deadline = time.monotonic() + 60

    async def consumer() -> None:
        async with AsyncQueue(queue, database) as aq:
            while not enough(Counter(keys)):
                d = await aq.poll(timedelta(seconds=30))
                if d is None:
                    await pause(f"the occurrences so far, {sorted(set(keys))}, to be enough", deadline)
                    continue
                keys.append(d.key)
                await d.ack()

    await agather(*[aspawn(consumer) for _ in range(workers)])
    return Counter(keys)


async def pause(what: str, deadline: float) -> None:
    """Sleep 20 ms; fail the test naming what it waits for once time.monotonic() passes deadline."""
    if time.monotonic() > deadline:
        pytest.fail(f"timed out waiting for {what}")
    await asleep(0.02)


def occurrence(key: str) -> datetime:
    return datetime.strptime(key.rsplit("/", 1)[1], "%Y%m%dT%H%M%S.%fZ").replace(tzinfo=UTC)


async def test_periodic_tick_once_per_occurrence_with_two_schedulers(database: str, queue_name: str) -> None:
    async with AsyncQueue(queue_name, database) as qa, AsyncQueue(queue_name, database) as qb:
        handles = [
            await AsyncCronService(q).install_periodic_tick("tick", timedelta(seconds=1), {"t": 1}) for q in (qa, qb)
        ]
        # a duplicate of an occurrence is due with it: once a fourth is
        # delivered, any of the first three would have been too
        seen = await consume(database, queue_name, lambda keys: len(keys) >= 4)
        for h in handles:
            await h.stop()
    assert seen and max(seen.values()) == 1, "each occurrence delivered once"
    times = sorted(occurrence(k) for k in seen)
    assert len(times) >= 3
    assert all(t.microsecond == 0 for t in times), "aligned to whole seconds"
    assert all(b - a == timedelta(seconds=1) for a, b in zip(times, times[1:], strict=False)), "none missing"


async def test_daily_and_cron_schedules_deliver(aq: AsyncQueue, database: str) -> None:
    zone = ZoneInfo("Europe/Bucharest")
    soon = datetime.now(zone) + timedelta(seconds=3)
    times = [soon.time().replace(microsecond=0), (soon + timedelta(seconds=1)).time().replace(microsecond=0)]
    cron = AsyncCronService(aq)
    daily = await cron.install_daily_schedule("daily", "Europe/Bucharest", times, timedelta(hours=1), {"d": 1})
    every2 = await cron.install_cron("every2", "*/2 * * * * *", "America/New_York", {"c": 1}, timedelta(seconds=5))
    seen = await consume(
        database,
        aq.name,
        lambda keys: sum(k.startswith("daily/") for k in keys) == 2 and sum(k.startswith("every2/") for k in keys) >= 2,
    )
    await daily.stop()
    await every2.stop()
    assert max(seen.values()) == 1
    daily_keys = sorted(k for k in seen if k.startswith("daily/"))
    assert [occurrence(k).astimezone(zone).time() for k in daily_keys] == times
    cron_times = [occurrence(k) for k in seen if k.startswith("every2/")]
    assert len(cron_times) >= 2 and all(t.second % 2 == 0 for t in cron_times)


async def test_changed_configuration_replaces_pending_keeps_leased(aq: AsyncQueue) -> None:
    now = datetime.now(UTC)
    # soon: still ahead when installed, on a busy machine too
    soon, later, latest = now + timedelta(seconds=2), now + timedelta(hours=1), now + timedelta(hours=2)
    cron = AsyncCronService(aq)
    assert await cron.install_tick("h1", "rep", [(soon, "a"), (later, "b")]) == 2
    deadline = time.monotonic() + 60
    while (leased := await aq.poll(timedelta(minutes=1))) is None:
        await pause("the first occurrence to fall due", deadline)
    assert leased.payload == "a"
    assert await cron.install_tick("h2", "rep", [(latest, "c")]) == 1
    replaced, kept = f"rep/h1/{later:%Y%m%dT%H%M%S.%fZ}", f"rep/h2/{latest:%Y%m%dT%H%M%S.%fZ}"
    present = {k for k in (leased.key, replaced, kept) if await aq.get(k) is not None}
    assert present == {leased.key, kept}, "pending replaced, leased kept"
    await leased.ack()


async def test_same_configuration_creates_nothing_new(aq: AsyncQueue) -> None:
    cron = AsyncCronService(aq)
    args = ("daily", "Australia/Lord_Howe", [clock(9), clock(21)], timedelta(days=3))
    first = await cron.install_daily_schedule(*args)
    await first.stop()
    assert first.created in (5, 6, 7), "two a day for three days"
    again = await cron.install_daily_schedule(*args)
    await again.stop()
    assert again.created == 0, "a restart with the same configuration creates nothing"
    changed = await cron.install_daily_schedule("daily", "Australia/Lord_Howe", [clock(10)], timedelta(days=3))
    await changed.stop()
    assert changed.created >= 2 and (await aq.stats()).delayed == changed.created, "the old occurrences were replaced"


async def test_occurrences_in_the_past_install_nothing(aq: AsyncQueue) -> None:
    spring = datetime(2025, 3, 9, 0, 0, tzinfo=ZoneInfo("America/New_York"))
    past = list(daily_plan("s", "America/New_York", [clock(2, 30), clock(23)], timedelta(days=1)).generate(spring))
    assert len(past) == 2
    assert await AsyncCronService(aq).install_tick("dst", "dst", past) == 0
    assert (await aq.stats()).delayed == 0


def flaky(broken: threading.Event) -> Any:
    """A generator: its first call works, the second raises, then (while
    broken is set) its payload is one the server rejects (22P05)."""
    calls: list[datetime] = []

    def generate(now: datetime) -> list[tuple[datetime, Any]]:
        calls.append(now)
        if len(calls) == 2:
            raise RuntimeError("generator broke")
        at = now.replace(microsecond=0) + timedelta(hours=1)
        return [(at, "\x00" if broken.is_set() else len(calls))]

    return generate


async def test_a_failing_run_is_logged_and_retried(aq: AsyncQueue, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="pgdq.cron")
    broken = threading.Event()
    handle = await AsyncCronService(aq).install("h", "flaky", timedelta(seconds=0.1), flaky(broken))
    broken.set()
    deadline = time.monotonic() + 60
    while not isinstance(handle.last_error, psycopg.errors.UntranslatableCharacter):
        await pause("a server error", deadline)
    broken.clear()
    while handle.last_error is not None or (await aq.stats()).delayed < 2:
        await pause("a run after the failures", deadline)
    await handle.stop()
    failed = [r for r in caplog.records if r.getMessage().startswith("pgdq cron flaky: run failed")]
    assert [type(r.exc_info[1]).__name__ for r in failed[:2] if r.exc_info] == [
        "RuntimeError",
        "UntranslatableCharacter",
    ]


class Script:
    """A generator of one occurrence an hour ahead whose n-th call raises
    failures[n] (None: no failure); calls past the script succeed."""

    def __init__(self, *failures: Exception | None) -> None:
        self.failures = list(failures)
        self.calls = 0

    def __call__(self, now: datetime) -> list[tuple[datetime, Any]]:
        self.calls += 1
        failure = self.failures[self.calls - 1] if self.calls <= len(self.failures) else None
        if failure is not None:
            raise failure
        return [(now.replace(microsecond=0) + timedelta(hours=1), self.calls)]


async def test_failing_runs_back_off_and_stop_stops(aq: AsyncQueue, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="pgdq.cron")
    broke = RuntimeError("broke")
    script = Script(None, psycopg.OperationalError("connection lost"), broke, broke, broke, None, broke)
    handle = await AsyncCronService(aq).install("h", "backoff", timedelta(seconds=0.1), script)
    deadline = time.monotonic() + 60
    while script.calls < 8:
        await pause("eight runs", deadline)
    await handle.stop()
    stopped_at = script.calls
    await asleep(0.3)
    assert script.calls == stopped_at, "no run after stop()"
    records = [r for r in caplog.records if r.name == "pgdq.cron"]
    waits = [(r.levelname, r.args[1] if r.levelname == "ERROR" and r.args else None) for r in records[:5]]
    assert waits == [
        ("WARNING", None),  # a lost connection: the next run, one interval later
        ("ERROR", 0.1),  # other errors: one interval, then doubling
        ("ERROR", 0.2),
        ("ERROR", 0.4),
        ("ERROR", 0.1),  # a success in between starts again from one interval
    ]
    assert handle.last_error is None


async def test_install_rejects_a_non_positive_interval(aq: AsyncQueue) -> None:
    with pytest.raises(InvalidArgument, match="interval must be positive"):
        await AsyncCronService(aq).install("h", "never", timedelta(0), Script())
    assert (await aq.stats()).delayed == 0
