"""Many sessions at once, on a real server: no unique violations, no
deadlocks, each message to one consumer at a time, polls never wait."""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import psycopg
from pgdq import OfferOutcome, Queue
from waiting import outstanding, wait_for

T = TypeVar("T")


def run_together(n: int, work: Callable[[int, threading.Barrier], T]) -> list[T]:
    """Run work(i, barrier) in n threads that start together; their results."""
    barrier = threading.Barrier(n)
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda i: work(i, barrier), range(n)))


def test_ten_threads_offer_one_key(database: str, queue_name: str) -> None:
    for round_ in range(10):
        key = f"contended-{round_}"

        def offer(i: int, barrier: threading.Barrier, key: str = key) -> OfferOutcome:
            with Queue(queue_name, database) as q:
                q.version()  # connect before the start line
                barrier.wait()
                return q.offer(key, {"writer": i})

        outcomes = Counter(run_together(10, offer))
        assert outcomes[OfferOutcome.CREATED] == 1, outcomes
        assert outcomes[OfferOutcome.UPDATED] + outcomes[OfferOutcome.IGNORED] == 9


def test_concurrent_batches_of_the_same_new_keys_create_each_once(database: str, queue_name: str) -> None:
    """Four sessions offer the same 300 new keys at once, in their own orders:
    each tries one plain insert, the losers undo it and replay; every key is
    created exactly once, and the other outcomes are updates."""
    keys = [f"n{i}" for i in range(300)]

    def offer_all(i: int, barrier: threading.Barrier) -> list[tuple[str, OfferOutcome]]:
        order = keys[:]
        random.Random(i).shuffle(order)
        with Queue(queue_name, database) as q:
            q.version()
            barrier.wait()
            return [(r.key, r.outcome) for r in q.offer_many([(k, {"writer": i}) for k in order])]

    results = run_together(4, offer_all)
    created = Counter(key for batch in results for key, outcome in batch if outcome is OfferOutcome.CREATED)
    assert created == Counter(keys), "each key created by exactly one batch"
    others = Counter(outcome for batch in results for _, outcome in batch if outcome is not OfferOutcome.CREATED)
    assert others == Counter({OfferOutcome.UPDATED: 900}), others  # each writer's payload differs
    assert Queue(queue_name, database).stats().ready == 300


def test_ten_consumers_drain_500_exactly_once(database: str, queue_name: str) -> None:
    Queue(queue_name, database).offer_many([(f"m{i}", i) for i in range(500)])

    def consume(_: int, barrier: threading.Barrier) -> list[str]:
        seen = []
        with Queue(queue_name, database, lease=timedelta(minutes=5)) as q:
            q.version()
            barrier.wait()
            while (d := q.poll()) is not None:
                seen.append(d.key)
                d.ack()
        return seen

    per_consumer = run_together(10, consume)
    delivered = Counter(k for keys in per_consumer for k in keys)
    assert len(delivered) == 500 and set(delivered.values()) == {1}
    assert sum(1 for keys in per_consumer if keys) > 1, "the work was shared"
    assert Queue(queue_name, database).stats().ready == 0


def test_concurrent_poll_many_batches_are_disjoint(database: str, queue_name: str) -> None:
    Queue(queue_name, database).offer_many([(f"m{i}", i) for i in range(1000)])

    def grab(_: int, barrier: threading.Barrier) -> list[str]:
        keys: list[str] = []
        with Queue(queue_name, database) as q:
            q.version()
            barrier.wait()
            while batch := q.poll_many(37):
                keys.extend(d.key for d in batch)
        return keys

    batches = run_together(8, grab)
    everything = [k for keys in batches for k in keys]
    assert len(everything) == len(set(everything)) == 1000


def test_poll_never_waits_behind_open_transactions(database: str, queue_name: str) -> None:
    q = Queue(queue_name, database)
    past = datetime(2020, 1, 1, tzinfo=UTC)
    q.offer_many(
        [
            ("a-held-by-poll", 1, past),
            ("b-held-by-offer", 2, past),
            ("free", 3, past + timedelta(seconds=1)),
        ]
    )
    with (
        psycopg.connect(database) as a,
        psycopg.connect(database) as b,
        psycopg.connect(database) as c,
    ):
        Queue(queue_name, a).poll()  # leases held-by-poll; transaction left open
        Queue(queue_name, b).offer("b-held-by-offer", 20, conn=b)  # row lock by an update, open
        Queue(queue_name, c).offer("uncommitted", 4, conn=c)  # an insert not yet committed
        with psycopg.connect(database, autocommit=True) as poller:
            # the transactions stay open: a poll that waited for any of their
            # locks would wait past this and fail (LockNotAvailable), however fast the machine
            poller.execute("SET lock_timeout = '1s'")
            got = Queue(queue_name, poller).poll_many(10)
        assert [d.key for d in got] == ["free"]
        for session in (a, b, c):
            session.rollback()


def test_five_sessions_install_the_same_cron_occurrences(database: str, queue_name: str) -> None:
    base = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
    occurrences = [(base + timedelta(minutes=i), {"i": i}) for i in range(50)]

    def install(_: int, barrier: threading.Barrier) -> int:
        with Queue(queue_name, database) as q:
            q.version()
            barrier.wait()
            return q.cron_install("tick", "cfg1", occurrences)

    created = run_together(5, install)
    assert sum(created) == 50, created
    assert Queue(queue_name, database).stats().delayed == 50


def test_an_install_that_waited_skips_occurrences_delivered_meanwhile(database: str, queue_name: str) -> None:
    """A cron install that waits for another installer of its prefix reads the
    time after the wait: an occurrence that fell due, and was delivered and
    acked, while it waited is not installed again (two schedulers delivered
    one occurrence twice)."""
    with Queue(queue_name, database) as q, psycopg.connect(database) as holder:
        due = datetime.now(UTC) + timedelta(seconds=2)  # still ahead once installed, on a busy machine too
        assert q.cron_install("tick", "cfg1", [(due, {})]) == 1
        # another installer of the prefix holds its lock (dq_cron_install's first step)
        holder.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s || '/tick', 0))", (queue_name,))

        def install_again() -> int:
            with Queue(queue_name, database) as other:
                return other.cron_install("tick", "cfg1", [(due, {})])

        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(install_again)
            wait_for(
                lambda: (
                    holder.execute(
                        "SELECT count(*) FROM pg_locks AS l JOIN pg_database AS d ON d.oid = l.database"
                        " WHERE l.locktype = 'advisory' AND NOT l.granted AND d.datname = current_database()"
                    ).fetchone()
                    == (1,)
                ),
                "the second install to wait for the prefix's lock",
            )
            delivered = wait_for(q.poll, "the occurrence to fall due")
            delivered.ack()
            holder.commit()
            assert waiting.result() == 0, "the delivered occurrence was installed again"
        stats = q.stats()
        assert stats.ready + stats.delayed + stats.leased == 0


def test_batches_in_any_key_order_never_deadlock(database: str, queue_name: str) -> None:
    keys = [f"k{i}" for i in range(300)]

    def offer_shuffled(i: int, barrier: threading.Barrier) -> int:
        rng = random.Random(i)
        with Queue(queue_name, database) as q:
            q.version()
            barrier.wait()
            for round_ in range(8):
                order = keys[:]
                rng.shuffle(order)
                q.offer_many([(k, {"round": round_, "writer": i}) for k in order])
                batch = q.poll_many(20, 60)
                q.ack_many([d.lock_token for d in batch])
        return 0

    run_together(4, offer_shuffled)  # any deadlock or unique violation raises here


def test_lease_expiry_redelivers(database: str, queue_name: str, conn: psycopg.Connection[Any]) -> None:
    q = Queue(queue_name, conn)
    q.offer("k", 1)
    first = q.poll(timedelta(seconds=2))  # long enough for the next poll to come first on a busy machine
    assert first is not None and q.poll() is None, "leased: invisible to other pollers"
    second = wait_for(q.poll, "the lease to run out")
    assert second is not None and second.redelivery and second.attempts == 2
    assert not q.ack(first.lock_token), "the expired, re-leased token is stale"
    assert q.ack(second.lock_token)


def test_counts_stay_exact_while_sessions_write_and_fold(database: str, queue_name: str) -> None:
    """Four sessions offer, send, poll, ack and nack one queue while a fifth
    folds the counts (dq__fold_counts) over and over: nobody waits for the
    counts or deadlocks on them, and dq_stats() of every queue, from the
    counts, equals a count of the messages at the end."""
    stop = threading.Event()

    def write(i: int, barrier: threading.Barrier) -> int:
        rng = random.Random(i)
        with Queue(queue_name, database) as q:
            q.version()
            barrier.wait()
            for n in range(60):
                later = datetime.now(UTC) + timedelta(minutes=rng.choice([0, 3, 15, 90]))
                q.offer(f"k{rng.randrange(40)}", {"n": n}, scheduled_at=later)
                q.send_many([{"n": n}] * rng.randrange(1, 5))
                for d in q.poll_many(rng.randrange(1, 6), lease=timedelta(minutes=rng.choice([1, 30]))):
                    # a concurrent offer of its key may have replaced the lease: stale is fine here
                    if rng.random() < 0.6:
                        q.ack(d.lock_token)
                    else:
                        q.nack(d.lock_token, later)
        return n

    def fold(barrier: threading.Barrier) -> int:
        folds = 0
        with psycopg.connect(database, autocommit=True) as conn:
            barrier.wait()
            while not stop.is_set():
                conn.execute("SELECT dq__fold_counts()")
                folds += 1
        return folds

    barrier = threading.Barrier(5)
    with ThreadPoolExecutor(5) as pool:
        folder = pool.submit(fold, barrier)
        writers = [pool.submit(write, i, barrier) for i in range(4)]
        assert [w.result() for w in writers] == [59] * 4
        stop.set()
        assert folder.result() > 0
    with psycopg.connect(database, autocommit=True) as conn:
        (now,) = conn.execute("SELECT dq_now()").fetchone() or (None,)
        counted, scanned = conn.execute(
            "SELECT ARRAY(SELECT row(s.*)::text FROM dq__counted_stats(%(now)s) AS s),"
            " ARRAY(SELECT row(s.*)::text FROM dq__scanned_stats(%(now)s) AS s)",
            {"now": now},
        ).fetchone() or (None, None)
    assert counted == scanned
    assert any(row.startswith(f"({queue_name},") for row in counted)


def test_history_stays_exact_while_sessions_ack_fold_and_expire(database: str, queue_name: str) -> None:
    """Four sessions ack and cancel in a queue with history (1.2) while a fifth
    folds its tallies (dq__fold_history) and expires records
    (dq__expire_history) over and over: nobody waits or deadlocks, no record
    or tally is lost or counted twice: the stats add up to the records."""
    stop = threading.Event()

    def finish(i: int, barrier: threading.Barrier) -> tuple[int, int]:
        acked = cancelled = 0
        with Queue(queue_name, database) as q:
            q.version()
            barrier.wait()
            for n in range(40):
                q.send_many([{"n": n}] * 3)
                q.offer(f"w{i}-{n}", {"n": n})
                acked += q.ack_many([d.lock_token for d in q.poll_many(3)])
                cancelled += q.cancel(f"w{i}-{n}")
        return acked, cancelled

    def fold(barrier: threading.Barrier) -> int:
        folds = 0
        with psycopg.connect(database, autocommit=True) as conn:
            barrier.wait()
            while not stop.is_set():
                conn.execute("SELECT dq__fold_history(), dq__expire_history(ARRAY[%s], 1000)", (queue_name,))
                folds += 1
        return folds

    with Queue(queue_name, database) as q:
        q.retain(timedelta(days=1))
    barrier = threading.Barrier(5)
    with ThreadPoolExecutor(5) as pool:
        folder = pool.submit(fold, barrier)
        workers = [pool.submit(finish, i, barrier) for i in range(4)]
        results = [w.result() for w in workers]
        stop.set()
        assert folder.result() > 0
    acked = sum(a for a, _ in results)
    cancelled = sum(c for _, c in results)
    with Queue(queue_name, database) as q:
        records = q.history(max_count=10_000)
        assert Counter(r.outcome for r in records) == Counter({"acked": acked, "cancelled": cancelled})
        for bucket in (timedelta(minutes=1), timedelta(seconds=1), timedelta(seconds=7)):
            stats = q.history_stats(datetime.now(UTC) - timedelta(hours=1), bucket)
            assert (sum(b.acked for b in stats), sum(b.cancelled for b in stats)) == (acked, cancelled), bucket


def test_an_ack_that_waited_for_retention_turned_on_records_it(database: str, queue_name: str) -> None:
    """dq_ack_many decides whether the trigger records its deletes once it
    holds the rows: a transaction holding one of them that turns retention
    on commits while the ack waits, and the ack is recorded."""
    with psycopg.connect(database, autocommit=True) as conn:
        q = Queue(queue_name, conn)
        q.offer("held", {"n": 1})
        (delivery,) = q.poll_many(1)
        with psycopg.connect(database) as holder:
            holder.execute("SELECT dq_extend(%s, '5 minutes')", (delivery.lock_token,))  # holds the row
            holder.execute("SELECT dq_retain(%s, '1 day')", (queue_name,))
            with psycopg.connect(database, autocommit=True) as acker, ThreadPoolExecutor(1) as pool:
                acked = pool.submit(
                    lambda: acker.execute("SELECT dq_ack_many(%s)", ([delivery.lock_token],)).fetchone()
                )
                wait_for(
                    lambda: (
                        acked.done()
                        or conn.execute(
                            "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                            (acker.info.backend_pid,),
                        ).fetchone()[0]
                    ),
                    "the ack to wait for the held row",
                )
                assert not acked.done(), "the ack waits for the row the holder has"
                holder.commit()
                assert acked.result(60) == (1,)
        assert [(r.key, r.outcome) for r in q.history()] == [("held", "acked")]
        assert outstanding(q, "ready", "delayed", "leased") == 0, "the counts lost the message too"
