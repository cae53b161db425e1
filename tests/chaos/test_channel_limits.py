"""Channel limits under concurrency: eight poller processes drain one queue
of 50 channels with mixed limits while a monitor samples the table. At no
sampled instant does a channel hold more valid leases than its
max_concurrency; lease starts in a min_interval channel are never closer than
the interval; no message is held by two consumers at once; nothing is lost;
no poller fails (a deadlock would end it). The second run SIGKILLs pollers
as they work: the leases they held expire and their slots come back (the
ordered channels, max_concurrency 1, could not finish otherwise)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import dsn, recreate_database
from pgdq import Message, Queue

AGENT = Path(__file__).with_name("channel_agents.py")
QUEUE = "limits"
POLLERS = 8
CHANNELS = 50
PER_CHANNEL = 30
UNCHANNELED = 100
# seconds a run may take: a guard against a hang, not a speed to meet (a
# loaded machine drains slowly; the kills stop after MAX_KILLS)
DEADLINE = 240.0
MAX_KILLS = 12  # pollers killed in a run at most: then the rest drain the queue


def limits(i: int) -> tuple[int | None, timedelta | None]:
    """Channel i's (max_concurrency, min_interval): ordered, small pools,
    rate limits, both, or none."""
    return [
        (1, None),
        (3, None),
        (None, timedelta(milliseconds=100)),
        (2, timedelta(milliseconds=50)),
        (None, None),
    ][i % 5]


@pytest.fixture
def limits_db(database: str) -> Iterator[str]:
    recreate_database("pgdq_limits")
    conninfo = dsn("pgdq_limits")
    with psycopg.connect(conninfo, autocommit=True) as c:
        c.execute("CREATE EXTENSION pgdq")
        c.execute(
            "CREATE TABLE channel_deliveries (key text, channel text, token uuid PRIMARY KEY, leased_at timestamptz,"
            " lease_until timestamptz, seen_at timestamptz, pid int, ended_at timestamptz, acked boolean)"
        )
    yield conninfo


def fill(conninfo: str) -> list[str]:
    """The channels with their limits and their messages (random priorities); every key."""
    rng = random.Random(7)
    with Queue(QUEUE, conninfo) as q:
        messages = [Message(f"u{k}", k, priority=rng.randint(0, 3)) for k in range(UNCHANNELED)]
        for i in range(CHANNELS):
            max_concurrency, min_interval = limits(i)
            if max_concurrency is not None or min_interval is not None:
                q.set_channel(f"c{i:02d}", max_concurrency=max_concurrency, min_interval=min_interval)
            messages += [
                Message(f"c{i:02d}-{k}", k, channel=f"c{i:02d}", priority=rng.randint(0, 3)) for k in range(PER_CHANNEL)
            ]
        q.offer_many(messages)
    return [m.key for m in messages]


class Monitor(threading.Thread):
    """Samples, as often as it can, the channels holding more valid leases
    than their max_concurrency. One statement, one snapshot: the leases it
    counts were committed and still valid at the same moment (clock_timestamp()
    is read after the snapshot is taken)."""

    def __init__(self, conninfo: str) -> None:
        super().__init__(daemon=True)
        self.conninfo = conninfo
        self.stop = threading.Event()
        self.samples = 0
        self.over: list[tuple[Any, ...]] = []

    def run(self) -> None:
        with psycopg.connect(self.conninfo, autocommit=True) as c:
            while not self.stop.is_set():
                self.over += c.execute(
                    "SELECT m.channel, count(*), g.max_concurrency FROM dq_messages AS m"
                    " JOIN dq_groups AS g ON g.queue = m.queue AND g.channel = m.channel"
                    " WHERE m.queue = %s AND m.lock_token IS NOT NULL AND m.due_at > clock_timestamp()"
                    " GROUP BY m.channel, g.max_concurrency HAVING count(*) > g.max_concurrency",
                    (QUEUE,),
                ).fetchall()
                self.samples += 1


def spawn(conninfo: str, lease: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, str(AGENT), conninfo, QUEUE, str(lease)])


def drain(conninfo: str, lease: float, kill_every: float | None) -> tuple[Monitor, int]:
    """Run the pollers until the queue is empty, SIGKILLing one about every
    kill_every seconds (and starting another), MAX_KILLS at most; the monitor
    and the kill count."""
    rng = random.Random(11)
    monitor = Monitor(conninfo)
    monitor.start()
    pollers = [spawn(conninfo, lease) for _ in range(POLLERS)]
    kills, started, next_kill = 0, time.monotonic(), time.monotonic() + (kill_every or 0)
    try:
        with psycopg.connect(conninfo, autocommit=True) as c:
            while c.execute("SELECT count(*) FROM dq_messages").fetchone() != (0,):
                assert time.monotonic() - started < DEADLINE, "the queue did not drain in time"
                failed = [p.returncode for p in pollers if p.poll() is not None and p.returncode != -signal.SIGKILL]
                assert not failed, f"a poller failed: exit codes {failed}"
                if kill_every is not None and kills < MAX_KILLS and time.monotonic() >= next_kill:
                    victim = rng.randrange(POLLERS)
                    os.kill(pollers[victim].pid, signal.SIGKILL)
                    pollers[victim].wait()
                    pollers[victim] = spawn(conninfo, lease)
                    kills += 1
                    next_kill = time.monotonic() + kill_every
                time.sleep(0.05)
    finally:
        for p in pollers:
            p.send_signal(signal.SIGTERM)
        codes = [p.wait(timeout=30) for p in pollers]
        monitor.stop.set()
        monitor.join()
    # a poller started just before the end may not have its SIGTERM handler yet
    assert set(codes) <= {0, -signal.SIGTERM}, f"the pollers stopped cleanly: {codes}"
    return monitor, kills


def check(conninfo: str, keys: list[str], monitor: Monitor) -> None:
    """The rules, from the monitor's samples and the delivery log."""
    assert monitor.samples > 100, "the monitor sampled throughout"
    assert monitor.over == [], "no channel ever held more valid leases than its max_concurrency"
    with psycopg.connect(conninfo, autocommit=True) as c:
        log = c.execute(
            "SELECT key, channel, leased_at, lease_until, seen_at, ended_at, acked FROM channel_deliveries"
            " ORDER BY seen_at"
        ).fetchall()
        leftover = c.execute("SELECT sum(leased) FROM dq_channels(%s)", (QUEUE,)).fetchone()
    acked = sorted(key for key, *_, ok in log if ok)
    assert acked == sorted(keys), "every message acked exactly once: nothing lost, nothing twice"
    assert leftover == (0,), "no slot is held at the end"

    starts: dict[str, list[Any]] = defaultdict(list)
    held_until: dict[str, Any] = {}
    for key, channel, leased_at, lease_until, seen_at, ended_at, _ in log:
        if key in held_until:
            assert seen_at >= held_until[key], f"{key} was delivered while an earlier delivery held it"
        held_until[key] = lease_until if ended_at is None else min(lease_until, ended_at)
        if channel is not None:
            starts[channel].append(leased_at)
    for i in range(CHANNELS):
        _, min_interval = limits(i)
        times = sorted(starts[f"c{i:02d}"])
        assert len(times) >= PER_CHANNEL
        if min_interval is not None:
            closest = min(b - a for a, b in zip(times, times[1:], strict=False))
            assert closest >= min_interval, f"c{i:02d}: two leases {closest} apart, under {min_interval}"


def test_limits_hold_with_eight_pollers(limits_db: str) -> None:
    keys = fill(limits_db)
    monitor, _ = drain(limits_db, lease=5.0, kill_every=None)
    check(limits_db, keys, monitor)


def test_killed_pollers_give_their_slots_back(limits_db: str) -> None:
    keys = fill(limits_db)
    monitor, kills = drain(limits_db, lease=1.0, kill_every=0.7)
    assert kills >= 3, "pollers were killed while they worked"
    check(limits_db, keys, monitor)
