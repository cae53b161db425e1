"""The `pgdq` command (install / uninstall / version for now)."""

from __future__ import annotations

import os
import sys

import click
import psycopg

from . import __version__
from .errors import PgdqError
from .install import install as install_sql
from .install import installed_version
from .install import uninstall as uninstall_sql


def _connect(dsn: str | None) -> psycopg.Connection[tuple[object, ...]]:
    """Connect to --dsn, else DATABASE_URL, else the standard PG* variables."""
    conninfo = dsn or os.environ.get("DATABASE_URL", "")
    try:
        return psycopg.connect(conninfo, autocommit=True)
    except psycopg.OperationalError as e:
        raise click.ClickException(f"cannot connect: {e}") from e


dsn_option = click.option("--dsn", envvar="PGDQ_DSN", help="conninfo or URL; default DATABASE_URL or PG* variables")
schema_option = click.option("--schema", default="public", show_default=True, help="schema pgdq lives in")


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
            done = install_sql(conn, schema, if_not_exists=if_not_exists)
        except PgdqError as e:
            raise click.ClickException(str(e)) from e
        version = installed_version(conn, schema)
    click.echo(f"pgdq {version} {'installed in' if done else 'already installed in'} schema {schema}")


@main.command()
@dsn_option
@schema_option
@click.option("--yes", is_flag=True, help="do not ask; this deletes every message")
def uninstall(dsn: str | None, schema: str, yes: bool) -> None:
    """Drop pgdq and every message from the schema."""
    if not yes:
        click.confirm(f"Drop pgdq and all its messages from schema {schema}?", abort=True)
    with _connect(dsn) as conn:
        uninstall_sql(conn, schema)
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
