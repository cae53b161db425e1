"""Result types of the pgdq API."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple


class OfferOutcome(enum.StrEnum):
    """What an offer did to its key."""

    CREATED = "created"
    UPDATED = "updated"
    IGNORED = "ignored"


class Message(NamedTuple):
    """One element of offer_many: key, payload and optional aware due time."""

    key: str
    payload: Any
    scheduled_at: datetime | None = None


class OfferResult(NamedTuple):
    """One row of offer_many's answer, in input order."""

    key: str
    outcome: OfferOutcome


@dataclass(frozen=True)
class MessageInfo:
    """A message as dq_get sees it (nothing locked or changed)."""

    queue: str
    key: str
    payload: Any
    state: Any
    scheduled_at: datetime
    due_at: datetime
    attempts: int
    leased: bool
    created_at: datetime


@dataclass(frozen=True)
class QueueStats:
    """One row of dq_stats."""

    queue: str
    ready: int
    delayed: int
    leased: int
    oldest_ready_at: datetime | None
    next_due_at: datetime | None


@dataclass(frozen=True)
class DeadLetter:
    """A message given up on (one row of dq_dead_list)."""

    queue: str
    key: str
    payload: Any
    state: Any
    scheduled_at: datetime
    created_at: datetime
    attempts: int
    error: str | None
    failed_at: datetime


@dataclass(frozen=True)
class Schedule:
    """A schedule kept by the database (one row of dq_schedules)."""

    queue: str
    name: str
    expression: str
    timezone: str
    payload: Any
    max_missed: int
    next_at: datetime  # while failing: the next attempt
    last_error: str | None = None  # of the last attempt, when it failed (1.1)
    last_error_at: datetime | None = None
    failures: int = 0  # failed attempts in a row
