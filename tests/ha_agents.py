"""The failover test's clients, run as processes of their own:

    python ha_agents.py producer DSN QUEUE FIRST COUNT LOG
    python ha_agents.py consumer DSN QUEUE LOG

DSN names both servers with target_session_attrs=read-write. Each agent
reconnects by itself after any error, and writes what happened to LOG as
JSON lines, each with the time it was written: a producer "offered" once an
offer's call returned ("retried" after one that failed: it may have
committed); a consumer "delivered" at each poll, "acked" once an ack
returned true, "unsure" after an ack that failed. SIGTERM stops a consumer.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta
from typing import Any, TextIO

import psycopg
from chaos.stopping import until_sigterm
from pgdq import Queue

LEASE = timedelta(seconds=2)


def write(log: TextIO, event: str, key: str, attempt: int = 0) -> None:
    log.write(json.dumps({"event": event, "key": key, "attempt": attempt, "at": time.time()}) + "\n")
    log.flush()


def connect(dsn: str) -> psycopg.Connection[Any]:
    """Connect to whichever server accepts writes, retrying until one does."""
    while True:
        try:
            return psycopg.connect(dsn, autocommit=True)
        except psycopg.OperationalError:
            time.sleep(0.1)


def produce(dsn: str, queue: str, first: int, count: int, log: TextIO) -> None:
    """Offer keys first..first+count-1 one by one, due now."""
    conn = connect(dsn)
    for k in range(first, first + count):
        key = f"key-{k:05d}"
        while True:
            try:
                Queue(queue, conn).offer(key, {"k": k})
                write(log, "offered", key)
                break
            except psycopg.Error:
                write(log, "retried", key)
                conn.close()
                conn = connect(dsn)
        time.sleep(0.005)


def consume(dsn: str, queue: str, log: TextIO) -> None:
    """Poll, log, ack, log; until SIGTERM."""
    stopped = until_sigterm()
    conn = connect(dsn)
    while not stopped():
        try:
            q = Queue(queue, conn)
            d = q.poll(LEASE)
            if d is None:
                time.sleep(0.02)
                continue
            write(log, "delivered", d.key, d.attempts)
            try:
                if q.ack(d.lock_token):
                    write(log, "acked", d.key, d.attempts)
            except psycopg.Error:
                write(log, "unsure", d.key, d.attempts)
                raise
        except psycopg.Error:
            conn.close()
            conn = connect(dsn)


if __name__ == "__main__":
    role, dsn, queue, *rest = sys.argv[1:]
    with open(rest[-1], "a") as out:
        if role == "producer":
            produce(dsn, queue, int(rest[0]), int(rest[1]), out)
        else:
            consume(dsn, queue, out)
