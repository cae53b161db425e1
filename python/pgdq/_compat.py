"""The asyncio calls of pgdq's async code, each beside its blocking twin.

Async modules (and async tests) call the `a`-names; python/tools/gen_sync.py
renames them to the blocking names (its ASYNC_TO_SYNC map) when it writes
the sync twin, as psycopg's _acompat.py does. Each pair behaves alike.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeAlias

AWorker: TypeAlias = "asyncio.Task[None]"
Worker: TypeAlias = threading.Thread
Event = threading.Event
sleep = time.sleep


class AEvent(asyncio.Event):
    """An asyncio.Event that waits with a timeout, as threading.Event does."""

    async def wait_timeout(self, timeout: float) -> bool:
        """Wait until set or timeout seconds pass; whether it is set (threading.Event.wait)."""
        try:
            await asyncio.wait_for(self.wait(), timeout)
        except TimeoutError:
            return False
        return True


def aspawn(
    run: Callable[..., Coroutine[Any, Any, None]], args: tuple[Any, ...] = (), name: str | None = None
) -> AWorker:
    """Start run(*args) as an asyncio task."""
    return asyncio.create_task(run(*args), name=name)


def spawn(run: Callable[..., None], args: tuple[Any, ...] = (), name: str | None = None) -> Worker:
    """Start run(*args) in a daemon thread."""
    thread = threading.Thread(target=run, args=args, name=name, daemon=True)
    thread.start()
    return thread


async def agather(*workers: AWorker) -> None:
    """Wait until every task has finished."""
    await asyncio.gather(*workers)


def gather(*workers: Worker) -> None:
    """Wait until every thread has finished."""
    for worker in workers:
        worker.join()


async def asleep(seconds: float) -> None:
    """Sleep without blocking the event loop."""
    await asyncio.sleep(seconds)
