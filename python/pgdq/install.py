"""Install and upgrade pgdq's SQL in a schema with a plain connection."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from ._script import install_script, plain_sql, uninstall_script, upgrade_steps
from ._version import VERSION
from .errors import PgdqError, translate


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

    A second install is AlreadyInstalled, or a no-op with if_not_exists.
    """
    if if_not_exists and installed_version(conn, schema) is not None:
        return False
    try:
        with conn.transaction():
            conn.execute(install_script(schema).encode())
    except psycopg.Error as e:
        raise translate(e) from e
    return True


def uninstall(conn: psycopg.Connection[Any], schema: str = "public") -> None:
    """Drop pgdq's functions, types and messages from schema (one transaction)."""
    with conn.transaction():
        conn.execute(uninstall_script(schema).encode())


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
    Concurrent upgrades of one database take turns.
    """
    try:
        with conn.transaction():
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
