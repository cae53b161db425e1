"""The one place where the Python API meets SQL: each method's statement and
argument checks, shared by Queue and AsyncQueue."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
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

# send_many's headers travel as one JSON array document too, JSON null for an
# element without headers (an SQL NULL element); no document: NULL, no headers
_HEADERS_ARRAY = (
    "(SELECT pg_catalog.array_agg(NULLIF(e.v, 'null'::jsonb) ORDER BY e.n)"
    " FROM pg_catalog.jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS e (v, n))"
)

# method name -> statement; {fn} is replaced by the (schema-qualified) function,
# dq_ and the method name without these suffixes (variants of one function)
_VARIANTS = ("_grouped", "_headed", "_in_queue")
_TEMPLATES: dict[str, str] = {
    # plain offers call the 1.0 signatures, so this client works against 1.0.0 SQL
    "offer": "SELECT {fn}(%s, %s, %s::jsonb, %s, %s)",
    "offer_many": "SELECT o.outcome FROM {fn}(%s, %s::text[], " + _PAYLOAD_ARRAY + ", %s::timestamptz[], %s) AS o",
    # with a channel or a priority (1.1)
    "offer_grouped": "SELECT {fn}(%s, %s, %s::jsonb, %s, %s, %s, %s)",
    "offer_many_grouped": "SELECT o.outcome FROM {fn}(%s, %s::text[], "
    + _PAYLOAD_ARRAY
    + ", %s::timestamptz[], %s, %s::text[], %s::integer[]) AS o",
    # with headers (1.2)
    "offer_headed": "SELECT {fn}(%s, %s, %s::jsonb, %s, %s, %s, %s, %s::jsonb)",
    "offer_many_headed": "SELECT o.outcome FROM {fn}(%s, %s::text[], "
    + _PAYLOAD_ARRAY
    + ", %s::timestamptz[], %s, %s::text[], %s::integer[], "
    + _HEADERS_ARRAY
    + ") AS o",
    # keyless messages (1.2): sent, never deduplicated, addressed by id
    "send": "SELECT {fn}(%s, %s::jsonb, %s::timestamptz, %s::text, %s::integer, %s::jsonb)",
    "send_many": "SELECT s.id FROM {fn}(%s, "
    + _PAYLOAD_ARRAY
    + ", %s::timestamptz[], %s::text[], %s::integer[], "
    + _HEADERS_ARRAY
    + ") AS s (id)",
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
    "finish": "SELECT {fn}(%s, %s)",
    "get": "SELECT * FROM {fn}(%s, %s)",
    "cancel_id": "SELECT {fn}(%s, %s::bigint)",
    "finish_id": "SELECT {fn}(%s, %s::bigint)",
    "get_id": "SELECT * FROM {fn}(%s, %s::bigint)",
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
    "dead_redrive_id": "SELECT {fn}(%s, %s::bigint, %s::timestamptz)",
    "dead_purge_id": "SELECT {fn}(%s, %s::bigint)",
    "schedule_set": "SELECT {fn}(%s, %s, %s, %s, %s::jsonb, %s)",
    "schedule_remove": "SELECT {fn}(%s, %s)",
    "schedules": "SELECT * FROM {fn}(%s::text)",
    "channel_set": "SELECT {fn}(%s, %s, %s::integer, %s::interval)",
    "channel_remove": "SELECT {fn}(%s, %s)",
    "channels": "SELECT * FROM {fn}(%s)",
    # snapshot reads (pgdq.spark): payload and state as JSON text, as Spark takes them
    "read_bounds": "SELECT b.low, b.high FROM {fn}(%s, %s::text) AS b",
    # pause and resume, history (1.2)
    "browse": "SELECT * FROM {fn}(%s, %s::text, %s::text, %s::timestamptz, %s::bigint, %s::integer)",
    "run_now": "SELECT {fn}(%s, %s::bigint)",
    "pause": "SELECT {fn}(%s)",
    "resume": "SELECT {fn}(%s)",
    "retain": "SELECT {fn}(%s, %s::interval)",
    "history": "SELECT * FROM {fn}(%s, %s::text, %s::integer)",
    "history_stats": "SELECT * FROM {fn}(%s, %s::timestamptz, %s::interval)",
    # running and retrying messages, releasing a lease, failures over time (1.3)
    "deliveries": "SELECT * FROM {fn}(%s, %s::text, %s::integer)",
    "delivery_of": "SELECT * FROM {fn}(%s, %s::bigint)",
    "release": "SELECT {fn}(%s, %s::bigint)",
    "dead_counts": "SELECT * FROM {fn}(%s::text, %s::timestamptz, %s::interval)",
    "read_messages": "SELECT r.id, r.queue, r.key, r.payload::text, r.state::text, r.scheduled_at, r.due_at,"
    " r.created_at, r.attempts, r.leased FROM {fn}(%s::text, %s::bigint, %s::bigint) AS r",
    "read_dead_letters": "SELECT r.id, r.queue, r.key, r.payload::text, r.state::text, r.scheduled_at,"
    " r.created_at, r.attempts, r.error, r.failed_at FROM {fn}(%s::text, %s::bigint, %s::bigint) AS r",
}

# The methods whose rows may carry JSON values (payload, state, headers):
# those returning whole rows ("SELECT * FROM"). The others return a scalar,
# an outcome, an id or JSON as text, so their reads need no tolerance of
# JSON that Python cannot read (codec.tolerate_unreadable_json: a copy of the
# cursor's adapters, about 10 µs of an offer's 90). tests/test_statements.py
# checks this against the server's description of every statement.
READS_JSON = frozenset(method for method, template in _TEMPLATES.items() if template.startswith("SELECT * FROM"))

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


# PostgreSQL's bigint, the type of a message id
_BIGINT_MIN, _BIGINT_MAX = -(2**63), 2**63 - 1


def message_id(value: Any, name: str = "id") -> int | None:
    """A message id: an int that fits PostgreSQL's bigint (None stays None:
    the server answers NullArgument)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name} must be an int, got {type(value).__name__}")
    if not _BIGINT_MIN <= value <= _BIGINT_MAX:
        raise InvalidArgument(f"{name} must be between {_BIGINT_MIN} and {_BIGINT_MAX}, got {value}")
    return value


def headers(value: Any, name: str = "headers") -> str | None:
    """Headers as JSON text: a mapping (a JSON object) or None."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidArgument(f"{name} must be a dict (a JSON object) or None, got {type(value).__name__}")
    return _json_text(dict(value), name)


def _json_text(value: Any, name: str) -> str:
    try:
        return json.dumps(value, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        raise InvalidArgument(f"{name} is not JSON serialisable: {e}") from e


class Batch(NamedTuple):
    """offer_many's arrays: a list per column, None for a column no element
    sets (headers as one JSON array document, as send_many's)."""

    keys: list[Any]
    payloads: list[Any]
    times: list[datetime | None] | None
    channels: list[str | None] | None
    priorities: list[int] | None
    headers: str | None = None


def split_messages(messages: Iterable[Message | tuple[Any, ...]]) -> Batch:
    """The arrays of a batch: keys, payloads, aware times, channels, priorities, headers."""
    keys: list[Any] = []
    payloads: list[Any] = []
    times: list[datetime | None] = []
    channels: list[str | None] = []
    priorities: list[int] = []
    headers_: list[Mapping[str, Any] | None] = []
    for i, item in enumerate(messages):
        key, payload, at, channel, level, meta = item if isinstance(item, Message) else Message(*item)
        keys.append(key)
        payloads.append(payload)
        times.append(None if at is None else aware(at, f"messages[{i}].scheduled_at"))
        channels.append(channel)
        priorities.append(priority(level, f"messages[{i}].priority"))
        headers_.append(meta)
    return Batch(
        keys,
        payloads,
        times if any(t is not None for t in times) else None,
        channels if any(c is not None for c in channels) else None,
        priorities if any(priorities) else None,
        _headers_document(headers_, "messages[{}].headers"),
    )


def _headers_document(values: Sequence[Mapping[str, Any] | None], name: str) -> str | None:
    """A batch's headers as one JSON array document (JSON null for an
    element without), or None when no element has any; name is the
    element's name with {} for its position."""
    if all(h is None for h in values):
        return None
    for i, h in enumerate(values):
        if h is not None and not isinstance(h, Mapping):
            raise InvalidArgument(f"{name.format(i)} must be a dict (a JSON object) or None, got {type(h).__name__}")
    return _json_text([None if h is None else dict(h) for h in values], "headers")


class SendBatch(NamedTuple):
    """send_many's arrays: payloads, then a list per column, None for a
    column no element sets (headers as one JSON array document)."""

    payloads: list[Any]
    times: list[datetime | None] | None
    channels: list[str | None] | None
    priorities: list[int] | None
    headers: str | None


def _column(values: Sequence[Any] | None, name: str, count: int) -> Sequence[Any] | None:
    """A send_many column: None, or a sequence with count elements."""
    if values is None:
        return None
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Sequence):
        raise InvalidArgument(f"{name} must be a sequence or None, got {type(values).__name__}")
    if len(values) != count:
        raise InvalidArgument(f"{name} must be None or have as many elements as payloads ({count}), got {len(values)}")
    return values


def split_sends(
    payloads: Iterable[Any],
    scheduled_ats: Sequence[datetime | None] | None,
    channels: Sequence[str | None] | None,
    priorities: Sequence[int | None] | None,
    headers_: Sequence[Mapping[str, Any] | None] | None,
) -> SendBatch:
    """The arrays of a batch of sends, checked as offer_many checks its
    messages: aware times, int priorities, headers objects; each column as
    long as payloads, and None when no element sets it."""
    if isinstance(payloads, (str, bytes, Mapping)) or not isinstance(payloads, Iterable):
        raise InvalidArgument(f"payloads must be a sequence of payloads, got {type(payloads).__name__}")
    values = list(payloads)
    count = len(values)
    given_times = _column(scheduled_ats, "scheduled_ats", count)
    given_channels = _column(channels, "channels", count)
    given_priorities = _column(priorities, "priorities", count)
    given_headers = _column(headers_, "headers", count)
    times = None
    if given_times is not None and any(at is not None for at in given_times):
        times = [aware(at, f"scheduled_ats[{i}]") for i, at in enumerate(given_times)]
    levels = None
    if given_priorities is not None:
        levels = [priority(level, f"priorities[{i}]") for i, level in enumerate(given_priorities)]
    document = None if given_headers is None else _headers_document(given_headers, "headers[{}]")
    return SendBatch(
        values,
        times,
        list(given_channels) if given_channels is not None and any(c is not None for c in given_channels) else None,
        levels if levels is not None and any(levels) else None,
        document,
    )


def token_list(tokens: Sequence[Any] | None) -> list[Any] | None:
    """Lock tokens as a list (None stays None: the server answers 0)."""
    return None if tokens is None else list(tokens)


def use_snapshot(snapshot: str) -> bytes:
    """The statement that makes this transaction read in an exported snapshot."""
    return sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot)).as_bytes(None)
