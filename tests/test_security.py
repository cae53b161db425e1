"""docs/security.md against a real server: what docs/install.md's grants allow
(its privileges table, call by call), per-queue isolation with row-level
security (its SQL, run as written, for two tenants), wake-ups any role can
read and fake, and the test clock.

Roles are cluster-wide and other test runs share the cluster, so every role
here is pgdq_sec_<what>_<random tag>, the README's and the page's role names
are replaced by those, and all of them are dropped at the end."""

from __future__ import annotations

import re
import secrets
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import DB, ROOT, assert_counts_agree, dsn, install_extension, recreate_database
from pgdq import AsyncDelivery, Queue, Worker
from psycopg import sql
from test_worker import running
from waiting import notified, wait_for

TAG = secrets.token_hex(4)
PRODUCER = f"pgdq_sec_producer_{TAG}"
CONSUMER = f"pgdq_sec_consumer_{TAG}"
PAYROLL = f"pgdq_sec_payroll_{TAG}"
BILLING = f"pgdq_sec_billing_{TAG}"
NOBODY = f"pgdq_sec_nobody_{TAG}"  # no grants at all: what any role that can connect may do
ROLES = (PRODUCER, CONSUMER, PAYROLL, BILLING, NOBODY)
RENAMED = {"pgdq_producer": PRODUCER, "pgdq_consumer": CONSUMER}
RLS_DB = f"{DB}_rls"  # the isolation policies, for two tenants
UPGRADE_DB = f"{DB}_rls_upgrade"  # the same on 1.0.0, then upgraded
TABLES = ("dq_messages", "dq_dead_letters", "dq_queues", "dq_schedules", "dq_groups")
DOC = (ROOT / "docs/security.md").read_text()
Conn = psycopg.Connection[Any]


def rename(text: str, names: dict[str, str]) -> str:
    for old, new in names.items():
        text = re.sub(rf"\b{re.escape(old)}\b", new, text)
    return text


def readme_grants() -> list[str]:
    """The GRANT statements of docs/install.md, for this run's roles."""
    block = (ROOT / "docs/install.md").read_text().split("<!-- grants -->")[1]
    return [rename(line, RENAMED) for line in block.splitlines() if line.startswith("GRANT")]


def isolation_sql(role: str, prefix: str) -> str:
    """docs/security.md's isolation SQL, as written, for one tenant."""
    block = DOC.split("<!-- isolation -->")[1]
    code = block.split("```sql\n")[1].split("```")[0]
    tenant = prefix.rstrip("/")
    code = code.replace("'payroll/'", f"'{prefix}'").replace("tenant_payroll", f"tenant_{tenant}")
    return rename(code, {**RENAMED, "app_payroll": role})


def connect(conninfo: str, role: str | None = None) -> Conn:
    conn = psycopg.connect(conninfo, autocommit=True)
    if role is not None:
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
    return conn


def value(conn: Conn, query: str, *args: Any) -> Any:
    row = conn.execute(query, args).fetchone()
    assert row is not None
    return row[0]


def rows(conn: Conn, query: str, *args: Any) -> list[tuple[Any, ...]]:
    return conn.execute(query, args).fetchall()


@pytest.fixture(scope="module")
def roles(database: str) -> Iterator[None]:
    """This run's roles, with docs/install.md's grants in the test database; every
    database they were used in, and the roles, dropped at the end."""
    with connect(database) as admin:
        for role in ROLES:
            admin.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(role)))
        for statement in readme_grants():
            admin.execute(statement)
    try:
        yield
    finally:
        with connect(dsn("postgres")) as admin:
            for name in (RLS_DB, UPGRADE_DB):
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        with connect(database) as admin:
            for role in ROLES:
                admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
                admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def isolate(conninfo: str, *, version: str | None = None) -> None:
    """pgdq with docs/install.md's grants and the isolation SQL for two tenants
    (for version 1.0.0: the statements it had, without dq_groups, dq_turns and dq_counts)."""

    def of_version(statements: list[str]) -> list[str]:
        if version != "1.0.0":
            return statements
        return [s for s in statements if not any(t in s for t in ("dq_groups", "dq_turns", "dq_counts", "dq_history"))]

    with connect(conninfo) as admin:
        for statement in of_version(readme_grants()):
            admin.execute(statement)
        for tenant, prefix in ((PAYROLL, "payroll/"), (BILLING, "billing/")):
            for statement in of_version(isolation_sql(tenant, prefix).split(";\n")):
                admin.execute(statement)


@pytest.fixture(scope="module")
def isolated(roles: None) -> str:
    """A database of its own with pgdq, the grants and the isolation policies."""
    recreate_database(RLS_DB)
    with connect(dsn(RLS_DB)) as admin:
        install_extension(admin)
    isolate(dsn(RLS_DB))
    return dsn(RLS_DB)


# -- Privileges: what docs/install.md's grants allow --------------------------------------

# A call of each public function, on a queue with messages, a dead letter and a
# due schedule; %(token)s is a current lock token.
CALLS = {
    "dq_offer": "SELECT dq_offer(%(q)s, 'new', '1')",
    "dq_offer_many": "SELECT * FROM dq_offer_many(%(q)s, '{new,ready}', '{1,2}')",
    "dq_poll": "SELECT * FROM dq_poll(%(q)s)",
    "dq_poll_many": "SELECT * FROM dq_poll_many(%(q)s, 5)",
    "dq_ack_poll": "SELECT * FROM dq_ack_poll(ARRAY[%(token)s]::uuid[], %(q)s, 5)",
    "dq_ack": "SELECT dq_ack(%(token)s)",
    "dq_ack_many": "SELECT dq_ack_many(ARRAY[%(token)s]::uuid[])",
    "dq_nack": "SELECT dq_nack(%(token)s)",
    "dq_extend": "SELECT dq_extend(%(token)s, '1 minute')",
    "dq_dead_letter": "SELECT dq_dead_letter(%(token)s, 'given up')",
    "dq_cancel": "SELECT dq_cancel(%(q)s, 'ready')",
    "dq_finish": "SELECT dq_finish(%(q)s, 'ready')",
    "dq_get": "SELECT * FROM dq_get(%(q)s, 'ready')",
    "dq_purge": "SELECT dq_purge(%(q)s)",
    "dq_stats": "SELECT * FROM dq_stats()",
    "dq_next_due": "SELECT dq_next_due(%(q)s)",
    "dq_version": "SELECT dq_version()",
    "dq_now": "SELECT dq_now()",
    "dq_cron_next": "SELECT dq_cron_next('0 2 * * *', now(), 'UTC')",
    "dq_cron_install": "SELECT dq_cron_install(%(q)s, 'c', 'h', ARRAY[now() + interval '1 day'], '{1}')",
    "dq_cron_uninstall": "SELECT dq_cron_uninstall(%(q)s, 'c')",
    "dq_configure": "SELECT dq_configure(%(q)s, 3)",
    "dq_dead_list": "SELECT * FROM dq_dead_list(%(q)s)",
    "dq_dead_redrive": "SELECT dq_dead_redrive(%(q)s)",
    "dq_dead_purge": "SELECT dq_dead_purge(%(q)s)",
    "dq_schedule_set": "SELECT dq_schedule_set(%(q)s, 'other', '0 2 * * *')",
    "dq_schedule_remove": "SELECT dq_schedule_remove(%(q)s, 'tick')",
    "dq_schedules": "SELECT * FROM dq_schedules()",
    "dq_peek": "SELECT * FROM dq_peek(%(q)s)",
    "dq_read_messages": "SELECT * FROM dq_read_messages(%(q)s, NULL, NULL)",
    "dq_read_dead_letters": "SELECT * FROM dq_read_dead_letters(%(q)s, NULL, NULL)",
    "dq_read_bounds": "SELECT * FROM dq_read_bounds('messages', %(q)s)",
    "dq_channel_set": "SELECT dq_channel_set(%(q)s, 'partner', 2)",
    "dq_channel_remove": "SELECT dq_channel_remove(%(q)s, 'partner')",
    "dq_channels": "SELECT * FROM dq_channels(%(q)s)",
    "dq_due_hours": "SELECT * FROM dq_due_hours(%(q)s)",
    "dq_dead_stats": "SELECT * FROM dq_dead_stats()",
    "dq_key_queues": "SELECT * FROM dq_key_queues('ready')",
    "dq_send": "SELECT dq_send(%(q)s, '1')",
    "dq_send_many": "SELECT * FROM dq_send_many(%(q)s, '{1,2}')",
    "dq_get_id": "SELECT * FROM dq_get_id(%(q)s, 1)",
    "dq_cancel_id": "SELECT dq_cancel_id(%(q)s, 1)",
    "dq_finish_id": "SELECT dq_finish_id(%(q)s, 1)",
    "dq_dead_redrive_id": "SELECT dq_dead_redrive_id(%(q)s, 1)",
    "dq_dead_purge_id": "SELECT dq_dead_purge_id(%(q)s, 1)",
    "dq_browse": "SELECT * FROM dq_browse(%(q)s, NULL, 'rea')",
    "dq_run_now": "SELECT dq_run_now(%(q)s, 1)",
    "dq_pause": "SELECT dq_pause(%(q)s)",
    "dq_resume": "SELECT dq_resume(%(q)s)",
    "dq_retain": "SELECT dq_retain(%(q)s, '1 day')",
    "dq_history": "SELECT * FROM dq_history(%(q)s)",
    "dq_history_stats": "SELECT * FROM dq_history_stats(%(q)s, now() - interval '1 hour', '1 minute')",
    "dq_history_bins": "SELECT * FROM dq_history_bins(%(q)s, now() - interval '1 hour')",
    "dq_history_minutes": "SELECT * FROM dq_history_minutes(now() - interval '1 hour', ARRAY[%(q)s])",
    "dq_deliveries": "SELECT * FROM dq_deliveries(%(q)s, 'retrying')",
    "dq_delivery_of": "SELECT * FROM dq_delivery_of(%(q)s, 1)",
    "dq_release": "SELECT dq_release(%(q)s, 1)",
    "dq_dead_counts": "SELECT * FROM dq_dead_counts(%(q)s, now() - interval '1 hour', '1 minute')",
}


def privileges_table() -> dict[str, tuple[bool, bool, bool]]:
    """docs/security.md's table: function -> (producer, consumer, neither) may call it."""
    table = DOC.split("<!-- privileges -->")[1].strip().splitlines()
    assert table[0] == "| functions | `pgdq_producer` | `pgdq_consumer` | a role with neither |"
    allowed: dict[str, tuple[bool, bool, bool]] = {}
    for line in table[2:]:
        functions, *cells = (cell.strip() for cell in line.strip("|").split("|"))
        assert all(c in ("yes", "no") for c in cells) and len(cells) == 3, line
        for name in re.findall(r"`(\w+)`", functions):
            assert name not in allowed, f"{name} is listed twice"
            allowed[name] = (cells[0] == "yes", cells[1] == "yes", cells[2] == "yes")
    return allowed


def may_call(conn: Conn, role: str, call: str, args: dict[str, Any]) -> bool:
    """Whether role may make the call (rolled back either way)."""
    with conn.transaction(force_rollback=True):
        conn.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(role)))
        try:
            conn.execute(call, args)
        except psycopg.errors.InsufficientPrivilege:
            return False
    return True


def test_the_privileges_table_is_what_the_readme_grants_allow(database: str, roles: None) -> None:
    allowed = privileges_table()
    q = f"sec_matrix_{TAG}"
    with connect(database) as admin:
        public = {
            r[0]
            for r in rows(
                admin,
                "SELECT p.proname FROM pg_proc AS p JOIN pg_depend AS d ON d.objid = p.oid AND d.deptype = 'e'"
                " JOIN pg_extension AS e ON e.oid = d.refobjid AND e.extname = 'pgdq' WHERE p.proname !~ '^dq__'",
            )
        }
        assert set(allowed) == public == set(CALLS), "the table lists every public function once"
        try:
            # A ready message, a leased one, a dead letter and a due schedule
            # (so that a poll also turns an occurrence into a message).
            admin.execute("SELECT dq_offer(%s, 'dead', '1', now() - interval '3 s')", (q,))
            admin.execute("SELECT dq_offer(%s, 'leased', '1', now() - interval '2 s')", (q,))
            admin.execute("SELECT dq_offer(%s, 'ready', '1')", (q,))
            dead, leased = (d[0] for d in rows(admin, "SELECT lock_token FROM dq_poll_many(%s, 2)", q))
            assert value(admin, "SELECT dq_dead_letter(%s)", dead)
            admin.execute("SET dq.now = '2020-01-01 00:00:00+00'")
            admin.execute("SELECT dq_schedule_set(%s, 'tick', '* * * * * *')", (q,))
            admin.execute("RESET dq.now")
            args = {"q": q, "token": leased}
            found = {
                name: (
                    may_call(admin, PRODUCER, call, args),
                    may_call(admin, CONSUMER, call, args),
                    may_call(admin, NOBODY, call, args),
                )
                for name, call in CALLS.items()
            }
            assert found == allowed
        finally:
            admin.execute("SELECT dq_purge(%s), dq_dead_purge(%s), dq_schedule_remove(%s, 'tick')", (q, q, q))
            admin.execute("DELETE FROM dq_queues WHERE queue = %s", (q,))


def test_a_role_that_may_not_redrive_is_refused_whether_the_dead_letter_exists_or_not(
    database: str, roles: None
) -> None:
    q = f"sec_redrive_{TAG}"
    with connect(database) as admin:
        admin.execute("SELECT dq_configure(%s, 1)", (q,))
        admin.execute("SELECT dq_offer(%s, 'live', '1'), dq_offer(%s, 'dead', '1'), dq_send(%s, '1')", (q, q, q))
        assert value(admin, "SELECT count(dq_dead_letter(lock_token)) FROM dq_poll_many(%s, 3)", q) == 3
        admin.execute("SELECT dq_offer(%s, 'live', '2')", (q,))  # the key 'live' lives again
        ids = [r[0] for r in rows(admin, "SELECT id FROM dq_dead_list(%s) ORDER BY key", q)]
        missing = max(ids) + 1000
        try:
            for call in ("SELECT dq_dead_redrive_id(%(q)s, %(id)s)", "SELECT dq_dead_purge_id(%(q)s, %(id)s)"):
                for dead_id in (*ids, missing):  # keyed, keyed but live again, keyless, none
                    assert not may_call(admin, CONSUMER, call, {"q": q, "id": dead_id}), (call, dead_id)
                    assert not may_call(admin, NOBODY, call, {"q": q, "id": dead_id}), (call, dead_id)
            for key in ("dead", "live", "never"):
                call = "SELECT dq_dead_redrive(%(q)s, %(key)s)"
                assert not may_call(admin, CONSUMER, call, {"q": q, "key": key}), key
            assert value(admin, "SELECT count(*) FROM dq_dead_list(%s)", q) == 3, "nothing moved"
        finally:
            admin.execute("SELECT dq_purge(%s), dq_dead_purge(%s)", (q, q))


def test_without_isolation_the_grants_reach_every_queue(database: str, roles: None) -> None:
    """The default, so that a change of it is noticed: a producer or consumer
    role reads, configures and purges another team's queue."""
    secret = f"payroll-2026-secret-layoffs-{TAG}"
    with connect(database) as payroll, connect(database, PRODUCER) as other_producer:
        with connect(database, CONSUMER) as other_consumer:
            payroll.execute(
                "SELECT dq_offer(%s, 'alice', '{\"salary\": 1}', now() - interval '1 s'), dq_offer(%s, 'bob', '2')",
                (secret, secret),
            )
            assert (secret, 2) in rows(other_producer, "SELECT queue, ready FROM dq_stats()"), "it lists every queue"
            assert value(other_producer, "SELECT payload FROM dq_get(%s, 'alice')", secret) == {"salary": 1}
            assert value(other_consumer, "SELECT key FROM dq_poll(%s)", secret) == "alice", "it takes the messages"
            token = value(
                other_producer, "SELECT lock_token FROM dq_messages WHERE queue = %s AND key = 'alice'", secret
            )
            assert value(other_producer, "SELECT dq_ack(%s)", token), "and acks another's delivery"
            other_consumer.execute("SELECT dq_configure(%s, 1)", (secret,))
            assert value(payroll, "SELECT max_attempts FROM dq_queues WHERE queue = %s", secret) == 1
            assert value(other_producer, "SELECT dq_purge(%s)", secret) == 1, "it purges another team's queue"
            payroll.execute("DELETE FROM dq_queues WHERE queue = %s", (secret,))


# -- Isolation: row-level security on the queue column --------------------------------


def test_a_tenant_does_everything_on_its_own_queues(isolated: str) -> None:
    q = "payroll/reminders"
    with connect(isolated, PAYROLL) as t:
        assert value(t, "SELECT dq_offer(%s, 'k1', '1')", q) == "created"
        assert value(t, "SELECT dq_offer(%s, 'k1', '1')", q) == "ignored"
        assert value(t, "SELECT dq_offer(%s, 'k1', '2')", q) == "updated"  # ON CONFLICT DO UPDATE
        assert rows(t, "SELECT * FROM dq_offer_many(%s, '{k1,k2,k2}', '{5,2,3}')", q) == [
            ("k1", "updated"),
            ("k2", "created"),
            ("k2", "updated"),
        ]
        assert rows(t, "SELECT queue, ready FROM dq_stats()") == [(q, 2)]
        assert value(t, "SELECT payload FROM dq_get(%s, 'k2')", q) == 3
        assert value(t, "SELECT dq_next_due(%s)", q) is not None
        (k1, t1), (k2, t2) = rows(t, "SELECT key, lock_token FROM dq_poll_many(%s, 2)", q)
        assert (k1, k2) == ("k1", "k2")
        assert value(t, "SELECT dq_ack(%s)", t1) is True
        assert value(t, "SELECT dq_nack(%s)", t2) is True
        t2 = value(t, "SELECT lock_token FROM dq_poll(%s)", q)
        assert value(t, "SELECT dq_extend(%s, '1 minute')", t2) is not None
        assert value(t, "SELECT dq_dead_letter(%s, 'no')", t2) is True
        assert [r[0] for r in rows(t, "SELECT key FROM dq_dead_list(%s)", q)] == ["k2"]
        assert value(t, "SELECT dq_dead_redrive(%s)", q) == 1
        t2 = value(t, "SELECT lock_token FROM dq_ack_poll('{}', %s, 1)", q)
        assert value(t, "SELECT dq_ack_many(ARRAY[%s]::uuid[])", t2) == 1
        # a poll buries a message out of attempts (dq_configure), then the dead letter is purged
        t.execute("SELECT dq_configure(%s, 1)", (q,))
        t.execute("SET dq.now = '2030-01-01 00:00:00+00'")
        assert value(t, "SELECT dq_offer(%s, 'k3', '3')", q) == "created"
        assert value(t, "SELECT key FROM dq_poll(%s)", q) == "k3"
        t.execute("SET dq.now = '2030-01-01 01:00:00+00'")
        assert rows(t, "SELECT * FROM dq_poll(%s)", q) == [] and value(t, "SELECT dq_dead_purge(%s)", q) == 1
        # schedules: set, list, a poll turns a due occurrence into a message, remove
        t.execute("SET dq.now = '2030-01-01 00:00:00+00'")
        assert value(t, "SELECT dq_schedule_set(%s, 'tick', '* * * * *')", q) is not None
        assert rows(t, "SELECT queue, name FROM dq_schedules()") == [(q, "tick")]
        t.execute("SET dq.now = '2030-01-01 00:01:00+00'")
        assert value(t, "SELECT key FROM dq_poll(%s)", q).startswith("tick/")
        assert value(t, "SELECT dq_schedule_remove(%s, 'tick')", q) is True
        t.execute("RESET dq.now")
        # recurring occurrences, cancel and purge
        assert value(t, "SELECT dq_cron_install(%s, 'c', 'h', ARRAY[now() + interval '1 day'], '{1}')", q) == 1
        assert value(t, "SELECT dq_cron_uninstall(%s, 'c')", q) == 1
        t.execute("SELECT dq_offer(%s, 'k4', '4'), dq_offer(%s, 'k5', '5')", (q, q))
        assert value(t, "SELECT dq_cancel(%s, 'k4')", q) is True
        assert value(t, "SELECT dq_purge(%s)", q) >= 1
        t.execute("SELECT dq_configure(%s, NULL)", (q,))


def snapshot(admin: Conn, prefix: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of a tenant's queues, in the four tables."""
    return {
        table: rows(admin, f"SELECT * FROM {table} WHERE starts_with(queue, %s) ORDER BY 1, 2", prefix)
        for table in TABLES
    }


def test_another_tenants_queues_look_empty_and_stay_intact(isolated: str) -> None:
    b = "billing/payroll-2026-secret-layoffs"
    with connect(isolated) as admin, connect(isolated, BILLING) as owner, connect(isolated, PAYROLL) as t:
        # billing's queue: a dead letter, a leased message, a ready and a delayed one, a setting, a schedule,
        # a channel
        owner.execute("SELECT dq_offer(%s, 'dead', '1', now() - interval '2 s')", (b,))
        owner.execute("SELECT dq_offer(%s, 'leased', '2', now() - interval '1 s')", (b,))
        owner.execute("SELECT dq_offer(%s, 'ready', '3'), dq_offer(%s, 'later', '4', now() + interval '1 h')", (b, b))
        dead, token = (r[0] for r in rows(owner, "SELECT lock_token FROM dq_poll_many(%s, 2)", b))
        assert value(owner, "SELECT dq_dead_letter(%s)", dead)
        owner.execute("SELECT dq_configure(%s, 5), dq_schedule_set(%s, 'nightly', '0 2 * * *')", (b, b))
        owner.execute("SELECT dq_channel_set(%s, 'partner', 1)", (b,))
        before = snapshot(admin, "billing/")
        assert all(before.values())

        # reads find nothing
        assert rows(t, "SELECT * FROM dq_get(%s, 'ready')", b) == []
        assert all(r[0].startswith("payroll/") for r in rows(t, "SELECT queue FROM dq_stats()"))
        assert rows(t, "SELECT * FROM dq_stats(%s)", b) == [(b, 0, 0, 0, None, None, False)]
        assert value(t, "SELECT count(*) FROM dq_counts") == 0, "no count of any queue (1.2)"
        assert value(t, "SELECT dq_next_due(%s)", b) is None
        assert rows(t, "SELECT * FROM dq_poll_many(%s, 10)", b) == []
        assert rows(t, "SELECT * FROM dq_dead_list(%s)", b) == []
        assert rows(t, "SELECT * FROM dq_schedules(%s)", b) == []
        assert all(r[0].startswith("payroll/") for r in rows(t, "SELECT queue FROM dq_schedules()"))
        assert rows(t, "SELECT * FROM dq_peek(%s)", b) == []
        assert rows(t, "SELECT * FROM dq_key_queues('ready')") == [], "no other tenant's queue names"
        assert all(r[0].startswith("payroll/") for r in rows(t, "SELECT queue FROM dq_dead_stats()"))
        assert sum(r[1] for r in rows(t, "SELECT * FROM dq_due_hours(%s)", b)) == 0
        assert not any(r[0] == b for r in rows(t, "SELECT queue FROM dq_read_messages(NULL, NULL, NULL)"))
        assert not any(r[0] == b for r in rows(t, "SELECT queue FROM dq_read_dead_letters(NULL, NULL, NULL)"))
        assert rows(t, "SELECT * FROM dq_read_bounds('messages', %s)", b) == [(None, None)]
        assert value(t, "SELECT count(*) FROM dq_messages WHERE queue = %s", b) == 0
        # changes change nothing, even with billing's own lock token
        assert value(t, "SELECT dq_ack(%s)", token) is False
        assert value(t, "SELECT dq_ack_many(ARRAY[%s]::uuid[])", token) == 0
        assert rows(t, "SELECT * FROM dq_ack_poll(ARRAY[%s]::uuid[], %s, 10)", token, b) == []
        assert value(t, "SELECT dq_nack(%s)", token) is False
        assert value(t, "SELECT dq_extend(%s, '1 hour')", token) is None
        assert value(t, "SELECT dq_dead_letter(%s)", token) is False
        assert value(t, "SELECT dq_cancel(%s, 'ready')", b) is False
        assert value(t, "SELECT dq_purge(%s)", b) == 0
        assert value(t, "SELECT dq_dead_redrive(%s)", b) == 0
        assert value(t, "SELECT dq_dead_purge(%s)", b) == 0
        assert value(t, "SELECT dq_schedule_remove(%s, 'nightly')", b) is False
        assert value(t, "SELECT dq_cron_uninstall(%s, 'nightly')", b) == 0
        assert value(t, "SELECT dq_cron_install(%s, 'c', 'h', '{}', '{}')", b) == 0
        assert t.execute("UPDATE dq_messages SET payload = '0' WHERE queue = %s", (b,)).rowcount == 0
        assert t.execute("DELETE FROM dq_dead_letters WHERE queue = %s", (b,)).rowcount == 0
        # a clock far ahead sees every lease expired, but only on its own queues
        t.execute("SET dq.now = '2999-01-01 00:00:00+00'")
        assert rows(t, "SELECT * FROM dq_poll_many(%s, 10)", b) == []
        t.execute("RESET dq.now")

        # writes fail with 42501, the same error for an existing key or setting as for a new one
        writes = {
            "dq_messages": [
                ("SELECT dq_offer(%s, 'ready', '9')", b),
                ("SELECT dq_offer(%s, 'new', '9')", b),
                ("SELECT * FROM dq_offer_many(%s, '{ready}', '{9}')", b),
                ("SELECT * FROM dq_offer_many(%s, '{new,ready,new}', '{7,8,9}')", b),
                ("SELECT dq_cron_install(%s, 'c', 'h', ARRAY[now() + interval '1 day'], '{1}')", b),
                (
                    "INSERT INTO dq_messages (queue, key, payload, scheduled_at, due_at, created_at)"
                    " VALUES (%s, 'sql', '1', now(), now(), now())",
                    b,
                ),
            ],
            "dq_queues": [
                ("SELECT dq_configure(%s, 1)", b),
                ("SELECT dq_configure(%s, 1)", "billing/other"),
            ],
            "dq_schedules": [
                ("SELECT dq_schedule_set(%s, 'nightly', '0 3 * * *')", b),
                ("SELECT dq_schedule_set(%s, 'new', '0 3 * * *')", b),
            ],
            "dq_groups": [
                ("SELECT dq_channel_set(%s, 'partner', 5)", b),
                ("SELECT dq_channel_set(%s, 'new', 5)", b),
            ],
        }
        for table, attempts in writes.items():
            for query, queue in attempts:
                with pytest.raises(psycopg.errors.InsufficientPrivilege) as denied:
                    t.execute(query, (queue,))
                assert str(denied.value).splitlines()[0] == (
                    f'new row violates row-level security policy for table "{table}"'
                ), query

        assert snapshot(admin, "billing/") == before, "billing's rows are untouched"
        assert value(owner, "SELECT dq_ack(%s)", token) is True, "and billing's lease still holds"
        owner.execute("SELECT dq_purge(%s), dq_dead_purge(%s), dq_schedule_remove(%s, 'nightly')", (b, b, b))
        owner.execute("SELECT dq_configure(%s, NULL), dq_channel_remove(%s, 'partner')", (b, b))


def test_a_role_without_a_policy_sees_nothing(isolated: str) -> None:
    with connect(isolated, BILLING) as owner, connect(isolated, PRODUCER) as bare:
        owner.execute("SELECT dq_offer('billing/x', 'k', '1')")
        assert rows(bare, "SELECT * FROM dq_stats()") == []
        assert value(bare, "SELECT count(*) FROM dq_counts") == 0
        assert rows(bare, "SELECT * FROM dq_get('billing/x', 'k')") == []
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            bare.execute("SELECT dq_offer('anything', 'k', '1')")
        assert value(owner, "SELECT dq_purge('billing/x')") == 1


def test_the_python_api_works_for_a_tenant(isolated: str) -> None:
    with connect(isolated, PAYROLL) as conn:
        q = Queue("payroll/py", conn)
        assert q.offer("k", {"n": 1}).value == "created"
        delivery = q.poll()
        assert delivery is not None and delivery.payload == {"n": 1}
        delivery.ack()  # StaleToken if it were not
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            Queue("billing/py", conn).offer("k", 1)


def test_the_policies_keep_the_poll_on_its_index(isolated: str) -> None:
    """Under a policy a poll's (leakproof) conditions still drive the (queue, due_at, id) index."""
    with connect(isolated, PAYROLL) as t:
        t.execute("SET enable_seqscan = off")
        plan = value(
            t,
            "EXPLAIN (FORMAT JSON) SELECT m.id FROM dq_messages AS m WHERE m.queue = 'payroll/q'"
            " AND m.channel = '' AND m.priority = 0"
            " AND m.due_at <= now() ORDER BY m.due_at, m.id LIMIT 1 FOR UPDATE SKIP LOCKED",
        )
        scan = plan[0]["Plan"]["Plans"][0]["Plans"][0]
        assert scan["Index Name"] == "dq_messages_due", scan
        assert "(queue = 'payroll/q'::text)" in scan["Index Cond"] and "due_at <= now()" in scan["Index Cond"]


def pg_tool(name: str, *args: str) -> str:
    bindir = subprocess.run(["pg_config", "--bindir"], check=True, capture_output=True, text=True).stdout.strip()
    return subprocess.run([str(Path(bindir) / name), *args], check=True, capture_output=True, text=True).stdout


def test_pg_dump_of_an_extension_install_leaves_the_policies_out(isolated: str) -> None:
    """PostgreSQL does not dump policies of extension tables: the page says to re-run the SQL after a restore."""
    with connect(isolated) as admin:
        policies = value(admin, "SELECT count(*) FROM pg_policy WHERE polrelid::regclass::text = ANY(%s)", list(TABLES))
        assert policies == 2 * len(TABLES)
        extension = value(admin, "SELECT count(*) FROM pg_extension WHERE extname = 'pgdq'")
    dump = pg_tool("pg_dump", "--schema-only", "-d", RLS_DB)
    if extension:
        assert "CREATE POLICY" not in dump and "ROW LEVEL SECURITY" not in dump


def test_an_upgrade_from_1_0_0_keeps_the_policies(roles: None) -> None:
    recreate_database(UPGRADE_DB)
    with connect(dsn(UPGRADE_DB)) as admin:
        admin.execute("CREATE EXTENSION pgdq VERSION '1.0.0'")
        isolate(dsn(UPGRADE_DB), version="1.0.0")
        admin.execute("SELECT dq_offer('billing/q', 'k', '1')")
        admin.execute("ALTER EXTENSION pgdq UPDATE")
        assert value(admin, "SELECT dq_version()") != "1.0.0"
        admin.execute("SELECT dq_channel_set('billing/q', 'secret-partner', 1)")
    with connect(dsn(UPGRADE_DB), PAYROLL) as t:
        assert rows(t, "SELECT * FROM dq_stats()") == [] and value(t, "SELECT dq_purge('billing/q')") == 0
        # 1.2's counts took dq_messages' SELECT grants, and show the tenant nothing
        assert value(t, "SELECT has_table_privilege('dq_counts', 'SELECT')") is True
        assert value(t, "SELECT count(*) FROM dq_counts") == 0
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            t.execute("SELECT dq_offer('billing/q', 'k', '2')")
        # 1.1's table took the grants and policies of dq_messages: the tenant
        # uses channels in its own queues and sees none of another's
        t.execute("SELECT dq_offer('payroll/q', 'k', '1', NULL, true, 'bank', 1)")
        assert rows(t, "SELECT key, channel FROM dq_poll_many('payroll/q', 5)") == [("k", "bank")]
        assert rows(t, "SELECT channel FROM dq_channels('billing/q')") == []
        assert rows(t, "SELECT queue FROM dq_groups WHERE NOT starts_with(queue, 'payroll/')") == []
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            t.execute("SELECT dq_channel_set('billing/q', 'mine', 1)")
        # 1.3's hot statements add their own counts: the step granted INSERT
        # on dq_counts to every role that may write messages, and the
        # tenant's sends, leases and acks are counted
        assert value(t, "SELECT has_table_privilege('dq_counts', 'INSERT')") is True
        t.execute("SELECT count(*) FROM dq_send_many('payroll/plain', '{1,2,3}')")
        t.execute("SELECT dq_offer('payroll/plain', 'k', '1')")
        tokens = [row[0] for row in rows(t, "SELECT lock_token FROM dq_poll_many('payroll/plain', 2)")]
        assert value(t, "SELECT dq_ack(%s)", tokens[0]) is True
        assert value(t, "SELECT dq_ack_many(%s)", tokens[1:]) == 1
    with connect(dsn(UPGRADE_DB)) as admin:
        assert_counts_agree(admin, "payroll/plain")


# -- Wake-ups: LISTEN and NOTIFY take no privilege -------------------------------------


def wakeups(listener: Conn) -> list[str]:
    """The wake-ups listener got from every transaction committed so far."""
    return notified(listener)


def test_any_role_can_listen_to_and_fake_wake_ups(database: str, roles: None) -> None:
    secret = f"payroll-2026-secret-layoffs-{TAG}"
    with connect(database, NOBODY) as spy, connect(database) as producer, connect(database) as consumer:
        with connect(dsn("postgres")) as elsewhere:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                spy.execute("SELECT * FROM dq_stats()")
            for listener in (spy, consumer, elsewhere):
                listener.execute("LISTEN dq_wakeup")
            producer.execute("SELECT dq_offer(%s, 'k', '1')", (secret,))
            assert secret in wakeups(spy), "a role with no grants learns the queue name"
            assert secret not in wakeups(elsewhere), "notifications stay in their database"
            spy.execute("SELECT pg_notify('dq_wakeup', %s)", (secret,))
            assert [p for p in wakeups(consumer) if p == secret] == [secret, secret], "the real one, then the fake"
            producer.execute("SELECT dq_purge(%s)", (secret,))


def test_fake_wake_ups_make_a_worker_deliver_nothing(database: str, queue_name: str, roles: None) -> None:
    handled: list[str] = []

    def handler(d: AsyncDelivery) -> None:
        handled.append(d.key)

    def fake(n: int) -> None:
        for _ in range(n):
            spy.execute("NOTIFY dq_wakeup, " + sql.quote(queue_name))
        time.sleep(1)

    with connect(database, NOBODY) as spy, Queue(queue_name, database) as q:
        with running(Worker(queue_name, handler, dsn=database)):
            time.sleep(0.5)  # idle on an empty queue
            fake(20)
            q.offer("later", 1, datetime.now(UTC) + timedelta(minutes=10))
            fake(20)
            assert handled == [], "nothing is delivered early"
            q.offer("now", 2)
            wait_for(lambda: handled, "the worker, still running, to handle a due message")
        assert handled == ["now"]


# -- The test clock ------------------------------------------------------------------


def test_the_test_clock_is_the_sessions_own(database: str, queue_name: str) -> None:
    with connect(database) as pinned, connect(database) as other:
        pinned.execute("SET dq.now = '2000-01-01 00:00:00+00'")
        assert value(pinned, "SELECT dq_now()").year == 2000
        assert value(other, "SELECT dq_now()").year > 2000, "other sessions keep the wall clock"
        pinned.execute("DISCARD ALL")  # what a pool's reset does
        assert value(pinned, "SELECT dq_now()").year > 2000
        pinned.execute("SET dq.now = 'infinity'")
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="dq.now must be a finite timestamp"):
            pinned.execute("SELECT dq_purge(%s)", (queue_name,))
        pinned.execute("RESET dq.now")
        assert value(pinned, "SELECT dq_purge(%s)", queue_name) == 0


# -- History: a caller reaches no records but those of the messages it deletes (1.3) ---


def forge(queue: str) -> sql.Composed:
    """1,000 offers and cancels of queue in one statement: 1.2's count trigger
    expired history (with probability 1/64 each, as pgdq's owner) over every
    queue by the caller's clock."""
    return sql.SQL(
        "DO $forge$ BEGIN FOR i IN 1..1000 LOOP"
        " PERFORM dq_offer({q}, 'forged', '1'); PERFORM dq_cancel({q}, 'forged');"
        " END LOOP; END $forge$"
    ).format(q=sql.Literal(queue))


def acked_history(conn: Conn, queue: str, n: int) -> None:
    """n messages of queue that keeps history a day, sent, delivered and acked."""
    conn.execute("SELECT dq_retain(%s, '1 day')", (queue,))
    conn.execute("SELECT dq_send_many(%s, array_fill('1'::jsonb, ARRAY[%s]))", (queue, n))
    assert value(conn, "SELECT dq_ack_many(ARRAY(SELECT lock_token FROM dq_poll_many(%s, %s)))", queue, n) == n


def kept(conn: Conn, queue: str) -> tuple[int, int, int]:
    """A queue's acked records, all its records, and the acked in its stats."""
    return (
        value(conn, "SELECT count(*) FROM dq_history(%s, NULL, 100000) WHERE outcome = 'acked'", queue),
        value(conn, "SELECT count(*) FROM dq_history(%s, NULL, 100000)", queue),
        value(
            conn, "SELECT coalesce(sum(acked), 0) FROM dq_history_stats(%s, now() - interval '1 hour', '1 hour')", queue
        ),
    )


def test_a_producer_with_a_clock_in_9999_wipes_no_history(database: str, roles: None) -> None:
    """The README's producer, SET dq.now = '9999-06-01', 1,000 offers and
    cancels: no record of its queue or another ages out, and its own are not
    dated after the server's clock (1.2: all records and tallies of every
    queue went, and the forged ones headed dq_history for ever)."""
    mine, theirs = f"sec_hist_mine_{TAG}", f"sec_hist_theirs_{TAG}"
    with connect(database) as admin, connect(database, PRODUCER) as producer:
        try:
            acked_history(admin, mine, 50)
            acked_history(admin, theirs, 50)
            producer.execute("SET dq.now = '9999-06-01 00:00+00'")
            producer.execute(forge(mine))
            assert kept(admin, theirs) == (50, 50, 50), "another queue's records and tallies stay"
            assert kept(admin, mine) == (50, 1050, 50), "and the queue's own"
            assert value(admin, "SELECT max(finished_at) <= clock_timestamp() FROM dq_history WHERE queue = %s", mine)
        finally:
            for q in (mine, theirs):
                admin.execute("DELETE FROM dq_history WHERE queue = %s", (q,))
                admin.execute("DELETE FROM dq_history_deltas WHERE queue = %s", (q,))
                admin.execute("DELETE FROM dq_history_tallies WHERE queue = %s", (q,))
                admin.execute("DELETE FROM dq_queues WHERE queue = %s", (q,))


def test_a_tenant_reads_its_own_history_and_touches_no_other(isolated: str) -> None:
    """Under the isolation SQL a tenant reads every record of its queues (1.2:
    none of them) and nothing of another's, and its forged clock and deletes
    leave the other's records as they were."""
    payroll, billing = "payroll/history", "billing/history"
    with connect(isolated, PAYROLL) as p, connect(isolated, BILLING) as b, connect(isolated) as admin:
        acked_history(p, payroll, 300)
        acked_history(b, billing, 10)
        assert kept(p, payroll) == (300, 300, 300), "a tenant reads its own queue's history"
        assert kept(b, payroll) == (0, 0, 0), "and no other's"
        assert value(b, "SELECT count(*) FROM dq_history_bins(%s, now() - interval '1 hour')", payroll) == 0
        minutes = "SELECT count(*) FROM dq_history_minutes(now() - interval '1 hour') WHERE queue = %s"
        assert value(b, minutes, payroll) == 0
        assert value(p, minutes, payroll) > 0, "a tenant reads its own queue's minutes"
        for table in ("dq_history", "dq_history_deltas", "dq_history_tallies"):
            assert value(b, f"SELECT count(*) FROM {table} WHERE NOT starts_with(queue, 'billing/')") == 0, table
        b.execute("SET dq.now = '9999-06-01 00:00+00'")
        b.execute(forge(billing))
        assert kept(admin, payroll) == (300, 300, 300), "its forged clock ages out nothing of another tenant"
        assert kept(p, payroll) == (300, 300, 300)
