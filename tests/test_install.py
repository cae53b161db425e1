"""Both install paths (extension and plain SQL), repeated installs, the one
list of pgdq's tables, search_path hijacking, the GRANTs docs/install.md documents
for producers and consumers, schema names the scripts cannot embed, uninstall
keeping users' objects, and the server's warnings shown at install and
upgrade."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pgdq
import psycopg
import pytest
from conftest import DB, dsn, recreate_database
from pgdq import AlreadyInstalled, InvalidArgument, PgdqError, Queue, install, uninstall
from pgdq._script import KEPT_TABLES, SEQUENCES, TABLES, grants_script, quote_ident, released_install_script
from pgdq.errors import translate
from pgdq.install import ServerWarning, installed_version, upgrade

ROOT = Path(__file__).resolve().parent.parent
SCRATCH = f"{DB}_scratch_install"  # beside the session's database, so suites in other databases do not meet


def pgdq_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pgdq", *args],
        check=False,
        capture_output=True,
        text=True,
        env=os.environ,
    )


@pytest.fixture
def scratch(database: str) -> Iterator[str]:
    """A fresh empty database; its conninfo."""
    recreate_database(SCRATCH)
    yield dsn(SCRATCH)
    recreate_database(SCRATCH)


def functions_in(conn: psycopg.Connection[Any], schema: str) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = %s AND p.proname LIKE 'dq%%'",
        (schema,),
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_schema_without_pgdq_is_sql_missing_and_other_errors_stay_psycopgs(scratch: str) -> None:
    """A pgdq call into a schema that lacks pgdq is the typed SqlMissing with
    what to do; a missing function that is not pgdq's keeps psycopg's error."""
    with psycopg.connect(scratch, autocommit=True) as conn:
        conn.execute('CREATE SCHEMA "no pgdq"')
        with pytest.raises(pgdq.SqlMissing, match=r"^function no pgdq\.dq_offer\(.*pgdq upgrade") as e:
            Queue("q", conn, schema="no pgdq").offer("k", 1)
        assert e.value.sqlstate == "42883"
        with pytest.raises(pgdq.SqlMissing, match=r"dq_version\(\) does not exist"):
            pgdq.Client(conn, schema="no pgdq").version()
        with pytest.raises(psycopg.errors.UndefinedFunction) as raw:
            conn.execute("SELECT dqx_version(), no_such_function()")
        assert translate(raw.value) is raw.value


def test_cli_plain_install_into_any_schema(scratch: str) -> None:
    schema = 'odd "schema"; name'
    done = pgdq_cli("install", "--dsn", scratch, "--schema", schema)
    assert done.returncode == 0, done.stderr
    assert f"pgdq {pgdq.__version__} installed" in done.stdout
    with psycopg.connect(scratch, autocommit=True) as conn:
        count = functions_in(conn, schema)
        q = Queue("plain", conn, schema=schema)
        assert q.offer("k", 1).value == "created"
        assert q.poll() is not None

        again = pgdq_cli("install", "--dsn", scratch, "--schema", schema)
        assert again.returncode == 1 and "already installed" in again.stderr
        assert functions_in(conn, schema) == count, "a second install changed nothing"
        quiet = pgdq_cli("install", "--dsn", scratch, "--schema", schema, "--if-not-exists")
        assert quiet.returncode == 0 and "already installed" in quiet.stdout
        with pytest.raises(AlreadyInstalled):
            install(conn, schema)

        version = pgdq_cli("version", "--dsn", scratch, "--schema", schema)
        assert f"database {pgdq.__version__}" in version.stdout
        uninstall(conn, schema)
        assert functions_in(conn, schema) == 0
        missing = pgdq_cli("version", "--dsn", scratch, "--schema", schema)
        assert missing.returncode == 3 and "not installed" in missing.stdout


def test_make_sql_script_applies_with_psql(scratch: str, tmp_path: Path) -> None:
    script = tmp_path / "pgdq.sql"
    subprocess.run(
        ["make", "-s", "sql", "SCHEMA=queueing"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    script.write_text((ROOT / "build/pgdq.sql").read_text())
    first = subprocess.run(
        ["psql", "-X", "-v", "ON_ERROR_STOP=1", "-q", "-d", scratch, "-f", str(script)],
        check=False,
        capture_output=True,
        text=True,
    )
    assert first.returncode == 0, first.stderr
    with psycopg.connect(scratch, autocommit=True) as conn:
        count = functions_in(conn, "queueing")
        assert count > 15
        second = subprocess.run(
            [
                "psql",
                "-X",
                "-v",
                "ON_ERROR_STOP=1",
                "-q",
                "-d",
                scratch,
                "-f",
                str(script),
            ],
            check=False,
            capture_output=True,
            text=True,
        )
        assert second.returncode != 0 and "pgdq is already installed in schema queueing" in second.stderr
        assert functions_in(conn, "queueing") == count


def test_extension_install(scratch: str) -> None:
    with psycopg.connect(scratch, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA q")
        conn.execute("CREATE EXTENSION pgdq SCHEMA q")
        assert Queue("ext", conn, schema="q").version() == pgdq.__version__
        with pytest.raises(psycopg.errors.DuplicateObject):
            conn.execute("CREATE EXTENSION pgdq SCHEMA q")
        conn.execute("DROP EXTENSION pgdq")
        assert functions_in(conn, "q") == 0


def relations(conn: psycopg.Connection[Any], schema: str) -> tuple[set[str], set[str]]:
    """The tables and the sequences in schema."""
    rows = conn.execute(
        "SELECT relkind::text, relname FROM pg_class"
        " WHERE relnamespace = %s::regnamespace AND relkind IN ('r', 'p', 'S')",
        (quote_ident(schema),),
    ).fetchall()
    return {name for kind, name in rows if kind != "S"}, {name for kind, name in rows if kind == "S"}


def test_the_one_table_list_is_what_the_install_creates(scratch: str) -> None:
    """_script.TABLES, KEPT_TABLES and SEQUENCES (which uninstall drops and the
    README's GRANTs come from; the extension registers TABLES and SEQUENCES
    with pg_dump) are exactly the tables and sequences either install
    creates: a new table must be listed there."""
    listed = (set(TABLES) | set(KEPT_TABLES), set(SEQUENCES))
    with psycopg.connect(scratch, autocommit=True) as conn:
        install(conn, "plain")
        assert relations(conn, "plain") == listed
        conn.execute("CREATE SCHEMA ext; CREATE EXTENSION pgdq SCHEMA ext")
        assert relations(conn, "ext") == listed
        dumped = conn.execute(
            "SELECT x::regclass::text FROM pg_extension, unnest(extconfig) AS x WHERE extname = 'pgdq'"
        ).fetchall()
        assert {name.removeprefix("ext.") for (name,) in dumped} == set(TABLES) | set(SEQUENCES)
        uninstall(conn, "plain")
        assert relations(conn, "plain") == (set(), set())


def test_search_path_cannot_hijack(database: str, queue_name: str) -> None:
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS evil CASCADE")
        conn.execute("CREATE SCHEMA evil")
        conn.execute("CREATE TABLE evil.dq_messages (LIKE public.dq_messages)")
        conn.execute(
            "CREATE FUNCTION evil.dq_now() RETURNS timestamptz LANGUAGE sql AS $$ SELECT '2000-01-01'::timestamptz $$"
        )
        conn.execute("CREATE FUNCTION evil.dq__check_queue(text) RETURNS void LANGUAGE sql AS $$ SELECT $$")
        conn.execute("SET search_path = evil, public")
        assert conn.execute("SELECT dq_offer(%s, 'k', '1')", (queue_name,)).fetchone() == ("created",)
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            conn.execute("SELECT dq_offer('', 'k', '1')")
        created = conn.execute("SELECT created_at FROM public.dq_get(%s, 'k')", (queue_name,)).fetchone()
        assert created is not None and created[0].year > 2000
        assert conn.execute("SELECT count(*) FROM evil.dq_messages").fetchone() == (0,)
        conn.execute("DROP SCHEMA evil CASCADE")


def test_documented_grants(database: str, queue_name: str) -> None:
    readme = (ROOT / "docs/install.md").read_text()
    grants = readme.split("<!-- grants -->")[1]
    assert grants.strip().removeprefix("```sql").removesuffix("```").lstrip("\n") == grants_script(), (
        "the GRANTs of docs/install.md are `python3 python/pgdq/_script.py --grants`, as generated"
    )
    statements = [line for line in grants.splitlines() if line.startswith(("GRANT", "CREATE ROLE"))]
    assert statements, "docs/install.md documents the GRANTs"
    with psycopg.connect(database, autocommit=True) as admin, documented_roles(admin):
        admin.execute("CREATE ROLE pgdq_nobody")
        for statement in statements:
            admin.execute(statement)
        admin.execute("GRANT pgdq_producer, pgdq_consumer, pgdq_nobody TO CURRENT_USER")

        admin.execute("SET ROLE pgdq_producer")
        q = Queue(queue_name, admin)
        assert q.offer("k", 1).value == "created"
        q.offer_many([("k2", 2)])
        q.schedule("grants", "* * * * * *", payload={"n": 0})
        time.sleep(1.1)  # an occurrence is due: the consumer's poll turns it into a message
        admin.execute("SET ROLE pgdq_consumer")
        got = q.poll_many(10)
        assert any(d.key.startswith("grants/") for d in got), "materialised by the consumer"
        q.ack_many([d.lock_token for d in got])
        admin.execute("SET ROLE pgdq_producer")
        assert q.unschedule("grants")
        q.offer_many([("k", 1), ("k2", 2)])
        admin.execute("SET ROLE pgdq_consumer")
        q.configure(max_attempts=1)
        d, d2 = q.poll_many(2)
        d.ack()
        d2.dead_letter("documented grants")
        admin.execute("SET ROLE pgdq_producer")
        assert [x.key for x in q.dead_letters()] == [d2.key] and q.redrive() == 1
        admin.execute("SET ROLE pgdq_consumer")
        q.configure(max_attempts=None)
        q.ack_many([d.lock_token for d in q.poll_many(10)])
        admin.execute("SET ROLE pgdq_producer")
        q.set_channel("partner", max_concurrency=1)
        q.offer("c1", 1, channel="partner", priority=2)
        admin.execute("SET ROLE pgdq_consumer")
        (c,) = q.poll_many(10)
        assert (c.key, c.channel, c.priority) == ("c1", "partner", 2), "channels work under the documented grants"
        c.ack()
        admin.execute("SET ROLE pgdq_nobody")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            q.offer("k3", 3)
        admin.execute("RESET ROLE")


@contextmanager
def documented_roles(admin: psycopg.Connection[Any]) -> Iterator[None]:
    """No README role before, none after: roles are cluster-wide, and the
    suite runs in several databases of one cluster."""

    def drop() -> None:
        for role in ("pgdq_producer", "pgdq_consumer", "pgdq_nobody"):
            if admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone() is not None:
                admin.execute(f"DROP OWNED BY {role}")
                admin.execute(f"DROP ROLE {role}")

    drop()
    try:
        yield
    finally:
        admin.execute("RESET ROLE")
        drop()


# -- schema names the scripts cannot embed; uninstall; server warnings -------

CRAFTED = [
    "a$$b",
    "x$$;CREATE TABLE IF NOT EXISTS public.pgdq_pwned();SELECT $$x",  # ends a $$ body
    "z\nCREATE TABLE IF NOT EXISTS public.pgdq_pwned();--",  # ends a comment the name is in
    "n" * 64,  # the server would truncate it
    "x');CREATE TABLE IF NOT EXISTS public.pgdq_pwned();SELECT ('",  # ends a string literal the name is in (1.2)
    "back\\slash",  # PostgreSQL refuses it for extension schemas too
]


def objects(conn: psycopg.Connection[Any]) -> set[str]:
    rows = conn.execute("SELECT relname FROM pg_class UNION ALL SELECT nspname FROM pg_namespace").fetchall()
    return {str(name) for (name,) in rows}


@pytest.mark.parametrize("schema", CRAFTED)
def test_unembeddable_schema_names_are_refused_and_create_nothing(scratch: str, schema: str) -> None:
    with psycopg.connect(scratch, autocommit=True) as conn:
        conn.execute("SET check_function_bodies = off")
        before = objects(conn)
        with pytest.raises(InvalidArgument, match="schema must"):
            install(conn, schema)
        with pytest.raises(InvalidArgument):
            uninstall(conn, schema)
        with pytest.raises(InvalidArgument):
            upgrade(conn, schema)
        with pytest.raises(ValueError):
            released_install_script("1.0.0", schema)
        assert objects(conn) == before
    refused = pgdq_cli("install", "--dsn", scratch, "--schema", schema)
    assert refused.returncode == 2 and refused.stderr.startswith("Error: invalid --schema: schema must")
    assert len(refused.stderr.splitlines()) == 1


def test_a_63_byte_schema_name_installs(scratch: str) -> None:
    schema = "é" * 31 + "x"
    with psycopg.connect(scratch, autocommit=True) as conn:
        assert install(conn, schema)
        assert Queue("q", conn, schema=schema).version() == pgdq.__version__


def test_uninstall_drops_only_pgdq_objects(scratch: str) -> None:
    with psycopg.connect(scratch, autocommit=True) as conn:
        install(conn, "app")
        conn.execute("CREATE FUNCTION app.dq_app_billing_report() RETURNS int LANGUAGE sql AS 'SELECT 1'")
        conn.execute("CREATE FUNCTION app.report() RETURNS int LANGUAGE sql AS 'SELECT 2'")
        conn.execute("CREATE TABLE app.dq_app_audit (id int)")
        done = pgdq_cli("uninstall", "--dsn", scratch, "--schema", "app", "--yes")
        assert done.returncode == 0, done.stderr
        assert conn.execute("SELECT app.dq_app_billing_report() + app.report()").fetchone() == (3,)
        assert conn.execute("SELECT count(*) FROM app.dq_app_audit").fetchone() == (0,)
        assert functions_in(conn, "app") == 1 and installed_version(conn, "app") is None
        assert conn.execute(
            "SELECT to_regclass('app.dq_messages'), to_regtype('app.dq_delivery'), to_regtype('app.dq_delivery_info')"
        ).fetchone() == (None, None, None)


def test_uninstall_leaves_an_extension_install_to_drop_extension(scratch: str) -> None:
    with psycopg.connect(scratch, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA q")
        conn.execute("CREATE EXTENSION pgdq SCHEMA q")
        with pytest.raises(PgdqError, match="DROP EXTENSION pgdq"):
            uninstall(conn, "q")
        refused = pgdq_cli("uninstall", "--dsn", scratch, "--schema", "q", "--yes")
        assert refused.returncode == 1 and "DROP EXTENSION pgdq" in refused.stderr
        assert len(refused.stderr.splitlines()) == 1
        assert installed_version(conn, "q") == pgdq.__version__


def test_install_warns_when_every_role_may_create_in_the_schema(scratch: str) -> None:
    with psycopg.connect(scratch, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA open; GRANT CREATE ON SCHEMA open TO PUBLIC; CREATE SCHEMA closed")
        with pytest.warns(ServerWarning, match="every role may create objects in schema open"):
            install(conn, "open")
        with warnings.catch_warnings():
            warnings.simplefilter("error", ServerWarning)
            install(conn, "closed")
        conn.execute("GRANT CREATE ON SCHEMA closed TO PUBLIC")
    uninstalled = pgdq_cli("uninstall", "--dsn", scratch, "--schema", "closed", "--yes")
    assert uninstalled.returncode == 0, uninstalled.stderr
    done = pgdq_cli("install", "--dsn", scratch, "--schema", "closed")
    assert done.returncode == 0 and done.stdout.startswith(f"pgdq {pgdq.__version__} installed")
    assert done.stderr.startswith("WARNING: pgdq: every role may create objects in schema closed\n")
    assert "HINT: REVOKE CREATE ON SCHEMA closed FROM PUBLIC" in done.stderr


def test_upgrade_shows_the_server_warnings(scratch: str) -> None:
    with psycopg.connect(scratch, autocommit=True) as conn:
        with conn.transaction():
            conn.execute(released_install_script("1.0.0", "old").encode())
        conn.execute(
            "CREATE FUNCTION public.warn() RETURNS event_trigger LANGUAGE plpgsql"
            " AS $$ BEGIN RAISE WARNING 'audit: % ran', tg_tag; END $$"
        )
        conn.execute(
            "CREATE EVENT TRIGGER audit ON ddl_command_end WHEN TAG IN ('DROP FUNCTION') EXECUTE FUNCTION warn()"
        )
    done = pgdq_cli("upgrade", "--dsn", scratch, "--schema", "old")
    assert done.returncode == 0, done.stderr
    assert "WARNING: audit: DROP FUNCTION ran" in done.stderr
