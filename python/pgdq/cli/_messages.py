"""`pgdq offer` (one message, or JSON Lines), `poll`, `ack` and `nack`."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from datetime import timedelta

import click
import psycopg

from .._sync_queue import Queue
from .._words import count as _count
from ..errors import PgdqError
from ..model import Message
from ..shard import is_router
from ._base import (
    BadInput,
    NothingThere,
    _client,
    _database,
    _emit,
    _emit_done,
    _json_argument,
    _parse_time,
    _queue,
    _reason,
    _stderr,
    _table,
    _tokens,
    _when,
    common_options,
)

# --- producing ----------------------------------------------------------------------


@click.command()
@common_options
@click.argument("queue")
@click.argument("key", required=False)
@click.argument("payload", required=False)
@click.option("--at", "at_text", help="due time, ISO 8601 with a zone (default: now)")
@click.option("--in", "in_seconds", type=float, help="due in this many seconds")
@click.option("--no-update", is_flag=True, help="leave an existing message of the key as it is")
@click.option("--channel", default=None, help="the message's channel (see `pgdq channels`)")
@click.option("--priority", default=0, show_default=True, type=int, help="higher first within its channel")
@click.option(
    "--jsonl",
    is_flag=True,
    help='read {"key", "payload"[, "scheduled_at", "channel", "priority"]} lines from stdin',
)
@click.option("--batch", default=1000, show_default=True, type=click.IntRange(1, 100_000), help="with --jsonl")
@click.option("--atomic", is_flag=True, help="with --jsonl: one transaction, all lines or none")
def offer(
    dsn: str | None,
    schema: str,
    as_json: bool,
    queue: str,
    key: str | None,
    payload: str | None,
    at_text: str | None,
    in_seconds: float | None,
    no_update: bool,
    channel: str | None,
    priority: int,
    jsonl: bool,
    batch: int,
    atomic: bool,
) -> None:
    """Offer one message (KEY PAYLOAD, PAYLOAD as JSON), or many with --jsonl.

    --jsonl commits each batch as it goes: a bad line stops the import, the
    batches before it stay and the error says how many went in. With
    --atomic the whole import is one transaction: all or nothing."""
    if jsonl:
        if key is not None or at_text is not None or in_seconds is not None or channel is not None or priority:
            raise click.UsageError(
                "--jsonl reads the messages from stdin: give no KEY, PAYLOAD, --at, --in, --channel or --priority"
            )
        counts = _offer_lines(dsn, schema, queue, not no_update, batch, atomic)
        _emit(counts, as_json, lambda: click.echo(", ".join(f"{n} {k}" for k, n in counts.items())))
        return
    if atomic:
        raise click.UsageError("--atomic goes with --jsonl")
    if key is None or payload is None:
        raise click.UsageError("give KEY and PAYLOAD, or --jsonl")
    value = _json_argument(payload, "PAYLOAD")
    with _queue(dsn, schema, queue) as q:
        outcome = q.offer(
            key, value, _when(at_text, in_seconds), can_update=not no_update, channel=channel, priority=priority
        )
    _emit({"key": key, "outcome": outcome.value}, as_json, lambda: click.echo(outcome.value))


def _offer_lines(
    dsn: str | None, schema: str, queue: str, can_update: bool, batch: int, atomic: bool
) -> dict[str, int]:
    """offer --jsonl: stdin's lines in batches of offer_many (in one
    transaction with atomic); the counts of their outcomes."""
    counts = {"created": 0, "updated": 0, "ignored": 0}
    with _database(dsn, schema) as conn, _progress(queue) as advance:
        if atomic and is_router(conn, schema):
            raise BadInput(
                "--atomic: through a PL/Proxy router each batch commits on its partition by itself;"
                " import on the partition that owns the queue (the router's dq_shard_partition names it)"
            )
        q = Queue(queue, conn, schema=schema)
        with conn.transaction() if atomic else nullcontext():
            chunk: list[Message] = []
            first = last = 0  # the lines of the first and last message not yet written
            for number, line in enumerate(sys.stdin, 1):
                if not line.strip():
                    continue
                if not chunk:
                    first = number
                try:
                    chunk.append(_message(line))
                except ValueError as e:
                    raise _import_failed(f"line {number}", str(e), counts, first, atomic) from e
                last = number
                if len(chunk) >= batch:
                    _offer_chunk(q, chunk, (first, last), can_update, counts, atomic)
                    advance(len(chunk))
                    chunk = []
            if chunk:
                _offer_chunk(q, chunk, (first, last), can_update, counts, atomic)
                advance(len(chunk))
    return counts


def _message(line: str) -> Message:
    """One JSON Lines message: key, payload, optional aware scheduled_at, channel and priority."""
    try:
        item = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON: {e}") from e
    if not isinstance(item, dict) or "key" not in item or "payload" not in item:
        raise ValueError('expected an object {"key", "payload"[, "scheduled_at", "channel", "priority"]}')
    key, at = item["key"], item.get("scheduled_at")
    channel, priority = item.get("channel"), item.get("priority", 0)
    if not isinstance(key, str):
        raise ValueError(f"key must be a string, got {json.dumps(key)}")
    if at is not None and not isinstance(at, str):
        raise ValueError(f"scheduled_at must be an ISO 8601 string, got {json.dumps(at)}")
    if channel is not None and not isinstance(channel, str):
        raise ValueError(f"channel must be a string, got {json.dumps(channel)}")
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError(f"priority must be an integer, got {json.dumps(priority)}")
    return Message(key, item["payload"], None if at is None else _parse_time(at), channel, priority)


def _offer_chunk(
    q: Queue, chunk: list[Message], lines: tuple[int, int], can_update: bool, counts: dict[str, int], atomic: bool
) -> None:
    """Offer one batch (lines first to last) and count its outcomes; a refused batch stops the import."""
    try:
        results = q.offer_many(chunk, can_update=can_update)
    except (PgdqError, psycopg.Error) as e:
        where = f"the batch of lines {lines[0]}-{lines[1]}"
        raise _import_failed(where, _reason(e), counts, lines[0], atomic) from e
    for result in results:
        counts[result.outcome.value] += 1


def _import_failed(where: str, reason: str, counts: dict[str, int], first: int, atomic: bool) -> click.ClickException:
    """The error that stops offer --jsonl, saying exactly what was written before it."""
    if atomic:
        return click.ClickException(f"{where}: {reason}; nothing was offered (--atomic: the import rolled back)")
    written = sum(counts.values())
    if written == 0:
        return click.ClickException(f"{where}: {reason}; nothing was offered")
    detail = ", ".join(f"{n} {k}" for k, n in counts.items() if n)
    offered = "was offered and stays" if written == 1 else "were offered and stay"
    kept = f"{_count(written, 'message')} before it {offered} ({detail})"
    return click.ClickException(f"{where}: {reason}; {kept}; nothing from line {first} on")


@contextmanager
def _progress(queue: str) -> Iterator[Callable[[int], None]]:
    """A live count and rate of offered messages on stderr (only when it is
    a terminal); yields the function that adds to the count."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = _stderr()
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TextColumn("{task.fields[done]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as progress:
        task = progress.add_task(f"offering to {queue}", total=None, done="")
        start, done = time.monotonic(), 0

        def advance(count: int) -> None:
            nonlocal done
            done += count
            rate = done / max(time.monotonic() - start, 1e-6)
            progress.update(task, advance=count, done=f"{_count(done, 'message')}, {rate:,.0f}/s")

        yield advance


# --- consuming --------------------------------------------------------------------------


@click.command()
@common_options
@click.argument("queue")
@click.option("--max", "max_count", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--lease", default=60.0, show_default=True, type=click.FloatRange(min=0.001), help="seconds")
def poll(dsn: str | None, schema: str, as_json: bool, queue: str, max_count: int, lease: float) -> None:
    """Lease due messages (for debugging); prints their lock tokens, whole
    (`pgdq poll Q | cut -f1 | xargs pgdq ack`), and their ids last (a
    keyless message's key is empty)."""
    with _queue(dsn, schema, queue) as q:
        got = q.poll_many(max_count, timedelta(seconds=lease))
    rows = [
        {
            "lock_token": str(d.lock_token),
            "key": d.key,
            "attempts": d.attempts,
            "lease_until": d.lease_until,
            "channel": d.channel,
            "priority": d.priority,
            "payload": d.raw_payload,
            "id": d.id,
        }
        for d in got
    ]
    _emit(
        rows,
        as_json,
        lambda: _table(
            f"{queue}: {len(rows)} leased",
            ["lock_token", "key", "attempts", "lease_until", "payload", "id"],
            [[d.lock_token, d.key, d.attempts, d.lease_until, json.dumps(d.raw_payload), d.id] for d in got],
        ),
    )


@click.command()
@common_options
@click.argument("tokens", nargs=-1, required=True)
def ack(dsn: str | None, schema: str, as_json: bool, tokens: tuple[str, ...]) -> None:
    """Ack lock tokens (of any queues); exit 4 if any was stale."""
    parsed = _tokens(tokens)
    with _client(dsn, schema) as client:
        done = client.ack_many(parsed)
    _emit({"acked": done, "stale": len(parsed) - done}, as_json, lambda: click.echo(f"{done} of {len(parsed)} acked"))
    if done < len(parsed):
        sys.exit(NothingThere.exit_code)


@click.command()
@common_options
@click.argument("token")
@click.option("--at", "at_text", help="due again at, ISO 8601 with a zone (default: now)")
@click.option("--in", "in_seconds", type=float, help="due again in this many seconds")
@click.option("--error", default=None, help="why: kept as the message's last_error")
def nack(
    dsn: str | None,
    schema: str,
    as_json: bool,
    token: str,
    at_text: str | None,
    in_seconds: float | None,
    error: str | None,
) -> None:
    """Give a leased message back, due now or --at/--in; exit 4 if the token was stale."""
    (parsed,) = _tokens([token])
    at = _when(at_text, in_seconds)
    with _client(dsn, schema) as client:
        done = client.nack(parsed, at, error=error)
    _emit_done(done, "nacked", "stale: the delivery is no longer current", as_json)
