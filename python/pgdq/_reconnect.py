"""Riding out a lost connection: which errors heal by themselves, how long to
wait between tries, and retrying(), the one async loop that calls again. One
policy for the worker's calls, its LISTEN loop, its heartbeats and the cron
services (TRANSIENT, is_transient and RetryDelays sleep nowhere: sync code uses
them too)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import psycopg
from psycopg_pool import PoolTimeout

from .errors import PgdqError

T = TypeVar("T")

# errors a lost connection or a restarting server raise; callers retry these
TRANSIENT = (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout, OSError)

# what a database call can raise: a lost connection, or an error the server reported
DATABASE_ERRORS = (*TRANSIENT, psycopg.Error, PgdqError)


def is_transient(error: BaseException) -> bool:
    """True when error heals by itself (a lost connection, a restarting server)."""
    return isinstance(error, TRANSIENT)


@dataclass
class RetryDelays:
    """Waits between tries of something that keeps failing: first, doubled
    after each failure, at most cap; back to first after a success."""

    first: float = 0.1
    cap: float = 5.0
    failures: int = field(default=0, init=False)

    def failed(self) -> float:
        """Count a failure; the seconds to wait before the next try."""
        self.failures += 1
        return min(self.first * 2.0 ** (self.failures - 1), self.cap)

    def succeeded(self) -> None:
        """Count a success: the next failure waits `first` again."""
        self.failures = 0


def describe(error: BaseException) -> str:
    """An error in one line, with its SQLSTATE if it has one."""
    sqlstate = getattr(error, "sqlstate", None)
    return f"{type(error).__name__}{f' [{sqlstate}]' if sqlstate else ''}: {' '.join(str(error).split())}"


def _cancelling() -> bool:
    """True when the running task has been asked to cancel."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def retrying(
    what: str,
    call: Callable[[], Awaitable[T]],
    *,
    log: logging.Logger,
    delays: RetryDelays | None = None,
    errors: tuple[type[BaseException], ...] = TRANSIENT,
) -> T:
    """await call() until it returns; its answer. Each error of `errors` is
    logged (a transient one as a warning, others as errors) and the call made
    again after delays.failed(); any other error propagates, and so does a
    cancellation, even one the call turned into an error of its own."""
    delays = delays if delays is not None else RetryDelays()
    while True:
        try:
            answer = await call()
        except errors as e:
            if _cancelling():
                raise asyncio.CancelledError from e  # the call turned our cancellation into its error
            wait = delays.failed()
            level = logging.WARNING if is_transient(e) else logging.ERROR
            log.log(level, "%s failed (%s); trying again in %.1f s", what, describe(e), wait)
            await asyncio.sleep(wait)
        else:
            delays.succeeded()
            return answer
