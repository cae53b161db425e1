"""AsyncCronService: recurring messages from Python, an asyncio task per schedule.

This file is the source: _sync_cron.py (CronService) is generated from it by
python/tools/gen_sync.py, so the two services never drift. Edit this file,
then run `make sync-code`. The plans they run are in _cron_plans.py.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import time, timedelta
from typing import Any

from ._async_queue import AsyncQueue
from ._compat import AEvent, AWorker, agather, aspawn
from ._cron_plans import Generator, Occurrences, Plan, cron_plan, daily_plan, periodic_plan, positive, upcoming
from ._reconnect import RetryDelays, is_transient

log = logging.getLogger("pgdq.cron")

RETRY_CAP = timedelta(seconds=30)  # the longest wait between retries of a failing plan (or its interval)


class AsyncCronHandle:
    """A running schedule: created is how many occurrences its first run
    created; last_error the exception of the latest run if it failed (None
    once a run succeeds). Failed runs are logged and retried."""

    def __init__(self, created: int) -> None:
        self.created = created
        self.last_error: Exception | None = None
        self._stopping = AEvent()
        self._worker: AWorker | None = None

    async def stop(self) -> None:
        """Stop installing (what was installed stays); returns once a run under way is over."""
        self._stopping.set()
        if self._worker is not None:
            await agather(self._worker)


class AsyncCronService:
    """Recurring messages for the AsyncQueue given, each schedule run by an asyncio task.

    Each install_* method installs the schedule's next occurrences at once
    (a run that may update pending ones), then again every interval from
    an asyncio task of its own (runs that only add), and returns its
    AsyncCronHandle: .created (what the first run created), .last_error,
    .stop(). How far ahead each run installs, and how often it runs:

    - install_periodic_tick(period): the next two periods (at least 2 s),
      every max(period / 4, 1 s);
    - install_daily_schedule: schedule_in_advance ahead (default 1 day), and
      install_cron: schedule_in_advance ahead (default 1 hour); both run
      every schedule_in_advance / 4, between 1 s and 1 hour;
    - install(config_hash, key_prefix, interval, generator): whatever
      generator(now) yields, every interval.

    A failing run is logged and retried: one interval later after a lost
    connection, else after waits doubling from one interval up to RETRY_CAP
    (30 s) or the interval if longer. Occurrences are installed only while
    this process runs its schedules (those installed are delivered anyway);
    a schedule stored in the database (Queue.schedule) needs no process.
    Processes running the same schedule install each occurrence once.
    """

    def __init__(self, queue: AsyncQueue) -> None:
        self.queue = queue

    async def install_tick(
        self, config_hash: str, key_prefix: str, messages: Occurrences, *, can_update: bool = True
    ) -> int:
        """Install these occurrences once; how many were created."""
        return await self.queue.cron_install(key_prefix, config_hash, messages, can_update=can_update)

    async def install(
        self, config_hash: str, key_prefix: str, interval: timedelta, generator: Generator
    ) -> AsyncCronHandle:
        """Run generator(now) every interval and install what it yields; a handle to stop it."""
        positive(interval, "interval")
        return await self.start(Plan(key_prefix, config_hash, interval, generator))

    async def install_periodic_tick(self, key_prefix: str, period: timedelta, payload: Any = None) -> AsyncCronHandle:
        """A message at every multiple of period; a handle to stop it."""
        return await self.start(periodic_plan(key_prefix, period, payload))

    async def install_daily_schedule(
        self,
        key_prefix: str,
        timezone: str,
        times_of_day: Sequence[time],
        schedule_in_advance: timedelta = timedelta(days=1),
        payload: Any = None,
    ) -> AsyncCronHandle:
        """A message at each local time of day; a handle to stop it."""
        return await self.start(daily_plan(key_prefix, timezone, times_of_day, schedule_in_advance, payload))

    async def install_cron(
        self,
        key_prefix: str,
        expression: str,
        timezone: str = "UTC",
        payload: Any = None,
        schedule_in_advance: timedelta = timedelta(hours=1),
    ) -> AsyncCronHandle:
        """A message at each time a cron expression names; a handle to stop it."""
        return await self.start(cron_plan(key_prefix, expression, timezone, payload, schedule_in_advance))

    async def start(self, plan: Plan) -> AsyncCronHandle:
        """Run the plan now (it may update), then every interval (only adding) until stopped."""
        handle = AsyncCronHandle(await self.install_tick(plan.config_hash, plan.key_prefix, upcoming(plan)))
        handle._worker = aspawn(self._repeat, (plan, handle), name=f"pgdq-cron-{plan.key_prefix}")
        return handle

    async def _repeat(self, plan: Plan, handle: AsyncCronHandle) -> None:
        """Run the plan every interval until stopped; a failed run never ends the loop."""
        interval = plan.interval.total_seconds()
        delays = RetryDelays(first=interval, cap=max(interval, RETRY_CAP.total_seconds()))
        wait = interval
        while not await handle._stopping.wait_timeout(wait):
            try:
                await self.install_tick(plan.config_hash, plan.key_prefix, upcoming(plan), can_update=False)
            except Exception as e:
                handle.last_error = e
                wait = _after_failure(plan, e, delays)
            else:
                handle.last_error = None
                delays.succeeded()
                wait = interval


def _after_failure(plan: Plan, error: Exception, delays: RetryDelays) -> float:
    """Log a failed run; the seconds to wait before the next: one interval
    after a lost connection (it heals), else the next of delays (logged
    with the traceback)."""
    if is_transient(error):
        log.warning("pgdq cron %s: install failed (%s); trying again next run", plan.key_prefix, error)
        return plan.interval.total_seconds()
    wait = delays.failed()
    log.error("pgdq cron %s: run failed; trying again in %.1f s", plan.key_prefix, wait, exc_info=error)
    return wait
