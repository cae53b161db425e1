"""W8 (pgdq): channels and priority at scale.

- dq_poll and dq_poll_many(100) server time with 1,000,000 due messages in
  100 and in 10,000 channels, half of them limited (a quarter
  max_concurrency 2, a quarter min_interval 1 s), in steady state (after
  20,000 deliveries gave the channels their turns), each poll committed
  and its messages acked;
- drain throughput of 4 consumers (poll_many(100) + ack_many) of that queue
  against the same messages without channels;
- dq_poll with 10 priority levels over 1,000,000 future messages (none due,
  then 1,000 due);
- the LonnyMQ design written as plain SQL (bench/lonnymq.sql) against pgdq,
  both taking one message at a time with 4 consumers, at 10,000 channels.
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import time
from pathlib import Path
from typing import Any

import psycopg
from common import fresh_db, n, server_ms
from systems import System

LONNYMQ = Path(__file__).with_name("lonnymq.sql")
LIMITED = "CASE WHEN g %% 4 = 0 THEN 2 END", "CASE WHEN g %% 4 = 1 THEN interval '1 second' END"


def load_channels(conn: psycopg.Connection[Any], queue: str, channels: int, total: int) -> None:
    """total messages due now over channels channels, half of them limited."""
    conn.execute(
        f"SELECT count(dq_channel_set(%s, 'c' || g, {LIMITED[0]}, {LIMITED[1]}))"
        " FROM generate_series(0, %s - 1) AS g WHERE g %% 4 IN (0, 1)",
        (queue, channels),
    )
    load(conn, queue, total, f"'c' || (g %% {channels})", "0")


def load(conn: psycopg.Connection[Any], queue: str, total: int, channel: str, priority: str, at: str = "now()") -> None:
    """total messages offered in batches of 50,000, channel and priority SQL of g."""
    for first in range(0, total, 50_000):
        last = min(first + 50_000, total) - 1
        conn.execute(
            "SELECT count(*) FROM dq_offer_many(%s,"
            " ARRAY(SELECT 'k' || g FROM generate_series(%s, %s) AS g),"
            " ARRAY(SELECT jsonb_build_object('n', g) FROM generate_series(%s, %s) AS g),"
            f" ARRAY(SELECT {at} FROM generate_series(%s, %s) AS g), true,"
            f" ARRAY(SELECT ({channel})::text FROM generate_series(%s, %s) AS g),"
            f" ARRAY(SELECT ({priority})::integer FROM generate_series(%s, %s) AS g))",
            (queue, *(first, last) * 5),
        )
    conn.execute("VACUUM ANALYZE dq_messages")
    conn.execute("VACUUM ANALYZE dq_groups")


# A poll's server time, committed, its messages acked after the clock stops:
# a rolled-back poll (W5's way) would redo what the real ones did once, such
# as waking every channel whose min_interval had ended.
POLL_MS = """
CREATE OR REPLACE FUNCTION pg_temp.poll_ms(queue text, max_count integer) RETURNS float8
LANGUAGE plpgsql AS $$
DECLARE
    started timestamptz := clock_timestamp();
    tokens uuid[] := ARRAY(SELECT d.lock_token FROM dq_poll_many(queue, max_count) AS d);
    ms float8 := 1000 * extract(epoch FROM clock_timestamp() - started);
BEGIN
    PERFORM dq_ack_many(tokens);
    RETURN ms;
END $$
"""


def committed_ms(conn: psycopg.Connection[Any], queue: str, max_count: int, calls: int) -> tuple[float, float]:
    """Median and p99 server time of dq_poll_many(queue, max_count), each committed and acked."""
    conn.execute(POLL_MS)
    times = sorted(
        conn.execute("SELECT pg_temp.poll_ms(%s, %s)", (queue, max_count)).fetchone()[0] for _ in range(calls)
    )  # type: ignore[index]
    return statistics.median(times), times[int(len(times) * 0.99) - 1]


def deliver(conn: psycopg.Connection[Any], queue: str, count: int) -> None:
    """count deliveries, committed: poll 100, ack them."""
    done = 0
    while done < count:
        tokens = [r[0] for r in conn.execute("SELECT lock_token FROM dq_poll_many(%s, 100)", (queue,)).fetchall()]
        if not tokens:
            break
        conn.execute("SELECT dq_ack_many(%s::uuid[])", (tokens,))
        done += len(tokens)


def _consume(conninfo: str, kind: str, queue: str, total: int, counter: Any, barrier: Any) -> None:
    """One consumer process: take messages until the shared counter reaches total."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        barrier.wait()
        while counter.value < total:
            if kind == "batch":
                rows = conn.execute("SELECT lock_token FROM dq_poll_many(%s, 100)", (queue,)).fetchall()
                if rows:
                    conn.execute("SELECT dq_ack_many(%s::uuid[])", ([r[0] for r in rows],))
            elif kind == "single":
                rows = conn.execute("SELECT lock_token FROM dq_poll(%s)", (queue,)).fetchall()
                if rows:
                    conn.execute("SELECT dq_ack(%s)", (rows[0][0],))
            else:  # the LonnyMQ design
                rows = [r for r in conn.execute("SELECT lonny_dequeue('1 minute')").fetchall() if r[0] is not None]
                if rows:
                    conn.execute("SELECT lonny_ack(%s)", (rows[0][0],))
            if not rows:
                time.sleep(0.001)  # a limited channel's turn is not yet back
            with counter.get_lock():
                counter.value += len(rows)


def drain(conninfo: str, kind: str, queue: str, total: int, consumers: int = 4) -> float:
    """Messages a second of `consumers` processes taking total messages."""
    ctx = mp.get_context("fork")
    counter, barrier = ctx.Value("l", 0), ctx.Barrier(consumers + 1)
    procs = [
        ctx.Process(target=_consume, args=(conninfo, kind, queue, total, counter, barrier)) for _ in range(consumers)
    ]
    for p in procs:
        p.start()
    barrier.wait()
    started = time.perf_counter()
    for p in procs:
        p.join()
    return counter.value / (time.perf_counter() - started)


def w8_channels(system: System) -> dict[str, float]:
    """W8 (pgdq): channels and priority at scale (bench/channels.py)."""
    if system.name != "pgdq":
        return {}
    out: dict[str, float] = {}
    total = n(1_000_000)
    conninfo = fresh_db(system)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        for channels in (n(100), n(10_000)):
            queue = f"w8_{channels}"
            load_channels(conn, queue, channels, total)
            deliver(conn, queue, n(20_000))  # steady state: every channel has had turns
            for fn, max_count in (("dq_poll", 1), ("dq_poll_many(100)", 100)):
                med, p99 = committed_ms(conn, queue, max_count, n(1000))
                out[f"W8 {fn} {channels} channels p50 ms"], out[f"W8 {fn} {channels} channels p99 ms"] = med, p99
        load(conn, "w8_plain", total, "NULL", "NULL")
    out["W8 drain 4c, 10k channels msg/s"] = drain(conninfo, "batch", f"w8_{n(10_000)}", n(200_000))
    out["W8 drain 4c, same without channels msg/s"] = drain(conninfo, "batch", "w8_plain", n(200_000))
    out["W8 drain with / without channels ratio"] = (
        out["W8 drain 4c, 10k channels msg/s"] / out["W8 drain 4c, same without channels msg/s"]
    )
    out.update(priorities(conninfo, total))
    out.update(lonnymq(system, conninfo))
    return out


def priorities(conninfo: str, total: int) -> dict[str, float]:
    """dq_poll of an unchanneled queue with 10 priority levels over total future messages."""
    out = {}
    with psycopg.connect(conninfo, autocommit=True) as conn:
        load(conn, "w8_prio", total, "NULL", "g %% 10", at="now() + interval '1 day' + g * interval '1 ms'")
        poll = "SELECT * FROM dq_poll('w8_prio')"
        # Right after the drains' deletes, autovacuum may be at work on the
        # same cores: measured as it comes, then again once VACUUM is done.
        out["W8 autovacuum workers busy before the 10-priority polls"] = conn.execute(
            "SELECT count(*) FROM pg_stat_progress_vacuum"
        ).fetchone()[0]  # type: ignore[index]
        (
            out["W8 dq_poll 10 priorities, 1M future, none due p50 ms"],
            out["W8 dq_poll 10 priorities, 1M future, none due p99 ms"],
        ) = server_ms(conn, poll, n(1000))
        conn.execute("VACUUM dq_messages")
        (
            out["W8 dq_poll 10 priorities, 1M future, none due, after VACUUM p50 ms"],
            out["W8 dq_poll 10 priorities, 1M future, none due, after VACUUM p99 ms"],
        ) = server_ms(conn, poll, n(1000))
        conn.execute(
            "SELECT count(*) FROM dq_offer_many('w8_prio',"
            " ARRAY(SELECT 'due' || g FROM generate_series(1, 1000) g), array_fill('{}'::jsonb, ARRAY[1000]),"
            " NULL, true, NULL, ARRAY(SELECT g % 10 FROM generate_series(1, 1000) g))"
        )
        (
            out["W8 dq_poll 10 priorities, 1M future, 1k due p50 ms"],
            out["W8 dq_poll 10 priorities, 1M future, 1k due p99 ms"],
        ) = server_ms(conn, poll, n(1000))
    return out


def lonnymq(system: System, pgdq_conninfo: str) -> dict[str, float]:
    """The LonnyMQ design beside pgdq: 10,000 channels, one message at a time, 4 consumers."""
    channels, per = n(10_000), 100
    conninfo = fresh_db(type("Lonny", (System,), {"name": "lonnymq", "setup": lambda self, c: None})())
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(LONNYMQ.read_text())
        conn.execute(
            "INSERT INTO lonny_channels (name, max_concurrency, release_interval)"
            f" SELECT 'c' || g, {LIMITED[0]}, {LIMITED[1]} FROM generate_series(0, %s - 1) AS g",
            (channels,),
        )
        for first in range(0, channels * per, 50_000):
            conn.execute(
                "SELECT lonny_enqueue(ARRAY(SELECT 'c' || (g %% %s) FROM generate_series(%s, %s) g),"
                " ARRAY(SELECT jsonb_build_object('n', g) FROM generate_series(%s, %s) g))",
                (
                    channels,
                    first,
                    min(first + 50_000, channels * per) - 1,
                    first,
                    min(first + 50_000, channels * per) - 1,
                ),
            )
        conn.execute("VACUUM ANALYZE lonny_messages")
        conn.execute("VACUUM ANALYZE lonny_channels")
        med, p99 = server_ms(conn, "SELECT lonny_dequeue('1 minute')", n(1000))
    with psycopg.connect(pgdq_conninfo, autocommit=True) as conn:
        load_channels(conn, "w8_single", channels, channels * per)
        pmed, pp99 = server_ms(conn, "SELECT * FROM dq_poll('w8_single')", n(1000))
    return {
        "W8 LonnyMQ design: dequeue, 10k channels p50 ms": med,
        "W8 LonnyMQ design: dequeue, 10k channels p99 ms": p99,
        "W8 pgdq: dq_poll, same channels, never leased p50 ms": pmed,
        "W8 pgdq: dq_poll, same channels, never leased p99 ms": pp99,
        "W8 LonnyMQ design: dequeue + ack 4c msg/s": drain(conninfo, "lonny", "", n(50_000)),
        "W8 pgdq: poll + ack 4c, same channels msg/s": drain(pgdq_conninfo, "single", "w8_single", n(50_000)),
    }
