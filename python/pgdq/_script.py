"""The plain-SQL install and upgrade scripts (no extension needed).

The install script is sql/src assembled; the upgrade scripts are the
extension's step scripts (sql/pgdq--A--B.sql), the same files ALTER EXTENSION
runs. Runs with no third-party imports, so `make sql` can call it as a file:
    python3 python/pgdq/_script.py [SCHEMA]
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
# In a checkout pgdq/sql links to the repo's sql/src; a wheel carries a copy.
SOURCE_DIRS = (_HERE / "sql", _HERE.parent.parent / "sql" / "src")
# Likewise pgdq/upgrades links to the repo's sql/, home of the step scripts.
UPGRADE_DIRS = (_HERE / "upgrades", _HERE.parent.parent / "sql")


def quote_ident(name: str) -> str:
    """Quote name as a PostgreSQL identifier (doubling any double quote)."""
    if not name or "\x00" in name:
        raise ValueError("schema must be a non-empty name without NUL characters")
    return '"' + name.replace('"', '""') + '"'


# the longest name PostgreSQL keeps whole (NAMEDATALEN - 1 bytes); longer ones are truncated
MAX_NAME_BYTES = 63


def check_schema(name: str) -> str:
    """name if the scripts can embed it, else ValueError: it must be 1 to 63
    bytes, without `$` (it could end a dollar-quoted function body) or control
    characters (a line break would end a comment the name appears in)."""
    if not name or len(name.encode()) > MAX_NAME_BYTES:
        raise ValueError(f"schema must be 1 to {MAX_NAME_BYTES} bytes long, got {len(name.encode())}")
    if "$" in name or any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise ValueError(f"schema must not contain $ or control characters, got {name!r}")
    return name


def schema_ident(name: str) -> str:
    """The schema as a quoted identifier the scripts can embed (check_schema)."""
    return quote_ident(check_schema(name))


def source_files() -> list[Path]:
    """The install sources, in the order they run."""
    for directory in SOURCE_DIRS:
        files = sorted(directory.glob("*.sql"))
        if files:
            return files
    raise FileNotFoundError("pgdq SQL sources not found next to the package")


def plain_sql(script: str, schema: str) -> str:
    """An extension script as a plain one for schema: @extschema@ filled in,
    psql meta-commands dropped, schema first on search_path."""
    ident = schema_ident(schema)
    body = "\n".join(line for line in script.splitlines() if not line.startswith("\\echo"))
    return f"SET LOCAL search_path = {ident};\n" + body.replace("@extschema@", ident) + "\n"


def install_script(schema: str = "public") -> str:
    """The plain install script for schema, to run inside one transaction."""
    ident = schema_ident(schema)
    body = "\n".join(f.read_text() for f in source_files())
    head = f"-- pgdq plain install into schema {ident}; run in one transaction.\nCREATE SCHEMA IF NOT EXISTS {ident};\n"
    return head + plain_sql(body, schema)


def released_install_script(version: str, schema: str = "public") -> str:
    """The full install script of a released version (sql/pgdq--VERSION.sql, kept
    for upgrade tests and benchmarks) as a plain install into schema."""
    for directory in UPGRADE_DIRS:
        path = directory / f"pgdq--{version}.sql"
        if path.exists():
            # the extension-only footer registers tables with pg_dump; a plain install has none
            lines = (line for line in path.read_text().splitlines() if "pg_extension_config_dump" not in line)
            return f"CREATE SCHEMA IF NOT EXISTS {schema_ident(schema)};\n" + plain_sql("\n".join(lines), schema)
    raise FileNotFoundError(f"no released install script for pgdq {version}")


def step_scripts() -> dict[str, tuple[str, Path]]:
    """The step scripts shipped, by the version each starts from: {from: (to, path)}."""
    for directory in UPGRADE_DIRS:
        steps = {}
        for path in directory.glob("pgdq--*--*.sql"):
            old, new = path.name.removeprefix("pgdq--").removesuffix(".sql").split("--")
            steps[old] = (new, path)
        if steps:
            return steps
    return {}


def upgrade_steps(installed: str, target: str) -> list[tuple[str, str, Path]]:
    """The steps (from, to, script) that take installed to target, in order;
    none when installed is target. ValueError when no path leads there."""
    steps, version = step_scripts(), installed
    path: list[tuple[str, str, Path]] = []
    while version != target:
        if version not in steps or len(path) > len(steps):
            raise ValueError(f"no upgrade path from pgdq {installed} to {target}")
        new, script = steps[version]
        path.append((version, new, script))
        version = new
    return path


# CREATE or DROP FUNCTION and the name, in the sources and step scripts
_FUNCTION = re.compile(
    r"^\s*(?:CREATE\s+(?:OR\s+REPLACE\s+)?|DROP\s+)FUNCTION\s+(?:IF\s+EXISTS\s+)?(?:@extschema@\.)?(dq_\w+)\s*\(",
    re.IGNORECASE | re.MULTILINE | re.ASCII,
)


def function_names() -> list[str]:
    """The names of every function pgdq creates, in this version or (through
    the step scripts) an earlier one."""
    scripts = [*source_files(), *(path for _, path in step_scripts().values())]
    return sorted({name.lower() for path in scripts for name in _FUNCTION.findall(path.read_text())})


def uninstall_script(schema: str = "public") -> str:
    """Drop pgdq's functions (every overload of each of its names), tables,
    type and messages from schema; other objects there stay."""
    ident = schema_ident(schema)
    names = ", ".join(f"'{name}'" for name in function_names())
    return (
        f"SET LOCAL search_path = {ident};\n"
        "DO $$ DECLARE f regprocedure; BEGIN\n"
        "  FOR f IN SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p\n"
        "    JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace\n"
        "    WHERE n.nspname = pg_catalog.current_schema()\n"
        f"      AND p.proname = ANY (ARRAY[{names}])\n"
        "  LOOP EXECUTE 'DROP FUNCTION ' || f; END LOOP;\n"
        "END $$;\n"
        f"DROP TABLE IF EXISTS {ident}.dq_messages, {ident}.dq_dead_letters, {ident}.dq_queues, {ident}.dq_schedules;\n"
        f"DROP TYPE IF EXISTS {ident}.dq_delivery;\n"
    )


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else "public"
    sys.stdout.write("BEGIN;\n" + install_script(target) + "COMMIT;\n")
