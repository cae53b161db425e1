"""`pgdq serve` through a pgdq.shard router over 2 partitions: a long poll
is woken by an offer on its queue's partition (the service listens on every
partition, as it cannot know its queues in advance)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from conftest import DB, dsn, partition_databases, recreate_database, unsharded
from http_server import Server, serve, waiting_polls
from pgdq import Queue, shard
from waiting import wait_for

pytestmark = [
    pytest.mark.skipif(
        not Path("/usr/share/postgresql/15/extension/plproxy.control").exists(),
        reason="Debian postgresql-15-plproxy not installed (make deps installs it)",
    ),
    unsharded("sets up a router of its own"),
]

WAIT = 30  # seconds a poll may wait; woken, it answers long before


@pytest.fixture(scope="module")
def router(database: str) -> str:
    """A router database on the test cluster over 2 partition clusters; its conninfo."""
    partitions = partition_databases(2, f"{DB}_http_part")
    recreate_database(f"{DB}_http_router")
    with psycopg.connect(dsn(f"{DB}_http_router"), autocommit=True) as conn:
        shard.init(conn, partitions)
    return dsn(f"{DB}_http_router")


@pytest.fixture(scope="module")
def routed(router: str) -> Iterator[Server]:
    """`pgdq serve` on the router."""
    s = serve(router)
    yield s
    s.stop()


def one_queue_per_partition(router: str) -> list[str]:
    """A queue name owned by each partition, in the partitions' order."""
    with psycopg.connect(router) as conn:
        rows = conn.execute(
            "SELECT q, dq_shard_number(q) FROM unnest(%s::text[]) AS q", ([f"wake-{n}" for n in range(64)],)
        )
        owned = {number: name for name, number in reversed(rows.fetchall())}
    assert sorted(owned) == [0, 1], "64 names and not one on each partition"
    return [owned[0], owned[1]]


def test_a_long_poll_through_a_router_wakes_on_an_offer_on_each_partition(routed: Server, router: str) -> None:
    names = one_queue_per_partition(router)
    answers: dict[str, tuple[float, Any]] = {}

    def poll(name: str) -> None:
        with httpx.Client(base_url=routed.url, timeout=WAIT + 30) as client:
            started = time.monotonic()
            r = client.post(f"/v1/queues/{name}/poll", json={"wait": WAIT})
            answers[name] = (time.monotonic() - started, r.json())

    pollers = [threading.Thread(target=poll, args=(name,)) for name in names]
    with httpx.Client(base_url=routed.url, timeout=10) as api:
        for poller in pollers:
            poller.start()
        try:
            wait_for(lambda: waiting_polls(api) >= 2, "both polls to wait")
            for name in names:
                with Queue(name, router) as q:
                    q.offer("wake", name)
        finally:
            for poller in pollers:
                poller.join(WAIT + 30)
            for name in names:
                with Queue(name, router) as q:
                    q.purge()
    for name in names:
        took, body = answers[name]
        assert [d["payload"] for d in body["deliveries"]] == [name]
        assert took < WAIT / 2, f"the poll of {name} woke only after {took:.1f} s (its wait: {WAIT} s)"


def test_pause_resume_retention_and_history_through_a_router(routed: Server, router: str) -> None:
    """The managing routes of 1.2 run on each queue's partition; /metrics
    answers without the history metrics, as a router cannot list the queues
    with retention (no dq_queues there)."""
    names = one_queue_per_partition(router)
    with httpx.Client(base_url=routed.url, timeout=10) as api:
        for name in names:
            base = f"/v1/queues/{name}"
            assert api.put(base + "/retention", json={"keep": 3600}).json() == {"keep": 3600.0}
            assert api.post(base + "/messages", json={"key": "a", "payload": 1}).status_code == 200
            assert api.post(base + "/pause").json() == {"paused": True, "changed": True}
            assert api.get(base + "/stats").json()["paused"] is True
            assert api.post(base + "/poll", json={}).json() == {"deliveries": []}
            assert api.post(base + "/resume").json() == {"paused": False, "changed": True}
            (d,) = api.post(base + "/poll", json={}).json()["deliveries"]
            assert api.post(base + "/ack", json={"lock_tokens": [d["lock_token"]]}).json() == {"acked": 1}
            assert [(r["key"], r["outcome"]) for r in api.get(base + "/history").json()] == [("a", "acked")]
            (bucket,) = api.get(base + "/history/stats", params={"bucket": 86400}).json()
            assert bucket["acked"] == 1
            assert api.put(base + "/retention", json={"keep": None}).json() == {"keep": None}
        metrics = api.get("/metrics")
        assert metrics.status_code == 200 and "pgdq_queue_ready" in metrics.text
        assert "pgdq_queue_finished_total" not in metrics.text
