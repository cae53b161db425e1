"""pgdq serve's managing routes (dead letters, schedules, channels) over a real server and database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from http_server import make_tokens, serve
from pgdq import Queue


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
