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
import contextvars
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from uuid import UUID

from psycopg_pool import AsyncConnectionPool

from .. import AsyncDelivery, AsyncQueue, _tracing
from .._reconnect import is_transient
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
        max_lag: float = 0.005,
    ) -> None:
        self._run_many, self._run_one, self._size = run_many, run_one, size
        self._unclaimed, self._on_idle, self._on_batch = unclaimed, on_idle, on_batch
        self._max_lag = max_lag
        self._waiting: list[tuple[R, asyncio.Future[A]]] = []
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
        """Run the waiting requests' next batch in a task of its own, in an
        empty context, so that no request's leaving cancels it."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._waiting:
            return
        batch = self._next_batch()
        self._running += 1
        asyncio.get_running_loop().create_task(self._run(batch), context=contextvars.Context())

    async def _run(self, batch: list[tuple[R, asyncio.Future[A]]]) -> None:
        """Answer batch; whatever fails unforeseen still settles every request."""
        try:
            await self._answer(batch)
        except BaseException as e:
            for _, future in batch:
                if not future.done():
                    future.cancel() if isinstance(e, asyncio.CancelledError) else future.set_exception(e)
            raise
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
        """Run batch and settle each request's future."""
        if not batch:
            return
        if len(batch) == 1:
            await self._answer_alone(*batch[0])
            return
        if self._on_batch is not None:
            self._on_batch(len(batch))
        try:
            answers = await self._run_many([request for request, _ in batch])
        except Exception as e:
            if _unreachable(e):  # each alone would have failed so
                for _, future in batch:
                    _settle(future, error=e)
                return
            log.debug("a batch of %d requests was refused (%s): running them one by one", len(batch), e)
            await asyncio.gather(*(self._answer_alone(request, future) for request, future in batch))
            return
        for (_, future), answer in zip(batch, answers, strict=True):
            await self._settle_or_return(future, answer)

    async def _answer_alone(self, request: R, future: asyncio.Future[A]) -> None:
        """Run request alone and settle its future."""
        try:
            answer = await self._run_one(request)
        except Exception as e:
            _settle(future, error=e)
            return
        await self._settle_or_return(future, answer)

    async def _settle_or_return(self, future: asyncio.Future[A], answer: A) -> None:
        """Give answer to future's request; if it left, hand answer to unclaimed."""
        if not future.done():
            future.set_result(answer)
        elif self._unclaimed is not None:
            try:
                await self._unclaimed(answer)
            except Exception as e:  # the lease then ends by itself
                log.warning("could not give back what a departed request was given: %s", e)


def _settle(future: asyncio.Future[Any], *, error: BaseException) -> None:
    """Fail future's request with error, unless it left."""
    if not future.done():
        future.set_exception(error)


def _unreachable(error: BaseException) -> bool:
    """Whether error says the statement may not have run as sent (a lost
    connection, a full pool, a cancelled statement): then no request runs again."""
    return is_transient(error)  # QueryCanceled is an OperationalError


@dataclass(frozen=True)
class OfferRequest:
    """The messages of one offer request (one or a batch), all or nothing."""

    messages: Sequence[Message]


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
        self, pool: AsyncConnectionPool[Any], schema: str | None, *, batching: bool = True, max_lag: float = MAX_LAG
    ) -> None:
        self._pool, self._schema, self._batching, self._max_lag = pool, schema, batching, max_lag
        self._groups: dict[tuple[Any, ...], GroupCommit[Any, Any]] = {}
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

    def _group(self, key: tuple[Any, ...], make: Callable[..., GroupCommit[Any, Any]]) -> Any:
        """The group commit of key, made by make(on_idle=..., on_batch=...) if there is none."""
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = make(
                on_idle=lambda: self._drop(key), on_batch=self._counted, max_lag=self._max_lag
            )
        return group

    def _drop(self, key: tuple[Any, ...]) -> None:
        group = self._groups.get(key)
        if group is not None and group.idle:
            del self._groups[key]

    async def offer(self, queue: str, messages: Sequence[Message], can_update: bool) -> list[OfferResult]:
        """Offer messages to queue (dq_offer_many, all or nothing), batched with concurrent offers."""
        q = self._queue(queue)

        async def many(requests: Sequence[OfferRequest]) -> list[list[OfferResult]]:
            results = await q.offer_many([m for r in requests for m in r.messages], can_update=can_update)
            return _split(results, [len(r.messages) for r in requests])

        async def one(request: OfferRequest) -> list[OfferResult]:
            if len(request.messages) == 1:
                m = request.messages[0]
                outcome = await q.offer(
                    m.key, m.payload, m.scheduled_at, can_update=can_update, channel=m.channel, priority=m.priority
                )
                return [OfferResult(m.key, outcome)]
            return await q.offer_many(request.messages, can_update=can_update)

        if not self._batching or _tracing.inject(None) is not None:  # traced: alone, in its own producer span
            return await one(OfferRequest(messages))
        group = self._group(
            ("offer", queue, can_update), lambda **hooks: GroupCommit(many, one, lambda r: len(r.messages), **hooks)
        )
        return await group.submit(OfferRequest(messages))  # type: ignore[no-any-return]

    async def poll(self, queue: str, count: int, lease: float) -> list[AsyncDelivery]:
        """Up to count deliveries of queue (dq_poll_many), batched with concurrent polls of the same lease."""
        q = self._queue(queue)

        async def many(requests: Sequence[PollRequest]) -> list[list[AsyncDelivery]]:
            deliveries = await q.poll_many(sum(r.count for r in requests), lease)
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
            for d in deliveries:  # due again now, as a consumer's nack leaves it
                await q.nack(d.lock_token)

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
            async with self._pool.connection() as conn, conn.transaction():
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
