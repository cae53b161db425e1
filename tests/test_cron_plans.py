"""The plans the Python cron services run (pgdq._cron_plans), without a
database: DST rules of daily and cron plans, periodic alignment, config
hashes, and bad configurations. Pure functions, so one hand-written file
rather than an async source with a generated twin."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from datetime import time as clock
from zoneinfo import ZoneInfo

import pytest
from pgdq import InvalidArgument
from pgdq.cron import cron_plan, daily_plan, periodic_plan

NEW_YORK = ZoneInfo("America/New_York")


def test_dst_rules_for_daily_and_cron() -> None:
    # New York springs forward on 2026-03-08 (02:00 -> 03:00) and falls back on 2026-11-01 (02:00 -> 01:00)
    spring = daily_plan("s", "America/New_York", [clock(2, 30)], timedelta(days=1)).generate(
        datetime(2026, 3, 8, 0, 0, tzinfo=NEW_YORK)
    )
    assert [at.astimezone(NEW_YORK).isoformat() for at, _ in spring] == ["2026-03-08T03:30:00-04:00"], (
        "a skipped time happens after the shift"
    )
    autumn = daily_plan("a", "America/New_York", [clock(1, 30)], timedelta(days=1)).generate(
        datetime(2026, 11, 1, 0, 0, tzinfo=NEW_YORK)
    )
    assert [at.isoformat() for at, _ in autumn] == ["2026-11-01T05:30:00+00:00"], "a repeated time happens once"
    # Lord Howe shifts by 30 minutes: 02:00 -> 02:30 on 2026-10-04
    howe = cron_plan("h", "15 2 * * *", "Australia/Lord_Howe", None, timedelta(days=2)).generate(
        datetime(2026, 10, 3, 12, 0, tzinfo=UTC)
    )
    assert len(list(howe)) == 2


def test_periodic_plan_is_aligned_and_runs_often_enough() -> None:
    plan = periodic_plan("p", timedelta(minutes=1), {"a": 1})
    assert plan.interval == timedelta(seconds=15), "a quarter of the period"
    now = datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC)
    times = [at for at, _ in plan.generate(now)]
    assert times == [datetime(2026, 1, 1, 12, m, tzinfo=UTC) for m in (1, 2, 3)], "two periods ahead, aligned"
    assert periodic_plan("p", timedelta(seconds=1), None).interval == timedelta(seconds=1), "at most once a second"


def test_config_hash_follows_the_whole_configuration() -> None:
    def digest(period: float, payload: object) -> str:
        return periodic_plan("p", timedelta(seconds=period), payload).config_hash

    assert digest(5, {"a": 1}) == digest(5, {"a": 1})
    assert len({digest(5, {"a": 1}), digest(5, {"a": 2}), digest(6, {"a": 1})}) == 3
    daily = daily_plan("d", "UTC", [clock(9), clock(21)], timedelta(days=1)).config_hash
    assert daily == daily_plan("d", "UTC", [clock(21), clock(9)], timedelta(days=2)).config_hash, (
        "the order of times and how far ahead do not change what is installed"
    )
    assert daily != daily_plan("d", "Europe/Bucharest", [clock(9), clock(21)], timedelta(days=1)).config_hash


def test_bad_configurations_are_invalid_arguments() -> None:
    with pytest.raises(InvalidArgument, match="period must be positive"):
        periodic_plan("p", timedelta(0), None)
    with pytest.raises(InvalidArgument, match="unknown time zone"):
        daily_plan("d", "Mars/Olympus", [clock(9)], timedelta(days=1))
    with pytest.raises(InvalidArgument, match="times_of_day must not be empty"):
        daily_plan("d", "UTC", [], timedelta(days=1))
    with pytest.raises(InvalidArgument, match="schedule_in_advance must be positive"):
        cron_plan("c", "* * * * *", "UTC", None, timedelta(seconds=-1))
    with pytest.raises(InvalidArgument, match="not a cron expression"):
        cron_plan("c", "61 * * * *", "UTC", None, timedelta(hours=1))
