"""dq_wakeup from Python (api-v1.1): a statement notifies only when a message
it wrote is due no later than every other message of its queue; a Worker
sleeping until dq_next_due is still woken at once in every case the rule
covers, and a write behind the head sends nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from pgdq import AsyncDelivery, Queue, Worker
from test_worker import running
from waiting import PATIENCE, notified, wait_for

SOON = timedelta(minutes=10)  # a head far enough away that only a wake-up explains a delivery before it


def drain(listener: psycopg.Connection[Any]) -> list[str]:
    """The wake-ups listener got from every statement committed so far."""
    return notified(listener)


def test_only_writes_at_the_head_notify(database: str, queue_name: str) -> None:
    with psycopg.connect(database, autocommit=True) as listener, Queue(queue_name, database) as q:
        listener.execute("LISTEN dq_wakeup")
        later = datetime.now(UTC) + SOON
        q.offer_many([(f"k{i}", i, later + timedelta(seconds=i)) for i in range(100)])
        assert drain(listener) == [queue_name], "a batch into an empty queue: exactly one"
        q.offer_many([(f"k{i}", i, later + timedelta(seconds=i)) for i in range(100)])
        assert drain(listener) == [], "a batch that only ignores sends nothing"
        q.offer("k1", "changed", later + timedelta(hours=1))
        assert drain(listener) == [], "an update behind the head sends nothing"
        q.offer_many([(f"b{i}", i, later + timedelta(hours=2)) for i in range(1000)])
        assert drain(listener) == [], "nor does a batch behind it"
        q.offer("k1", "first", later - timedelta(seconds=1))
        assert drain(listener) == [queue_name], "an update that becomes the head notifies"


@contextmanager
def sleeping_worker(database: str, queue_name: str) -> Iterator[list[tuple[str, float]]]:
    """A Worker idle on queue_name (its head is SOON away); yields what it handles, with lateness."""
    handled: list[tuple[str, float]] = []

    def handler(d: AsyncDelivery) -> None:
        handled.append((d.key, (datetime.now(UTC) - d.scheduled_at).total_seconds()))

    with Queue(queue_name, database) as q:
        q.offer("head", 0, datetime.now(UTC) + SOON)
    # nothing but a wake-up or the head (SOON) ends its sleep: not its idle
    # cap, nor a waiting line, before the tests' deadline (PATIENCE)
    worker = Worker(queue_name, handler, dsn=database, idle_cap=timedelta(hours=1))
    worker.report_every = timedelta(hours=1)
    with running(worker):
        time.sleep(0.5)  # idle: sleeping until the head, or a wake-up
        yield handled


def quickly(handled: list[tuple[str, float]], key: str) -> None:
    """key is handled long before the head (SOON) and the worker's idle cap
    (an hour): only a wake-up could do that."""
    assert PATIENCE < min(SOON, timedelta(hours=1)).total_seconds()
    wait_for(lambda: any(k == key for k, _ in handled), f"{key} to be handled: the worker overslept")


def test_a_sleeping_worker_wakes_for_an_offer_before_its_head(database: str, queue_name: str) -> None:
    with sleeping_worker(database, queue_name) as handled, Queue(queue_name, database) as q:
        q.offer("now", 1)
        quickly(handled, "now")
        q.offer_many([("batch-late", 1, datetime.now(UTC) + SOON * 2), ("batch-now", 2)])
        quickly(handled, "batch-now")


def test_a_sleeping_worker_wakes_for_an_offer_into_an_empty_queue(database: str, queue_name: str) -> None:
    with sleeping_worker(database, queue_name) as handled, Queue(queue_name, database) as q:
        q.cancel("head")  # now the worker sleeps on an empty queue
        time.sleep(0.3)
        q.offer("first", 1)
        quickly(handled, "first")


def test_a_sleeping_worker_wakes_for_a_nack_to_now(database: str, queue_name: str) -> None:
    with Queue(queue_name, database) as other_consumer:
        other_consumer.offer("nacked", 1)
        delivery = other_consumer.poll(lease=timedelta(hours=1))  # held by another session
        assert delivery is not None
        with sleeping_worker(database, queue_name) as handled:
            assert handled == [], "the leased message is not due, the head is delayed"
            delivery.nack()  # due now: before the worker's head
            quickly(handled, "nacked")


def test_a_sleeping_worker_wakes_for_a_redrive(database: str, queue_name: str) -> None:
    with Queue(queue_name, database) as q:
        q.offer("dead", 1)
        delivery = q.poll()
        assert delivery is not None
        delivery.dead_letter("boom")
        with sleeping_worker(database, queue_name) as handled:
            assert q.redrive("dead") == 1
            quickly(handled, "dead")
