"""pgdq demo: schedule messages a few seconds ahead plus a recurring tick,
then consume them like a worker would (wake on dq_wakeup, sleep until the
next due time, never a fixed poll interval) and print each delivery with its
lateness. Uses DATABASE_URL, or the standard PG* variables; installs pgdq
there if missing and purges the queue pgdq_demo first.

    python examples/demo.py       (make demo runs it on a throwaway cluster)
"""

from __future__ import annotations

import os
import sys
import time
from datetime import datetime, timedelta
from typing import Any

import psycopg
from pgdq import Delivery, Queue, install
from rich.console import Console
from rich.table import Table

QUEUE = "pgdq_demo"  # a name of the demo's own: it purges the queue first
LEASE = timedelta(seconds=30)
TICK = timedelta(seconds=2)
console = Console()


def server_now(conn: psycopg.Connection[Any]) -> datetime:
    """The database clock: the only clock pgdq trusts."""
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def schedule(q: Queue, now: datetime) -> int:
    """Offer one-off reminders and install a tick every 2 s; how many to expect."""
    reminders = [
        ("close-unpaid-order-17", {"order": 17}, now + timedelta(seconds=1)),
        ("send-reminder-alice", {"user": "alice"}, now + timedelta(seconds=2.5)),
        ("retry-webhook-9", {"webhook": 9, "attempt": 2}, now + timedelta(seconds=4)),
        ("nightly-report", {"report": "sales"}, now + timedelta(seconds=6)),
        ("send-reminder-bob", {"user": "bob"}, now),
    ]
    for result in q.offer_many(reminders):
        console.print(f"offered [bold]{result.key}[/] → {result.outcome.value}")
    start = now + (TICK - timedelta(microseconds=now.timestamp() * 1e6 % (TICK.total_seconds() * 1e6)))
    ticks = [(start + i * TICK, {"tick": i}) for i in range(4)]
    created = q.cron_install("tick", "every-2s", ticks)
    console.print(f"installed recurring [bold]tick[/] every 2 s: {created} occurrences")
    return len(reminders) + created


def consume(q: Queue, listener: psycopg.Connection[Any], expected: int, deadline: float) -> list[Delivery]:
    """Poll until `expected` deliveries are acked, sleeping until the next due time."""
    done: list[Delivery] = []
    while len(done) < expected and time.monotonic() < deadline:
        batch = q.poll_many(10, LEASE)
        for delivery in batch:
            lateness = (delivery.lease_until - LEASE) - delivery.scheduled_at
            console.print(
                f"[green]delivered[/] {delivery.key:<45} payload={delivery.payload} "
                f"late by [bold]{lateness.total_seconds() * 1000:.1f} ms[/]",
                soft_wrap=True,
            )
            delivery.ack()
            done.append(delivery)
        if batch:
            continue
        due = q.next_due()
        wait = 5.0 if due is None else max(0.0, (due - server_now(listener)).total_seconds())
        for _ in listener.notifies(timeout=min(wait, 5.0), stop_after=1):
            pass  # woken by an offer: poll again
    return done


def main() -> int:
    conninfo = os.environ.get("DATABASE_URL", "")
    with (
        psycopg.connect(conninfo, autocommit=True) as conn,
        psycopg.connect(conninfo, autocommit=True) as listener,
    ):
        if install(conn, if_not_exists=True):
            console.print("installed pgdq into schema public")
        q = Queue(QUEUE, conn)
        q.purge()  # a re-run starts clean
        listener.execute("LISTEN dq_wakeup")
        expected = schedule(q, server_now(conn))
        done = consume(q, listener, expected, time.monotonic() + 30)
        table = Table(title=f"pgdq {q.version()}: {len(done)} of {expected} delivered")
        table.add_column("key")
        table.add_column("scheduled (UTC)")
        table.add_column("lateness ms", justify="right")
        for d in done:
            late = ((d.lease_until - LEASE) - d.scheduled_at).total_seconds() * 1000
            table.add_row(d.key, d.scheduled_at.strftime("%H:%M:%S.%f")[:-3], f"{late:.1f}")
        console.print(table)
        return 0 if len(done) == expected else 1


if __name__ == "__main__":
    sys.exit(main())
