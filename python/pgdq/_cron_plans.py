"""What a Python schedule installs: pure functions of its configuration.

A plan is a key prefix, a config hash derived from the whole configuration,
how often to run, and a generator of (time, payload) occurrences ahead of
now. CronService and AsyncCronService (pgdq.cron) run plans.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from croniter import croniter

from .errors import InvalidArgument

Occurrences = list[tuple[datetime, Any]]
Generator = Callable[[datetime], Iterable[tuple[datetime, Any]]]

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Plan:
    """What a schedule installs, and how often."""

    key_prefix: str
    config_hash: str
    interval: timedelta
    generate: Generator  # now -> the occurrences to install


def config_hash(*parts: Any) -> str:
    """A short stable hash of a configuration (JSON of its parts)."""
    text = json.dumps(parts, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# --- plans: pure functions of the configuration -------------------------------


def periodic_plan(key_prefix: str, period: timedelta, payload: Any) -> Plan:
    """Occurrences at every multiple of period since the Unix epoch (UTC);
    runs every max(period / 4, 1 s), each run installing the occurrences of
    the next two periods (at least the next 2 s)."""
    positive(period, "period")
    interval = max(period / 4, timedelta(seconds=1))
    horizon = 2 * max(period, interval)

    def generate(now: datetime) -> Occurrences:
        step = (now - EPOCH) // period + 1
        first = EPOCH + step * period
        count = int(horizon / period) + 1
        return [(first + i * period, payload) for i in range(count)]

    return Plan(key_prefix, config_hash("periodic", period.total_seconds(), payload), interval, generate)


def daily_plan(
    key_prefix: str,
    timezone: str,
    times_of_day: Sequence[time],
    schedule_in_advance: timedelta,
    payload: Any = None,
) -> Plan:
    """Occurrences at each local time of day in timezone, schedule_in_advance
    ahead. A time that a DST change skips happens at the same wall time after
    the shift (02:30 on a spring-forward night becomes 03:30); a time that
    happens twice (fall back) happens once, the first time."""
    zone = _zone(timezone)
    if not times_of_day:
        raise InvalidArgument("times_of_day must not be empty")
    positive(schedule_in_advance, "schedule_in_advance")

    def generate(now: datetime) -> Occurrences:
        end = now + schedule_in_advance
        day, last = now.astimezone(zone).date() - timedelta(days=1), end.astimezone(zone).date()
        found: Occurrences = []
        while day <= last:
            found += [(at, payload) for t in times_of_day if now < (at := _local(day, t, zone)) <= end]
            day += timedelta(days=1)
        return sorted(found, key=lambda o: o[0])

    times = sorted(t.isoformat() for t in times_of_day)
    digest = config_hash("daily", timezone, times, payload)
    return Plan(key_prefix, digest, _interval_for(schedule_in_advance), generate)


def cron_plan(key_prefix: str, expression: str, timezone: str, payload: Any, schedule_in_advance: timedelta) -> Plan:
    """Occurrences of a cron expression (5 fields, or 6 with leading seconds)
    in timezone, schedule_in_advance ahead (croniter decides DST edges)."""
    zone = _zone(timezone)
    positive(schedule_in_advance, "schedule_in_advance")
    seconds_first = len(expression.split()) == 6
    if not croniter.is_valid(expression, second_at_beginning=seconds_first):
        raise InvalidArgument(f"not a cron expression: {expression!r}")

    def generate(now: datetime) -> Occurrences:
        it = croniter(expression, now.astimezone(zone), second_at_beginning=seconds_first)
        found: Occurrences = []
        while (at := it.get_next(datetime)) <= now + schedule_in_advance:
            found.append((at.astimezone(UTC), payload))
        return found

    digest = config_hash("cron", expression, timezone, payload)
    return Plan(key_prefix, digest, _interval_for(schedule_in_advance), generate)


def _zone(name: str) -> ZoneInfo:
    """The time zone called name; InvalidArgument if there is none."""
    try:
        return ZoneInfo(name)
    except (KeyError, ValueError) as e:
        raise InvalidArgument(f"unknown time zone {name!r}") from e


def positive(value: timedelta, name: str) -> None:
    """InvalidArgument naming the argument unless value is positive."""
    if value <= timedelta(0):
        raise InvalidArgument(f"{name} must be positive, got {value}")


def _interval_for(schedule_in_advance: timedelta) -> timedelta:
    """Run often enough that the horizon never runs dry: a quarter of it,
    between 1 second and 1 hour."""
    return min(max(schedule_in_advance / 4, timedelta(seconds=1)), timedelta(hours=1))


def _local(day: date, at: time, zone: ZoneInfo) -> datetime:
    """Wall time `at` on `day` in zone, in UTC. fold=0 (PEP 495) gives the
    rules in daily_plan: a skipped time maps forward by the shift, a repeated
    one to its first occurrence."""
    return datetime.combine(day, at, tzinfo=zone).replace(fold=0).astimezone(UTC)


def upcoming(plan: Plan) -> Occurrences:
    """The plan's occurrences as of now."""
    return list(plan.generate(datetime.now(UTC)))
