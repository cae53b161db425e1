"""W13 (pgdq 1.2): message history (dq_retain) under steady traffic, and the
cost of reading its stats.

- The soak: 30 minutes of steady offer + drain at 1,000 msgs/s on a queue
  keeping 10 minutes of history; per minute, the size on disk of the
  history (records and their indexes, tallies, deltas), how many records are
  kept, and dq_history_stats of the last hour (1-minute buckets), timed.
  Flat means: once the first 10 minutes have aged out, the size stops growing.
- The stats at 1,000 msgs/s: an hour of history written through the real
  path (send_many, poll_many, ack_many of 1,000 each, the clock pinned one
  second further each time), then dq_history_stats of that hour with
  1-minute and 1-second buckets, timed (median of 20).
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import common
import psycopg
from common import fresh_db
from pgdq import Client, Queue
from systems import QUEUE, System

SIZES = """
SELECT pg_table_size('dq_history') + pg_indexes_size('dq_history'),
       pg_total_relation_size('dq_history_tallies'),
       pg_total_relation_size('dq_history_deltas'),
       (SELECT count(*) FROM dq_history)
"""


def _producer(conninfo: str, rate: int, seconds: float, stop: Any) -> None:
    """Offer `rate` messages a second, due now, in 10 ms ticks."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        q = Queue(QUEUE, conn)
        per_tick, k, started = max(1, rate // 100), 0, time.perf_counter()
        while not stop.is_set() and time.perf_counter() - started < seconds:
            q.offer_many([(f"s{k + i}", {"n": k + i}) for i in range(per_tick)])
            k += per_tick
            time.sleep(max(0.0, started + k / rate - time.perf_counter()))


def _consumer(conninfo: str, acked: Any, stop: Any) -> None:
    """Lease and ack in batches of up to 100 until told to stop."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        q, client = Queue(QUEUE, conn), Client(conn)
        while not stop.is_set():
            batch = q.poll_many(100, timedelta(seconds=30))
            if not batch:
                time.sleep(0.005)
                continue
            done = client.ack_many([d.lock_token for d in batch])
            with acked.get_lock():
                acked.value += done


def _timed_stats(conn: psycopg.Connection[Any], since: datetime, bucket: str, calls: int) -> float:
    """Median milliseconds of dq_history_stats(QUEUE, since, bucket), client-side."""
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        conn.execute("SELECT * FROM dq_history_stats(%s, %s, %s::interval)", (QUEUE, since, bucket)).fetchall()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def soak(system: System) -> dict[str, float]:
    """The 30-minute soak at 1,000 msgs/s, keeping 10 minutes of history."""
    fresh = fresh_db(system)
    seconds, window = 1800 * common.SCALE, 60 * common.SCALE
    with psycopg.connect(fresh, autocommit=True) as conn:
        conn.execute("SELECT dq_retain(%s, %s::interval)", (QUEUE, timedelta(seconds=600 * common.SCALE)))
    ctx = mp.get_context("fork")
    stop, acked = ctx.Event(), ctx.Value("q", 0)
    procs = [ctx.Process(target=_producer, args=(fresh, 1000, seconds, stop))]
    procs += [ctx.Process(target=_consumer, args=(fresh, acked, stop)) for _ in range(2)]
    out: dict[str, float] = {}
    with psycopg.connect(fresh, autocommit=True) as conn:
        for p in procs:
            p.start()
        started, last = time.perf_counter(), 0
        for w in range(1, int(seconds / window) + 1):
            time.sleep(max(0.0, started + w * window - time.perf_counter()))
            history, tallies, deltas, records = conn.execute(SIZES).fetchone() or (0, 0, 0, 0)
            now_acked = acked.value
            out[f"W13 soak minute {w} msg/s"] = (now_acked - last) / window
            out[f"W13 soak minute {w} history MB"] = history / 2**20
            out[f"W13 soak minute {w} tallies+deltas MB"] = (tallies + deltas) / 2**20
            out[f"W13 soak minute {w} records"] = records
            out[f"W13 soak minute {w} stats ms"] = _timed_stats(
                conn, datetime.now(UTC) - timedelta(hours=1), "1 minute", 3
            )
            last = now_acked
        stop.set()
        for p in procs:
            p.join()
    return out


def hour_of_stats(system: System) -> dict[str, float]:
    """An hour of history at 1,000 msgs/s through the real path, then its stats timed."""
    fresh = fresh_db(system)
    base = datetime(2026, 1, 1, tzinfo=UTC)
    seconds = int(3600 * common.SCALE)
    with psycopg.connect(fresh, autocommit=True) as conn:
        # on the pinned clock from the start: a period set at today's time
        # would have aged out everything before its day (dq_retain)
        conn.execute("SELECT set_config('dq.now', %s, false)", (base.isoformat(),))
        conn.execute("SELECT dq_retain(%s, '100 days')", (QUEUE,))
        q = Queue(QUEUE, conn)
        started = time.perf_counter()
        for s in range(seconds):
            conn.execute("SELECT set_config('dq.now', %s, false)", ((base + timedelta(seconds=s)).isoformat(),))
            q.send_many([{"n": i} for i in range(1000)])
            q.ack_many([d.lock_token for d in q.poll_many(1000)])
        written = seconds * 1000 / (time.perf_counter() - started)
        conn.execute("SELECT set_config('dq.now', %s, false)", ((base + timedelta(seconds=seconds)).isoformat(),))
        since = base + timedelta(seconds=seconds) - timedelta(hours=1)
        return {
            "W13 hour of history: written msg/s (send, poll, ack 1,000 at a time)": written,
            "W13 dq_history_stats last hour, 1-minute buckets, ms": _timed_stats(conn, since, "1 minute", 20),
            "W13 dq_history_stats last hour, 1-second buckets, ms": _timed_stats(conn, since, "1 second", 20),
            "W13 dq_history_stats last hour, 1-hour bucket, ms": _timed_stats(conn, since, "1 hour", 20),
        }


def w13_history(system: System) -> dict[str, float]:
    """W13 (pgdq history): a 30-minute soak at 1,000 msgs/s keeping 10 minutes
    of history (size on disk per minute), and dq_history_stats over an hour
    of history at 1,000 msgs/s."""
    if system.name != "pgdq history":
        return {}
    return {**hour_of_stats(system), **soak(system)}
