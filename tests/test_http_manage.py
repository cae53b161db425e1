"""pgdq serve's managing routes (dead letters, schedules, channels, pause
and resume, retention and history) over a real server and database."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from http_server import make_tokens, serve, waiting_polls
from pgdq import Queue
from waiting import wait_for


def _bury(q: Queue, *keys: str) -> None:
    q.offer_many([(k, {"k": k}) for k in keys])
    for d in q.poll_many(len(keys)):
        d.dead_letter(f"{d.key} failed")


def test_dead_letters_list_redrive_purge(api: httpx.Client, queue_name: str, q: Queue) -> None:
    base = f"/v1/queues/{queue_name}/dead-letters"
    _bury(q, "a", "b", "c")
    listed = api.get(base, params={"max": 2}).json()
    assert [(d["key"], d["payload"], d["error"], d["attempts"]) for d in listed] == [
        ("a", {"k": "a"}, "a failed", 1),
        ("b", {"k": "b"}, "b failed", 1),
    ]
    assert api.post(base + "/redrive", json={"key": "a", "delay": 3600}).json() == {"redriven": 1}
    assert q.get("a").due_at > q.get("a").created_at  # type: ignore[union-attr]
    assert api.post(base + "/purge", json={"key": "b"}).json() == {"purged": 1}
    overview = {d["queue"]: d["dead"] for d in api.get("/v1/dead-letters").json()}
    assert overview[queue_name] == 1
    r = api.post(base + "/purge", json={})
    assert r.status_code == 400 and '"all": true' in r.json()["error"]
    assert [d.key for d in q.dead_letters()] == ["c"], "nothing purged without key or all"
    assert api.post(base + "/purge", json={"all": True}).json() == {"purged": 1}
    assert api.post(base + "/redrive", json={}).json() == {"redriven": 0}


def test_keyless_messages_are_delivered_and_listed_with_key_null(api: httpx.Client, queue_name: str, q: Queue) -> None:
    first, second = q.send_many([{"n": 1}, {"n": 2}])
    polled = api.post(f"/v1/queues/{queue_name}/poll", json={"max": 1}).json()["deliveries"]
    assert [(d["key"], d["id"], d["payload"]) for d in polled] == [(None, first, {"n": 1})]
    for d in q.poll_many(1):
        d.dead_letter("gave up")
    listed = api.get(f"/v1/queues/{queue_name}/dead-letters").json()
    assert [(d["key"], d["id"], d["error"]) for d in listed] == [(None, second, "gave up")]


def test_schedules(api: httpx.Client, queue_name: str, q: Queue) -> None:
    base = f"/v1/queues/{queue_name}/schedules"
    body = {"expression": "0 2 * * *", "timezone": "Europe/Bucharest", "payload": {"report": "sales"}}
    r = api.put(base + "/nightly", json=body)
    assert r.status_code == 200, r.text
    (listed,) = api.get(base).json()
    assert (listed["name"], listed["payload"], listed["next_at"]) == (
        "nightly",
        {"report": "sales"},
        r.json()["next_at"],
    )
    assert [s.name for s in q.schedules()] == ["nightly"]
    assert api.delete(base + "/nightly").json() == {"done": True}
    assert api.delete(base + "/nightly").status_code == 404
    bad = api.put(base + "/broken", json={"expression": "every tuesday"})
    assert bad.status_code == 400 and bad.json()["sqlstate"] == "22023"
    assert q.schedules() == []


def test_channels(api: httpx.Client, queue_name: str, q: Queue) -> None:
    base = f"/v1/queues/{queue_name}/channels"
    assert api.put(base + "/acme", json={"max_concurrency": 2, "min_interval": 0.5}).json() == {"done": True}
    q.offer("m", 1, channel="acme")
    (c,) = api.get(base).json()
    assert (c["channel"], c["max_concurrency"], c["min_interval"], c["ready"]) == ("acme", 2, 0.5, 1)
    assert api.delete(base + "/acme").json() == {"done": True}
    assert api.delete(base + "/acme").status_code == 404
    assert api.put(base + "/acme", json={"max_concurrency": 0}).status_code == 400
    assert q.channels()[0].max_concurrency is None, "nothing written"


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("post", "/dead-letters/redrive", {"key": "a", "at": "2030-01-01T00:00:00Z", "delay": 5}),
        ("post", "/dead-letters/purge", {"key": "a", "all": True}),
        ("post", "/dead-letters/purge", {"all": "yes"}),
        ("put", "/schedules/x", {"expression": "* * * * *", "max_missed": 0}),
        ("put", "/schedules/x", {"expression": "* * * * *", "timezone": "Mars/Olympus"}),
        ("put", "/channels/x", {"min_interval": -1}),
        ("put", "/channels/x", {"max_concurrency": 1.5}),
    ],
)
def test_bad_input_is_400(
    api: httpx.Client, queue_name: str, q: Queue, method: str, path: str, body: dict[str, Any]
) -> None:
    _bury(q, "a")
    r = api.request(method.upper(), f"/v1/queues/{queue_name}{path}", json=body)
    assert r.status_code == 400, r.text
    assert [d.key for d in q.dead_letters()] == ["a"] and q.schedules() == [] and q.channels() == []


def test_scopes(database: str, tmp_path: Path) -> None:
    secrets = make_tokens(tmp_path / "t.json", {"reader": (["consume"], ["orders"]), "ops": (["admin"], ["orders"])})
    q = Queue("orders", database)
    q.purge_dead_letters()
    _bury(q, "x")
    s = serve(database, "--tokens", str(tmp_path / "t.json"))
    try:
        with httpx.Client(base_url=s.url, timeout=10) as api:
            reader = {"authorization": f"Bearer {secrets['reader']}"}
            ops = {"authorization": f"Bearer {secrets['ops']}"}
            assert api.get("/v1/queues/orders/dead-letters", headers=reader).status_code == 200
            r = api.post("/v1/queues/orders/dead-letters/redrive", json={}, headers=reader)
            assert r.status_code == 403 and "admin" in r.json()["error"]
            assert [d.key for d in q.dead_letters()] == ["x"], "nothing changed"
            assert api.get("/v1/dead-letters", headers=ops).status_code == 403, "admin of one queue is not of all"
            assert api.post("/v1/queues/orders/dead-letters/redrive", json={}, headers=ops).json() == {"redriven": 1}
    finally:
        s.stop()
        q.purge()


def test_pause_and_resume(api: httpx.Client, queue_name: str, q: Queue) -> None:
    base = f"/v1/queues/{queue_name}"
    q.offer("a", 1)
    assert api.post(base + "/pause").json() == {"paused": True, "changed": True}
    assert api.post(base + "/pause").json() == {"paused": True, "changed": False}
    assert api.get(base + "/stats").json()["paused"] is True
    assert api.post(base + "/poll", json={"max": 10}).json() == {"deliveries": []}, "a paused queue leases nothing"
    assert api.post(base + "/resume").json() == {"paused": False, "changed": True}
    assert api.post(base + "/resume").json() == {"paused": False, "changed": False}
    assert api.get(base + "/stats").json()["paused"] is False
    assert [d["key"] for d in api.post(base + "/poll", json={"max": 10}).json()["deliveries"]] == ["a"]


def test_a_long_poll_of_a_paused_queue_wakes_on_resume(api: httpx.Client, queue_name: str, q: Queue) -> None:
    q.offer("a", 1)
    q.pause()
    answers: list[httpx.Response] = []
    waiting = threading.Thread(
        target=lambda: answers.append(api.post(f"/v1/queues/{queue_name}/poll", json={"wait": 30}, timeout=60))
    )
    waiting.start()
    try:
        wait_for(lambda: waiting_polls(api) >= 1, "the long poll to wait")
        assert q.stats().ready == 1, "due, and not leased while paused"
        assert api.post(f"/v1/queues/{queue_name}/resume").json()["changed"] is True
    finally:
        waiting.join(60)
    (answer,) = answers
    assert [d["key"] for d in answer.json()["deliveries"]] == ["a"], "woken by the resume, not by its wait's end"


def test_retention_and_history(api: httpx.Client, queue_name: str, q: Queue) -> None:
    base = f"/v1/queues/{queue_name}"
    assert api.put(base + "/retention", json={"keep": 86400}).json() == {"keep": 86400.0}
    q.offer_many([("a", {"n": 1}), ("b", 2), ("c", 3)])
    deliveries = api.post(base + "/poll", json={"max": 2}).json()["deliveries"]
    by_key = {d["key"]: d["lock_token"] for d in deliveries}
    assert api.post(base + "/ack", json={"lock_tokens": [by_key["a"]]}).json() == {"acked": 1}
    assert (
        api.post(base + "/nack", json={"lock_token": by_key["b"], "error": "boom", "retry_in": 3600}).status_code == 200
    )
    assert api.delete(base + "/messages/c").json() == {"done": True}
    records = api.get(base + "/history").json()
    assert [(r["key"], r["outcome"]) for r in records] == [("c", "cancelled"), ("a", "acked")]
    a = records[1]
    assert (a["payload"], a["attempts"], a["headers"], a["queue"], a["channel"]) == (
        {"n": 1},
        1,
        None,
        queue_name,
        None,
    )
    assert a["last_leased_at"] is not None and records[0]["last_leased_at"] is None, "c was never delivered"
    assert [r["key"] for r in api.get(base + "/history", params={"key": "a"}).json()] == ["a"]
    assert [r["key"] for r in api.get(base + "/history", params={"limit": 1}).json()] == ["c"]
    since = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    buckets = api.get(base + "/history/stats", params={"since": since, "bucket": 86400}).json()
    (bucket,) = buckets
    assert (bucket["acked"], bucket["dead"], bucket["cancelled"]) == (1, 0, 1)
    assert bucket["lateness_p50"] >= 0 and bucket["run_p99"] >= 0, "a was delivered: seconds"
    minutes = api.get(base + "/history/stats").json()  # the last hour by minute
    assert sum(m["acked"] for m in minutes) == 1 and sum(m["cancelled"] for m in minutes) == 1
    assert api.put(base + "/retention", json={"keep": None}).json() == {"keep": None}
    q.offer("d", 4)
    assert api.delete(base + "/messages/d").json() == {"done": True}
    assert len(api.get(base + "/history").json()) == 2, "off: no new record, the old stay"


@pytest.mark.parametrize(
    ("method", "path", "body", "message"),
    [
        ("PUT", "/retention", {"keep": 0}, "keep: Input should be greater than 0"),
        ("PUT", "/retention", {"keep": 3650 * 86400 + 1}, "keep: Input should be less than or equal to 315360000"),
        ("PUT", "/retention", {"keep": "1h"}, "keep: Input should be a valid number"),
        ("PUT", "/retention", {"keep": True}, "keep: Input should be a valid number"),
        ("PUT", "/retention", {}, "keep: Field required"),
        ("PUT", "/retention", {"keep": 60, "period": 60}, "period: Extra inputs are not permitted"),
        ("GET", "/history?limit=0", None, "limit: Input should be greater than or equal to 1"),
        ("GET", "/history?limit=1001", None, "limit: Input should be less than or equal to 1000"),
        ("GET", "/history?key=", None, "key: String should have at least 1 character"),
        ("GET", "/history/stats?since=yesterday", None, "since: Input should be a valid datetime"),
        ("GET", "/history/stats?since=2030-01-01T00:00:00", None, "since: Input should have timezone info"),
        ("GET", "/history/stats?since=2030-01-01T00:00:00Z&bucket=0.5", None, "bucket: Input should be greater"),
        ("GET", "/history/stats?since=2000-01-01T00:00:00Z&bucket=1", None, "must span at most 10000 buckets"),
        ("GET", "/history/stats?since=1990-01-01T00:00:00Z&bucket=86399.5", None, "bucket must be whole seconds"),
    ],
)
def test_history_bad_input_is_400_and_writes_nothing(
    api: httpx.Client, queue_name: str, q: Queue, method: str, path: str, body: Any, message: str
) -> None:
    r = api.request(method, f"/v1/queues/{queue_name}{path}", json=body)
    assert r.status_code == 400 and message in r.json()["error"], r.text
    q.offer("a", 1)
    assert q.cancel("a")
    assert q.history() == [], "retention still off"


def test_history_and_pausing_scopes(database: str, tmp_path: Path, queue_name: str, q: Queue) -> None:
    """Reading the history takes consume; pausing, resuming and retention
    take admin. A token without the scope, or of another queue, gets the
    same answer whether the queue exists or not, and changes nothing."""
    secrets = make_tokens(
        tmp_path / "t.json",
        {
            "reader": (["consume"], []),
            "producer": (["produce"], []),
            "other": (["admin"], ["another-queue"]),
            "ops": (["admin"], []),
        },
    )
    q.retain(3600)
    q.offer("a", 1)
    assert q.cancel("a")
    missing = f"missing-{queue_name}"[:100]
    reads = [("GET", "/history"), ("GET", "/history/stats?since=2030-01-01T00:00:00Z")]
    changes = [("POST", "/pause"), ("POST", "/resume"), ("PUT", "/retention")]
    s = serve(database, "--tokens", str(tmp_path / "t.json"))
    try:
        with httpx.Client(base_url=s.url, timeout=10) as api:
            for who, allowed in (("reader", reads), ("producer", []), ("other", []), (None, [])):
                headers = {"authorization": f"Bearer {secrets[who]}"} if who else {}
                for method, path in reads + changes:
                    body = {"keep": None} if path == "/retention" else None
                    answers = [
                        api.request(method, f"/v1/queues/{name}{path}", json=body, headers=headers)
                        for name in (queue_name, missing)
                    ]
                    statuses = {a.status_code for a in answers}
                    if (method, path) in allowed:
                        assert statuses == {200}, (who, path, answers[0].text)
                        continue
                    assert statuses == {401 if who is None else 403}, (who, path, statuses)
                    texts = [a.text.replace(missing, queue_name) for a in answers]
                    assert texts[0] == texts[1] and queue_name not in texts[0], (who, path, texts)
            ops = {"authorization": f"Bearer {secrets['ops']}"}
            assert api.post(f"/v1/queues/{queue_name}/pause", headers=ops).json()["changed"] is True
    finally:
        s.stop()
    q.offer("b", 2)
    assert q.cancel("b")
    assert [r.key for r in q.history()] == ["b", "a"], "retention still on, history as it was"
    assert q.stats().paused is True and q.resume()
