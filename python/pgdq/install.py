"""Install and upgrade pgdq's SQL in a schema with a plain connection."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql

from ._script import check_schema, install_script, plain_sql, uninstall_script, upgrade_steps
from ._version import VERSION
from .errors import InvalidArgument, PgdqError, translate


class ServerWarning(UserWarning):
    """A WARNING the server raised while installing or upgrading pgdq, such as
    a schema every role may create objects in."""


def _checked(schema: str) -> str:
    """schema, or InvalidArgument when pgdq's scripts cannot embed it safely."""
    try:
        return check_schema(schema)
    except ValueError as e:
        raise InvalidArgument(str(e)) from e


@contextmanager
def _server_warnings(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """Re-raise the server's WARNINGs inside the block as ServerWarning, once it succeeds."""
    raised: list[str] = []

    def keep(notice: psycopg.errors.Diagnostic) -> None:
        if notice.severity_nonlocalized == "WARNING":
            raised.append(_notice_text(notice))  # read it now: psycopg frees it after this call

    conn.add_notice_handler(keep)
    try:
        yield
    finally:
        conn.remove_notice_handler(keep)
    for text in raised:
        warnings.warn(text, ServerWarning, stacklevel=4)


def _notice_text(notice: psycopg.errors.Diagnostic) -> str:
    """A notice as psql shows it: the message, then DETAIL and HINT lines."""
    lines = [notice.message_primary or ""]
    if notice.message_detail:
        lines.append(f"DETAIL: {notice.message_detail}")
    if notice.message_hint:
        lines.append(f"HINT: {notice.message_hint}")
    return "\n".join(lines)


def installed_version(conn: psycopg.Connection[Any], schema: str = "public") -> str | None:
    """The pgdq version installed in schema, or None."""
    found = conn.execute(
        "SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = %s AND p.proname = 'dq_version'",
        (schema,),
    ).fetchone()
    if found is None:
        return None
    row = conn.execute(sql.SQL("SELECT {}.dq_version()").format(sql.Identifier(schema))).fetchone()
    return None if row is None else str(row[0])


def install(conn: psycopg.Connection[Any], schema: str = "public", *, if_not_exists: bool = False) -> bool:
    """Install pgdq into schema in one transaction; True if it installed.

    A second install is AlreadyInstalled, or a no-op with if_not_exists; a
    schema name the script cannot embed is InvalidArgument. The server's
    warnings (e.g. every role may create in schema) come as ServerWarning.
    """
    script = install_script(_checked(schema))
    if if_not_exists and installed_version(conn, schema) is not None:
        return False
    try:
        with _server_warnings(conn), conn.transaction():
            conn.execute(script.encode())
    except psycopg.Error as e:
        raise translate(e) from e
    return True


def uninstall(conn: psycopg.Connection[Any], schema: str = "public") -> None:
    """Drop pgdq's own functions, tables, type and messages from schema (one
    transaction); an extension install is PgdqError (DROP EXTENSION removes it)."""
    script = uninstall_script(_checked(schema))
    if extension_schema(conn) == schema:
        raise PgdqError(f"pgdq is installed as an extension in schema {schema}: remove it with DROP EXTENSION pgdq")
    try:
        with conn.transaction():
            conn.execute(script.encode())
    except psycopg.Error as e:
        raise translate(e) from e


def extension_schema(conn: psycopg.Connection[Any]) -> str | None:
    """The schema of the pgdq extension in this database, or None."""
    row = conn.execute(
        "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'pgdq'"
    ).fetchone()
    return None if row is None else str(row[0])


def upgrade(conn: psycopg.Connection[Any], schema: str = "public") -> list[tuple[str, str]]:
    """Bring pgdq in schema to VERSION in one transaction; the steps
    taken as (from, to), none when already current.

    A plain install runs the step scripts in order; an extension install runs
    ALTER EXTENSION pgdq UPDATE (the server needs the new extension files).
    Concurrent upgrades of one database take turns. The server's warnings
    come as ServerWarning.
    """
    _checked(schema)
    try:
        with _server_warnings(conn), conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext('pgdq upgrade'))")
            installed = installed_version(conn, schema)
            if installed is None:
                raise PgdqError(f"pgdq is not installed in schema {schema}")
            try:
                steps = upgrade_steps(installed, VERSION)
            except ValueError as e:
                raise PgdqError(str(e)) from e
            if steps and extension_schema(conn) == schema:
                conn.execute(sql.SQL("ALTER EXTENSION pgdq UPDATE TO {}").format(sql.Literal(VERSION)))
            else:
                for _, _, script in steps:
                    conn.execute(plain_sql(script.read_text(), schema).encode())
    except psycopg.Error as e:
        raise translate(e) from e
    return [(old, new) for old, new, _ in steps]
