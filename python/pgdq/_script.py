"""Assemble the plain-SQL install script from sql/src (no extension needed).

Runs with no third-party imports, so `make sql` can call it as a file:
    python3 python/pgdq/_script.py [SCHEMA]
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
# In a checkout pgdq/sql links to the repo's sql/src; a wheel carries a copy.
SOURCE_DIRS = (_HERE / "sql", _HERE.parent.parent / "sql" / "src")


def quote_ident(name: str) -> str:
    """Quote name as a PostgreSQL identifier (doubling any double quote)."""
    if not name or "\x00" in name:
        raise ValueError("schema must be a non-empty name without NUL characters")
    return '"' + name.replace('"', '""') + '"'


def source_files() -> list[Path]:
    """The install sources, in the order they run."""
    for directory in SOURCE_DIRS:
        files = sorted(directory.glob("*.sql"))
        if files:
            return files
    raise FileNotFoundError("pgdq SQL sources not found next to the package")


def install_script(schema: str = "public") -> str:
    """The plain install script for schema, to run inside one transaction."""
    ident = quote_ident(schema)
    body = "\n".join(f.read_text() for f in source_files())
    head = (
        f"-- pgdq plain install into schema {ident}; run in one transaction.\n"
        f"CREATE SCHEMA IF NOT EXISTS {ident};\n"
        f"SET LOCAL search_path = {ident};\n"
    )
    return head + body.replace("@extschema@", ident)


def uninstall_script(schema: str = "public") -> str:
    """Drop every pgdq object (messages included) from schema."""
    ident = quote_ident(schema)
    return (
        f"SET LOCAL search_path = {ident};\n"
        "DO $$ DECLARE f regprocedure; BEGIN\n"
        "  FOR f IN SELECT p.oid::regprocedure FROM pg_proc p\n"
        "    JOIN pg_namespace n ON n.oid = p.pronamespace\n"
        "    WHERE n.nspname = current_schema()\n"
        "      AND p.proname LIKE 'dq\\_%'\n"
        "  LOOP EXECUTE 'DROP FUNCTION ' || f; END LOOP;\n"
        "END $$;\n"
        f"DROP TABLE IF EXISTS {ident}.dq_messages, {ident}.dq_dead_letters, {ident}.dq_queues, {ident}.dq_schedules;\n"
        f"DROP TYPE IF EXISTS {ident}.dq_delivery;\n"
    )


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else "public"
    sys.stdout.write("BEGIN;\n" + install_script(target) + "COMMIT;\n")
