"""pgdq.spark with a local SparkSession against a real server: outcomes, an
idempotent re-run, a task that fails mid-partition and is retried, bad rows,
read_queue and read_dead_letters; offers and reads through PgBouncer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from conftest import DB
from pgbouncer import BINARY, PgBouncer
from pgdq import Queue
from pgdq.spark import BadRow, offer_dataframe, read_dead_letters, read_queue

pyspark = pytest.importorskip("pyspark", reason="pgdq[spark] extra not installed")
from pyspark import TaskContext  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402, N812


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable  # executors run this Python
    session = (
        SparkSession.builder.master("local[2,3]")  # 2 cores, a task may fail 3 times
        .appName("pgdq-tests")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def users(spark: Any, count: int, partitions: int = 4) -> Any:
    return (
        spark.range(count, numPartitions=partitions)
        .withColumn("key", F.concat(F.lit("user-"), F.col("id").cast("string")))
        .withColumn("payload", F.struct(F.col("id").alias("user"), F.lit("hello").alias("text")))
        .withColumn("send_at", F.lit(datetime(2030, 1, 1, 9, tzinfo=UTC)) + F.expr("make_interval(0,0,0,0,0,0,id)"))
    )


def test_outcomes_and_an_idempotent_rerun(spark: Any, database: str, queue_name: str) -> None:
    df = users(spark, 2500)
    first = offer_dataframe(df, database, queue_name, scheduled_at="send_at", batch_size=400)
    assert (first.created, first.updated, first.ignored) == (2500, 0, 0)
    again = offer_dataframe(df, database, queue_name, scheduled_at="send_at", batch_size=400)
    assert (again.created, again.updated, again.ignored) == (0, 0, 2500), "a re-run changes nothing"
    changed = df.withColumn("payload", F.struct(F.col("id").alias("user"), F.lit("bye").alias("text")))
    assert offer_dataframe(changed.limit(10), database, queue_name, scheduled_at="send_at").updated == 10
    with Queue(queue_name, database) as q:
        info = q.get("user-42")
        assert info is not None and info.payload == {"user": 42, "text": "hello"}
        assert info.scheduled_at == datetime(2030, 1, 1, 9, 0, 42, tzinfo=UTC)
        assert q.stats().delayed == 2500


def test_channel_and_priority_columns(spark: Any, database: str, queue_name: str) -> None:
    df = (
        users(spark, 300)
        .withColumn(
            "tenant", F.when(F.col("id") % 3 == 0, F.lit(None)).otherwise(F.concat(F.lit("t"), F.col("id") % 3))
        )
        .withColumn("urgency", F.when(F.col("id") % 2 == 0, F.lit(None)).otherwise(F.col("id") % 5))
    )
    summary = offer_dataframe(df, database, queue_name, scheduled_at="send_at", channel="tenant", priority="urgency")
    assert summary.created == 300
    with Queue(queue_name, database) as q:
        for user in (42, 43, 44):
            info = q.get(f"user-{user}")
            assert info is not None
            assert (info.channel, info.priority) == (
                None if user % 3 == 0 else f"t{user % 3}",
                0 if user % 2 == 0 else user % 5,
            ), "a null channel is none, a null priority 0"
        assert {c.channel: c.delayed for c in q.channels()} == {"t1": 100, "t2": 100}
    again = offer_dataframe(df, database, queue_name, scheduled_at="send_at", channel="tenant", priority="urgency")
    assert again.ignored == 300, "a re-run changes nothing"


def test_a_task_that_fails_mid_partition_is_retried(spark: Any, database: str, queue_name: str) -> None:
    @F.udf("string")
    def fail_once(key: str) -> str:
        # the first attempt of the task dies at row 15,000: the chunks before
        # it were offered already, but for the rows Spark buffers between
        # the two Python workers (about 2,500 at 200,000 rows)
        if key == "user-15000" and TaskContext.get().attemptNumber() == 0:
            raise RuntimeError("executor lost")
        return key

    df = users(spark, 20_000, partitions=1).withColumn("key", fail_once(F.col("key")))
    summary = offer_dataframe(df, database, queue_name, scheduled_at="send_at", batch_size=1_000)
    assert summary.rows == 20_000 and summary.ignored > 0, f"the retry found rows already written: {summary}"
    with Queue(queue_name, database) as q:
        assert q.stats().delayed == 20_000, "every row once"
    again = offer_dataframe(df, database, queue_name, scheduled_at="send_at", batch_size=1_000)
    assert again.ignored == 20_000


def test_bad_rows_fail_the_job_before_their_chunk(spark: Any, database: str, queue_name: str) -> None:
    def frame(rows: list[tuple[str | None, str]]) -> Any:
        return spark.createDataFrame(rows, "key string, payload string").coalesce(1)  # one chunk

    with pytest.raises(Exception, match="column 'key' is null in row"):
        offer_dataframe(frame([("a", '{"ok": 1}'), (None, '{"ok": 2}')]), database, queue_name)
    with pytest.raises(Exception, match="column 'payload' is not JSON in row .*'c'"):
        offer_dataframe(frame([("b", '{"ok": 1}'), ("c", "{not json")]), database, queue_name)
    with Queue(queue_name, database) as q:
        assert q.get("a") is None and q.get("b") is None, "nothing of a failing chunk was written"
    assert issubclass(BadRow, Exception)


def test_read_queue_and_dead_letters(spark: Any, database: str, queue_name: str) -> None:
    offer_dataframe(users(spark, 300), database, queue_name, scheduled_at="send_at")
    with Queue(queue_name, database) as q:
        q.offer("now", {"x": 1})
        d = q.poll()
        assert d is not None
        d.dead_letter("broken")
    frame = read_queue(spark, database, queue_name, num_partitions=3)
    assert frame.count() == 300
    row = frame.where(F.col("key") == "user-7").first()
    assert row is not None and json.loads(row.payload) == {"user": 7, "text": "hello"} and not row.leased
    assert row.scheduled_at == datetime(2030, 1, 1, 9, 0, 7)  # naive in the session zone, UTC
    assert read_queue(spark, database, "no-such-queue").count() == 0
    dead = read_dead_letters(spark, database, queue_name).collect()
    assert [(r.key, r.error) for r in dead] == [("now", "broken")]
    with Queue(queue_name, database) as q:
        q.purge_dead_letters()


def test_the_example_pipeline_on_small_data(spark: Any, database: str) -> None:
    example = Path(__file__).resolve().parent.parent / "examples/spark_reminders.py"
    env = {**os.environ, "DATABASE_URL": database, "PYSPARK_PYTHON": sys.executable}
    out = subprocess.run(
        [sys.executable, str(example), "--users", "3000", "--queue", "example_reminders"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    assert "3,000 created" in out and "hour (UTC)" in out, out
    with Queue("example_reminders", database) as q:
        stats = q.stats()
        assert stats.delayed + stats.ready == 3000
        info = q.get("reminder/10")  # user 10 lives in ZONES[10]: Australia/Lord_Howe
        assert info is not None and info.payload["timezone"] == "Australia/Lord_Howe"
        local = info.scheduled_at.astimezone(ZoneInfo("Australia/Lord_Howe"))
        assert (local.hour, local.minute) == (9, 0), "09:00 on the user's own clock"
        assert timedelta(0) < info.scheduled_at - datetime.now(UTC) <= timedelta(days=1)
        q.purge()


@pytest.mark.skipif(not Path(BINARY).exists(), reason="Debian pgbouncer not installed (make deps installs it)")
def test_through_pgbouncer_in_transaction_mode(spark: Any, queue_name: str) -> None:
    # 4 server connections: read_queue's snapshot holder and local[2]'s two readers
    bouncer = PgBouncer(pool_size=4)
    try:
        pooled = bouncer.conninfo(DB)
        # 20 chunks a partition: past psycopg's prepare_threshold, in turns on the pooled connections
        summary = offer_dataframe(users(spark, 4000, 2), pooled, queue_name, scheduled_at="send_at", batch_size=100)
        assert (summary.created, summary.ignored) == (4000, 0)
        frame = read_queue(spark, pooled, queue_name, num_partitions=4)
        assert frame.count() == 4000 and frame.select("key").distinct().count() == 4000
    finally:
        bouncer.stop()
