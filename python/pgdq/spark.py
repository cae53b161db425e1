"""pgdq on Spark: offer a DataFrame to a queue, read queues back.

    summary = offer_dataframe(df, conninfo, "reminders", key="user_id", payload="message", scheduled_at="send_at")
    report = read_queue(spark, conninfo, "reminders")

offer_dataframe sends each partition over one connection, one dq_offer_many
per chunk of batch_size rows (one round trip per chunk, never per row). Keys
decide identity, so Spark's task retries and whole re-runs are harmless: a
retried chunk is ignored. read_queue reads a consistent snapshot in parallel
by id ranges. Needs `pip install 'pgdq[spark]'` and Java 17; executors must
run the same Python (PYSPARK_PYTHON). Neither prepares statements, so both
work through PgBouncer in transaction mode; a read holds one server
connection for its snapshot and one for each range read at a time.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from itertools import islice
from typing import Any

import psycopg

from . import _statements as st
from ._sync_queue import Queue
from .errors import InvalidArgument, PgdqError, translate
from .model import Message

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class OfferSummary:
    """What offer_dataframe did, row by row. Under task retries the rows a
    failed attempt had already written count as ignored."""

    created: int = 0
    updated: int = 0
    ignored: int = 0

    def __add__(self, other: OfferSummary) -> OfferSummary:
        return OfferSummary(self.created + other.created, self.updated + other.updated, self.ignored + other.ignored)

    @property
    def rows(self) -> int:
        return self.created + self.updated + self.ignored


class BadRow(PgdqError):
    """A row offer_dataframe cannot offer: a NULL key or payload, or a string
    payload that is not JSON. Raised before its chunk is written."""


class _RawJson:
    """A codec for payloads that already are JSON text (Spark's to_json)."""

    def dumps(self, value: Any) -> str:
        return str(value)

    def load(self, value: Any) -> Any:
        return value


def offer_dataframe(
    df: Any,
    conninfo: str,
    queue: str,
    key: str = "key",
    payload: str = "payload",
    scheduled_at: str | None = None,
    can_update: bool = True,
    batch_size: int = 10_000,
    *,
    channel: str | None = None,
    priority: str | None = None,
    schema: str | None = None,
) -> OfferSummary:
    """Offer every row of df: key column, payload column (struct, map or array
    become JSON; a string must hold JSON), optional timestamp, channel
    (string; null: none) and priority (integer; null: 0) columns."""
    from pyspark.sql import functions as F  # noqa: N812 - PySpark's own idiom
    from pyspark.sql.types import StringType

    if batch_size < 1:
        raise InvalidArgument(f"batch_size must be positive, got {batch_size}")
    payload_type = df.schema[payload].dataType
    body = F.col(payload) if isinstance(payload_type, StringType) else F.to_json(F.col(payload))
    micros = F.unix_micros(F.col(scheduled_at)) if scheduled_at else F.lit(None).cast("long")
    group = F.col(channel).cast("string") if channel else F.lit(None).cast("string")
    level = F.col(priority).cast("int") if priority else F.lit(None).cast("int")
    rows = df.select(F.col(key).cast("string"), body, micros, group, level)
    offer = partial(_offer_partition, conninfo, queue, schema, can_update, batch_size, (key, payload))
    totals = rows.rdd.mapPartitions(offer).collect()
    return sum((OfferSummary(*t) for t in totals), OfferSummary())


def _offer_partition(
    conninfo: str,
    queue: str,
    schema: str | None,
    can_update: bool,
    batch_size: int,
    columns: tuple[str, str],
    rows: Iterable[Any],
) -> Iterator[tuple[int, int, int]]:
    """One partition: one connection, one dq_offer_many per chunk; its counts."""
    counts = {"created": 0, "updated": 0, "ignored": 0}
    iterator = iter(rows)
    # prepares nothing: a chunk is one large statement, and poolers in transaction mode cannot keep them
    with psycopg.connect(conninfo, autocommit=True, prepare_threshold=None) as conn:
        q = Queue(queue, conn, schema=schema, codec=_RawJson())
        while chunk := list(islice(iterator, batch_size)):
            messages = [_message(row, columns) for row in chunk]
            try:
                results = q.offer_many(messages, can_update=can_update)
            except psycopg.errors.InvalidTextRepresentation as e:  # some string payload is not JSON
                raise _not_json(chunk, columns) from e
            for result in results:
                counts[result.outcome.value] += 1
    yield counts["created"], counts["updated"], counts["ignored"]


def _message(row: Any, columns: tuple[str, str]) -> Message:
    key, body, micros, channel, priority = row
    if key is None or body is None:
        column = columns[0] if key is None else columns[1]
        raise BadRow(f"offer_dataframe: column {column!r} is null in row {_sample(row, columns)}")
    at = None if micros is None else EPOCH + timedelta(microseconds=micros)
    return Message(key, body, at, channel, priority or 0)


def _not_json(chunk: list[Any], columns: tuple[str, str]) -> BadRow:
    for row in chunk:
        try:
            json.loads(row[1])
        except ValueError:
            return BadRow(f"offer_dataframe: column {columns[1]!r} is not JSON in row {_sample(row, columns)}")
    return BadRow(f"offer_dataframe: a value of column {columns[1]!r} is not valid JSON for PostgreSQL")


def _sample(row: Any, columns: tuple[str, str]) -> str:
    return f"{{{columns[0]!r}: {row[0]!r}, {columns[1]!r}: {str(row[1])[:200]!r}}}"


# --- reading ------------------------------------------------------------------

# each source's Spark schema: the columns of dq_read_messages / dq_read_dead_letters
_SCHEMAS = {
    "messages": "id long, queue string, key string, payload string, state string, scheduled_at timestamp,"
    " due_at timestamp, created_at timestamp, attempts int, leased boolean",
    "dead_letters": "id long, queue string, key string, payload string, state string, scheduled_at timestamp,"
    " created_at timestamp, attempts int, error string, failed_at timestamp",
}


def read_queue(
    spark: Any, conninfo: str, queue: str | None = None, num_partitions: int = 4, *, schema: str = "public"
) -> Any:
    """The messages (of queue, or all) as one consistent snapshot, read in
    parallel by id ranges; payload and state as JSON strings."""
    return _read(spark, conninfo, "messages", queue, num_partitions, schema)


def read_dead_letters(
    spark: Any, conninfo: str, queue: str | None = None, num_partitions: int = 4, *, schema: str = "public"
) -> Any:
    """The dead letters (of queue, or all), like read_queue."""
    return _read(spark, conninfo, "dead_letters", queue, num_partitions, schema)


def _read(spark: Any, conninfo: str, source: str, queue: str | None, num_partitions: int, schema: str) -> Any:
    """Export a snapshot, read its id ranges (dq_read_bounds) in parallel,
    and cache the result before the snapshot's transaction ends."""
    from pyspark import StorageLevel

    if num_partitions < 1:
        raise InvalidArgument(f"num_partitions must be positive, got {num_partitions}")
    with _snapshot_reader(conninfo) as conn:  # one transaction holds the snapshot
        cur = conn.cursor()
        ((snapshot,),) = cur.execute(st.EXPORT_SNAPSHOT).fetchall()
        ((low, high),) = _run(cur, schema, "read_bounds", (source, queue))
        read = partial(_read_range, conninfo, snapshot, schema, source, queue)
        ranges = _id_ranges(low, high, num_partitions)
        rdd = spark.sparkContext.parallelize(ranges, max(1, len(ranges))).flatMap(read)
        frame = spark.createDataFrame(rdd, _SCHEMAS[source]).persist(StorageLevel.MEMORY_AND_DISK)
        frame.count()  # read everything while the snapshot exists
    return frame


def _snapshot_reader(conninfo: str) -> psycopg.Connection[Any]:
    """A connection whose transactions read one snapshot (REPEATABLE READ, read only)."""
    conn = psycopg.connect(conninfo, prepare_threshold=None)
    conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    conn.read_only = True
    return conn


def _run(cur: psycopg.Cursor[Any], schema: str, method: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """Run one of pgdq's statements (_statements); its rows. pgdq's errors become typed."""
    try:
        return cur.execute(st.statements(schema)[method], params).fetchall()
    except psycopg.Error as e:
        raise translate(e) from e


def _id_ranges(low: int | None, high: int | None, parts: int) -> list[tuple[int, int]]:
    """[low, high] cut into at most parts half-open ranges."""
    if low is None or high is None:
        return []
    step = max(1, (high - low + parts) // parts)
    return [(start, min(start + step, high + 1)) for start in range(low, high + 1, step)]


def _read_range(
    conninfo: str, snapshot: str, schema: str, source: str, queue: str | None, bounds: tuple[int, int]
) -> Iterator[tuple[Any, ...]]:
    """One id range (dq_read_messages / dq_read_dead_letters), inside the
    exported snapshot (timestamps stay aware: Spark converts them from their own zone)."""
    with _snapshot_reader(conninfo) as conn:
        cur = conn.cursor()
        cur.execute(st.use_snapshot(snapshot))
        yield from _run(cur, schema, f"read_{source}", (queue, bounds[0], bounds[1]))
