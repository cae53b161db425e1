"""Result types of the pgdq API."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from .errors import PayloadDecodeError


class OfferOutcome(enum.StrEnum):
    """What an offer did to its key."""

    CREATED = "created"
    UPDATED = "updated"
    IGNORED = "ignored"


class Message(NamedTuple):
    """One element of offer_many: key, payload, optional aware due time,
    channel (None: none), priority (higher first within its group) and
    headers (a dict kept with the message; 1.2)."""

    key: str
    payload: Any
    scheduled_at: datetime | None = None
    channel: str | None = None
    priority: int = 0
    headers: Mapping[str, Any] | None = None


class OfferResult(NamedTuple):
    """One row of offer_many's answer, in input order."""

    key: str
    outcome: OfferOutcome


class DecodedPayload:
    """payload for a message read through a codec: decoded, or its
    decode_error raised: a payload the codec rejects (one that does not fit
    payload_type) spoils only its own message, never the read that returned
    it; raw_payload keeps the JSON value as stored."""

    __slots__ = ()  # the result classes that use it keep their fields in slots

    decode_error: PayloadDecodeError | None
    _decoded: Any

    @property
    def payload(self) -> Any:
        """The decoded payload; raises decode_error if there is one."""
        if self.decode_error is not None:
            raise self.decode_error
        return self._decoded


@dataclass(frozen=True)
class MessageInfo(DecodedPayload):
    """A message as dq_get (or dq_get_id) sees it (nothing locked or
    changed); key is None for a keyless message (sent, not offered: 1.2)."""

    queue: str
    key: str | None
    raw_payload: Any
    state: Any
    scheduled_at: datetime
    due_at: datetime
    attempts: int
    leased: bool
    created_at: datetime
    channel: str | None = None  # since 1.1
    priority: int = 0
    headers: dict[str, Any] | None = None  # since 1.2
    decode_error: PayloadDecodeError | None = field(default=None, compare=False)
    _decoded: Any = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class PeekedMessage(DecodedPayload):
    """A message as dq_peek sees it (nothing locked or changed).

    payload is the payload as the queue's codec decodes it; raw_payload is
    the JSON value as stored. When the codec cannot decode it, the message
    still comes back: decode_error holds a PayloadDecodeError (the codec's
    exception as its __cause__) and reading payload raises it.
    lease_until is set while leased; last_error is the error its last nack
    recorded, if any. key is None for a keyless message (sent, not offered),
    id is the message's id (1.2; None from older SQL).
    """

    queue: str
    key: str | None
    raw_payload: Any
    state: Any
    scheduled_at: datetime
    due_at: datetime
    attempts: int
    leased: bool
    lease_until: datetime | None
    last_error: str | None
    id: int | None = None  # since 1.2
    headers: dict[str, Any] | None = None  # since 1.2
    decode_error: PayloadDecodeError | None = field(default=None, compare=False)
    _decoded: Any = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class QueueStats:
    """One row of dq_stats; paused (1.2) is None from older SQL, or for a
    role that may not read the queues' settings."""

    queue: str
    ready: int
    delayed: int
    leased: int
    oldest_ready_at: datetime | None
    next_due_at: datetime | None
    paused: bool | None = None


@dataclass(frozen=True)
class HistoryRecord(DecodedPayload):
    """A message that left its queue, as its history kept it (one row of
    dq_history, 1.2): outcome is 'acked', 'dead', 'cancelled' or 'purged';
    last_leased_at is when its last delivery began (None: never delivered)."""

    queue: str
    key: str | None
    id: int
    outcome: str
    raw_payload: Any
    state: Any
    channel: str | None
    priority: int
    created_at: datetime
    scheduled_at: datetime
    last_leased_at: datetime | None
    finished_at: datetime
    attempts: int
    last_error: str | None
    headers: dict[str, Any] | None
    decode_error: PayloadDecodeError | None = field(default=None, compare=False)
    _decoded: Any = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class HistoryBucket:
    """One row of dq_history_stats (1.2): the records that finished in the
    bucket from bucket_at, by outcome, and the percentiles of lateness (a
    delivery's start minus its due time) and run time (finish minus the last
    delivery's start) of the acked and dead ones (None: none delivered)."""

    bucket_at: datetime
    acked: int
    dead: int
    cancelled: int
    lateness_p50: timedelta | None
    lateness_p99: timedelta | None
    run_p50: timedelta | None
    run_p99: timedelta | None


@dataclass(frozen=True)
class DueHour:
    """One row of dq_due_hours: how many messages fall due in the hour from hour_start."""

    hour_start: datetime
    due: int


@dataclass(frozen=True)
class DeadLetterStats:
    """One row of dq_dead_stats: a queue's dead letters and its latest failure."""

    queue: str
    dead: int
    last_failed_at: datetime


@dataclass(frozen=True)
class DeliveryInfo:
    """A live message as an operator looks at its deliveries (a row of
    dq_deliveries or dq_delivery_of, 1.3): channel None for none;
    leased_at when its current or last delivery began (None: never, or
    before 1.2); due_at when it is due, or a running lease's end."""

    id: int
    key: str | None
    channel: str | None
    priority: int
    attempts: int
    leased_at: datetime | None
    due_at: datetime
    last_error: str | None


@dataclass(frozen=True)
class DeadCount:
    """One row of dq_dead_counts (1.3): the dead letters of queue that failed in the bucket starting at bucket_at."""

    queue: str
    bucket_at: datetime
    dead: int


@dataclass(frozen=True)
class ChannelInfo:
    """One row of dq_channels: a channel's limits, its messages by
    condition (a due message held back by a limit is ready) and its last lease."""

    channel: str
    max_concurrency: int | None
    min_interval: timedelta | None
    ready: int
    delayed: int
    leased: int
    last_leased_at: datetime | None


@dataclass(frozen=True)
class DeadLetter(DecodedPayload):
    """A message given up on (one row of dq_dead_list): key is None for a
    keyless message (sent, not offered), id the message's id when it failed
    (1.2; None from older SQL), which redrive_id and purge_dead_letter_id take."""

    queue: str
    key: str | None
    raw_payload: Any
    state: Any
    scheduled_at: datetime
    created_at: datetime
    attempts: int
    error: str | None
    failed_at: datetime
    id: int | None = None  # since 1.2
    decode_error: PayloadDecodeError | None = field(default=None, compare=False)
    _decoded: Any = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class Schedule(DecodedPayload):
    """A schedule kept by the database (one row of dq_schedules)."""

    queue: str
    name: str
    expression: str
    timezone: str
    raw_payload: Any
    max_missed: int
    next_at: datetime | None  # while failing: the next attempt; None: ended (no occurrence before year 10000)
    last_error: str | None = None  # of the last attempt, when it failed (1.1)
    last_error_at: datetime | None = None
    failures: int = 0  # failed attempts in a row
    decode_error: PayloadDecodeError | None = field(default=None, compare=False)
    _decoded: Any = field(default=None, repr=False, compare=False)
