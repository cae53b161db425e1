"""The one place where the Python API meets SQL: each method's statement and
argument checks, shared by Queue and AsyncQueue."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from functools import cache
from typing import Any, NamedTuple

from psycopg import sql

from .errors import InvalidArgument
from .model import Message

Lease = timedelta | float | int

# A batch's payloads travel as one JSON array document: far
# cheaper to send and parse than a jsonb[] literal of 1,000 quoted elements
# (codec.dumps_array).
_PAYLOAD_ARRAY = (
    "ARRAY(SELECT e.v FROM pg_catalog.jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS e (v, n) ORDER BY e.n)"
)

# method name -> statement; {fn} is replaced by the (schema-qualified) function,
# dq_ and the method name without these suffixes (variants of one function)
_VARIANTS = ("_grouped", "_in_queue")
_TEMPLATES: dict[str, str] = {
    # plain offers call the 1.0 signatures, so this client works against 1.0.0 SQL
    "offer": "SELECT {fn}(%s, %s, %s::jsonb, %s, %s)",
    "offer_many": "SELECT o.outcome FROM {fn}(%s, %s::text[], " + _PAYLOAD_ARRAY + ", %s::timestamptz[], %s) AS o",
    # with a channel or a priority (1.1)
    "offer_grouped": "SELECT {fn}(%s, %s, %s::jsonb, %s, %s, %s, %s)",
    "offer_many_grouped": "SELECT o.outcome FROM {fn}(%s, %s::text[], "
    + _PAYLOAD_ARRAY
    + ", %s::timestamptz[], %s, %s::text[], %s::integer[]) AS o",
    "poll": "SELECT * FROM {fn}(%s, %s)",
    "poll_many": "SELECT * FROM {fn}(%s, %s, %s)",
    # lock tokens of any queue (a Client): the 1.1 signatures, so it works against 1.0.0 and 1.1.0 SQL
    "ack": "SELECT {fn}(%s)",
    "ack_many": "SELECT {fn}(%s::uuid[])",
    "ack_poll": "SELECT * FROM {fn}(%s::uuid[], %s, %s, %s)",
    "nack": "SELECT {fn}(%s, %s, %s::jsonb, %s::text)",
    "extend": "SELECT {fn}(%s, %s)",
    "dead_letter": "SELECT {fn}(%s, %s)",
    # lock tokens of one queue (a Queue): its name last, another queue's token is stale (1.2)
    "ack_in_queue": "SELECT {fn}(%s, %s::text)",
    "ack_many_in_queue": "SELECT {fn}(%s::uuid[], %s::text)",
    "nack_in_queue": "SELECT {fn}(%s, %s, %s::jsonb, %s::text, %s::text)",
    "extend_in_queue": "SELECT {fn}(%s, %s, %s::text)",
    "dead_letter_in_queue": "SELECT {fn}(%s, %s::text, %s::text)",
    "cancel": "SELECT {fn}(%s, %s)",
    "get": "SELECT * FROM {fn}(%s, %s)",
    "purge": "SELECT {fn}(%s)",
    "peek": "SELECT * FROM {fn}(%s, %s::text, %s::integer)",
    "stats": "SELECT * FROM {fn}(%s::text)",
    "dead_stats": "SELECT * FROM {fn}(%s::text)",
    "due_hours": "SELECT * FROM {fn}(%s, %s)",
    "key_queues": "SELECT q FROM {fn}(%s) AS q",
    "next_due": "SELECT {fn}(%s)",
    "cron_install": "SELECT {fn}(%s, %s, %s, %s::timestamptz[], " + _PAYLOAD_ARRAY + ", %s)",
    "cron_uninstall": "SELECT {fn}(%s, %s, %s)",
    "version": "SELECT {fn}()",
    "configure": "SELECT {fn}(%s, %s)",
    "dead_list": "SELECT * FROM {fn}(%s, %s)",
    "dead_redrive": "SELECT {fn}(%s, %s, %s)",
    "dead_purge": "SELECT {fn}(%s, %s)",
    "schedule_set": "SELECT {fn}(%s, %s, %s, %s, %s::jsonb, %s)",
    "schedule_remove": "SELECT {fn}(%s, %s)",
    "schedules": "SELECT * FROM {fn}(%s::text)",
    "channel_set": "SELECT {fn}(%s, %s, %s::integer, %s::interval)",
    "channel_remove": "SELECT {fn}(%s, %s)",
    "channels": "SELECT * FROM {fn}(%s)",
    # snapshot reads (pgdq.spark): payload and state as JSON text, as Spark takes them
    "read_bounds": "SELECT b.low, b.high FROM {fn}(%s, %s::text) AS b",
    "read_messages": "SELECT r.id, r.queue, r.key, r.payload::text, r.state::text, r.scheduled_at, r.due_at,"
    " r.created_at, r.attempts, r.leased FROM {fn}(%s::text, %s::bigint, %s::bigint) AS r",
    "read_dead_letters": "SELECT r.id, r.queue, r.key, r.payload::text, r.state::text, r.scheduled_at,"
    " r.created_at, r.attempts, r.error, r.failed_at FROM {fn}(%s::text, %s::bigint, %s::bigint) AS r",
}

# The snapshot a reader exports for others to read in (pgdq.spark).
EXPORT_SNAPSHOT = b"SELECT pg_catalog.pg_export_snapshot()"


@cache
def statements(schema: str | None) -> dict[str, bytes]:
    """Every statement, rendered once per schema, calling dq_<method> in schema (or on search_path)."""
    rendered = {}
    for method, template in _TEMPLATES.items():
        function = method
        for variant in _VARIANTS:
            function = function.removesuffix(variant)
        name = sql.Identifier(f"dq_{function}")
        fn = sql.SQL(".").join([sql.Identifier(schema), name]) if schema else name
        rendered[method] = sql.SQL(template).format(fn=fn).as_bytes(None)
    return rendered


def aware(value: datetime | None, name: str) -> datetime | None:
    """value if it is None or timezone-aware; a naive time is an error, not a guess."""
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise InvalidArgument(f"{name} must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidArgument(f"{name} must be timezone-aware (got naive {value.isoformat()})")
    return value


def lease(value: Lease | None, name: str = "lease") -> timedelta | None:
    """A lease as an interval: timedelta, or a number of seconds."""
    if value is None or isinstance(value, timedelta):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgument(f"{name} must be a timedelta or seconds, got {type(value).__name__}")
    return timedelta(seconds=value)


# PostgreSQL's integer, the type of a priority
_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1


def priority(value: Any, name: str = "priority") -> int:
    """A priority: an int that fits PostgreSQL's integer (None is 0)."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name} must be an int, got {type(value).__name__}")
    if not _INT_MIN <= value <= _INT_MAX:
        raise InvalidArgument(f"{name} must be between {_INT_MIN} and {_INT_MAX}, got {value}")
    return value


class Batch(NamedTuple):
    """offer_many's arrays: a list per column, None for a column no element sets."""

    keys: list[Any]
    payloads: list[Any]
    times: list[datetime | None] | None
    channels: list[str | None] | None
    priorities: list[int] | None


def split_messages(messages: Iterable[Message | tuple[Any, ...]]) -> Batch:
    """The arrays of a batch: keys, payloads, aware times, channels, priorities."""
    keys: list[Any] = []
    payloads: list[Any] = []
    times: list[datetime | None] = []
    channels: list[str | None] = []
    priorities: list[int] = []
    for i, item in enumerate(messages):
        key, payload, at, channel, level = item if isinstance(item, Message) else Message(*item)
        keys.append(key)
        payloads.append(payload)
        times.append(None if at is None else aware(at, f"messages[{i}].scheduled_at"))
        channels.append(channel)
        priorities.append(priority(level, f"messages[{i}].priority"))
    return Batch(
        keys,
        payloads,
        times if any(t is not None for t in times) else None,
        channels if any(c is not None for c in channels) else None,
        priorities if any(priorities) else None,
    )


def token_list(tokens: Sequence[Any] | None) -> list[Any] | None:
    """Lock tokens as a list (None stays None: the server answers 0)."""
    return None if tokens is None else list(tokens)


def use_snapshot(snapshot: str) -> bytes:
    """The statement that makes this transaction read in an exported snapshot."""
    return sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)).as_bytes(None)
