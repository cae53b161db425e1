"""The one place where the Python API meets SQL: each method's statement and
argument checks, shared by Queue and AsyncQueue."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from functools import cache
from typing import Any

from psycopg import sql

from .errors import InvalidArgument
from .model import Message

Lease = timedelta | float | int

# method name -> statement; {fn} is replaced by the (schema-qualified) function
_TEMPLATES: dict[str, str] = {
    "offer": "SELECT {fn}(%s, %s, %s::jsonb, %s, %s)",
    "offer_many": "SELECT * FROM {fn}(%s, %s::text[], %s::text[]::jsonb[], %s::timestamptz[], %s)",
    "poll": "SELECT * FROM {fn}(%s, %s)",
    "poll_many": "SELECT * FROM {fn}(%s, %s, %s)",
    "ack": "SELECT {fn}(%s)",
    "ack_many": "SELECT {fn}(%s::uuid[])",
    "nack": "SELECT {fn}(%s, %s, %s::jsonb)",
    "extend": "SELECT {fn}(%s, %s)",
    "cancel": "SELECT {fn}(%s, %s)",
    "get": "SELECT * FROM {fn}(%s, %s)",
    "purge": "SELECT {fn}(%s)",
    "stats": "SELECT * FROM {fn}(%s)",
    "next_due": "SELECT {fn}(%s)",
    "cron_install": "SELECT {fn}(%s, %s, %s, %s::timestamptz[], %s::text[]::jsonb[], %s)",
    "cron_uninstall": "SELECT {fn}(%s, %s, %s)",
    "version": "SELECT {fn}()",
}


@cache
def statements(schema: str | None) -> dict[str, bytes]:
    """Every statement, rendered once per schema, calling dq_<method> in schema (or on search_path)."""
    rendered = {}
    for method, template in _TEMPLATES.items():
        name = sql.Identifier(f"dq_{method}")
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


def split_messages(
    messages: Iterable[Message | tuple[Any, ...]],
) -> tuple[list[Any], list[Any], list[datetime | None] | None]:
    """Keys, payloads and aware times (None when no element has one) of a batch."""
    keys: list[Any] = []
    payloads: list[Any] = []
    times: list[datetime | None] = []
    for i, item in enumerate(messages):
        msg = item if isinstance(item, Message) else Message(*item)
        keys.append(msg.key)
        payloads.append(msg.payload)
        times.append(aware(msg.scheduled_at, f"messages[{i}].scheduled_at"))
    return keys, payloads, (times if any(t is not None for t in times) else None)


def token_list(tokens: Sequence[Any] | None) -> list[Any] | None:
    """Lock tokens as a list (None stays None: the server answers 0)."""
    return None if tokens is None else list(tokens)
