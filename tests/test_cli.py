"""The `pgdq` command against a real server: offer (one, and JSON Lines,
with what a bad line leaves behind, and --atomic), poll, ack, nack, peek,
cancel, purge, stats, pause, resume, retain, history, dead-letters,
schedules; keyless messages (their id shown, named by --id); tokens
printed whole on a narrow terminal and into a pipe; --json output,
--schema and exit codes (pgdq not installed, a malformed --dsn, install
errors: one line each)."""

from __future__ import annotations

import fcntl
import getpass
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import click
import psycopg
import pytest
from click.testing import CliRunner, Result
from conftest import DB, IN_YOUR_TRANSACTION, SHARDS, dsn, recreate_database, unsharded
from pgdq import Queue
from pgdq import __version__ as pgdq_version
from pgdq.cli import main

# the CLI tells a typo from a queue by dq_queues, which a PL/Proxy router does not have: every
# queue counts as known there (UNKNOWN: the exit code of a command on a queue with nothing left)
UNKNOWN = 0 if SHARDS else 4
SETTINGS_UNREAD = (
    "a router has no dq_queues: a queue known by its settings alone (paused, history on) cannot be told from a typo"
)


def pgdq(database: str, *args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), input=stdin, env={"PGDQ_DSN": database})


def as_json(result: Result) -> Any:
    """The JSON a command printed on stdout, once it succeeded."""
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


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
    assert "key must be 1 to 200 characters" in one_line_error(long_key, 2), "an argument pgdq refuses is bad usage"
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


def test_channels(database: str, queue_name: str) -> None:
    assert (
        pgdq(
            database, "channel", "set", queue_name, "acme", "--max-concurrency", "2", "--min-interval", "0.5"
        ).exit_code
        == 0
    )
    offered = pgdq(database, "offer", queue_name, "k1", "1", "--channel", "acme", "--priority", "3")
    assert offered.exit_code == 0 and offered.output.strip() == "created"
    lines = [
        json.dumps({"key": "k2", "payload": 2, "channel": "beta", "priority": -1}),
        json.dumps({"key": "k3", "payload": 3}),
    ]
    assert (
        as_json(pgdq(database, "offer", "--json", "--jsonl", queue_name, stdin="\n".join(lines) + "\n"))["created"] == 2
    )
    bad = pgdq(
        database,
        "offer",
        "--jsonl",
        queue_name,
        stdin=json.dumps({"key": "k4", "payload": 1, "priority": "high"}) + "\n",
    )
    assert bad.exit_code == 1 and "priority must be an integer" in bad.output
    assert as_json(pgdq(database, "channels", "--json", queue_name)) == [
        {
            "channel": "acme",
            "max_concurrency": 2,
            "min_interval": 0.5,
            "ready": 1,
            "delayed": 0,
            "leased": 0,
            "last_leased_at": None,
        },
        {
            "channel": "beta",
            "max_concurrency": None,
            "min_interval": None,
            "ready": 1,
            "delayed": 0,
            "leased": 0,
            "last_leased_at": None,
        },
    ]
    leased = as_json(pgdq(database, "poll", "--json", queue_name, "--max", "5"))
    assert [(d["key"], d["channel"], d["priority"]) for d in leased] == [
        ("k1", "acme", 3),
        ("k3", None, 0),  # due with k2 (one batch): the unchanneled group wins the tie
        ("k2", "beta", -1),
    ]
    table = pgdq(database, "stats", queue_name)
    assert table.exit_code == 0 and "acme\t2\t0.5 s\t0\t0\t1\t" in table.output, "stats QUEUE lists its channels"
    removed = pgdq(database, "channel", "remove", queue_name, "acme")
    assert removed.exit_code == 0 and removed.output.strip() == "removed"
    again = pgdq(database, "channel", "remove", queue_name, "acme")
    assert again.exit_code == 4 and "has no limits" in again.output
    refused = pgdq(database, "channel", "set", queue_name, "x" * 101, "--max-concurrency", "1")
    assert "channel must be 1 to 100 characters" in one_line_error(refused, 2)


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


def test_keyless_messages_show_their_id_and_are_named_by_it(database: str, queue_name: str) -> None:
    with Queue(queue_name, database) as q:
        q.offer("keyed", 1)
        sent = q.send({"n": 2}, scheduled_at=datetime.now(UTC) + timedelta(hours=1))
        other = q.send(3, scheduled_at=datetime.now(UTC) + timedelta(hours=2))
    shown = as_json(pgdq(database, "peek", "--json", queue_name))
    assert [(m["key"], m["payload"]) for m in shown] == [("keyed", 1), (None, {"n": 2}), (None, 3)]
    assert [m["id"] for m in shown][1:] == [sent, other] and isinstance(shown[0]["id"], int)
    rows = [line.split("\t") for line in pgdq(database, "peek", queue_name).output.splitlines()]
    assert [(r[0], r[5], r[6]) for r in rows] == [
        ("keyed", "1", str(shown[0]["id"])),
        ("", '{"n": 2}', str(sent)),
        ("", "3", str(other)),
    ], "a keyless message's key is empty, its id the last column"
    assert as_json(pgdq(database, "cancel", "--json", queue_name, "--id", str(sent))) == {"cancelled": True}
    missing = pgdq(database, "cancel", queue_name, "--id", str(sent))
    assert missing.exit_code == 4 and f"no message of id {sent} in" in missing.output
    both = pgdq(database, "cancel", queue_name, "keyed", "--id", str(other))
    assert both.exit_code == 2 and "not both" in both.output
    neither = pgdq(database, "cancel", queue_name)
    assert neither.exit_code == 2 and "--id" in neither.output
    with Queue(queue_name, database) as q:
        assert q.get_id(sent) is None and q.get_id(other) is not None and q.get("keyed") is not None
        q.purge()
        first, second = q.send("a"), q.send("b")
    polled = as_json(pgdq(database, "poll", "--json", queue_name, "--max", "2"))
    assert sorted((d["key"], d["id"]) for d in polled) == [(None, first), (None, second)]
    with Queue(queue_name, database) as q:
        for d in polled:
            assert q.dead_letter(UUID(d["lock_token"]), f"ValueError: {d['id']} broke")
    dead = as_json(pgdq(database, "dead-letters", "list", "--json", queue_name))
    assert sorted((d["key"], d["id"]) for d in dead) == [(None, first), (None, second)]
    rows = [line.split("\t") for line in pgdq(database, "dead-letters", "list", queue_name).output.splitlines()]
    assert sorted((r[0], r[4]) for r in rows) == [("", str(first)), ("", str(second))]
    redriven = as_json(pgdq(database, "dead-letters", "redrive", "--json", queue_name, "--id", str(first)))
    assert redriven["redriven"] == 1 and redriven["id"] not in (None, first, second)
    again = as_json(pgdq(database, "dead-letters", "redrive", "--json", queue_name, "--id", str(first)))
    assert again == {"redriven": 0, "id": None}
    clash = pgdq(database, "dead-letters", "purge", "--yes", queue_name, "--key", "k", "--id", str(second))
    assert clash.exit_code == 2 and "not both" in clash.output
    asked = pgdq(database, "dead-letters", "purge", queue_name, "--id", str(second), stdin="n\n")
    assert asked.exit_code == 1 and f"the dead letter of id {second}" in asked.output
    assert as_json(pgdq(database, "dead-letters", "purge", "--json", "--yes", queue_name, "--id", str(second))) == {
        "purged": 1
    }
    with Queue(queue_name, database) as q:
        assert q.dead_letters() == []
        (back,) = q.peek()
        assert back.key is None and back.id == redriven["id"] and back.raw_payload == "a"


def test_pause_and_resume_say_whether_they_changed_anything(database: str, queue_name: str) -> None:
    with Queue(queue_name, database) as q:
        q.offer("a", 1)
    paused = pgdq(database, "pause", queue_name)
    assert paused.exit_code == 0 and paused.output == f"{queue_name}: paused\n"
    assert as_json(pgdq(database, "pause", "--json", queue_name)) == {
        "queue": queue_name,
        "paused": True,
        "changed": False,
    }, "already paused: exit 0, nothing changed"
    assert as_json(pgdq(database, "poll", "--json", queue_name)) == [], "a paused queue leases nothing"
    (row,) = as_json(pgdq(database, "stats", "--json", queue_name))
    assert (row["ready"], row["paused"]) == (1, True)
    (line,) = pgdq(database, "stats", queue_name).output.splitlines()
    assert line.split("\t")[0] == queue_name and line.endswith("\tpaused"), "stats shows it, last"
    resumed = pgdq(database, "resume", queue_name)
    assert resumed.exit_code == 0 and resumed.output == f"{queue_name}: resumed\n"
    assert pgdq(database, "resume", queue_name).output == f"{queue_name}: not paused\n"
    (line,) = pgdq(database, "stats", queue_name).output.splitlines()
    assert line.endswith("\t"), "a running queue's paused cell is empty"
    assert [d["key"] for d in as_json(pgdq(database, "poll", "--json", queue_name))] == ["a"]


def test_retain_and_history(database: str, queue_name: str) -> None:
    assert as_json(pgdq(database, "retain", "--json", "--new", queue_name, "90s")) == {
        "queue": queue_name,
        "keep": 90.0,
    }
    said = pgdq(database, "retain", queue_name, "7d")
    assert said.exit_code == 0 and said.output == f"{queue_name}: records kept for 7d\n"
    with Queue(queue_name, database) as q:
        q.offer_many([("a", {"n": 1}), ("b", 2)])
        sent = q.send(3)
        for d in q.poll_many(3):
            if d.key == "a":
                d.nack(error="Traceback ...\nValueError: first try")
            elif d.key == "b":
                d.dead_letter("broke")
        (again,) = q.poll_many(1)
        again.ack()
        q.cancel_id(sent)
    records = as_json(pgdq(database, "history", "--json", queue_name))
    assert [(r["key"], r["outcome"]) for r in records] == [(None, "cancelled"), ("a", "acked"), ("b", "dead")]
    a = records[1]
    assert (a["payload"], a["attempts"], a["last_error"], a["queue"]) == (
        {"n": 1},
        2,
        "Traceback ...\nValueError: first try",
        queue_name,
    )
    assert a["finished_at"].endswith("Z") and records[0]["id"] == sent
    assert [r["outcome"] for r in as_json(pgdq(database, "history", "--json", queue_name, "a"))] == ["acked"]
    assert len(as_json(pgdq(database, "history", "--json", "--limit", "1", queue_name))) == 1
    rows = [line.split("\t") for line in pgdq(database, "history", queue_name).output.splitlines()]
    assert [(r[1], r[2], r[3], r[4], r[5], r[6]) for r in rows] == [
        ("cancelled", "", "1", "", "3", str(sent)),
        ("acked", "a", "2", "ValueError: first try", '{"n": 1}', str(a["id"])),
        ("dead", "b", "1", "broke", "2", str(records[2]["id"])),  # 1.3: the dead letter's verdict
    ], "finished_at, outcome, key, attempts, last error's last line, payload, id"
    assert rows[1][0] == a["finished_at"][:19] + "Z"
    assert as_json(pgdq(database, "retain", "--json", queue_name, "off")) == {"queue": queue_name, "keep": None}
    with Queue(queue_name, database) as q:
        q.offer("c", 4)
        (d,) = q.poll_many(1)
        d.ack()
    assert len(as_json(pgdq(database, "history", "--json", queue_name))) == 3, "off: no new record, the old stay"


# commands that read or act on a queue that exists: a typo is exit 4, naming it
PER_QUEUE = [
    ["pause"],
    ["resume"],
    ["retain", "{queue}", "7d"],
    ["history"],
    ["peek"],
    ["purge", "{queue}", "--yes"],
    ["stats"],
    ["channels"],
    ["dead-letters", "list"],
    ["dead-letters", "redrive"],
    ["dead-letters", "purge", "{queue}", "--yes"],
    ["schedules", "list"],
]


@unsharded(SETTINGS_UNREAD)
@pytest.mark.parametrize("command", PER_QUEUE, ids=lambda c: " ".join(c[:2]))
def test_a_queue_pgdq_does_not_know_is_exit_4_and_changes_nothing(
    database: str, queue_name: str, command: list[str]
) -> None:
    args = [a.format(queue=queue_name) for a in command] if "{queue}" in command else [*command, queue_name]
    refused = pgdq(database, *args)
    assert refused.exit_code == 4, refused.output
    assert f"no queue {queue_name!r}: pgdq knows no messages, dead letters, schedules" in refused.output
    assert pgdq(database, "pause", queue_name).exit_code == 4, "still unknown: nothing was written"


def test_a_queue_is_known_by_anything_it_has(database: str, queue_name: str) -> None:
    with Queue(queue_name, database) as q:
        q.configure(max_attempts=3)  # as every worker does: settings alone
        assert pgdq(database, "history", queue_name).exit_code == 0
    for what, make in {
        "a dead letter": lambda q: q.poll_many(1)[0].dead_letter("x") if q.offer("k", 1) else None,
        "a schedule": lambda q: q.schedule("s", "0 3 * * *"),
        "a channel's limits": lambda q: q.set_channel("c", max_concurrency=1),
    }.items():
        with Queue(f"{queue_name}_{what[2:4]}", database) as q:
            make(q)
            assert pgdq(database, "peek", q.name).exit_code == 0, what


@unsharded(SETTINGS_UNREAD)
def test_pause_new_shows_an_idle_paused_queue_in_stats(database: str, queue_name: str) -> None:
    said = pgdq(database, "pause", "--new", queue_name)
    assert said.exit_code == 0 and said.output == f"{queue_name}: paused\n"
    rows = [line.split("\t") for line in pgdq(database, "stats").output.splitlines()]
    assert [queue_name, "0", "0", "0", "", "", "paused"] in rows, "a paused queue with no messages is listed"
    (row,) = [r for r in as_json(pgdq(database, "stats", "--json")) if r["queue"] == queue_name]
    assert (row["ready"], row["paused"]) == (0, True)
    assert pgdq(database, "resume", queue_name).exit_code == 0
    assert queue_name not in pgdq(database, "stats").output, "resumed, with no messages: not listed"


@unsharded(SETTINGS_UNREAD)
def test_history_says_when_it_is_off(database: str, queue_name: str) -> None:
    with Queue(queue_name, database) as q:
        q.offer("k", 1)
    off = CliRunner().invoke(main, ["history", queue_name], env={"PGDQ_DSN": database})
    assert off.exit_code == 0 and f"{queue_name}: history is off (`pgdq retain {queue_name} 7d`" in off.stderr
    assert pgdq(database, "retain", queue_name, "1h").exit_code == 0
    on = CliRunner().invoke(main, ["history", queue_name], env={"PGDQ_DSN": database})
    assert on.exit_code == 0 and "history is off" not in on.stderr


def test_stored_control_characters_are_escaped(database: str, queue_name: str) -> None:
    title, clear = "\x1b]0;pwned\x07", "\x1b[2J"
    with Queue(queue_name, database) as q:
        q.offer(f"k{title}", clear)
        (d,) = q.poll_many(1)
        d.nack(error=f"boom{clear}\u202eevil")
    piped = pgdq(database, "peek", queue_name).output
    on_tty = on_terminal(database, "peek", queue_name, columns=200)
    for output in (piped, on_tty):
        assert "\x1b" not in output and "\x07" not in output and "\u202e" not in output, repr(output)
        assert "\\u001b]0;pwned\\u0007" in output and "boom\\u001b[2J\\u202eevil" in output, repr(output)
    assert "k\\u001b]0;pwned\\u0007\t" in piped, "into a pipe: escaped once, not the backslash again"
    assert as_json(pgdq(database, "peek", "--json", queue_name))[0]["key"] == f"k{title}", "JSON escapes by itself"


def test_schedules_take_five_or_six_fields_as_the_help_says(database: str, queue_name: str) -> None:
    helped = pgdq(database, "schedules", "set", "--help").output
    assert "five cron fields" in helped and "six with a leading seconds field" in helped
    made = as_json(pgdq(database, "schedules", "set", "--json", queue_name, "s", "30 0 9 * * *"))
    assert datetime.fromisoformat(made["next_at"]).second == 30


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["retain", "{queue}", "7x"], 2, "'7x' is neither a duration"),
        (["retain", "{queue}", "7"], 2, "'7' is neither a duration"),
        (["retain", "{queue}", "1.5h"], 2, "'1.5h' is neither a duration"),
        (["retain", "{queue}", "0s"], 2, "keep must be positive and at most 3650 days"),
        (["retain", "{queue}", "3651d"], 2, "keep must be positive and at most 3650 days"),
        (["retain", "q" * 101, "1h"], 2, "queue must be 1 to 100 characters"),
        (["history", "{queue}", "k" * 201], 2, "key must be 1 to 200 characters"),
        (["history", "{queue}", "--limit", "0"], 2, "0 is not in the range 1<=x<=1000"),
        (["pause", "q" * 101], 2, "queue must be 1 to 100 characters"),
        (["resume", ""], 2, "queue must be 1 to 100 characters"),
    ],
)
def test_pause_retain_and_history_refuse_bad_input_and_write_nothing(
    database: str, queue_name: str, args: list[str], code: int, message: str
) -> None:
    refused = pgdq(database, *(a.format(queue=queue_name) for a in args))
    assert refused.exit_code == code and message in refused.output, refused.output
    with Queue(queue_name, database) as q:
        q.offer("a", 1)
        (d,) = q.poll_many(1)
        d.ack()
        assert q.history() == [] and q.stats().paused is False, "no retention turned on, nothing paused"


def jsonl(*items: dict[str, Any] | str) -> str:
    """JSON Lines of items (a str item is a line as it is)."""
    return "".join((item if isinstance(item, str) else json.dumps(item)) + "\n" for item in items)


def test_offer_json_lines_says_what_a_bad_line_left_behind(database: str, queue_name: str) -> None:
    with Queue(queue_name, database) as q:
        q.offer("k1", "old")
    lines = jsonl(
        *({"key": f"k{i}", "payload": i} for i in range(1, 6)), "", '{"key": "k6"}', {"key": "k7", "payload": 7}
    )
    broken = pgdq(database, "offer", "--jsonl", "--batch", "2", queue_name, stdin=lines)
    assert one_line_error(broken, 1) == (
        'Error: line 7: expected an object {"key", "payload"[, "scheduled_at", "channel", "priority"]};'
        " 4 messages before it were offered and stay (3 created, 1 updated); nothing from line 5 on\n"
    )
    with Queue(queue_name, database) as q:
        assert [(m.key, m.payload) for m in q.peek()] == [("k1", 1), ("k2", 2), ("k3", 3), ("k4", 4)]
    first = pgdq(database, "offer", "--jsonl", queue_name, stdin="[1]\n")
    assert one_line_error(first, 1).endswith("; nothing was offered\n")


def test_offer_json_lines_says_which_batch_the_server_refused(database: str, queue_name: str) -> None:
    lines = jsonl(
        {"key": "a", "payload": 1}, {"key": "b", "payload": 2}, {"key": "c", "payload": 3}, {"key": "", "payload": 4}
    )
    refused = one_line_error(pgdq(database, "offer", "--jsonl", "--batch", "2", queue_name, stdin=lines), 1)
    assert refused.startswith("Error: the batch of lines 3-4: pgdq: ")
    assert refused.endswith("; 2 messages before it were offered and stay (2 created); nothing from line 3 on\n")
    with Queue(queue_name, database) as q:
        assert [m.key for m in q.peek()] == ["a", "b"]


@unsharded(IN_YOUR_TRANSACTION)
def test_offer_json_lines_atomic_is_all_or_nothing(database: str, queue_name: str) -> None:
    good = [{"key": f"k{i}", "payload": i} for i in range(5)]
    for bad in ('{"key": "k5"', {"key": "", "payload": 0}):
        failed = pgdq(database, "offer", "--jsonl", "--atomic", "--batch", "2", queue_name, stdin=jsonl(*good, bad))
        assert one_line_error(failed, 1).endswith("; nothing was offered (--atomic: the import rolled back)\n")
        with Queue(queue_name, database) as q:
            assert q.peek() == []
    counts = as_json(
        pgdq(database, "offer", "--json", "--jsonl", "--atomic", "--batch", "2", queue_name, stdin=jsonl(*good))
    )
    assert counts == {"created": 5, "updated": 0, "ignored": 0}
    assert pgdq(database, "offer", "--atomic", queue_name, "k", "1").exit_code == 2


def test_peek_cancel_and_purge(database: str, queue_name: str) -> None:
    with Queue(queue_name, database) as q:
        q.offer("leased", 2)
        leased = q.poll()
        assert leased is not None
        q.offer_many([("due", {"a": 1}), ("later", 3, datetime.now(UTC) + timedelta(hours=1))])
    shown = as_json(pgdq(database, "peek", "--json", queue_name))
    assert [(m["key"], m["payload"], m["leased"]) for m in shown] == [
        ("due", {"a": 1}, False),
        ("leased", 2, True),
        ("later", 3, False),
    ]
    assert [m["key"] for m in as_json(pgdq(database, "peek", "--json", "--leased", queue_name))] == ["leased"]
    assert [m["key"] for m in as_json(pgdq(database, "peek", "--json", "--delayed", queue_name))] == ["later"]
    assert [m["key"] for m in as_json(pgdq(database, "peek", "--json", "--due", "--limit", "5", queue_name))] == ["due"]
    rows = [line.split("\t") for line in pgdq(database, "peek", queue_name).output.splitlines()]
    assert [(r[0], r[2], r[3], r[5]) for r in rows] == [
        ("due", "0", "", '{"a": 1}'),
        ("leased", "1", "leased", "2"),
        ("later", "0", "", "3"),
    ]
    assert pgdq(database, "peek", "--limit", "0", queue_name).exit_code == 2
    assert as_json(pgdq(database, "cancel", "--json", queue_name, "leased")) == {"cancelled": True}
    missing = pgdq(database, "cancel", queue_name, "leased")
    assert missing.exit_code == 4 and "no message leased in" in missing.output
    asked = pgdq(database, "purge", queue_name, stdin="n\n")
    assert asked.exit_code == 1 and "Delete every message of" in asked.output
    assert as_json(pgdq(database, "purge", "--json", queue_name, stdin="y\n")) == {"purged": 2}
    emptied = pgdq(database, "purge", "--yes", "--json", queue_name)
    assert emptied.exit_code == UNKNOWN, "nothing left of it: nothing there to act on"
    assert SHARDS or "no queue" in emptied.output
    with Queue(queue_name, database) as q:
        assert not q.ack(leased.lock_token)


def test_nack_with_an_error(database: str, queue_name: str) -> None:
    with Queue(queue_name, database) as q:
        q.offer_many([("a", 1), ("b", 2)])
        a, b = q.poll_many(2)
    assert as_json(pgdq(database, "nack", "--json", str(a.lock_token), "--in", "3600", "--error", "boom")) == {
        "nacked": True
    }
    assert pgdq(database, "nack", str(b.lock_token)).output == "nacked\n"
    stale = pgdq(database, "nack", str(a.lock_token))
    assert stale.exit_code == 4 and "stale" in stale.output
    assert pgdq(database, "nack", "nope").exit_code == 2
    assert pgdq(database, "nack", str(b.lock_token), "--at", "2030-01-01T00:00:00Z", "--in", "1").exit_code == 2
    with Queue(queue_name, database) as q:
        (b_now, a_now) = q.peek()
    assert (a_now.key, a_now.last_error, a_now.due_at > datetime.now(UTC) + timedelta(minutes=59)) == (
        "a",
        "boom",
        True,
    )
    assert (b_now.key, b_now.last_error, b_now.leased) == ("b", None, False)


def test_schedules(database: str, queue_name: str) -> None:
    made = as_json(
        pgdq(database, "schedules", "set", "--json", queue_name, "nightly", "0 3 * * *", "--payload", '{"x": 1}')
    )
    assert made["name"] == "nightly" and datetime.fromisoformat(made["next_at"]).hour == 3
    said = pgdq(database, "schedules", "set", queue_name, "paris", "0 9 * * mon-fri", "--timezone", "Europe/Paris")
    assert said.exit_code == 0 and said.output.startswith(f"{queue_name}/paris: next at ")
    listed = [s for s in as_json(pgdq(database, "schedules", "list", "--json")) if s["queue"] == queue_name]
    assert [(s["name"], s["payload"], s["timezone"]) for s in listed] == [
        ("nightly", {"x": 1}, "UTC"),
        ("paris", None, "Europe/Paris"),
    ]
    rows = pgdq(database, "schedules", "list", queue_name).output.splitlines()
    assert [row.split("\t")[:3] for row in rows] == [
        [queue_name, "nightly", "0 3 * * *"],
        [queue_name, "paris", "0 9 * * mon-fri"],
    ]
    bad = pgdq(database, "schedules", "set", queue_name, "bad", "61 * * * *")
    assert bad.exit_code == 2 and "Error: " in bad.output
    assert pgdq(database, "schedules", "set", queue_name, "bad", "* * * * *", "--payload", "{").exit_code == 2
    assert as_json(pgdq(database, "schedules", "remove", "--json", queue_name, "nightly")) == {"removed": True}
    assert pgdq(database, "schedules", "remove", queue_name, "paris").output == "removed\n"
    assert pgdq(database, "schedules", "remove", queue_name, "paris").exit_code == 4
    assert pgdq(database, "schedules", "list", "--json", queue_name).exit_code == UNKNOWN, "nothing left of the queue"


def test_poll_prints_whole_tokens_into_a_pipe(database: str, queue_name: str) -> None:
    key = "a-key-rather-longer-than-a-narrow-terminal-would-like-" + "x" * 60
    with Queue(queue_name, database) as q:
        q.offer_many([(f"{key}{i}", {"text": "y" * 200}) for i in range(3)])
    env = {**os.environ, "PGDQ_DSN": database, "COLUMNS": "80"}
    command = [sys.executable, "-m", "pgdq", "poll", queue_name, "--max", "3"]
    printed = subprocess.run(command, capture_output=True, text=True, env=env, check=True)  # stdout: a pipe
    rows = [line.split("\t") for line in printed.stdout.splitlines()]
    assert [row[1] for row in rows] == [f"{key}{i}" for i in range(3)], "keys whole, one row a line"
    assert as_json(pgdq(database, "ack", "--json", *(row[0] for row in rows))) == {"acked": 3, "stale": 0}


def test_poll_prints_whole_tokens_on_a_narrow_terminal(database: str, queue_name: str) -> None:
    with Queue(queue_name, database) as q:
        q.offer_many([(f"key-{i}-" + "k" * 70, {"text": "y" * 300}) for i in range(3)])
    output = on_terminal(database, "poll", queue_name, "--max", "3", columns=80)
    assert "leased" in output and max(map(len, output.splitlines())) <= 80
    tokens = re.findall(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", output)
    assert len(tokens) == 3
    assert as_json(pgdq(database, "ack", "--json", *tokens)) == {"acked": 3, "stale": 0}


def test_offer_json_lines_shows_count_and_rate_on_a_terminal(database: str, queue_name: str) -> None:
    lines = jsonl(*({"key": f"k{i}", "payload": i} for i in range(3000)))
    output = on_terminal(database, "offer", "--jsonl", "--batch", "100", queue_name, stdin=lines, columns=120)
    assert re.search(r"offering to \S+ .*[\d,]+ messages, [\d,]+/s", output), output
    assert output.strip().endswith("3000 created, 0 updated, 0 ignored")


def on_terminal(database: str, *args: str, columns: int, stdin: str | None = None) -> str:
    """What `pgdq args` writes to a terminal columns wide (stdout and stderr), escapes removed."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    env = {**os.environ, "PGDQ_DSN": database, "COLUMNS": str(columns), "TERM": "xterm"}
    process = subprocess.Popen(
        [sys.executable, "-m", "pgdq", *args],
        stdin=subprocess.PIPE,
        stdout=follower,
        stderr=follower,
        env=env,
    )
    os.close(follower)
    assert process.stdin is not None
    process.stdin.write((stdin or "").encode())
    process.stdin.close()
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed: the command is done
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert process.wait(timeout=60) == 0, b"".join(chunks)
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode()).replace("\r", "")


@unsharded("reads pg_extension of the test database")
def test_every_command_takes_one_schema_default_and_json(database: str, empty: str) -> None:
    with psycopg.connect(database, autocommit=True) as conn:
        schema = conn.execute(
            "SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = 'pgdq'"
        ).fetchone()
    assert schema == ("public",)
    assert as_json(pgdq(database, "version", "--json")) == {
        "client": pgdq_version,
        "database": pgdq_version,
        "schema": "public",
    }
    env_schema = CliRunner().invoke(main, ["stats"], env={"PGDQ_DSN": database, "PGDQ_SCHEMA": "elsewhere"})
    assert one_line_error(env_schema, 3) == "Error: pgdq is not installed in schema elsewhere\n"
    bad = CliRunner().invoke(main, ["peek", "q"], env={"PGDQ_DSN": database, "PGDQ_SCHEMA": "a$b"})
    assert "invalid --schema" in one_line_error(bad, 2)
    assert as_json(pgdq(empty, "install", "--json", "--schema", "app")) == {
        "installed": True,
        "version": pgdq_version,
        "schema": "app",
    }
    assert as_json(pgdq(empty, "install", "--json", "--schema", "app", "--if-not-exists"))["installed"] is False
    assert as_json(pgdq(empty, "upgrade", "--json", "--schema", "app")) == {
        "schema": "app",
        "version": pgdq_version,
        "path": [],
    }
    assert as_json(pgdq(empty, "offer", "--json", "--schema", "app", "q", "k", "1")) == {
        "key": "k",
        "outcome": "created",
    }
    in_app = CliRunner().invoke(main, ["stats", "--json"], env={"PGDQ_DSN": empty, "PGDQ_SCHEMA": "app"})
    assert [s["queue"] for s in as_json(in_app)] == ["q"]
    assert as_json(pgdq(empty, "uninstall", "--json", "--yes", "--schema", "app")) == {
        "uninstalled": True,
        "schema": "app",
    }
    gone = pgdq(empty, "version", "--json", "--schema", "app")
    assert gone.exit_code == 3 and json.loads(gone.output)["database"] is None


# -- exit codes: pgdq not installed, a malformed --dsn, install errors -------

TOKEN = "00000000-0000-0000-0000-000000000001"
NEEDS_PGDQ = [
    ["offer", "q", "k", "1"],
    ["offer", "q", "--jsonl"],
    ["poll", "q"],
    ["ack", TOKEN],
    ["nack", TOKEN],
    ["peek", "q"],
    ["cancel", "q", "k"],
    ["cancel", "q", "--id", "1"],
    ["purge", "q", "--yes"],
    ["stats"],
    ["schedules", "list"],
    ["schedules", "set", "q", "s", "* * * * *"],
    ["schedules", "remove", "q", "s"],
    ["channels", "q"],
    ["channel", "set", "q", "c", "--max-concurrency", "1"],
    ["channel", "remove", "q", "c"],
    ["dead-letters", "list", "q"],
    ["dead-letters", "redrive", "q"],
    ["dead-letters", "redrive", "q", "--id", "1"],
    ["dead-letters", "purge", "q", "--yes"],
    ["pause", "q"],
    ["resume", "q"],
    ["retain", "q", "1h"],
    ["history", "q"],
    ["worker", "--queue", "q", "--handler", "json:dumps"],
    ["upgrade"],
    ["uninstall", "--yes"],
]


@pytest.fixture
def empty(database: str) -> Iterator[str]:
    """A database without pgdq; its conninfo."""
    name = f"{DB}_cli_empty"  # one per test database: runs of other checkouts do not collide
    recreate_database(name)
    yield dsn(name)
    recreate_database(name)


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


# -- what a newcomer meets: no DSN, --help, times, counts, --handler ------------------


def test_without_a_dsn_it_says_which_server_it_tried() -> None:
    unset: dict[str, str | None] = {k: None for k in os.environ if re.fullmatch(r"PG[A-Z]+|PGDQ_\w+|DATABASE_URL", k)}
    result = CliRunner().invoke(main, ["stats"], env=unset)
    # nothing named a server: libpq's defaults reach a local server without pgdq (3) or none at all (1)
    error = one_line_error(result, 3 if "not installed" in result.output else 1)
    assert f"(no DSN given, so libpq's defaults: database {getpass.getuser()} on " in error, error
    assert "set --dsn, PGDQ_DSN or DATABASE_URL)" in error
    version = CliRunner().invoke(main, ["version"], env=unset)
    assert version.exit_code in (1, 3) and "(no DSN given, so libpq's defaults: database " in version.output


def commands_with_a_dsn(group: click.Group, path: str = "pgdq") -> Iterator[tuple[str, click.Command]]:
    """Every command under group that takes --dsn, with its full name."""
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from commands_with_a_dsn(command, f"{path} {name}")
        elif any("--dsn" in p.opts for p in command.params):
            yield f"{path} {name}", command


def test_every_dsn_option_names_its_environment_variables() -> None:
    found = dict(commands_with_a_dsn(main))
    assert "pgdq stats" in found and "pgdq serve" in found and "pgdq worker" in found
    for name, command in found.items():
        (option,) = (p for p in command.params if "--dsn" in p.opts)
        assert "PGDQ_DSN" in (option.help or "") and "DATABASE_URL" in (option.help or ""), name


def test_help_lists_whole_summaries() -> None:
    for args in ([], ["schedules"], ["dead-letters"], ["channel"]):
        listed = CliRunner().invoke(main, [*args, "--help"], terminal_width=80)
        assert listed.exit_code == 0 and "..." not in listed.output.split("Commands:")[1], listed.output
    listed = CliRunner().invoke(main, ["--help"], terminal_width=80).output
    purge = " ".join(re.split(r"\n  \S", listed.split("  purge ", 1)[1])[0].split())  # up to the next command
    assert purge == "Delete every message of QUEUE (leased ones too; its dead letters stay)", "wrapped, not cut"


def test_times_are_iso_8601_in_utc_with_z(database: str, queue_name: str) -> None:
    offered = pgdq(database, "offer", queue_name, "k", "1", "--at", "2030-01-01T14:30:00+02:00")
    assert offered.exit_code == 0
    (peeked,) = as_json(pgdq(database, "peek", "--json", queue_name))
    assert peeked["scheduled_at"] == "2030-01-01T12:30:00Z"
    (stats,) = [s for s in as_json(pgdq(database, "stats", "--json")) if s["queue"] == queue_name]
    assert stats["next_due_at"] == "2030-01-01T12:30:00Z"
    piped = pgdq(database, "peek", queue_name)  # CliRunner's stdout is no terminal: tab-separated
    assert piped.exit_code == 0 and "\t2030-01-01T12:30:00Z\t" in piped.output, piped.output


def test_counts_agree_with_their_nouns(database: str, queue_name: str) -> None:
    assert pgdq(database, "channel", "set", queue_name, "acme", "--max-concurrency", "1").exit_code == 0
    assert re.search(r": 1 channel *\n", on_terminal(database, "channels", queue_name, columns=120))
    with Queue(queue_name, database) as q:
        q.offer("a", 1)
        (d,) = q.poll_many(1)
        d.dead_letter("broke")
    assert re.search(r": 1 dead letter *\n", on_terminal(database, "dead-letters", "list", queue_name, columns=120))
    broken = pgdq(
        database, "offer", "--jsonl", "--batch", "1", queue_name, stdin=jsonl({"key": "b", "payload": 1}, "{")
    )
    assert "; 1 message before it was offered and stays (1 created);" in one_line_error(broken, 1)


def test_handler_from_a_file_or_a_hint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pgdq.cli._setup import _import_handler

    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "mytasks.py").write_text("def handle(d):\n    return d\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert _import_handler("jobs/mytasks.py:handle")(7) == 7
    with pytest.raises(
        click.BadParameter,
        match=r"no module nosuchtasks in .* give the file, e.g. "
        r"--handler path/to/nosuchtasks.py:handle",
    ):
        _import_handler("nosuchtasks:handle")
    with pytest.raises(click.BadParameter, match="no file jobs/nothere.py"):
        _import_handler("jobs/nothere.py:handle")
    with pytest.raises(click.BadParameter, match="module mytasks has no other"):
        _import_handler("jobs/mytasks.py:other")
