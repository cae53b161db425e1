"""make spark-demo: a reminder at each user's next local 09:00, computed in
Spark for 1,000,000 users across time zones, offered to pgdq with
offer_dataframe, then read back with read_queue for a report.

    python examples/spark_reminders.py [--users 1000000] [--parquet users.parquet]

Connects with DATABASE_URL or the PG* variables; installs pgdq if missing and
purges the queue (--queue, default pgdq_demo_reminders) first.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import psycopg
from pgdq import install
from pgdq.spark import offer_dataframe, read_queue
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812
from rich.console import Console
from rich.table import Table

ZONES = [
    "America/New_York", "America/Los_Angeles", "America/Sao_Paulo", "Europe/London", "Europe/Bucharest",
    "Europe/Berlin", "Africa/Lagos", "Asia/Kolkata", "Asia/Tokyo", "Australia/Sydney", "Australia/Lord_Howe",
    "Pacific/Auckland",
]  # fmt: skip
console = Console()


def users(spark: SparkSession, count: int, parquet: str | None) -> DataFrame:
    """user_id, name and IANA time zone: from Parquet, or generated."""
    if parquet:
        return spark.read.parquet(parquet)
    zones = F.array(*[F.lit(z) for z in ZONES])
    return spark.range(count).select(
        F.col("id").alias("user_id"),
        F.concat(F.lit("user "), F.col("id")).alias("name"),
        F.element_at(zones, (F.col("id") % len(ZONES) + 1).cast("int")).alias("timezone"),
    )


def next_local_nine(df: DataFrame) -> DataFrame:
    """send_at: the next 09:00 on each user's own clock, as an instant (DST
    included: the wall time is converted with the zone's rules of that day)."""
    local_now = F.from_utc_timestamp(F.current_timestamp(), F.col("timezone"))
    today_nine = F.to_timestamp(F.concat(F.to_date(local_now).cast("string"), F.lit(" 09:00:00")))
    nine = F.when(today_nine > local_now, today_nine).otherwise(today_nine + F.expr("INTERVAL 1 DAY"))
    return df.withColumn("send_at", F.to_utc_timestamp(nine, F.col("timezone")))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=1_000_000)
    parser.add_argument("--parquet", help="read users (user_id, name, timezone) from this Parquet file")
    parser.add_argument("--queue", default="pgdq_demo_reminders")  # purged first
    args = parser.parse_args()
    conninfo = os.environ.get("DATABASE_URL", "")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        if install(conn, if_not_exists=True):
            console.print("installed pgdq")
        conn.execute("SELECT dq_purge(%s)", (args.queue,))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("pgdq-reminders")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.showConsoleProgress", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")

    people = next_local_nine(users(spark, args.users, args.parquet))
    reminders = people.select(
        F.concat(F.lit("reminder/"), F.col("user_id").cast("string")).alias("key"),
        F.struct("user_id", "name", "timezone").alias("payload"),
        "send_at",
    )
    console.print(f"[bold]offering {args.users:,} reminders[/] (Spark's progress bar below)")
    started = time.perf_counter()
    summary = offer_dataframe(reminders, conninfo, args.queue, scheduled_at="send_at")
    seconds = time.perf_counter() - started
    console.print(
        f"{summary.created:,} created, {summary.updated:,} updated, {summary.ignored:,} ignored"
        f" in {seconds:.1f} s ({summary.rows / seconds:,.0f} rows/s)"
    )

    queued = read_queue(spark, conninfo, args.queue, num_partitions=4)
    per_hour = queued.groupBy(F.date_format("scheduled_at", "yyyy-MM-dd HH:00").alias("hour")).count().orderBy("hour")
    table = Table(title=f"{args.queue}: reminders per hour of delivery (UTC)")
    table.add_column("hour (UTC)")
    table.add_column("reminders", justify="right")
    for row in per_hour.collect():
        table.add_row(row["hour"], f"{row['count']:,}")
    console.print(table)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
