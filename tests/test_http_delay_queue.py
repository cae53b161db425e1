"""pgdq serve's delay-queue (ouqiang) dialect: POST /push, /pop, /finish and
/delete over a real server and database."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest
from conftest import ROOT
from http_server import Server, make_tokens, serve, waiting_polls
from pgdq import Queue
from waiting import wait_for

EMPTY = {"code": 0, "message": "ok", "data": None}


def call(api: httpx.Client, path: str, headers: dict[str, str] | None = None, **fields: Any) -> tuple[int, Any]:
    r = api.post(path, json=fields, headers=headers or {})
    return r.status_code, r.json()


def failed(message: str) -> dict[str, Any]:
    return {"code": 1, "message": message, "data": None}


def test_push_pop_finish(api: httpx.Client, queue_name: str, q: Queue) -> None:
    body = '{"uid": 10829378, "created": 1498657365}'
    pushed = call(api, "/push", topic=queue_name, id="15702398321", delay=0, ttr=120, body=body)
    assert pushed == (200, {"code": 0, "message": "added", "data": None})
    assert q.get("15702398321").payload == {"body": body, "ttr": 120}  # type: ignore[union-attr]
    assert call(api, "/pop", topic=queue_name) == (200, {**EMPTY, "data": {"id": "15702398321", "body": body}})
    left = q.get("15702398321").due_at - datetime.now(UTC)  # type: ignore[union-attr]
    assert timedelta(seconds=110) < left <= timedelta(seconds=120), "leased for its ttr"
    assert call(api, "/pop", topic=queue_name, timeout=0) == (200, EMPTY)
    assert call(api, "/finish", id="15702398321") == (200, EMPTY)
    assert q.get("15702398321") is None
    assert call(api, "/finish", id="15702398321") == (200, EMPTY), "as delay-queue: done is done"


def test_a_finished_job_is_recorded_acked_a_deleted_one_cancelled(api: httpx.Client, queue_name: str, q: Queue) -> None:
    """/finish is the job done (history: acked, 1.3; it said cancelled), /delete is not."""
    q.retain(timedelta(days=1))
    for job in ("done", "dropped"):
        assert call(api, "/push", topic=queue_name, id=job, delay=0, ttr=30, body=job)[1]["code"] == 0
    assert call(api, "/pop", topic=queue_name)[1]["data"]["id"] in {"done", "dropped"}
    assert call(api, "/finish", id="done") == (200, EMPTY)
    assert call(api, "/delete", id="dropped") == (200, EMPTY)
    assert {r.key: r.outcome for r in q.history()} == {"done": "acked", "dropped": "cancelled"}


def test_a_finished_keyless_job_is_recorded_acked_a_deleted_one_cancelled(
    api: httpx.Client, queue_name: str, q: Queue
) -> None:
    """/finish of a job popped as "#ID@TOPIC" (sent without a key): history acked
    (dq_finish_id, 1.3; it said cancelled); /delete of one: cancelled."""
    q.retain(timedelta(days=1))
    done, dropped = q.send({"body": "done", "ttr": 30}), q.send({"body": "dropped", "ttr": 30})
    assert call(api, "/pop", topic=queue_name)[1]["data"]["id"] == f"#{done}@{queue_name}"
    assert call(api, "/finish", id=f"#{done}@{queue_name}") == (200, EMPTY)
    assert call(api, "/delete", id=f"#{dropped}@{queue_name}") == (200, EMPTY)
    assert {r.id: r.outcome for r in q.history()} == {done: "acked", dropped: "cancelled"}


def test_delay_and_delete(api: httpx.Client, queue_name: str, q: Queue) -> None:
    assert call(api, "/push", topic=queue_name, id="later", delay=3600, ttr=30, body="x")[1]["code"] == 0
    assert timedelta(seconds=3590) < q.get("later").due_at - datetime.now(UTC)  # type: ignore[union-attr]
    assert call(api, "/pop", topic=queue_name, timeout=0) == (200, EMPTY)
    assert call(api, "/delete", id="later") == (200, EMPTY)
    assert q.get("later") is None
    assert call(api, "/delete", id="later") == (200, EMPTY)


def test_pop_of_several_topics_takes_them_in_order(api: httpx.Client, queue_name: str, database: str) -> None:
    a, b = queue_name + "_a", queue_name + "_b"
    try:
        call(api, "/push", topic=b, id="b1", body="from b")
        assert call(api, "/pop", topic=f"{a},{b}")[1]["data"] == {"id": "b1", "body": "from b"}
        call(api, "/push", topic=b, id="b2", body="from b")
        call(api, "/push", topic=a, id="a1", body="from a")
        assert call(api, "/pop", topic=f"{a}, {b}")[1]["data"]["id"] == "a1", "the first topic first"
        assert call(api, "/pop", topic=f"{a},{b}")[1]["data"]["id"] == "b2"
    finally:
        for topic in (a, b):
            Queue(topic, database).purge()


def test_long_poll_wakes_on_a_push_to_any_topic(api: httpx.Client, queue_name: str, database: str) -> None:
    a, b = queue_name + "_a", queue_name + "_b"
    answer: dict[str, Any] = {}

    def pop() -> None:
        started = time.monotonic()
        answer["got"] = call(api, "/pop", topic=f"{a},{b}")  # the default wait: up to 60 s
        answer["took"] = time.monotonic() - started

    waiting = threading.Thread(target=pop)
    waiting.start()
    try:
        wait_for(lambda: waiting_polls(api) >= 2, "the pop to wait on both topics")
        call(api, "/push", topic=b, id="wake", body="up")
        waiting.join(30)
        assert answer["got"] == (200, {**EMPTY, "data": {"id": "wake", "body": "up"}})
        assert answer["took"] < 30
    finally:
        waiting.join(70)
        Queue(b, database).purge()


def test_pop_ends_empty_after_its_timeout(api: httpx.Client, queue_name: str) -> None:
    started = time.monotonic()
    assert call(api, "/pop", topic=queue_name, timeout=0.5) == (200, EMPTY)
    assert 0.4 < time.monotonic() - started < 10


@pytest.mark.parametrize(
    ("path", "fields", "says"),
    [
        ("/push", {"id": "k"}, "topic: Field required"),
        ("/push", {"topic": "t"}, "id: Field required"),
        ("/push", {"topic": "t", "id": ""}, "id: String should have at least 1 character"),
        ("/push", {"topic": "t", "id": "k", "ttr": 0}, "ttr: Input should be greater than or equal to 1"),
        ("/push", {"topic": "t", "id": "k", "ttr": 1e-7}, "ttr: Input should be greater than or equal to 1"),
        ("/push", {"topic": "t", "id": "k", "ttr": -1}, "ttr: Input should be greater than or equal to 1"),
        ("/push", {"topic": "t", "id": "k", "ttr": 1e300}, "ttr: Input should be less than or equal to 86400"),
        ("/push", {"topic": "t", "id": "k", "ttr": "60"}, "ttr: Input should be a valid number"),
        ("/push", {"topic": "t", "id": "k", "delay": -1}, "delay: Input should be greater than or equal to 0"),
        ("/push", {"topic": "t", "id": "k", "body": {"uid": 1}}, "body: Input should be a valid string"),
        ("/push", {"topic": "t", "id": "k", "TTR": 60}, "TTR: Extra inputs are not permitted"),
        ("/push", {"topic": "t" * 101, "id": "k"}, "topic: String should have at most 100 characters"),
        ("/push", {"topic": "t", "id": "k\u0000"}, "0x00"),
        ("/push", {"topic": "t,u", "id": "k"}, "topic: Value error, a topic of these routes holds no comma"),
        ("/pop", {}, "topic: Field required"),
        ("/pop", {"topic": "t,,u"}, "topic: Value error, each topic, separated by commas, must have 1 to 100"),
        ("/pop", {"topic": ",".join("t" * 21)}, "topic: Value error, at most 20 topics"),
        ("/pop", {"topic": "t", "timeout": 61}, "timeout: Input should be less than or equal to 60"),
        ("/finish", {}, "id: Field required"),
        ("/delete", {"id": ""}, "id: String should have at least 1 character"),
    ],
)
def test_bad_input_fails_in_the_dialects_shape(
    api: httpx.Client, path: str, fields: dict[str, Any], says: str, database: str
) -> None:
    status, answer = call(api, path, **fields)
    assert status == 400 and answer["code"] == 1 and says in answer["message"], answer
    assert set(answer) == {"code", "message", "data"} and answer["data"] is None
    assert Queue("t", database).stats().ready == 0, "nothing written"


def test_malformed_large_and_wrong_method(api: httpx.Client) -> None:
    r = api.post("/push", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["code"] == 1 and "JSON" in r.json()["message"]
    r = api.post("/push", json={"topic": "t", "id": "k", "body": "x" * (1 << 20)})
    assert (r.status_code, r.json()) == (413, failed("the request body is over 1048576 bytes"))
    r = api.get("/pop")
    assert (r.status_code, r.json()) == (405, failed("Method Not Allowed"))


def test_ids_are_unique_across_topics(api: httpx.Client, queue_name: str, q: Queue, database: str) -> None:
    other = queue_name + "_other"
    assert call(api, "/push", topic=queue_name, id="x", body="1")[1]["code"] == 0
    assert call(api, "/push", topic=queue_name, id="x", body="2")[1]["code"] == 0, "same topic: replaced"
    status, answer = call(api, "/push", topic=other, id="x", body="3")
    assert (status, answer) == (409, failed("id 'x' is taken by another topic; ids are unique across topics"))
    assert Queue(other, database).get("x") is None
    assert q.get("x").payload == {"body": "2", "ttr": 60}  # type: ignore[union-attr]


def test_jobs_of_the_classic_protocol_and_bad_envelopes(
    api: httpx.Client, queue_name: str, q: Queue, conn: psycopg.Connection[Any]
) -> None:
    api.post("/command", json={"command": "add", "topic": queue_name, "id": "json", "body": {"uid": 7}})
    assert call(api, "/pop", topic=queue_name)[1]["data"] == {"id": "json", "body": '{"uid": 7}'}, "JSON as text"
    conn.execute("SELECT dq_offer(%s, 'bad', jsonb_build_object('body', 'b', 'ttr', 1e300))", (queue_name,))
    assert call(api, "/pop", topic=queue_name) == (200, {**EMPTY, "data": {"id": "bad", "body": "b"}})
    left = q.get("bad").due_at - datetime.now(UTC)  # type: ignore[union-attr]
    assert timedelta(seconds=45) < left <= timedelta(seconds=60), "leased for the default TTR"


@pytest.fixture(scope="module")
def guarded(database: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, dict[str, str]]]:
    """A server with tokens: a producer and a worker of orders, a token for another queue."""
    path = tmp_path_factory.mktemp("tokens") / "tokens.json"
    secrets = make_tokens(
        path,
        {
            "producer": (["produce"], ["orders"]),
            "worker": (["consume"], ["orders"]),
            "elsewhere": (["produce", "consume"], ["mail"]),
        },
    )
    s = serve(database, "--tokens", str(path))
    yield s, secrets
    s.stop()


def test_tokens_and_scopes(guarded: tuple[Server, dict[str, str]], database: str) -> None:
    server, secrets = guarded

    def as_(who: str) -> dict[str, str]:
        return {"authorization": f"Bearer {secrets[who]}"}

    with httpx.Client(base_url=server.url, timeout=10) as api:
        job = {"topic": "orders", "id": "o1", "ttr": 30, "body": "b"}
        assert call(api, "/push", **job) == (401, failed("a valid bearer token is required"))
        assert call(api, "/push", as_("worker"), **job) == (
            403,
            failed("token 'worker' has no produce scope on this queue"),
        )
        assert call(api, "/push", as_("producer"), **job) == (200, {"code": 0, "message": "added", "data": None})
        assert call(api, "/pop", as_("producer"), topic="orders")[0] == 403
        status, answer = call(api, "/pop", as_("worker"), topic="orders,payroll")
        assert status == 403 and "payroll" not in answer["message"]
        assert call(api, "/pop", as_("worker"), topic="orders")[1]["data"] == {"id": "o1", "body": "b"}
        assert call(api, "/finish", as_("worker"), id="o1") == (200, EMPTY)
        assert Queue("orders", database).get("o1") is None


def test_finish_and_delete_answer_the_same_whether_ids_exist(
    guarded: tuple[Server, dict[str, str]], database: str
) -> None:
    server, secrets = guarded
    Queue("orders", database).offer("o2", {"body": "b", "ttr": 30})
    with httpx.Client(base_url=server.url, timeout=10) as api:
        for who, path, status in [
            (None, "/finish", 401),  # no token
            (None, "/delete", 401),
            ("elsewhere", "/finish", 200),  # a token for another queue: as absent as a missing id
            ("elsewhere", "/delete", 200),
            ("producer", "/finish", 403),  # a token without the scope
            ("worker", "/delete", 403),
        ]:
            headers = {"authorization": f"Bearer {secrets[who]}"} if who else {}
            there, missing = call(api, path, headers, id="o2"), call(api, path, headers, id="o404")
            assert there == missing and there[0] == status, (who, path, there, missing)
            assert "orders" not in str(there)
        assert Queue("orders", database).get("o2") is not None, "nothing deleted"
    Queue("orders", database).purge()


@pytest.mark.skipif(shutil.which("php") is None, reason="php-cli is not installed (make deps installs it)")
def test_the_php_example(server: Server, queue_name: str, database: str) -> None:
    topics = [queue_name + "_order", queue_name + "_mail"]
    out = subprocess.run(
        ["php", str(ROOT / "examples/delay_queue.php"), server.url, *topics],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert "all checks passed" in out, out
    for topic in topics:
        stats = Queue(topic, database).stats()
        assert (stats.ready, stats.delayed, stats.leased) == (0, 0, 0), stats


@pytest.mark.skipif(shutil.which("php") is None, reason="php-cli is not installed (make deps installs it)")
def test_the_php_example_sends_the_token_and_stops_at_a_failure(
    guarded: tuple[Server, dict[str, str]], database: str
) -> None:
    server, secrets = guarded
    try:
        done = subprocess.run(
            ["php", str(ROOT / "examples/delay_queue.php"), server.url, "orders", "mail"],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": os.environ["PATH"], "DELAY_QUEUE_TOKEN": secrets["producer"]},
        )
        assert "pushed orders:1 to orders" in done.stdout, "the token was sent"
        assert done.returncode == 1 and "/push failed (code 1): token 'producer' has no produce scope" in done.stderr
    finally:
        Queue("orders", database).purge()
