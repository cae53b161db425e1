"""The JSON bodies of the HTTP API (they make its OpenAPI document)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal
from uuid import UUID

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    Strict,
    StrictBool,
    StrictInt,
    model_validator,
)

MAX_BATCH = 1000  # messages an offer, poll or ack may carry
MAX_WAIT = 60  # seconds a poll may wait

# Values of the JSON type the document gives, never coerced from another
# (true is no 1, 0 no false, a number no time).
Number = Annotated[float, Strict()]
Seconds = Annotated[Number, Field(ge=0, le=365 * 86400)]
LeaseSeconds = Annotated[Number, Field(gt=0, le=86400)]
Key = Annotated[str, Field(min_length=1, max_length=200)]
Channel = Annotated[str, Field(min_length=1, max_length=100)]
Priority = Annotated[StrictInt, Field(ge=-(2**31), le=2**31 - 1)]


# Levels of arrays and objects a payload, state or body may nest: the
# service's answers wrap them in 3 or 4 more, and pydantic answers at most 254.
MAX_DEPTH = 200


def too_deep(value: object, limit: int = MAX_DEPTH) -> bool:
    """True when the JSON value nests arrays and objects more than limit levels deep."""
    level = [value] if isinstance(value, dict | list) else []
    for _ in range(limit):
        level = [c for v in level for c in (v.values() if isinstance(v, dict) else v) if isinstance(c, dict | list)]
        if not level:
            return False
    return bool(level)


def shallow(value: JsonValue, limit: int = MAX_DEPTH) -> JsonValue:
    """value, unless it nests more than limit levels (ValueError): what the service could not answer."""
    if too_deep(value, limit):
        raise ValueError(f"nests arrays and objects more than {limit} levels deep")
    return value


# A JSON value the service can hand out again: at most MAX_DEPTH levels deep
Payload = Annotated[JsonValue, AfterValidator(shallow)]


def _rfc3339(value: object) -> object:
    if not isinstance(value, str):
        raise ValueError("must be an RFC 3339 time (a string)")
    return value


def _in_utc_range(value: datetime) -> datetime:
    try:  # a time whose UTC is past 9999-12-31 could be stored, but no client could read it back
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("must fall between the years 1 and 9999 in UTC") from None


Time = Annotated[AwareDatetime, BeforeValidator(_rfc3339), AfterValidator(_in_utc_range)]


class Body(BaseModel):
    """Every request body: unknown fields are an error, not ignored."""

    model_config = ConfigDict(extra="forbid")


class DueTime(Body):
    """A body with a due time: `at` (RFC 3339) or `delay` (seconds from now), not both; neither: now."""

    at: Time | None = None
    delay: Seconds | None = None

    @model_validator(mode="after")
    def _one_time(self) -> DueTime:
        if self.at is not None and self.delay is not None:
            raise ValueError("give at or delay, not both")
        return self


class OfferIn(DueTime):
    """One message: due at `at`, or `delay` seconds from now, or now."""

    key: Key
    payload: Payload
    can_update: StrictBool = True
    channel: Channel | None = None
    priority: Priority = 0


class OfferBatchIn(Body):
    messages: list[OfferIn] = Field(max_length=MAX_BATCH)


class OfferOut(BaseModel):
    key: str
    outcome: str = Field(description="created, updated or ignored")


class OfferBatchOut(BaseModel):
    results: list[OfferOut]


class PollIn(Body):
    max: StrictInt = Field(1, ge=1, le=MAX_BATCH, description="at most this many messages")
    lease: LeaseSeconds = 300
    wait: Number = Field(0, ge=0, le=MAX_WAIT, description="seconds to wait for a message when none is due (long poll)")


class MessageFields(BaseModel):
    """What a delivery and a dead letter both say of their message."""

    queue: str
    key: str | None = Field(description="null for a keyless message (sent without a key)")
    payload: JsonValue
    state: JsonValue
    scheduled_at: datetime
    created_at: datetime
    attempts: int


class DeliveryOut(MessageFields):
    id: int
    redelivery: bool
    lock_token: UUID
    lease_until: datetime
    channel: str | None
    priority: int


class PollOut(BaseModel):
    deliveries: list[DeliveryOut]


class AckIn(Body):
    lock_tokens: list[UUID] = Field(min_length=1, max_length=MAX_BATCH)


class AckOut(BaseModel):
    acked: int


class NackIn(Body):
    """Give a leased message back, due at retry_at, retry_in seconds from now, or now."""

    lock_token: UUID
    retry_at: Time | None = None
    retry_in: Seconds | None = None
    state: Payload = None
    error: str | None = None


class ExtendIn(Body):
    lock_token: UUID
    lease: LeaseSeconds


class ExtendOut(BaseModel):
    lease_until: datetime


class MessageOut(BaseModel):
    queue: str
    key: str | None = Field(description="null for a keyless message (sent without a key)")
    payload: JsonValue
    state: JsonValue
    scheduled_at: datetime
    due_at: datetime
    attempts: int
    leased: bool
    created_at: datetime
    channel: str | None
    priority: int


class Done(BaseModel):
    done: bool = True


class ErrorOut(BaseModel):
    error: str
    sqlstate: str | None = None


class DeadLetterOut(MessageFields):
    error: str | None
    failed_at: datetime
    id: int | None = Field(default=None, description="the message's id when it failed")


class RedriveIn(DueTime):
    """Offer dead letters again (key's only, if given), due at `at`, `delay` seconds from now, or now."""

    key: Key | None = None


class RedriveOut(BaseModel):
    redriven: int


class PurgeIn(Body):
    """Delete key's dead letter, or with all true every one of the queue."""

    key: Key | None = None
    all: StrictBool = False

    @model_validator(mode="after")
    def _key_or_all(self) -> PurgeIn:
        if (self.key is None) == (not self.all):
            raise ValueError('give key, or "all": true to delete every dead letter of the queue')
        return self


class PurgeOut(BaseModel):
    purged: int


class ScheduleIn(Body):
    """A schedule kept by the database (dq_schedule_set)."""

    expression: str = Field(min_length=1, max_length=200, description="cron: 5 or 6 fields, or @hourly, @daily, …")
    timezone: str = Field("UTC", min_length=1, max_length=100)
    payload: Payload = None
    max_missed: StrictInt = Field(1, ge=1, le=100, description="occurrences one poll delivers when several are due")


class ScheduleOut(BaseModel):
    queue: str
    name: str
    expression: str
    timezone: str
    payload: JsonValue
    max_missed: int
    next_at: datetime | Literal["infinity", "-infinity"] | None = Field(
        description="null: the schedule has ended (no occurrence before year 10000)"
    )
    last_error: str | None
    last_error_at: datetime | None
    failures: int


class NextAt(BaseModel):
    next_at: datetime


class ChannelIn(Body):
    """A channel's limits (dq_channel_set); null: no limit."""

    max_concurrency: StrictInt | None = Field(None, ge=1, le=2**31 - 1)
    min_interval: Annotated[Number, Field(gt=0, le=86400)] | None = Field(None, description="seconds between leases")


class ChannelOut(BaseModel):
    channel: str
    max_concurrency: int | None
    min_interval: float | None = Field(description="seconds")
    ready: int
    delayed: int
    leased: int
    last_leased_at: datetime | None


class PauseOut(BaseModel):
    paused: bool = Field(description="the queue's state now")
    changed: bool = Field(description="false: it was already in that state")


MAX_KEEP = 3650 * 86400  # seconds of history a queue may keep (dq_retain)


class RetentionIn(Body):
    """How long a record of each message that leaves the queue is kept (dq_retain)."""

    keep: Annotated[Number, Field(gt=0, le=MAX_KEEP)] | None = Field(
        description="seconds (at most 3650 days); null: stop keeping records (those kept age out as before)"
    )


class RetentionOut(BaseModel):
    keep: float | None = Field(description="seconds; null: history off")


class HistoryOut(BaseModel):
    queue: str
    key: str | None = Field(description="null for a keyless message (sent without a key)")
    id: int
    outcome: Literal["acked", "dead", "cancelled", "purged"]
    payload: JsonValue
    state: JsonValue
    channel: str | None
    priority: int
    created_at: datetime
    scheduled_at: datetime
    last_leased_at: datetime | None = Field(description="when its last delivery began; null: never delivered")
    finished_at: datetime
    attempts: int
    last_error: str | None
    headers: dict[str, JsonValue] | None


class HistoryBucketOut(BaseModel):
    bucket_at: datetime
    acked: int
    dead: int
    cancelled: int
    lateness_p50: float | None = Field(description="seconds from due to delivery; null: none delivered")
    lateness_p99: float | None
    run_p50: float | None = Field(description="seconds from the last delivery to the finish; null: none delivered")
    run_p99: float | None
