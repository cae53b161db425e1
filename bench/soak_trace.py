"""W6 under a magnifying glass (issue 28): the soak's load, traced every second.

Runs bench.py's W6 load (2,000 msg/s offered in batches of 20 every 10 ms,
two consumers with poll_many(100) + ack_many, 30 s lease) for --minutes
against the cluster in the PG* environment, and writes one CSV row a second:
offered and acked msg/s, the worst offer call of that second, the client
backends' wait events (sampled every 50 ms: samples per event), the
checkpointer's and autovacuum's state, pg_stat_bgwriter, pg_stat_wal and
dq_messages' size. A CHECKPOINT at the start (unless --after-w5) puts the
checkpoints at known places. --vacuum-off S holds autovacuum of dq_messages off
for S seconds and, if the server preloads pg_stat_statements, writes the
costliest statements before and after into CSV.statements. Set log_checkpoints
and log_autovacuum_min_duration = 0 (and track_wal_io_timing, for the fsync
times) and read server.log beside the trace. Results: bench/RESULTS.md, "W6:
the stall every five minutes, explained".

    scripts/pgcluster.sh start soak; eval "$(scripts/pgcluster.sh env soak)"
    .venv/bin/python bench/soak_trace.py --minutes 11 --out /tmp/soak.csv
    .venv/bin/python bench/soak_trace.py --summary /tmp/soak.csv
"""

from __future__ import annotations

import argparse
import csv
import multiprocessing as mp
import os
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from common import fresh_db
from pgdq import Queue
from systems import QUEUE, SYSTEMS

from bench import _soak_consumer

RATE = 2000


def _producer(conninfo: str, seconds: float, stop: Any, offered: Any, worst_us: Any) -> None:
    """bench._soak_producer, counting what it offered and its slowest call."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        q = Queue(QUEUE, conn)
        per_tick, k, started = RATE // 100, 0, time.perf_counter()
        while not stop.is_set() and time.perf_counter() - started < seconds:
            t0 = time.perf_counter()
            q.offer_many([(f"s{k + i}", {"n": k + i}) for i in range(per_tick)])
            took = int((time.perf_counter() - t0) * 1e6)
            with offered.get_lock():
                offered.value += per_tick
            with worst_us.get_lock():
                worst_us.value = max(worst_us.value, took)
            k += per_tick
            time.sleep(max(0.0, started + k / RATE - time.perf_counter()))


WAIT_SQL = """SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU')
                FROM pg_stat_activity
               WHERE backend_type = 'client backend' AND datname = current_database()
                 AND pid <> pg_backend_pid() AND state = 'active'"""
STATE_SQL = """SELECT
  (SELECT coalesce(wait_event, '-') FROM pg_stat_activity WHERE backend_type = 'checkpointer'),
  (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'),
  (SELECT string_agg(p.phase, ',') FROM pg_stat_progress_vacuum p
     WHERE p.relid = 'dq_messages'::regclass),
  b.checkpoints_timed, b.checkpoints_req, b.buffers_checkpoint, b.buffers_clean,
  b.buffers_backend, b.buffers_backend_fsync, b.checkpoint_write_time, b.checkpoint_sync_time,
  w.wal_records, w.wal_fpi, w.wal_bytes, w.wal_buffers_full, w.wal_write, w.wal_sync,
  w.wal_write_time, w.wal_sync_time,
  pg_table_size('dq_messages'), pg_indexes_size('dq_messages'),
  (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'dq_messages'::regclass),
  (SELECT count(*) FROM dq_messages)
  FROM pg_stat_bgwriter b, pg_stat_wal w"""
STATE_COLS = [
    "checkpointer",
    "autovacuum_workers",
    "vacuum_dq_messages",
    "checkpoints_timed",
    "checkpoints_req",
    "buffers_checkpoint",
    "buffers_clean",
    "buffers_backend",
    "buffers_backend_fsync",
    "checkpoint_write_ms",
    "checkpoint_sync_ms",
    "wal_records",
    "wal_fpi",
    "wal_bytes",
    "wal_buffers_full",
    "wal_write",
    "wal_sync",
    "wal_write_ms",
    "wal_sync_ms",
    "table_bytes",
    "index_bytes",
    "dead_tuples",
    "rows",
]
# the counters, shown per second (the rest are states and sizes)
DELTAS = set(STATE_COLS[STATE_COLS.index("buffers_checkpoint") : STATE_COLS.index("table_bytes")])


def _waits(conninfo: str, stop: threading.Event, into: Counter[str], lock: threading.Lock) -> None:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        while not stop.is_set():
            rows = conn.execute(WAIT_SQL).fetchall()
            with lock:
                into["samples"] += 1
                for (event,) in rows:
                    into[event] += 1
            time.sleep(0.05)


def w5_load(messages: int) -> None:
    """What W5 leaves behind in bench_pgdq before W6 drops it: `messages` future messages."""
    with psycopg.connect(fresh_db(SYSTEMS["pgdq"]), autocommit=True) as conn:
        q, future, loaded = Queue(QUEUE, conn), datetime.now(UTC) + timedelta(days=1), 0
        while loaded < messages:
            size = min(50_000, messages - loaded)
            q.offer_many([(f"f{loaded + i}", i, future + timedelta(seconds=loaded + i)) for i in range(size)])
            loaded += size
        conn.execute("VACUUM ANALYZE dq_messages")


def _top_statements(conn: psycopg.Connection[Any], out: str, label: str) -> None:
    """pg_stat_statements' costliest statements so far (if loaded), into out + '.statements'; then reset."""
    if not conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements'").fetchone():
        return
    rows = conn.execute(
        """SELECT calls, round(total_exec_time::numeric, 1), round(mean_exec_time::numeric, 3),
                  shared_blks_hit, left(regexp_replace(query, '\\s+', ' ', 'g'), 120)
             FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
            ORDER BY total_exec_time DESC LIMIT 10"""
    ).fetchall()
    with open(out + ".statements", "a") as f:
        print(f"## {label}", file=f)
        for r in rows:
            print(" | ".join(str(x) for x in r), file=f)
    conn.execute("SELECT pg_stat_statements_reset()")


def trace(minutes: float, out: str, checkpoint: bool, vacuum_off: int = 0) -> None:
    fresh = fresh_db(SYSTEMS["pgdq"])
    if vacuum_off:  # what a late first autovacuum does: none for that long
        with psycopg.connect(fresh, autocommit=True) as conn:
            conn.execute("ALTER TABLE dq_messages SET (autovacuum_enabled = off)")
            if conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_stat_statements'").fetchone():
                if "pg_stat_statements" in str(conn.execute("SHOW shared_preload_libraries").fetchone()):
                    conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                    conn.execute("SELECT pg_stat_statements_reset()")
    seconds = minutes * 60
    ctx = mp.get_context("fork")
    stop, acked, offered, worst = ctx.Event(), ctx.Value("q", 0), ctx.Value("q", 0), ctx.Value("q", 0)
    procs = [ctx.Process(target=_producer, args=(fresh, seconds, stop, offered, worst))]
    procs += [ctx.Process(target=_soak_consumer, args=(fresh, acked, stop)) for _ in range(2)]
    waits: Counter[str] = Counter()
    lock, wstop = threading.Lock(), threading.Event()
    with psycopg.connect(fresh, autocommit=True) as conn:
        if checkpoint:
            conn.execute("CHECKPOINT")  # the next ones then come about every 5 minutes from here
        prev = dict(zip(STATE_COLS, conn.execute(STATE_SQL).fetchone() or (), strict=True))
        for p in procs:
            p.start()
        sampler = threading.Thread(target=_waits, args=(fresh, wstop, waits, lock), daemon=True)
        sampler.start()
        started, last_acked, last_offered = time.perf_counter(), 0, 0
        with open(out, "w", newline="") as f:
            w = csv.writer(f)
            header: list[str] | None = None
            for s in range(1, int(seconds) + 3):
                time.sleep(max(0.0, started + s - time.perf_counter()))
                if vacuum_off and s == vacuum_off:
                    _top_statements(conn, out, f"the first {s} s, no autovacuum")
                    conn.execute("ALTER TABLE dq_messages RESET (autovacuum_enabled)")
                state = dict(zip(STATE_COLS, conn.execute(STATE_SQL).fetchone() or (), strict=True))
                with lock:
                    snap = dict(waits)
                    waits.clear()
                a, o = acked.value, offered.value
                with worst.get_lock():
                    worst_ms, worst.value = worst.value / 1000, 0
                load1 = os.getloadavg()[0]
                row: dict[str, Any] = {
                    "t": s,
                    "offered": o - last_offered,
                    "acked": a - last_acked,
                    "backlog": o - a,
                    "worst_offer_ms": round(worst_ms, 1),
                    "load1": load1,
                }
                for c in STATE_COLS:
                    row[c] = state[c] - prev[c] if c in DELTAS else state[c]
                n = max(1, snap.pop("samples", 0))
                row["wait_samples"] = n
                row["waits"] = " ".join(f"{k}={v}" for k, v in sorted(snap.items(), key=lambda kv: -kv[1]))
                if header is None:
                    header = list(row)
                    w.writerow(header)
                w.writerow([row[h] for h in header])
                f.flush()
                prev, last_acked, last_offered = state, a, o
        if vacuum_off:
            _top_statements(conn, out, f"from {vacuum_off} s to the end, autovacuum on")
        stop.set()
        wstop.set()
        for p in procs:
            p.join()


def summary(path: str, every: int) -> None:
    """Per-`every`-second windows: msg/s, waits, checkpointer, vacuum, FPIs, WAL syncs."""
    with open(path) as f:
        rows = list(csv.DictReader(f))
    print(
        "| t (s) | offered/s | acked/s | max backlog | worst offer ms | backends on CPU | waiting on WAL"
        " | checkpointer | vacuum | FPI | WAL MB/s | WAL fsyncs/s | ms per fsync | MB | load |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for i in range(0, len(rows), every):
        chunk = rows[i : i + every]
        total = Counter[str]()
        samples = 0
        for r in chunk:
            samples += int(r["wait_samples"])
            for kv in r["waits"].split():
                k, v = kv.rsplit("=", 1)
                total[k] += int(v)
        ln = len(chunk)
        walwait = sum(v for k, v in total.items() if k.startswith(("IO:WAL", "LWLock:WAL")))
        ckpt = "writing" if any(r["checkpointer"] != "CheckpointerMain" for r in chunk) else "idle"
        vac = ",".join(sorted({r["vacuum_dq_messages"] for r in chunk if r["vacuum_dq_messages"]})) or "-"

        def s(c: str, chunk: list[dict[str, str]] = chunk) -> float:
            return sum(float(r[c]) for r in chunk)

        mb = (int(chunk[-1]["table_bytes"]) + int(chunk[-1]["index_bytes"])) / 2**20
        print(
            f"| {chunk[0]['t']}–{chunk[-1]['t']} | {s('offered') / ln:,.0f} | {s('acked') / ln:,.0f} |"
            f" {max(int(r['backlog']) for r in chunk)} | {max(float(r['worst_offer_ms']) for r in chunk):.0f} |"
            f" {total['CPU'] / samples:.2f} | {walwait / samples:.2f} | {ckpt} | {vac} | {s('wal_fpi'):,.0f} |"
            f" {s('wal_bytes') / ln / 2**20:.2f} | {s('wal_sync') / ln:.0f} |"
            f" {s('wal_sync_ms') / max(1, s('wal_sync')):.2f} |"
            f" {mb:.1f} | {float(chunk[-1]['load1']):.2f} |"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=11)
    ap.add_argument("--out", default="soak_trace.csv")
    ap.add_argument(
        "--after-w5",
        type=int,
        default=0,
        metavar="N",
        help="first load N future messages as W5 does (bench's order), no CHECKPOINT at the start",
    )
    ap.add_argument(
        "--vacuum-off",
        type=int,
        default=0,
        metavar="S",
        help="no autovacuum of dq_messages for the first S seconds (a late first visit)",
    )
    ap.add_argument("--summary", metavar="CSV", help="print a per-window table of a trace and exit")
    ap.add_argument("--every", type=int, default=10, help="window of --summary, seconds")
    args = ap.parse_args()
    if args.summary:
        summary(args.summary, args.every)
        return 0
    if args.after_w5:
        w5_load(args.after_w5)
    trace(args.minutes, args.out, checkpoint=not args.after_w5, vacuum_off=args.vacuum_off)
    return 0


if __name__ == "__main__":
    sys.exit(main())
