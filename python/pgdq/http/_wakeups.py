"""One LISTEN dq_wakeup connection per server process (through a pgdq.shard
router, one per partition): every long-polling request of a queue waits on
it, so idle requests hold no database connection."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from functools import partial

import psycopg
from psycopg import AsyncConnection

from .. import shard
from .._reconnect import DATABASE_ERRORS, RetryDelays, retrying

log = logging.getLogger("pgdq.http")


class Wakeups:
    """Waiters by queue; a notification for a queue (or a new connection,
    which may have missed some) wakes its waiters."""

    def __init__(self, dsn: str, schema: str | None = None) -> None:
        self.dsn, self.schema = dsn, schema
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Listen in the background until stop()."""
        self._task = asyncio.create_task(self._listen())

    async def stop(self) -> None:
        """Stop listening."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    @contextlib.contextmanager
    def waiter(self, queue: str) -> Iterator[asyncio.Event]:
        """An event set by the next wake-up of queue, registered until the block ends."""
        event = asyncio.Event()
        self._waiters.setdefault(queue, set()).add(event)
        try:
            yield event
        finally:
            waiting = self._waiters[queue]
            waiting.discard(event)
            if not waiting:
                del self._waiters[queue]

    def waiting(self) -> int:
        """How many requests wait now."""
        return sum(len(w) for w in self._waiters.values())

    def _wake(self, queue: str | None) -> None:
        """Wake the waiters of queue (None: of every queue)."""
        for name, events in self._waiters.items():
            if queue is None or name == queue:
                for event in events:
                    event.set()

    async def _listen(self) -> None:
        """LISTEN where wake-ups are raised: on dsn, or through a router on every
        partition (any queue may be asked for), each connection opened again whenever it fails."""
        find = partial(shard.wakeup_sources, self.dsn, self.schema or "public", None)
        sources = await retrying(
            "reaching the database (to find where wake-ups are raised)", find, log=log, errors=DATABASE_ERRORS
        )
        await asyncio.gather(*(self._listen_to(source) for source in sources))

    async def _listen_to(self, source: str) -> None:
        delays = RetryDelays()
        listen = partial(self._listen_once, source, delays)
        await retrying("LISTEN dq_wakeup", listen, log=log, delays=delays, errors=DATABASE_ERRORS)

    async def _listen_once(self, source: str, delays: RetryDelays) -> None:
        """Connect to source, LISTEN, wake everyone (notifications may have been missed), then relay."""
        async with await AsyncConnection.connect(source, autocommit=True) as conn:
            await conn.execute("LISTEN dq_wakeup")
            delays.succeeded()
            self._wake(None)
            async for note in conn.notifies():
                self._wake(note.payload)
        raise psycopg.OperationalError("the wake-up connection ended")
