"""The `pgdq` command against a real server: offer (one, and JSON Lines),
poll, ack, stats, dead-letters; --json output and exit codes (pgdq not
installed, a malformed --dsn, install errors: one line each)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result
from conftest import dsn, recreate_database
from pgdq import Queue
from pgdq.cli import main


def pgdq(database: str, *args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), input=stdin, env={"PGDQ_DSN": database})


def as_json(result: Result) -> Any:
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_offer_one(database: str, queue_name: str) -> None:
    assert as_json(pgdq(database, "offer", "--json", queue_name, "k", '{"a": 1}')) == {
        "key": "k",
        "outcome": "created",
    }
    again = pgdq(database, "offer", queue_name, "k", '{"a": 1}')
    assert again.exit_code == 0 and again.output.strip() == "ignored"
    later = pgdq(database, "offer", queue_name, "k2", "2", "--in", "3600")
    assert later.exit_code == 0 and later.output.strip() == "created"
    with Queue(queue_name, database) as q:
        assert q.stats().delayed == 1 and q.stats().ready == 1


def test_offer_rejects_bad_input_and_writes_nothing(database: str, queue_name: str) -> None:
    bad_json = pgdq(database, "offer", queue_name, "k", "{not json")
    assert bad_json.exit_code == 2 and "not JSON" in bad_json.output
    naive = pgdq(database, "offer", queue_name, "k", "1", "--at", "2030-01-01T10:00:00")
    assert naive.exit_code == 2 and "no time zone" in naive.output
    long_key = pgdq(database, "offer", queue_name, "k" * 201, "1")
    assert long_key.exit_code == 1 and "key must be 1 to 200 characters" in long_key.output
    with Queue(queue_name, database) as q:
        assert q.stats().ready == 0


def test_offer_json_lines(database: str, queue_name: str) -> None:
    lines = [json.dumps({"key": f"k{i}", "payload": {"n": i}}) for i in range(2500)]
    lines.append(json.dumps({"key": "k0", "payload": {"n": 0}}))
    lines.append(json.dumps({"key": "late", "payload": 1, "scheduled_at": "2099-01-01T00:00:00Z"}))
    counts = as_json(pgdq(database, "offer", "--json", "--jsonl", queue_name, stdin="\n".join(lines) + "\n"))
    assert counts == {"created": 2501, "updated": 0, "ignored": 1}
    broken = pgdq(database, "offer", "--jsonl", queue_name, stdin='{"key": "x", "payload": 1}\n{"key": "y"}\n')
    assert broken.exit_code == 1 and "line 2" in broken.output
    with Queue(queue_name, database) as q:
        assert q.get("x") is None, "a broken batch writes nothing"
        assert q.stats().delayed == 1


def test_poll_ack_and_stats(database: str, queue_name: str) -> None:
    with Queue(queue_name, database) as q:
        q.offer_many([("a", 1), ("b", 2)])
    leased = as_json(pgdq(database, "poll", "--json", queue_name, "--max", "5"))
    assert [d["key"] for d in leased] == ["a", "b"] and leased[0]["payload"] == 1
    tokens = [d["lock_token"] for d in leased]
    assert as_json(pgdq(database, "ack", "--json", *tokens)) == {"acked": 2, "stale": 0}
    stale = pgdq(database, "ack", tokens[0])
    assert stale.exit_code == 4 and "0 of 1 acked" in stale.output
    assert pgdq(database, "ack", "not-a-token").exit_code == 2
    with Queue(queue_name, database) as q:
        q.offer("c", 3)
    (row,) = as_json(pgdq(database, "stats", "--json", queue_name))
    assert row["queue"] == queue_name and row["ready"] == 1 and row["leased"] == 0
    everything = pgdq(database, "stats")
    assert everything.exit_code == 0 and queue_name[:10] in everything.output


def test_dead_letters(database: str, queue_name: str) -> None:
    with Queue(queue_name, database) as q:
        q.offer_many([("a", 1), ("b", 2)])
        for d in q.poll_many(2):
            d.dead_letter(f"Traceback ...\nValueError: {d.key} broke")
    listed = as_json(pgdq(database, "dead-letters", "list", "--json", queue_name))
    assert [(d["key"], d["attempts"]) for d in listed] == [("a", 1), ("b", 1)]
    table = pgdq(database, "dead-letters", "list", queue_name)
    assert table.exit_code == 0 and "ValueError: a broke" in table.output
    assert as_json(pgdq(database, "dead-letters", "redrive", "--json", queue_name, "--key", "a")) == {"redriven": 1}
    assert as_json(pgdq(database, "dead-letters", "purge", "--json", "--yes", queue_name)) == {"purged": 1}
    with Queue(queue_name, database) as q:
        assert q.get("a") is not None and q.dead_letters() == []


# -- exit codes: pgdq not installed, a malformed --dsn, install errors -------

TOKEN = "00000000-0000-0000-0000-000000000001"
NEEDS_PGDQ = [
    ["offer", "q", "k", "1"],
    ["poll", "q"],
    ["ack", TOKEN],
    ["stats"],
    ["dead-letters", "list", "q"],
    ["dead-letters", "redrive", "q"],
    ["dead-letters", "purge", "q", "--yes"],
    ["worker", "--queue", "q", "--handler", "json:dumps"],
    ["upgrade"],
    ["uninstall", "--yes"],
]


@pytest.fixture
def empty(database: str) -> Iterator[str]:
    """A database without pgdq; its conninfo."""
    recreate_database("pgdq_cli_empty")
    yield dsn("pgdq_cli_empty")
    recreate_database("pgdq_cli_empty")


def one_line_error(result: Result, code: int) -> str:
    """The one line a failing command printed, once its exit code is checked (and no exception escaped)."""
    assert result.exit_code == code and isinstance(result.exception, SystemExit), result.output
    assert len(result.output.splitlines()) == 1 and result.output.startswith("Error: "), result.output
    return result.output


@pytest.mark.parametrize("args", NEEDS_PGDQ, ids=" ".join)
def test_commands_exit_3_when_pgdq_is_not_installed(empty: str, args: list[str]) -> None:
    assert "pgdq is not installed in " in one_line_error(pgdq(empty, *args), 3)
    assert "in schema nowhere" in one_line_error(pgdq(empty, *args, "--schema", "nowhere"), 3)


@pytest.mark.parametrize("conninfo", ["foo", "host='x", "nosuchoption=1", "postgresql://%zz@h/db"])
def test_a_malformed_dsn_is_bad_usage(conninfo: str) -> None:
    for args in (["stats"], ["install"], ["worker", "--queue", "q", "--handler", "json:dumps"]):
        assert "invalid connection string: " in one_line_error(pgdq(conninfo, *args), 2)


@pytest.mark.parametrize("conninfo", ["postgresql://x:y@:bad", "host=a=b"])
def test_an_unusable_dsn_is_one_line(conninfo: str) -> None:
    assert "cannot connect: " in one_line_error(pgdq(conninfo, "stats"), 1)


def test_install_errors_are_one_line(empty: str) -> None:
    assert pgdq(empty, "install", "--schema", "app").exit_code == 0
    assert "pgdq is already installed in schema app" in one_line_error(pgdq(empty, "install", "--schema", "app"), 1)
    assert "invalid --schema" in one_line_error(pgdq(empty, "install", "--schema", "a$$b"), 2)
    with psycopg.connect(empty, autocommit=True) as admin:
        admin.execute("DROP ROLE IF EXISTS pgdq_cli_weak")
        admin.execute("CREATE ROLE pgdq_cli_weak")
        try:
            weak = psycopg.conninfo.make_conninfo(empty, options="-c role=pgdq_cli_weak")
            assert "permission denied" in one_line_error(pgdq(weak, "install", "--schema", "other"), 1)
        finally:
            admin.execute("DROP ROLE pgdq_cli_weak")
