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
A delivery whose payload cannot be decoded goes to the dead letters at once,
with the decoding error. Errors of one queue's polls pause that queue (with
backoff), not the worker.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import os
import random
import signal
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, TypeVar

import psycopg
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from ._async_queue import AsyncDelivery, AsyncQueue
from .codec import Codec
from .errors import PgdqError

log = logging.getLogger("pgdq.worker")

Handler = Callable[[AsyncDelivery], Any]
T = TypeVar("T")

# errors a lost connection or a restarting server raise; the worker retries these
TRANSIENT = (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout, OSError)


@dataclass(frozen=True)
class Backoff:
    """Retry delays: base * factor ** (attempts - 1), at most cap, the last
    `jitter` fraction of it drawn at random so failing messages spread out."""

    base: timedelta = timedelta(seconds=1)
    cap: timedelta = timedelta(minutes=10)
    factor: float = 2.0
    jitter: float = 0.5

    def delay(self, attempts: int) -> timedelta:
        """The wait before the next delivery after `attempts` deliveries failed."""
        full = min(self.cap.total_seconds(), self.base.total_seconds() * self.factor ** max(0, attempts - 1))
        return timedelta(seconds=full * (1 - self.jitter * random.random()))


class Retry(Exception):  # noqa: N818 - raised as control flow, like StopIteration
    """Raise from a handler to retry at a chosen time (an aware datetime, or a
    delay), saving state as the message's checkpoint. at=None: the backoff."""

    def __init__(self, at: datetime | timedelta | None = None, state: Any = None) -> None:
        super().__init__(at, state)
        self.at = at
        self.state = state


class HandlerTimeout(Exception):  # noqa: N818 - the failure recorded, like Retry
    """The failure a handler running past its timeout is retried (and at
    last dead-lettered) with; the worker records it, handlers do not raise it."""


@dataclass(frozen=True)
class Route:
    """A queue's handler and its overrides of the worker's defaults."""

    handler: Handler
    lease: timedelta | None = None
    max_attempts: int | None = None
    backoff: Backoff | None = None
    timeout: timedelta | None = None


def handler(
    *,
    lease: timedelta | None = None,
    max_attempts: int | None = None,
    backoff: Backoff | None = None,
    timeout: timedelta | None = None,
) -> Callable[[T], T]:
    """Decorator: per-handler overrides of lease, max_attempts, backoff and timeout."""

    def mark(fn: T) -> T:
        marks = {"lease": lease, "max_attempts": max_attempts, "backoff": backoff, "timeout": timeout}
        fn.__pgdq_route__ = marks  # type: ignore[attr-defined]
        return fn

    return mark


@dataclass(frozen=True)
class _Policy:
    """A queue's handler with every setting resolved."""

    handler: Handler
    lease: timedelta
    max_attempts: int
    backoff: Backoff
    timeout: timedelta | None


@dataclass
class _Running:
    """One delivery being handled."""

    queue: AsyncQueue
    delivery: AsyncDelivery
    lost: threading.Event = field(default_factory=threading.Event)  # lease_lost(): lease lost or timed out
    ours: bool = True  # the outcome is ours to write: not once the lease was lost or handed back
    task: asyncio.Task[Any] | None = None  # the async handler's task


@dataclass
class _Pause:
    """A call about one queue that keeps failing: when to try it again."""

    failures: int = 0
    until: float = 0.0  # time.monotonic()


_current: contextvars.ContextVar[_Running] = contextvars.ContextVar("pgdq_current")


def lease_lost() -> bool:
    """Inside a handler: True once its lease was lost (another consumer may
    have the message now) or it ran past its timeout. Sync handlers should
    check it and stop; async handlers are cancelled instead."""
    running = _current.get(None)
    return running is not None and running.lost.is_set()


class Worker:
    """Consume one or more queues. queues is a queue name (with handler) or a
    mapping of queue name to handler or Route.

    timeout (default None: none) bounds each handler call; past it the
    handler is told to stop (lease_lost(); an async one is cancelled, a sync
    one's thread is abandoned, as Python cannot stop it), its slot is freed
    and the message is retried with backoff, then dead-lettered after
    max_attempts, as a failure (HandlerTimeout). Route and @handler override it.
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
    ) -> None:
        if isinstance(queues, str):
            if handler is None:
                raise TypeError("Worker(queue, handler): the handler is missing")
            queues = {queues: handler}
        if not queues or concurrency < 1 or max_attempts < 1:
            raise ValueError("a worker needs at least one queue, concurrency >= 1 and max_attempts >= 1")
        self.dsn = dsn
        self.concurrency = concurrency
        self.grace = grace
        self.idle_cap = idle_cap
        defaults = _Policy(route_missing, lease, max_attempts, backoff or Backoff(), timeout)
        self.routes = {name: _resolve(r, defaults) for name, r in queues.items()}
        if any(r.timeout is not None and r.timeout <= timedelta(0) for r in self.routes.values()):
            raise ValueError("a handler timeout must be positive (None: no timeout)")
        if any(r.lease <= timedelta(0) or r.max_attempts < 1 for r in self.routes.values()):
            raise ValueError("every queue needs a positive lease and max_attempts >= 1")
        self._queue_args: dict[str, Any] = {"schema": schema, "codec": codec, "payload_type": payload_type}
        self._running: dict[asyncio.Task[None], _Running] = {}
        self._pauses: dict[tuple[str, str], _Pause] = {}
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()
        self._signals = 0
        self._loop: asyncio.AbstractEventLoop | None = None

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
        pool = AsyncConnectionPool(
            self.dsn,
            min_size=1,
            max_size=min(self.concurrency, 16) + 2,  # polls, heartbeats and acks are short
            kwargs={"autocommit": True},
            check=AsyncConnectionPool.check_connection,
            open=False,
            name="pgdq-worker",
        )
        await pool.open(wait=False)
        queues = {name: AsyncQueue(name, pool, lease=r.lease, **self._queue_args) for name, r in self.routes.items()}
        listener = asyncio.create_task(self._listen())
        try:
            await self._configure(queues)
            await self._consume(queues)
            await self._drain()
        finally:
            listener.cancel()
            await pool.close()
            if handle_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    self._loop.remove_signal_handler(sig)
        log.info("pgdq worker stopped cleanly")
        return 0

    def stop(self) -> None:
        """Ask for a graceful stop (from any thread)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._begin_stop)

    def _on_signal(self, sig: int) -> None:
        self._signals += 1
        if self._signals > 1:
            log.warning("pgdq worker: second %s, exiting now", signal.Signals(sig).name)
            os._exit(128 + sig)
        log.info("pgdq worker: %s, finishing running handlers", signal.Signals(sig).name)
        self._begin_stop()

    def _begin_stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    # --- fetching ------------------------------------------------------------

    async def _configure(self, queues: Mapping[str, AsyncQueue]) -> None:
        """Store each queue's max_attempts, so polls dead-letter messages whose
        consumers keep crashing (retried while the server is unreachable)."""
        for name, q in queues.items():
            configure = partial(q.configure, max_attempts=self.routes[name].max_attempts)
            await self._retrying(f"configure {name}", configure)

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
        earliest next due time of the queues or end of a pause, at most idle_cap."""
        wait = self.idle_cap.total_seconds()
        if slots_free:
            now = datetime.now(UTC)
            for name, q in queues.items():
                if paused := self._pause_left(name, "poll"):
                    wait = min(wait, paused)
                    continue
                if self._pause_left(name, "next_due"):
                    continue
                due = await self._guarded(name, "next_due", q.next_due(), None)
                if due is not None:
                    wait = min(wait, max(0.0, (due - now).total_seconds()))
        if wait > 0:
            try:
                await asyncio.wait_for(self._wake.wait(), wait)
            except TimeoutError:
                pass

    async def _listen(self) -> None:
        """LISTEN dq_wakeup on a connection of its own; reconnect when it drops."""
        delay = 0.1
        while True:
            try:
                async with await AsyncConnection.connect(self.dsn, autocommit=True) as conn:
                    await conn.execute("LISTEN dq_wakeup")
                    delay = 0.1
                    self._wake.set()  # anything offered while we were not listening
                    async for note in conn.notifies():
                        if note.payload in self.routes:
                            self._wake.set()
            except TRANSIENT as e:
                log.warning("pgdq worker: wake-up connection lost (%s); reconnecting in %.1f s", e, delay)
            except psycopg.Error as e:  # not fatal: polls still run, woken by idle_cap meanwhile
                log.error("pgdq worker: LISTEN dq_wakeup failed (%s); retrying in %.1f s", e, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    # --- handling ------------------------------------------------------------

    def _start(self, q: AsyncQueue, delivery: AsyncDelivery) -> None:
        run = _Running(q, delivery)
        task = asyncio.create_task(self._handle(run))
        self._running[task] = run
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._running.pop(task, None)
        self._wake.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("pgdq worker: internal error", exc_info=task.exception())

    async def _handle(self, run: _Running) -> None:
        """Run the handler under a heartbeat, then ack, retry or dead-letter;
        an undecodable payload goes to the dead letters without a handler."""
        policy = self.routes[run.queue.name]
        if run.delivery.decode_error is not None:
            await self._settle(run, partial(self._bury_undecodable, run))
            return
        heartbeat = asyncio.create_task(self._heartbeat(run, policy.lease))
        _current.set(run)
        outcome: Callable[[], Awaitable[bool]]
        try:
            await self._call(policy, run)
            outcome = partial(run.queue.ack, run.delivery.lock_token)
        except asyncio.CancelledError:
            if run.ours:
                raise
            return
        except Retry as retry:
            outcome = partial(self._retry, run, policy, retry)
        except Exception as error:  # HandlerTimeout included
            outcome = partial(self._fail, run, policy, error)
        finally:
            heartbeat.cancel()
        await self._settle(run, outcome)

    @staticmethod
    async def _call(policy: _Policy, run: _Running) -> None:
        """Call the handler: an async one as a task of its own (so a lost lease
        can cancel it), a plain one in a thread of its own (so one abandoned
        keeps no slot); HandlerTimeout past policy.timeout."""
        fn = policy.handler
        if inspect.iscoroutinefunction(fn):
            run.task = asyncio.create_task(fn(run.delivery))
            work: asyncio.Future[Any] = run.task
        else:
            work = asyncio.wrap_future(_in_thread(contextvars.copy_context().run, fn, run.delivery))
        limit = None if policy.timeout is None else policy.timeout.total_seconds()
        done, _ = await asyncio.wait({work}, timeout=limit)
        if not done:
            raise _time_out(run, work, limit)
        work.result()

    async def _settle(self, run: _Running, call: Callable[[], Awaitable[Any]]) -> None:
        """Ack / nack / dead-letter, unless the lease was lost or the delivery
        was handed back; retried while the server is unreachable."""
        if not run.ours:
            log.warning("pgdq worker: %s finished after its lease was lost; left alone", run.delivery.key)
            return
        if not await self._retrying(f"settle {run.delivery.key}", call):
            log.warning("pgdq worker: %s was no longer ours when it finished", run.delivery.key)

    async def _retry(self, run: _Running, route: _Policy, retry: Retry) -> bool:
        d = run.delivery
        if d.attempts >= route.max_attempts:
            return await run.queue.dead_letter(d.lock_token, f"Retry requested after {d.attempts} attempts")
        at = retry.at
        if at is None:
            at = datetime.now(UTC) + route.backoff.delay(d.attempts)
        elif isinstance(at, timedelta):
            at = datetime.now(UTC) + at
        return await run.queue.nack(d.lock_token, at, retry.state)

    async def _fail(self, run: _Running, route: _Policy, error: Exception) -> bool:
        d = run.delivery
        if d.attempts >= route.max_attempts:
            log.warning("pgdq worker: %s failed %s times, dead-lettered: %r", d.key, d.attempts, error)
            return await run.queue.dead_letter(d.lock_token, _error_text(error))
        at = datetime.now(UTC) + route.backoff.delay(d.attempts)
        log.info("pgdq worker: %s failed (%r), retrying at %s", d.key, error, at.isoformat())
        return await run.queue.nack(d.lock_token, at)

    @staticmethod
    async def _bury_undecodable(run: _Running) -> bool:
        """Dead-letter a delivery whose payload the codec rejected, with why."""
        d = run.delivery
        log.error("pgdq worker: %s/%s: payload cannot be decoded, dead-lettered: %s", d.queue, d.key, d.decode_error)
        return await run.queue.dead_letter(d.lock_token, _error_text(d.decode_error))

    async def _heartbeat(self, run: _Running, lease: timedelta) -> None:
        """Extend the lease every lease/3; on a stale token, mark it lost and
        cancel an async handler."""
        while True:
            await asyncio.sleep(lease.total_seconds() / 3)
            try:
                until = await run.queue.extend(run.delivery.lock_token, lease)
            except TRANSIENT as e:
                log.warning("pgdq worker: heartbeat for %s failed (%s); trying again", run.delivery.key, e)
                continue
            except psycopg.Error as e:
                log.error("pgdq worker: heartbeat for %s refused (%s); trying again", run.delivery.key, e)
                continue
            if until is None:
                log.warning("pgdq worker: lease of %s lost; its result will be ignored", run.delivery.key)
                run.ours = False
                run.lost.set()
                if run.task is not None:
                    run.task.cancel()
                return

    async def _drain(self) -> None:
        """Shutdown: wait up to grace for running handlers, then hand the rest
        back (due now) so another consumer takes them without waiting for the lease."""
        if not self._running:
            return
        log.info("pgdq worker: waiting up to %s for %d handlers", self.grace, len(self._running))
        _, pending = await asyncio.wait(set(self._running), timeout=self.grace.total_seconds())
        for task in pending:
            run = self._running[task]
            run.ours = False
            if run.task is not None:
                run.task.cancel()
            handed_back = await self._safely(run.queue.nack(run.delivery.lock_token), False)
            log.warning(
                "pgdq worker: %s still running at shutdown; %s",
                run.delivery.key,
                "handed back" if handed_back else "left to its lease",
            )
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    # --- resilience ----------------------------------------------------------

    async def _safely(self, call: Awaitable[T], fallback: T) -> T:
        """One database call of the fetch loop: a lost connection is logged and
        answered with fallback after a short pause (the loop tries again)."""
        try:
            return await call
        except TRANSIENT as e:
            log.warning("pgdq worker: database unreachable (%s); retrying", e)
            await asyncio.sleep(1.0)
            return fallback

    async def _guarded(self, queue: str, what: str, call: Awaitable[T], fallback: T) -> T:
        """A call (what) about one queue, as _safely; any other error (a bad
        argument, permission denied, ...) is logged naming the queue, and
        pauses that call of that queue alone, 0.1 s doubling up to idle_cap."""
        try:
            result = await self._safely(call, fallback)
        except Exception as e:
            pause = self._pauses.setdefault((queue, what), _Pause())
            pause.failures += 1
            delay = min(0.1 * 2 ** (pause.failures - 1), self.idle_cap.total_seconds())
            pause.until = time.monotonic() + delay
            log.error(
                "pgdq worker: %s of queue %s failed (%s); trying again in %.1f s, other queues go on",
                what,
                queue,
                _describe(e),
                delay,
                exc_info=not isinstance(e, (psycopg.Error, PgdqError)),
            )
            return fallback
        self._pauses.pop((queue, what), None)
        return result

    def _pause_left(self, queue: str, what: str) -> float:
        """Seconds until a paused call (what) of queue may be tried again; 0 if not paused."""
        pause = self._pauses.get((queue, what))
        return 0.0 if pause is None else max(0.0, pause.until - time.monotonic())

    async def _retrying(self, what: str, call: Callable[[], Awaitable[Any]]) -> Any:
        """Call until it gets through, backing off from 0.1 s to 5 s."""
        delay = 0.1
        while True:
            try:
                return await call()
            except TRANSIENT as e:
                log.warning("pgdq worker: %s failed (%s); retrying in %.1f s", what, e, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)


def route_missing(delivery: AsyncDelivery) -> None:
    raise AssertionError("the worker's defaults have no handler")


def _resolve(route: Handler | Route, worker: _Policy) -> _Policy:
    """Settings for one queue: the Route's, else the handler's (@handler), else the worker's."""
    if not isinstance(route, Route):
        route = Route(route)
    marks = getattr(route.handler, "__pgdq_route__", {})
    return _Policy(
        route.handler,
        _first_set(route.lease, marks.get("lease"), worker.lease),
        _first_set(route.max_attempts, marks.get("max_attempts"), worker.max_attempts),
        _first_set(route.backoff, marks.get("backoff"), worker.backoff),
        _first_set(route.timeout, marks.get("timeout"), worker.timeout),
    )


def _first_set(*values: Any) -> Any:
    """The first value that is not None (a zero or empty setting counts as set)."""
    return next((v for v in values if v is not None), None)


def _in_thread(fn: Callable[..., T], *args: Any) -> Future[T]:
    """fn(*args) in a new daemon thread (named pgdq-handler); its future."""
    future: Future[T] = Future()
    future.set_running_or_notify_cancel()  # running: a cancel cannot drop its result

    def target() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as e:
            future.set_exception(e)

    threading.Thread(target=target, name="pgdq-handler", daemon=True).start()
    return future


def _time_out(run: _Running, work: asyncio.Future[Any], limit: float | None) -> HandlerTimeout:
    """A handler past its timeout: lease_lost() turns true, an async one is
    cancelled, a sync one abandoned (its thread runs on) and reported."""
    run.lost.set()
    work.cancel()
    what = "cancelled" if run.task is not None else "abandoned, its thread still running"
    log.error(
        "pgdq worker: handler of %s/%s ran past its timeout of %s s; %s", run.queue.name, run.delivery.key, limit, what
    )
    return HandlerTimeout(f"the handler ran past its timeout of {limit} s")


def _describe(error: Exception) -> str:
    """An error in one line, with its SQLSTATE if it has one."""
    sqlstate = getattr(error, "sqlstate", None)
    return f"{type(error).__name__}{f' [{sqlstate}]' if sqlstate else ''}: {' '.join(str(error).split())}"


def _error_text(error: BaseException | None) -> str:
    """What a dead letter records of an error: its traceback, at most 4000 characters."""
    return "".join(traceback.format_exception(error))[-4000:] if error is not None else ""
