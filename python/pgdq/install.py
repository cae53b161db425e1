"""Install pgdq's SQL into a schema with a plain connection (no extension)."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from ._script import install_script, uninstall_script
from .errors import translate


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
