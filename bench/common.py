"""What bench.py and its workload modules share: the --quick scale, a fresh
database per system, server-side timings."""

from __future__ import annotations

import statistics
from typing import Any

import psycopg
from psycopg import sql
from systems import System

SCALE = 1.0  # --quick shrinks the counts of the workload under way (bench.py sets it)


def n(count: int) -> int:
    """count at the run's scale."""
    return max(1, int(count * SCALE))


def fresh_db(system: System) -> str:
    """A new database for system, set up; its conninfo."""
    name = "bench_" + "".join(ch if ch.isalnum() else "_" for ch in system.name.lower())
    with psycopg.connect("dbname=postgres", autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    conninfo = psycopg.conninfo.make_conninfo(dbname=name)
    system.setup(conninfo)
    return conninfo


def server_ms(conn: psycopg.Connection[Any], statement: str, calls: int) -> tuple[float, float]:
    """Median and p99 server execution time (EXPLAIN ANALYZE) of a statement."""
    times = []
    for _ in range(calls):
        # rolled back, so the due set stays the same for every call
        with conn.transaction(force_rollback=True):
            plan = conn.execute("EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) " + statement).fetchone()
        assert plan is not None
        times.append(plan[0][0]["Execution Time"])
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.99) - 1]
