"""pgdq through a real PgBouncer in transaction pooling mode (Debian's
pgbouncer 1.18: no prepared statements across transactions). Each call of
the Python API is one statement in a transaction of its own and keeps no
session state, so a pool whose connections prepare nothing
(prepare_threshold=None) works through it unchanged."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from conftest import DB
from pgbouncer import BINARY, PgBouncer
from pgdq import AsyncDelivery, Client, CronService, Message, Queue, Worker
from psycopg_pool import ConnectionPool
from test_worker import hour_idle, running
from waiting import outstanding, wait_for

pytestmark = pytest.mark.skipif(
    not Path(BINARY).exists(), reason="Debian pgbouncer not installed (make deps installs it)"
)


@pytest.fixture(scope="module")
def bouncer(database: str) -> Iterator[PgBouncer]:
    b = PgBouncer(pool_size=3)
    yield b
    b.stop()


@pytest.fixture
def pool(bouncer: PgBouncer) -> Iterator[ConnectionPool]:
    """Client connections through PgBouncer that prepare nothing server-side."""
    kwargs = {"autocommit": True, "prepare_threshold": None}
    with ConnectionPool(bouncer.conninfo(DB), kwargs=kwargs, min_size=1, max_size=8, open=True) as p:
        yield p


def test_the_python_api_through_transaction_pooling(pool: ConnectionPool, queue_name: str) -> None:
    q, client = Queue(queue_name, pool), Client(pool)
    later = datetime.now(UTC) + timedelta(hours=1)
    for round_ in range(10):  # more calls than psycopg's prepare threshold (5), on few server connections
        keys = [f"r{round_}-{i}" for i in range(20)]
        assert {r.outcome.value for r in q.offer_many([(k, {"i": i}) for i, k in enumerate(keys)])} == {"created"}
        q.offer(f"later-{round_}", 1, later, channel="c", priority=2)
        got = q.poll_many(20, 30)
        assert sorted(d.key for d in got) == sorted(keys)
        first, *rest = got
        assert first.extend(60) > datetime.now(UTC)
        first.nack(retry_at=datetime.now(UTC), error="again")
        assert client.ack_many([d.lock_token for d in rest]) == 19
        (again,) = q.poll_many(5)
        again.ack()
        assert q.get(f"later-{round_}") is not None and q.next_due() is not None
    assert q.stats().delayed == 10 and client.key_queues("later-3") == [queue_name]
    assert sum(h.due for h in q.due_hours(2)) == 10


def test_competing_consumers_each_message_once(pool: ConnectionPool, queue_name: str) -> None:
    """4 consumers over 3 server connections: every message delivered and acked exactly once."""
    q = Queue(queue_name, pool)
    q.offer_many(Message(f"m{i}", i) for i in range(2000))
    seen: Counter[str] = Counter()
    lock = threading.Lock()

    def consume() -> None:
        mine = Queue(queue_name, pool)
        while batch := mine.poll_many(25, 30):
            with lock:
                seen.update(d.key for d in batch)
            Client(pool).ack_many([d.lock_token for d in batch])

    threads = [threading.Thread(target=consume) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(seen) == 2000 and set(seen.values()) == {1}
    assert outstanding(q, "ready", "leased", "delayed") == 0


def test_the_pool_really_is_transaction_pooling(bouncer: PgBouncer, database: str) -> None:
    """Two client connections take turns on one server connection, as in production."""
    single = PgBouncer(pool_size=1)
    try:
        with (
            psycopg.connect(single.conninfo(DB), autocommit=True, prepare_threshold=None) as a,
            psycopg.connect(single.conninfo(DB), autocommit=True, prepare_threshold=None) as b,
        ):
            (pid_a,) = a.execute("SELECT pg_backend_pid()").fetchone()  # type: ignore[misc]
            (pid_b,) = b.execute("SELECT pg_backend_pid()").fetchone()  # type: ignore[misc]
        assert pid_a == pid_b
    finally:
        single.stop()


def test_the_worker_through_pgbouncer_wakes_on_a_direct_listen(
    bouncer: PgBouncer, database: str, queue_name: str, pool: ConnectionPool
) -> None:
    """`pgdq worker` through PgBouncer (prepares nothing) with --listen-dsn straight to the server:
    every message handled once, and an offer to the idle worker handled at once (a wake-up, not idle_cap)."""
    handled: list[tuple[str, float]] = []

    def handler(d: AsyncDelivery) -> None:
        handled.append((d.key, time.monotonic()))

    q = Queue(queue_name, pool)
    q.offer_many(Message(f"m{i}", i) for i in range(300))
    worker = Worker(
        queue_name, handler, dsn=bouncer.conninfo(DB), listen_dsn=database, prepared_statements=False, concurrency=8
    )
    with running(hour_idle(worker)):
        wait_for(lambda: len(handled) == 300, "300 handled")
        time.sleep(1.0)  # idle now, waiting on dq_wakeup
        q.offer("late", 1)
        # its idle cap and waiting line are an hour away: only the wake-up explains it
        wait_for(lambda: any(k == "late" for k, _ in handled), "the late offer handled, woken")
    assert sorted(k for k, _ in handled if k != "late") == sorted(f"m{i}" for i in range(300))
    assert outstanding(q, "ready", "leased") == 0


def test_the_command_line_through_pgbouncer(bouncer: PgBouncer, queue_name: str) -> None:
    """CLI commands prepare nothing: three 10-batch imports at once work through transaction pooling."""
    dsn = bouncer.conninfo(DB)
    pgdq = [sys.executable, "-m", "pgdq"]
    imports = []
    for part in range(3):
        lines = "".join(json.dumps({"key": f"k{part}-{i}", "payload": i}) + "\n" for i in range(1000))
        offer = [*pgdq, "offer", queue_name, "--jsonl", "--batch", "100", "--dsn", dsn]
        proc = subprocess.Popen(offer, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        imports.append((proc, lines))
    for proc, lines in imports:
        _, err = proc.communicate(lines, timeout=60)
        assert proc.returncode == 0, err
    out = subprocess.run([*pgdq, "stats", "--json", "--dsn", dsn], capture_output=True, text=True, check=True)
    assert {s["queue"]: s["ready"] for s in json.loads(out.stdout)}[queue_name] == 3000


def test_cron_services_through_pgbouncer(pool: ConnectionPool, queue_name: str) -> None:
    """A CronService runs on the Queue it is given: over such a pool, its repeated installs work too."""
    cron = CronService(Queue(queue_name, pool))
    handle = cron.install_periodic_tick("tick", timedelta(seconds=1))
    try:
        wait_for(lambda: len(Queue(queue_name, pool).peek(max_count=100)) >= 8, "eight runs' occurrences")
        assert handle.last_error is None
    finally:
        handle.stop()
