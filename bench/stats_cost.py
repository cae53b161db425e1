"""W11 (pgdq): what the stats functions cost as the table grows.

- dq_stats('small') of a 1-message queue beside a 300,000-message queue,
  and dq_stats('big') of that queue: server time of 50 calls each (300,000
  with --quick too);
- at STATS_MESSAGES messages (10,000,000 by default, a tenth with --quick;
  --stats-messages sets it) over 100 queues: the overview dq_stats() (from
  the counts since 1.2), dq_dead_stats(), dq_dead_stats(queue),
  dq_stats(queue) and dq_due_hours(queue), ~10 calls each, and 3 calls of
  the overview read from the messages (dq__scanned_stats, 1.1's way).
  Each queue holds half its messages due now and half delayed over the
  next 48 hours, 1 % of them leased; one
  queue has dead letters.

The messages are sent through dq_send_many (keyless, 100,000 a call, two
connections at once), then VACUUM ANALYZE: the public functions, so the
fill keeps working whatever the storage looks like. The database is dropped
at the end (10,000,000 messages take ~4 GB).
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from common import fresh_db, n, server_ms
from psycopg import sql
from systems import System

STATS_MESSAGES: int | None = None  # --stats-messages; None: n(10,000,000)
QUEUES = 100
CHUNK = 100_000
OVERVIEW_CALLS = ("dq_stats()", "dq_stats('q050')", "dq_dead_stats()", "dq_dead_stats('q000')", "dq_due_hours('q050')")
SCANNED_OVERVIEW = "SELECT * FROM dq__scanned_stats(dq_now())"
BYTES_PER_MESSAGE = 450  # table + indexes per message, measured with the layout of 1.2 (with margin)

# the messages of g in [first, last] of queue: half due now, half spread over the next 48 hours
SEND = """SELECT count(*) FROM dq_send_many(%(queue)s,
    ARRAY(SELECT jsonb_build_object('n', g) FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g),
    ARRAY(SELECT CASE WHEN g %% 2 = 1 THEN now() + (g %% 172800) * interval '1 second' END
          FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g))"""


def fill(conninfo: str, queue: str, total: int) -> None:
    """total keyless messages into queue, CHUNK a call."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        for first in range(0, total, CHUNK):
            conn.execute(SEND, {"queue": queue, "first": first, "last": min(first + CHUNK, total) - 1})


def fill_queues(conninfo: str, queues: list[str], per_queue: int, connections: int = 2) -> None:
    """per_queue messages into each queue, from `connections` connections at once."""
    errors: list[BaseException] = []

    def part(mine: list[str]) -> None:
        try:
            for queue in mine:
                fill(conninfo, queue, per_queue)
        except BaseException as e:  # re-raised below, in the caller's thread
            errors.append(e)

    threads = [threading.Thread(target=part, args=(queues[i::connections],)) for i in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def timed(conn: psycopg.Connection[Any], out: dict[str, float], label: str, statement: str, calls: int) -> None:
    """p50 and p99 server ms of statement into out."""
    out[f"{label} p50 ms"], out[f"{label} p99 ms"] = server_ms(conn, statement, calls)


def free_bytes(conn: psycopg.Connection[Any]) -> int:
    """Free bytes on the server's data directory (the server is on this machine)."""
    row = conn.execute("SHOW data_directory").fetchone()
    assert row is not None
    return shutil.disk_usage(Path(row[0])).free


def w11_stats(system: System) -> dict[str, float]:
    """W11 (pgdq): stats cost: dq_stats of a small queue beside a big one, the overview at 10M messages."""
    if system.name != "pgdq":
        return {}
    out: dict[str, float] = {}
    conninfo = fresh_db(system)
    big = 300_000  # not scaled by --quick: cheap, and a smaller queue hides the plan a big one gets
    with psycopg.connect(conninfo, autocommit=True) as conn:
        fill_queues(conninfo, ["big"], big, connections=1)
        conn.execute("SELECT dq_send('small', '{}')")
        conn.execute("VACUUM ANALYZE dq_messages")
        size = f"{big // 1000}k"
        timed(conn, out, f"W11 dq_stats('small') 1 message beside {size}", "SELECT * FROM dq_stats('small')", 50)
        timed(conn, out, f"W11 dq_stats('big') {size}", "SELECT * FROM dq_stats('big')", 50)

    total = STATS_MESSAGES or n(10_000_000)
    per_queue = max(1, total // QUEUES)
    label = f"{per_queue * QUEUES / 1e6:g}M"
    conninfo = fresh_db(system)  # dropping the first database frees its space
    with psycopg.connect(conninfo, autocommit=True) as conn:
        need, free = per_queue * QUEUES * BYTES_PER_MESSAGE, free_bytes(conn)
        if free < 2 * need:
            raise RuntimeError(f"W11 needs ~{need / 2**30:.1f} GB free twice over, {free / 2**30:.1f} GB are free")
        queues = [f"q{i:03}" for i in range(QUEUES)]
        started = time.perf_counter()
        fill_queues(conninfo, queues, per_queue)
        out[f"W11 fill {label} via dq_send_many msg/s"] = per_queue * QUEUES / (time.perf_counter() - started)
        # 1 % leased (taken and kept), and dead letters in one queue
        for queue in queues:
            conn.execute("SELECT count(*) FROM dq_poll_many(%s, %s, '1 day')", (queue, max(1, per_queue // 100)))
        conn.execute(
            "SELECT count(dq_dead_letter(d.lock_token, 'bench')) FROM dq_poll_many('q000', %s, '1 day') AS d",
            (n(10_000),),
        )
        started = time.perf_counter()
        conn.execute("VACUUM ANALYZE dq_messages")
        conn.execute("VACUUM ANALYZE dq_dead_letters")
        out[f"W11 VACUUM ANALYZE at {label} s"] = time.perf_counter() - started
        row = conn.execute("SELECT pg_total_relation_size('dq_messages')").fetchone()
        assert row is not None
        out[f"W11 dq_messages table+indexes at {label} MB"] = row[0] / 2**20
        for call in OVERVIEW_CALLS:
            timed(conn, out, f"W11 {call} {label}/100 queues", f"SELECT * FROM {call}", 10)
        # the same overview read from the messages, as 1.1 did (what the counts replace)
        timed(conn, out, f"W11 dq_stats() from the messages {label}/100 queues", SCANNED_OVERVIEW, 3)
        row = conn.execute("SELECT count(*) FROM dq_counts").fetchone()
        assert row is not None
        out[f"W11 dq_counts rows at {label}"] = row[0]
    drop(conninfo)
    return out


def drop(conninfo: str) -> None:
    """Drop the database of conninfo."""
    name = psycopg.conninfo.conninfo_to_dict(conninfo)["dbname"]
    with psycopg.connect("dbname=postgres", autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(str(name))))
