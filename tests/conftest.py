"""Fixtures: a real PostgreSQL (the repo's throwaway cluster unless PG* says
otherwise), a fresh database with pgdq installed, a fresh queue per test."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from http_server import Server, serve
from pgdq import AsyncQueue, Queue
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
DB = os.environ.get("PGDQ_TEST_DB", "pgdq_py")
# "fresh": CREATE EXTENSION pgdq; "upgrade": install 1.0.0, then ALTER
# EXTENSION pgdq UPDATE, so the whole suite runs against an upgraded database;
# "1.0.0": the first release alone, to show that a new test fails on it.
INSTALL = os.environ.get("PGDQ_TEST_INSTALL", "fresh")


def _cluster_env() -> None:
    """Point PG* at the repo's test cluster (started here) unless already set."""
    if os.environ.get("PGHOST"):
        return
    subprocess.run([str(ROOT / "scripts/pgcluster.sh"), "start", "test"], check=True)
    out = subprocess.run(
        [str(ROOT / "scripts/pgcluster.sh"), "env", "test"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    for assignment in shlex.split(out.replace("export", "")):
        name, _, value = assignment.partition("=")
        os.environ[name] = value


def dsn(dbname: str = DB) -> str:
    """conninfo of a test database (PG* variables give host, port and user)."""
    return psycopg.conninfo.make_conninfo(dbname=dbname)


def recreate_database(name: str) -> None:
    """Drop and create an empty database."""
    with psycopg.connect(dsn("postgres"), autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


@pytest.fixture(scope="session")
def database() -> str:
    """A fresh database with the pgdq extension (PGDQ_TEST_INSTALL says how it
    got there); its conninfo."""
    _cluster_env()
    recreate_database(DB)
    with psycopg.connect(dsn(), autocommit=True) as conn:
        install_extension(conn)
    return dsn()


def install_extension(conn: psycopg.Connection[Any]) -> None:
    """CREATE EXTENSION pgdq the way PGDQ_TEST_INSTALL says (fresh, upgrade, 1.0.0)."""
    if INSTALL in ("upgrade", "1.0.0"):
        conn.execute("CREATE EXTENSION pgdq VERSION '1.0.0'")
        if INSTALL == "upgrade":
            conn.execute("ALTER EXTENSION pgdq UPDATE")
    else:
        assert INSTALL == "fresh", f"PGDQ_TEST_INSTALL must be fresh, upgrade or 1.0.0, got {INSTALL!r}"
        conn.execute("CREATE EXTENSION pgdq")


@pytest.fixture
def conn(database: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to the test database."""
    with psycopg.connect(database, autocommit=True) as c:
        yield c


@pytest.fixture
def queue_name(request: pytest.FixtureRequest, database: str) -> Iterator[str]:
    """A queue name of this test's own, purged (channels too) before and after."""
    name = re.sub(r"\W+", "_", request.node.name)[-90:]
    with psycopg.connect(database, autocommit=True) as c:

        def forget() -> None:
            c.execute("SELECT dq_purge(%s)", (name,))
            c.execute("DELETE FROM dq_groups WHERE queue = %s", (name,))

        forget()
        yield name
        forget()


@pytest.fixture
async def aq(database: str, queue_name: str) -> AsyncIterator[AsyncQueue]:
    """This test's queue (asyncio), over an autocommit connection of its own."""
    async with AsyncQueue(queue_name, database) as queue:
        yield queue


@pytest.fixture
def q(database: str, queue_name: str) -> Iterator[Queue]:
    """This test's queue (blocking), over an autocommit connection of its own:
    the sync twin of aq, which generated tests (tests/test_*.py from
    tests/test_*_async.py) ask for."""
    with Queue(queue_name, database) as queue:
        yield queue


@pytest.fixture(scope="module")
def server(database: str) -> Iterator[Server]:
    """A `pgdq serve` on the test database, one per test module."""
    s = serve(database)
    yield s
    s.stop()


@pytest.fixture
def api(server: Server) -> Iterator[httpx.Client]:
    """An HTTP client of the module's server."""
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client
