"""The `pgdq` command.

Installing: install, upgrade, uninstall, version. Messages: offer (one, or
JSON Lines), peek, poll, ack, nack, cancel, purge, stats. dead-letters
list|redrive|purge; schedules list|set|remove (kept by the database); worker.

Every command takes --dsn (else PGDQ_DSN, DATABASE_URL or the PG* variables),
--schema (else PGDQ_SCHEMA, else public) and --json (machine-readable output;
for worker: log lines as JSON objects). Tables go to a terminal; into a pipe
the same rows go as tab-separated lines (no title, no header; a tab, line
break or backslash inside a value is written \\t, \\n, \\r or \\\\), so what
one command prints (a lock token, a key) can be pasted into the next whole.

Exit codes: 0 done, 1 an error the message explains (pgdq's or the
server's, or no connection), 2 bad usage (bad arguments, an argument pgdq
refuses, a malformed --dsn or an unusable --schema), 3 pgdq not installed in
the schema (any command that needs it), 4 nothing there to act on: some lock
tokens were stale (ack, nack), no message of the key (cancel), no schedule
of the name (schedules remove).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, is_dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import click
import psycopg

from . import __version__
from ._script import check_schema
from ._sync_queue import Client, Queue
from .errors import InvalidArgument, PgdqError
from .install import ServerWarning, installed_version
from .install import install as install_sql
from .install import uninstall as uninstall_sql
from .install import upgrade as upgrade_sql
from .model import DecodedPayload


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


def _require_pgdq(conn: psycopg.Connection[Any], schema: str) -> None:
    """Exit 3 unless pgdq is installed in schema."""
    if installed_version(conn, schema) is None:
        raise NotInstalled(f"pgdq is not installed in schema {schema}")


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
    "--schema",
    default="public",
    envvar="PGDQ_SCHEMA",
    show_default=True,
    show_envvar=True,
    callback=_valid_schema,
    help="schema pgdq lives in",
)
json_option = click.option("--json", "as_json", is_flag=True, help="machine-readable output (JSON)")


def common_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--dsn, --schema and --json: the options every command takes."""
    return dsn_option(schema_option(json_option(command)))


@click.group()
@click.version_option(__version__, prog_name="pgdq")
def main() -> None:
    """pgdq: a delayed-message queue inside PostgreSQL.

    Every command takes --dsn (else PGDQ_DSN, DATABASE_URL or PG*), --schema
    (else PGDQ_SCHEMA, else public) and --json. Into a pipe, tables become
    tab-separated lines. Exit codes: 0 done, 1 error, 2 bad usage, 3 pgdq not
    installed, 4 nothing to act on (stale token, no such key or schedule).
    """


# --- output -------------------------------------------------------------------


def _emit(data: Any, as_json: bool, human: Callable[[], None]) -> None:
    """Print data as JSON, or call human() for people."""
    if as_json:
        click.echo(json.dumps(_plain(data), default=str))
    else:
        human()


def _emit_done(done: bool, word: str, missing: str, as_json: bool) -> None:
    """Print {word: done} as JSON, or word / missing for people; exit 4 when not done."""
    _emit({word: done}, as_json, lambda: click.echo(word if done else missing))
    if not done:
        sys.exit(NothingThere.exit_code)


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
    """A value as one table cell: None is empty, times ISO 8601 to the second."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds")
    return str(value)


_TSV_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
# columns a table never narrows: what the next command takes whole
_WHOLE = {"lock_token"}


def _table(title: str, columns: list[str], rows: Iterable[list[Any]]) -> None:
    """Rows for a terminal as a table (lock tokens never cut, other cells
    folded, never cut), or into a pipe as tab-separated lines."""
    cells = [[_cell(v) for v in row] for row in rows]
    if not sys.stdout.isatty():
        for row in cells:
            click.echo("\t".join(c.translate(_TSV_ESCAPES) for c in row))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in columns:
        if column in _WHOLE:
            table.add_column(column, no_wrap=True, min_width=36)
        else:
            table.add_column(column, overflow="fold")
    for row in cells:
        table.add_row(*row)
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
        _require_pgdq(conn, schema)
        with _refusals():
            yield conn


@contextmanager
def _queue(dsn: str | None, schema: str, name: str) -> Iterator[Queue]:
    """The queue name on a fresh autocommit connection (see _database)."""
    with _database(dsn, schema) as conn:
        yield Queue(name, conn, schema=schema)


@contextmanager
def _client(dsn: str | None, schema: str) -> Iterator[Client]:
    """A Client (what belongs to no queue) on a fresh autocommit connection (see _database)."""
    with _database(dsn, schema) as conn:
        yield Client(conn, schema=schema)


# --- installing -------------------------------------------------------------------


@main.command()
@common_options
@click.option("--if-not-exists", is_flag=True, help="succeed quietly when already installed")
def install(dsn: str | None, schema: str, as_json: bool, if_not_exists: bool) -> None:
    """Install pgdq's SQL (plain install, no extension needed)."""
    with _connect(dsn) as conn:
        try:
            with _server_warnings_shown():
                done = install_sql(conn, schema, if_not_exists=if_not_exists)
        except (PgdqError, psycopg.Error) as e:
            raise click.ClickException(f"install failed, nothing changed: {_reason(e)}") from e
        version = installed_version(conn, schema)
    said = "installed in" if done else "already installed in"
    _emit(
        {"installed": done, "version": version, "schema": schema},
        as_json,
        lambda: click.echo(f"pgdq {version} {said} schema {schema}"),
    )


@main.command()
@common_options
def upgrade(dsn: str | None, schema: str, as_json: bool) -> None:
    """Upgrade pgdq in place to this client's version (one transaction; messages, leases and schedules kept)."""
    with _connect(dsn) as conn:
        _require_pgdq(conn, schema)
        try:
            with _server_warnings_shown():
                steps = upgrade_sql(conn, schema)
        except (PgdqError, psycopg.Error) as e:
            raise click.ClickException(f"upgrade failed, nothing changed: {_reason(e)}") from e
    path = [steps[0][0], *(new for _, new in steps)] if steps else []

    def human() -> None:
        if not steps:
            click.echo(f"pgdq {__version__} is already current in schema {schema}; nothing to do")
        else:
            click.echo(f"pgdq upgraded in schema {schema}: {' -> '.join(path)}")

    _emit({"schema": schema, "version": __version__, "path": path}, as_json, human)


@main.command()
@common_options
@click.option("--yes", is_flag=True, help="do not ask; this deletes every message")
def uninstall(dsn: str | None, schema: str, as_json: bool, yes: bool) -> None:
    """Drop pgdq and every message from the schema (a plain install; other objects there stay)."""
    with _connect(dsn) as conn:
        _require_pgdq(conn, schema)
        if not yes:
            click.confirm(f"Drop pgdq and all its messages from schema {schema}?", abort=True, err=True)
        try:
            uninstall_sql(conn, schema)
        except (PgdqError, psycopg.Error) as e:
            raise click.ClickException(f"uninstall failed, nothing changed: {_reason(e)}") from e
    _emit(
        {"uninstalled": True, "schema": schema}, as_json, lambda: click.echo(f"pgdq uninstalled from schema {schema}")
    )


@main.command()
@common_options
def version(dsn: str | None, schema: str, as_json: bool) -> None:
    """Print the client version and the version installed in the database (exit 3 if none)."""
    with _connect(dsn) as conn:
        installed = installed_version(conn, schema)
    _emit(
        {"client": __version__, "database": installed, "schema": schema},
        as_json,
        lambda: click.echo(f"client {__version__}; database {installed or 'not installed'} (schema {schema})"),
    )
    if installed is None:
        sys.exit(3)


# --- the worker -------------------------------------------------------------------


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


LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


class JsonLogFormatter(logging.Formatter):
    """One JSON object per log line: time, level, logger, message (and the exception)."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line)


def _configure_logging(level: str, as_json: bool) -> None:
    """Log to stderr at level: LOG_FORMAT lines, or JSON objects."""
    stream = logging.StreamHandler()
    stream.setFormatter(JsonLogFormatter() if as_json else logging.Formatter(LOG_FORMAT))
    logging.basicConfig(level=level, handlers=[stream])


@main.command()
@dsn_option
@schema_option
@click.option("--json", "as_json", is_flag=True, help="log lines as JSON objects")
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
@click.option(
    "--log-level", default="INFO", show_default=True, type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"])
)
def worker(
    dsn: str | None,
    schema: str,
    as_json: bool,
    queues: tuple[str, ...],
    handler_spec: str,
    concurrency: int,
    lease: float,
    max_attempts: int,
    grace: float,
    timeout: float | None,
    log_level: str,
) -> None:
    """Consume queues with a handler until SIGTERM / SIGINT (exit 0 when clean).
    Logs go to stderr: `time LEVEL logger: message` lines, or JSON with --json."""
    from .worker import Worker

    fn = _import_handler(handler_spec)
    _check_worker_database(dsn, schema)
    _configure_logging(log_level, as_json)
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
        raise click.ClickException(f"the worker stopped: {_reason(e)}") from e
    if any(t.name.startswith("pgdq-handler") and t.is_alive() for t in threading.enumerate()):
        # a sync handler still running past the grace period was handed back;
        # do not wait for its thread
        logging.shutdown()
        os._exit(code)
    sys.exit(code)


def _check_worker_database(dsn: str | None, schema: str) -> None:
    """Exit 2 on a malformed --dsn, 3 when pgdq is not installed; a server
    that cannot be reached yet is the worker's to wait for."""
    try:
        with _connect(dsn) as conn:
            _require_pgdq(conn, schema)
    except CannotConnect:
        pass


# --- producing ----------------------------------------------------------------------

Row = tuple[str, Any, datetime | None]


@main.command()
@common_options
@click.argument("queue")
@click.argument("key", required=False)
@click.argument("payload", required=False)
@click.option("--at", "at_text", help="due time, ISO 8601 with a zone (default: now)")
@click.option("--in", "in_seconds", type=float, help="due in this many seconds")
@click.option("--no-update", is_flag=True, help="leave an existing message of the key as it is")
@click.option("--jsonl", is_flag=True, help='read {"key", "payload"[, "scheduled_at"]} lines from stdin')
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
    jsonl: bool,
    batch: int,
    atomic: bool,
) -> None:
    """Offer one message (KEY PAYLOAD, PAYLOAD as JSON), or many with --jsonl.

    --jsonl commits each batch as it goes: a bad line stops the import, the
    batches before it stay and the error says how many went in. With
    --atomic the whole import is one transaction: all or nothing."""
    if jsonl:
        if key is not None or at_text is not None or in_seconds is not None:
            raise click.UsageError("--jsonl reads the messages from stdin: give no KEY, PAYLOAD, --at or --in")
        counts = _offer_lines(dsn, schema, queue, not no_update, batch, atomic)
        _emit(counts, as_json, lambda: click.echo(", ".join(f"{n} {k}" for k, n in counts.items())))
        return
    if atomic:
        raise click.UsageError("--atomic goes with --jsonl")
    if key is None or payload is None:
        raise click.UsageError("give KEY and PAYLOAD, or --jsonl")
    value = _json_argument(payload, "PAYLOAD")
    with _queue(dsn, schema, queue) as q:
        outcome = q.offer(key, value, _when(at_text, in_seconds), can_update=not no_update)
    _emit({"key": key, "outcome": outcome.value}, as_json, lambda: click.echo(outcome.value))


def _offer_lines(
    dsn: str | None, schema: str, queue: str, can_update: bool, batch: int, atomic: bool
) -> dict[str, int]:
    """offer --jsonl: stdin's lines in batches of offer_many (in one
    transaction with atomic); the counts of their outcomes."""
    counts = {"created": 0, "updated": 0, "ignored": 0}
    with _database(dsn, schema) as conn, _progress(queue) as advance:
        q = Queue(queue, conn, schema=schema)
        with conn.transaction() if atomic else nullcontext():
            chunk: list[Row] = []
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


def _message(line: str) -> Row:
    """One JSON Lines message: key, payload and optional aware scheduled_at."""
    try:
        item = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON: {e}") from e
    if not isinstance(item, dict) or "key" not in item or "payload" not in item:
        raise ValueError('expected an object {"key", "payload"[, "scheduled_at"]}')
    key, at = item["key"], item.get("scheduled_at")
    if not isinstance(key, str):
        raise ValueError(f"key must be a string, got {json.dumps(key)}")
    if at is not None and not isinstance(at, str):
        raise ValueError(f"scheduled_at must be an ISO 8601 string, got {json.dumps(at)}")
    return key, item["payload"], None if at is None else _parse_time(at)


def _offer_chunk(
    q: Queue, chunk: list[Row], lines: tuple[int, int], can_update: bool, counts: dict[str, int], atomic: bool
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
    kept = f"{written} messages before it were offered and stay ({detail})"
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
            progress.update(task, advance=count, done=f"{done:,} messages, {rate:,.0f}/s")

        yield advance


# --- consuming --------------------------------------------------------------------------


@main.command()
@common_options
@click.argument("queue")
@click.option("--max", "max_count", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--lease", default=60.0, show_default=True, type=click.FloatRange(min=0.001), help="seconds")
def poll(dsn: str | None, schema: str, as_json: bool, queue: str, max_count: int, lease: float) -> None:
    """Lease due messages (for debugging); prints their lock tokens, whole
    (`pgdq poll Q | cut -f1 | xargs pgdq ack`)."""
    with _queue(dsn, schema, queue) as q:
        got = q.poll_many(max_count, timedelta(seconds=lease))
    rows = [
        {
            "lock_token": str(d.lock_token),
            "key": d.key,
            "attempts": d.attempts,
            "lease_until": d.lease_until,
            "payload": d.raw_payload,
        }
        for d in got
    ]
    _emit(
        rows,
        as_json,
        lambda: _table(
            f"{queue}: {len(rows)} leased",
            ["lock_token", "key", "attempts", "lease_until", "payload"],
            [[d.lock_token, d.key, d.attempts, d.lease_until, json.dumps(d.raw_payload)] for d in got],
        ),
    )


@main.command()
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


@main.command()
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


# --- looking and managing --------------------------------------------------------------


@main.command()
@common_options
@click.argument("queue")
@click.option("--due", "which", flag_value="due", help="only messages due now (expired leases too)")
@click.option("--delayed", "which", flag_value="delayed", help="only messages due later")
@click.option("--leased", "which", flag_value="leased", help="only leased messages")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 1000), help="at most this many")
def peek(dsn: str | None, schema: str, as_json: bool, queue: str, which: str | None, limit: int) -> None:
    """Messages of QUEUE, earliest due first, without locking or changing them."""
    with _queue(dsn, schema, queue) as q:
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
        }
        for m in found
    ]
    _emit(
        rows,
        as_json,
        lambda: _table(
            f"{queue}: {len(rows)} {which + ' ' if which else ''}messages",
            ["key", "due_at", "attempts", "leased", "last_error", "payload"],
            [
                [
                    m.key,
                    m.due_at,
                    m.attempts,
                    "leased" if m.leased else "",
                    _last_line(m.last_error),
                    json.dumps(m.raw_payload),
                ]
                for m in found
            ],
        ),
    )


@main.command()
@common_options
@click.argument("queue")
@click.argument("key")
def cancel(dsn: str | None, schema: str, as_json: bool, queue: str, key: str) -> None:
    """Delete the message of KEY, leased or not; exit 4 if there was none."""
    with _queue(dsn, schema, queue) as q:
        done = q.cancel(key)
    _emit_done(done, "cancelled", f"no message {key} in {queue}", as_json)


@main.command()
@common_options
@click.argument("queue")
@click.option("--yes", is_flag=True, help="do not ask")
def purge(dsn: str | None, schema: str, as_json: bool, queue: str, yes: bool) -> None:
    """Delete every message of QUEUE (leased ones too; its dead letters stay)."""
    with _queue(dsn, schema, queue) as q:
        if not yes:
            click.confirm(f"Delete every message of {queue}?", abort=True, err=True)
        count = q.purge()
    _emit({"purged": count}, as_json, lambda: click.echo(f"{count} deleted"))


@main.command()
@common_options
@click.argument("queue", required=False)
def stats(dsn: str | None, schema: str, as_json: bool, queue: str | None) -> None:
    """Ready, delayed and leased counts per queue (or of QUEUE)."""
    with _client(dsn, schema) as client:
        found = client.stats(queue)
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


# --- dead letters ----------------------------------------------------------------------


@main.group("dead-letters")
def dead_letters() -> None:
    """List, redrive or purge a queue's dead letters."""


@dead_letters.command("list")
@common_options
@click.argument("queue")
@click.option("--max", "max_count", default=100, show_default=True, type=click.IntRange(min=1))
def dead_list(dsn: str | None, schema: str, as_json: bool, queue: str, max_count: int) -> None:
    """The oldest failures first."""
    with _queue(dsn, schema, queue) as q:
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
@common_options
@click.argument("queue")
@click.option("--key", default=None, help="only this key")
@click.option("--at", "at_text", help="due time, ISO 8601 with a zone (default: now)")
def dead_redrive(dsn: str | None, schema: str, as_json: bool, queue: str, key: str | None, at_text: str | None) -> None:
    """Offer the dead letters again (fresh: no attempts, no state)."""
    at = _when(at_text, None)
    with _queue(dsn, schema, queue) as q:
        count = q.redrive(key, at)
    _emit({"redriven": count}, as_json, lambda: click.echo(f"{count} re-offered"))


@dead_letters.command("purge")
@common_options
@click.argument("queue")
@click.option("--key", default=None, help="only this key")
@click.option("--yes", is_flag=True, help="do not ask")
def dead_purge(dsn: str | None, schema: str, as_json: bool, queue: str, key: str | None, yes: bool) -> None:
    """Delete the dead letters."""
    with _queue(dsn, schema, queue) as q:
        if not yes:
            what = f"the dead letter {key}" if key else "every dead letter"
            click.confirm(f"Delete {what} of {queue}?", abort=True, err=True)
        count = q.purge_dead_letters(key)
    _emit({"purged": count}, as_json, lambda: click.echo(f"{count} deleted"))


# --- schedules kept by the database ------------------------------------------------------


@main.group()
def schedules() -> None:
    """List, set or remove the schedules the database keeps (polls of their
    queue turn occurrences into messages; no scheduler process needed)."""


@schedules.command("list")
@common_options
@click.argument("queue", required=False)
def schedules_list(dsn: str | None, schema: str, as_json: bool, queue: str | None) -> None:
    """Every schedule (or QUEUE's), with its next occurrence and last error."""
    with _client(dsn, schema) as client:
        found = client.schedules(queue)
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
    """Create or replace the schedule NAME of QUEUE (EXPRESSION: five cron
    fields, e.g. '0 9 * * mon-fri'); prints its next occurrence."""
    value = _json_argument(payload, "--payload")
    with _queue(dsn, schema, queue) as q:
        next_at = q.schedule(name, expression, timezone, value, max_missed=max_missed)
    _emit(
        {"queue": queue, "name": name, "next_at": next_at},
        as_json,
        lambda: click.echo(f"{queue}/{name}: next at {_cell(next_at)}"),
    )


@schedules.command("remove")
@common_options
@click.argument("queue")
@click.argument("name")
def schedules_remove(dsn: str | None, schema: str, as_json: bool, queue: str, name: str) -> None:
    """Remove the schedule NAME of QUEUE and its pending occurrences; exit 4 if there was none."""
    with _queue(dsn, schema, queue) as q:
        done = q.unschedule(name)
    _emit_done(done, "removed", f"no schedule {name} in {queue}", as_json)
