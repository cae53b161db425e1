"""The `pgdq` command: install / upgrade / uninstall / version; offer, poll, ack, stats
and dead-letters for operators and scripts (--json); worker.

Exit codes: 0 done, 1 an error the message explains (pgdq's or the
server's, or no connection), 2 bad usage (a malformed --dsn or an unusable
--schema included), 3 pgdq not installed in the schema (any command that
needs it), 4 some tokens were stale (ack).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, is_dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import click
import psycopg

from . import __version__
from . import _statements as st
from ._script import check_schema
from ._sync_queue import Queue
from .errors import PgdqError
from .install import ServerWarning, installed_version
from .install import install as install_sql
from .install import uninstall as uninstall_sql
from .install import upgrade as upgrade_sql
from .model import QueueStats


class BadInput(click.ClickException):
    """A malformed --dsn or an unusable --schema: one line, exit 2 (bad usage)."""

    exit_code = 2


class NotInstalled(click.ClickException):
    """pgdq is not installed where the command looks: one line, exit 3."""

    exit_code = 3


class CannotConnect(click.ClickException):
    """The server could not be reached: one line, exit 1."""


def _reason(error: Exception) -> str:
    """An error in one line: a server error's primary message, else its text."""
    primary = error.diag.message_primary if isinstance(error, psycopg.Error) else None
    return primary or " ".join(str(error).split())


def _connect(dsn: str | None) -> psycopg.Connection[tuple[object, ...]]:
    """Connect to --dsn, else DATABASE_URL, else the standard PG* variables;
    exit 2 when libpq cannot parse the connection string."""
    conninfo = dsn or os.environ.get("DATABASE_URL", "")
    try:
        return psycopg.connect(conninfo, autocommit=True)
    except psycopg.ProgrammingError as e:
        raise BadInput(f"invalid connection string: {_reason(e)}") from e
    except psycopg.OperationalError as e:
        raise CannotConnect(f"cannot connect: {_reason(e)}") from e


def _require_pgdq(conn: psycopg.Connection[Any], schema: str | None) -> None:
    """Exit 3 unless pgdq is installed in schema (None: a schema on the search_path)."""
    found = conn.execute(
        "SELECT FROM pg_catalog.pg_proc AS p JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace"
        " WHERE p.proname = 'dq_version' AND CASE WHEN %(schema)s::text IS NULL"
        " THEN n.nspname = ANY (pg_catalog.current_schemas(false)) ELSE n.nspname = %(schema)s::text END",
        {"schema": schema},
    ).fetchone()
    if found is None:
        where = f"schema {schema}" if schema else "any schema on the search_path"
        raise NotInstalled(f"pgdq is not installed in {where}")


def _valid_schema(ctx: click.Context, param: click.Parameter, schema: str) -> str:
    """--schema, if pgdq's scripts can embed it; else exit 2."""
    try:
        return check_schema(schema)
    except ValueError as e:
        raise BadInput(f"invalid --schema: {e}") from e


@contextmanager
def _server_warnings_shown() -> Iterator[None]:
    """Print the warnings raised inside the block (the server's, as ServerWarning) on stderr."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ServerWarning)
        yield
    for warning in caught:
        click.echo(f"WARNING: {warning.message}", err=True)


dsn_option = click.option("--dsn", envvar="PGDQ_DSN", help="conninfo or URL; default DATABASE_URL or PG* variables")
schema_option = click.option(
    "--schema", default="public", show_default=True, callback=_valid_schema, help="schema pgdq lives in"
)


@click.group()
@click.version_option(__version__, prog_name="pgdq")
def main() -> None:
    """pgdq: a delayed-message queue inside PostgreSQL."""


@main.command()
@dsn_option
@schema_option
@click.option("--if-not-exists", is_flag=True, help="succeed quietly when already installed")
def install(dsn: str | None, schema: str, if_not_exists: bool) -> None:
    """Install pgdq's SQL (plain install, no extension needed)."""
    with _connect(dsn) as conn:
        try:
            with _server_warnings_shown():
                done = install_sql(conn, schema, if_not_exists=if_not_exists)
        except (PgdqError, psycopg.Error) as e:
            raise click.ClickException(f"install failed, nothing changed: {_reason(e)}") from e
        version = installed_version(conn, schema)
    click.echo(f"pgdq {version} {'installed in' if done else 'already installed in'} schema {schema}")


@main.command()
@dsn_option
@schema_option
def upgrade(dsn: str | None, schema: str) -> None:
    """Upgrade pgdq in place to this client's version (one transaction; messages, leases and schedules kept)."""
    with _connect(dsn) as conn:
        _require_pgdq(conn, schema)
        try:
            with _server_warnings_shown():
                steps = upgrade_sql(conn, schema)
        except (PgdqError, psycopg.Error) as e:
            raise click.ClickException(f"upgrade failed, nothing changed: {_reason(e)}") from e
    if not steps:
        click.echo(f"pgdq {__version__} is already current in schema {schema}; nothing to do")
    else:
        path = " -> ".join([steps[0][0], *(new for _, new in steps)])
        click.echo(f"pgdq upgraded in schema {schema}: {path}")


@main.command()
@dsn_option
@schema_option
@click.option("--yes", is_flag=True, help="do not ask; this deletes every message")
def uninstall(dsn: str | None, schema: str, yes: bool) -> None:
    """Drop pgdq and every message from the schema (a plain install; other objects there stay)."""
    with _connect(dsn) as conn:
        _require_pgdq(conn, schema)
        if not yes:
            click.confirm(f"Drop pgdq and all its messages from schema {schema}?", abort=True)
        try:
            uninstall_sql(conn, schema)
        except (PgdqError, psycopg.Error) as e:
            raise click.ClickException(f"uninstall failed, nothing changed: {_reason(e)}") from e
    click.echo(f"pgdq uninstalled from schema {schema}")


@main.command()
@dsn_option
@schema_option
def version(dsn: str | None, schema: str) -> None:
    """Print the client version and the version installed in the database."""
    with _connect(dsn) as conn:
        installed = installed_version(conn, schema)
    click.echo(f"client {__version__}; database {installed or 'not installed'} (schema {schema})")
    if installed is None:
        sys.exit(3)


def _import_handler(spec: str) -> Callable[..., Any]:
    """The function named by module:function (the current directory is importable)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise click.BadParameter("expected module:function, e.g. myapp.tasks:send_email", param_hint="--handler")
    sys.path.insert(0, os.getcwd())
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise click.BadParameter(f"cannot load {spec}: {e}", param_hint="--handler") from e
    if not callable(fn):
        raise click.BadParameter(f"{spec} is not callable", param_hint="--handler")
    return fn  # type: ignore[no-any-return]


@main.command()
@dsn_option
@click.option("--schema", default=None, help="schema pgdq lives in (default: the search_path)")
@click.option("--queue", "queues", multiple=True, required=True, help="a queue to consume; repeat for several")
@click.option("--handler", "handler_spec", required=True, help="module:function called with each delivery")
@click.option("--concurrency", default=8, show_default=True, type=click.IntRange(min=1), help="handlers at once")
@click.option("--lease", default=60.0, show_default=True, type=click.FloatRange(min=0.1), help="lease seconds")
@click.option("--max-attempts", default=10, show_default=True, type=click.IntRange(min=1), help="then dead-letter")
@click.option("--grace", default=30.0, show_default=True, type=click.FloatRange(min=0), help="seconds on SIGTERM")
@click.option(
    "--timeout",
    default=None,
    type=click.FloatRange(min=0, min_open=True),
    help="seconds a handler may run (default: no limit)",
)
@click.option("--log-level", default="INFO", show_default=True, type=click.Choice(["DEBUG", "INFO", "WARNING"]))
def worker(
    dsn: str | None,
    schema: str | None,
    queues: tuple[str, ...],
    handler_spec: str,
    concurrency: int,
    lease: float,
    max_attempts: int,
    grace: float,
    timeout: float | None,
    log_level: str,
) -> None:
    """Consume queues with a handler until SIGTERM / SIGINT (exit 0 when clean)."""
    from .worker import Worker

    fn = _import_handler(handler_spec)
    _check_worker_database(dsn, schema)
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    runner = Worker(
        {queue: fn for queue in queues},
        dsn=dsn or os.environ.get("DATABASE_URL", ""),
        schema=schema,
        concurrency=concurrency,
        lease=timedelta(seconds=lease),
        max_attempts=max_attempts,
        grace=timedelta(seconds=grace),
        timeout=None if timeout is None else timedelta(seconds=timeout),
    )
    try:
        code = runner.run()
    except (PgdqError, psycopg.Error) as e:  # not a lost connection: those are retried
        raise click.ClickException(f"the worker stopped: {e}") from e
    if any(t.name.startswith("pgdq-handler") and t.is_alive() for t in threading.enumerate()):
        # a sync handler still running past the grace period was handed back;
        # do not wait for its thread
        logging.shutdown()
        os._exit(code)
    sys.exit(code)


def _check_worker_database(dsn: str | None, schema: str | None) -> None:
    """Exit 2 on a malformed --dsn, 3 when pgdq is not installed; a server
    that cannot be reached yet is the worker's to wait for."""
    try:
        with _connect(dsn) as conn:
            _require_pgdq(conn, schema)
    except CannotConnect:
        pass


# --- operating on queues ----------------------------------------------------

json_option = click.option("--json", "as_json", is_flag=True, help="machine-readable output (JSON)")
queue_schema_option = click.option("--schema", default=None, help="schema pgdq lives in (default: the search_path)")


@contextmanager
def _queue(dsn: str | None, name: str, schema: str | None) -> Iterator[Queue]:
    """A Queue on a fresh autocommit connection (exit 3 without pgdq); pgdq errors become clear CLI errors."""
    with _connect(dsn) as conn:
        _require_pgdq(conn, schema)
        try:
            yield Queue(name, conn, schema=schema)
        except PgdqError as e:
            raise click.ClickException(str(e)) from e
        except psycopg.Error as e:
            raise click.ClickException(f"the server refused: {e}") from e


def _emit(data: Any, as_json: bool, table: Callable[[], None]) -> None:
    """Print data as JSON, or call table() for people."""
    if as_json:
        click.echo(json.dumps(_plain(data), default=str))
    else:
        table()


def _plain(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _when(text: str | None, seconds: float | None) -> datetime | None:
    """--at (ISO 8601, a zone required) or --in (seconds from now)."""
    if text is not None and seconds is not None:
        raise click.UsageError("give --at or --in, not both")
    if seconds is not None:
        return datetime.now(UTC) + timedelta(seconds=seconds)
    if text is None:
        return None
    try:
        at = datetime.fromisoformat(text)
    except ValueError as e:
        raise click.BadParameter(f"not an ISO 8601 time: {text}", param_hint="--at") from e
    if at.tzinfo is None:
        raise click.BadParameter(f"{text} has no time zone (add Z or +02:00)", param_hint="--at")
    return at


def _last_line(text: str | None) -> str:
    """The last line of an error (a traceback's is the exception itself)."""
    lines = (text or "").strip().splitlines()
    return lines[-1] if lines else ""


def _table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*("" if v is None else str(v) for v in row))
    Console().print(table)


@main.command()
@dsn_option
@queue_schema_option
@json_option
@click.argument("queue")
@click.argument("key", required=False)
@click.argument("payload", required=False)
@click.option("--at", "at_text", help="due time, ISO 8601 with a zone (default: now)")
@click.option("--in", "in_seconds", type=float, help="due in this many seconds")
@click.option("--no-update", is_flag=True, help="leave an existing message of the key as it is")
@click.option("--jsonl", is_flag=True, help='read {"key", "payload"[, "scheduled_at"]} lines from stdin')
@click.option("--batch", default=1000, show_default=True, type=click.IntRange(1, 100_000), help="with --jsonl")
def offer(
    dsn: str | None,
    schema: str | None,
    as_json: bool,
    queue: str,
    key: str | None,
    payload: str | None,
    at_text: str | None,
    in_seconds: float | None,
    no_update: bool,
    jsonl: bool,
    batch: int,
) -> None:
    """Offer one message (KEY PAYLOAD, PAYLOAD as JSON), or many with --jsonl."""
    if jsonl:
        if key is not None:
            raise click.UsageError("--jsonl reads the messages from stdin: give no KEY or PAYLOAD")
        _offer_lines(dsn, schema, as_json, queue, not no_update, batch)
        return
    if key is None or payload is None:
        raise click.UsageError("give KEY and PAYLOAD, or --jsonl")
    try:
        value = json.loads(payload)
    except json.JSONDecodeError as e:
        raise click.BadParameter(f"not JSON: {e}", param_hint="PAYLOAD") from e
    with _queue(dsn, queue, schema) as q:
        outcome = q.offer(key, value, _when(at_text, in_seconds), can_update=not no_update)
    _emit({"key": key, "outcome": outcome.value}, as_json, lambda: click.echo(outcome.value))


def _offer_lines(dsn: str | None, schema: str | None, as_json: bool, queue: str, can_update: bool, batch: int) -> None:
    """offer --jsonl: batches of offer_many, a progress line on stderr, counts at the end."""
    from rich.progress import Progress

    counts = {"created": 0, "updated": 0, "ignored": 0}
    with _queue(dsn, queue, schema) as q, Progress(transient=True, console=_stderr()) as progress:
        task = progress.add_task(f"offering to {queue}", total=None)
        chunk: list[tuple[str, Any, datetime | None]] = []
        for number, line in enumerate(sys.stdin, 1):
            if line.strip():
                chunk.append(_message(line, number))
            if len(chunk) >= batch:
                _offer_chunk(q, chunk, can_update, counts)
                progress.update(task, advance=len(chunk))
                chunk = []
        if chunk:
            _offer_chunk(q, chunk, can_update, counts)
            progress.update(task, advance=len(chunk))
    _emit(counts, as_json, lambda: click.echo(", ".join(f"{n} {k}" for k, n in counts.items())))


def _message(line: str, number: int) -> tuple[str, Any, datetime | None]:
    try:
        item = json.loads(line)
        key, payload = item["key"], item["payload"]
        at = item.get("scheduled_at")
        return key, payload, None if at is None else _when(at, None)
    except (json.JSONDecodeError, KeyError, TypeError, click.BadParameter) as e:
        raise click.ClickException(f'line {number}: expected {{"key", "payload"[, "scheduled_at"]}}: {e}') from e


def _offer_chunk(
    q: Queue, chunk: list[tuple[str, Any, datetime | None]], can_update: bool, counts: dict[str, int]
) -> None:
    for result in q.offer_many(chunk, can_update=can_update):
        counts[result.outcome.value] += 1


def _stderr() -> Any:
    from rich.console import Console

    return Console(stderr=True)


@main.command()
@dsn_option
@queue_schema_option
@json_option
@click.argument("queue")
@click.option("--max", "max_count", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--lease", default=60.0, show_default=True, type=click.FloatRange(min=0.001), help="seconds")
def poll(dsn: str | None, schema: str | None, as_json: bool, queue: str, max_count: int, lease: float) -> None:
    """Lease due messages (for debugging); prints their lock tokens."""
    with _queue(dsn, queue, schema) as q:
        got = q.poll_many(max_count, timedelta(seconds=lease))
    rows = [
        {
            "key": d.key,
            "attempts": d.attempts,
            "lock_token": str(d.lock_token),
            "lease_until": d.lease_until,
            "payload": d.payload,
        }
        for d in got
    ]
    _emit(
        rows,
        as_json,
        lambda: _table(
            f"{queue}: {len(rows)} leased",
            ["key", "attempts", "lock_token", "lease_until", "payload"],
            [[r["key"], r["attempts"], r["lock_token"], r["lease_until"], json.dumps(r["payload"])] for r in rows],
        ),
    )


@main.command()
@dsn_option
@queue_schema_option
@json_option
@click.argument("tokens", nargs=-1, required=True)
def ack(dsn: str | None, schema: str | None, as_json: bool, tokens: tuple[str, ...]) -> None:
    """Ack lock tokens; exit 4 if any was stale."""
    try:
        parsed = [UUID(t) for t in tokens]
    except ValueError as e:
        raise click.BadParameter(f"not a lock token: {e}", param_hint="TOKENS") from e
    with _queue(dsn, "-", schema) as q:
        done = q.ack_many(parsed)
    _emit({"acked": done, "stale": len(parsed) - done}, as_json, lambda: click.echo(f"{done} of {len(parsed)} acked"))
    if done < len(parsed):
        sys.exit(4)


@main.command()
@dsn_option
@queue_schema_option
@json_option
@click.argument("queue", required=False)
def stats(dsn: str | None, schema: str | None, as_json: bool, queue: str | None) -> None:
    """Ready, delayed and leased counts per queue (or of QUEUE)."""
    with _connect(dsn) as conn:
        _require_pgdq(conn, schema)
        try:
            rows: list[tuple[Any, ...]] = conn.execute(st.statements(schema)["stats"], (queue,)).fetchall()
        except psycopg.Error as e:
            raise click.ClickException(f"the server refused: {e}") from e
    found = [QueueStats(*r) for r in rows]
    now = datetime.now(UTC)

    def age(at: datetime | None) -> str:
        return "" if at is None else f"{(now - at).total_seconds():,.1f} s"

    _emit(
        found,
        as_json,
        lambda: _table(
            "pgdq queues",
            ["queue", "ready", "delayed", "leased", "oldest ready", "next due"],
            [[r.queue, r.ready, r.delayed, r.leased, age(r.oldest_ready_at), r.next_due_at] for r in found],
        ),
    )


@main.group("dead-letters")
def dead_letters() -> None:
    """List, redrive or purge a queue's dead letters."""


@dead_letters.command("list")
@dsn_option
@queue_schema_option
@json_option
@click.argument("queue")
@click.option("--max", "max_count", default=100, show_default=True, type=click.IntRange(min=1))
def dead_list(dsn: str | None, schema: str | None, as_json: bool, queue: str, max_count: int) -> None:
    """The oldest failures first."""
    with _queue(dsn, queue, schema) as q:
        dead = q.dead_letters(max_count)
    _emit(
        dead,
        as_json,
        lambda: _table(
            f"{queue}: {len(dead)} dead letters",
            ["key", "attempts", "failed_at", "error"],
            [[d.key, d.attempts, d.failed_at, _last_line(d.error)] for d in dead],
        ),
    )


@dead_letters.command("redrive")
@dsn_option
@queue_schema_option
@json_option
@click.argument("queue")
@click.option("--key", default=None, help="only this key")
@click.option("--at", "at_text", help="due time, ISO 8601 with a zone (default: now)")
def dead_redrive(
    dsn: str | None, schema: str | None, as_json: bool, queue: str, key: str | None, at_text: str | None
) -> None:
    """Offer the dead letters again (fresh: no attempts, no state)."""
    with _queue(dsn, queue, schema) as q:
        count = q.redrive(key, _when(at_text, None))
    _emit({"redriven": count}, as_json, lambda: click.echo(f"{count} re-offered"))


@dead_letters.command("purge")
@dsn_option
@queue_schema_option
@json_option
@click.argument("queue")
@click.option("--key", default=None, help="only this key")
@click.option("--yes", is_flag=True, help="do not ask")
def dead_purge(dsn: str | None, schema: str | None, as_json: bool, queue: str, key: str | None, yes: bool) -> None:
    """Delete the dead letters."""
    if not yes:
        click.confirm(f"Delete {'the dead letter ' + key if key else 'every dead letter'} of {queue}?", abort=True)
    with _queue(dsn, queue, schema) as q:
        count = q.purge_dead_letters(key)
    _emit({"purged": count}, as_json, lambda: click.echo(f"{count} deleted"))
