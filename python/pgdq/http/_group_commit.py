"""Group commit for the service's hot routes: concurrent offers, polls and
acks of one queue go to PostgreSQL together.

A request that finds no statement of its kind running for its queue goes
at once: an idle service adds no wait. Whatever arrives while one runs
waits for it to end (at most MAX_LAG), then goes as the next batch: one
dq_offer_many, dq_poll_many or dq_ack_many call, whose result is split so that each request gets its
own answer, exactly what it would have got alone. A batch that the database
refuses runs again request by request, so one request's bad input is never
its neighbours' error; a batch that could not reach the database fails each
of its requests with that error, as each alone would have failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from uuid import UUID

import psycopg
from psycopg_pool import AsyncConnectionPool

from .. import AsyncDelivery, AsyncQueue, _tracing
from ..model import Message, OfferResult

log = logging.getLogger("pgdq.http")

R = TypeVar("R")  # a request
A = TypeVar("A")  # its answer

# The most messages one batch carries (offered, polled or acked): a request
# bigger than this goes alone.
BATCH_LIMIT = 1000
# Seconds requests wait for the statement in front of them before they go
# anyway, as a batch of their own (pgdq serve --group-commit-lag): statements
# take about a millisecond, and one that waits on a lock (an offer of a key a
# transaction holds) must not hold up every other request of its kind and queue.
MAX_LAG = 0.005
# Seconds a batch's statement waits for a lock before it is rolled back and
# its requests run one by one, each then waiting as it would alone (pgdq
# serve --group-commit-lock-timeout): one request's key held by a transaction
# holds up no other request of its batch.
LOCK_TIMEOUT = 0.02
# How many requests of a refused batch run at once.
FALLBACK_CONCURRENCY = 4


class GroupCommit(Generic[R, A]):
    """Requests of one kind for one queue, answered in batches: run_many
    answers a batch in one statement (an answer per request, in order),
    run_one a request alone (a batch of one, and what a refused batch falls
    back to). size is a request's number of messages; unclaimed gets the
    answer of a request whose client left while its batch ran."""

    def __init__(
        self,
        run_many: Callable[[Sequence[R]], Awaitable[Sequence[A]]],
        run_one: Callable[[R], Awaitable[A]],
        size: Callable[[R], int],
        unclaimed: Callable[[A], Awaitable[None]] | None = None,
        on_idle: Callable[[], None] | None = None,
        on_batch: Callable[[int], None] | None = None,
        max_lag: float = MAX_LAG,
        tasks: set[asyncio.Task[None]] | None = None,
    ) -> None:
        self._run_many, self._run_one, self._size = run_many, run_one, size
        self._unclaimed, self._on_idle, self._on_batch = unclaimed, on_idle, on_batch
        self._max_lag = max_lag
        self._waiting: list[tuple[R, asyncio.Future[A]]] = []
        self._tasks = set() if tasks is None else tasks  # batches and give-backs running (_spawn)
        self._running = 0  # statements of this kind running (a lone request's or a batch's)
        self._timer: asyncio.TimerHandle | None = None  # starts the waiting batch if none ends by then

    @property
    def idle(self) -> bool:
        """True when no statement runs and no request waits."""
        return not self._running and not self._waiting

    @property
    def waiting(self) -> int:
        """How many requests wait for the next batch."""
        return len(self._waiting)

    async def submit(self, request: R) -> A:
        """request's answer (or error): alone and at once if no statement of
        its kind runs, else from the batch that goes when one ends (or after
        max_lag, if none has: a statement waiting on a lock holds no one up longer)."""
        if self._running:
            future: asyncio.Future[A] = asyncio.get_running_loop().create_future()
            self._waiting.append((request, future))
            if self._timer is None:
                self._timer = asyncio.get_running_loop().call_later(self._max_lag, self._start_batch)
            return await future
        self._running += 1
        try:
            # in the caller's own task: its client leaving cancels its statement, as without batching
            return await self._run_one(request)
        finally:
            self._ended()

    def _ended(self) -> None:
        """A statement ended: start the batch of what waits, or go idle."""
        self._running -= 1
        if self._waiting:
            self._start_batch()
        elif not self._running and self._on_idle is not None:
            self._on_idle()

    def _start_batch(self) -> None:
        """Run the waiting requests' next batch in a task of its own (see
        _spawn); what is left past BATCH_LIMIT waits for the next end or lag."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._waiting:
            return
        batch = self._next_batch()
        self._running += 1
        self._spawn(self._run(batch))
        if self._waiting:
            self._timer = asyncio.get_running_loop().call_later(self._max_lag, self._start_batch)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run work in a task of its own, in an empty context, so that no
        request's leaving cancels it; kept in tasks until done (GroupCommits.close waits for them)."""
        task = asyncio.get_running_loop().create_task(work, context=contextvars.Context())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: list[tuple[R, asyncio.Future[A]]]) -> None:
        """Answer batch; whatever fails unforeseen still settles every request."""
        try:
            await self._answer(batch)
        except BaseException as e:
            for _, future in batch:
                _settle(future, error=e)
            if not isinstance(e, Exception):
                raise
            log.exception("a batch of %d requests failed", len(batch))
        finally:
            self._ended()

    def _next_batch(self) -> list[tuple[R, asyncio.Future[A]]]:
        """The waiting requests, oldest first, up to BATCH_LIMIT messages (at
        least one request), less those whose clients left."""
        taken, total = 0, 0
        for request, _ in self._waiting:
            total += self._size(request)
            if taken and total > BATCH_LIMIT:
                break
            taken += 1
        batch, self._waiting = self._waiting[:taken], self._waiting[taken:]
        return [(request, future) for request, future in batch if not future.done()]

    async def _answer(self, batch: list[tuple[R, asyncio.Future[A]]]) -> None:
        """Run batch and settle each request's future; the answers of those
        that left go to unclaimed after every other request has its own."""
        if not batch:
            return
        if len(batch) == 1:
            await self._answer_alone(*batch[0])
            return
        try:
            answers = await self._run_many([request for request, _ in batch])
        except Exception as e:
            if not _rolled_back(e):  # it may have run, or none could: each alone would have failed so
                for _, future in batch:
                    _settle(future, error=e)
                return
            log.debug("a batch of %d requests was refused (%s): running them one by one", len(batch), e)
            alone = asyncio.Semaphore(FALLBACK_CONCURRENCY)
            await asyncio.gather(*(self._answer_alone(request, future, alone) for request, future in batch))
            return
        if self._on_batch is not None:
            self._on_batch(len(batch))
        left = [answer for (_, future), answer in zip(batch, answers, strict=True) if not _answered(future, answer)]
        if left and self._unclaimed is not None:
            self._spawn(self._give_back(left))

    async def _answer_alone(
        self, request: R, future: asyncio.Future[A], alone: asyncio.Semaphore | None = None
    ) -> None:
        """Run request alone (at most alone's count at once) and settle its future."""
        try:
            async with alone or contextlib.nullcontext():
                answer = await self._run_one(request)
        except Exception as e:
            _settle(future, error=e)
            return
        if not _answered(future, answer) and self._unclaimed is not None:
            self._spawn(self._give_back([answer]))

    async def _give_back(self, answers: list[A]) -> None:
        """Hand the answers of requests that left to unclaimed."""
        for answer in answers:
            try:
                await self._unclaimed(answer)  # type: ignore[misc]
            except Exception as e:  # the lease then ends by itself
                log.warning("could not give back what a departed request was given: %s", e)


def _answered(future: asyncio.Future[Any], answer: Any) -> bool:
    """Give answer to future's request; False if it left."""
    if future.done():
        return False
    future.set_result(answer)
    return True


def _settle(future: asyncio.Future[Any], *, error: BaseException) -> None:
    """Fail future's request with error (cancel it for a cancellation), unless it left."""
    if future.done():
        return
    if isinstance(error, asyncio.CancelledError):
        future.cancel()
    else:
        future.set_exception(error)


def _rolled_back(error: BaseException) -> bool:
    """Whether error says the batch's statement was refused or rolled back
    whole, so that its requests may run again one by one: an error the
    server gave (bad input, a lock not granted within LOCK_TIMEOUT, a
    deadlock), one psycopg raised before sending (a NUL in a text), or an
    ack batch short of a token. Not a lost connection, a full pool or a
    statement timeout (it may have run; each alone would have failed too),
    nor a fault of Python's after the statement."""
    if isinstance(error, (_BatchShort, psycopg.DataError)):
        return True
    sqlstate = getattr(error, "sqlstate", None)
    return sqlstate is not None and sqlstate != psycopg.errors.QueryCanceled.sqlstate


@dataclass(frozen=True)
class OfferRequest:
    """The messages of one offer request, all or nothing: one (single, alone a dq_offer) or a batch."""

    messages: Sequence[Message]
    single: bool


@dataclass(frozen=True)
class PollRequest:
    """One poll's count."""

    count: int


@dataclass(frozen=True)
class AckRequest:
    """One ack request's lock tokens."""

    tokens: Sequence[UUID]

    @property
    def distinct(self) -> int:
        return len(set(self.tokens))


class _BatchShort(Exception):
    """An ack batch acked fewer tokens than it carried: rolled back, to run request by request."""


class GroupCommits:
    """The service's group commits: one per kind, queue and what a batch
    must share (an offer's can_update, a poll's lease), made on first use and
    dropped when idle. batching False: every request goes alone (pgdq serve --no-group-commit)."""

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        schema: str | None,
        *,
        batching: bool = True,
        max_lag: float = MAX_LAG,
        lock_timeout: float = LOCK_TIMEOUT,
    ) -> None:
        self._pool, self._schema, self._batching, self._max_lag = pool, schema, batching, max_lag
        self._lock_timeout = f"{max(round(lock_timeout * 1000), 1)}ms"
        self._groups: dict[tuple[Any, ...], GroupCommit[Any, Any]] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # every group's batches and give-backs running
        self.batches = 0  # batches of more than one request run so far
        self.batched = 0  # the requests in them

    def waiting(self) -> int:
        """How many requests wait for the next batch of their kind and queue."""
        return sum(group.waiting for group in self._groups.values())

    def _counted(self, size: int) -> None:
        self.batches += 1
        self.batched += size

    def _queue(self, name: str) -> AsyncQueue:
        return AsyncQueue(name, self._pool, schema=self._schema)

    @contextlib.asynccontextmanager
    async def _batch_transaction(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled connection in a transaction whose locks are waited for at most the lock timeout
        (SET LOCAL: nothing outlives it, behind PgBouncer's transaction pooling too)."""
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute("SELECT pg_catalog.set_config('lock_timeout', %s, true)", (self._lock_timeout,))
            yield conn

    async def close(self) -> None:
        """Wait for the batches and give-backs still running (before the pool closes)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks))

    def _group(self, key: tuple[Any, ...], make: Callable[..., GroupCommit[Any, Any]]) -> Any:
        """The group commit of key, made by make(on_idle=..., on_batch=...) if there is none."""
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = make(
                on_idle=lambda: self._drop(key), on_batch=self._counted, max_lag=self._max_lag, tasks=self._tasks
            )
        return group

    def _drop(self, key: tuple[Any, ...]) -> None:
        group = self._groups.get(key)
        if group is not None and group.idle:
            del self._groups[key]

    async def offer(
        self, queue: str, messages: Sequence[Message], can_update: bool, *, single: bool = False
    ) -> list[OfferResult]:
        """Offer messages to queue (dq_offer_many, all or nothing; single: one message, dq_offer),
        batched with concurrent offers."""
        q = self._queue(queue)

        async def many(requests: Sequence[OfferRequest]) -> list[list[OfferResult]]:
            async with self._batch_transaction() as conn:
                messages = [m for r in requests for m in r.messages]
                results = await q.offer_many(messages, can_update=can_update, conn=conn)
            return _split(results, [len(r.messages) for r in requests])

        async def one(request: OfferRequest) -> list[OfferResult]:
            if request.single:
                m = request.messages[0]
                outcome = await q.offer(
                    m.key, m.payload, m.scheduled_at, can_update=can_update, channel=m.channel, priority=m.priority
                )
                return [OfferResult(m.key, outcome)]
            return await q.offer_many(request.messages, can_update=can_update)

        if not self._batching or _tracing.inject(None) is not None:  # traced: alone, in its own producer span
            return await one(OfferRequest(messages, single))
        group = self._group(
            ("offer", queue, can_update), lambda **hooks: GroupCommit(many, one, lambda r: len(r.messages), **hooks)
        )
        return await group.submit(OfferRequest(messages, single))  # type: ignore[no-any-return]

    async def poll(self, queue: str, count: int, lease: float) -> list[AsyncDelivery]:
        """Up to count deliveries of queue (dq_poll_many), batched with concurrent polls of the same lease."""
        q = self._queue(queue)

        async def many(requests: Sequence[PollRequest]) -> list[list[AsyncDelivery]]:
            async with self._batch_transaction() as conn:
                deliveries = await q.poll_many(sum(r.count for r in requests), lease, conn=conn)
            shares, start = [], 0
            for r in requests:  # the oldest request first
                shares.append(deliveries[start : start + r.count])
                start += r.count
            return shares

        async def one(request: PollRequest) -> list[AsyncDelivery]:
            return await q.poll_many(request.count, lease)

        if not self._batching:
            return await one(PollRequest(count))

        async def give_back(deliveries: list[AsyncDelivery]) -> None:
            for d in deliveries:  # due again now, its attempt counted, its last error kept (dq_release)
                await q.release(d.id)

        group = self._group(
            ("poll", queue, lease),
            lambda **hooks: GroupCommit(many, one, lambda r: r.count, unclaimed=give_back, **hooks),
        )
        return await group.submit(PollRequest(count))  # type: ignore[no-any-return]

    async def ack(self, queue: str, tokens: Sequence[UUID]) -> int:
        """Ack tokens of queue (dq_ack_many): how many were current, batched with concurrent acks."""
        q = self._queue(queue)

        async def many(requests: Sequence[AckRequest]) -> list[int]:
            # one dq_ack_many of every token: each request acked all its tokens,
            # or the transaction is rolled back and they run one by one
            tokens = list({t: None for r in requests for t in r.tokens})
            if len(tokens) < sum(r.distinct for r in requests):  # a token in two requests: one of them is stale
                raise _BatchShort
            async with self._batch_transaction() as conn:
                if await q.ack_many(tokens, conn=conn) < len(tokens):
                    raise _BatchShort
            return [r.distinct for r in requests]

        async def one(request: AckRequest) -> int:
            return await q.ack_many(request.tokens)

        if not self._batching:
            return await one(AckRequest(tokens))
        group = self._group(("ack", queue), lambda **hooks: GroupCommit(many, one, lambda r: len(r.tokens), **hooks))
        return await group.submit(AckRequest(tokens))  # type: ignore[no-any-return]


def _split(items: Sequence[Any], sizes: Sequence[int]) -> list[list[Any]]:
    """items cut into consecutive runs of sizes."""
    runs, start = [], 0
    for size in sizes:
        runs.append(list(items[start : start + size]))
        start += size
    return runs
