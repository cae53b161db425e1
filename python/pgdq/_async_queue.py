"""AsyncQueue: one queue of pgdq, and AsyncClient: what belongs to no one
queue (lock tokens, every queue's stats and schedules), over asyncio and psycopg 3.

This file is the source: _sync_queue.py is generated from it by
python/tools/gen_sync.py (as psycopg generates its own sync code), so the two
APIs never drift. Edit this file, then run `make sync-code`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, Self
from uuid import UUID

import psycopg
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from . import _statements as st
from . import _tracing
from .codec import Codec, JsonCodec, UnreadableJson, dumps_array, tolerate_unreadable_json
from .errors import PayloadDecodeError, StaleToken, translate
from .model import (
    ChannelInfo,
    DeadCount,
    DeadLetter,
    DeadLetterStats,
    DecodedPayload,
    DeliveryInfo,
    DueHour,
    HistoryBucket,
    HistoryRecord,
    Message,
    MessageInfo,
    OfferOutcome,
    OfferResult,
    PeekedMessage,
    QueueStats,
    Schedule,
)

_OUTCOMES = {o.value: o for o in OfferOutcome}

AsyncSource = AsyncConnection[Any] | AsyncConnectionPool[Any] | str


@dataclass(frozen=True, slots=True)
class AsyncDelivery(DecodedPayload):
    """A leased message (all dq_delivery fields) with its ack/nack/extend.

    payload is the payload as the queue's codec decodes it; raw_payload is
    the JSON value as stored. When the codec cannot decode it (a payload that
    does not fit payload_type), or Python cannot read its payload, state or
    headers (UnreadableJson: e.g. a number of more than 4300 digits), the
    delivery still comes back, leased like the rest of its batch:
    decode_error holds a PayloadDecodeError (the cause as its __cause__) and
    reading payload raises it.
    Dead-letter such a delivery (the Worker does), or ack or nack it.
    key is None for a keyless message (sent, not offered: 1.2); id names it.
    headers are the message's (1.2; None: none, or older SQL).
    """

    id: int
    queue: str
    key: str | None
    raw_payload: Any
    state: Any
    scheduled_at: datetime
    created_at: datetime
    attempts: int
    redelivery: bool
    lock_token: UUID
    lease_until: datetime
    channel: str | None  # None: no channel
    priority: int
    source: AsyncQueue = field(repr=False, compare=False)
    headers: dict[str, Any] | None = None
    decode_error: PayloadDecodeError | None = field(default=None, compare=False)
    _decoded: Any = field(default=None, repr=False, compare=False)

    async def ack(self, *, conn: AsyncConnection[Any] | None = None) -> None:
        """Delete the message; StaleToken if this delivery is no longer current."""
        if not await self.source.ack(self.lock_token, conn=conn):
            raise StaleToken(f"cannot ack {message_name(self.key, self.id)}: the delivery is no longer current")

    async def nack(
        self,
        retry_at: datetime | None = None,
        state: Any = None,
        *,
        error: str | None = None,
        conn: AsyncConnection[Any] | None = None,
    ) -> None:
        """Give the message back, due at retry_at (None: now), saving state
        and recording error as its last_error if given."""
        if not await self.source.nack(self.lock_token, retry_at, state, error=error, conn=conn):
            raise StaleToken(f"cannot nack {message_name(self.key, self.id)}: the delivery is no longer current")

    async def dead_letter(self, error: str | None = None, *, conn: AsyncConnection[Any] | None = None) -> None:
        """Give up on the message: move it to the dead letters with error."""
        if not await self.source.dead_letter(self.lock_token, error, conn=conn):
            raise StaleToken(f"cannot dead-letter {message_name(self.key, self.id)}: the delivery is no longer current")

    async def extend(self, lease: st.Lease, *, conn: AsyncConnection[Any] | None = None) -> datetime:
        """Lease until now + lease; the new lease end. StaleToken if not current."""
        until = await self.source.extend(self.lock_token, lease, conn=conn)
        if until is None:
            raise StaleToken(f"cannot extend {message_name(self.key, self.id)}: the delivery is no longer current")
        return until


def message_name(key: str | None, id_: int | None) -> str:
    """How errors and logs name a message: its key quoted, or for a keyless
    message (key None) its id, as "message 42"."""
    return repr(key) if key is not None else f"message {id_}"


def _decoded(
    codec: Codec,
    payload: Any,
    queue: str,
    key: str | None,
    id_: int | None = None,
    state: Any = None,
    headers: Any = None,
) -> tuple[Any, PayloadDecodeError | None]:
    """The payload as codec decodes it and None; or None and the
    PayloadDecodeError saying why not (naming the message by key, or by id_
    when it has none): the payload, state or headers is UnreadableJson, or
    the codec failed. (Positional and flat: a batch poll runs it per message.)"""
    if UnreadableJson in (type(payload), type(state), type(headers)):
        parts = {"payload": payload, "state": state, "headers": headers}
        part, value = next((p, v) for p, v in parts.items() if type(v) is UnreadableJson)
        what = f"the {part} of {message_name(key, id_)} in queue {queue!r}"
        return None, _undecoded(f"cannot read {what}: Python cannot read its JSON ({value.error})", value.error)
    try:
        return codec.load(payload), None
    except Exception as e:  # the codec is the caller's code: any error is this message's alone
        return None, _undecoded(f"cannot decode the payload of {message_name(key, id_)} in queue {queue!r}: {e!r}", e)


def _decoding(codec: Codec, payload: Any, queue: str, key: str | None, id_: int | None = None) -> dict[str, Any]:
    """The DecodedPayload fields of a payload (_decoded: decoded and decode_error)."""
    decoded, error = _decoded(codec, payload, queue, key, id_)
    return {"_decoded": decoded, "decode_error": error}


def _undecoded(message: str, cause: BaseException) -> PayloadDecodeError:
    """The decode_error of an undecodable message: a PayloadDecodeError of message, caused by cause."""
    error = PayloadDecodeError(message)
    error.__cause__ = cause
    return error


def _dead_id(rest: list[Any]) -> int | None:
    """The id of a dq_dead_list row's fields after its payload (1.2: the
    last of seven; None from older SQL)."""
    return rest[6] if len(rest) > 6 else None


# How many leading columns of a row this client knows: newer SQL adds
# columns last (api-v1.2), which a row built by position must not take.
_DELIVERY_COLUMNS = 14  # dq_delivery: ..., channel, priority (1.1), headers (1.2)
_STATS_COLUMNS = 7  # dq_stats: ..., next_due_at, paused (1.2)
_INFO_COLUMNS = 12  # dq_get: ..., channel, priority (1.1), headers (1.2)
_PEEK_COLUMNS = 11  # dq_peek: ..., last_error, id, headers (1.2)
_HISTORY_COLUMNS = 15  # dq_history (1.2)


def _stats(row: tuple[Any, ...]) -> QueueStats:
    """A QueueStats of a dq_stats row (paused None from older SQL)."""
    return QueueStats(*row[:_STATS_COLUMNS])


def _schedules(codec: Codec, rows: list[tuple[Any, ...]]) -> list[Schedule]:
    """dq_schedules rows as Schedules, payloads decoded."""
    return [Schedule(q, n, e, z, p, *rest, **_decoding(codec, p, q, n)) for q, n, e, z, p, *rest in rows]


class _AsyncBase:
    """What AsyncClient and AsyncQueue share: a source of connections, one
    SQL statement a method, and the lock-token methods (a token names its
    message whatever the queue).

    source is a connection (used as it is, its transaction is yours), a pool
    (one pooled connection per call, committed on return) or a conninfo
    string (one autocommit connection, opened on first use).
    """

    def __init__(self, source: AsyncSource, *, schema: str | None, codec: Codec) -> None:
        self.codec = codec
        self._source = source
        self._own: AsyncConnection[Any] | None = None
        self._sql = st.statements(schema)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection opened here (never yours or the pool's)."""
        if self._own is not None:
            await self._own.close()
            self._own = None

    @asynccontextmanager
    async def _connection(self, conn: AsyncConnection[Any] | None) -> AsyncIterator[AsyncConnection[Any]]:
        if conn is not None:
            yield conn
        elif isinstance(self._source, AsyncConnectionPool):
            async with self._source.connection() as pooled:
                yield pooled
        elif isinstance(self._source, str):
            if self._own is None or self._own.closed:
                self._own = await AsyncConnection.connect(self._source, autocommit=True)
            yield self._own
        else:
            yield self._source

    async def _rows(
        self, method: str, params: Sequence[Any], conn: AsyncConnection[Any] | None = None
    ) -> list[tuple[Any, ...]]:
        """Run the method's one statement; its rows. Server errors become pgdq's."""
        async with self._connection(conn) as c:
            try:
                cur = c.cursor()
                if method in st.READS_JSON:  # one unreadable value fails its own message, never the read
                    tolerate_unreadable_json(cur)
                await cur.execute(self._sql[method], params)
                return await cur.fetchall()
            except psycopg.Error as e:
                raise translate(e) from e

    async def _value(self, method: str, params: Sequence[Any], conn: AsyncConnection[Any] | None = None) -> Any:
        rows = await self._rows(method, params, conn)
        return rows[0][0]

    async def version(self, *, conn: AsyncConnection[Any] | None = None) -> str:
        """The installed pgdq version."""
        return str(await self._value("version", (), conn))

    # lock tokens: a Client's of any queue, a Queue's of its own only

    def _token_queue(self) -> str | None:
        """The queue whose lock tokens the token methods accept (None: any)."""
        return None

    async def _token_value(self, method: str, params: Sequence[Any], conn: AsyncConnection[Any] | None) -> Any:
        """Run a lock-token method: with _token_queue() as its last argument
        when there is one (a token of another queue is then stale), else as in 1.1."""
        queue = self._token_queue()
        if queue is None:
            return await self._value(method, params, conn)
        return await self._value(f"{method}_in_queue", (*params, queue), conn)

    async def ack(self, lock_token: UUID | None, *, conn: AsyncConnection[Any] | None = None) -> bool:
        """Delete the message leased under lock_token; False when stale (dq_ack)."""
        return bool(await self._token_value("ack", (lock_token,), conn))

    async def ack_many(
        self, lock_tokens: Sequence[UUID | None] | None, *, conn: AsyncConnection[Any] | None = None
    ) -> int:
        """Ack a batch of tokens; how many were current (dq_ack_many)."""
        return int(await self._token_value("ack_many", (st.token_list(lock_tokens),), conn))

    async def nack(
        self,
        lock_token: UUID | None,
        retry_at: datetime | None = None,
        state: Any = None,
        *,
        error: str | None = None,
        conn: AsyncConnection[Any] | None = None,
    ) -> bool:
        """Give a leased message back, due at retry_at (None: now), saving
        state and recording error as its last_error if given; False when stale."""
        saved = None if state is None else self.codec.dumps(state)
        params = (lock_token, st.aware(retry_at, "retry_at"), saved, error)
        return bool(await self._token_value("nack", params, conn))

    async def extend(
        self, lock_token: UUID | None, lease: st.Lease, *, conn: AsyncConnection[Any] | None = None
    ) -> datetime | None:
        """Lease until now + lease; the new lease end, or None when stale (dq_extend)."""
        until: datetime | None = await self._token_value("extend", (lock_token, st.lease(lease)), conn)
        return until

    async def dead_letter(
        self, lock_token: UUID | None, error: str | None = None, *, conn: AsyncConnection[Any] | None = None
    ) -> bool:
        """Move the message leased under lock_token to the dead letters; False when stale."""
        return bool(await self._token_value("dead_letter", (lock_token, error), conn))


class AsyncClient(_AsyncBase):
    """What belongs to no one queue of pgdq: lock tokens (ack, nack, extend,
    dead_letter), the stats and schedules of every queue, the version. Every
    method is one SQL statement. source as for AsyncQueue; codec encodes nack
    states and decodes schedule payloads (default: JSON values).
    """

    def __init__(self, source: AsyncSource, *, schema: str | None = None, codec: Codec | None = None) -> None:
        super().__init__(source, schema=schema, codec=codec if codec is not None else JsonCodec())

    # every queue

    async def stats(self, queue: str | None = None, *, conn: AsyncConnection[Any] | None = None) -> list[QueueStats]:
        """Ready, delayed and leased counts of every queue (of queue, if given), by name (dq_stats)."""
        return [_stats(row) for row in await self._rows("stats", (queue,), conn)]

    async def dead_stats(
        self, queue: str | None = None, *, conn: AsyncConnection[Any] | None = None
    ) -> list[DeadLetterStats]:
        """Dead-letter counts of every queue that has some (of queue, if given), by name (dq_dead_stats)."""
        return [DeadLetterStats(*row) for row in await self._rows("dead_stats", (queue,), conn)]

    async def dead_counts(
        self, since: datetime, bucket: st.Lease, queue: str | None = None, *, conn: AsyncConnection[Any] | None = None
    ) -> list[DeadCount]:
        """The dead letters kept that failed from since on, per bucket (1 minute
        to 1 day) of every queue (of queue, if given), only buckets with some
        (dq_dead_counts, 1.3): failures over time, history kept or not."""
        params = (queue, st.aware(since, "since"), st.lease(bucket, "bucket"))
        return [DeadCount(*row) for row in await self._rows("dead_counts", params, conn)]

    async def key_queues(self, key: str, *, conn: AsyncConnection[Any] | None = None) -> list[str]:
        """The queues holding a live message of key, by name (dq_key_queues)."""
        return [row[0] for row in await self._rows("key_queues", (key,), conn)]

    async def schedules(self, queue: str | None = None, *, conn: AsyncConnection[Any] | None = None) -> list[Schedule]:
        """The schedules of every queue (of queue, if given) with their next occurrence (dq_schedules)."""
        return _schedules(self.codec, await self._rows("schedules", (queue,), conn))


class AsyncQueue(_AsyncBase):
    """One queue of pgdq. Every method is one SQL statement: one round trip.

    source is a connection (AsyncConnection: used as it is, its transaction is
    yours), a pool (AsyncConnectionPool: one pooled connection per call,
    committed on return) or a conninfo string (one autocommit connection,
    opened on first use).
    Methods that write take conn= to run inside your own transaction instead.
    The lock-token methods (ack, ack_many, nack, extend, dead_letter) and
    version are AsyncClient's (one base class), but take only this queue's
    tokens: another queue's token is stale (needs pgdq 1.2.0 SQL).
    """

    def __init__(
        self,
        name: str,
        source: AsyncSource,
        *,
        schema: str | None = None,
        codec: Codec | None = None,
        payload_type: type[Any] | None = None,
        lease: st.Lease = timedelta(minutes=5),
    ) -> None:
        super().__init__(source, schema=schema, codec=codec if codec is not None else JsonCodec(payload_type))
        self.name = name
        self.lease = st.lease(lease)

    def _token_queue(self) -> str | None:
        """This queue: its token methods refuse another queue's tokens."""
        return self.name

    def _lease(self, lease: st.Lease | None) -> timedelta | None:
        """The lease to ask for: the given one, else the queue's default."""
        return self.lease if lease is None else st.lease(lease)

    def _delivery(self, row: tuple[Any, ...]) -> AsyncDelivery:
        """A delivery built straight from a dq_delivery row (positionally: its
        fields are in the row's order); a payload the codec rejects becomes its decode_error."""
        if len(row) < _DELIVERY_COLUMNS:  # older SQL: 1.0.0 has no channel and priority, 1.1 no headers
            row = (*row[:11], *(row[11:13] or (None, 0)), None)
        id_, queue, key, payload, state, scheduled_at, created_at, attempts, redelivery, token, until = row[:11]
        channel, level, headers = row[11:_DELIVERY_COLUMNS]
        decoded, error = _decoded(self.codec, payload, queue, key, id_, state, headers)
        return AsyncDelivery(
            id_,
            queue,
            key,
            payload,
            state,
            scheduled_at,
            created_at,
            attempts,
            redelivery,
            token,
            until,
            channel,
            level,
            self,
            headers,
            error,
            decoded,
        )

    # producing

    @_tracing.producer
    async def offer(
        self,
        key: str,
        payload: Any,
        scheduled_at: datetime | None = None,
        *,
        can_update: bool = True,
        channel: str | None = None,
        priority: int = 0,
        headers: Mapping[str, Any] | None = None,
        conn: AsyncConnection[Any] | None = None,
    ) -> OfferOutcome:
        """Offer one message (dq_offer): created, updated or ignored. channel
        groups it (the queue shares its polls fairly between channels and holds
        each to its limits: set_channel); priority orders it within its group,
        highest first; headers a dict (a JSON object) kept with it, replaced
        by an update, kept by an ignored offer (1.2). When tracing, headers
        gain the trace context (docs/observability.md)."""
        headers = _tracing.inject(headers)
        params = (self.name, key, self.codec.dumps(payload), st.aware(scheduled_at, "scheduled_at"), can_update)
        if headers is not None:
            grouped = (*params, channel, st.priority(priority), st.headers(headers))
            return OfferOutcome(await self._value("offer_headed", grouped, conn))
        if channel is None and not st.priority(priority):
            return OfferOutcome(await self._value("offer", params, conn))
        return OfferOutcome(await self._value("offer_grouped", (*params, channel, priority), conn))

    @_tracing.producer
    async def offer_many(
        self,
        messages: Iterable[Message | tuple[Any, ...]],
        *,
        can_update: bool = True,
        conn: AsyncConnection[Any] | None = None,
    ) -> list[OfferResult]:
        """Offer a batch (dq_offer_many): one result per element, in order.
        Elements are Messages or tuples (key, payload[, scheduled_at[, channel[, priority[, headers]]]])."""
        batch = st.split_messages(messages)
        batch = batch._replace(headers=_tracing.inject_document(batch.headers, len(batch.keys)))
        params = (self.name, batch.keys, dumps_array(self.codec, batch.payloads), batch.times, can_update)
        if batch.headers is not None:
            headed = (*params, batch.channels, batch.priorities, batch.headers)
            rows = await self._rows("offer_many_headed", headed, conn)
        elif batch.channels is None and batch.priorities is None:
            rows = await self._rows("offer_many", params, conn)
        else:
            rows = await self._rows("offer_many_grouped", (*params, batch.channels, batch.priorities), conn)
        return [OfferResult(key, _OUTCOMES[outcome]) for key, (outcome,) in zip(batch.keys, rows, strict=True)]

    @_tracing.producer
    async def send(
        self,
        payload: Any,
        *,
        scheduled_at: datetime | None = None,
        channel: str | None = None,
        priority: int = 0,
        headers: Mapping[str, Any] | None = None,
        conn: AsyncConnection[Any] | None = None,
    ) -> int:
        """Send one keyless message (dq_send, 1.2): its id. Never
        deduplicated: each send is a new message, with key None in every
        result, addressed by its id (get_id, cancel_id, redrive_id,
        purge_dead_letter_id). scheduled_at (aware; None: now), channel and
        priority as for offer; headers a dict (a JSON object) kept with it."""
        params = (
            self.name,
            self.codec.dumps(payload),
            st.aware(scheduled_at, "scheduled_at"),
            channel,
            st.priority(priority),
            st.headers(_tracing.inject(headers)),
        )
        return int(await self._value("send", params, conn))

    @_tracing.producer
    async def send_many(
        self,
        payloads: Iterable[Any],
        *,
        scheduled_ats: Sequence[datetime | None] | None = None,
        channels: Sequence[str | None] | None = None,
        priorities: Sequence[int | None] | None = None,
        headers: Sequence[Mapping[str, Any] | None] | None = None,
        conn: AsyncConnection[Any] | None = None,
    ) -> list[int]:
        """Send a batch of keyless messages (dq_send_many, 1.2): their ids,
        in input order (ascending). scheduled_ats, channels, priorities and
        headers are None or one element per payload, a None element meaning
        the default (now, no channel, 0, no headers), as send takes them."""
        batch = st.split_sends(payloads, scheduled_ats, channels, priorities, headers)
        batch = batch._replace(headers=_tracing.inject_document(batch.headers, len(batch.payloads)))
        params = (
            self.name,
            dumps_array(self.codec, batch.payloads),
            batch.times,
            batch.channels,
            batch.priorities,
            batch.headers,
        )
        return [int(id_) for (id_,) in await self._rows("send_many", params, conn)]

    # consuming

    async def poll(
        self, lease: st.Lease | None = None, *, conn: AsyncConnection[Any] | None = None
    ) -> AsyncDelivery | None:
        """Lease the earliest due message (dq_poll), or None."""
        rows = await self._rows("poll", (self.name, self._lease(lease)), conn)
        return self._delivery(rows[0]) if rows else None

    async def poll_many(
        self,
        max_count: int,
        lease: st.Lease | None = None,
        *,
        ack: Sequence[UUID | None] | None = None,
        conn: AsyncConnection[Any] | None = None,
    ) -> list[AsyncDelivery]:
        """Lease up to max_count due messages, earliest due first (dq_poll_many).
        With ack=, first ack those tokens in the same statement (dq_ack_poll):
        a batch consumer hands back its previous batch with its next poll.
        A payload the codec cannot decode never fails the batch: that
        delivery's decode_error is set (see AsyncDelivery)."""
        if ack is None:
            rows = await self._rows("poll_many", (self.name, max_count, self._lease(lease)), conn)
        else:
            params = (st.token_list(ack), self.name, max_count, self._lease(lease))
            rows = await self._rows("ack_poll", params, conn)
        return [self._delivery(r) for r in rows]

    # managing

    async def cancel(self, key: str, *, conn: AsyncConnection[Any] | None = None) -> bool:
        """Delete the message of key, leased or not; True if there was one."""
        return bool(await self._value("cancel", (self.name, key), conn))

    async def finish(self, key: str, *, conn: AsyncConnection[Any] | None = None) -> bool:
        """Delete the message of key as done, leased or not, its history
        record saying acked (dq_finish, 1.3); True if there was one."""
        return bool(await self._value("finish", (self.name, key), conn))

    async def get(self, key: str, *, conn: AsyncConnection[Any] | None = None) -> MessageInfo | None:
        """The message of key without locking or changing it, or None."""
        rows = await self._rows("get", (self.name, key), conn)
        if not rows:
            return None
        queue, key_, payload, *rest = rows[0][:_INFO_COLUMNS]
        return MessageInfo(queue, key_, payload, *rest, **_decoding(self.codec, payload, queue, key_))

    async def get_id(self, id: int, *, conn: AsyncConnection[Any] | None = None) -> MessageInfo | None:
        """The message id of this queue (keyed or keyless) without locking
        or changing it, or None (dq_get_id, 1.2): another queue's id is None."""
        rows = await self._rows("get_id", (self.name, st.message_id(id)), conn)
        if not rows:
            return None
        queue, key, payload, *rest = rows[0][:_INFO_COLUMNS]
        return MessageInfo(queue, key, payload, *rest, **_decoding(self.codec, payload, queue, key, id))

    async def cancel_id(self, id: int, *, conn: AsyncConnection[Any] | None = None) -> bool:
        """Delete the message id of this queue (keyed or keyless), leased or
        not; True if there was one (dq_cancel_id, 1.2)."""
        return bool(await self._value("cancel_id", (self.name, st.message_id(id)), conn))

    async def finish_id(self, id: int, *, conn: AsyncConnection[Any] | None = None) -> bool:
        """Delete the message id of this queue (keyed or keyless) as done,
        leased or not, its history record saying acked; True if there was one
        (dq_finish_id, 1.3)."""
        return bool(await self._value("finish_id", (self.name, st.message_id(id)), conn))

    async def purge(self, *, conn: AsyncConnection[Any] | None = None) -> int:
        """Delete every message of the queue; how many."""
        return int(await self._value("purge", (self.name,), conn))

    async def peek(
        self, which: str | None = None, max_count: int = 100, *, conn: AsyncConnection[Any] | None = None
    ) -> list[PeekedMessage]:
        """Up to max_count messages, earliest due first, without locking or
        changing them (dq_peek): which is None (any), 'due', 'delayed' or
        'leased'. A payload the codec cannot decode never fails the peek:
        that message's decode_error is set (as for a delivery)."""
        rows = await self._rows("peek", (self.name, which, max_count), conn)
        return [self._peeked(row) for row in rows]

    async def browse(
        self,
        which: str | None = None,
        *,
        key_prefix: str | None = None,
        after: PeekedMessage | None = None,
        max_count: int = 100,
        conn: AsyncConnection[Any] | None = None,
    ) -> list[PeekedMessage]:
        """A page of messages in (due time, id) order, as peek sees them
        (dq_browse, 1.2): which as for peek, only keys starting with
        key_prefix if given, only after the message after (the last of the
        page before; None: from the start)."""
        params = (
            self.name,
            which,
            key_prefix,
            None if after is None else after.due_at,
            None if after is None else after.id,
            max_count,
        )
        return [self._peeked(row) for row in await self._rows("browse", params, conn)]

    async def run_now(self, id: int, *, conn: AsyncConnection[Any] | None = None) -> bool:
        """Make the delayed message id due now (dq_run_now, 1.2): True when it
        was delayed; a leased or due message is left as it is (False)."""
        return bool(await self._value("run_now", (self.name, st.message_id(id)), conn))

    async def deliveries(
        self, which: Literal["running", "retrying"], max_count: int = 100, *, conn: AsyncConnection[Any] | None = None
    ) -> list[DeliveryInfo]:
        """Up to max_count (1..1000) messages whose lease runs now, oldest
        delivery first (which "running"), or that were tried before and wait
        for a retry, earliest first, with their last error ("retrying")
        (dq_deliveries, 1.3)."""
        return [DeliveryInfo(*row) for row in await self._rows("deliveries", (self.name, which, max_count), conn)]

    async def delivery_of(self, id: int, *, conn: AsyncConnection[Any] | None = None) -> DeliveryInfo | None:
        """The live message id's attempts, last delivery and last error; None
        when there is none (dq_delivery_of, 1.3)."""
        rows = await self._rows("delivery_of", (self.name, st.message_id(id)), conn)
        return DeliveryInfo(*rows[0]) if rows else None

    async def release(self, id: int, *, conn: AsyncConnection[Any] | None = None) -> bool:
        """End the running lease of message id now, without its token (a stuck
        consumer): due now, its attempts and last error kept, its holder's ack
        fails; True when it was leased (dq_release, 1.3)."""
        return bool(await self._value("release", (self.name, st.message_id(id)), conn))

    def _peeked(self, row: tuple[Any, ...]) -> PeekedMessage:
        """A peeked message of a dq_peek row (its fields in the row's order);
        an undecodable payload becomes its decode_error."""
        id_ = row[9] if len(row) > 9 else None  # 1.2: the id, tenth
        fields = row[:_PEEK_COLUMNS]
        return PeekedMessage(self.name, *fields, **_decoding(self.codec, row[1], self.name, row[0], id_))

    async def stats(self, *, conn: AsyncConnection[Any] | None = None) -> QueueStats:
        """Ready, delayed and leased counts of the queue (dq_stats)."""
        (found,) = await self._rows("stats", (self.name,), conn)
        return _stats(found)

    async def due_hours(self, hours: int = 24, *, conn: AsyncConnection[Any] | None = None) -> list[DueHour]:
        """Messages falling due in each of the next hours hours, a leased one at its lease's end (dq_due_hours)."""
        return [DueHour(*row) for row in await self._rows("due_hours", (self.name, hours), conn)]

    async def next_due(self, *, conn: AsyncConnection[Any] | None = None) -> datetime | None:
        """The earliest due time in the queue (leases by their end), or None."""
        due: datetime | None = await self._value("next_due", (self.name,), conn)
        return due

    async def pause(self, *, conn: AsyncConnection[Any] | None = None) -> bool:
        """Pause the queue: polls lease nothing from it until resume; True
        when it was not paused (dq_pause, 1.2). Offers, acks and the rest work."""
        return bool(await self._value("pause", (self.name,), conn))

    async def resume(self, *, conn: AsyncConnection[Any] | None = None) -> bool:
        """Resume a paused queue, waking its idle consumers; True when it
        was paused (dq_resume, 1.2)."""
        return bool(await self._value("resume", (self.name,), conn))

    # history

    async def retain(self, keep: st.Lease | None, *, conn: AsyncConnection[Any] | None = None) -> None:
        """Keep a record of each message that leaves the queue from now on,
        for keep (timedelta or seconds; None: stop, records already kept age
        out as before) (dq_retain, 1.2)."""
        await self._rows("retain", (self.name, st.lease(keep, "keep")), conn)

    async def history(
        self, key: str | None = None, max_count: int = 100, *, conn: AsyncConnection[Any] | None = None
    ) -> list[HistoryRecord]:
        """Up to max_count records of messages that left the queue (key's
        only, if given), newest finish first (dq_history, 1.2)."""
        rows = await self._rows("history", (self.name, key, max_count), conn)
        return [self._record(row[:_HISTORY_COLUMNS]) for row in rows]

    def _record(self, row: tuple[Any, ...]) -> HistoryRecord:
        """A HistoryRecord of a dq_history row; an undecodable payload becomes its decode_error."""
        queue, key, id_, outcome, payload, *rest = row
        decoded = _decoding(self.codec, payload, queue, key, id_)
        return HistoryRecord(queue, key, id_, outcome, payload, *rest, **decoded)

    async def history_stats(
        self, since: datetime, bucket: st.Lease, *, conn: AsyncConnection[Any] | None = None
    ) -> list[HistoryBucket]:
        """The queue's records per bucket (timedelta or seconds, whole seconds
        from 1 second to 1 day) from the bucket holding since to now, oldest first: outcomes,
        lateness and run-time percentiles (dq_history_stats, 1.2)."""
        params = (self.name, st.aware(since, "since"), st.lease(bucket, "bucket"))
        return [HistoryBucket(*row[:8]) for row in await self._rows("history_stats", params, conn)]

    # channels

    async def set_channel(
        self,
        channel: str,
        *,
        max_concurrency: int | None = None,
        min_interval: st.Lease | None = None,
        conn: AsyncConnection[Any] | None = None,
    ) -> None:
        """Set a channel's limits, replacing earlier ones (dq_channel_set): at
        most max_concurrency of its messages leased at once, and min_interval
        (timedelta or seconds) between two of its leases; None: no limit."""
        interval = st.lease(min_interval, "min_interval")
        await self._rows("channel_set", (self.name, channel, max_concurrency, interval), conn)

    async def remove_channel(self, channel: str, *, conn: AsyncConnection[Any] | None = None) -> bool:
        """Drop a channel's limits (its messages stay); True if it had any (dq_channel_remove)."""
        return bool(await self._value("channel_remove", (self.name, channel), conn))

    async def channels(self, *, conn: AsyncConnection[Any] | None = None) -> list[ChannelInfo]:
        """The channels that have messages or limits, by name (dq_channels)."""
        return [ChannelInfo(*row) for row in await self._rows("channels", (self.name,), conn)]

    # dead letters and settings

    async def configure(self, *, max_attempts: int | None, conn: AsyncConnection[Any] | None = None) -> None:
        """Set the queue's max_attempts (None: no limit); polls enforce it (dq_configure)."""
        await self._rows("configure", (self.name, max_attempts), conn)

    async def dead_letters(self, max_count: int = 100, *, conn: AsyncConnection[Any] | None = None) -> list[DeadLetter]:
        """Up to max_count dead letters, oldest failure first (dq_dead_list)."""
        rows = await self._rows("dead_list", (self.name, max_count), conn)
        return [DeadLetter(q, k, p, *rest, **_decoding(self.codec, p, q, k, _dead_id(rest))) for q, k, p, *rest in rows]

    async def redrive(
        self,
        key: str | None = None,
        scheduled_at: datetime | None = None,
        *,
        conn: AsyncConnection[Any] | None = None,
    ) -> int:
        """Offer the dead letters (key's only, if given) again; how many (dq_dead_redrive)."""
        params = (self.name, key, st.aware(scheduled_at, "scheduled_at"))
        return int(await self._value("dead_redrive", params, conn))

    async def purge_dead_letters(self, key: str | None = None, *, conn: AsyncConnection[Any] | None = None) -> int:
        """Delete the dead letters (key's only, if given); how many (dq_dead_purge)."""
        return int(await self._value("dead_purge", (self.name, key), conn))

    async def redrive_id(
        self,
        id: int,
        scheduled_at: datetime | None = None,
        *,
        conn: AsyncConnection[Any] | None = None,
    ) -> int | None:
        """Offer the dead letter id (DeadLetter.id; keyed or keyless) again,
        due at scheduled_at (None: now): the id of the message it became, or
        None when there is no such dead letter or its key has a live message
        again (the dead letter stays) (dq_dead_redrive_id, 1.2). A keyless
        one comes back as a new message, under a new id."""
        params = (self.name, st.message_id(id), st.aware(scheduled_at, "scheduled_at"))
        new_id = await self._value("dead_redrive_id", params, conn)
        return None if new_id is None else int(new_id)

    async def purge_dead_letter_id(self, id: int, *, conn: AsyncConnection[Any] | None = None) -> int:
        """Delete the dead letter id (DeadLetter.id; keyed or keyless); how
        many: 0 or 1 (dq_dead_purge_id, 1.2)."""
        return int(await self._value("dead_purge_id", (self.name, st.message_id(id)), conn))

    # recurring

    async def schedule(
        self,
        name: str,
        expression: str,
        timezone: str = "UTC",
        payload: Any = None,
        *,
        max_missed: int = 1,
        conn: AsyncConnection[Any] | None = None,
    ) -> datetime:
        """Create or replace a schedule kept by the database: this queue's polls
        turn its occurrences into messages, no scheduler process needed. Its
        next occurrence (dq_schedule_set)."""
        params = (self.name, name, expression, timezone, self.codec.dumps(payload), max_missed)
        next_at: datetime = await self._value("schedule_set", params, conn)
        return next_at

    async def unschedule(self, name: str, *, conn: AsyncConnection[Any] | None = None) -> bool:
        """Remove a schedule and its pending occurrences; True if it existed."""
        return bool(await self._value("schedule_remove", (self.name, name), conn))

    async def schedules(self, *, conn: AsyncConnection[Any] | None = None) -> list[Schedule]:
        """This queue's schedules with their next occurrence (dq_schedules)."""
        return _schedules(self.codec, await self._rows("schedules", (self.name,), conn))

    async def cron_install(
        self,
        key_prefix: str,
        config_hash: str,
        occurrences: Iterable[tuple[datetime, Any]],
        *,
        can_update: bool = False,
        conn: AsyncConnection[Any] | None = None,
    ) -> int:
        """Install (time, payload) occurrences under key_prefix/config_hash,
        replacing other configurations' pending ones; how many were created."""
        pairs = list(occurrences)
        times = [st.aware(at, f"occurrences[{i}]") for i, (at, _) in enumerate(pairs)]
        payloads = dumps_array(self.codec, [p for _, p in pairs])
        params = (self.name, key_prefix, config_hash, times, payloads, can_update)
        return int(await self._value("cron_install", params, conn))

    async def cron_uninstall(
        self, key_prefix: str, config_hash: str | None = None, *, conn: AsyncConnection[Any] | None = None
    ) -> int:
        """Delete key_prefix's pending occurrences (only config_hash's if given)."""
        return int(await self._value("cron_uninstall", (self.name, key_prefix, config_hash), conn))
