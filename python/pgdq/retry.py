"""The retry policy users configure (Backoff, Retry, HandlerTimeout, Route, @handler); each queue's settings."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from ._async_queue import AsyncDelivery

Handler = Callable[[AsyncDelivery], Any]
T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """Retry delays: base * factor ** (attempts - 1), at most cap, the last
    `jitter` fraction of it drawn at random so failing messages spread out."""

    base: timedelta = timedelta(seconds=1)
    cap: timedelta = timedelta(minutes=10)
    factor: float = 2.0
    jitter: float = 0.5

    def delay(self, attempts: int) -> timedelta:
        """The wait before the next delivery after `attempts` deliveries failed."""
        full = min(self.cap.total_seconds(), self.base.total_seconds() * self.factor ** max(0, attempts - 1))
        return timedelta(seconds=full * (1 - self.jitter * random.random()))


class Retry(Exception):  # noqa: N818 - raised as control flow, like StopIteration
    """Raise from a handler to retry at a chosen time (an aware datetime, or a
    delay), saving state as the message's checkpoint. at=None: the backoff."""

    def __init__(self, at: datetime | timedelta | None = None, state: Any = None) -> None:
        super().__init__(at, state)
        self.at = at
        self.state = state


class HandlerTimeout(Exception):  # noqa: N818 - the failure recorded, like Retry
    """The failure a handler running past its timeout is retried (and at
    last dead-lettered) with; the worker records it, handlers do not raise it."""


@dataclass(frozen=True)
class Route:
    """A queue's handler and its overrides of the worker's defaults."""

    handler: Handler
    lease: timedelta | None = None
    max_attempts: int | None = None
    backoff: Backoff | None = None
    timeout: timedelta | None = None


def handler(
    *,
    lease: timedelta | None = None,
    max_attempts: int | None = None,
    backoff: Backoff | None = None,
    timeout: timedelta | None = None,
) -> Callable[[T], T]:
    """Decorator: per-handler overrides of lease, max_attempts, backoff and timeout."""

    def mark(fn: T) -> T:
        marks = {"lease": lease, "max_attempts": max_attempts, "backoff": backoff, "timeout": timeout}
        fn.__pgdq_route__ = marks  # type: ignore[attr-defined]
        return fn

    return mark


@dataclass(frozen=True)
class Policy:
    """A queue's handler with every setting resolved (refused unless usable)."""

    handler: Handler
    lease: timedelta
    max_attempts: int
    backoff: Backoff
    timeout: timedelta | None

    def __post_init__(self) -> None:
        if self.timeout is not None and self.timeout <= timedelta(0):
            raise ValueError("a handler timeout must be positive (None: no timeout)")
        if self.lease <= timedelta(0) or self.max_attempts < 1:
            raise ValueError("every queue needs a positive lease and max_attempts >= 1")

    def next_try(self, attempts: int, at: datetime | timedelta | None = None) -> datetime | None:
        """When to deliver again after `attempts` deliveries: at (a time, or a
        delay from now), else after the backoff; None once max_attempts are used up."""
        if attempts >= self.max_attempts:
            return None
        if isinstance(at, datetime):
            return at
        return datetime.now(UTC) + (self.backoff.delay(attempts) if at is None else at)


def route_missing(delivery: AsyncDelivery) -> None:
    """The handler of the worker's defaults, which no queue uses."""
    raise AssertionError("the worker's defaults have no handler")


def resolve(route: Handler | Route, worker: Policy) -> Policy:
    """Settings for one queue: the Route's, else the handler's (@handler), else the worker's."""
    if not isinstance(route, Route):
        route = Route(route)
    marks = getattr(route.handler, "__pgdq_route__", {})
    return Policy(
        route.handler,
        _first_set(route.lease, marks.get("lease"), worker.lease),
        _first_set(route.max_attempts, marks.get("max_attempts"), worker.max_attempts),
        _first_set(route.backoff, marks.get("backoff"), worker.backoff),
        _first_set(route.timeout, marks.get("timeout"), worker.timeout),
    )


def _first_set(*values: Any) -> Any:
    """The first value that is not None (a zero or empty setting counts as set)."""
    return next((v for v in values if v is not None), None)
