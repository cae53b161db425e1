"""`make bench`: each system in its own fresh database on one throwaway server
(fsync and synchronous_commit on), the same workloads through each public
API, results as ratios against the raw-SQL row. Prints a markdown table and
writes bench/results/<time>.json.

    python bench/bench.py [--systems pgdq,"raw SQL"] [--workloads W1,W2,...] [--repeat 3] [--quick]
                          [--stats-messages 10000000]

W1-W3 run --repeat times per system, the systems taking turns, and the table
shows the median: the machine (README, "Numbers": 2 shared vCPU) is shared, and a single run moves by
10-20 %.

--quick (`make bench-quick`, a few minutes): the ratios a change to pgdq's
hot path moves, pgdq's rows (Queue and SQL, keyed and keyless) against their
raw-SQL ceilings, on W1-W3 at a quarter of their counts, still --repeat
times interleaved; --workloads and --systems choose others (at a tenth of
their counts beyond W1-W3).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import queue
import statistics
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import common
import psycopg
import stats_cost
from channels import w8_channels
from common import fresh_db, n, server_ms
from history_cost import w13_history
from over_http import w9_http
from pgdq import AsyncDelivery, Client, Queue, Worker
from rich.console import Console
from stats_cost import w11_stats
from systems import QUEUE, ROUTED, SYSTEMS, System, lateness_times
from upgrade_lock import w12_upgrade

ROOT = Path(__file__).resolve().parent.parent
console = Console(stderr=True)


def _client(target: Callable[..., Any], args: tuple[Any, ...], barrier: Any, out: Any) -> None:
    """One client process: open the system's client, wait for the others, run, report."""
    conninfo, system_name, *rest = args
    system = KNOWN[system_name]
    native = getattr(system, "native", None)
    if native is not None:  # a client in another language runs the whole body
        barrier.wait()
        out.put(native(target.__name__, conninfo, tuple(rest)))
        return

    async def go() -> None:
        handle = await system.open(conninfo)
        barrier.wait()
        started = time.perf_counter()
        done = await target(system, handle, *rest)
        out.put((done, started, time.perf_counter()))
        await system.close(handle)

    asyncio.run(go())


def run_clients(clients: int, target: Callable[..., Any], *args: Any) -> tuple[int, float]:
    """Run target(system, handle, *args[2:], i) in `clients` processes started
    together: (items done, wall seconds from the first start to the last end)."""
    ctx = mp.get_context("fork")
    barrier, out = ctx.Barrier(clients), ctx.Queue()
    procs = [ctx.Process(target=_client, args=(target, (*args, i), barrier, out)) for i in range(clients)]
    for p in procs:
        p.start()
    results: list[Any] = []
    while len(results) < len(procs):
        try:
            results.append(out.get(timeout=1))
        except queue.Empty:
            if failed := [p.exitcode for p in procs if p.exitcode not in (None, 0)]:
                raise RuntimeError(f"a bench client exited with {failed[0]} (its traceback is above)") from None
    for p in procs:
        p.join()
    done = sum(r[0] for r in results)
    return done, max(r[2] for r in results) - min(r[1] for r in results)


# --- client bodies (module level: they run in forked processes) -------------


async def enqueue_part(system: System, h: Any, total: int, batch: int, clients: int, i: int) -> int:
    keys = [f"k{k}" for k in range(i, total, clients)]
    for start in range(0, len(keys), batch):
        chunk = keys[start : start + batch]
        await system.enqueue_batch(h, chunk, [{"n": k} for k in range(len(chunk))])
    return len(keys)


DRAIN_SECONDS = 60.0  # every drain stops after this; the rate counts what it did


async def drain_batches(system: System, h: Any, batch: int, i: int) -> int:
    done = 0
    deadline = time.perf_counter() + DRAIN_SECONDS
    while time.perf_counter() < deadline and (tokens := await system.poll_batch(h, batch)):
        await system.ack_batch(h, tokens)
        done += len(tokens)
    return done


async def drain_acking_on_poll(system: System, h: Any, batch: int, i: int) -> int:
    """Like drain_batches, but each poll acks the previous batch (one round trip per batch)."""
    done, tokens = 0, []
    deadline = time.perf_counter() + DRAIN_SECONDS
    while time.perf_counter() < deadline and (tokens := await system.ack_poll_batch(h, tokens, batch)):
        done += len(tokens)
    return done


async def offer_singles(system: System, h: Any, total: int, clients: int, i: int) -> int:
    count = 0
    for k in range(i, total, clients):
        await system.offer_one(h, f"s{k}", {"n": k})
        count += 1
    return count


async def drain_singles(system: System, h: Any, i: int) -> int:
    done = 0
    deadline = time.perf_counter() + DRAIN_SECONDS
    while time.perf_counter() < deadline and (token := await system.poll_one(h)) is not None:
        await system.ack_one(h, token)
        done += 1
    return done


# --- workloads --------------------------------------------------------------


# the rows of pgdq's own SQL that W4-W6 measure (with the Python Queue)
PGDQ_VERSIONS = ("pgdq", "pgdq 1.1.0", "pgdq before channels")


def w1_enqueue(system: System) -> dict[str, float]:
    """W1: 100,000 messages due now in batches of 1,000, by 1 and by 2 clients."""
    out = {}
    for clients in (1, 2):
        fresh = fresh_db(system)
        done, wall = run_clients(clients, enqueue_part, fresh, system.name, n(100_000), 1000, clients)
        out[f"W1 enqueue {clients}c msg/s"] = done / wall
    return out


def w2_drain(system: System) -> dict[str, float]:
    """W2: 100,000 due messages drained by 2 batch consumers (poll 500 + ack;
    one job per fetch where the system has no batch fetch)."""
    fresh = fresh_db(system)
    run_clients(2, enqueue_part, fresh, system.name, n(100_000), 1000, 2)
    done, wall = run_clients(2, drain_batches, fresh, system.name, 500)
    out = {"W2 drain 2c msg/s": done / wall}
    if hasattr(system, "ack_poll_batch"):  # the same drain, acks riding on the next poll
        fresh = fresh_db(system)
        run_clients(2, enqueue_part, fresh, system.name, n(100_000), 1000, 2)
        done, wall = run_clients(2, drain_acking_on_poll, fresh, system.name, 500)
        out["W2 drain 2c, acks on next poll msg/s"] = done / wall
    return out


def w3_single(system: System) -> dict[str, float]:
    """W3: 10,000 single offers from 4 clients, then 4 consumers poll + ack each."""
    fresh = fresh_db(system)
    done, wall = run_clients(4, offer_singles, fresh, system.name, n(10_000), 4)
    offered = done / wall
    done, wall = run_clients(4, drain_singles, fresh, system.name)
    out = {"W3 offer 4c msg/s": offered, "W3 poll+ack 4c msg/s": done / wall}
    if hasattr(system, "ack_poll_batch"):  # one message per poll, its ack riding on the next
        run_clients(4, offer_singles, fresh, system.name, n(10_000), 4)
        done, wall = run_clients(4, drain_acking_on_poll, fresh, system.name, 1)
        out["W3 poll+ack 4c, ack on next poll msg/s"] = done / wall
    return out


def w4_lateness(system: System) -> dict[str, float]:
    """W4: 2,000 messages at distinct times over 10 s to idle consumers; lateness
    = start of processing - scheduled time. pgdq: its Worker (wakes on
    dq_wakeup, sleeps until dq_next_due); the peers: their own workers with
    their default settings."""
    native = getattr(system, "lateness", None)
    if native is not None:
        return _lateness_summary(native(fresh_db(system), n(2000)))
    if system.name not in PGDQ_VERSIONS:
        return {}
    fresh = fresh_db(system)
    total = n(2000)
    late: list[float] = []

    def handler(d: AsyncDelivery) -> None:
        late.append((datetime.now(UTC) - d.scheduled_at).total_seconds() * 1000)

    worker = Worker(QUEUE, handler, dsn=fresh, concurrency=8)
    thread = threading.Thread(target=asyncio.run, args=(worker.run_async(),))
    thread.start()
    time.sleep(0.5)  # the worker idles first
    with psycopg.connect(fresh, autocommit=True) as conn:
        row = conn.execute("SELECT clock_timestamp()").fetchone()
        assert row is not None
        Queue(QUEUE, conn).offer_many([(f"t{i}", i, row[0] + after) for i, after in enumerate(lateness_times(total))])
    deadline = time.monotonic() + 40
    while len(late) < total and time.monotonic() < deadline:
        time.sleep(0.2)
    worker.stop()
    thread.join()
    return _lateness_summary(late)


def _lateness_summary(lateness_ms: list[float]) -> dict[str, float]:
    """p50 / p99 / max of lateness in milliseconds."""
    ms = sorted(lateness_ms)
    if not ms:
        return {}
    return {
        "W4 lateness p50 ms": statistics.median(ms),
        "W4 lateness p99 ms": ms[int(len(ms) * 0.99) - 1],
        "W4 lateness max ms": ms[-1],
    }


def w5_depth(system: System) -> dict[str, float]:
    """W5 (pgdq): server time of dq_poll, dq_poll_many(100), dq_next_due with
    10,000 and 1,000,000 future messages, with 1,000 due and with none."""
    if system.name not in PGDQ_VERSIONS:
        return {}
    fresh = fresh_db(system)
    out = {}
    with psycopg.connect(fresh, autocommit=True) as conn:
        q = Queue(QUEUE, conn)
        future = datetime.now(UTC) + timedelta(days=1)
        loaded = 0
        for depth in (n(10_000), n(1_000_000)):
            while loaded < depth:
                size = min(50_000, depth - loaded)
                q.offer_many([(f"f{loaded + i}", i, future + timedelta(seconds=loaded + i)) for i in range(size)])
                loaded += size
            conn.execute("VACUUM ANALYZE dq_messages")
            label = f"{depth // 1000}k"
            for due_label, due in (("none due", 0), ("1k due", 1000)):
                if due:
                    q.offer_many([(f"d{depth}-{i}", i, datetime(2020, 1, 1, tzinfo=UTC)) for i in range(due)])
                    conn.execute("VACUUM ANALYZE dq_messages")
                for fn, stmt in (
                    ("dq_poll", f"SELECT * FROM dq_poll('{QUEUE}')"),
                    ("dq_poll_many(100)", f"SELECT * FROM dq_poll_many('{QUEUE}', 100)"),
                    ("dq_next_due", f"SELECT dq_next_due('{QUEUE}')"),
                ):
                    med, p99 = server_ms(conn, stmt, n(1000))
                    out[f"W5 {fn} {label} {due_label} p50 ms"] = med
                    out[f"W5 {fn} {label} {due_label} p99 ms"] = p99
                conn.execute("DELETE FROM dq_messages WHERE key LIKE 'd%'")
        out.update(_schedule_cost(conn, f"{loaded // 1000}k"))
    return out


def _schedule_cost(conn: psycopg.Connection[Any], depth: str) -> dict[str, float]:
    """W5: what schedules kept by the database add to a poll: 100 schedules
    not due; then one occurrence due (the poll turns it into a message)."""
    out = {}
    poll = f"SELECT * FROM dq_poll('{QUEUE}')"
    conn.execute("SELECT dq_schedule_set(%s, 'yearly' || g, '0 0 1 1 *') FROM generate_series(1, 100) AS g", (QUEUE,))
    label = f"W5 dq_poll {depth} none due, 100 schedules"
    out[f"{label} p50 ms"], out[f"{label} p99 ms"] = server_ms(conn, poll, n(1000))
    conn.execute("SELECT dq_schedule_set(%s, 'every-second', '* * * * * *')", (QUEUE,))
    time.sleep(1.1)  # due now; each measured poll is rolled back, so it stays due
    out["W5 dq_poll, a schedule occurrence due p50 ms"], out["W5 dq_poll, a schedule occurrence due p99 ms"] = (
        server_ms(conn, poll, n(1000))
    )
    return out


def _soak_producer(conninfo: str, rate: int, seconds: float, stop: Any) -> None:
    """Offer `rate` messages a second, due now, in 10 ms ticks."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        q = Queue(QUEUE, conn)
        per_tick, k, started = max(1, rate // 100), 0, time.perf_counter()
        while not stop.is_set() and time.perf_counter() - started < seconds:
            q.offer_many([(f"s{k + i}", {"n": k + i}) for i in range(per_tick)])
            k += per_tick
            time.sleep(max(0.0, started + k / rate - time.perf_counter()))


def _soak_consumer(conninfo: str, acked: Any, stop: Any) -> None:
    """Lease and ack in batches until told to stop (acks through a Client: a
    Queue's token calls need 1.2.0 SQL, and the soak also runs older SQL)."""
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


def w6_soak(system: System) -> dict[str, float]:
    """W6 (pgdq): 5 minutes of steady offer + drain at 2,000 msgs/s; throughput
    per 30 s window and table + index size at the start and the end."""
    if system.name not in PGDQ_VERSIONS:
        return {}
    fresh = fresh_db(system)
    seconds, window = 300 * common.SCALE, 30 * common.SCALE
    ctx = mp.get_context("fork")
    stop, acked = ctx.Event(), ctx.Value("q", 0)
    procs = [ctx.Process(target=_soak_producer, args=(fresh, 2000, seconds, stop))]
    procs += [ctx.Process(target=_soak_consumer, args=(fresh, acked, stop)) for _ in range(2)]
    size_sql = (
        "SELECT pg_table_size('dq_messages'), pg_indexes_size('dq_messages'),"
        " (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'dq_messages')"
    )
    out: dict[str, float] = {}
    with psycopg.connect(fresh, autocommit=True) as conn:
        for p in procs:
            p.start()
        started, last = time.perf_counter(), 0
        for w in range(1, int(seconds / window) + 1):
            time.sleep(max(0.0, started + w * window - time.perf_counter()))
            row = conn.execute(size_sql).fetchone()
            assert row is not None
            now_acked = acked.value
            out[f"W6 window {w} msg/s"] = (now_acked - last) / window
            out[f"W6 window {w} table+indexes MB"] = (row[0] + row[1]) / 2**20
            out[f"W6 window {w} dead tuples"] = row[2] or 0
            last = now_acked
        stop.set()
        for p in procs:
            p.join()
    return out


def w7_spark(system: System) -> dict[str, float]:
    """W7 (pgdq): 1,000,000 rows offered by offer_dataframe on local[2] and by
    one Python process with offer_many, both in chunks of 10,000."""
    if system.name != "pgdq":
        return {}
    from pgdq.spark import offer_dataframe
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F  # noqa: N812

    total, chunk = n(1_000_000), 10_000
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    rows = spark.range(total, numPartitions=2).select(
        F.concat(F.lit("u"), F.col("id").cast("string")).alias("key"),
        F.struct(F.col("id").alias("user"), F.lit("hello").alias("text")).alias("payload"),
    )
    fresh = fresh_db(system)
    started = time.perf_counter()
    summary = offer_dataframe(rows, fresh, QUEUE, batch_size=chunk)
    spark_rate = summary.created / (time.perf_counter() - started)
    spark.stop()

    fresh = fresh_db(system)
    with psycopg.connect(fresh, autocommit=True) as conn:
        q = Queue(QUEUE, conn)
        started = time.perf_counter()
        for start in range(0, total, chunk):
            q.offer_many([(f"u{i}", {"user": i, "text": "hello"}) for i in range(start, min(start + chunk, total))])
        single_rate = total / (time.perf_counter() - started)
    return {
        "W7 offer_dataframe local[2] rows/s": spark_rate,
        "W7 one process offer_many rows/s": single_rate,
        "W7 Spark / one process": spark_rate / single_rate,
    }


WORKLOADS = {
    "W1": w1_enqueue,
    "W2": w2_drain,
    "W3": w3_single,
    "W4": w4_lateness,
    "W5": w5_depth,
    "W6": w6_soak,
    "W7": w7_spark,
    "W8": w8_channels,
    "W9": w9_http,
    "W11": w11_stats,
    "W12": w12_upgrade,
    "W13": w13_history,
}


REPEATED = ("W1", "W2", "W3")  # short throughput runs: repeated, interleaved, median kept
# --quick: pgdq's ways of calling it against their raw-SQL ceilings (RATIOS), on W1-W3
QUICK_SYSTEMS = ("raw SQL", "pgdq", "pgdq SQL", "raw SQL keyless", "pgdq keyless", "pgdq SQL keyless")
QUICK_SCALE = {w: 0.25 for w in REPEATED}  # W1-W3's counts in a quick run; other workloads a tenth
KNOWN = {**SYSTEMS, **ROUTED}  # every system a --systems may name; by default SYSTEMS run
# W10, the hop through a pgdq.shard router: W1-W3, direct and through routers over 1, 2 and 4 partitions
W10 = ("W1,W2,W3", ",".join(["pgdq", *ROUTED]))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--systems", help=f"default: {', '.join(SYSTEMS)}; --quick: {', '.join(QUICK_SYSTEMS)}")
    parser.add_argument("--workloads", help="W1,W2,... (default: all; --quick: W1-W3); W10 alone: W1-W3 via routers")
    parser.add_argument("--repeat", type=int, default=3, help="runs of W1-W3 per system, interleaved (median kept)")
    parser.add_argument(
        "--quick", action="store_true", help="a few minutes: pgdq against raw SQL on W1-W3 at a quarter of their counts"
    )
    parser.add_argument(
        "--stats-messages", type=int, help="W11: messages for the overview (default 10,000,000; --quick a tenth)"
    )
    args = parser.parse_args()
    stats_cost.STATS_MESSAGES = args.stats_messages
    args.systems = args.systems or ",".join(QUICK_SYSTEMS if args.quick else SYSTEMS)
    args.workloads = args.workloads or ",".join(REPEATED if args.quick else WORKLOADS)
    if args.workloads == "W10":
        args.workloads, args.systems = W10
    names = [name for name in args.systems.split(",") if runnable(KNOWN[name])]
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in names}
    for w in args.workloads.split(","):
        common.SCALE = QUICK_SCALE.get(w, 0.1) if args.quick else 1.0
        runs = args.repeat if w in REPEATED else 1
        for run in range(1, runs + 1):
            # systems take turns, so a noisy minute on this shared machine hits them all
            for name in names:
                title = WORKLOADS[w].__doc__.splitlines()[0]  # type: ignore[union-attr]
                console.print(f"[bold]{name}[/] (run {run}/{runs}): {title}")
                for measure, value in WORKLOADS[w](KNOWN[name]).items():
                    samples[name].setdefault(measure, []).append(value)
    results = {name: {m: statistics.median(v) for m, v in got.items()} for name, got in samples.items()}
    print(render(results))
    out = ROOT / "bench/results"
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    scale = {w: QUICK_SCALE.get(w, 0.1) if args.quick else 1.0 for w in args.workloads.split(",")}
    record = {"at": stamp, "scale": scale, "repeat": args.repeat, "results": results, "samples": samples}
    (out / f"{stamp}.json").write_text(json.dumps(record, indent=2))
    console.print(f"wrote bench/results/{stamp}.json")
    return 0


def runnable(system: System) -> bool:
    """Whether system can run here; says why not when it cannot."""
    reason = getattr(system, "available", lambda: None)()
    if reason:
        console.print(f"[yellow]{reason}[/]")
    return not reason


def fmt(measure: str, value: float | None) -> str:
    """A cell: milliseconds with 3 decimals, rates as whole numbers."""
    if value is None:
        return "—"
    if measure.endswith(("/ one process", " ratio")):
        return f"{value:.2f}"
    return f"{value:,.3f}" if measure.endswith((" ms", " MB", " s")) else f"{value:,.0f}"


# each way of calling pgdq, keyed and keyless, and what it is measured against
RATIOS = (
    *(("pgdq", base) for base in ("raw SQL", "PGMQ", "pgdq 1.1.0", "pgdq before channels")),
    *(("pgdq SQL", base) for base in ("raw SQL", "PGMQ", "pgdq before channels", "pgdq SQL by triggers")),
    *(("pgdq keyless", base) for base in ("raw SQL keyless", "PGMQ")),
    *(("pgdq SQL keyless", base) for base in ("raw SQL keyless", "PGMQ", "pgdq SQL keyless by triggers")),
)


def render(results: dict[str, dict[str, float]]) -> str:
    """A markdown table: one row per measure, one column per system, then one
    ratio column per (way of calling pgdq, baseline) of RATIOS that both ran."""
    names = list(results)
    measures = list(dict.fromkeys(m for r in results.values() for m in r))
    pairs = [(ours, base) for ours, base in RATIOS if ours in results and base in results]
    head = "| measure | " + " | ".join(names + [f"{ours} / {base}" for ours, base in pairs]) + " |"
    lines = [head, "|" + "---|" * (len(names) + len(pairs) + 1)]
    for m in measures:
        cells = [fmt(m, results[s].get(m)) for s in names]
        for ours, base in pairs:
            mine, theirs = results[ours].get(m), results[base].get(m)
            cells.append(f"{mine / theirs:.2f}" if mine and theirs else "")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    os.environ.setdefault("PGDATABASE", "postgres")
    sys.exit(main())
