"""Worker: consume queues with handlers, with leases kept alive, retries with
backoff, dead letters, wake-ups instead of polling, and a clean shutdown.

    worker = Worker({"emails": send_email}, dsn="postgresql:///app", concurrency=8)
    worker.run()            # until SIGTERM / SIGINT; returns 0 after a clean stop

A handler takes the delivery (payload decoded) and returns when the work is
done; the worker acks it. Async handlers run as asyncio tasks, plain functions
each in a thread of its own. Raising `Retry(at=..., state=...)` brings the message back
at a chosen time with a checkpoint; any other exception retries it with the
backoff policy, and after max_attempts moves it to the dead letters. A
handler running past its timeout (none by default) is treated as a failure.
A delivery whose payload cannot be decoded (or whose payload, state or
headers hold JSON Python cannot read) goes to the dead letters at once,
with the decoding error; the rest of its batch is handled. Errors of one
queue's polls pause that queue (with backoff), not the worker. One SIGTERM
stops it within seconds whatever the database does (a call under way gets
STOP_WAIT, then is cancelled).

This module is the fetch loop and the start and stop; pgdq.retry holds the
policy users configure, pgdq._delivery runs one delivery, pgdq._reconnect
rides out a lost connection. It logs to "pgdq.worker" (start, stop, a line a
minute while waiting, errors of the fetch loop) and "pgdq.worker.delivery"
(retries, dead letters, timeouts, lost leases; each handled message at DEBUG);
psycopg.pool's lines about the worker's own pool are dropped, as the worker
logs each failed call itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import re
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Coroutine, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, TypeVar

import psycopg
from psycopg import AsyncConnection
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool

from . import shard
from ._async_queue import AsyncDelivery, AsyncQueue
from ._delivery import OUTCOMES, Outcome, Running, deliver, lease_lost, named
from ._reconnect import DATABASE_ERRORS, RetryDelays, describe, is_transient, retrying
from ._worker_metrics import OutcomeRecorder, WorkerMetrics
from .codec import Codec
from .retry import Backoff, Handler, HandlerTimeout, Policy, Retry, Route, handler, resolve, route_missing

__all__ = ["Backoff", "Handler", "HandlerTimeout", "Retry", "Route", "Worker", "WorkerMetrics", "handler", "lease_lost"]

log = logging.getLogger("pgdq.worker")
T = TypeVar("T")
POOL_NAME = "pgdq-worker"
# seconds a call under way at a stop (a poll, a hand-back) may still take
STOP_WAIT = 2.0


class _OwnPoolFailures(logging.Filter):
    """Drops psycopg.pool's lines about the worker's own pool: the worker logs
    each failed call itself, naming what failed, so a failure is logged once."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.args, tuple) and POOL_NAME in record.args)


logging.getLogger("psycopg.pool").addFilter(_OwnPoolFailures())


@dataclass
class _Pause:
    """A call about one queue that keeps failing: when to try it again."""

    delays: RetryDelays
    until: float = 0.0  # time.monotonic()


class Worker:
    """Consume one or more queues. queues is a queue name (with handler) or a
    mapping of queue name to handler or Route.

    timeout (default None: none) bounds each handler call; past it the
    handler is told to stop (lease_lost(); an async one is cancelled, a sync
    one's thread is abandoned, as Python cannot stop it), its slot is freed
    and the message is retried with backoff, then dead-lettered after
    max_attempts, as a failure (HandlerTimeout). Route and @handler override it.

    report_every (an attribute, default a minute) is how often a waiting
    worker logs that it waits, with what it handled since the last such line.
    metrics (e.g. WorkerMetrics, what `pgdq worker --metrics-port` uses) is
    told each delivery's outcome and its handler's duration.

    Behind PgBouncer in transaction pooling mode: listen_dsn goes straight
    to the server (LISTEN needs a session of its own; default: dsn), and
    prepared_statements=False keeps the pool's connections from preparing
    statements server-side (PgBouncer before 1.21 cannot keep them).
    """

    def __init__(
        self,
        queues: str | Mapping[str, Handler | Route],
        handler: Handler | None = None,
        *,
        dsn: str,
        concurrency: int = 8,
        lease: timedelta = timedelta(minutes=1),
        max_attempts: int = 10,
        backoff: Backoff | None = None,
        grace: timedelta = timedelta(seconds=30),
        idle_cap: timedelta = timedelta(seconds=30),
        schema: str | None = None,
        codec: Codec | None = None,
        payload_type: type[Any] | None = None,
        timeout: timedelta | None = None,
        metrics: OutcomeRecorder | None = None,
        listen_dsn: str | None = None,
        prepared_statements: bool = True,
    ) -> None:
        if isinstance(queues, str):
            if handler is None:
                raise TypeError("Worker(queue, handler): the handler is missing")
            queues = {queues: handler}
        if not queues or concurrency < 1 or max_attempts < 1:
            raise ValueError("a worker needs at least one queue, concurrency >= 1 and max_attempts >= 1")
        self.dsn = dsn
        self.listen_dsn = listen_dsn or dsn
        self.prepared_statements = prepared_statements
        self.schema = schema
        self.concurrency = concurrency
        self.grace = grace
        self.idle_cap = idle_cap
        self.report_every = timedelta(minutes=1)
        self.metrics = metrics
        defaults = Policy(route_missing, lease, max_attempts, backoff or Backoff(), timeout)
        self.routes = {name: resolve(r, defaults) for name, r in queues.items()}
        self._queue_args: dict[str, Any] = {"schema": schema, "codec": codec, "payload_type": payload_type}
        self._running: dict[asyncio.Task[Outcome], Running] = {}
        self._pauses: dict[tuple[str, str], _Pause] = {}
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()
        self._signals = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._since_report: Counter[str] = Counter()  # outcomes since the last waiting line
        self._since_start: Counter[str] = Counter()
        self._reported_at = 0.0  # time.monotonic()

    # --- running -------------------------------------------------------------

    def run(self) -> int:
        """Run until SIGTERM / SIGINT (a second one exits at once); 0 after a clean stop."""
        return asyncio.run(self.run_async(handle_signals=True))

    async def run_async(self, *, handle_signals: bool = False) -> int:
        """Run until stop() (or a signal, with handle_signals); 0 after a clean stop."""
        self._loop = asyncio.get_running_loop()
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._loop.add_signal_handler(sig, self._on_signal, sig)
        self._log_start()
        started = self._reported_at = time.monotonic()
        pool = AsyncConnectionPool(
            self.dsn,
            min_size=1,
            max_size=min(self.concurrency, 16) + 2,  # polls, heartbeats and acks are short
            kwargs={"autocommit": True, **({} if self.prepared_statements else {"prepare_threshold": None})},
            check=AsyncConnectionPool.check_connection,
            open=False,
            name=POOL_NAME,
        )
        await pool.open(wait=False)
        queues = {name: AsyncQueue(name, pool, lease=r.lease, **self._queue_args) for name, r in self.routes.items()}
        listener = asyncio.create_task(self._listen())
        try:
            await self._until_stopped(self._fetch(queues))
            await self._drain()
        finally:
            listener.cancel()
            await asyncio.wait({listener}, timeout=STOP_WAIT)
            await pool.close()
            if handle_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    self._loop.remove_signal_handler(sig)
        ran = timedelta(seconds=round(time.monotonic() - started))
        log.info("pgdq worker stopped cleanly after %s: %s", ran, _counted(self._since_start))
        return 0

    def stop(self) -> None:
        """Ask for a graceful stop (from any thread)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._begin_stop)

    def _on_signal(self, sig: int) -> None:
        self._signals += 1
        if self._signals > 1:
            log.warning("second %s, exiting now", signal.Signals(sig).name)
            os._exit(128 + sig)
        log.info("%s, finishing running handlers", signal.Signals(sig).name)
        self._begin_stop()

    def _begin_stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    def _log_start(self) -> None:
        """One INFO line: each queue with its lease and max_attempts, the
        concurrency, the schema and the DSN (without its password)."""
        queues = ", ".join(f"{name} ({_settings(policy)})" for name, policy in self.routes.items())
        log.info(
            "pgdq worker starting: queues %s; concurrency %d; schema %s; dsn %s",
            queues,
            self.concurrency,
            self.schema or "(search_path)",
            dsn_in_words(self.dsn),
        )

    # --- fetching ------------------------------------------------------------

    async def _fetch(self, queues: Mapping[str, AsyncQueue]) -> None:
        """Configure the queues, then consume them until the stop."""
        await self._configure(queues)
        await self._consume(queues)

    async def _until_stopped(self, work: Coroutine[Any, Any, None]) -> None:
        """Run work to its end; once a stop is asked for, give a call under way
        STOP_WAIT to finish (a poll's leases are not left to run out), then
        cancel it: a worker whose database is unreachable stops all the same."""
        task = asyncio.ensure_future(work)
        stop = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                await asyncio.wait({task}, timeout=STOP_WAIT)
        finally:
            stop.cancel()
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _configure(self, queues: Mapping[str, AsyncQueue]) -> None:
        """Store each queue's max_attempts, so polls dead-letter messages whose
        consumers keep crashing (retried while the server is unreachable)."""
        for name, q in queues.items():
            configure = partial(q.configure, max_attempts=self.routes[name].max_attempts)
            await retrying(f"configuring queue {name}", configure, log=log)

    async def _consume(self, queues: Mapping[str, AsyncQueue]) -> None:
        """Fill free slots with polls of the queues not paused; when nothing is
        due, sleep until the next due time, a wake-up, a free slot or the stop."""
        order = list(queues)
        while not self._stopping.is_set():
            self._wake.clear()
            free = self.concurrency - len(self._running)
            got = 0
            if free > 0:
                random.shuffle(order)  # no queue starves the others
                for name in order:
                    if got >= free or self._stopping.is_set():
                        break
                    if self._pause_left(name, "poll"):
                        continue
                    batch = await self._guarded(name, "poll", queues[name].poll_many(free - got), [])
                    for delivery in batch:
                        self._start(queues[name], delivery)
                    got += len(batch)
            if got == 0 and not self._stopping.is_set():
                await self._idle(queues, free > 0)

    async def _idle(self, queues: Mapping[str, AsyncQueue], slots_free: bool) -> None:
        """Wait for a wake-up, a finished handler, or (with free slots) the
        earliest next due time of the queues or end of a pause, at most idle_cap
        and at most until the next waiting line."""
        wait = self.idle_cap.total_seconds()
        due: datetime | None = None
        if slots_free:
            for name, q in queues.items():
                # a failing poll is tried again when its pause ends: at once
                # if it ended since _consume looked (not after idle_cap)
                if (name, "poll") in self._pauses:
                    wait = min(wait, self._pause_left(name, "poll"))
                    continue
                if paused := self._pause_left(name, "next_due"):
                    wait = min(wait, paused)
                    continue
                if (at := await self._guarded(name, "next_due", q.next_due(), None)) is not None:
                    due = at if due is None else min(due, at)
            if due is not None:
                wait = min(wait, max(0.0, (due - datetime.now(UTC)).total_seconds()))
        wait = min(wait, self._report_waiting(due, slots_free))
        if wait > 0:
            try:
                await asyncio.wait_for(self._wake.wait(), wait)
            except TimeoutError:
                pass

    def _report_waiting(self, due: datetime | None, looked: bool) -> float:
        """Once every report_every while waiting: an INFO line saying so (the
        next due time if looked up) with the outcomes since the last one.
        Seconds until the next such line."""
        left = self._reported_at + self.report_every.total_seconds() - time.monotonic()
        if left > 0:
            return left
        if not looked:
            upcoming = "no free slot"
        elif due is None:
            upcoming = "nothing due"
        else:
            upcoming = f"next due at {due.astimezone(UTC).isoformat(timespec='seconds')}"
        running = f"{len(self._running)} of {self.concurrency} handlers running"
        log.info("waiting for work: %s, %s; since the last report %s", running, upcoming, _counted(self._since_report))
        self._since_report.clear()
        self._reported_at = time.monotonic()
        return self.report_every.total_seconds()

    async def _listen(self) -> None:
        """LISTEN dq_wakeup where our queues' wake-ups are raised (listen_dsn;
        through a pgdq.shard router, each partition owning one of our queues),
        each on a connection of its own, opened again whenever it fails."""
        sources = [self.listen_dsn]
        if self.listen_dsn == self.dsn:
            sources = await retrying(
                "reaching the database (to find where wake-ups are raised)",
                self._partitions,
                log=log,
                errors=DATABASE_ERRORS,
            )
        await asyncio.gather(*(self._listen_to(source) for source in sources))

    async def _partitions(self) -> list[str]:
        """The partitions owning our queues when dsn is a router, else [dsn]."""
        return await shard.wakeup_sources(self.dsn, self.schema or "public", list(self.routes))

    async def _listen_to(self, source: str) -> None:
        delays = RetryDelays()
        listen = partial(self._listen_once, source, delays)
        await retrying("LISTEN dq_wakeup", listen, log=log, delays=delays, errors=DATABASE_ERRORS)

    async def _listen_once(self, source: str, delays: RetryDelays) -> None:
        """Connect to source and LISTEN (a success for delays); wake the fetch
        loop for each notification about our queues; raise when the connection ends."""
        async with await AsyncConnection.connect(source, autocommit=True) as conn:
            await conn.execute("LISTEN dq_wakeup")
            delays.succeeded()
            self._wake.set()  # anything offered while we were not listening
            async for note in conn.notifies():
                if note.payload in self.routes:
                    self._wake.set()
        raise psycopg.OperationalError("the wake-up connection ended")

    # --- handling ------------------------------------------------------------

    def _start(self, q: AsyncQueue, delivery: AsyncDelivery) -> None:
        """Handle the delivery in a task of its own, counted as running until it ends."""
        run = Running(q, delivery, self.routes[q.name])
        task = asyncio.create_task(deliver(run))
        self._running[task] = run
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[Outcome]) -> None:
        """A delivery's task ended: free its slot, wake the fetch loop, count its outcome."""
        run = self._running.pop(task, None)
        self._wake.set()
        if task.cancelled() or run is None:
            return
        if (error := task.exception()) is not None:
            log.error("internal error", exc_info=error)
            return
        self._since_report[task.result()] += 1
        self._since_start[task.result()] += 1
        if self.metrics is not None:
            self.metrics.record(run.delivery.queue, task.result(), run.seconds)

    async def _drain(self) -> None:
        """Shutdown: wait up to grace for running handlers, then hand the rest
        back (due now) so another consumer takes them without waiting for the lease."""
        if not self._running:
            return
        log.info("stopping: waiting up to %s for %d handlers", self.grace, len(self._running))
        _, pending = await asyncio.wait(set(self._running), timeout=self.grace.total_seconds())
        for task in pending:
            run = self._running[task]
            run.give_up()
            handed_back = await _hand_back(run)
            where = "handed back" if handed_back else "left to its lease"
            log.warning("%s still running at shutdown; %s", named(run.delivery), where)
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    # --- resilience ----------------------------------------------------------

    async def _guarded(self, queue: str, what: str, call: Awaitable[T], fallback: T) -> T:
        """A call (what) of the fetch loop about one queue; when it fails (a
        lost connection, a bad argument, permission denied, ...), it is logged
        naming the queue, answered with fallback, and that call of that queue
        alone pauses, 0.1 s doubling up to idle_cap."""
        try:
            result = await call
        except Exception as e:
            pause = self._pauses.setdefault((queue, what), _Pause(RetryDelays(cap=self.idle_cap.total_seconds())))
            delay = pause.delays.failed()
            pause.until = time.monotonic() + delay
            log.log(
                logging.WARNING if is_transient(e) else logging.ERROR,
                "%s of queue %s failed (%s); trying again in %.1f s, other queues go on",
                what,
                queue,
                describe(e),
                delay,
                exc_info=not isinstance(e, DATABASE_ERRORS),
            )
            return fallback
        self._pauses.pop((queue, what), None)
        return result

    def _pause_left(self, queue: str, what: str) -> float:
        """Seconds until a paused call (what) of queue may be tried again; 0 if not paused."""
        pause = self._pauses.get((queue, what))
        return 0.0 if pause is None else max(0.0, pause.until - time.monotonic())


async def _hand_back(run: Running) -> bool:
    """Nack a delivery due now, so another consumer takes it at once; False if
    that failed or took longer than STOP_WAIT (the database is unreachable)."""
    try:
        return await asyncio.wait_for(run.queue.nack(run.delivery.lock_token), STOP_WAIT)
    except (*DATABASE_ERRORS, TimeoutError) as e:
        log.warning("handing back %s failed (%s)", named(run.delivery), describe(e))
        return False


def without_password(dsn: str) -> str:
    """The conninfo dsn (key=value or URL) as key=value without any password,
    to be logged; a malformed one is not shown."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "(malformed)"
    return make_conninfo("", **{k: v for k, v in params.items() if "password" not in k})


def dsn_in_words(dsn: str) -> str:
    """The DSN for the start line, without its password; an empty one as the
    server libpq's defaults and the PG* variables set lead to."""
    if dsn:
        return without_password(dsn)
    values = {o.keyword.decode(): (o.val or b"").decode() for o in psycopg.pq.Conninfo.get_defaults()}
    named = sorted(v for v in os.environ if re.fullmatch(r"PG[A-Z]+", v) and v != "PGPASSWORD")
    source = f"the variables {', '.join(named)}" if named else "no PG* variable set"
    user = values.get("user") or "(the OS user)"
    where = f"host={values.get('host') or '(the local socket)'} port={values.get('port')}"
    return f"{where} dbname={values.get('dbname') or user} user={user} (no DSN given: libpq's defaults, {source})"


def _settings(policy: Policy) -> str:
    """A queue's lease, max_attempts and timeout, for the start line."""
    timeout = "" if policy.timeout is None else f", timeout {policy.timeout.total_seconds():g} s"
    return f"lease {policy.lease.total_seconds():g} s, max_attempts {policy.max_attempts}{timeout}"


def _counted(outcomes: Counter[str]) -> str:
    """Outcome counts in words: handled and failed always, the others when any."""
    shown = [k for k in OUTCOMES if outcomes[k] or k in ("handled", "failed")]
    return ", ".join(f"{outcomes[k]} {k.replace('_', '-')}" for k in shown)
