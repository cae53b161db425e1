"""pgdq serve's classic protocol (POST /command) over a real server and database."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from conftest import ROOT, nested
from http_server import Server, make_tokens, serve
from pgdq import Client, Queue


def command(api: httpx.Client, **fields: Any) -> tuple[int, dict[str, Any]]:
    r = api.post("/command", json=fields)
    return r.status_code, r.json()


def test_add_pop_finish(api: httpx.Client, queue_name: str, q: Queue) -> None:
    status, answer = command(api, command="add", topic=queue_name, id="order:1", TTR=120, body='{"uid": 7}')
    assert (status, answer) == (200, {"success": True, "error": None, "id": "order:1", "value": "created"})
    assert q.get("order:1").payload == {"body": '{"uid": 7}', "ttr": 120}  # type: ignore[union-attr]
    status, answer = command(api, command="pop", topic=queue_name)
    assert (status, answer["id"], answer["value"]) == (200, "order:1", '{"uid": 7}')
    lease_end = q.get("order:1").due_at  # type: ignore[union-attr]
    assert timedelta(seconds=110) < lease_end - datetime.now(UTC) <= timedelta(seconds=120), "leased for its TTR"
    assert command(api, command="pop", topic=queue_name) == (200, _empty())
    assert command(api, command="finish", id="order:1") == (200, {**_empty(), "id": "order:1"})
    assert q.get("order:1") is None
    status, answer = command(api, command="finish", id="order:1")
    assert (status, answer["success"], answer["error"]) == (404, False, "no job of id 'order:1'")


def test_a_finished_job_is_recorded_acked_a_deleted_one_cancelled(api: httpx.Client, queue_name: str, q: Queue) -> None:
    """finish is the job done (history: acked, 1.3; it said cancelled), delete is not."""
    q.retain(timedelta(days=1))
    for job in ("done", "named", "dropped"):
        command(api, command="add", topic=queue_name, id=job, body=job)
    assert {command(api, command="pop", topic=queue_name)[1]["id"] for _ in range(3)} == {"done", "named", "dropped"}
    assert command(api, command="finish", id="done")[1]["success"] is True
    assert command(api, command="finish", id="named", topic=queue_name)[1]["success"] is True
    assert command(api, command="delete", id="dropped")[1]["success"] is True
    assert {r.key: r.outcome for r in q.history()} == {"done": "acked", "named": "acked", "dropped": "cancelled"}


def test_a_finished_keyless_job_is_recorded_acked_a_deleted_one_cancelled(
    api: httpx.Client, queue_name: str, q: Queue
) -> None:
    """A job popped as "#ID@TOPIC" (sent without a key) is finished as done too: history
    acked (dq_finish_id, 1.3; it said cancelled), with or without its topic; delete is not."""
    q.retain(timedelta(days=1))
    done, named, dropped = (q.send({"body": body, "ttr": 60}) for body in ("done", "named", "dropped"))
    handed = {command(api, command="pop", topic=queue_name)[1]["id"] for _ in range(3)}
    assert handed == {f"#{id}@{queue_name}" for id in (done, named, dropped)}
    assert command(api, command="finish", id=f"#{done}@{queue_name}")[1]["success"] is True
    assert command(api, command="finish", id=f"#{named}@{queue_name}", topic=queue_name)[1]["success"] is True
    assert command(api, command="delete", id=f"#{dropped}@{queue_name}")[1]["success"] is True
    assert {r.id: r.outcome for r in q.history()} == {done: "acked", named: "acked", dropped: "cancelled"}


def _empty() -> dict[str, Any]:
    return {"success": True, "error": None, "id": None, "value": None}


def test_delay_count_and_wait(api: httpx.Client, queue_name: str, q: Queue) -> None:
    for i in range(3):
        command(api, command="add", topic=queue_name, id=f"j{i}", body={"n": i})
    command(api, command="add", topic=queue_name, id="later", delay=3600, body=None)
    status, answer = command(api, command="pop", topic=queue_name, count=5)
    assert status == 200 and answer["id"] is None
    assert sorted(j["id"] for j in answer["value"]) == ["j0", "j1", "j2"]
    assert {j["id"]: j["value"] for j in answer["value"]}["j1"] == {"n": 1}
    threading.Timer(1.0, lambda: q.offer("woken", {"body": "hi", "ttr": 5})).start()
    started = time.monotonic()
    status, answer = command(api, command="pop", topic=queue_name, wait=20)
    assert (answer["id"], answer["value"]) == ("woken", "hi") and time.monotonic() - started < 10
    assert command(api, command="delete", id="later")[1]["success"] is True
    assert q.get("later") is None


def test_a_message_offered_otherwise_is_all_body(api: httpx.Client, queue_name: str, q: Queue) -> None:
    q.offer("plain", {"not": "an envelope"})
    answer = command(api, command="pop", topic=queue_name)[1]
    assert (answer["id"], answer["value"]) == ("plain", {"not": "an envelope"})


def test_a_body_too_deep_to_pop_is_refused_and_pops_go_on(api: httpx.Client, queue_name: str, q: Queue) -> None:
    assert command(api, command="add", topic=queue_name, id="ok", body=nested(199))[0] == 200
    status, answer = command(api, command="add", topic=queue_name, id="deep", body=nested(254))
    assert (status, answer["success"]) == (400, False) and "more than 199 levels deep" in answer["error"]
    assert q.get("deep") is None, "nothing written"
    q.offer("deeper", nested(255))  # offered otherwise: the pop dead-letters it, the others come out
    status, answer = command(api, command="pop", topic=queue_name, count=10)
    assert status == 200 and [j["id"] for j in answer["value"]] == ["ok"]
    (dead,) = q.dead_letters()
    assert dead.key == "deeper" and "more than 200 levels deep" in (dead.error or "")
    q.purge_dead_letters()


def test_ids_are_unique_across_topics(api: httpx.Client, queue_name: str, q: Queue, database: str) -> None:
    other = queue_name + "_other"
    assert command(api, command="add", topic=queue_name, id="x", body=1)[1]["success"]
    status, answer = command(api, command="add", topic=other, id="x", body=2)
    assert (status, answer["success"]) == (409, False) and "taken by another topic" in answer["error"]
    assert other not in answer["error"] and queue_name not in answer["error"], "no topic named"
    assert Queue(other, database).get("x") is None, "nothing written"
    Queue(other, database).offer("x", 3)  # not through /command: both topics hold x
    status, answer = command(api, command="delete", id="x")
    assert (status, answer["success"]) == (409, False) and "name the topic" in answer["error"]
    assert command(api, command="delete", id="x", topic=other)[1]["success"] is True
    assert command(api, command="finish", id="x")[1]["success"] is True and q.get("x") is None


def test_concurrent_adds_of_one_id_to_two_topics(api: httpx.Client, queue_name: str, database: str) -> None:
    topics = [queue_name + "_a", queue_name + "_b"]
    for key in (f"race{n}" for n in range(15)):
        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(lambda t, k=key: command(api, command="add", topic=t, id=k), topics))
        assert sorted(status for status, _ in answers) == [200, 409], answers
        held = [t for t in topics if Queue(t, database).get(key) is not None]
        assert len(held) == 1, held


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"command": "shout", "topic": "t"}, "does not match any of the expected tags"),
        ({"topic": "t", "id": "k"}, "Unable to extract tag using discriminator"),
        ({"command": "add", "topic": "t"}, "add.id: Field required"),
        ({"command": "add", "topic": "t", "id": "k", "TTR": 0}, "TTR: Input should be greater than or equal to 1"),
        ({"command": "add", "topic": "t", "id": "k", "TTR": 1e-7}, "TTR: Input should be greater than or equal to 1"),
        ({"command": "add", "topic": "t", "id": "k", "TTR": 0.5}, "TTR: Input should be greater than or equal to 1"),
        ({"command": "add", "topic": "t", "id": "k", "TTR": -1}, "TTR: Input should be greater than or equal to 1"),
        ({"command": "add", "topic": "t", "id": "k", "TTR": 1e300}, "TTR: Input should be less than or equal to 86400"),
        ({"command": "add", "topic": "t", "id": "k", "TTR": 86401}, "TTR: Input should be less than or equal to 86400"),
        ({"command": "add", "topic": "t", "id": "k", "TTR": "60"}, "TTR: Input should be a valid number"),
        ({"command": "add", "topic": "t", "id": "k", "delay": -1}, "delay"),
        ({"command": "add", "topic": "t", "id": "k", "delay": "5"}, "delay"),
        ({"command": "add", "topic": "t", "id": "k", "surprise": 1}, "surprise: Extra inputs"),
        ({"command": "add", "topic": "t", "id": "k\u0000"}, "0x00"),
        ({"command": "add", "topic": "t" * 101, "id": "k"}, "topic: String should have at most 100 characters"),
        ({"command": "pop", "topic": "t", "wait": 61}, "wait"),
        ({"command": "pop", "topic": "t", "count": 0}, "count"),
        ({"command": "finish", "id": ""}, "id"),
    ],
)
def test_bad_commands_fail_in_the_protocols_shape(
    api: httpx.Client, fields: dict[str, Any], says: str, database: str
) -> None:
    status, answer = command(api, **fields)
    assert status == 400 and answer["success"] is False and says in answer["error"], answer
    assert set(answer) == {"success", "error", "id", "value"}
    assert Queue("t", database).stats().ready == 0


def test_malformed_and_large_bodies(api: httpx.Client) -> None:
    r = api.post("/command", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["success"] is False and "JSON" in r.json()["error"]
    r = api.post("/command", json={"command": "add", "topic": "t", "id": "k", "body": "x" * (1 << 20)})
    assert r.status_code == 413 and r.json() == {
        "success": False,
        "error": "the request body is over 1048576 bytes",
        "id": None,
        "value": None,
    }


def test_tokens(database: str, tmp_path: Path) -> None:
    secrets = make_tokens(tmp_path / "tokens.json", {"shop": (["produce"], ["orders"]), "ops": (["admin"], [])})
    s = serve(database, "--tokens", str(tmp_path / "tokens.json"))
    try:
        with httpx.Client(base_url=s.url, timeout=10) as api:
            add = {"command": "add", "topic": "orders", "id": "t1"}
            assert api.post("/command", json=add).status_code == 401
            shop = {"authorization": f"Bearer {secrets['shop']}"}
            assert api.post("/command", json=add, headers=shop).json()["success"] is True
            r = api.post("/command", json={"command": "pop", "topic": "orders"}, headers=shop)
            assert r.status_code == 403 and r.json()["success"] is False and "consume" in r.json()["error"]
            r = api.post("/command", json={"command": "finish", "id": "t1"}, headers=shop)
            assert r.status_code == 403
            ops = {"authorization": f"Bearer {secrets['ops']}"}
            assert api.post("/command", json={"command": "finish", "id": "t1"}, headers=ops).json()["success"]
    finally:
        s.stop()


# Envelopes no add writes (a TTR under a second, negative, past any interval,
# not a number) beside good jobs, offered straight through SQL.
PLANTED = {
    "good:1": ("120", 120),
    "bad:tiny": ("1e-7", 60),
    "bad:negative": ("-1", 60),
    "bad:huge": ("1e300", 60),
    "bad:past_float": ("1e400", 60),
    "bad:text": ('"soon"', 60),
    "good:2": ("30", 30),
}


def _plant(conn: psycopg.Connection[Any], topic: str) -> None:
    for key, (ttr, _) in PLANTED.items():
        conn.execute(
            "SELECT dq_offer(%s, %s, jsonb_build_object('body', %s::text, 'ttr', %s::jsonb))", (topic, key, key, ttr)
        )


def test_a_bad_envelope_breaks_neither_its_batch_nor_its_topic(
    api: httpx.Client, queue_name: str, q: Queue, conn: psycopg.Connection[Any], database: str
) -> None:
    q.configure(max_attempts=1)  # a job leased and lost once would be buried: none must be
    _plant(conn, queue_name)
    status, answer = command(api, command="pop", topic=queue_name, count=10)
    assert status == 200, answer
    assert {j["id"]: (j["value"], j["TTR"]) for j in answer["value"]} == {k: (k, t) for k, (_, t) in PLANTED.items()}
    for key, (_, ttr) in PLANTED.items():
        left = q.get(key).due_at - datetime.now(UTC)  # type: ignore[union-attr]
        assert timedelta(seconds=ttr - 15) < left <= timedelta(seconds=ttr), (key, left)
    q.purge()
    _plant(conn, queue_name)
    popped = {}
    for _ in PLANTED:
        status, answer = command(api, command="pop", topic=queue_name)
        assert status == 200 and answer["success"], answer
        popped[answer["id"]] = answer["value"]
    assert popped == {k: k for k in PLANTED}
    assert command(api, command="pop", topic=queue_name) == (200, _empty())
    assert Client(database).dead_stats(queue_name) == []


def _token_answers(api: httpx.Client, secret: str | None, fields: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """The answer to fields sent with secret as the bearer token (None: no token)."""
    headers = {"authorization": f"Bearer {secret}"} if secret else {}
    r = api.post("/command", json=fields, headers=headers)
    return r.status_code, r.json()


def test_tokens_cannot_probe_ids_or_learn_topics(database: str, tmp_path: Path) -> None:
    secrets = make_tokens(
        tmp_path / "tokens.json",
        {"shop": (["produce"], ["orders"]), "worker": (["consume", "produce"], ["orders"])},
    )
    Queue("secret-payroll", database).offer("salary:1", {"body": "x", "ttr": 60})
    s = serve(database, "--tokens", str(tmp_path / "tokens.json"))
    try:
        with httpx.Client(base_url=s.url, timeout=10) as api:
            for who, cmd, status in [
                (None, "finish", 401),  # no token
                (None, "delete", 401),
                ("worker", "finish", 404),  # a token for another queue: as absent as a missing id
                ("worker", "delete", 404),
                ("shop", "finish", 403),  # a token without the scope
            ]:
                secret = secrets[who] if who else None
                there = _token_answers(api, secret, {"command": cmd, "id": "salary:1"})
                missing = _token_answers(api, secret, {"command": cmd, "id": "salary:404"})
                assert there[0] == missing[0] == status, (who, cmd, there, missing)
                assert there[1] == {**missing[1], "error": missing[1]["error"].replace("salary:404", "salary:1")}
                assert "payroll" not in str(there), there
            assert Queue("secret-payroll", database).get("salary:1") is not None, "nothing deleted"
            sent = Queue("secret-payroll", database).send({"body": "y", "ttr": 60})  # a pop names it by id
            for cmd in ("finish", "delete"):
                there = _token_answers(api, secrets["worker"], {"command": cmd, "id": f"#{sent}@secret-payroll"})
                missing = _token_answers(api, secrets["worker"], {"command": cmd, "id": f"#{sent + 9}@secret-payroll"})
                assert there[0] == missing[0] == 404, (cmd, there, missing)
            assert Queue("secret-payroll", database).get_id(sent) is not None, "nothing deleted"
            for fields in (
                {"command": "add", "topic": "orders", "id": "salary:1"},
                {"command": "pop", "topic": "secret-payroll"},
                {"command": "finish", "id": "salary:1", "topic": "secret-payroll"},
            ):
                status, answer = _token_answers(api, secrets["worker"], fields)
                assert status in (403, 409) and "payroll" not in answer["error"], answer
    finally:
        s.stop()
        Queue("secret-payroll", database).purge()


@pytest.mark.skipif(shutil.which("php") is None, reason="php-cli is not installed (make deps installs it)")
def test_the_php_example(server: Server, database: str) -> None:
    out = subprocess.run(
        ["php", str(ROOT / "examples/classic.php"), server.url, "php_orders"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "finished order_close:2" in out and "finished order_close:1" in out, out
    assert Queue("php_orders", database).stats().ready == 0


def test_the_serve_demo(database: str) -> None:
    demo = Server([sys.executable, str(ROOT / "examples/serve_demo.py")], env={**os.environ, "DATABASE_URL": database})
    try:
        with httpx.Client(base_url=demo.url, timeout=10) as api:
            counts = {s["queue"]: s["ready"] + s["delayed"] + s["leased"] for s in api.get("/v1/stats").json()}
        assert counts["pgdq_demo_orders"] >= 1400 and counts["pgdq_demo_webhooks"] == 80, counts
        assert [(d.queue, d.dead) for d in Client(database).dead_stats("pgdq_demo_orders")] == [("pgdq_demo_orders", 1)]
        assert [s.name for s in Client(database).schedules("pgdq_demo_reports")] == ["nightly-sales"]
    finally:
        demo.stop()


def test_a_popped_message_without_a_key_is_finished_and_nothing_else(
    api: httpx.Client, queue_name: str, q: Queue, database: str
) -> None:
    other = Queue(queue_name + "_2", database)
    other.purge()
    sent = q.send({"n": 1})  # keyless (dq_send): its id stands for it
    assert command(api, command="add", topic=other.name, id=str(sent), delay=3600, body="later")[1]["success"]
    handed = command(api, command="pop", topic=queue_name)[1]["id"]
    assert command(api, command="finish", id=handed) == (200, {**_empty(), "id": handed})
    assert q.get_id(sent) is None, "the popped message is finished"
    assert other.get(str(sent)) is not None, "the other topic's job of the same digits stays"
    assert command(api, command="finish", id=handed)[0] == 404
    status, answer = command(api, command="add", topic=queue_name, id=handed, body=1)
    assert (status, answer["success"]) == (400, False) and "reserved" in answer["error"], "no add may use that form"
    # a key of that form, offered otherwise, is handed out by the message's id too
    q.offer(handed, "keyed")
    taken = command(api, command="pop", topic=queue_name)[1]["id"]
    assert taken != handed and command(api, command="delete", id=taken, topic=queue_name)[1]["success"]
    assert q.get(handed) is None
    other.purge()
