"""No pgdq call deadlocks or hits a unique violation against any other (api-v1.1).

The contract: no single pgdq call, in autocommit or in a READ COMMITTED
transaction of its own, fails with a deadlock (40P01), a unique violation
(23505) or a serialization failure (40001) against any other pgdq calls,
dq_cron_install with different config hashes on one prefix included. A user
saw six sessions installing one prefix with two alternating config hashes
deadlock, so this checks every writing operation against every other one
(and against itself): a few autocommit sessions per side hammer one queue for
a bounded time on a deliberately tiny, overlapping key space. Plain keys sort
on both sides of the cron prefix, offers include the cron occurrence keys, a
schedule named like the cron prefix deletes the same occurrence rows, short
leases expire and get re-polled, and max_attempts buries messages, so every
operation keeps touching the rows the others lock. Any error at all fails the
pair; the message lists the failing calls with SQLSTATE, text and context.
PGDQ_DEADLOCK_SECONDS stretches each pair (default 0.6 s) for a deeper soak.

Besides the pairs: a four-session mix on a queue with max_attempts 1
(burying polls, dq_offer_many and dq_dead_redrive on the same keys, five pair
lengths: 3 s by default), and the same race step by step, where a redrive
waits while a later key is buried again or its dead letter purged. And a
race inside PostgreSQL that a poll must survive, replayed step by step with
gdb: SKIP LOCKED waiting on an update chain.
"""

from __future__ import annotations

import itertools
import os
import random
import shutil
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from queue import Empty, SimpleQueue
from typing import Any, LiteralString
from uuid import UUID

import psycopg
import pytest
from psycopg import sql
from psycopg.types.json import Jsonb

PAIR_SECONDS = float(os.environ.get("PGDQ_DEADLOCK_SECONDS", "0.6"))
SESSIONS_PER_SIDE = 2
# The sort order is the point: "k*" < "tick/0aaa/*" < "tick/<md5 hex>/*" <
# "tick/zzzz/*" < "u*", so batches of plain keys straddle the cron range, and
# a schedule named "tick" (md5 config hash) has its occurrences between the
# two cron hashes: each install deletes rows on both sides of its own range.
PLAIN_KEYS = ("k0", "k1", "k2", "k3", "u0", "u1", "u2", "u3")
PREFIX = "tick"
HASH_A = "0aaa"
HASH_B = "zzzz"
SCHEDULE_EXPRESSIONS = ("* * * * * *", "*/2 * * * * *")  # 6 fields: every (other) second
LEASES_MS = (50, 100, 200)
CONTRACT_SQLSTATES = {"40P01": "deadlock", "23505": "unique violation", "40001": "serialization failure"}


class CallFailed(Exception):
    """A pgdq call that raised: the function called and the server's error."""

    def __init__(self, function: str, error: psycopg.Error) -> None:
        super().__init__(function, error)
        self.function = function
        self.error = error


@dataclass(frozen=True)
class Workload:
    """What one pair's sessions share: the queue and its overlapping keys."""

    queue: str
    cron_times: tuple[datetime, ...]

    @property
    def occurrence_keys(self) -> tuple[str, ...]:
        """The cron occurrence keys of both config hashes."""
        return tuple(occurrence_key(PREFIX, h, at) for h in (HASH_A, HASH_B) for at in self.cron_times)

    @property
    def all_keys(self) -> tuple[str, ...]:
        """Every key offers pick from: plain keys and cron occurrence keys."""
        return PLAIN_KEYS + self.occurrence_keys


@dataclass(frozen=True)
class Failure:
    """One failed call, as the server reported it."""

    op: str
    function: str
    sqlstate: str
    message: str
    detail: str
    context: str

    def describe(self) -> str:
        """One readable paragraph: where, SQLSTATE, text, DETAIL and CONTEXT."""
        kind = CONTRACT_SQLSTATES.get(self.sqlstate, "unexpected error")
        text = f"[{self.op}] {self.function}: {self.sqlstate} ({kind}) {self.message}"
        if self.detail:
            text += f"\n    DETAIL: {self.detail}"
        if self.context:
            text += f"\n    CONTEXT: {self.context}"
        return text


@dataclass
class Tally:
    """What one session did: operations completed and calls that failed."""

    op: str
    rounds: int = 0
    failures: list[Failure] = field(default_factory=list)


Op = Callable[[psycopg.Connection[Any], random.Random, Workload], None]


def occurrence_key(prefix: str, config_hash: str, at: datetime) -> str:
    """The key dq_cron_install gives an occurrence (see dq__occurrence_key)."""
    return f"{prefix}/{config_hash}/{at.astimezone(UTC).strftime('%Y%m%dT%H%M%S.%fZ')}"


def call(conn: psycopg.Connection[Any], function: str, *args: object, column: LiteralString = "*") -> list[Any]:
    """SELECT column FROM function(args...): the first value of each row; raises CallFailed."""
    query = sql.SQL("SELECT {} FROM {}({})").format(
        sql.SQL(column), sql.Identifier(function), sql.SQL(", ").join([sql.Placeholder()] * len(args))
    )
    try:
        return [row[0] for row in conn.execute(query, args).fetchall()]
    except psycopg.Error as error:
        raise CallFailed(function, error) from error


def lease(rng: random.Random) -> timedelta:
    """A short lease, so leases expire and messages get polled again."""
    return timedelta(milliseconds=rng.choice(LEASES_MS))


def payloads(rng: random.Random, n: int) -> list[Jsonb]:
    """n small payloads from a tiny range, so offers both update and ignore."""
    return [Jsonb({"v": rng.randrange(3)}) for _ in range(n)]


def refill(conn: psycopg.Connection[Any], rng: random.Random, w: Workload) -> None:
    """Offer the plain keys again (half the time replacing, so leased ones become ready): keep the queue populated."""
    call(conn, "dq_offer_many", w.queue, list(PLAIN_KEYS), payloads(rng, len(PLAIN_KEYS)), None, rng.random() < 0.5)


def poll(conn: psycopg.Connection[Any], rng: random.Random, w: Workload) -> list[UUID]:
    """Lease 1..4 due messages; their lock tokens."""
    return call(conn, "dq_poll_many", w.queue, rng.randint(1, 4), lease(rng), column="lock_token")


def lease_some(conn: psycopg.Connection[Any], rng: random.Random, w: Workload) -> list[UUID]:
    """Lock tokens from a poll just before, refilling the queue once if nothing was due."""
    tokens = poll(conn, rng, w)
    if not tokens:
        refill(conn, rng, w)
        tokens = poll(conn, rng, w)
    return tokens


def cron_install(conn: psycopg.Connection[Any], rng: random.Random, w: Workload, config_hash: str) -> None:
    """Install the workload's future occurrences under config_hash."""
    times = list(w.cron_times)
    rng.shuffle(times)
    call(conn, "dq_cron_install", w.queue, PREFIX, config_hash, times, payloads(rng, len(times)), rng.random() < 0.5)


def set_schedule(conn: psycopg.Connection[Any], rng: random.Random, w: Workload) -> None:
    """Create or replace the schedule named like the cron prefix (one of four configurations)."""
    expression = rng.choice(SCHEDULE_EXPRESSIONS)
    call(conn, "dq_schedule_set", w.queue, PREFIX, expression, "UTC", Jsonb({"s": rng.randrange(2)}), rng.randint(1, 3))


def op_offer(conn: psycopg.Connection[Any], rng: random.Random, w: Workload) -> None:
    """dq_offer of one key, due now."""
    call(conn, "dq_offer", w.queue, rng.choice(w.all_keys), payloads(rng, 1)[0])


def offer_many(conn: psycopg.Connection[Any], rng: random.Random, w: Workload, descending: bool) -> None:
    """dq_offer_many of 3..6 keys (plain and occurrence keys), due now, in one key order."""
    keys = sorted(rng.sample(w.all_keys, rng.randint(3, 6)), reverse=descending)
    call(conn, "dq_offer_many", w.queue, keys, payloads(rng, len(keys)))


def op_cron_uninstall(conn: psycopg.Connection[Any], rng: random.Random, w: Workload) -> None:
    """dq_cron_uninstall of the prefix: every hash, or one of the two."""
    call(conn, "dq_cron_uninstall", w.queue, PREFIX, rng.choice((None, HASH_A, HASH_B)))


def op_poll_many(conn: psycopg.Connection[Any], rng: random.Random, w: Workload) -> None:
    """dq_poll_many with a short lease; refill when nothing was due."""
    if not poll(conn, rng, w):
        refill(conn, rng, w)


def op_ack_many(conn: psycopg.Connection[Any], rng: random.Random, w: Workload) -> None:
    """dq_ack_many of freshly polled tokens."""
    if tokens := lease_some(conn, rng, w):
        call(conn, "dq_ack_many", tokens)


def op_ack_poll(conn: psycopg.Connection[Any], rng: random.Random, w: Workload) -> None:
    """dq_ack_poll: ack freshly polled tokens and poll the next batch."""
    tokens = lease_some(conn, rng, w)
    call(conn, "dq_ack_poll", tokens, w.queue, rng.randint(1, 4), lease(rng))


def op_nack(conn: psycopg.Connection[Any], rng: random.Random, w: Workload) -> None:
    """dq_nack of freshly polled tokens, due now or a moment later, with state."""
    for token in lease_some(conn, rng, w):
        retry_at = rng.choice((None, datetime.now(UTC) + lease(rng)))
        call(conn, "dq_nack", token, retry_at, Jsonb({"nacked": rng.randrange(3)}))


def op_cancel(conn: psycopg.Connection[Any], rng: random.Random, w: Workload) -> None:
    """dq_cancel of one key (leased or not)."""
    call(conn, "dq_cancel", w.queue, rng.choice(w.all_keys))


def op_purge(conn: psycopg.Connection[Any], rng: random.Random, w: Workload) -> None:
    """dq_purge of the queue; refill when it was empty already."""
    if call(conn, "dq_purge", w.queue) == [0]:
        refill(conn, rng, w)


def op_dead_letter(conn: psycopg.Connection[Any], rng: random.Random, w: Workload) -> None:
    """dq_dead_letter of freshly polled tokens."""
    for token in lease_some(conn, rng, w):
        call(conn, "dq_dead_letter", token, "given up by the test")


def op_dead_redrive(conn: psycopg.Connection[Any], rng: random.Random, w: Workload) -> None:
    """dq_dead_redrive of the queue or one key; bury a polled message when nothing was redriven."""
    key = rng.choice((None, *PLAIN_KEYS))
    if call(conn, "dq_dead_redrive", w.queue, key) == [0]:
        for token in lease_some(conn, rng, w)[:1]:
            call(conn, "dq_dead_letter", token, "buried for the next redrive")


def op_schedule_remove(conn: psycopg.Connection[Any], rng: random.Random, w: Workload) -> None:
    """dq_schedule_remove of the schedule named like the cron prefix; set it again when it was gone."""
    if call(conn, "dq_schedule_remove", w.queue, PREFIX) == [False]:
        set_schedule(conn, rng, w)


def op_configure(conn: psycopg.Connection[Any], rng: random.Random, w: Workload) -> None:
    """dq_configure max_attempts: no limit, or so low that expired leases get buried."""
    call(conn, "dq_configure", w.queue, rng.choice((None, 1, 2, 3)))


OPS: dict[str, Op] = {
    "offer": op_offer,
    "offer_many_asc": lambda conn, rng, w: offer_many(conn, rng, w, descending=False),
    "offer_many_desc": lambda conn, rng, w: offer_many(conn, rng, w, descending=True),
    "cron_install_A": lambda conn, rng, w: cron_install(conn, rng, w, HASH_A),
    "cron_install_B": lambda conn, rng, w: cron_install(conn, rng, w, HASH_B),
    "cron_uninstall": op_cron_uninstall,
    "poll_many": op_poll_many,
    "ack_many": op_ack_many,
    "ack_poll": op_ack_poll,
    "nack": op_nack,
    "cancel": op_cancel,
    "purge": op_purge,
    "dead_letter": op_dead_letter,
    "dead_redrive": op_dead_redrive,
    "schedule_set": set_schedule,
    "schedule_remove": op_schedule_remove,
    "configure": op_configure,
}
PAIRS = list(itertools.combinations_with_replacement(OPS, 2))


def connect(database: str, name: str) -> psycopg.Connection[Any]:
    """An autocommit session that detects deadlocks fast and never hangs the suite."""
    conn = psycopg.connect(database, autocommit=True, application_name=f"deadlocks:{name}")
    conn.execute("SET deadlock_timeout = '20ms'")
    conn.execute("SET statement_timeout = '30s'")
    return conn


def failure(op: str, failed: CallFailed) -> Failure:
    """The Failure record of a CallFailed."""
    diag = failed.error.diag
    return Failure(
        op=op,
        function=failed.function,
        sqlstate=failed.error.sqlstate or "?????",
        message=diag.message_primary or str(failed.error),
        detail=(diag.message_detail or "").replace("\n", "\n            "),
        context=call_stack(diag.context or ""),
    )


def call_stack(context: str) -> str:
    """The CONTEXT frames that say where (function and line), without the statements' full text."""
    frames = [line for line in context.splitlines() if line.startswith(("PL/pgSQL function", "SQL function", "while "))]
    return " <- ".join(frames) or context


def hammer(
    database: str, op: str, seed: str, w: Workload, start: threading.Barrier, ops: dict[str, Op], seconds: float
) -> Tally:
    """Run ops[op] in a loop for seconds after the start line; what it did."""
    rng = random.Random(seed)
    tally = Tally(op)
    with connect(database, op) as conn:
        start.wait(timeout=60)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not conn.broken:
            try:
                ops[op](conn, rng, w)
                tally.rounds += 1
            except CallFailed as failed:
                tally.failures.append(failure(op, failed))
    return tally


def run_sessions(
    database: str,
    w: Workload,
    ops: Sequence[str],
    seed: str,
    table: dict[str, Op] = OPS,
    seconds: float = PAIR_SECONDS,
) -> list[Tally]:
    """One thread and session per entry of ops (names in table), started
    together, each for seconds; joined, so calls in flight count."""
    start = threading.Barrier(len(ops))
    with ThreadPoolExecutor(len(ops)) as pool:
        futures = [
            pool.submit(hammer, database, op, f"{seed}/{i}", w, start, table, seconds) for i, op in enumerate(ops)
        ]
        return [f.result() for f in futures]


def report(failures: Sequence[Failure], shown: int = 5) -> str:
    """Counts per (function, SQLSTATE), then the first few failures in full."""
    counts = Counter((f.function, f.sqlstate) for f in failures)
    lines = [f"{len(failures)} failed call(s): " + ", ".join(f"{fn} {st} x{n}" for (fn, st), n in counts.items())]
    lines += [f.describe() for f in failures[:shown]]
    return "\n".join(lines)


def prepare(conn: psycopg.Connection[Any], queue: str) -> Workload:
    """A fresh queue with everything in it: ready messages, both hashes' occurrences,
    the schedule, dead letters and max_attempts."""
    now = datetime.now(UTC).replace(microsecond=123456)
    w = Workload(queue, tuple(now + timedelta(minutes=10 + i) for i in range(4)))
    rng = random.Random(queue)
    call(conn, "dq_purge", queue)
    call(conn, "dq_configure", queue, 3)
    refill(conn, rng, w)
    cron_install(conn, rng, w, HASH_B)
    assert call(conn, "dq_get", queue, w.occurrence_keys[-1], column="key"), "occurrence_key() matches dq_cron_install"
    hash_a_keys = [k for k in w.occurrence_keys if k.startswith(f"{PREFIX}/{HASH_A}/")]
    call(conn, "dq_offer_many", queue, hash_a_keys, payloads(rng, len(hash_a_keys)), list(w.cron_times))
    set_schedule(conn, rng, w)
    for token in poll(conn, rng, w):
        call(conn, "dq_dead_letter", token, "dead before the start")
    refill(conn, rng, w)
    return w


@pytest.mark.parametrize(("first", "second"), PAIRS, ids=[f"{a}-{b}" for a, b in PAIRS])
def test_no_deadlock_between(database: str, first: str, second: str) -> None:
    with psycopg.connect(database, autocommit=True) as conn:
        w = prepare(conn, f"deadlocks-{first}-{second}")
    ops = [first] * SESSIONS_PER_SIDE + [second] * SESSIONS_PER_SIDE
    tallies = run_sessions(database, w, ops, seed=w.queue)
    failures = [f for t in tallies for f in t.failures]
    assert not failures, f"{first} vs {second}: " + report(failures)
    assert all(t.rounds > 0 for t in tallies), [(t.op, t.rounds) for t in tallies]


# The user's report: six sessions installing one prefix, alternating between
# two config hashes, ten rounds each: one call failed with "deadlock detected".
REPORT_SESSIONS = 6
REPORT_ROUNDS = int(os.environ.get("PGDQ_DEADLOCK_ROUNDS", "10"))
REPORT_OCCURRENCES = 20


def install_rounds(database: str, queue: str, session: int, start: threading.Barrier) -> list[Failure]:
    """REPORT_ROUNDS dq_cron_install calls in step with the other sessions, hash A and B in turn."""
    base = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=5)
    times = [base + timedelta(minutes=i) for i in range(REPORT_OCCURRENCES)]
    ticks = [Jsonb({"tick": i}) for i in range(REPORT_OCCURRENCES)]
    failures = []
    with connect(database, f"report-{session}") as conn:
        for round_ in range(REPORT_ROUNDS):
            config_hash = (HASH_A, HASH_B)[(session + round_) % 2]
            start.wait(timeout=60)
            try:
                call(conn, "dq_cron_install", queue, PREFIX, config_hash, times, ticks)
            except CallFailed as failed:
                failures.append(failure(f"session {session} round {round_}", failed))
    return failures


def test_six_sessions_install_one_prefix_with_alternating_hashes(database: str) -> None:
    queue = "deadlocks-user-report"
    with psycopg.connect(database, autocommit=True) as conn:
        call(conn, "dq_purge", queue)
    start = threading.Barrier(REPORT_SESSIONS)
    with ThreadPoolExecutor(REPORT_SESSIONS) as pool:
        futures = [pool.submit(install_rounds, database, queue, i, start) for i in range(REPORT_SESSIONS)]
        failures = [f for future in futures for f in future.result()]
    assert not failures, report(failures)
    with psycopg.connect(database, autocommit=True) as conn:
        remaining = call(conn, "dq_stats", queue, column="delayed")
    assert remaining == [REPORT_OCCURRENCES], "one configuration's occurrences are left"


# Issue 11, finding 3: polls that bury messages against dq_dead_redrive.
# A queue with max_attempts 1 and four sessions: dq_offer_many re-offering
# keys that have dead letters, two pollers with 5 ms leases that never ack
# (each buries the other's expired leases: every message is buried on its
# second delivery) and dq_dead_redrive in a loop. Every key keeps cycling
# through offer, lease, bury and redrive, so a redrive that waited keeps
# meeting keys offered, leased and buried after its statement's snapshot.
# 1.0.0 locked the dead letters (those its NOT EXISTS, from that snapshot,
# let through) before it inserted their messages, while a bury holds the
# message and then wants the dead letter: 40P01 in most runs of this test,
# now and then in a three-way cycle through dq_offer_many.
MIX_SECONDS = 5 * PAIR_SECONDS
MIX_KEYS = tuple(f"m{i:02d}" for i in range(12))
MIX_LEASE = timedelta(milliseconds=5)
MIX_BATCH = len(MIX_KEYS)
MIX_REDRIVEN: list[int] = []  # what each dq_dead_redrive call returned


def mix_offer_dead_keys(conn: psycopg.Connection[Any], rng: random.Random, w: Workload) -> None:
    """dq_offer_many of 1..MIX_BATCH keys that have dead letters (any keys while there are none)."""
    dead = call(conn, "dq_dead_list", w.queue, len(MIX_KEYS), column="key") or list(MIX_KEYS)
    keys = rng.sample(dead, rng.randint(1, min(MIX_BATCH, len(dead))))
    call(conn, "dq_offer_many", w.queue, keys, payloads(rng, len(keys)))


def mix_poll_bury(conn: psycopg.Connection[Any], rng: random.Random, w: Workload) -> None:
    """dq_poll_many of 1..MIX_BATCH messages with a 5 ms lease, never acked: the next poll buries them."""
    call(conn, "dq_poll_many", w.queue, rng.randint(1, MIX_BATCH), MIX_LEASE, column="id")


def mix_redrive(conn: psycopg.Connection[Any], rng: random.Random, w: Workload) -> None:
    """dq_dead_redrive of one key, now and then of the whole queue; counts what it re-offered."""
    MIX_REDRIVEN.extend(call(conn, "dq_dead_redrive", w.queue, rng.choice((None, None, None, *MIX_KEYS))))


MIX_OPS: dict[str, Op] = {
    "offer_many_dead": mix_offer_dead_keys,
    "poll_bury": mix_poll_bury,
    "dead_redrive": mix_redrive,
}


def test_no_deadlock_between_burying_polls_redrive_and_offers(database: str) -> None:
    queue = "deadlocks-bury-redrive"
    w = Workload(queue, ())
    with psycopg.connect(database, autocommit=True) as conn:
        call(conn, "dq_purge", queue)
        call(conn, "dq_dead_purge", queue)
        call(conn, "dq_configure", queue, 1)
        call(conn, "dq_offer_many", queue, list(MIX_KEYS), payloads(random.Random(queue), len(MIX_KEYS)))
    ops = ["offer_many_dead", "poll_bury", "poll_bury", "dead_redrive"]
    MIX_REDRIVEN.clear()
    tallies = run_sessions(database, w, ops, seed=queue, table=MIX_OPS, seconds=MIX_SECONDS)
    failures = [f for t in tallies for f in t.failures]
    assert not failures, "burying polls vs redrive vs offers: " + report(failures)
    assert all(t.rounds > 0 for t in tallies), [(t.op, t.rounds) for t in tallies]
    assert sum(MIX_REDRIVEN) > 0, "polls buried messages and the redrive re-offered them"


# The same race, step by step: a redrive's statement snapshot goes stale
# while its insert waits for an uncommitted offer of an earlier key, and
# meanwhile a later key is offered, delivered and buried again (its dead
# letter replaced), or its dead letter is purged. 1.0.0 deadlocked with the
# bury here, or re-offered the stale payload and removed the newer dead
# letter (the newer payload was lost); the message-first redrive of 1.1.0
# did the latter every time, and re-offered a dead letter that dq_dead_purge
# had deleted and counted.
def bury(conn: psycopg.Connection[Any], queue: str, key: str, payload: dict[str, str]) -> None:
    """Offer key with payload, lease it and dead-letter it."""
    call(conn, "dq_offer", queue, key, Jsonb(payload))
    tokens = call(conn, "dq_poll_many", queue, 10, timedelta(minutes=5), column="lock_token")
    assert len(tokens) == 1, "only the key just offered is ready"
    assert call(conn, "dq_dead_letter", tokens[0], "failed") == [True]


def message(conn: psycopg.Connection[Any], queue: str, key: str) -> tuple[Any, ...] | None:
    """key's live message as (payload, attempts), None when there is none."""
    row = conn.execute("SELECT payload, attempts FROM dq_get(%s, %s)", (queue, key)).fetchone()
    return None if row is None else tuple(row)


def in_thread(run: Callable[[], list[Any]]) -> tuple[threading.Thread, list[Any]]:
    """Start run in a thread; the list gets its result or the CallFailed it raised."""
    outcome: list[Any] = []

    def target() -> None:
        try:
            outcome.append(run())
        except CallFailed as failed:
            outcome.append(failed)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


def wait_blocked_or_done(admin: psycopg.Connection[Any], pid: int, thread: threading.Thread) -> None:
    """Until the session pid waits for a lock, or thread has finished (60 s at most)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if not thread.is_alive():
            return
        waits = admin.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
        if waits and waits[0] == "Lock":
            return
        time.sleep(0.01)
    raise AssertionError(f"session {pid} neither waited for a lock nor finished")


def results(*outcomes: list[Any]) -> list[Any]:
    """Each outcome's value; fails with the calls that raised."""
    failed = [o[0] for o in outcomes if o and isinstance(o[0], CallFailed)]
    assert not failed, report([failure("race", f) for f in failed])
    assert all(len(o) == 1 for o in outcomes), "every call finished"
    return [o[0] for o in outcomes]


@pytest.mark.parametrize("meanwhile", ["buried_again", "purged"])
def test_redrive_that_waited_reoffers_exactly_the_dead_letters_it_removes(database: str, meanwhile: str) -> None:
    queue = f"deadlocks-redrive-waited-{meanwhile}"
    with (
        connect(database, "setup") as conn,
        connect(database, "redrive") as redriver,
        connect(database, "meanwhile") as other,
        psycopg.connect(database) as holder,
        psycopg.connect(database, autocommit=True) as admin,
    ):
        call(conn, "dq_purge", queue)
        call(conn, "dq_dead_purge", queue)
        bury(conn, queue, "a", {"v": "a-old"})
        bury(conn, queue, "b", {"v": "b-old"})
        call(holder, "dq_offer", queue, "a", Jsonb({"v": "a-live"}))  # not committed yet
        redrive, redriven = in_thread(lambda: call(redriver, "dq_dead_redrive", queue))
        wait_blocked_or_done(admin, redriver.info.backend_pid, redrive)
        assert redrive.is_alive(), "the redrive waits for the uncommitted offer of a"

        if meanwhile == "buried_again":
            call(other, "dq_offer", queue, "b", Jsonb({"v": "b-new"}))
            (token,) = call(other, "dq_poll_many", queue, 10, timedelta(minutes=5), column="lock_token")
            step, stepped = in_thread(lambda: call(other, "dq_dead_letter", token, "failed again"))
        else:
            step, stepped = in_thread(lambda: call(other, "dq_dead_purge", queue, "b"))
        wait_blocked_or_done(admin, other.info.backend_pid, step)
        holder.commit()
        redrive.join(30)
        step.join(30)
        (count,), (stepped_result,) = results(redriven, stepped)

        live = {k: message(conn, queue, k) for k in ("a", "b")}
        dead = {r[0]: r[1] for r in conn.execute("SELECT key, payload FROM dq_dead_list(%s)", (queue,))}
    assert live["a"] == ({"v": "a-live"}, 0) and dead["a"] == {"v": "a-old"}, "a has a live message: left alone"
    if meanwhile == "buried_again":
        # the bury came first (the redrive waited): the redrive re-offers the newer dead letter
        seen = (stepped_result, count, live.get("b"), dead.get("b"))
        assert seen == (True, 1, ({"v": "b-new"}, 0), None), f"(buried, redriven, message b, dead letter b): {seen}"
    else:
        # one of them came first: purged and not re-offered, or re-offered and not purged
        seen = (stepped_result, count, live.get("b"), dead.get("b"))
        assert seen in ((1, 0, None, None), (0, 1, ({"v": "b-old"}, 0), None)), (
            f"(purged, redriven, message b, dead letter b): {seen}"
        )


class Paused:
    """gdb attached to a server process, which runs until it first calls
    function and then waits there until resume(). A context manager: on the
    way out, however the test ended, the process is let go (a process left
    stopped would hang every DROP DATABASE of the cluster)."""

    def __init__(self, pid: int, function: str) -> None:
        self.gdb = subprocess.Popen(
            # the server's own signals (SIGUSR1 for every barrier, latch and
            # catch-up) pass straight to it: a stop on one would wait forever
            ["gdb", "-q", "-nx", "-p", str(pid), "-ex", "set pagination off"]
            + ["-ex", "handle all nostop noprint pass", "-ex", f"break {function}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: SimpleQueue[str | None] = SimpleQueue()
        threading.Thread(target=self._read, daemon=True).start()
        self.stopped_at_function = False

    def __enter__(self) -> Paused:
        try:
            self.says("Breakpoint 1 at", "continue\n")
        except BaseException:
            self.gdb.kill()  # attached, it stopped the process: gdb's end lets it go
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.gdb.poll() is None:
            if not self.stopped_at_function:
                self.gdb.send_signal(signal.SIGINT)  # stops the process: gdb reads commands again
            self.resume()

    def _read(self) -> None:
        """gdb's output, line by line, then None when it ends."""
        assert self.gdb.stdout
        for line in self.gdb.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def says(self, text: str, then: str) -> None:
        """Wait until a line of gdb's holds text, then send it the then
        command; skips the test when gdb may not attach (ptrace refused)."""
        assert self.gdb.stdin
        deadline = time.monotonic() + 60
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except Empty:
                raise AssertionError(f"gdb did not say {text!r} within 60 s") from None
            if line is None:
                break
            if "ptrace:" in line or "Could not attach" in line:
                pytest.skip(f"gdb cannot stop a server process here: {line.strip()}")
            if text in line:
                self.gdb.stdin.write(then)
                self.gdb.stdin.flush()
                return
        raise AssertionError(f"gdb ended before saying {text!r}")

    def stopped(self) -> None:
        """Until the process reached function."""
        self.says("Breakpoint 1,", "delete\n")
        self.stopped_at_function = True

    def resume(self) -> None:
        """Let the process go on (and gdb end)."""
        assert self.gdb.stdin
        self.gdb.stdin.write("detach\nquit\n")
        self.gdb.stdin.flush()
        try:
            self.gdb.wait(30)
        except subprocess.TimeoutExpired:
            self.gdb.kill()
            raise


# PostgreSQL's SKIP LOCKED skips a row whose updater is in progress; but when
# that updater commits between the check and the lock (heap_lock_tuple), the
# scan locks the row's newer versions too (heap_lock_updated_tuple) and waits
# for whoever holds them, whatever SKIP LOCKED says, holding the rows it locked
# before. The race is narrow (CI met it once, in the ack_poll-dead_letter pair);
# gdb holds it open: the poll stops in ConditionalXactLockTableWait.
@pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb is not installed (make deps installs it)")
def test_a_poll_that_waits_on_an_update_chain_lets_its_rows_go(database: str) -> None:
    queue = "deadlocks-update-chain"
    now = datetime.now(UTC)
    with (
        connect(database, "setup") as conn,
        psycopg.connect(database) as updater,
        connect(database, "poll") as poller,
        connect(database, "offer") as offerer,
        psycopg.connect(database, autocommit=True) as admin,
        ExitStack() as stack,  # gdb lets the poll go before the connections close
    ):
        call(conn, "dq_purge", queue)
        call(conn, "dq_offer", queue, "z", Jsonb({"v": 0}), now - timedelta(seconds=2))  # polled first
        call(conn, "dq_offer", queue, "a", Jsonb({"v": 0}), now - timedelta(seconds=1))
        call(updater, "dq_offer", queue, "a", Jsonb({"v": 1}), now - timedelta(seconds=1), True)  # not committed
        paused = stack.enter_context(Paused(poller.info.backend_pid, "ConditionalXactLockTableWait"))
        poll, polled = in_thread(lambda: call(poller, "dq_poll_many", queue, 2, timedelta(minutes=1), column="key"))
        paused.stopped()  # the poll locked z and found a's update in progress
        updater.commit()
        # the offer updates a's new version, then waits for z (key order)
        offer, offered = in_thread(
            lambda: call(
                offerer, "dq_offer_many", queue, ["a", "z"], [Jsonb({"v": 2})] * 2, None, True, column="outcome"
            )
        )
        wait_blocked_or_done(admin, offerer.info.backend_pid, offer)
        assert offer.is_alive(), "the offer waits for z, which the poll holds"
        paused.resume()  # the poll locks a's newer versions: it waits for the offer
        poll.join(30)
        offer.join(30)
        keys, outcome = results(polled, offered)
        # the poll took what the offer did not hold when it picked again
        assert set(keys) <= {"a", "z"} and len(set(keys)) == len(keys), keys
        assert outcome == ["updated", "updated"], outcome
        assert message(conn, queue, "a") and message(conn, queue, "z"), "both messages are there"


def lease_keys(conn: psycopg.Connection[Any], queue: str, keys: Sequence[str]) -> dict[str, UUID]:
    """Offer keys due now and lease them all: their lock tokens by key."""
    call(conn, "dq_offer_many", queue, list(keys), [Jsonb({"v": 0})] * len(keys))
    rows = conn.execute("SELECT key, lock_token FROM dq_poll_many(%s, %s)", (queue, len(keys))).fetchall()
    assert len(rows) == len(keys), rows
    return dict(rows)


# A batch ack deletes its rows as the tokens come, not in key order: it waits
# 1 ms at most for a row, then lets go of what it deleted and locks its rows in
# key order. Here it deletes z, then waits for a, which an offer holds; the
# offer then needs z. Waiting on, the two would deadlock.
def test_an_ack_that_waits_lets_its_rows_go(database: str) -> None:
    queue = "deadlocks-ack-lets-go"
    with (
        connect(database, "setup") as conn,
        psycopg.connect(database, application_name="deadlocks:offer") as offerer,
        connect(database, "ack") as acker,
        psycopg.connect(database, autocommit=True) as admin,
    ):
        call(conn, "dq_purge", queue)
        tokens = lease_keys(conn, queue, ["a", "z"])
        offerer.execute("SET deadlock_timeout = '20ms'")
        acker.execute("SET deadlock_timeout = '10s'")  # in a deadlock, the offer would fail
        assert call(offerer, "dq_offer", queue, "a", Jsonb({"v": 1}), None, True) == ["updated"]
        ack, acked = in_thread(lambda: call(acker, "dq_ack_many", [tokens["z"], tokens["a"]]))
        wait_blocked_or_done(admin, acker.info.backend_pid, ack)
        assert ack.is_alive(), "the ack waits for a, which the offer holds"
        # z is free again: the ack let it go (waiting on, it would hold z)
        assert call(offerer, "dq_offer", queue, "z", Jsonb({"v": 1}), None, True) == ["updated"]
        offerer.commit()
        ack.join(30)
        (deleted,) = results(acked)
        # the updates ended both deliveries: the ack, in key order after them, acks neither
        assert deleted == [0]
        assert message(conn, queue, "a") == message(conn, queue, "z") == ({"v": 1}, 0), "updated, undelivered"


# The same ack decides before it deletes that no queue keeps history, and so
# counts its rows itself instead of the trigger that records. A transaction
# that holds one of its rows and turns retention on can commit while the
# first try waits for that row: the ack asks again after its delete, and
# acks again in key order through the trigger. Replayed with gdb: the ack's
# backend stops where it is about to wait for the holder.
@pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb is not installed (make deps installs it)")
def test_an_ack_whose_wait_ended_as_retention_began_records_it(database: str) -> None:
    queue = "deadlocks-ack-retention"
    with (
        connect(database, "setup") as conn,
        psycopg.connect(database) as holder,
        connect(database, "ack") as acker,
        ExitStack() as stack,  # gdb lets the ack go before the connections close
    ):
        call(conn, "dq_purge", queue)
        tokens = lease_keys(conn, queue, ["held"])
        holder.execute("SELECT dq_extend(%s, '5 minutes')", (tokens["held"],))  # holds the row
        holder.execute("SELECT dq_retain(%s, '1 day')", (queue,))
        stack.callback(call, conn, "dq_retain", queue, None)  # the other tests' acks count themselves
        paused = stack.enter_context(Paused(acker.info.backend_pid, "XactLockTableWait"))
        ack, acked = in_thread(lambda: call(acker, "dq_ack_many", [tokens["held"]]))
        paused.stopped()  # the ack found the held row, before it waits
        holder.commit()
        paused.resume()  # its wait ends at once
        ack.join(30)
        assert results(acked) == [[1]]
        records = conn.execute("SELECT key, outcome FROM dq_history(%s)", (queue,)).fetchall()
        assert records == [("held", "acked")], "the ack is recorded"
