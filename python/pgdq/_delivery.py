"""Running one delivery: its handler under a heartbeat and a timeout, then ack, retry with backoff or dead letter."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, TypeVar

from . import _tracing
from ._async_queue import AsyncDelivery, AsyncQueue
from ._reconnect import DATABASE_ERRORS, RetryDelays, describe, retrying
from ._words import count
from .retry import HandlerTimeout, Policy, Retry

log = logging.getLogger("pgdq.worker.delivery")

T = TypeVar("T")
# what became of a delivery: acked; retried at the handler's request; failed
# and retried after the backoff; dead-lettered (attempts used up, or its
# payload undecodable); its outcome no longer ours to write
Outcome = Literal["handled", "retried", "failed", "dead_lettered", "lost"]
OUTCOMES: tuple[Outcome, ...] = ("handled", "retried", "failed", "dead_lettered", "lost")
Settle = Callable[[], Awaitable[bool]]


@dataclass
class Running:
    """One delivery being handled, under its queue's policy."""

    queue: AsyncQueue
    delivery: AsyncDelivery
    policy: Policy
    lost: threading.Event = field(default_factory=threading.Event)  # lease_lost(): lease lost or timed out
    ours: bool = True  # the outcome is ours to write: not once the lease was lost or handed back
    task: asyncio.Task[Any] | None = None  # the async handler's task
    seconds: float | None = None  # how long the handler ran (None: it did not run)
    error: BaseException | None = None  # the handler's error (or the payload's), for the trace
    why: str | None = None  # why it failed or was dead-lettered, in words, for the trace

    def give_up(self) -> None:
        """The outcome is no longer ours: lease_lost() turns true, an async handler is cancelled."""
        self.ours = False
        self.lost.set()
        if self.task is not None:
            self.task.cancel()


def named(d: AsyncDelivery) -> str:
    """How logs name a delivery's message: queue/key, or "queue message 42"
    for a keyless one (key None: named by its id)."""
    return f"{d.queue}/{d.key}" if d.key is not None else f"{d.queue} message {d.id}"


_current: contextvars.ContextVar[Running] = contextvars.ContextVar("pgdq_current")


def lease_lost() -> bool:
    """Inside a handler: True once its lease was lost (another consumer may
    have the message now) or it ran past its timeout. Sync handlers should
    check it and stop; async handlers are cancelled instead."""
    running = _current.get(None)
    return running is not None and running.lost.is_set()


async def deliver(run: Running) -> Outcome:
    """Handle the delivery (_handle); when tracing, inside a CONSUMER span
    continuing the trace its headers carry, its status the outcome (pgdq._tracing)."""
    traced = _tracing.consuming(run.delivery)
    if traced is None:
        return await _handle(run)
    try:
        outcome = await _handle(run)
    except BaseException as e:
        traced.finish(None, e, None)
        raise
    traced.finish(outcome, run.error, run.why)
    return outcome


async def _handle(run: Running) -> Outcome:
    """Run the handler under a heartbeat, then ack, retry or dead-letter; an
    undecodable payload goes to the dead letters without a handler."""
    d = run.delivery
    if d.decode_error is not None:
        return await _settle(run, *_bury(run, d.decode_error, f"it cannot be decoded: {describe(d.decode_error)}"))
    heartbeat = asyncio.create_task(_heartbeat(run))
    _current.set(run)
    settle: Settle
    outcome: Outcome
    started = time.perf_counter()
    try:
        await _call(run)
        log.debug("%s handled (attempt %d)", named(d), d.attempts)
        settle, outcome = partial(run.queue.ack, d.lock_token), "handled"
    except asyncio.CancelledError:
        if run.ours:
            raise
        return "lost"
    except Retry as retry:
        settle, outcome = _retry(run, retry)
    except Exception as error:  # HandlerTimeout included
        settle, outcome = _fail(run, error)
    finally:
        heartbeat.cancel()
        run.seconds = time.perf_counter() - started
    return await _settle(run, settle, outcome)


async def _call(run: Running) -> None:
    """Call the handler: an async one as a task of its own (so a lost lease
    can cancel it), a plain one in a thread of its own (so one abandoned
    keeps no slot); HandlerTimeout past the policy's timeout."""
    fn = run.policy.handler
    if inspect.iscoroutinefunction(fn):
        run.task = asyncio.create_task(fn(run.delivery))
        work: asyncio.Future[Any] = run.task
    else:
        work = asyncio.wrap_future(_in_thread(contextvars.copy_context().run, fn, run.delivery))
    limit = None if run.policy.timeout is None else run.policy.timeout.total_seconds()
    done, _ = await asyncio.wait({work}, timeout=limit)
    if not done:
        raise _time_out(run, work, limit)
    work.result()


async def _settle(run: Running, settle: Settle, outcome: Outcome) -> Outcome:
    """Write the outcome (ack / nack / dead letter), retried while the server
    is unreachable; "lost" when the lease was lost or the delivery handed back."""
    key = named(run.delivery)
    if not run.ours:
        log.warning("%s finished after its lease was lost; left alone", key)
        return "lost"
    if not await retrying(f"settling {key}", settle, log=log):
        log.warning("%s was no longer ours when it finished", key)
        return "lost"
    return outcome


def _retry(run: Running, retry: Retry) -> tuple[Settle, Outcome]:
    """The handler raised Retry: nack it for retry.at (else the backoff's time)
    with its state, or dead-letter it once max_attempts are used up."""
    d = run.delivery
    at = run.policy.next_try(d.attempts, retry.at)
    if at is None:
        return _bury(run, f"Retry requested after {count(d.attempts, 'attempt')}", "Retry requested")
    when = at.isoformat(timespec="seconds")
    log.info(
        "%s: retry requested (attempt %d of %d); next try at %s", named(d), d.attempts, run.policy.max_attempts, when
    )
    return partial(run.queue.nack, d.lock_token, at, retry.state), "retried"


def _fail(run: Running, error: Exception) -> tuple[Settle, Outcome]:
    """The handler failed: nack it for after the backoff, the error kept with
    the message, or dead-letter it once max_attempts are used up."""
    d = run.delivery
    run.error, run.why = error, describe(error)
    at = run.policy.next_try(d.attempts)
    if at is None:
        return _bury(run, error, describe(error))
    log.info(
        "%s failed (attempt %d of %d): %s; next try at %s",
        named(d),
        d.attempts,
        run.policy.max_attempts,
        describe(error),
        at.isoformat(timespec="seconds"),
    )
    return partial(run.queue.nack, d.lock_token, at, error=error_text(error)), "failed"


def _bury(run: Running, error: BaseException | str, why: str) -> tuple[Settle, Outcome]:
    """Dead-letter the delivery with error (an exception: its traceback), saying why."""
    d = run.delivery
    log.warning("%s dead-lettered (attempt %d of %d): %s", named(d), d.attempts, run.policy.max_attempts, why)
    run.error, run.why = (None if isinstance(error, str) else error), why
    text = error if isinstance(error, str) else error_text(error)
    return partial(run.queue.dead_letter, d.lock_token, text), "dead_lettered"


async def _heartbeat(run: Running) -> None:
    """Extend the lease every lease/3 (a failed extend is tried again sooner);
    once the lease is lost, give the delivery up."""
    d, lease = run.delivery, run.policy.lease
    every = lease.total_seconds() / 3
    while True:
        await asyncio.sleep(every)
        extend = partial(run.queue.extend, d.lock_token, lease)
        delays = RetryDelays(cap=every)
        if await retrying(f"heartbeat of {named(d)}", extend, log=log, delays=delays, errors=DATABASE_ERRORS):
            continue
        log.warning("lease of %s lost; its result will be ignored", named(d))
        run.give_up()
        return


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


def _time_out(run: Running, work: asyncio.Future[Any], limit: float | None) -> HandlerTimeout:
    """A handler past its timeout: lease_lost() turns true, an async one is
    cancelled, a sync one abandoned (its thread runs on) and reported."""
    run.lost.set()
    work.cancel()
    what = "cancelled" if run.task is not None else "abandoned, its thread still running"
    log.error("handler of %s ran past its timeout of %s s; %s", named(run.delivery), limit, what)
    return HandlerTimeout(f"the handler ran past its timeout of {limit} s")


def error_text(error: BaseException) -> str:
    """What a message keeps of a handler's error: its traceback, at most 4000 characters."""
    return "".join(traceback.format_exception(error))[-4000:]
