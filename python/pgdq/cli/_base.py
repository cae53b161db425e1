"""What every `pgdq` command shares: errors with their exit codes, connecting,
the common options and printing (tables on a terminal, tab-separated lines
into a pipe, JSON with --json)."""

from __future__ import annotations

import getpass
import json
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, is_dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import click
import psycopg
from psycopg import sql

from .._script import check_schema
from .._sync_queue import Client, Queue
from ..errors import InvalidArgument, PgdqError
from ..install import ServerWarning, installed_version
from ..model import DecodedPayload


class BadInput(click.ClickException):
    """Bad input the usage checks could not see (a malformed --dsn, an unusable
    --schema, an argument pgdq refuses): one line, exit 2 (bad usage)."""

    exit_code = 2


class NotInstalled(click.ClickException):
    """pgdq is not installed where the command looks: one line, exit 3."""

    exit_code = 3


class NothingThere(click.ClickException):
    """Nothing to act on (stale tokens, no such key or schedule): exit 4."""

    exit_code = 4


class CannotConnect(click.ClickException):
    """The server could not be reached: one line, exit 1."""


def _reason(error: Exception) -> str:
    """An error in one line: a server error's primary message, else its text."""
    primary = error.diag.message_primary if isinstance(error, psycopg.Error) else None
    return primary or " ".join(str(error).split())


def _no_dsn_given(dsn: str | None) -> bool:
    """True when nothing names a server: no --dsn / PGDQ_DSN, no DATABASE_URL
    and no PG* variable (libpq then tries its defaults: the local socket,
    a database named after the OS user)."""
    return not dsn and not os.environ.get("DATABASE_URL") and not any(re.fullmatch(r"PG[A-Z]+", v) for v in os.environ)


def _defaults_note(where: str) -> str:
    """What a failure adds when no DSN was given: the server tried, and how to name one."""
    return f" (no DSN given, so libpq's defaults: {where}; set --dsn, PGDQ_DSN or DATABASE_URL)"


def _libpq_defaults() -> str:
    """The server and database libpq tries without a DSN, in words."""
    options = {o.keyword.decode(): (o.compiled or b"").decode() for o in psycopg.pq.Conninfo.get_defaults()}
    dbname = options.get("dbname") or options.get("user") or getpass.getuser()
    return f"database {dbname} on {options.get('host') or '/var/run/postgresql'} port {options.get('port') or 5432}"


def _connect(dsn: str | None) -> psycopg.Connection[tuple[object, ...]]:
    """Connect to --dsn, else DATABASE_URL, else the standard PG* variables;
    exit 2 when libpq cannot parse the connection string. A command runs few
    statements: it prepares none, so it works through PgBouncer in any mode."""
    conninfo = dsn or os.environ.get("DATABASE_URL", "")
    try:
        return psycopg.connect(conninfo, autocommit=True, prepare_threshold=None)
    except psycopg.ProgrammingError as e:
        raise BadInput(f"invalid connection string: {_reason(e)}") from e
    except psycopg.OperationalError as e:
        note = _defaults_note(_libpq_defaults()) if _no_dsn_given(dsn) else ""
        raise CannotConnect(f"cannot connect: {_reason(e)}{note}") from e


def _require_pgdq(conn: psycopg.Connection[Any], schema: str, dsn: str | None) -> None:
    """Exit 3 unless pgdq is installed in schema; without a DSN, the message
    names the database and server libpq's defaults led to."""
    if installed_version(conn, schema) is None:
        raise NotInstalled(f"pgdq is not installed in schema {schema}{_reached_note(conn, dsn)}")


def _reached_note(conn: psycopg.Connection[Any], dsn: str | None) -> str:
    """Without a DSN, the database and server conn reached (see _defaults_note); else nothing."""
    if not _no_dsn_given(dsn):
        return ""
    return _defaults_note(f"database {conn.info.dbname} on {conn.info.host} port {conn.info.port}")


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


dsn_option = click.option(
    "--dsn",
    envvar="PGDQ_DSN",
    help="the database: a conninfo or URL; default $PGDQ_DSN, else $DATABASE_URL, else the PG* variables",
)
schema_option = click.option(
    "--schema",
    default="public",
    envvar="PGDQ_SCHEMA",
    show_default=True,
    show_envvar=True,
    callback=_valid_schema,
    help="schema pgdq lives in",
)
json_option = click.option("--json", "as_json", is_flag=True, help="machine-readable output (JSON)")


def _first_sentence(text: str) -> str:
    """text up to its first ". " or "; " outside parentheses, without that stop."""
    depth = 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and char in ".;" and text[i + 1 : i + 2] in ("", " "):
            return text[:i]
    return text


def whole_summaries(group: click.Group) -> click.Group:
    """group, with each command's summary in `--help` its whole first sentence
    (click cuts docstrings to the terminal's width with "..."); subgroups too."""
    for command in group.commands.values():
        if command.short_help is None and command.help:
            command.short_help = _first_sentence(" ".join(command.help.split("\n\n")[0].split()))
        if isinstance(command, click.Group):
            whole_summaries(command)
    return group


def common_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--dsn, --schema and --json: the options every command takes."""
    return dsn_option(schema_option(json_option(command)))


# --- output -------------------------------------------------------------------


def _emit(data: Any, as_json: bool, human: Callable[[], None]) -> None:
    """Print data as JSON, or call human() for people."""
    if as_json:
        click.echo(json.dumps(_plain(data), default=_json_default))
    else:
        human()


def _emit_done(done: bool, word: str, missing: str, as_json: bool) -> None:
    """Print {word: done} as JSON, or word / missing for people; exit 4 when not done."""
    _emit({word: done}, as_json, lambda: click.echo(word if done else missing))
    if not done:
        sys.exit(NothingThere.exit_code)


def _json_default(value: Any) -> Any:
    """What JSON has no type for: times as _iso_time (to the microsecond),
    durations in seconds, anything else as text."""
    if isinstance(value, datetime):
        return _iso_time(value, "auto")
    return value.total_seconds() if isinstance(value, timedelta) else str(value)


def _iso_time(value: datetime, timespec: str = "seconds") -> str:
    """The one form the command line prints times in, as the HTTP API does:
    ISO 8601 in UTC with a Z (2030-01-01T12:30:00Z)."""
    return value.astimezone(UTC).isoformat(timespec=timespec).replace("+00:00", "Z")


def _plain(value: Any) -> Any:
    """value with dataclasses turned into dicts (for JSON); a message's
    payload as stored (raw_payload), without the decoded copy."""
    if isinstance(value, DecodedPayload):
        fields = {k: v for k, v in vars(value).items() if k not in ("_decoded", "decode_error")}
        return {("payload" if k == "raw_payload" else k): v for k, v in fields.items()}
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _cell(value: Any) -> str:
    """A value as one table cell: None is empty, times as _iso_time (to the
    second), durations in seconds."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        return _iso_time(value)
    if isinstance(value, timedelta):
        return f"{value.total_seconds():g} s"
    return str(value)


# Characters a terminal acts on (C0 but tab and newline, DEL, C1, and the
# bidirectional overrides and isolates) as \\uXXXX escapes
_CONTROLS = [*range(0x20), *range(0x7F, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
_CONTROL_ESCAPES = {c: f"\\u{c:04x}" for c in _CONTROLS if chr(c) not in "\t\n"}
_TERMINAL_ESCAPES = str.maketrans(_CONTROL_ESCAPES)
_TSV_ESCAPES = str.maketrans(
    {**_CONTROL_ESCAPES, **str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})}
)
# columns a table never narrows: what the next command takes whole
_WHOLE = {"lock_token"}


def _table(title: str, columns: list[str], rows: Iterable[list[Any]]) -> None:
    """Rows for a terminal as a table (lock tokens never cut, other cells
    folded, never cut), or into a pipe as tab-separated lines; control
    characters of stored text escaped (\\u001b), never written raw."""
    cells = [[_cell(v) for v in row] for row in rows]
    if not sys.stdout.isatty():
        for row in cells:
            click.echo("\t".join(c.translate(_TSV_ESCAPES) for c in row))
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(title))
    for column in columns:
        if column in _WHOLE:
            table.add_column(column, no_wrap=True, min_width=36)
        else:
            table.add_column(column, overflow="fold")
    for row in cells:
        table.add_row(*(escape(c.translate(_TERMINAL_ESCAPES)) for c in row))  # shown, never read as markup
    Console().print(table)


def _stderr() -> Any:
    from rich.console import Console

    return Console(stderr=True)


def _last_line(text: str | None) -> str:
    """The last line of an error (a traceback's is the exception itself)."""
    lines = (text or "").strip().splitlines()
    return lines[-1] if lines else ""


def _parse_time(text: str) -> datetime:
    """An ISO 8601 time with a zone; ValueError saying what is wrong."""
    try:
        at = datetime.fromisoformat(text)
    except ValueError as e:
        raise ValueError(f"not an ISO 8601 time: {text}") from e
    if at.tzinfo is None:
        raise ValueError(f"{text} has no time zone (add Z or +02:00)")
    return at


def _when(text: str | None, seconds: float | None) -> datetime | None:
    """--at (ISO 8601, a zone required) or --in (seconds from now)."""
    if text is not None and seconds is not None:
        raise click.UsageError("give --at or --in, not both")
    if seconds is not None:
        return datetime.now(UTC) + timedelta(seconds=seconds)
    if text is None:
        return None
    try:
        return _parse_time(text)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--at") from e


# A span's units: a number of them follows the number (90s, 30m, 12h, 7d, 8w)
SPANS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_span(text: str, units: str = "smhdw") -> timedelta | None:
    """text as a span (1 to 6 digits, then one of units), or None if it is not one."""
    span = re.fullmatch(rf"([0-9]{{1,6}})([{units}])", text.strip())
    return timedelta(**{SPANS[span[2]]: int(span[1])}) if span else None


def _json_argument(text: str, name: str) -> Any:
    """A JSON argument's value; exit 2 when it is not JSON."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise click.BadParameter(f"not JSON: {e}", param_hint=name) from e


def _tokens(texts: Iterable[str]) -> list[UUID]:
    """Lock tokens; exit 2 on one that is not a UUID."""
    try:
        return [UUID(t) for t in texts]
    except ValueError as e:
        raise click.BadParameter(f"not a lock token: {e}", param_hint="TOKEN") from e


# --- connecting -----------------------------------------------------------------


@contextmanager
def _refusals() -> Iterator[None]:
    """pgdq's and the server's errors inside the block as one-line CLI errors:
    an argument pgdq refuses exits 2, any other error 1."""
    try:
        yield
    except InvalidArgument as e:
        raise BadInput(str(e)) from e
    except PgdqError as e:
        raise click.ClickException(str(e)) from e
    except psycopg.Error as e:
        raise click.ClickException(f"the server refused: {_reason(e)}") from e


@contextmanager
def _database(dsn: str | None, schema: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection where pgdq is installed in schema (else exit 3)."""
    with _connect(dsn) as conn:
        _require_pgdq(conn, schema, dsn)
        with _refusals():
            yield conn


@contextmanager
def _queue(dsn: str | None, schema: str, name: str) -> Iterator[Queue]:
    """The queue name on a fresh autocommit connection (see _database)."""
    with _database(dsn, schema) as conn:
        yield Queue(name, conn, schema=schema)


@contextmanager
def _known_queue(dsn: str | None, schema: str, name: str, new: bool = False) -> Iterator[Queue]:
    """The queue name as _queue gives it, for a queue pgdq knows (see _known_queue_on)."""
    with _known_queue_on(dsn, schema, name, new) as (_, q):
        yield q


@contextmanager
def _known_queue_on(
    dsn: str | None, schema: str, name: str, new: bool = False
) -> Iterator[tuple[psycopg.Connection[Any], Queue]]:
    """The connection (see _database) and the queue name on it. When pgdq
    does not know the queue (see known) and new is false, the command's
    work still runs, so that bad input is exit 2 whatever the queue, but in
    a transaction rolled back; then exit 4 naming the queue: a typo changes
    nothing and says so."""
    with _database(dsn, schema) as conn:
        q = Queue(name, conn, schema=schema)
        if new or known(conn, schema, q):
            yield conn, q
            return
        with conn.transaction(force_rollback=True):
            yield conn, q
        raise NothingThere(
            f"no queue {name!r}: pgdq knows no messages, dead letters, schedules, channels or settings of it"
        )


@dataclass(frozen=True)
class QueueSettings:
    """A queue's row of dq_queues: paused, and its retention (None: history off)."""

    paused: bool
    retain: timedelta | None


_SETTINGS = "SELECT queue, paused_at IS NOT NULL, retain FROM {} WHERE %s::text IS NULL OR queue = %s::text"
_READABLE = (
    "SELECT r IS NOT NULL AND pg_catalog.has_table_privilege(r, 'SELECT')"
    " FROM pg_catalog.to_regclass(pg_catalog.format('%%I.dq_queues', %s::text)) AS r"
)


def queue_settings(
    conn: psycopg.Connection[Any], schema: str, queue: str | None = None
) -> dict[str, QueueSettings] | None:
    """Every queue's settings (queue's only, if given) by name, read from
    dq_queues (no function lists them): a queue paused, configured by a
    worker or keeping history has a row. None when they cannot be read (a
    role without SELECT on it, a pgdq.shard router)."""
    (readable,) = conn.execute(_READABLE, (schema,)).fetchone() or (False,)
    if not readable:
        return None
    statement = sql.SQL(_SETTINGS).format(sql.Identifier(schema, "dq_queues"))
    rows = conn.execute(statement, (queue, queue)).fetchall()
    return {name: QueueSettings(paused, keep) for name, paused, keep in rows}


def known(conn: psycopg.Connection[Any], schema: str, q: Queue) -> bool:
    """True when pgdq knows the queue q: it has messages, dead letters,
    schedules, channels (limits or messages) or settings (see queue_settings).
    Where the settings cannot be read (a pgdq.shard router, a role without
    SELECT on dq_queues), a queue known by its settings alone cannot be told
    from a typo: every queue counts as known there."""
    settings = queue_settings(conn, schema, q.name)
    if settings is None or settings:
        return True
    counts = q.stats()
    if counts.ready or counts.delayed or counts.leased or counts.paused:
        return True
    return bool(Client(conn, schema=schema).dead_stats(q.name) or q.schedules() or q.channels())


@contextmanager
def _client(dsn: str | None, schema: str) -> Iterator[Client]:
    """A Client (what belongs to no queue) on a fresh autocommit connection (see _database)."""
    with _database(dsn, schema) as conn:
        yield Client(conn, schema=schema)
