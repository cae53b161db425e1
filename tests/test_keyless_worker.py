"""A Worker consuming keyless messages (1.2): handled, retried with backoff
and dead-lettered like keyed ones, named by their id in its log lines, with
an undecodable one dead-lettered alone, and counted by its metrics."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import timedelta

import pytest
from pgdq import AsyncDelivery, Queue
from pgdq.worker import Backoff, Worker
from test_worker import running
from waiting import outstanding, wait_for


@dataclass
class Job:
    n: int


class Outcomes:
    """A Worker's metrics (OutcomeRecorder): each finished delivery's queue and outcome."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def record(self, queue: str, outcome: str, seconds: float | None) -> None:
        with self.lock:
            self.seen.append((queue, outcome))


def test_a_worker_handles_retries_and_dead_letters_keyless_messages(
    database: str, queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="pgdq.worker")
    handled: list[tuple[int, str | None, int]] = []
    lock = threading.Lock()

    def handler(d: AsyncDelivery) -> None:
        job = d.payload
        assert isinstance(job, Job)
        if job.n == 2 and d.attempts == 1:
            raise ValueError("not yet")
        if job.n == 3:
            raise ValueError("never")
        with lock:
            handled.append((d.id, d.key, job.n))

    metrics = Outcomes()
    backoff = Backoff(base=timedelta(seconds=0.1), jitter=0)
    worker = Worker(
        queue_name, handler, dsn=database, max_attempts=2, backoff=backoff, payload_type=Job, metrics=metrics
    )
    with Queue(queue_name, database) as q:
        one, two, three, bad = q.send_many([{"n": 1}, {"n": 2}, {"n": 3}, "not a job"])
        with running(worker):
            wait_for(lambda: len(q.dead_letters()) == 2 and len(handled) == 2, "two handled, two dead letters")
            wait_for(lambda: outstanding(q, "ready", "delayed", "leased") == 0, "the acks")
        dead = {d.id: d for d in q.dead_letters()}
        q.purge_dead_letters()
    assert sorted(handled) == [(one, None, 1), (two, None, 2)], "key None, named by id"
    assert dead.keys() == {three, bad} and all(d.key is None for d in dead.values())
    assert dead[three].attempts == 2 and "ValueError: never" in (dead[three].error or "")
    assert dead[bad].attempts == 1 and "PayloadDecodeError" in (dead[bad].error or ""), "dead-lettered at once"
    assert f"payload of message {bad} in queue '{queue_name}'" in (dead[bad].error or "")
    lines = [r.getMessage() for r in caplog.records]
    assert any(f"{queue_name} message {two} failed (attempt 1 of 2): ValueError: not yet" in line for line in lines)
    assert any(f"{queue_name} message {three} dead-lettered (attempt 2 of 2)" in line for line in lines)
    assert not any("/None" in line for line in lines), lines
    assert sorted(outcome for _, outcome in metrics.seen) == sorted(
        ["handled", "handled", "failed", "failed", "dead_lettered", "dead_lettered"]
    )
    assert {queue for queue, _ in metrics.seen} == {queue_name}
