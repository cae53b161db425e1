"""The JSON API under /v1: one route per SQL function, each one statement
(a long poll: a statement per wake-up, no connection held while waiting)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal, TypeVar
from urllib.parse import unquote

import psycopg
from fastapi import APIRouter, Path, Request
from fastapi.routing import APIRoute
from psycopg import adapters
from psycopg.adapt import Buffer, Loader
from psycopg.pq import Format
from pydantic import BaseModel
from starlette.routing import Match
from starlette.types import Scope

from .. import AsyncClient, AsyncDelivery, AsyncQueue
from .._reconnect import is_transient
from ..codec import UnreadableJson
from ..model import Message, QueueStats
from ._access import ApiError, authorize
from ._models import (
    MAX_DEPTH,
    AckIn,
    AckOut,
    DeliveryOut,
    Done,
    ErrorOut,
    ExtendIn,
    ExtendOut,
    MessageOut,
    NackIn,
    OfferBatchIn,
    OfferBatchOut,
    OfferIn,
    OfferOut,
    PollIn,
    PollOut,
    too_deep,
)

log = logging.getLogger("pgdq.http")


class SegmentRoute(APIRoute):
    """A route whose path parameters are whole segments of the raw path, each
    percent-decoded once: the queue "a/b" is /v1/queues/a%2Fb/stats (the server
    decodes %2F before routing, where it would be one segment more)."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        """Match as usual; with an encoded "/" in the path, match the raw path and decode each parameter."""
        raw = scope.get("raw_path")
        if scope["type"] != "http" or not raw or b"%2f" not in raw.lower():
            return super().matches(scope)
        match, child = super().matches({**scope, "path": raw.decode("ascii", "replace")})
        if match != Match.NONE:
            params = child["path_params"]
            child["path_params"] = {k: unquote(v) if k in self.param_convertors else v for k, v in params.items()}
        return match, child


ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorOut} for code in (400, 401, 403, 404, 409, 413, 503)}
router = APIRouter(prefix="/v1", responses=ERRORS, route_class=SegmentRoute)
W = TypeVar("W", bound=BaseModel)
QueueName = Annotated[str, Path(min_length=1, max_length=100, description="the queue")]
KeyName = Annotated[str, Path(min_length=1, max_length=200, description="the message's key")]


# PostgreSQL's 'infinity' and '-infinity' timestamps as read on the service's
# connections (EndlessTimestamptzLoader), where psycopg would fail; wire_time
# answers them as those words.
INFINITY = datetime.max.replace(tzinfo=UTC)
MINUS_INFINITY = datetime.min.replace(tzinfo=UTC)
_TIMESTAMPTZ = adapters.get_loader(adapters.types["timestamptz"].oid, Format.TEXT)


class EndlessTimestamptzLoader(Loader):
    """timestamptz as psycopg reads it, but 'infinity' / '-infinity' as INFINITY / MINUS_INFINITY."""

    def __init__(self, oid: int, context: Any = None) -> None:
        super().__init__(oid, context)
        self._finite = _TIMESTAMPTZ(oid, context)  # type: ignore[misc]

    def load(self, data: Buffer) -> Any:
        """The datetime of data (its text), or INFINITY / MINUS_INFINITY."""
        if bytes(data[-1:]) == b"y":  # only the infinities end so: the hot path pays one comparison
            endless = {b"infinity": INFINITY, b"-infinity": MINUS_INFINITY}.get(bytes(data))
            if endless is not None:
                return endless
        return self._finite.load(data)


def wire_time(at: datetime | None) -> datetime | Literal["infinity", "-infinity"] | None:
    """at for JSON: INFINITY and MINUS_INFINITY (stored before 1.2) as "infinity" and "-infinity"."""
    return "infinity" if at == INFINITY else "-infinity" if at == MINUS_INFINITY else at


def _queue(request: Request, name: str) -> AsyncQueue:
    return AsyncQueue(name, request.app.state.pool, schema=request.app.state.settings.schema)


def _client(request: Request) -> AsyncClient:
    return AsyncClient(request.app.state.pool, schema=request.app.state.settings.schema)


def _at(at: datetime | None, delay: float | None) -> datetime | None:
    """A due time from an RFC 3339 time or a delay in seconds (None: now)."""
    return datetime.now(UTC) + timedelta(seconds=delay) if delay is not None else at


@router.post("/queues/{queue}/messages", response_model=OfferOut, tags=["produce"])
async def offer(request: Request, queue: QueueName, body: OfferIn) -> OfferOut:
    """Offer one message (dq_offer): created, updated or ignored."""
    authorize(request, "produce", queue)
    message = Message(body.key, body.payload, _at(body.at, body.delay), body.channel, body.priority)
    (result,) = await request.app.state.group_commits.offer(queue, [message], body.can_update, single=True)
    outcome = result.outcome
    return OfferOut(key=body.key, outcome=outcome.value)


@router.post("/queues/{queue}/messages/batch", response_model=OfferBatchOut, tags=["produce"])
async def offer_many(request: Request, queue: QueueName, body: OfferBatchIn) -> OfferBatchOut:
    """Offer a batch (dq_offer_many), one result per message, in order; all or nothing."""
    authorize(request, "produce", queue)
    if len({m.can_update for m in body.messages}) > 1:
        raise ApiError(400, "messages: can_update must be the same for every message of a batch")
    batch = [Message(m.key, m.payload, _at(m.at, m.delay), m.channel, m.priority) for m in body.messages]
    can_update = body.messages[0].can_update if body.messages else True
    results = await request.app.state.group_commits.offer(queue, batch, can_update)
    return OfferBatchOut(results=[OfferOut(key=r.key, outcome=r.outcome.value) for r in results])


@router.post("/queues/{queue}/poll", response_model=PollOut, tags=["consume"])
async def poll(request: Request, queue: QueueName, body: PollIn) -> PollOut:
    """Lease up to max due messages (dq_poll_many); with wait, wait up to
    that many seconds for one to fall due or be offered."""
    authorize(request, "consume", queue)
    deliveries = await poll_waiting(request, queue, body.max, body.lease, body.wait)
    return PollOut(deliveries=[_wire(DeliveryOut, d) for d in deliveries])


async def poll_waiting(
    request: Request, queues: str | Sequence[str], count: int, lease: float, wait: float
) -> list[AsyncDelivery]:
    """Up to count deliveries of the first of queues (in order) that has any; none
    due: wait up to wait seconds, woken by dq_wakeup of any of them or the next
    due time ([] if none came or the client left). A database that cannot be
    reached is waited for within wait too: tried again each second and when
    the wake-up connection is back; its error once wait has run out."""
    names = [queues] if isinstance(queues, str) else list(queues)
    deadline = asyncio.get_running_loop().time() + wait
    while True:
        with contextlib.ExitStack() as waiters:  # before the poll: no wake-up is lost
            woken = [waiters.enter_context(request.app.state.wakeups.waiter(name)) for name in names]
            try:
                if deliveries := await _poll_first(request, names, count, lease):
                    return deliveries
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    return []
                left = await _until_next_due(request, names, left)
            except Exception as e:
                left = deadline - asyncio.get_running_loop().time()
                if not _unreachable(e) or left <= 0:
                    raise
                log.info("long poll of %s: the database is unreachable (%s); waiting for it", names, e)
                left = min(left, 1.0)
            if not await _woken_or_gone(request, woken, left):
                return []


async def _poll_first(request: Request, names: Sequence[str], count: int, lease: float) -> list[AsyncDelivery]:
    """Deliveries of the first of names that has any answerable ones; [] if none."""
    for name in names:
        # a batch that was all dead-lettered (_answerable) says nothing of
        # the messages behind it: poll again until one answers or none is due
        while polled := await request.app.state.group_commits.poll(name, count, lease):
            if deliveries := await _answerable(polled):
                return deliveries
    return []


async def _until_next_due(request: Request, names: Sequence[str], left: float) -> float:
    """Seconds to wait: left, or less if a message of names falls due sooner."""
    dues = [due for name in names if (due := await _queue(request, name).next_due()) is not None]
    if dues:
        left = min(left, max((min(dues) - datetime.now(UTC)).total_seconds(), 0.01))
    return left


def _unreachable(error: Exception) -> bool:
    """Whether error says the database cannot be reached now (a restart, a
    crash, a full pool), not that it refused or cancelled the statement."""
    return is_transient(error) and not isinstance(error, psycopg.errors.QueryCanceled)


async def _woken_or_gone(request: Request, woken: Sequence[asyncio.Event], timeout: float) -> bool:
    """Wait for any of woken or timeout; False if the client went away meanwhile."""
    gone = asyncio.ensure_future(_disconnected(request))
    tasks = [gone, *(asyncio.ensure_future(event.wait()) for event in woken)]
    try:
        await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return not (gone.done() and not gone.cancelled() and gone.result())


async def _disconnected(request: Request) -> bool:
    """True once the client disconnects (its body was read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return True


async def _answerable(deliveries: list[AsyncDelivery]) -> list[AsyncDelivery]:
    """The deliveries the service can answer as JSON; each other one is
    dead-lettered saying why (unanswerable), so it never blocks its batch."""
    kept = []
    for d in deliveries:
        why = unanswerable(d)
        if why is None:
            kept.append(d)
            continue
        log.warning("message %s of queue %r dead-lettered: %s", d.key if d.key is not None else d.id, d.queue, why)
        await d.source.dead_letter(d.lock_token, f"pgdq serve could not hand it out: {why}")
    return kept


_JSON_FIELDS = {"payload": "raw_payload", "state": "state", "headers": "headers"}


def unanswerable(found: Any) -> str | None:
    """Why the service cannot answer a message's payload, state or headers as
    JSON (JSON Python cannot read, or nested past MAX_DEPTH); None if it can."""
    for name, attribute in _JSON_FIELDS.items():
        value = getattr(found, attribute, None)
        if isinstance(value, UnreadableJson):
            return f"its {name} is JSON Python cannot read ({value.error})"
        if too_deep(value):
            return f"its {name} nests arrays and objects more than {MAX_DEPTH} levels deep"
    return None


def _answerable_value(name: str, value: Any) -> Any:
    """A JSON field's value as answered: as it is or, when the service could
    not answer it as JSON (see unanswerable), its JSON text (a string;
    headers, an object or null: null)."""
    if not isinstance(value, UnreadableJson) and not too_deep(value):
        return value
    if name == "headers":
        return None
    return str(value) if isinstance(value, UnreadableJson) else json.dumps(value)


def _wire(model: type[W], found: Any) -> W:
    """model from the same-named fields of a result (payload: its raw JSON, as
    stored; a JSON field the service cannot answer as JSON: its JSON text)."""
    fields = {f: getattr(found, _JSON_FIELDS.get(f, f)) for f in model.model_fields}
    return model(**{f: _answerable_value(f, v) if f in _JSON_FIELDS else v for f, v in fields.items()})


@router.post("/queues/{queue}/ack", response_model=AckOut, tags=["consume"])
async def ack(request: Request, queue: QueueName, body: AckIn) -> AckOut:
    """Ack leased messages of queue by lock token (dq_ack_many); 409 if any token
    was stale or another queue's (the current ones are acked all the same)."""
    authorize(request, "consume", queue)
    acked = await request.app.state.group_commits.ack(queue, body.lock_tokens)
    if acked < len(set(body.lock_tokens)):
        raise ApiError(409, f"stale lock tokens: {len(set(body.lock_tokens)) - acked}; {acked} acked")
    return AckOut(acked=acked)


@router.post("/queues/{queue}/nack", response_model=Done, tags=["consume"])
async def nack(request: Request, queue: QueueName, body: NackIn) -> Done:
    """Give a leased message of queue back (dq_nack), due at retry_at, in retry_in
    seconds or now; 409 if stale or another queue's."""
    authorize(request, "consume", queue)
    if body.retry_at is not None and body.retry_in is not None:
        raise ApiError(400, "give retry_at or retry_in, not both")
    if not await _queue(request, queue).nack(
        body.lock_token, _at(body.retry_at, body.retry_in), body.state, error=body.error
    ):
        raise ApiError(409, "the lock token is stale")
    return Done()


@router.post("/queues/{queue}/extend", response_model=ExtendOut, tags=["consume"])
async def extend(request: Request, queue: QueueName, body: ExtendIn) -> ExtendOut:
    """Lease a message of queue for lease more seconds from now (dq_extend); 409
    if stale or another queue's."""
    authorize(request, "consume", queue)
    until = await _queue(request, queue).extend(body.lock_token, body.lease)
    if until is None:
        raise ApiError(409, "the lock token is stale")
    return ExtendOut(lease_until=until)


@router.get("/queues/{queue}/messages/{key}", response_model=MessageOut, tags=["manage"])
async def get(request: Request, queue: QueueName, key: KeyName) -> MessageOut:
    """A message without locking or changing it (dq_get); 404 if there is none."""
    authorize(request, "consume", queue)
    found = await _queue(request, queue).get(key)
    if found is None:
        raise ApiError(404, f"no message of key {key!r} in queue {queue!r}")
    return _wire(MessageOut, found)


@router.delete("/queues/{queue}/messages/{key}", response_model=Done, tags=["produce"])
async def cancel(request: Request, queue: QueueName, key: KeyName) -> Done:
    """Delete a message, leased or not (dq_cancel); 404 if there is none."""
    authorize(request, "produce", queue)
    if not await _queue(request, queue).cancel(key):
        raise ApiError(404, f"no message of key {key!r} in queue {queue!r}")
    return Done()


@router.get("/queues/{queue}/stats", response_model=QueueStats, tags=["manage"])
async def queue_stats(request: Request, queue: QueueName) -> QueueStats:
    """Ready, delayed and leased counts of a queue (dq_stats)."""
    authorize(request, "consume", queue)
    return await _queue(request, queue).stats()


@router.get("/stats", response_model=list[QueueStats], tags=["manage"])
async def stats(request: Request) -> list[QueueStats]:
    """Every queue's counts (dq_stats); a token needs admin on every queue ("*")."""
    authorize(request, "admin", None)
    return await _client(request).stats()
