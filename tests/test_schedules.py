"""Schedules stored in the database (Queue.schedule, dq_schedule) against a
real server: their occurrences come with no scheduler process running, each
once to competing consumers, and an idle worker wakes for the next one.
(Python's CronService: test_cron_service.py; cron expressions evaluated in
SQL: test_cron_expressions.py.)"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from click.testing import CliRunner
from conftest import unsharded
from pgdq import Queue, Worker
from pgdq.cli import main
from test_worker import hour_idle, running
from waiting import PATIENCE, wait_for


def consume(database: str, queue: str, enough: Callable[[Counter[str]], bool], workers: int = 5) -> Counter[str]:
    """Keys delivered (and acked) by `workers` competing consumers, polling
    until enough(keys so far) holds (the test fails after PATIENCE without)."""
    keys: list[str] = []  # appended to by every consumer (atomic in threads)
    deadline = time.monotonic() + PATIENCE

    def consumer() -> None:
        with Queue(queue, database) as q:
            while not enough(Counter(keys)):
                d = q.poll(timedelta(seconds=30))
                if d is None:
                    if time.monotonic() > deadline:
                        return  # the test fails on what was delivered
                    time.sleep(0.02)
                    continue
                keys.append(d.key)
                d.ack()

    threads = [threading.Thread(target=consumer) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return Counter(keys)


def occurrence(key: str) -> datetime:
    return datetime.strptime(key.rsplit("/", 1)[1], "%Y%m%dT%H%M%S.%fZ").replace(tzinfo=UTC)


def test_database_schedule_fires_with_no_scheduler_running(database: str, queue_name: str) -> None:
    with Queue(queue_name, database) as q:
        # max_missed: a poll late by more than a second (a busy machine)
        # still delivers every occurrence since the last, in order
        next_at = q.schedule("db-tick", "* * * * * *", "Australia/Lord_Howe", {"db": 1}, max_missed=100)
        assert next_at > datetime.now(UTC) - timedelta(seconds=1)
        assert [s.name for s in q.schedules()] == ["db-tick"]
        # 5 competing consumers, nothing else; a duplicate of an occurrence
        # is due with it: once a fourth is delivered, any of the first three would have been
        seen = consume(database, queue_name, lambda keys: len(keys) >= 4)
        assert q.unschedule("db-tick") and q.schedules() == []
    assert seen and max(seen.values()) == 1, "each occurrence once"
    times = sorted(occurrence(k) for k in seen)
    assert len(times) >= 2 and all(b - a == timedelta(seconds=1) for a, b in zip(times, times[1:], strict=False))


def test_an_idle_worker_wakes_for_the_next_occurrence(database: str, queue_name: str) -> None:
    late: list[float] = []

    def handler(d: Any) -> None:
        late.append((datetime.now(UTC) - d.scheduled_at).total_seconds())

    with Queue(queue_name, database) as q:
        q.schedule("every2", "*/2 * * * * *")
        # nothing but dq_next_due's time (or a wake-up) ends its idle sleep before the deadline
        worker = hour_idle(Worker(queue_name, handler, dsn=database))
        with running(worker):
            wait_for(lambda: len(late) >= 2, "two occurrences handled: woken by dq_next_due, not the hour's cap")
        q.unschedule("every2")
    assert min(late) >= 0, f"none before its time: {late}"


@unsharded("sets the test clock dq.now in its session, which a routed call does not carry to the partition")
def test_a_schedule_past_year_9999_ends_and_still_reads(database: str, queue_name: str) -> None:
    """1.2 (times are readable): a schedule whose next occurrence would fall
    after year 9999 delivers its last one and ends; the client and `pgdq
    schedules list` read it (next_at None), where 1.1's infinity broke both."""
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("SELECT set_config('dq.now', '9999-12-31 23:00:00+00', false)")
        q = Queue(queue_name, conn)
        assert q.schedule("last", "30 23 31 12 *") == datetime(9999, 12, 31, 23, 30, tzinfo=UTC)
        conn.execute("SELECT set_config('dq.now', '9999-12-31 23:45:00+00', false)")
        [d] = q.poll_many(10, timedelta(minutes=1))
        assert d.scheduled_at == datetime(9999, 12, 31, 23, 30, tzinfo=UTC)
        d.ack()
        assert [(s.name, s.next_at) for s in q.schedules()] == [("last", None)]
        listed = CliRunner().invoke(main, ["schedules", "list", queue_name], env={"PGDQ_DSN": database})
        assert listed.exit_code == 0, listed.output
        assert "last" in listed.output
        assert q.unschedule("last")
