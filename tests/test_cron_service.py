"""CronService / AsyncCronService against a real server: periodic, daily and
cron schedules deliver each occurrence once to 5 competing consumers; a
changed configuration replaces pending occurrences and keeps leased ones;
restarting with the same configuration creates nothing; DST rules."""

from __future__ import annotations

import asyncio
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
from pgdq import AsyncQueue, Queue, Worker
from pgdq.cron import AsyncCronService, CronService, cron_plan, daily_plan, periodic_plan


def consume(database: str, queue: str, seconds: float, workers: int = 5) -> Counter[str]:
    """Keys delivered (and acked) by `workers` competing consumers polling for `seconds`."""
    seen: Counter[str] = Counter()
    lock = threading.Lock()

    def consumer() -> None:
        with Queue(queue, database) as q:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                d = q.poll(timedelta(seconds=30))
                if d is None:
                    time.sleep(0.02)
                    continue
                with lock:
                    seen[d.key] += 1
                d.ack()

    threads = [threading.Thread(target=consumer) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return seen


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 10.0) -> None:
    """Poll condition until it is truthy; fail naming what after timeout."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def occurrence(key: str) -> datetime:
    return datetime.strptime(key.rsplit("/", 1)[1], "%Y%m%dT%H%M%S.%fZ").replace(tzinfo=UTC)


def test_periodic_tick_once_per_occurrence_with_two_schedulers(database: str, queue_name: str) -> None:
    with Queue(queue_name, database) as qa, Queue(queue_name, database) as qb:
        handles = [CronService(q).install_periodic_tick("tick", timedelta(seconds=1), {"t": 1}) for q in (qa, qb)]
        seen = consume(database, queue_name, 4.5)
        for h in handles:
            h.stop()
    assert seen and max(seen.values()) == 1, "each occurrence delivered once"
    times = sorted(occurrence(k) for k in seen)
    assert len(times) >= 3
    assert all(t.microsecond == 0 for t in times), "aligned to whole seconds"
    assert all(b - a == timedelta(seconds=1) for a, b in zip(times, times[1:], strict=False)), "none missing"


def test_daily_and_cron_schedules_deliver(database: str, queue_name: str) -> None:
    zone = ZoneInfo("Europe/Bucharest")
    soon = datetime.now(zone) + timedelta(seconds=2)
    times = [soon.time().replace(microsecond=0), (soon + timedelta(seconds=1)).time().replace(microsecond=0)]
    with Queue(queue_name, database) as q:
        cron = CronService(q)
        daily = cron.install_daily_schedule("daily", "Europe/Bucharest", times, timedelta(hours=1), {"d": 1})
        every2 = cron.install_cron("every2", "*/2 * * * * *", "America/New_York", {"c": 1}, timedelta(seconds=5))
        seen = consume(database, queue_name, 4.5)
        daily.stop()
        every2.stop()
    assert max(seen.values()) == 1
    daily_keys = sorted(k for k in seen if k.startswith("daily/"))
    assert [occurrence(k).astimezone(zone).time() for k in daily_keys] == times
    cron_times = [occurrence(k) for k in seen if k.startswith("every2/")]
    assert len(cron_times) >= 2 and all(t.second % 2 == 0 for t in cron_times)


def test_changed_configuration_replaces_pending_keeps_leased(database: str, queue_name: str) -> None:
    now = datetime.now(UTC)
    soon, later, latest = now + timedelta(seconds=1), now + timedelta(hours=1), now + timedelta(hours=2)
    with Queue(queue_name, database) as q:
        cron = CronService(q)
        assert cron.install_tick("h1", "rep", [(soon, "a"), (later, "b")]) == 2
        time.sleep(max(0.0, (soon - datetime.now(UTC)).total_seconds()) + 0.1)
        leased = q.poll(timedelta(minutes=1))
        assert leased is not None and leased.payload == "a"
        assert cron.install_tick("h2", "rep", [(latest, "c")]) == 1
        keys = {k for k in (leased.key, f"rep/h1/{later:%Y%m%dT%H%M%S.%fZ}", f"rep/h2/{latest:%Y%m%dT%H%M%S.%fZ}")}
        present = {k for k in keys if q.get(k) is not None}
        assert present == {leased.key, f"rep/h2/{latest:%Y%m%dT%H%M%S.%fZ}"}, "pending replaced, leased kept"
        leased.ack()


def test_same_configuration_creates_nothing_new(database: str, queue_name: str) -> None:
    with Queue(queue_name, database) as q:
        cron = CronService(q)
        args = ("daily", "Australia/Lord_Howe", [clock(9), clock(21)], timedelta(days=3))
        first = cron.install_daily_schedule(*args)
        first.stop()
        assert first.created in (5, 6, 7), "two a day for three days"
        again = cron.install_daily_schedule(*args)
        again.stop()
        assert again.created == 0, "a restart with the same configuration creates nothing"
        changed = cron.install_daily_schedule("daily", "Australia/Lord_Howe", [clock(10)], timedelta(days=3))
        changed.stop()
        assert changed.created >= 2 and q.stats().delayed == changed.created, "the old occurrences were replaced"
    assert (
        periodic_plan("p", timedelta(seconds=5), {"a": 1}).config_hash
        == periodic_plan("p", timedelta(seconds=5), {"a": 1}).config_hash
    )
    assert (
        periodic_plan("p", timedelta(seconds=5), {"a": 1}).config_hash
        != periodic_plan("p", timedelta(seconds=5), {"a": 2}).config_hash
    )


def test_dst_rules_for_daily_and_cron(database: str, queue_name: str) -> None:
    # New York springs forward on 2026-03-08 (02:00 -> 03:00) and falls back on 2026-11-01 (02:00 -> 01:00)
    spring = daily_plan("s", "America/New_York", [clock(2, 30)], timedelta(days=1)).generate(
        datetime(2026, 3, 8, 0, 0, tzinfo=ZoneInfo("America/New_York"))
    )
    assert [at.astimezone(ZoneInfo("America/New_York")).isoformat() for at, _ in spring] == [
        "2026-03-08T03:30:00-04:00"
    ], "a skipped time happens after the shift"
    autumn = daily_plan("a", "America/New_York", [clock(1, 30)], timedelta(days=1)).generate(
        datetime(2026, 11, 1, 0, 0, tzinfo=ZoneInfo("America/New_York"))
    )
    assert [at.isoformat() for at, _ in autumn] == ["2026-11-01T05:30:00+00:00"], "a repeated time happens once"
    # Lord Howe shifts by 30 minutes: 02:00 -> 02:30 on 2026-10-04
    howe = cron_plan("h", "15 2 * * *", "Australia/Lord_Howe", None, timedelta(days=2)).generate(
        datetime(2026, 10, 3, 12, 0, tzinfo=UTC)
    )
    assert len(howe) == 2
    with Queue(queue_name, database) as q:  # and they install as occurrence keys
        assert CronService(q).install_tick("dst", "dst", spring + autumn + howe) == 0, "all in the past"


def test_async_cron_service(database: str, queue_name: str) -> None:
    async def go() -> int:
        async with AsyncQueue(queue_name, database) as q:
            handle = await AsyncCronService(q).install_periodic_tick("atick", timedelta(seconds=1))
            await asyncio.sleep(2.5)
            await handle.stop()
            stats = await q.stats()
            return stats.ready + stats.delayed

    assert asyncio.run(go()) >= 3, "the task kept installing ahead"


def flaky(broken: threading.Event) -> Callable[[datetime], list[tuple[datetime, Any]]]:
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


def test_a_failing_run_is_logged_and_retried(database: str, queue_name: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="pgdq.cron")
    broken = threading.Event()
    with Queue(queue_name, database) as q:
        handle = CronService(q).install("h", "flaky", timedelta(seconds=0.1), flaky(broken))
        broken.set()
        wait_for(lambda: isinstance(handle.last_error, psycopg.errors.UntranslatableCharacter), "a server error")
        broken.clear()
        wait_for(lambda: handle.last_error is None and q.stats().delayed >= 2, "a run after the failures")
        handle.stop()
    failed = [r for r in caplog.records if r.getMessage().startswith("pgdq cron flaky: run failed")]
    assert [type(r.exc_info[1]).__name__ for r in failed[:2] if r.exc_info] == [
        "RuntimeError",
        "UntranslatableCharacter",
    ]


def test_async_cron_survives_a_failing_run(database: str, queue_name: str) -> None:
    async def go() -> tuple[int, Exception | None]:
        async with AsyncQueue(queue_name, database) as q:
            handle = await AsyncCronService(q).install("h", "aflaky", timedelta(seconds=0.1), flaky(threading.Event()))
            while (await q.stats()).delayed < 2:
                await asyncio.sleep(0.05)
            await handle.stop()
            return (await q.stats()).delayed, handle.last_error

    delayed, last_error = asyncio.run(asyncio.wait_for(go(), 10))
    assert delayed >= 2 and last_error is None, "installed again after the generator raised"


def test_database_schedule_fires_with_no_scheduler_running(database: str, queue_name: str) -> None:
    with Queue(queue_name, database) as q:
        next_at = q.schedule("db-tick", "* * * * * *", "Australia/Lord_Howe", {"db": 1})
        assert next_at > datetime.now(UTC) - timedelta(seconds=1)
        assert [s.name for s in q.schedules()] == ["db-tick"]
        seen = consume(database, queue_name, 3.5)  # 5 competing consumers, nothing else
        assert q.unschedule("db-tick") and q.schedules() == []
    assert seen and max(seen.values()) == 1, "each occurrence once"
    times = sorted(occurrence(k) for k in seen)
    assert len(times) >= 2 and all(b - a == timedelta(seconds=1) for a, b in zip(times, times[1:], strict=False))


def test_an_idle_worker_wakes_for_the_next_occurrence(database: str, queue_name: str) -> None:
    late: list[float] = []

    def handler(d: Any) -> None:
        late.append((datetime.now(UTC) - d.scheduled_at).total_seconds())

    with Queue(queue_name, database) as q:
        q.schedule("every2", "*/2 * * * * *")
        worker = Worker(queue_name, handler, dsn=database, idle_cap=timedelta(seconds=30))
        thread = threading.Thread(target=lambda: asyncio.run(worker.run_async()))
        thread.start()
        time.sleep(4.3)
        worker.stop()
        thread.join(30)
        q.unschedule("every2")
    assert len(late) >= 2 and max(late) < 0.5, f"woken by dq_next_due, not the 30 s cap: {late}"
