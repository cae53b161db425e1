"""Upgrades in place: each release (as released, sql/pgdq--VERSION.sql) plus
the step scripts equals a fresh install object for object; a live 1.0.0 or
1.1.0 database keeps every message, lease, token, schedule, channel and dead
letter through ALTER EXTENSION UPDATE and `pgdq upgrade`; pg_dump + restore of
an extension install keeps the messages and the id sequence."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pgdq
import psycopg
import pytest
from conftest import DB, dsn, recreate_database
from pgdq import install
from pgdq._script import quote_ident, released_install_script, upgrade_steps
from pgdq.http._metrics import MAX_SPAN, history_rows
from pgdq.install import upgrade
from waiting import wait_for

FIRST_RELEASE = "1.0.0"
# every released version, each upgraded in place by the tests below
RELEASES = ("1.0.0", "1.1.0", "1.2.0")
# the releases that let in times no client can read (1.2.0 refuses them at every entry)
UNREADABLE_TIME_RELEASES = ("1.0.0", "1.1.0")
# the releases whose lock-token functions take no queue (a Queue's token calls need 1.2.0)
QUEUE_TOKEN_RELEASES = ("1.0.0", "1.1.0")
TABLES = ("dq_messages", "dq_dead_letters", "dq_schedules", "dq_queues")

Conn = psycopg.Connection[Any]


def install_released(conn: Conn, kind: str, schema: str = "public", version: str = FIRST_RELEASE) -> None:
    """Install a release exactly as released: the extension, or its script as a plain install."""
    if kind == "extension":
        conn.execute(f"CREATE EXTENSION pgdq SCHEMA {quote_ident(schema)} VERSION '{version}'")
        return
    with conn.transaction():
        conn.execute(released_install_script(version, schema).encode())


def steps_from(version: str) -> list[tuple[str, str]]:
    """The (from, to) steps from a release to this version, one per release in between."""
    return [(old, new) for old, new, _ in upgrade_steps(version, pgdq.__version__)]


def upgrade_to_current(conn: Conn, kind: str, schema: str = "public", version: str = FIRST_RELEASE) -> None:
    """ALTER EXTENSION pgdq UPDATE, or the plain upgrade `pgdq upgrade` runs, from version."""
    if kind == "extension":
        conn.execute("ALTER EXTENSION pgdq UPDATE")
    else:
        assert upgrade(conn, schema) == steps_from(version)
    assert conn.execute(f"SELECT {quote_ident(schema)}.dq_version()").fetchone() == (pgdq.__version__,)


def test_each_release_has_its_step_into_the_next() -> None:
    assert [old for old, _ in steps_from(FIRST_RELEASE)] == list(RELEASES)


@pytest.fixture
def scratch(database: str) -> Iterator[str]:
    """An empty database of this test's own; its conninfo."""
    recreate_database(f"{DB}_upgrade")
    yield dsn(f"{DB}_upgrade")
    recreate_database(f"{DB}_upgrade")


# -- the schema an upgrade leaves equals a fresh install ----------------------

CATALOG_QUERY = """
WITH objects AS (
    SELECT 'function ' || p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')' AS object,
        pg_get_functiondef(p.oid) || coalesce(' -- ' || obj_description(p.oid, 'pg_proc'), '') AS definition
    FROM pg_proc p WHERE p.pronamespace = %(nsp)s::regnamespace
    UNION ALL
    SELECT 'relation ' || c.relname, c.relkind::text || ' ' || coalesce(c.reloptions::text, '')
        || coalesce(' -- ' || obj_description(c.oid, 'pg_class'), '')
    FROM pg_class c WHERE c.relnamespace = %(nsp)s::regnamespace
    UNION ALL
    SELECT 'column ' || c.relname || '.' || a.attname,
        format_type(a.atttypid, a.atttypmod) || ' notnull=' || a.attnotnull || ' identity=' || a.attidentity::text
        || ' collation=' || coalesce(co.collname, '') || ' default=' || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
        || ' position=' || a.attnum
    FROM pg_class c
    JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
    LEFT JOIN pg_collation co ON co.oid = a.attcollation AND a.attcollation <> 100
    LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
    WHERE c.relnamespace = %(nsp)s::regnamespace
    UNION ALL
    SELECT 'index ' || i.relname, pg_get_indexdef(i.oid)
    FROM pg_class i WHERE i.relnamespace = %(nsp)s::regnamespace AND i.relkind = 'i'
    UNION ALL
    SELECT 'constraint ' || conname, pg_get_constraintdef(k.oid)
    FROM pg_constraint k WHERE k.connamespace = %(nsp)s::regnamespace
    UNION ALL
    SELECT 'trigger ' || c.relname || '.' || g.tgname, pg_get_triggerdef(g.oid) || ' enabled=' || g.tgenabled::text
    FROM pg_trigger g JOIN pg_class c ON c.oid = g.tgrelid
    WHERE c.relnamespace = %(nsp)s::regnamespace AND NOT g.tgisinternal
    UNION ALL
    SELECT 'type ' || t.typname, t.typtype::text
    FROM pg_type t WHERE t.typnamespace = %(nsp)s::regnamespace AND t.typname NOT LIKE '\\_%%'
    UNION ALL
    SELECT 'extension member ' || pg_describe_object(d.classid, d.objid, 0), d.deptype::text
    FROM pg_depend d JOIN pg_extension e ON d.refobjid = e.oid
    WHERE d.refclassid = 'pg_extension'::regclass AND e.extname = 'pgdq' AND d.deptype = 'e'
    UNION ALL
    SELECT 'pg_dump keeps ' || x.oid::regclass::text, 'config'
    FROM pg_extension e, unnest(e.extconfig) AS x (oid) WHERE e.extname = 'pgdq'
)
SELECT object, definition FROM objects ORDER BY object
"""


def catalog(conn: Conn, schema: str) -> dict[str, str]:
    """Every pgdq object in schema with its definition, the schema name replaced by SCHEMA."""
    rows = conn.execute(CATALOG_QUERY, {"nsp": quote_ident(schema)}).fetchall()
    return {obj.replace(schema, "SCHEMA"): str(definition).replace(schema, "SCHEMA") for obj, definition in rows}


def assert_same_catalog(upgraded: dict[str, str], fresh: dict[str, str]) -> None:
    """Equal, or a readable list of what differs."""
    differences = [
        f"{key}:\n  upgraded: {upgraded.get(key)}\n  fresh:    {fresh.get(key)}"
        for key in sorted(upgraded.keys() | fresh.keys())
        if upgraded.get(key) != fresh.get(key)
    ]
    assert not differences, "a release + upgrade differs from a fresh install:\n" + "\n".join(differences[:10])
    assert len(fresh) > 100


@pytest.mark.parametrize("release", RELEASES)
def test_extension_upgrade_equals_a_fresh_install(database: str, scratch: str, release: str) -> None:
    recreate_database(f"{DB}_upgrade_fresh")
    with psycopg.connect(scratch, autocommit=True) as old, psycopg.connect(dsn(f"{DB}_upgrade_fresh")) as new:
        install_released(old, "extension", version=release)
        upgrade_to_current(old, "extension", version=release)
        new.execute("CREATE EXTENSION pgdq")
        assert_same_catalog(catalog(old, "public"), catalog(new, "public"))
    recreate_database(f"{DB}_upgrade_fresh")


@pytest.mark.parametrize("release", RELEASES)
def test_plain_upgrade_equals_a_fresh_install(scratch: str, release: str) -> None:
    with psycopg.connect(scratch, autocommit=True) as conn:
        install_released(conn, "plain", "queue_upgraded", release)
        upgrade_to_current(conn, "plain", "queue_upgraded", release)
        install(conn, "queue_freshly")
        assert_same_catalog(catalog(conn, "queue_upgraded"), catalog(conn, "queue_freshly"))


def test_the_catalog_comparison_sees_a_changed_function(scratch: str) -> None:
    with psycopg.connect(scratch, autocommit=True) as conn:
        install(conn, "queue_a")
        install(conn, "queue_b")
        conn.execute("CREATE OR REPLACE FUNCTION queue_b.dq_version() RETURNS text LANGUAGE sql AS $$ SELECT '0' $$")
        with pytest.raises(AssertionError, match="function dq_version"):
            assert_same_catalog(catalog(conn, "queue_a"), catalog(conn, "queue_b"))


# -- a live 1.0.0 database upgrades with everything in it ---------------------


def fill(conn: Conn, consumer: Conn) -> tuple[Any, set[str]]:
    """Messages in every condition; the lock token the consumer holds and the keys a drain must see."""
    now = datetime.now(UTC)
    conn.execute("SELECT dq_configure('live', 5)")
    conn.execute(
        "SELECT count(*) FROM dq_offer_many('live', %s, %s::jsonb[], %s)",
        (
            ["leased", "nacked", "dead", "due-1", "due-2", "later"],
            ['{"n": 1}', '{"n": 2}', '{"n": 3}', '"due"', "[1, 2]", "null"],
            [*(now - timedelta(days=d) for d in (3, 2, 1)), now, now, now + timedelta(hours=1)],
        ),
    )
    token = consumer.execute("SELECT lock_token FROM dq_poll('live', '10 minutes')").fetchone()
    assert token is not None  # 'leased', held by a consumer that stays connected
    conn.execute("""SELECT dq_nack(lock_token, now() - interval '1 minute', '{"step": 2}') FROM dq_poll('live')""")
    conn.execute("SELECT dq_dead_letter(lock_token, 'boom') FROM dq_poll('live')")
    conn.execute("SELECT dq_schedule_set('live', 'nightly', '0 2 * * *', 'Europe/Bucharest', '{\"report\": 1}')")
    occurrences = [now + timedelta(hours=1, minutes=i) for i in (1, 2)]
    conn.execute("SELECT dq_cron_install('live', 'reminder', 'h1', %s, ARRAY['1', '2']::jsonb[])", (occurrences,))
    keys = {"nacked", "due-1", "due-2", "later"} | {
        f"reminder/h1/{at.astimezone(UTC):%Y%m%dT%H%M%S.%fZ}" for at in occurrences
    }
    return token[0], keys


def snapshot(conn: Conn, tables: tuple[str, ...] = TABLES) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of tables (by default every table 1.0.0 had), in a stable order."""
    return {table: conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall() for table in tables}


def fill_channels(conn: Conn, consumer: Conn) -> Any:
    """What 1.1 added: a channel at its limit, held by the consumer's lease
    (its lock token returned), one more message waiting its turn, and a
    message keeping the error of its nack."""
    conn.execute("SELECT dq_channel_set('tenants', 'partner', 1)")
    conn.execute("SELECT dq_offer('tenants', k, '1', NULL, true, 'partner', 2) FROM unnest('{p1,p2}'::text[]) k")
    token = consumer.execute("SELECT lock_token FROM dq_poll_many('tenants', 10, '10 minutes')").fetchall()
    assert len(token) == 1, "the channel's limit let one through"
    conn.execute("SELECT dq_offer('errors', 'e', '1')")
    conn.execute("SELECT dq_nack(lock_token, now() + interval '1 hour', NULL, 'kept') FROM dq_poll('errors')")
    return token[0][0]


def check_live_queue(conn: Conn, consumer: Conn, token: Any, keys: set[str], before: list[tuple[Any, ...]]) -> None:
    """After an upgrade, fill()'s queue: the consumer's old token extends and
    acks (in its own queue only), every message is delivered once, the dead
    letter, schedule and settings survived, and ids keep counting past before's."""
    assert consumer.execute("SELECT dq_extend(%s, '1 minute') IS NOT NULL", (token,)).fetchone() == (True,)
    assert consumer.execute("SELECT dq_ack(%s, 'tenants')", (token,)).fetchone() == (False,), "1.2: in its queue"
    assert consumer.execute("SELECT dq_ack(%s, 'live')", (token,)).fetchone() == (True,), "the old token still acks"

    conn.execute("SELECT set_config('dq.now', %s, false)", (str(datetime.now(UTC) + timedelta(hours=2)),))
    drained = conn.execute("SELECT key, state, attempts, lock_token FROM dq_poll_many('live', 100)").fetchall()
    delivered = [key for key, *_ in drained if not key.startswith("nightly/")]
    assert sorted(delivered) == sorted(keys), "nothing lost, nothing duplicated"
    assert ("nacked", {"step": 2}, 2) in [row[:3] for row in drained], "the nack's state and attempts survived"
    tokens = [row[3] for row in drained]
    assert conn.execute("SELECT dq_ack_many(%s, 'live')", (tokens,)).fetchone() == (len(tokens),)
    assert conn.execute("SELECT dq_dead_redrive('live')").fetchone() == (1,), "the dead letter survived"
    assert conn.execute("SELECT name FROM dq_schedules('live')").fetchall() == [("nightly",)]
    assert conn.execute("SELECT max_attempts FROM dq_queues WHERE queue = 'live'").fetchall() == [(5,)]
    conn.execute("SELECT dq_offer('live', 'new', '1')")
    new_id = conn.execute("SELECT id FROM dq_messages WHERE key = 'new'").fetchone()
    assert new_id is not None and new_id[0] > max(row[0] for row in before), "ids kept counting"
    sent = conn.execute("SELECT dq_send('live', '2')").fetchone()
    assert sent is not None and sent[0] > new_id[0], "1.2: a keyless message beside the keyed ones"
    assert conn.execute("SELECT dq_offer('live', 'new', '1')").fetchone() == ("ignored",), "keys still unique"


@pytest.mark.parametrize("kind", ["extension", "plain"])
def test_a_live_database_upgrades_with_everything_in_it(scratch: str, kind: str) -> None:
    with psycopg.connect(scratch, autocommit=True) as conn, psycopg.connect(scratch, autocommit=True) as consumer:
        install_released(conn, kind)
        token, keys = fill(conn, consumer)
        before = snapshot(conn)
        assert [len(before[table]) for table in TABLES] == [7, 1, 1, 1]

        upgrade_to_current(conn, kind)  # while the consumer holds its lease

        after = snapshot(conn)
        # 1.1 added last_error, last_error_at, failures and missed_from to dq_schedules
        assert [row[8:] for row in after["dq_schedules"]] == [(None, None, 0, None)]
        after["dq_schedules"] = [row[:8] for row in after["dq_schedules"]]
        # and last_error, channel ('' for none) and priority to dq_messages, as its last
        # columns, and 1.2 headers, leased_at and leased_due_at
        assert [row[-6:] for row in after["dq_messages"]] == [(None, "", 0, None, None, None)] * len(
            before["dq_messages"]
        )
        after["dq_messages"] = [row[:-6] for row in after["dq_messages"]]
        # 1.2 added paused_at, retain, history_keep and history_from to dq_queues
        assert [row[-4:] for row in after["dq_queues"]] == [(None, None, None, None)]
        after["dq_queues"] = [row[:-4] for row in after["dq_queues"]]
        # and channel and priority to dq_dead_letters, and 1.2 headers
        assert [row[-3:] for row in after["dq_dead_letters"]] == [("", 0, None)]
        after["dq_dead_letters"] = [row[:-3] for row in after["dq_dead_letters"]]
        assert after == before, "the upgrade changed no row"
        assert conn.execute("SELECT count(*) FROM dq_groups").fetchone() == (0,), "and made no queue a grouped one"
        check_live_queue(conn, consumer, token, keys, before["dq_messages"])
        assert conn.execute("SELECT dq_nack(lock_token, NULL, NULL, 'boom') FROM dq_poll('live')").fetchone() == (True,)
        assert conn.execute("SELECT last_error FROM dq_peek('live') WHERE last_error IS NOT NULL").fetchall() == [
            ("boom",)
        ], "a nack keeps its error in the upgraded table"
        conn.execute("SELECT dq_channel_set('tenants', 'partner', 1)")
        conn.execute("SELECT dq_offer('tenants', k, '1', NULL, true, 'partner', 2) FROM unnest('{p1,p2}'::text[]) k")
        assert conn.execute("SELECT key, channel, priority FROM dq_poll_many('tenants', 10)").fetchall() == [
            ("p1", "partner", 2)
        ], "channels work in the upgraded database"


@pytest.mark.parametrize("kind", ["extension", "plain"])
def test_a_live_1_1_0_database_upgrades_with_everything_in_it(scratch: str, kind: str) -> None:
    with psycopg.connect(scratch, autocommit=True) as conn, psycopg.connect(scratch, autocommit=True) as consumer:
        install_released(conn, kind, version="1.1.0")
        token, keys = fill(conn, consumer)
        channel_token = fill_channels(conn, consumer)
        tables = (*TABLES, "dq_groups")
        before = snapshot(conn, tables)
        assert [len(before[table]) for table in tables] == [10, 1, 1, 1, 2]

        upgrade_to_current(conn, kind, version="1.1.0")  # while the consumer holds its leases

        after = snapshot(conn, tables)
        # 1.2 added columns last: headers to dq_messages and dq_dead_letters,
        # leased_at and leased_due_at to dq_messages, paused_at, retain,
        # history_keep and history_from to dq_queues
        for table, added in (("dq_messages", 3), ("dq_dead_letters", 1), ("dq_queues", 4)):
            assert [row[-added:] for row in after[table]] == [(None,) * added] * len(before[table])
            after[table] = [row[:-added] for row in after[table]]
        assert after == before, "the upgrade changed no row"
        assert consumer.execute("SELECT dq_ack(%s, 'live')", (channel_token,)).fetchone() == (False,), (
            "1.2: a token given another queue is stale"
        )
        assert conn.execute("SELECT key FROM dq_poll_many('tenants', 10)").fetchall() == [], (
            "the channel's lease survived and still holds its limit"
        )
        assert consumer.execute("SELECT dq_ack(%s, 'tenants')", (channel_token,)).fetchone() == (True,)
        assert conn.execute("SELECT key, channel, priority FROM dq_poll_many('tenants', 10)").fetchall() == [
            ("p2", "partner", 2)
        ], "the channel's turn came"
        assert conn.execute("SELECT attempts, last_error FROM dq_peek('errors')").fetchall() == [(1, "kept")]
        check_live_queue(conn, consumer, token, keys, before["dq_messages"])


def fill_history(conn: Conn, consumer: Conn) -> Any:
    """What 1.2 added: a queue keeping history with records of each outcome,
    folded tallies and deltas not yet folded, a leased message with headers
    and a nacked one with its error (the consumer's lock token returned), a
    keyless message, and a paused queue with a message."""
    conn.execute("SELECT dq_retain('kept', '7 days')")
    conn.execute(
        """SELECT dq_offer('kept', k, '1', NULL, true, NULL, 0, '{"h": 1}') FROM unnest('{a,b,c,d}'::text[]) k"""
    )
    conn.execute("SELECT dq_ack(lock_token) FROM dq_poll('kept')")
    conn.execute("SELECT dq_dead_letter(lock_token, 'why') FROM dq_poll('kept')")
    conn.execute("SELECT dq__fold_history()")
    conn.execute("SELECT dq_nack(lock_token, now() - interval '1 hour', NULL, 'err') FROM dq_poll('kept')")
    token = consumer.execute("SELECT lock_token FROM dq_poll('kept', '10 minutes')").fetchone()
    assert token is not None
    conn.execute("SELECT dq_send('kept', '2', now() + interval '1 hour')")
    # 1.2.0's triggers fold deltas at random (1 in 256): this seed's draws
    # leave the cancel's record a delta, so the snapshot is the same every run
    conn.execute("SELECT setseed(0.5)")
    conn.execute("SELECT dq_offer('kept', 'gone', '1'), dq_cancel('kept', 'gone')")
    conn.execute("SELECT dq_pause('paused'), dq_offer('paused', 'p', '1')")
    return token[0]


def metrics_history(conninfo: str, since: datetime) -> list[tuple[Any, ...]]:
    """The rows /metrics reads of the history (pgdq.http's history_rows) from since, without the clock's."""

    async def read() -> list[tuple[Any, ...]]:
        async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
            rows = await history_rows(conn, None, {"since": since, "span": MAX_SPAN, "names": None})
        return [row[1:] for row in rows]

    return asyncio.run(read())


@pytest.mark.parametrize("kind", ["extension", "plain"])
def test_a_live_1_2_0_database_upgrades_with_everything_in_it(scratch: str, kind: str) -> None:
    """Messages, leases, history records and tallies, retention, a paused
    queue and channels survive the 1.2.0 -> 1.3.0 step, row for row, and work
    as 1.3 says after it."""
    with psycopg.connect(scratch, autocommit=True) as conn, psycopg.connect(scratch, autocommit=True) as consumer:
        install_released(conn, kind, version="1.2.0")
        token, keys = fill(conn, consumer)
        channel_token = fill_channels(conn, consumer)
        history_token = fill_history(conn, consumer)
        tables = (*TABLES, "dq_groups", "dq_history", "dq_history_deltas", "dq_history_tallies")
        before = snapshot(conn, tables)
        assert [len(before[t]) for t in ("dq_history", "dq_history_deltas")] == [3, 1]
        assert len(before["dq_history_tallies"]) > 0
        since = datetime.now(UTC) - timedelta(hours=1)
        stats = "SELECT * FROM dq_history_stats('kept', %s, '1 minute')"
        stats_before = conn.execute(stats, (since,)).fetchall()
        history = "SELECT * FROM dq_history('kept')"
        history_before = conn.execute(history).fetchall()
        assert conn.execute("SELECT to_regproc('dq_history_minutes')").fetchone() == (None,)
        metrics_before = metrics_history(scratch, since)  # dq_history_stats and dq_history_bins per queue
        assert {row[0] for row in metrics_before} == {"kept"} and any(row[5] for row in metrics_before)

        upgrade_to_current(conn, kind, version="1.2.0")  # while the consumer holds its leases

        assert snapshot(conn, tables) == before, "the upgrade changed no row"
        assert conn.execute(history).fetchall() == history_before, "every record reads as before"
        assert conn.execute(stats, (since,)).fetchall() == stats_before, "and every tally"
        assert metrics_history(scratch, since) == metrics_before, "/metrics reads them alike (dq_history_minutes)"
        assert conn.execute("SELECT retain FROM dq_queues WHERE queue = 'kept'").fetchone() == (timedelta(days=7),)
        assert conn.execute("SELECT * FROM dq_poll('paused')").fetchall() == [], "the paused queue stays paused"
        assert conn.execute("SELECT dq_resume('paused')").fetchone() == (True,)
        assert conn.execute("SELECT key FROM dq_poll('paused')").fetchall() == [("p",)]
        assert consumer.execute("SELECT dq_dead_letter(%s, 'verdict', 'kept')", (history_token,)).fetchone() == (True,)
        assert conn.execute("SELECT dq_finish('kept', 'd')").fetchone() == (True,)
        assert conn.execute("SELECT key, outcome, last_error, headers FROM dq_history('kept', NULL, 2)").fetchall() == [
            ("d", "acked", None, {"h": 1}),
            ("c", "dead", "verdict", {"h": 1}),
        ], "1.3: records go on, a dead one with its verdict, a finished one acked"
        assert consumer.execute("SELECT dq_ack(%s, 'tenants')", (channel_token,)).fetchone() == (True,)
        assert conn.execute("SELECT key FROM dq_poll_many('tenants', 10)").fetchall() == [("p2",)]
        check_live_queue(conn, consumer, token, keys, before["dq_messages"])


def fill_unreadable_times(conn: Conn) -> None:
    """Rows with times no client can read, as 1.0.0 and 1.1.0 let them in
    (an offer or nack at year 10000 or infinity, a schedule left at infinity
    when it had no next occurrence): each time kind in messages, a lease,
    a dead letter and a schedule, beside a schedule and a message that are fine."""
    conn.execute("SELECT dq_offer('times', k, '1') FROM unnest('{inf,neg,far,bc,leased,dead,fine}'::text[]) k")
    conn.execute("SELECT dq_dead_letter(lock_token, 'x') FROM dq_poll_many('times', 10) WHERE key = 'dead'")
    for key, at in (("inf", "infinity"), ("neg", "-infinity"), ("far", "12000-01-01"), ("bc", "0001-01-01 BC")):
        conn.execute(
            "UPDATE dq_messages SET scheduled_at = %s, due_at = %s WHERE queue = 'times' AND key = %s", (at, at, key)
        )
    conn.execute("UPDATE dq_messages SET lock_token = NULL WHERE queue = 'times' AND key <> 'leased'")
    conn.execute("UPDATE dq_messages SET due_at = '20000-01-01' WHERE queue = 'times' AND key = 'leased'")
    conn.execute("UPDATE dq_messages SET due_at = now() + interval '1 hour' WHERE queue = 'times' AND key = 'fine'")
    conn.execute("UPDATE dq_dead_letters SET failed_at = 'infinity', created_at = '-infinity' WHERE queue = 'times'")
    conn.execute("SELECT dq_schedule_set('times', s, '0 2 * * *') FROM unnest('{ended,far,fine}'::text[]) s")
    conn.execute("UPDATE dq_schedules SET next_at = 'infinity' WHERE name = 'ended'")
    conn.execute("UPDATE dq_schedules SET next_at = '10001-01-01 02:00Z' WHERE name = 'far'")


LAST = datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
FIRST = datetime(1, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("kind", ["extension", "plain"])
@pytest.mark.parametrize("release", UNREADABLE_TIME_RELEASES)
def test_unreadable_times_are_brought_into_range_by_the_upgrade(scratch: str, kind: str, release: str) -> None:
    """1.2 (times are readable): after the step every schedule and message
    reads in the Python client and `pgdq schedules list`; a schedule at
    infinity has ended (next_at NULL), other times are clamped to years 1 to
    9999 UTC and keep their order."""
    with psycopg.connect(scratch, autocommit=True) as conn:
        install_released(conn, kind, version=release)
        fill_unreadable_times(conn)
        fine_at = conn.execute("SELECT next_at FROM dq_schedules WHERE name = 'fine'").fetchone()

        upgrade_to_current(conn, kind, version=release)

        client = pgdq.Client(conn)
        assert [(s.name, s.next_at) for s in client.schedules("times")] == [
            ("ended", None),
            ("far", None),
            ("fine", fine_at[0] if fine_at else None),
        ], "a schedule past year 9999 has ended; the others keep their place"
        q = pgdq.Queue("times", conn)
        peeked = [m.key for m in q.peek(max_count=10)]
        assert [sorted(peeked[:2]), peeked[2], sorted(peeked[3:])] == [
            ["bc", "neg"],
            "fine",
            ["far", "inf", "leased"],
        ], "every message reads, in the order of its due time as before (ties by id)"
        infos = {key: q.get(key) for key in ("inf", "neg", "far", "bc", "leased", "fine")}
        assert {k: (i.scheduled_at, i.due_at) for k, i in infos.items() if i and k in ("inf", "far")} == {
            "inf": (LAST, LAST),
            "far": (LAST, LAST),
        }
        assert infos["neg"] is not None and infos["neg"].due_at == FIRST
        assert infos["leased"] is not None and infos["leased"].due_at == LAST, "the lease still holds"
        [dead] = q.dead_letters()
        assert (dead.key, dead.created_at, dead.failed_at) == ("dead", FIRST, LAST)
        assert q.stats().ready == 2 and q.next_due() == FIRST
        assert sorted(d.key for d in q.poll_many(10)) == ["bc", "neg"], "what was due before year 1 is due now"
    for output in ((), ("--json",)):
        listed = pgdq_cli("schedules", "list", "--dsn", scratch, *output)
        assert listed.returncode == 0, listed.stderr
        assert "ended" in listed.stdout and "fine" in listed.stdout


@pytest.mark.parametrize("release", RELEASES)
def test_this_client_against_the_released_sql(scratch: str, release: str) -> None:
    """docs/upgrading.md: upgrade the SQL first or together. This client works
    against older SQL for everything it had, but for a Queue's lock-token
    methods, which pass the queue (1.2): a Client's take any queue's tokens.
    Against 1.2.0 SQL, everything but what 1.3 adds works."""
    with psycopg.connect(scratch, autocommit=True) as conn:
        install_released(conn, "extension", version=release)
        q = pgdq.Queue("old", conn)
        assert q.offer("a", {"n": 1}) is pgdq.OfferOutcome.CREATED
        assert [r.outcome for r in q.offer_many([("b", 2), ("a", {"n": 1})])] == ["created", "ignored"]
        got = q.poll_many(10)
        assert [(d.key, d.channel, d.priority) for d in got] == [("a", None, 0), ("b", None, 0)]
        info = q.get("a")
        assert info is not None and (info.channel, info.priority) == (None, 0)
        if release not in QUEUE_TOKEN_RELEASES:  # 1.2.0 SQL has every call of a 1.2 client
            assert got[0].extend(60) is not None and q.ack_many([d.lock_token for d in got]) == 2
            assert q.next_due() is None
            return
        with pytest.raises(pgdq.SqlMissing, match=r"dq_ack_many\(uuid\[\], text\) does not exist: .*pgdq upgrade") as e:
            q.ack_many([d.lock_token for d in got])
        assert e.value.sqlstate == "42883" and isinstance(e.value.__cause__, psycopg.errors.UndefinedFunction)
        with pytest.raises(pgdq.SqlMissing, match="needs pgdq's SQL"):
            got[0].ack()
        client = pgdq.Client(conn)
        assert client.extend(got[0].lock_token, 60) is not None
        assert client.ack_many([d.lock_token for d in got]) == 2 and q.next_due() is None
        if release == "1.0.0":
            with pytest.raises(pgdq.SqlMissing):
                q.offer("c", 3, channel="needs-1.1")


# -- the command ---------------------------------------------------------------


def pgdq_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pgdq", *args], check=False, capture_output=True, text=True)


@pytest.mark.parametrize("kind", ["extension", "plain"])
@pytest.mark.parametrize("release", RELEASES)
def test_pgdq_upgrade_says_what_it_did_and_nothing_when_current(scratch: str, kind: str, release: str) -> None:
    schema = 'app "queues"' if kind == "plain" else "public"
    with psycopg.connect(scratch, autocommit=True) as conn:
        install_released(conn, kind, schema, release)
        conn.execute(f"SELECT {quote_ident(schema)}.dq_offer('q', 'k', '1')")
    done = pgdq_cli("upgrade", "--dsn", scratch, "--schema", schema)
    assert done.returncode == 0, done.stderr
    path = " -> ".join([release, *(new for _, new in steps_from(release))])
    assert done.stdout.strip() == f"pgdq upgraded in schema {schema}: {path}"
    again = pgdq_cli("upgrade", "--dsn", scratch, "--schema", schema)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == f"pgdq {pgdq.__version__} is already current in schema {schema}; nothing to do"
    with psycopg.connect(scratch, autocommit=True) as conn:
        ident = quote_ident(schema)
        assert conn.execute(f"SELECT {ident}.dq_version(), key FROM {ident}.dq_poll('q')").fetchone() == (
            pgdq.__version__,
            "k",
        )
    missing = pgdq_cli("upgrade", "--dsn", scratch, "--schema", "nowhere")
    assert missing.returncode == 3 and "not installed" in missing.stderr


# -- pg_dump and restore -----------------------------------------------------------


def pg_tool(name: str, *args: str) -> None:
    bindir = subprocess.run(["pg_config", "--bindir"], check=True, capture_output=True, text=True).stdout.strip()
    subprocess.run([str(Path(bindir) / name), *args], check=True, capture_output=True, env=os.environ)


@pytest.mark.parametrize("kind", ["fresh", "upgraded"])
def test_dump_and_restore_keep_messages_and_ids(scratch: str, tmp_path: Path, kind: str) -> None:
    with psycopg.connect(scratch, autocommit=True) as conn:
        if kind == "fresh":
            conn.execute("CREATE EXTENSION pgdq")
        else:
            install_released(conn, "extension")
            upgrade_to_current(conn, "extension")
        token, _ = fill(conn, conn)
        before = snapshot(conn)
    dump = tmp_path / "app.dump"
    pg_tool("pg_dump", "-Fc", "-f", str(dump), "-d", scratch)
    recreate_database(f"{DB}_restored")
    try:
        pg_tool("pg_restore", "-d", dsn(f"{DB}_restored"), str(dump))
        with psycopg.connect(dsn(f"{DB}_restored"), autocommit=True) as restored:
            assert snapshot(restored) == before
            assert restored.execute("SELECT dq_ack(%s)", (token,)).fetchone() == (True,), "tokens survive"
            restored.execute("SELECT dq_offer('live', 'after-restore', '1')")
            new_id = restored.execute("SELECT id FROM dq_messages WHERE key = 'after-restore'").fetchone()
            assert new_id is not None and new_id[0] > max(row[0] for row in before["dq_messages"]), "no id reused"
    finally:
        recreate_database(f"{DB}_restored")


def test_upgrade_heals_ids_of_a_database_restored_from_a_1_0_0_dump(scratch: str, tmp_path: Path) -> None:
    with psycopg.connect(scratch, autocommit=True) as conn:
        install_released(conn, "extension")
        conn.execute("SELECT dq_offer('q', 'a', '1'), dq_offer('q', 'b', '1')")
    dump = tmp_path / "old.dump"
    pg_tool("pg_dump", "-Fc", "-f", str(dump), "-d", scratch)
    recreate_database(f"{DB}_restored")
    try:
        with psycopg.connect(dsn(f"{DB}_restored"), autocommit=True) as restored:
            install_released(restored, "extension")  # 1.0.0's dump carries no sequence position
            pg_tool("pg_restore", "-d", dsn(f"{DB}_restored"), str(dump))
            with pytest.raises(psycopg.errors.UniqueViolation):
                restored.execute("SELECT dq_offer('q', 'c', '1')")
            upgrade_to_current(restored, "extension")
            assert restored.execute("SELECT dq_offer('q', 'c', '1')").fetchone() == ("created",)
    finally:
        recreate_database(f"{DB}_restored")


def test_every_version_number_agrees(database: str) -> None:
    root = Path(__file__).resolve().parent.parent
    control = re.search(r"default_version = '(.+)'", (root / "pgdq.control").read_text())
    pyproject = re.search(r'^version = "(.+)"', (root / "python/pyproject.toml").read_text(), re.M)
    changelog = re.search(r"^## (\S+)", (root / "CHANGELOG.md").read_text(), re.M)
    with psycopg.connect(database) as conn:
        row = conn.execute("SELECT dq_version()").fetchone()
    found = {
        "pgdq.control": control and control[1],
        "python/pyproject.toml": pyproject and pyproject[1],
        "pgdq.__version__": pgdq.__version__,
        "dq_version()": row and row[0],
        "CHANGELOG.md's newest entry": changelog and changelog[1],
    }
    assert set(found.values()) == {pgdq.__version__}, found
    steps = {(old, new) for old, new, _ in upgrade_steps(FIRST_RELEASE, pgdq.__version__)}
    assert steps, "a step script leads from the first release to this version"


def _poll_until(conninfo: str, done: threading.Event, errors: list[BaseException]) -> int:
    """Poll and ack queue 'busy' in a loop until done is set: the number of
    calls, each error kept in errors."""
    calls = 0
    with psycopg.connect(conninfo, autocommit=True) as conn:
        while not done.is_set():
            try:
                tokens = [r[0] for r in conn.execute("SELECT lock_token FROM dq_poll_many('busy', 50)").fetchall()]
                conn.execute("SELECT dq_ack_many(%s)", (tokens,))
            except psycopg.Error as error:
                errors.append(error)
            calls += 1
    return calls


@pytest.mark.parametrize("kind", ["extension", "plain"])
def test_consumers_polling_through_the_upgrade_wait_for_it_without_failing(scratch: str, kind: str) -> None:
    """1.2 builds an index on dq_messages: taking ACCESS EXCLUSIVE only after
    the SHARE lock of the build deadlocked with polls that held row locks
    and waited to update them (seen in the bench's W12)."""
    with psycopg.connect(scratch, autocommit=True) as conn:
        install_released(conn, kind, version="1.1.0")
        conn.execute(
            "SELECT count(*) FROM dq_offer_many('busy', ARRAY(SELECT 'k' || g FROM generate_series(1, 200000) g),"
            " ARRAY(SELECT '1'::jsonb FROM generate_series(1, 200000)))"
        )
        done, errors = threading.Event(), []
        with ThreadPoolExecutor(2) as pool:
            pollers = [pool.submit(_poll_until, scratch, done, errors) for _ in range(2)]
            wait_for(lambda: conn.execute("SELECT count(*) FROM dq_messages").fetchone() != (200000,), "a poll acked")
            upgrade_to_current(conn, kind, version="1.1.0")
            done.set()
            calls = sum(p.result() for p in pollers)
        assert errors == [], "no poll failed"
        assert calls > 2, "the pollers ran"


PREBUILT = "CREATE UNIQUE INDEX CONCURRENTLY dq_messages_queue_key_1_2 ON {}.dq_messages {}"


@pytest.mark.parametrize(
    ("definition", "taken"),
    [
        ("(queue, key) WHERE key IS NOT NULL", True),
        ("(queue, key) WHERE key IS NOT NULL AND queue <> 'x'", False),
        ("(queue, key)", False),
        ("(queue DESC, key text_pattern_ops) WHERE key IS NOT NULL", False),
        ("(queue, key) WITH (fillfactor = 50) WHERE key IS NOT NULL", False),
    ],
    ids=["as documented", "another predicate", "not partial", "another order and class", "storage options"],
)
def test_the_key_index_built_beforehand_is_taken_when_it_is_that_index(
    scratch: str, definition: str, taken: bool
) -> None:
    """docs/upgrading.md: on a large table, build 1.2's key index concurrently
    first; the step then takes it instead of building it under its locks. An
    index of that name that is another index is rebuilt, so the result always
    equals a fresh install."""
    with psycopg.connect(scratch, autocommit=True) as conn:
        install_released(conn, "plain", "queue_upgraded", "1.1.0")
        conn.execute(PREBUILT.format("queue_upgraded", definition))
        before = conn.execute("SELECT 'queue_upgraded.dq_messages_queue_key_1_2'::regclass::oid").fetchone()
        upgrade_to_current(conn, "plain", "queue_upgraded", "1.1.0")
        after = conn.execute("SELECT 'queue_upgraded.dq_messages_queue_key'::regclass::oid").fetchone()
        assert (after == before) is taken
        install(conn, "queue_freshly")
        assert_same_catalog(catalog(conn, "queue_upgraded"), catalog(conn, "queue_freshly"))


@pytest.mark.parametrize("kind", ["extension", "plain"])
def test_a_published_database_upgrades_and_buries(scratch: str, kind: str) -> None:
    """A publication of every table (logical replication, change data capture)
    refuses updates and deletes of a table without a replica identity: 1.2's
    dead letters have no primary key, so they need REPLICA IDENTITY FULL, or
    the step (its clamping UPDATE) and every bury, purge and redrive failed."""
    with psycopg.connect(scratch, autocommit=True) as conn:
        install_released(conn, kind, version="1.1.0")
        conn.execute("CREATE PUBLICATION pgdq_everything FOR ALL TABLES")
        try:
            conn.execute("SELECT dq_offer('pub', 'a', '1'), dq_offer('pub', 'b', '1')")
            conn.execute("SELECT dq_dead_letter(lock_token) FROM dq_poll_many('pub', 1)")
            upgrade_to_current(conn, kind, version="1.1.0")
            conn.execute("SELECT dq_send('pub', '2')")
            buried = conn.execute("SELECT count(dq_dead_letter(lock_token)) FROM dq_poll_many('pub', 5)")
            assert buried.fetchone() == (2,)
            assert conn.execute("SELECT dq_dead_redrive('pub', 'a')").fetchone() == (1,)
            assert conn.execute("SELECT dq_dead_purge('pub')").fetchone() == (2,)
        finally:
            conn.execute("DROP PUBLICATION pgdq_everything")
