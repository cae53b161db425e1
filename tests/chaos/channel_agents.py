"""A poller of a queue with channels, run as a separate process by
test_channel_limits.py (so that the test can SIGKILL it):

    python channel_agents.py DSN QUEUE LEASE_SECONDS

It polls batches of 1 to 4 messages and logs each delivery in
channel_deliveries in the poll's own transaction, so the log is exactly what
the queue handed out; then it works a few milliseconds and acks (or, one
time in ten, nacks) each, logging when the delivery ended in the same
transaction. Any error but a broken connection ends it with a traceback
(a deadlock would).
"""

from __future__ import annotations

import os
import random
import sys
import time
from datetime import timedelta
from typing import Any

import psycopg
from pgdq import Queue
from stopping import until_sigterm


def run(dsn: str, queue: str, lease: timedelta) -> None:
    """Poll, log, work, ack or nack, until SIGTERM."""
    stopped = until_sigterm()
    rng = random.Random(os.getpid())
    conn: psycopg.Connection[Any] = psycopg.connect(dsn, autocommit=True)
    q = Queue(queue, conn, lease=lease)
    while not stopped():
        with conn.transaction():
            got = q.poll_many(rng.randint(1, 4), conn=conn)
            for d in got:
                conn.execute(
                    "INSERT INTO channel_deliveries (key, channel, token, leased_at, lease_until, seen_at, pid)"
                    " VALUES (%s, %s, %s, %s, %s, clock_timestamp(), %s)",
                    (d.key, d.channel, d.lock_token, d.lease_until - lease, d.lease_until, os.getpid()),
                )
        if not got:
            time.sleep(0.005)
            continue
        time.sleep(rng.uniform(0, 0.03))  # the work
        for d in got:
            nack = rng.random() < 0.1
            with conn.transaction():
                ended = q.nack(d.lock_token, conn=conn) if nack else q.ack(d.lock_token, conn=conn)
                if ended:
                    conn.execute(
                        "UPDATE channel_deliveries SET ended_at = clock_timestamp(), acked = %s WHERE token = %s",
                        (not nack, d.lock_token),
                    )
    conn.close()


if __name__ == "__main__":
    run(sys.argv[1], sys.argv[2], timedelta(seconds=float(sys.argv[3])))
