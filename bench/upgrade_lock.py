"""W12 (pgdq): the upgrade's lock time under traffic.

pgdq 1.1.0 as released (the extension when the server has its files, as
`make install` leaves them; else the plain install), 1,000,000 keyed
messages over 10 queues (n() scales it), 10 % of them leased; then the
step to this version (`ALTER EXTENSION pgdq UPDATE`, or `pgdq.upgrade` for a
plain install) while one connection loops dq_poll_many(queue, 10) and
another loops dq_offer on a live queue. Reported: the step's time, and for
each loop the longest single call that overlapped the step (how long it
was blocked), its longest call before the step (the baseline), and the
calls that failed.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pgdq
import psycopg
from common import n
from pgdq._script import released_install_script
from psycopg import sql
from rich.console import Console
from systems import System

console = Console(stderr=True)
FROM = "1.1.0"
DB = "bench_upgrade"
QUEUES = 10
CHUNK = 50_000


class Loop(threading.Thread):
    """Run one statement in a loop on a connection of its own: (start, end, error) per call."""

    def __init__(self, conninfo: str, statement: str, args: Any) -> None:
        super().__init__(daemon=True)
        self.conninfo, self.statement, self.args = conninfo, statement, args
        self.calls: list[tuple[float, float, str | None]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            i = 0
            while not self.stop.is_set():
                started, error = time.perf_counter(), None
                try:
                    conn.execute(self.statement, self.args(i)).fetchall()
                except psycopg.Error as e:
                    error = f"{type(e).__name__}: {e}".splitlines()[0]
                self.calls.append((started, time.perf_counter(), error))
                i += 1

    def longest(self, since: float, until: float) -> float:
        """Seconds of the longest call that overlapped [since, until]."""
        return max((end - start for start, end, _ in self.calls if end >= since and start <= until), default=0.0)

    def longest_before(self, at: float) -> float:
        """Seconds of the longest call that ended before at."""
        return max((end - start for start, end, _ in self.calls if end < at), default=0.0)

    def errors(self) -> list[str]:
        return [e for _, _, e in self.calls if e is not None]


def create(conninfo_admin: str = "dbname=postgres") -> str:
    """A new empty database DB; its conninfo."""
    with psycopg.connect(conninfo_admin, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DB)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DB)))
    return psycopg.conninfo.make_conninfo(dbname=DB)


def install_from(conn: psycopg.Connection[Any]) -> bool:
    """pgdq FROM as released: the extension if the server has both versions' files (True), else plain."""
    versions = {r[0] for r in conn.execute("SELECT version FROM pg_available_extension_versions WHERE name = 'pgdq'")}
    if {FROM, pgdq.__version__} <= versions:
        conn.execute(f"CREATE EXTENSION pgdq VERSION '{FROM}'")
        return True
    console.print(f"[yellow]W12: no pgdq {FROM}/{pgdq.__version__} extension files (make install): plain upgrade[/]")
    with conn.transaction():
        conn.execute(released_install_script(FROM).encode())
    return False


def w12_upgrade(system: System) -> dict[str, float]:
    """W12 (pgdq): the upgrade from 1.1.0 at 1M messages: its time, how long polls and offers wait."""
    if system.name != "pgdq":
        return {}
    total = n(1_000_000)
    per_queue = total // QUEUES
    conninfo = create()
    with psycopg.connect(conninfo, autocommit=True) as conn:
        extension = install_from(conn)
        for q in range(QUEUES):
            for first in range(0, per_queue, CHUNK):
                last = min(first + CHUNK, per_queue) - 1
                conn.execute(
                    "SELECT count(*) FROM dq_offer_many(%s,"
                    " ARRAY(SELECT 'k' || g FROM generate_series(%s::bigint, %s::bigint) AS g),"
                    " ARRAY(SELECT jsonb_build_object('n', g) FROM generate_series(%s::bigint, %s::bigint) AS g))",
                    (f"u{q}", first, last, first, last),
                )
            conn.execute("SELECT count(*) FROM dq_poll_many(%s, %s, '1 hour')", (f"u{q}", per_queue // 10))
        conn.execute(
            "SELECT count(*) FROM dq_offer_many('live', ARRAY(SELECT 'l' || g FROM generate_series(1, 50000) AS g),"
            " ARRAY(SELECT '{}'::jsonb FROM generate_series(1, 50000)))"
        )
        conn.execute("VACUUM ANALYZE")
        poll = Loop(conninfo, "SELECT * FROM dq_poll_many('live', 10, '1 minute')", lambda i: ())
        offer = Loop(conninfo, "SELECT dq_offer('live', %s, '{}'::jsonb)", lambda i: (f"o{i}",))
        for loop in (poll, offer):
            loop.start()
        time.sleep(1.0)  # the baseline: both loops before the step
        started = time.perf_counter()
        if extension:
            conn.execute("ALTER EXTENSION pgdq UPDATE")
        else:
            pgdq.upgrade(conn)
        ended = time.perf_counter()
        time.sleep(1.0)
        for loop in (poll, offer):
            loop.stop.set()
            loop.join()
        row = conn.execute("SELECT dq_version()").fetchone()
        assert row == (pgdq.__version__,), row
    label = f"{total // 1000}k" if total < 1_000_000 else f"{total / 1e6:g}M"
    how = "ALTER EXTENSION UPDATE" if extension else "pgdq.upgrade (plain)"
    out = {f"W12 {FROM} -> {pgdq.__version__} {how} at {label} s": ended - started}
    for name, loop in (("dq_poll_many(10)", poll), ("dq_offer", offer)):
        out[f"W12 {name} longest call during the step s"] = loop.longest(started, ended)
        out[f"W12 {name} longest call before the step s"] = loop.longest_before(started)
        out[f"W12 {name} calls failed"] = float(len(loop.errors()))
        for error in sorted(set(loop.errors()))[:3]:
            console.print(f"[red]W12 {name} failed during the upgrade: {error}[/]")
    with psycopg.connect("dbname=postgres", autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DB)))
    return out
