"""The JSON bodies of the HTTP API (they make its OpenAPI document)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated
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


class OfferIn(Body):
    """One message: due at `at`, or `delay` seconds from now, or now."""

    key: Key
    payload: JsonValue
    at: Time | None = None
    delay: Seconds | None = None
    can_update: StrictBool = True
    channel: Channel | None = None
    priority: Priority = 0

    @model_validator(mode="after")
    def _one_time(self) -> OfferIn:
        if self.at is not None and self.delay is not None:
            raise ValueError("give at or delay, not both")
        return self


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


class DeliveryOut(BaseModel):
    id: int
    queue: str
    key: str
    payload: JsonValue
    state: JsonValue
    scheduled_at: datetime
    created_at: datetime
    attempts: int
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
    state: JsonValue = None
    error: str | None = None


class ExtendIn(Body):
    lock_token: UUID
    lease: LeaseSeconds


class ExtendOut(BaseModel):
    lease_until: datetime


class MessageOut(BaseModel):
    queue: str
    key: str
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
