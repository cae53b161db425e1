"""`pgdq peek`, `cancel`, `purge`, `stats`, `pause`, `resume`, `retain`,
`history`, `channels …`, `dead-letters …` and `schedules …`."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime

import click

from .._sync_queue import Client, Queue
from .._words import count as _count
from ..model import ChannelInfo, QueueStats
from ._base import (
    QueueSettings,
    _cell,
    _client,
    _database,
    _emit,
    _emit_done,
    _json_argument,
    _known_queue,
    _known_queue_on,
    _last_line,
    _queue,
    _table,
    _when,
    common_options,
    parse_span,
    queue_settings,
)

# --- looking and managing --------------------------------------------------------------


@click.command()
@common_options
@click.argument("queue")
@click.option("--due", "which", flag_value="due", help="only messages due now (expired leases too)")
@click.option("--delayed", "which", flag_value="delayed", help="only messages due later")
@click.option("--leased", "which", flag_value="leased", help="only leased messages")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 1000), help="at most this many")
def peek(dsn: str | None, schema: str, as_json: bool, queue: str, which: str | None, limit: int) -> None:
    """Messages of QUEUE, earliest due first, without locking or changing them.

    A keyless message's key is empty (null with --json); the id, last, is
    what `pgdq cancel QUEUE --id ID` takes."""
    with _known_queue(dsn, schema, queue) as q:
        found = q.peek(which, limit)
    rows = [
        {
            "key": m.key,
            "payload": m.raw_payload,
            "state": m.state,
            "scheduled_at": m.scheduled_at,
            "due_at": m.due_at,
            "attempts": m.attempts,
            "leased": m.leased,
            "lease_until": m.lease_until,
            "last_error": m.last_error,
            "id": m.id,
        }
        for m in found
    ]
    _emit(
        rows,
        as_json,
        lambda: _table(
            f"{queue}: {len(rows)} {which + ' ' if which else ''}messages",
            ["key", "due_at", "attempts", "leased", "last_error", "payload", "id"],
            [
                [
                    m.key,
                    m.due_at,
                    m.attempts,
                    "leased" if m.leased else "",
                    _last_line(m.last_error),
                    json.dumps(m.raw_payload),
                    m.id,
                ]
                for m in found
            ],
        ),
    )


@click.command()
@common_options
@click.argument("queue")
@click.argument("key", required=False)
@click.option("--id", "message_id", type=int, default=None, help="the message of this id instead (keyless ones too)")
def cancel(dsn: str | None, schema: str, as_json: bool, queue: str, key: str | None, message_id: int | None) -> None:
    """Delete the message of KEY (or --id ID), leased or not; exit 4 if there was none."""
    _key_or_id(key, message_id, "KEY")
    with _queue(dsn, schema, queue) as q:
        done = q.cancel(key) if key is not None else q.cancel_id(message_id or 0)
    what = key if key is not None else f"of id {message_id}"
    _emit_done(done, "cancelled", f"no message {what} in {queue}", as_json)


def _key_or_id(key: str | None, message_id: int | None, key_name: str, required: bool = True) -> None:
    """Exit 2 unless exactly one of a key and --id is given (at most one when not required)."""
    if key is not None and message_id is not None:
        raise click.UsageError(f"give {key_name} or --id, not both")
    if required and key is None and message_id is None:
        raise click.UsageError(f"give {key_name}, or --id for a message by its id (keyless ones have only an id)")


@click.command()
@common_options
@click.argument("queue")
@click.option("--yes", is_flag=True, help="do not ask")
def purge(dsn: str | None, schema: str, as_json: bool, queue: str, yes: bool) -> None:
    """Delete every message of QUEUE (leased ones too; its dead letters stay)."""
    with _known_queue(dsn, schema, queue) as q:
        if not yes:
            click.confirm(f"Delete every message of {queue}?", abort=True, err=True)
        count = q.purge()
    _emit({"purged": count}, as_json, lambda: click.echo(f"{count} deleted"))


@click.command()
@common_options
@click.argument("queue", required=False)
def stats(dsn: str | None, schema: str, as_json: bool, queue: str | None) -> None:
    """Ready, delayed and leased counts per queue, and which are paused (of QUEUE, with its channels)."""
    channels = []
    if queue is not None:
        with _known_queue(dsn, schema, queue) as q:
            found, channels = [q.stats()], q.channels()
    else:
        with _database(dsn, schema) as conn:
            found = _with_idle_paused(Client(conn, schema=schema).stats(), queue_settings(conn, schema))
    now = datetime.now(UTC)

    def age(at: datetime | None) -> str:
        return "" if at is None else f"{(now - at).total_seconds():,.1f} s"

    def human() -> None:
        _table(
            "pgdq queues",
            ["queue", "ready", "delayed", "leased", "oldest ready", "next due", "paused"],
            [
                [
                    r.queue,
                    r.ready,
                    r.delayed,
                    r.leased,
                    age(r.oldest_ready_at),
                    r.next_due_at,
                    "paused" if r.paused else "",
                ]
                for r in found
            ],
        )
        if channels:
            _channel_table(queue or "", channels)

    _emit(found, as_json, human)  # --json keeps its shape: `pgdq channels QUEUE --json` has the channels


def _with_idle_paused(found: list[QueueStats], settings: dict[str, QueueSettings] | None) -> list[QueueStats]:
    """Every queue's stats with the paused queues that have no messages (dq_stats lists only queues with some)."""
    listed = {r.queue for r in found}
    idle = [QueueStats(name, 0, 0, 0, None, None, True) for name, s in (settings or {}).items() if s.paused]
    return sorted(found + [r for r in idle if r.queue not in listed], key=lambda r: r.queue)


# --- pausing --------------------------------------------------------------------------


new_option = click.option(
    "--new", is_flag=True, help="QUEUE may be one pgdq does not know yet (no messages, no settings)"
)


@click.command()
@common_options
@click.argument("queue")
@new_option
def pause(dsn: str | None, schema: str, as_json: bool, queue: str, new: bool) -> None:
    """Pause QUEUE: polls lease none of its messages until `pgdq resume`
    (offers, acks and the rest go on); says whether it was running. A
    queue pgdq does not know is an error (exit 4) unless --new."""
    with _known_queue(dsn, schema, queue, new) as q:
        changed = q.pause()
    _emit_state(queue, True, changed, "paused", "already paused", as_json)


@click.command()
@common_options
@click.argument("queue")
def resume(dsn: str | None, schema: str, as_json: bool, queue: str) -> None:
    """Resume QUEUE, waking its waiting consumers; says whether it was paused."""
    with _known_queue(dsn, schema, queue) as q:
        changed = q.resume()
    _emit_state(queue, False, changed, "resumed", "not paused", as_json)


def _emit_state(queue: str, paused: bool, changed: bool, done: str, already: str, as_json: bool) -> None:
    """Print a queue's paused state and whether the command changed it (exit 0 either way)."""
    _emit(
        {"queue": queue, "paused": paused, "changed": changed},
        as_json,
        lambda: click.echo(f"{queue}: {done if changed else already}"),
    )


# --- history ----------------------------------------------------------------------------


@click.command()
@common_options
@click.argument("queue")
@click.argument("keep", metavar="DURATION|off")
@new_option
def retain(dsn: str | None, schema: str, as_json: bool, queue: str, keep: str, new: bool) -> None:
    """Keep a record of each message that leaves QUEUE from now on, for
    DURATION (90s, 30m, 12h, 7d, 2w; at most 3650 days), or stop with off.

    Records already kept age out by the last DURATION set; `pgdq history`
    lists them. A queue pgdq does not know is an error (exit 4) unless --new."""
    off = keep.strip().lower() == "off"
    period = None if off else parse_span(keep)
    if period is None and not off:
        raise click.BadParameter(
            f"{keep!r} is neither a duration (a number and s, m, h, d or w: 90s, 7d) nor off",
            param_hint="DURATION|off",
        )
    with _known_queue(dsn, schema, queue, new) as q:
        q.retain(period)
    said = f"records kept for {keep.strip()}" if period is not None else "history off (records kept age out)"
    _emit({"queue": queue, "keep": period}, as_json, lambda: click.echo(f"{queue}: {said}"))


@click.command()
@common_options
@click.argument("queue")
@click.argument("key", required=False)
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 1000), help="at most this many")
def history(dsn: str | None, schema: str, as_json: bool, queue: str, key: str | None, limit: int) -> None:
    """Messages that left QUEUE (KEY's only, if given), newest first, with
    their outcome: acked, dead, cancelled or purged.

    Only while `pgdq retain` keeps them (with history off, it says so on
    stderr); a keyless message's key is empty (null with --json), its id last."""
    with _known_queue_on(dsn, schema, queue) as (conn, q):
        found, settings = q.history(key, limit), queue_settings(conn, schema, queue)
    off = settings is not None and (queue not in settings or settings[queue].retain is None)
    if off:
        click.echo(f"{queue}: history is off (`pgdq retain {queue} 7d` turns it on; records kept age out)", err=True)
    _emit(
        found,
        as_json,
        lambda: _table(
            f"{queue}: {_count(len(found), 'record')}{' (history is off)' if off else ''}",
            ["finished_at", "outcome", "key", "attempts", "last_error", "payload", "id"],
            [
                [r.finished_at, r.outcome, r.key, r.attempts, _last_line(r.last_error), json.dumps(r.raw_payload), r.id]
                for r in found
            ],
        ),
    )


# --- channels ------------------------------------------------------------------------


def _channel_table(queue: str, found: list[ChannelInfo]) -> None:
    """A queue's channels: limits, counts, last lease."""
    _table(
        f"{queue}: {_count(len(found), 'channel')}",
        ["channel", "max_concurrency", "min_interval", "ready", "delayed", "leased", "last leased"],
        [[c.channel, c.max_concurrency, c.min_interval, c.ready, c.delayed, c.leased, c.last_leased_at] for c in found],
    )


@click.command()
@common_options
@click.argument("queue")
def channels(dsn: str | None, schema: str, as_json: bool, queue: str) -> None:
    """QUEUE's channels with messages or limits: limits, ready, delayed,
    leased, last lease (`pgdq channel set|remove` changes the limits)."""
    with _known_queue(dsn, schema, queue) as q:
        found = q.channels()
    _emit(found, as_json, lambda: _channel_table(queue, found))


@click.group()
def channel() -> None:
    """Set or remove a channel's limits. A poll shares its queue fairly
    between channels and holds each to its limits (`pgdq channels QUEUE`
    lists them)."""


@channel.command("set")
@common_options
@click.argument("queue")
@click.argument("channel")
@click.option("--max-concurrency", type=click.IntRange(min=1), help="at most this many leased at once")
@click.option("--min-interval", type=click.FloatRange(min=0), help="seconds between two of its leases")
def channels_set(
    dsn: str | None,
    schema: str,
    as_json: bool,
    queue: str,
    channel: str,
    max_concurrency: int | None,
    min_interval: float | None,
) -> None:
    """Set the limits of CHANNEL of QUEUE, replacing earlier ones (no option: none)."""
    with _queue(dsn, schema, queue) as q:
        q.set_channel(channel, max_concurrency=max_concurrency, min_interval=min_interval)
    _emit(
        {"queue": queue, "channel": channel, "max_concurrency": max_concurrency, "min_interval": min_interval},
        as_json,
        lambda: click.echo(f"{queue}/{channel}: max_concurrency {max_concurrency}, min_interval {min_interval} s"),
    )


def _remove_command(
    group: click.Group, what: str, summary: str, remove: Callable[[Queue, str], bool], missing: str
) -> None:
    """Add `remove QUEUE WHAT` to group (its help: summary): remove(queue,
    name), printing "removed", or when there was none missing (formatted
    with name and queue) and exit 4."""

    @group.command("remove", help=summary)
    @common_options
    @click.argument("queue")
    @click.argument("name", metavar=what.upper())
    def remove_one(dsn: str | None, schema: str, as_json: bool, queue: str, name: str) -> None:
        with _queue(dsn, schema, queue) as q:
            done = remove(q, name)
        _emit_done(done, "removed", missing.format(name=name, queue=queue), as_json)


_remove_command(
    channel,
    "channel",
    "Drop the limits of CHANNEL of QUEUE (its messages stay); exit 4 if it had none.",
    Queue.remove_channel,
    "channel {name} of {queue} has no limits",
)


# --- dead letters ----------------------------------------------------------------------


@click.group("dead-letters")
def dead_letters() -> None:
    """List, redrive or purge a queue's dead letters."""


@dead_letters.command("list")
@common_options
@click.argument("queue")
@click.option("--max", "max_count", default=100, show_default=True, type=click.IntRange(min=1))
def dead_list(dsn: str | None, schema: str, as_json: bool, queue: str, max_count: int) -> None:
    """The oldest failures first; a keyless one's key is empty (null with
    --json), and its id (last) is what redrive and purge take with --id."""
    with _known_queue(dsn, schema, queue) as q:
        dead = q.dead_letters(max_count)
    _emit(
        dead,
        as_json,
        lambda: _table(
            f"{queue}: {_count(len(dead), 'dead letter')}",
            ["key", "attempts", "failed_at", "error", "id"],
            [[d.key, d.attempts, d.failed_at, _last_line(d.error), d.id] for d in dead],
        ),
    )


@dead_letters.command("redrive")
@common_options
@click.argument("queue")
@click.option("--key", default=None, help="only this key")
@click.option("--id", "dead_id", type=int, default=None, help="only the dead letter of this id (keyless ones too)")
@click.option("--at", "at_text", help="due time, ISO 8601 with a zone (default: now)")
def dead_redrive(
    dsn: str | None, schema: str, as_json: bool, queue: str, key: str | None, dead_id: int | None, at_text: str | None
) -> None:
    """Offer the dead letters again (fresh: no attempts, no state); with
    --id, that one alone, and --json says the id of the message it became."""
    _key_or_id(key, dead_id, "--key", required=False)
    at = _when(at_text, None)
    with _known_queue(dsn, schema, queue) as q:
        if dead_id is None:
            count = q.redrive(key, at)
            _emit({"redriven": count}, as_json, lambda: click.echo(f"{count} re-offered"))
            return
        new_id = q.redrive_id(dead_id, at)
    count = 0 if new_id is None else 1
    _emit({"redriven": count, "id": new_id}, as_json, lambda: click.echo(f"{count} re-offered"))


@dead_letters.command("purge")
@common_options
@click.argument("queue")
@click.option("--key", default=None, help="only this key")
@click.option("--id", "dead_id", type=int, default=None, help="only the dead letter of this id (keyless ones too)")
@click.option("--yes", is_flag=True, help="do not ask")
def dead_purge(
    dsn: str | None, schema: str, as_json: bool, queue: str, key: str | None, dead_id: int | None, yes: bool
) -> None:
    """Delete the dead letters (--key's or --id's only, if given)."""
    _key_or_id(key, dead_id, "--key", required=False)
    with _known_queue(dsn, schema, queue) as q:
        if not yes:
            what = f"the dead letter {key}" if key else "every dead letter"
            what = what if dead_id is None else f"the dead letter of id {dead_id}"
            click.confirm(f"Delete {what} of {queue}?", abort=True, err=True)
        count = q.purge_dead_letters(key) if dead_id is None else q.purge_dead_letter_id(dead_id)
    _emit({"purged": count}, as_json, lambda: click.echo(f"{count} deleted"))


# --- schedules kept by the database ------------------------------------------------------


@click.group()
def schedules() -> None:
    """List, set or remove the schedules the database keeps (polls of their
    queue turn occurrences into messages; no scheduler process needed)."""


@schedules.command("list")
@common_options
@click.argument("queue", required=False)
def schedules_list(dsn: str | None, schema: str, as_json: bool, queue: str | None) -> None:
    """Every schedule (or QUEUE's: exit 4 for a queue pgdq does not know),
    with its next occurrence and last error."""
    if queue is None:
        with _client(dsn, schema) as client:
            found = client.schedules()
    else:
        with _known_queue(dsn, schema, queue) as q:
            found = q.schedules()
    _emit(
        found,
        as_json,
        lambda: _table(
            "pgdq schedules",
            ["queue", "name", "expression", "timezone", "next_at", "failures", "last_error"],
            [[s.queue, s.name, s.expression, s.timezone, s.next_at, s.failures or "", s.last_error] for s in found],
        ),
    )


@schedules.command("set")
@common_options
@click.argument("queue")
@click.argument("name")
@click.argument("expression")
@click.option("--timezone", default="UTC", show_default=True, help="IANA zone the expression is read in")
@click.option("--payload", default="null", show_default=True, help="each occurrence's payload, as JSON")
@click.option("--max-missed", default=1, show_default=True, type=int, help="occurrences caught up after a pause")
def schedules_set(
    dsn: str | None,
    schema: str,
    as_json: bool,
    queue: str,
    name: str,
    expression: str,
    timezone: str,
    payload: str,
    max_missed: int,
) -> None:
    """Create or replace the schedule NAME of QUEUE; prints its next occurrence.

    EXPRESSION: five cron fields (minute, hour, day of month, month, day of
    week: '0 9 * * mon-fri'), or six with a leading seconds field
    ('30 0 9 * * mon-fri')."""
    value = _json_argument(payload, "--payload")
    with _queue(dsn, schema, queue) as q:
        next_at = q.schedule(name, expression, timezone, value, max_missed=max_missed)
    _emit(
        {"queue": queue, "name": name, "next_at": next_at},
        as_json,
        lambda: click.echo(f"{queue}/{name}: next at {_cell(next_at)}"),
    )


_remove_command(
    schedules,
    "schedule",
    "Remove the schedule SCHEDULE of QUEUE and its pending occurrences; exit 4 if there was none.",
    Queue.unschedule,
    "no schedule {name} in {queue}",
)
