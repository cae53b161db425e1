"""`pgdq install`, `upgrade`, `uninstall`, `version` and `worker`."""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import click
import psycopg

from .. import __version__
from ..errors import PgdqError
from ._base import (
    BadInput,
    CannotConnect,
    _connect,
    _emit,
    _iso_time,
    _reached_note,
    _reason,
    _require_pgdq,
    _server_warnings_shown,
    common_options,
    dsn_option,
    schema_option,
)

if TYPE_CHECKING:
    from .._worker_metrics import WorkerMetrics
from ..install import install as install_sql
from ..install import installed_version
from ..install import uninstall as uninstall_sql
from ..install import upgrade as upgrade_sql

# --- installing -------------------------------------------------------------------


@click.command()
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


@click.command()
@common_options
def upgrade(dsn: str | None, schema: str, as_json: bool) -> None:
    """Upgrade pgdq in place to this client's version (one transaction; messages, leases and schedules kept)."""
    with _connect(dsn) as conn:
        _require_pgdq(conn, schema, dsn)
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


@click.command()
@common_options
@click.option("--yes", is_flag=True, help="do not ask; this deletes every message")
def uninstall(dsn: str | None, schema: str, as_json: bool, yes: bool) -> None:
    """Drop pgdq and every message from the schema (a plain install; other objects there stay)."""
    with _connect(dsn) as conn:
        _require_pgdq(conn, schema, dsn)
        if not yes:
            click.confirm(f"Drop pgdq and all its messages from schema {schema}?", abort=True, err=True)
        try:
            uninstall_sql(conn, schema)
        except (PgdqError, psycopg.Error) as e:
            raise click.ClickException(f"uninstall failed, nothing changed: {_reason(e)}") from e
    _emit(
        {"uninstalled": True, "schema": schema}, as_json, lambda: click.echo(f"pgdq uninstalled from schema {schema}")
    )


@click.command()
@common_options
def version(dsn: str | None, schema: str, as_json: bool) -> None:
    """Print the client version and the version installed in the database (exit 3 if none)."""
    with _connect(dsn) as conn:
        installed = installed_version(conn, schema)
        note = "" if installed else _reached_note(conn, dsn)
    _emit(
        {"client": __version__, "database": installed, "schema": schema},
        as_json,
        lambda: click.echo(f"client {__version__}; database {installed or 'not installed'} (schema {schema}){note}"),
    )
    if installed is None:
        sys.exit(3)


# --- the worker -------------------------------------------------------------------


def _import_handler(spec: str) -> Callable[..., Any]:
    """The function named by module:function (the current directory is
    importable) or path/to/file.py:function (its directory is); BadParameter
    saying how to fix a module that cannot be found."""
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise click.BadParameter(
            "expected module:function or path/to/file.py:function, e.g. tasks:send_email", param_hint="--handler"
        )
    module_name, directory = target, os.getcwd()
    if target.endswith(".py") or os.sep in target:
        path = os.path.abspath(target)
        if not os.path.isfile(path):
            raise click.BadParameter(f"cannot load {spec}: no file {target} in {os.getcwd()}", param_hint="--handler")
        module_name, directory = os.path.splitext(os.path.basename(path))[0], os.path.dirname(path)
    sys.path.insert(0, directory)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is None or not (module_name == e.name or module_name.startswith(e.name + ".")):
            raise click.BadParameter(
                f"cannot load {spec}: importing {module_name} failed: {e}", param_hint="--handler"
            ) from e
        file = module_name.replace(".", "/") + ".py"
        hint = (
            f"cannot load {spec}: no module {module_name} in {os.getcwd()} or on PYTHONPATH: run the worker from "
            f"the directory that holds {file}, or give the file, e.g. --handler path/to/{file}:{attr}"
        )
        raise click.BadParameter(hint, param_hint="--handler") from e
    except Exception as e:  # the module's own code failed: say so, in one line
        raise click.BadParameter(
            f"cannot load {spec}: importing {module_name} failed: {type(e).__name__}: {e}", param_hint="--handler"
        ) from e
    fn = getattr(module, attr, None)
    if fn is None:
        raise click.BadParameter(f"cannot load {spec}: module {module_name} has no {attr}", param_hint="--handler")
    if not callable(fn):
        raise click.BadParameter(f"{spec} is not callable", param_hint="--handler")
    return fn  # type: ignore[no-any-return]


LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


class JsonLogFormatter(logging.Formatter):
    """One JSON object per log line: time, level, logger, message (and the exception)."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": _iso_time(datetime.fromtimestamp(record.created, UTC), "auto"),
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


def _worker_metrics(queues: tuple[str, ...], port: int | None, host: str) -> WorkerMetrics | None:
    """The worker's metrics server on host:port, or None without a port; BadInput if it cannot start."""
    if port is None:
        return None
    from .._worker_metrics import WorkerMetrics

    try:
        return WorkerMetrics(queues, port, host)
    except (RuntimeError, OSError) as e:
        raise BadInput(f"--metrics-port {port}: {e}") from e


@click.command()
@dsn_option
@schema_option
@click.option("--json", "as_json", is_flag=True, help="log lines as JSON objects")
@click.option("--queue", "queues", multiple=True, required=True, help="a queue to consume; repeat for several")
@click.option(
    "--handler",
    "handler_spec",
    required=True,
    help="module:function (from the current directory) or path/to/file.py:function, called with each delivery",
)
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
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    help="serve Prometheus metrics (outcomes, handler durations) on this port (needs the http extra)",
)
@click.option("--metrics-host", default="127.0.0.1", show_default=True, help="address of the metrics port")
@click.option(
    "--listen-dsn", help="LISTEN for wake-ups here, straight to the server (behind PgBouncer); default: --dsn"
)
@click.option(
    "--no-prepared-statements",
    "prepared_statements",
    flag_value=False,
    default=True,
    help="prepare nothing server-side (PgBouncer before 1.21 in transaction mode)",
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
    metrics_port: int | None,
    metrics_host: str,
    listen_dsn: str | None,
    prepared_statements: bool,
) -> None:
    """Consume queues with a handler until SIGTERM / SIGINT (exit 0 when clean).
    Logs go to stderr: `time LEVEL logger: message` lines, or JSON with --json."""
    from ..worker import Worker

    fn = _import_handler(handler_spec)
    _check_worker_database(dsn, schema)
    _configure_logging(log_level, as_json)
    metrics = _worker_metrics(queues, metrics_port, metrics_host)
    runner = Worker(
        {queue: fn for queue in queues},
        dsn=dsn or os.environ.get("DATABASE_URL", ""),
        schema=schema,
        concurrency=concurrency,
        lease=timedelta(seconds=lease),
        max_attempts=max_attempts,
        grace=timedelta(seconds=grace),
        timeout=None if timeout is None else timedelta(seconds=timeout),
        metrics=metrics,
        listen_dsn=listen_dsn,
        prepared_statements=prepared_statements,
    )
    try:
        code = runner.run()
    except (PgdqError, psycopg.Error) as e:  # not a lost connection: those are retried
        raise click.ClickException(f"the worker stopped: {_reason(e)}") from e
    finally:
        if metrics is not None:
            metrics.close()
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
            _require_pgdq(conn, schema, dsn)
    except CannotConnect:
        pass
