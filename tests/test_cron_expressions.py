"""Cron expressions evaluated in SQL (dq_cron_next, 62_cron_expressions.sql)
against croniter: random expressions (lists, ranges, steps, names, an
optional leading seconds field) at random instants, many of them around the
DST changes of New York, Bucharest and Lord Howe (a 30-minute shift), and
its errors; the occurrences a poll materialises after a while against
croniter's; a statement timeout while a schedule is materialised. (Python's
CronService: test_cron_service.py; database schedules: test_schedules.py.)"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
from conftest import examples
from croniter import CroniterBadDateError, croniter
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from waiting import PATIENCE, wait_for

ZONES = ["America/New_York", "Europe/Bucharest", "Australia/Lord_Howe", "UTC"]
# local days on which the zones change their clocks (2025-2027)
SHIFTS = [
    datetime(2025, 3, 9), datetime(2025, 11, 2), datetime(2026, 3, 8), datetime(2026, 11, 1),  # New York
    datetime(2025, 3, 30), datetime(2025, 10, 26), datetime(2026, 3, 29), datetime(2026, 10, 25),  # Bucharest
    datetime(2025, 4, 6), datetime(2025, 10, 5), datetime(2026, 4, 5), datetime(2026, 10, 4),  # Lord Howe
]  # fmt: skip
MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]


def field(lo: int, hi: int, names: list[str] | None = None) -> st.SearchStrategy[str]:
    """One cron field: *, */n, a, a-b, a/n, a-b/n, or a list of the last four."""

    def value(v: int) -> st.SearchStrategy[str]:
        if names is None:
            return st.just(str(v))
        return st.sampled_from([str(v), names[v - lo].upper(), names[v - lo]])

    @st.composite
    def part(draw: Any) -> str:
        a = draw(st.integers(lo, hi - 1))
        # b > a: croniter 7 reads a one-value range such as "1-1" in the day
        # field as every day (a croniter bug); pgdq reads it as day 1
        b = draw(st.integers(a + 1, hi))
        step = draw(st.integers(1, max(1, (hi - lo) // 2 + 1)))
        kind = draw(st.sampled_from(["one", "range", "from-step", "range-step"]))
        if kind == "one":
            return str(draw(value(a)))
        if kind == "from-step":
            return f"{a}/{step}"
        text = f"{draw(value(a))}-{draw(value(b))}"
        return text if kind == "range" else f"{text}/{step}"

    star = st.sampled_from(["*"]) | st.integers(1, max(1, (hi - lo) // 2)).map(lambda n: f"*/{n}")
    return star | st.lists(part(), min_size=1, max_size=3).map(",".join)


@st.composite
def expressions(draw: Any) -> str:
    fields = [
        draw(field(0, 59)),
        draw(field(0, 23)),
        draw(field(1, 31)),
        draw(field(1, 12, MONTHS)),
        draw(field(0, 6, DAYS)),
    ]
    if draw(st.booleans()):
        fields.insert(0, draw(field(0, 59)))
    return " ".join(fields)


@st.composite
def instants(draw: Any) -> datetime:
    if draw(st.booleans()):  # near a clock change
        day = draw(st.sampled_from(SHIFTS))
        return (day + timedelta(seconds=draw(st.integers(-6 * 3600, 30 * 3600)))).replace(tzinfo=UTC) - timedelta(
            hours=draw(st.integers(-11, 5))
        )
    seconds = draw(st.integers(0, 3 * 365 * 86400))
    return datetime(2025, 1, 1, tzinfo=UTC) + timedelta(seconds=seconds, microseconds=draw(st.integers(0, 999_999)))


@pytest.fixture(scope="module")
def server(database: str) -> Any:
    with psycopg.connect(database, autocommit=True) as conn:
        yield conn


def croniter_next(expression: str, after: datetime, zone: str) -> datetime | None:
    seconds_first = len(expression.split()) == 6
    try:
        it = croniter(expression, after.astimezone(ZoneInfo(zone)), second_at_beginning=seconds_first)
        found: datetime = it.get_next(datetime)
    except CroniterBadDateError:
        return None
    return found


# 2,000 examples took over pytest.ini's 300 s on 2 loaded cores: a hang guard, not a speed to meet
@pytest.mark.timeout(900)
@settings(
    max_examples=examples(2000),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(expression=expressions(), after=instants(), zone=st.sampled_from(ZONES))
def test_agrees_with_croniter(server: Any, expression: str, after: datetime, zone: str) -> None:
    expected = croniter_next(expression, after, zone)
    assume(expected is not None and expected - after < timedelta(days=5 * 365))
    row = server.execute("SELECT dq_cron_next(%s, %s, %s)", (expression, after, zone)).fetchone()
    # compared as UTC instants: Python's == of aware datetimes in different
    # zones is always False when one of them falls in a DST fold (PEP 495)
    assert row[0].astimezone(UTC) == expected.astimezone(UTC), f"{expression!r} after {after.isoformat()} in {zone}"


@pytest.mark.parametrize(
    ("expression", "zone", "message"),
    [
        ("* * * *", "UTC", "5 fields"),
        ("61 * * * *", "UTC", "minute field"),
        ("* * 0 * *", "UTC", "day of month field"),
        ("* * * foo *", "UTC", "month field"),
        ("* * * * 8", "UTC", "day of week field"),
        ("*/0 * * * *", "UTC", "minute field"),
        ("5-1 * * * *", "UTC", "reversed"),
        ("0 0 L * *", "UTC", "day of month field"),
        ("0 0 * * *", "Mars/Olympus", "time zone"),
    ],
)
def test_invalid_expressions_are_clear_errors(server: Any, expression: str, zone: str, message: str) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
        server.execute("SELECT dq_cron_next(%s, now(), %s)", (expression, zone))


def test_nulls_are_errors(server: Any) -> None:
    for args in ((None, datetime.now(UTC), "UTC"), ("* * * * *", None, "UTC"), ("* * * * *", datetime.now(UTC), None)):
        with pytest.raises(psycopg.errors.NullValueNotAllowed):
            server.execute("SELECT dq_cron_next(%s, %s, %s)", args)


# -- materialisation: the most recent occurrences, bounded, isolated (1.1) ----


@settings(
    max_examples=examples(400),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    expression=expressions(),
    until=instants(),
    zone=st.sampled_from(ZONES),
    idle=st.integers(1, 3 * 86400),
    keep=st.sampled_from([1, 2, 3, 10, 100]),
)
def test_due_occurrences_are_the_most_recent(
    server: Any, expression: str, until: datetime, zone: str, idle: int, keep: int
) -> None:
    """What a poll delivers after `idle` seconds: the `keep` most recent of
    croniter's occurrences from next_at to until, DST changes included."""
    next_at = (until - timedelta(seconds=idle)).replace(microsecond=0)
    seconds_first = len(expression.split()) == 6
    it = croniter(
        expression, (next_at - timedelta(seconds=1)).astimezone(ZoneInfo(zone)), second_at_beginning=seconds_first
    )
    expected: list[datetime] = []
    try:
        while (at := it.get_next(datetime)) <= until:
            expected.append(at.astimezone(UTC))
            assume(len(expected) <= 20_000)
    except CroniterBadDateError:
        pass
    row = server.execute(
        "SELECT dq__due_occurrences(%s, %s, %s, %s, %s)", (expression, zone, next_at, until, keep)
    ).fetchone()
    assert [at.astimezone(UTC) for at in row[0]] == expected[-keep:], f"{expression!r} {next_at} .. {until} in {zone}"


def _occurrence_setup(conn: Any, queue: str) -> str:
    """An hourly schedule and an ordinary message on queue (the clock pinned
    at 09:30); the key of the schedule's 10:00 occurrence."""
    conn.execute("SET dq.now = '2024-01-01 09:30:00+00'")
    conn.execute("SELECT dq_schedule_set(%s, 'hourly', '0 * * * *')", (queue,))
    conn.execute("SELECT dq_offer(%s, 'plain', '{}')", (queue,))
    row = conn.execute(
        "SELECT dq__occurrence_key('hourly', dq__schedule_hash('0 * * * *', 'UTC', '{}'), '2024-01-01 10:00+00')"
    ).fetchone()
    return str(row[0])


def _hold_the_occurrence(poller: Any, holder: Any, queue: str) -> None:
    """_occurrence_setup on queue, the 10:00 occurrence's key offered in
    holder's open transaction, poller's clock at 10:00:30: a poll of queue
    that materialises the schedule waits for holder."""
    key = _occurrence_setup(poller, queue)
    holder.execute("SELECT dq_offer(%s, %s, '{}', '2024-01-01 10:00+00')", (queue, key))  # not committed
    poller.execute("SET dq.now = '2024-01-01 10:00:30+00'")


def test_a_statement_timeout_while_materialising_is_the_schedules_error(database: str) -> None:
    """Another transaction holds the occurrence's key, so the poll's insert
    waits until its statement timeout fires: the poll still delivers the
    queue's ordinary message and the schedule keeps the error (1.0.0: every
    such poll failed)."""
    queue = "cron_lock_timeout"
    with psycopg.connect(database, autocommit=True) as poller, psycopg.connect(database) as holder:
        _hold_the_occurrence(poller, holder, queue)
        # long enough for the poll to reach the held key first, on a busy machine too
        poller.execute("SET statement_timeout = '2s'")
        delivered = poller.execute("SELECT key FROM dq_poll_many(%s, 10)", (queue,)).fetchall()
        poller.execute("SET statement_timeout = 0")
        holder.rollback()
        assert delivered == [("plain",)]
        error, failures = poller.execute("SELECT last_error, failures FROM dq_schedules(%s)", (queue,)).fetchone()
        assert failures == 1 and error.endswith("(SQLSTATE 57014)")


def test_a_statement_timeout_counts_from_the_statements_first_message(database: str) -> None:
    """The extended protocol starts a statement's timeout at its Parse, and
    statement_timestamp() at its Execute: with 500 ms between them (a client
    that parses, then binds later), a timeout of 2 s fires 1.5 s after
    statement_timestamp() (time for a busy machine's Execute to reach the
    held key first), and is still the schedule's error, not a cancel
    (1.1.0 took it for a cancel whenever the gap was wider than the timer's
    lateness, and failed the poll)."""
    queue = "cron_lock_timeout_parse"
    with psycopg.connect(database, autocommit=True) as poller, psycopg.connect(database) as holder:
        _hold_the_occurrence(poller, holder, queue)
        poller.execute("SET statement_timeout = '2s'")
        pgconn = poller.pgconn
        pgconn.enter_pipeline_mode()  # Parse now, Bind and Execute later, one implicit transaction
        pgconn.send_prepare(b"poll", b"SELECT key FROM dq_poll_many($1, 10)")
        pgconn.flush()
        time.sleep(0.5)  # the gap itself (not a wait for some state): Parse's clock runs meanwhile
        pgconn.send_query_prepared(b"poll", [queue.encode()])
        pgconn.pipeline_sync()
        pgconn.flush()
        results = []
        while len(results) < 3:  # Parse's, Execute's, the Sync's
            result = pgconn.get_result()
            if result is not None:
                results.append(result)
        pgconn.exit_pipeline_mode()
        poller.execute("SET statement_timeout = 0")
        holder.rollback()
        assert [r.status for r in results] == [
            psycopg.pq.ExecStatus.COMMAND_OK,
            psycopg.pq.ExecStatus.TUPLES_OK,
            psycopg.pq.ExecStatus.PIPELINE_SYNC,
        ], [r.error_message for r in results]
        assert results[1].get_value(0, 0) == b"plain"
        error, failures = poller.execute("SELECT last_error, failures FROM dq_schedules(%s)", (queue,)).fetchone()
        assert failures == 1 and error.endswith("(SQLSTATE 57014)")


def test_a_cancel_request_still_cancels_the_poll(database: str) -> None:
    """Only a statement timeout is caught: a poll waiting in a schedule's
    insert is cancelled by pg_cancel_backend as any statement is."""
    queue = "cron_lock_cancel"
    with (
        psycopg.connect(database, autocommit=True) as poller,
        psycopg.connect(database) as holder,
        psycopg.connect(database, autocommit=True) as admin,
    ):
        _hold_the_occurrence(poller, holder, queue)
        pid = poller.info.backend_pid
        outcome: list[BaseException] = []

        def poll() -> None:
            try:
                poller.execute("SELECT key FROM dq_poll_many(%s, 10)", (queue,))
            except psycopg.Error as exc:
                outcome.append(exc)

        thread = threading.Thread(target=poll)
        thread.start()
        waiting = "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s"
        wait_for(lambda: admin.execute(waiting, (pid,)).fetchone()[0], "the poll to wait for the holder's row")
        admin.execute("SELECT pg_cancel_backend(%s)", (pid,))
        thread.join(PATIENCE)
        holder.rollback()
        assert len(outcome) == 1 and isinstance(outcome[0], psycopg.errors.QueryCanceled)
