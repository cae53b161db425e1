"""pgdq serve's group commit (issue 39): offers, polls and acks of a queue
that arrive while a statement of their kind runs go to PostgreSQL together,
as one statement, and each request gets the answer it would have got alone.

Each test holds a table lock so that a first request's statement waits on
it, sends the others (which then wait in the server: its
pgdq_http_batch_waiting gauge), and lets go: what waited is answered by one
statement, which the rows' transaction ids (xmin) show."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import psycopg
import pytest
from conftest import owner, unsharded
from http_server import Server, serve
from pgdq import Queue
from test_http_limits import backends, send_raw
from waiting import wait_for

pytestmark = unsharded("holds a lock on dq_messages, which lives on the partitions")


@pytest.fixture(scope="module")
def served(database: str) -> Iterator[Server]:
    """A server whose requests wait for the statement in front of them, and batches for locks, as long as they run."""
    s = serve(database, "--group-commit-lag", "60", "--group-commit-lock-timeout", "60")
    yield s
    s.stop()


def test_a_statement_waiting_on_a_lock_holds_up_the_others_only_for_the_lag(
    database: str, queue_name: str, q: Queue
) -> None:
    s = serve(database)  # the default lag, 5 ms
    q.offer("held", 0)
    offer = offering(s, queue_name)
    try:
        with psycopg.connect(owner(database, queue_name)) as holder, ThreadPoolExecutor(1) as thread:
            holder.execute("SELECT 1 FROM dq_messages WHERE queue = %s AND key = 'held' FOR UPDATE", (queue_name,))
            stuck = thread.submit(offer("held", 1))
            wait_for(lambda: backends(database, "wait_event_type = 'Lock'") == 1, "the offer of the held key waiting")
            assert offer("free", 2)().json() == {"key": "free", "outcome": "created"}  # while the other waits
            holder.rollback()
    finally:
        s.stop()
    assert stuck.result().json() == {"key": "held", "outcome": "updated"}


def metric(server: Server, name: str) -> float:
    """A sample of the server's /metrics without labels."""
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith(name + " ")))


@contextlib.contextmanager
def first_waiting(database: str, queue: str, mode: str, first: Any) -> Iterator[Future[httpx.Response]]:
    """A transaction holding dq_messages in mode, and first() running in a thread until it waits on that lock
    (open the callers' thread pools before: they are joined after the lock is let go)."""
    with psycopg.connect(owner(database, queue)) as holder, ThreadPoolExecutor(1) as thread:
        holder.execute(f"LOCK TABLE dq_messages IN {mode} MODE")
        running = thread.submit(first)
        wait_for(lambda: backends(database, "wait_event_type = 'Lock'") == 1, "the first request waiting on the lock")
        yield running
        holder.rollback()


def distinct_writers(database: str, queue: str, where: str = "TRUE") -> int:
    """How many transactions wrote the current versions of queue's messages (a fixed condition)."""
    with psycopg.connect(owner(database, queue), autocommit=True) as c:
        query = "SELECT count(DISTINCT xmin::text) FROM dq_messages WHERE queue = %s AND " + where
        (n,) = c.execute(query, (queue,)).fetchone()  # type: ignore[misc]
        return int(n)


def offering(server: Server, queue: str) -> Any:
    """offer(key, payload): a callable that offers it to queue over HTTP, its response."""
    url = f"{server.url}/v1/queues/{queue}/messages"
    return lambda key, payload: lambda: httpx.post(url, json={"key": key, "payload": payload}, timeout=60)


def test_a_key_held_by_a_transaction_holds_up_no_other_request_of_its_batch(
    database: str, queue_name: str, q: Queue
) -> None:
    s = serve(database, "--group-commit-lag", "60", "--group-commit-lock-timeout", "0.2")
    q.offer("held", 0)
    offer = offering(s, queue_name)
    try:
        with (
            ThreadPoolExecutor(3) as pool,
            psycopg.connect(owner(database, queue_name)) as key_holder,
        ):
            key_holder.execute("SELECT 1 FROM dq_messages WHERE queue = %s AND key = 'held' FOR UPDATE", (queue_name,))
            with first_waiting(database, queue_name, "SHARE", offer("first", 0)):
                batch = [pool.submit(offer(k, 1)) for k in ("held", "free1", "free2")]
                wait_for(lambda: metric(s, "pgdq_http_batch_waiting") == 3, "3 offers waiting for the first")
            # the batch waits for "held" 0.2 s, is rolled back, and its requests run one by one
            assert batch[1].result().json() == {"key": "free1", "outcome": "created"}
            assert batch[2].result().json() == {"key": "free2", "outcome": "created"}
            assert not batch[0].done()  # still waiting for the key, alone
            key_holder.rollback()
        assert batch[0].result().json() == {"key": "held", "outcome": "updated"}
    finally:
        s.stop()


def test_offers_that_wait_go_as_one_statement_each_answered_as_alone(
    database: str, queue_name: str, q: Queue, served: Server
) -> None:
    offer = offering(served, queue_name)
    batch_url = f"{served.url}/v1/queues/{queue_name}/messages/batch"
    batches = metric(served, "pgdq_http_batched_requests_total")
    with ThreadPoolExecutor(6) as pool, first_waiting(database, queue_name, "SHARE", offer("first", 0)) as first:
        # k1 twice: one is created, the other updates it, as two offers in turn
        offers = [offer("k1", 1), offer("k2", 2), offer("k1", 3), offer("k3", 4)]
        batch = [
            pool.submit(offers[0]),
            pool.submit(offers[1]),
            pool.submit(offers[2]),
            pool.submit(offers[3]),
            # a batch offer rides along, all or nothing as alone
            pool.submit(lambda: httpx.post(batch_url, json={"messages": [{"key": "k4", "payload": 5}]}, timeout=60)),
        ]
        wait_for(lambda: metric(served, "pgdq_http_batch_waiting") == 5, "5 offers waiting for the first")
    assert first.result().json() == {"key": "first", "outcome": "created"}
    answers = [f.result() for f in batch]
    assert all(r.status_code == 200 for r in answers), [r.text for r in answers]
    outcomes = {(a.json()["key"], a.json()["outcome"]) for a in answers[:4]}
    assert sorted(o for k, o in outcomes if k == "k1") == ["created", "updated"]
    assert {("k2", "created"), ("k3", "created")} <= outcomes
    assert answers[4].json() == {"results": [{"key": "k4", "outcome": "created"}]}
    assert distinct_writers(database, queue_name, "key <> 'first'") == 1  # one statement wrote them all
    assert metric(served, "pgdq_http_batched_requests_total") - batches == 5
    updated = next(a for a in answers[:4] if a.json() == {"key": "k1", "outcome": "updated"})
    got = q.get("k1")
    assert got is not None and got.payload == (3 if updated is answers[2] else 1)


def test_a_refused_request_fails_alone_and_its_batch_runs_without_it(
    database: str, queue_name: str, q: Queue, served: Server
) -> None:
    offer = offering(served, queue_name)
    with ThreadPoolExecutor(3) as pool, first_waiting(database, queue_name, "SHARE", offer("first", 0)):
        # PostgreSQL refuses a JSON string holding \u0000: the whole statement would fail
        batch = [pool.submit(offer("good1", 1)), pool.submit(offer("bad", "a\u0000b")), pool.submit(offer("good2", 2))]
        wait_for(lambda: metric(served, "pgdq_http_batch_waiting") == 3, "3 offers waiting for the first")
    good1, bad, good2 = (f.result() for f in batch)
    assert good1.json() == {"key": "good1", "outcome": "created"} and good2.json()["outcome"] == "created"
    assert bad.status_code == 400 and "sqlstate" in bad.json(), bad.text
    assert q.get("bad") is None and q.get("good1") is not None


def test_polls_that_wait_share_one_statement_each_getting_its_own(
    database: str, queue_name: str, q: Queue, served: Server
) -> None:
    q.offer_many([(f"k{i}", i) for i in range(10)])
    url = f"{served.url}/v1/queues/{queue_name}/poll"

    def poll(count: int) -> Any:
        return lambda: httpx.post(url, json={"max": count, "lease": 60}, timeout=60)

    with ThreadPoolExecutor(4) as pool, first_waiting(database, queue_name, "EXCLUSIVE", poll(1)) as first:
        batch = [pool.submit(poll(2)) for _ in range(4)]
        wait_for(lambda: metric(served, "pgdq_http_batch_waiting") == 4, "4 polls waiting for the first")
    shares = [[d["key"] for d in f.result().json()["deliveries"]] for f in batch]
    keys = [d["key"] for d in first.result().json()["deliveries"]] + [k for s in shares for k in s]
    assert [len(s) for s in shares] == [2, 2, 2, 2] and len(set(keys)) == 9
    assert distinct_writers(database, queue_name, "lock_token IS NOT NULL") == 2  # the first poll's and the batch's
    assert q.stats().leased == 9


def test_acks_that_wait_go_together_and_a_stale_token_is_its_own_requests_409(
    database: str, queue_name: str, q: Queue, served: Server
) -> None:
    q.offer_many([(f"k{i}", i) for i in range(5)])
    tokens = [str(d.lock_token) for d in q.poll_many(5, 60)]
    stale = "00000000-0000-0001-0000-000000000000"
    url = f"{served.url}/v1/queues/{queue_name}/ack"

    def ack(*acked: str) -> Any:
        return lambda: httpx.post(url, json={"lock_tokens": list(acked)}, timeout=60)

    with ThreadPoolExecutor(3) as pool, first_waiting(database, queue_name, "EXCLUSIVE", ack(tokens[0])) as first:
        batch = [
            pool.submit(ack(tokens[1])),
            pool.submit(ack(tokens[2], tokens[3])),
            pool.submit(ack(tokens[4], stale)),
        ]
        wait_for(lambda: metric(served, "pgdq_http_batch_waiting") == 3, "3 acks waiting for the first")
    assert first.result().json() == {"acked": 1}
    one, two, with_stale = (f.result() for f in batch)
    assert one.json() == {"acked": 1} and two.json() == {"acked": 2}
    assert with_stale.status_code == 409 and with_stale.json()["error"] == "stale lock tokens: 1; 1 acked"
    assert q.stats().leased == 0 and q.stats().ready == 0


def test_the_lease_of_a_poll_whose_client_left_during_its_batch_is_given_back(
    database: str, queue_name: str, q: Queue, served: Server
) -> None:
    q.offer_many([(f"k{i}", i) for i in range(3)])
    url = f"{served.url}/v1/queues/{queue_name}/poll"
    path = f"/v1/queues/{queue_name}/poll"
    locked = "wait_event_type = 'Lock'"
    body = b'{"max": 1, "lease": 600}'
    with (
        psycopg.connect(owner(database, queue_name)) as holder,
        psycopg.connect(owner(database, queue_name)) as next_holder,
    ):
        holder.execute("LOCK TABLE dq_messages IN EXCLUSIVE MODE")
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(lambda: httpx.post(url, json={"max": 1, "lease": 600}, timeout=60))
            wait_for(lambda: backends(database, locked) == 1, "the first poll waiting on the lock")
            leaving = send_raw(served.url, "POST", path, body)
            staying = pool.submit(lambda: httpx.post(url, json={"max": 1, "lease": 600}, timeout=60))
            wait_for(lambda: metric(served, "pgdq_http_batch_waiting") == 2, "2 polls waiting for the first")
            # the next holder queues behind the first poll: the batch then waits on it in turn
            with ThreadPoolExecutor(1) as locker:
                taken = locker.submit(next_holder.execute, "LOCK TABLE dq_messages IN EXCLUSIVE MODE")
                wait_for(lambda: backends(database, locked) == 2, "the next holder queued behind the first poll")
                holder.rollback()
                taken.result()
            assert len(first.result().json()["deliveries"]) == 1
            wait_for(lambda: backends(database, locked) == 1, "the batch of the two polls waiting")
            leaving.close()
            gone = 'pgdq_http_requests_total{method="POST",route="/v1/queues/{queue}/poll",status="499"}'
            wait_for(lambda: gone in httpx.get(f"{served.url}/metrics", timeout=30).text, "the leaving poll gone")
            next_holder.rollback()
            assert len(staying.result().json()["deliveries"]) == 1
    # the departed poll's message was leased by the batch, then given back: due now, its attempt counted
    wait_for(lambda: q.stats().leased == 2, "the departed poll's lease given back")
    assert q.stats().ready == 1
