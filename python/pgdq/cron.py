"""Recurring messages from Python: CronService (blocking, a thread per
schedule) and AsyncCronService (an asyncio task per schedule).

A schedule is a plan: a key prefix, a config hash derived from its whole
configuration, how often to run, and a generator of (time, payload)
occurrences ahead of now. Each run installs them with dq_cron_install, so an
occurrence is one message with an occurrence key: however many processes run
the same schedule, each occurrence exists once; a changed configuration (a new
hash) replaces the old one's pending occurrences; restarting with the same one
creates nothing new. The first run may update occurrences (can_update true),
later runs only add (false), as the SQL API intends (docs/sql-reference.md).

    cron = CronService(Queue("reports", pool))
    cron.install_cron("daily-report", "0 2 * * *", "Europe/Bucharest", {"kind": "daily"})
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from croniter import croniter

from ._async_queue import AsyncQueue
from ._sync_queue import Queue
from .errors import InvalidArgument
from .worker import TRANSIENT

log = logging.getLogger("pgdq.cron")

Occurrences = list[tuple[datetime, Any]]
Generator = Callable[[datetime], Iterable[tuple[datetime, Any]]]

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
RETRY_CAP = timedelta(seconds=30)  # the longest wait between retries of a failing plan (or its interval)


@dataclass(frozen=True)
class Plan:
    """What a schedule installs, and how often."""

    key_prefix: str
    config_hash: str
    interval: timedelta
    generate: Generator  # now -> the occurrences to install


def config_hash(*parts: Any) -> str:
    """A short stable hash of a configuration (JSON of its parts)."""
    text = json.dumps(parts, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# --- plans: pure functions of the configuration -------------------------------


def periodic_plan(key_prefix: str, period: timedelta, payload: Any) -> Plan:
    """Occurrences at every multiple of period since the Unix epoch (UTC);
    runs every max(period / 4, 1 s) and keeps two runs' worth ahead."""
    if period <= timedelta(0):
        raise InvalidArgument(f"period must be positive, got {period}")
    interval = max(period / 4, timedelta(seconds=1))
    horizon = 2 * max(period, interval)

    def generate(now: datetime) -> Occurrences:
        step = (now - EPOCH) // period + 1
        first = EPOCH + step * period
        count = int(horizon / period) + 1
        return [(first + i * period, payload) for i in range(count)]

    return Plan(key_prefix, config_hash("periodic", period.total_seconds(), payload), interval, generate)


def daily_plan(
    key_prefix: str,
    timezone: str,
    times_of_day: Sequence[time],
    schedule_in_advance: timedelta,
    payload: Any = None,
) -> Plan:
    """Occurrences at each local time of day in timezone, schedule_in_advance
    ahead. A time that a DST change skips happens at the same wall time after
    the shift (02:30 on a spring-forward night becomes 03:30); a time that
    happens twice (fall back) happens once, the first time."""
    zone = _zone(timezone)
    if not times_of_day:
        raise InvalidArgument("times_of_day must not be empty")
    _positive(schedule_in_advance, "schedule_in_advance")

    def generate(now: datetime) -> Occurrences:
        end = now + schedule_in_advance
        day, last = now.astimezone(zone).date() - timedelta(days=1), end.astimezone(zone).date()
        found: Occurrences = []
        while day <= last:
            found += [(at, payload) for t in times_of_day if now < (at := _local(day, t, zone)) <= end]
            day += timedelta(days=1)
        return sorted(found, key=lambda o: o[0])

    times = sorted(t.isoformat() for t in times_of_day)
    digest = config_hash("daily", timezone, times, payload)
    return Plan(key_prefix, digest, _interval_for(schedule_in_advance), generate)


def cron_plan(key_prefix: str, expression: str, timezone: str, payload: Any, schedule_in_advance: timedelta) -> Plan:
    """Occurrences of a cron expression (5 fields, or 6 with leading seconds)
    in timezone, schedule_in_advance ahead (croniter decides DST edges)."""
    zone = _zone(timezone)
    _positive(schedule_in_advance, "schedule_in_advance")
    seconds_first = len(expression.split()) == 6
    if not croniter.is_valid(expression, second_at_beginning=seconds_first):
        raise InvalidArgument(f"not a cron expression: {expression!r}")

    def generate(now: datetime) -> Occurrences:
        it = croniter(expression, now.astimezone(zone), second_at_beginning=seconds_first)
        found: Occurrences = []
        while (at := it.get_next(datetime)) <= now + schedule_in_advance:
            found.append((at.astimezone(UTC), payload))
        return found

    digest = config_hash("cron", expression, timezone, payload)
    return Plan(key_prefix, digest, _interval_for(schedule_in_advance), generate)


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (KeyError, ValueError) as e:
        raise InvalidArgument(f"unknown time zone {name!r}") from e


def _positive(value: timedelta, name: str) -> None:
    if value <= timedelta(0):
        raise InvalidArgument(f"{name} must be positive, got {value}")


def _interval_for(schedule_in_advance: timedelta) -> timedelta:
    """Run often enough that the horizon never runs dry: a quarter of it,
    between 1 second and 1 hour."""
    return min(max(schedule_in_advance / 4, timedelta(seconds=1)), timedelta(hours=1))


def _local(day: date, at: time, zone: ZoneInfo) -> datetime:
    """Wall time `at` on `day` in zone, in UTC. fold=0 (PEP 495) gives the
    rules in daily_plan: a skipped time maps forward by the shift, a repeated
    one to its first occurrence."""
    return datetime.combine(day, at, tzinfo=zone).replace(fold=0).astimezone(UTC)


# --- running plans --------------------------------------------------------------


class _Schedules:
    """The install_* methods, shared by both services: each builds a plan and
    hands it to start()."""

    def start(self, plan: Plan) -> Any:
        raise NotImplementedError

    def install(self, config_hash: str, key_prefix: str, interval: timedelta, generator: Generator) -> Any:
        """Run generator(now) every interval and install what it yields; a handle to stop it."""
        _positive(interval, "interval")
        return self.start(Plan(key_prefix, config_hash, interval, generator))

    def install_periodic_tick(self, key_prefix: str, period: timedelta, payload: Any = None) -> Any:
        """A message at every multiple of period; a handle to stop it."""
        return self.start(periodic_plan(key_prefix, period, payload))

    def install_daily_schedule(
        self,
        key_prefix: str,
        timezone: str,
        times_of_day: Sequence[time],
        schedule_in_advance: timedelta = timedelta(days=1),
        payload: Any = None,
    ) -> Any:
        """A message at each local time of day; a handle to stop it."""
        return self.start(daily_plan(key_prefix, timezone, times_of_day, schedule_in_advance, payload))

    def install_cron(
        self,
        key_prefix: str,
        expression: str,
        timezone: str = "UTC",
        payload: Any = None,
        schedule_in_advance: timedelta = timedelta(hours=1),
    ) -> Any:
        """A message at each time a cron expression names; a handle to stop it."""
        return self.start(cron_plan(key_prefix, expression, timezone, payload, schedule_in_advance))


class CronHandle:
    """A running schedule (blocking service): created is what its first run
    created; last_error the exception of the latest run if it failed (None
    once a run succeeds). Failed runs are logged and retried."""

    def __init__(self, created: int) -> None:
        self.created = created
        self.last_error: Exception | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def stop(self) -> None:
        """Stop installing (what was installed stays)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


class CronService(_Schedules):
    """Schedules for a Queue, each run by a daemon thread."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue

    def install_tick(self, config_hash: str, key_prefix: str, messages: Occurrences, *, can_update: bool = True) -> int:
        """Install these occurrences once; how many were created."""
        return self.queue.cron_install(key_prefix, config_hash, messages, can_update=can_update)

    def start(self, plan: Plan) -> CronHandle:
        handle = CronHandle(self.install_tick(plan.config_hash, plan.key_prefix, _upcoming(plan)))
        name = f"pgdq-cron-{plan.key_prefix}"
        handle._thread = threading.Thread(target=self._repeat, args=(plan, handle), daemon=True, name=name)
        handle._thread.start()
        return handle

    def _repeat(self, plan: Plan, handle: CronHandle) -> None:
        """Run the plan every interval until stopped; a failed run never ends the thread."""
        delay = plan.interval.total_seconds()
        while not handle._stop.wait(delay):
            try:
                self.install_tick(plan.config_hash, plan.key_prefix, _upcoming(plan), can_update=False)
            except Exception as e:
                handle.last_error = e
                delay = _after_failure(plan, e, delay)
            else:
                handle.last_error = None
                delay = plan.interval.total_seconds()


class AsyncCronHandle:
    """A running schedule (asyncio service): created is what its first run
    created; last_error the exception of the latest run if it failed (None
    once a run succeeds). Failed runs are logged and retried."""

    def __init__(self, created: int) -> None:
        self.created = created
        self.last_error: Exception | None = None
        self._task: asyncio.Task[None] | None = None

    async def stop(self) -> None:
        """Stop installing (what was installed stays)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


class AsyncCronService(_Schedules):
    """Schedules for an AsyncQueue, each run by an asyncio task. The install_*
    methods return coroutines of AsyncCronHandle."""

    def __init__(self, queue: AsyncQueue) -> None:
        self.queue = queue

    async def install_tick(
        self, config_hash: str, key_prefix: str, messages: Occurrences, *, can_update: bool = True
    ) -> int:
        """Install these occurrences once; how many were created."""
        return await self.queue.cron_install(key_prefix, config_hash, messages, can_update=can_update)

    async def start(self, plan: Plan) -> AsyncCronHandle:
        handle = AsyncCronHandle(await self.install_tick(plan.config_hash, plan.key_prefix, _upcoming(plan)))
        handle._task = asyncio.create_task(self._repeat(plan, handle))
        return handle

    async def _repeat(self, plan: Plan, handle: AsyncCronHandle) -> None:
        """Run the plan every interval until cancelled; a failed run never ends the task."""
        delay = plan.interval.total_seconds()
        while True:
            await asyncio.sleep(delay)
            try:
                await self.install_tick(plan.config_hash, plan.key_prefix, _upcoming(plan), can_update=False)
            except Exception as e:
                handle.last_error = e
                delay = _after_failure(plan, e, delay)
            else:
                handle.last_error = None
                delay = plan.interval.total_seconds()


def _after_failure(plan: Plan, error: Exception, delay: float) -> float:
    """Log a failed run; the wait before the next: the interval after a lost
    connection (it heals), else the last wait doubled, up to RETRY_CAP (or
    the interval, if longer), logged with the traceback."""
    interval = plan.interval.total_seconds()
    if isinstance(error, TRANSIENT):
        log.warning("pgdq cron %s: install failed (%s); trying again next run", plan.key_prefix, error)
        return interval
    after = min(delay * 2, max(interval, RETRY_CAP.total_seconds()))
    log.error("pgdq cron %s: run failed; trying again in %.1f s", plan.key_prefix, after, exc_info=error)
    return after


def _upcoming(plan: Plan) -> Occurrences:
    """The plan's occurrences as of now."""
    return list(plan.generate(datetime.now(UTC)))
