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
from pgdq import AsyncQueue, Queue, shard
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
# Under pytest-xdist (make check) each worker has databases of its own.
DB = os.environ.get("PGDQ_TEST_DB", "pgdq_py") + (f"_{w}" if (w := os.environ.get("PYTEST_XDIST_WORKER")) else "")
# "fresh": CREATE EXTENSION pgdq; "upgrade": install 1.0.0, then ALTER
# EXTENSION pgdq UPDATE, so the whole suite runs against an upgraded database
# ("upgrade-1.1.0", "upgrade-1.2.0": the same from that release); "1.0.0",
# "1.1.0" or "1.2.0": that release
# alone, to show that a new test fails on it.
INSTALL = os.environ.get("PGDQ_TEST_INSTALL", "fresh")
# > 0: the test database is a PL/Proxy router (pgdq.shard) over this many
# partitions, each a throwaway cluster of its own (test-shard0, ...).
SHARDS = int(os.environ.get("PGDQ_TEST_SHARDS", "0"))
# The repo's throwaway cluster the suite runs on (scripts/pgcluster.sh), and
# the prefix of its partition clusters: make test runs suites at once, each
# that restarts servers or makes cluster-wide roles on clusters of its own.
CLUSTER = os.environ.get("PGDQ_TEST_CLUSTER", "test")


# The share of each property test's examples to run: make check runs a quarter
# (derandomized, so the same first quarter every time), make test all of them.
EXAMPLES_SHARE = float(os.environ.get("PGDQ_TEST_EXAMPLES_SHARE", "1"))


def examples(count: int) -> int:
    """count property-test examples, scaled by PGDQ_TEST_EXAMPLES_SHARE (at least 20)."""
    return max(20, round(count * EXAMPLES_SHARE))


class JsonText:
    """A codec storing the JSON text it is given as it is: JSON Python cannot read back, as another client may store."""

    def dumps(self, value: Any) -> str:
        return str(value)

    def load(self, value: Any) -> Any:
        return value


def nested(levels: int) -> Any:
    """A JSON value of arrays and objects nested levels deep."""
    value: Any = 0
    for _ in range(levels):
        value = {"x": value}
    return value


def unsharded(why: str) -> pytest.MarkDecorator:
    """Skip a test when the suite runs through a router (PGDQ_TEST_SHARDS), saying why."""
    return pytest.mark.skipif(SHARDS > 0, reason=f"not through a PL/Proxy router: {why}")


IN_YOUR_TRANSACTION = "each call commits on its partition by itself, outside the caller's transaction"
READS_TABLES = "reads pgdq's tables, which live on the partitions"


def _cluster_env() -> None:
    """Point PG* at the repo's test cluster (started here) unless already set."""
    if os.environ.get("PGHOST"):
        return
    os.environ.update(start_cluster(CLUSTER))


def own_cluster() -> bool:
    """True when PG* points at the repo's test cluster (CLUSTER, of PGDQ_PG's
    version), which a test may restart."""
    cluster = subprocess.check_output([str(ROOT / "scripts/pgcluster.sh"), "dir", CLUSTER], text=True).strip()
    return os.environ.get("PGHOST") == f"{cluster}/run"


def partition_cluster(number: int) -> str:
    """The name of the suite's partition cluster number (scripts/pgcluster.sh)."""
    return f"{CLUSTER}-shard{number}"


def start_cluster(name: str) -> dict[str, str]:
    """Start the repo's throwaway cluster name (scripts/pgcluster.sh); its PG*
    variables, and PATH with its version's programs first (PGDQ_PG=16|17|18)."""
    subprocess.run([str(ROOT / "scripts/pgcluster.sh"), "start", name], check=True)
    out = subprocess.run(
        [str(ROOT / "scripts/pgcluster.sh"), "env", name], check=True, capture_output=True, text=True
    ).stdout
    env = dict(assignment.partition("=")[::2] for assignment in shlex.split(out.replace("export", "")))
    if "PATH" in env:
        env["PATH"] = env["PATH"].replace("$PATH", os.environ["PATH"])
    return env


def partition_databases(count: int, dbname: str = DB) -> list[str]:
    """count partition clusters (started), each with a fresh dbname holding pgdq; their conninfos."""
    conninfos = []
    for number in range(count):
        env = start_cluster(partition_cluster(number))
        params = {"host": env["PGHOST"], "port": env["PGPORT"], "user": env["PGUSER"]}
        with psycopg.connect(psycopg.conninfo.make_conninfo(dbname="postgres", **params), autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
        conninfo = psycopg.conninfo.make_conninfo(dbname=dbname, **params)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            install_extension(conn)
        conninfos.append(conninfo)
    return conninfos


def owner(database: str, queue: str) -> str:
    """The conninfo of the database holding queue's rows: database itself, or
    the partition that owns queue when database is a router."""
    if not SHARDS:
        return database
    with psycopg.connect(database, autocommit=True) as router:
        (partition,) = shard.partitions_of(router, [queue]) or {database}
    return partition


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
        if SHARDS:
            shard.init(conn, partition_databases(SHARDS))
        else:
            install_extension(conn)
    return dsn()


def install_extension(conn: psycopg.Connection[Any]) -> None:
    """CREATE EXTENSION pgdq the way PGDQ_TEST_INSTALL says (fresh, upgrade[-1.1.0|-1.2.0], 1.0.0, 1.1.0, 1.2.0)."""
    releases = {"upgrade": "1.0.0", "upgrade-1.1.0": "1.1.0", "upgrade-1.2.0": "1.2.0"}
    releases |= {v: v for v in ("1.0.0", "1.1.0", "1.2.0")}
    if INSTALL in releases:
        conn.execute(sql.SQL("CREATE EXTENSION pgdq VERSION {}").format(sql.Literal(releases[INSTALL])))
        if INSTALL.startswith("upgrade"):
            conn.execute("ALTER EXTENSION pgdq UPDATE")
    else:
        assert INSTALL == "fresh", f"PGDQ_TEST_INSTALL must be fresh, {', '.join(releases)}; got {INSTALL!r}"
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
    with psycopg.connect(owner(database, name), autocommit=True) as c:

        def forget() -> None:
            c.execute("SELECT dq_purge(%s)", (name,))
            c.execute("DELETE FROM dq_groups WHERE queue = %s", (name,))
            # settings (pause, retention: 1.2) and history: the queue's twin test starts afresh
            c.execute("DELETE FROM dq_queues WHERE queue = %s", (name,))
            for table in ("dq_history", "dq_history_deltas", "dq_history_tallies"):
                if c.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone() == (True,):
                    c.execute(sql.SQL("DELETE FROM {} WHERE queue = %s").format(sql.Identifier(table)), (name,))

        forget()
        yield name
        assert_counts_agree(c, name)
        forget()


def assert_counts_agree(conn: psycopg.Connection[Any], queue: str) -> None:
    """dq_stats()'s overview of queue from the counts (dq_counts, kept by
    triggers on every write) equals one read from its messages, at one time
    and one snapshot: every test that leaves messages behind checks the
    counts of the writes it made. Installs before 1.2 have no counts."""
    if conn.execute("SELECT to_regproc('dq__counted_stats') IS NULL").fetchone() == (True,):
        return
    (now,) = conn.execute("SELECT dq_now()").fetchone() or (None,)
    counted, scanned = conn.execute(
        """SELECT
            (SELECT row(s.*)::text FROM dq__counted_stats(%(now)s) AS s WHERE s.queue = %(queue)s),
            (SELECT row(s.*)::text FROM dq__scanned_stats(%(now)s) AS s WHERE s.queue = %(queue)s)""",
        {"now": now, "queue": queue},
    ).fetchone() or (None, None)
    assert counted == scanned, f"the counts of {queue} disagree with its messages"


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


# make test's parallel runs hand out whole files (pytest-xdist --dist
# loadfile) in collection order: the longest files first, so that none of them
# starts last and runs on alone while the other workers idle.
LONGEST_FIRST = (
    "test_spark.py",
    "test_cron_expressions.py",
    "test_readme.py",
    "test_dashboard.py",
    "test_http_guard.py",
    "test_failover.py",
    "test_channel_limits.py",
    "test_http_limits.py",
    "test_http_manage.py",
    "test_http.py",
    "test_http_classic.py",
    "test_shard.py",
    "test_upgrade.py",
    "test_properties.py",
    "test_channels.py",
    "test_channels_async.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Order the files LONGEST_FIRST, then the rest as collected."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
