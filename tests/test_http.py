"""pgdq serve: the JSON API over a real uvicorn server and a real database."""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest
from conftest import JsonText, nested, unsharded
from http_server import Server, free_port, make_tokens, serve, waiting_polls
from pgdq import Queue
from pgdq.http._metrics import HistoryMetrics
from prometheus_client.parser import text_string_to_metric_families
from waiting import wait_for


def test_offer_poll_ack(api: httpx.Client, queue_name: str, q: Queue) -> None:
    r = api.post(f"/v1/queues/{queue_name}/messages", json={"key": "a", "payload": {"n": 1}})
    assert r.status_code == 200, r.text
    assert r.json() == {"key": "a", "outcome": "created"}
    again = api.post(f"/v1/queues/{queue_name}/messages", json={"key": "a", "payload": {"n": 1}, "can_update": False})
    assert again.json()["outcome"] == "ignored"
    r = api.post(f"/v1/queues/{queue_name}/poll", json={"max": 10, "lease": 30})
    assert r.status_code == 200, r.text
    (d,) = r.json()["deliveries"]
    assert (d["key"], d["payload"], d["attempts"], d["channel"], d["priority"]) == ("a", {"n": 1}, 1, None, 0)
    assert q.get("a").leased  # type: ignore[union-attr]
    r = api.post(f"/v1/queues/{queue_name}/ack", json={"lock_tokens": [d["lock_token"]]})
    assert r.json() == {"acked": 1}
    assert q.get("a") is None
    stale = api.post(f"/v1/queues/{queue_name}/ack", json={"lock_tokens": [d["lock_token"]]})
    assert stale.status_code == 409 and "stale" in stale.json()["error"]


def test_batch_delay_nack_extend_get_cancel(api: httpx.Client, queue_name: str, q: Queue) -> None:
    base = f"/v1/queues/{queue_name}"
    batch = [
        {"key": "now", "payload": 1},
        {"key": "later", "payload": 2, "delay": 3600},
        {"key": "at", "payload": 3, "at": "2999-01-01T00:00:00Z", "channel": "c", "priority": 5},
    ]
    r = api.post(base + "/messages/batch", json={"messages": batch})
    assert [x["outcome"] for x in r.json()["results"]] == ["created"] * 3, r.text
    assert q.get("later").due_at > q.get("now").due_at  # type: ignore[union-attr]
    got = api.get(base + "/messages/at").json()
    assert (got["channel"], got["priority"], got["scheduled_at"][:4]) == ("c", 5, "2999")
    (d,) = api.post(base + "/poll", json={"max": 5}).json()["deliveries"]
    assert d["key"] == "now"
    extended = api.post(base + "/extend", json={"lock_token": d["lock_token"], "lease": 600})
    assert extended.status_code == 200 and extended.json()["lease_until"] > d["lease_until"]
    r = api.post(base + "/nack", json={"lock_token": d["lock_token"], "retry_in": 0, "state": {"try": 1}, "error": "x"})
    assert r.json() == {"done": True}
    assert api.post(base + "/nack", json={"lock_token": d["lock_token"]}).status_code == 409
    assert q.get("now").state == {"try": 1}  # type: ignore[union-attr]
    assert api.delete(base + "/messages/later").json() == {"done": True}
    assert api.delete(base + "/messages/later").status_code == 404
    assert api.get(base + "/messages/later").status_code == 404
    stats = api.get(base + "/stats").json()
    assert (stats["ready"], stats["delayed"]) == (1, 1)


@pytest.mark.parametrize(
    ("path", "body", "says"),
    [
        ("/messages", {"payload": 1}, "key: Field required"),
        ("/messages", {"key": "k", "payload": 1, "delay": -1}, "delay"),
        ("/messages", {"key": "k", "payload": 1, "at": "2030-01-01T00:00:00"}, "at: Input should have timezone"),
        ("/messages", {"key": "k", "payload": 1, "delay": 1, "at": "2030-01-01T00:00:00Z"}, "not both"),
        ("/messages", {"key": "k", "payload": 1, "at": "9999-12-31T23:00:00-05:00"}, "years 1 and 9999 in UTC"),
        ("/messages", {"key": "k", "payload": 1, "surprise": 1}, "surprise: Extra inputs"),
        ("/messages", {"key": "", "payload": 1}, "key"),  # the SQL's 22023
        ("/messages/batch", {"messages": [{"key": "k", "payload": 1}, {"key": "", "payload": 2}]}, "key"),
        ("/poll", {"max": 0}, "max"),
        ("/poll", {"max": 1001}, "max: Input should be less than or equal to 1000"),
        ("/poll", {"wait": 61}, "wait: Input should be less than or equal to 60"),
        ("/messages", {"key": "k\u0000", "payload": 1}, "0x00"),  # PostgreSQL's own 22021
        ("/ack", {"lock_tokens": ["not-a-uuid"]}, "lock_tokens.0"),
    ],
)
def test_bad_input_is_400_and_writes_nothing(
    api: httpx.Client, queue_name: str, q: Queue, path: str, body: dict[str, Any], says: str
) -> None:
    r = api.post(f"/v1/queues/{queue_name}{path}", json=body)
    assert r.status_code == 400, r.text
    assert says in r.json()["error"]
    assert q.stats().ready + q.stats().delayed == 0


def test_malformed_json_and_large_bodies(api: httpx.Client, queue_name: str) -> None:
    r = api.post(
        f"/v1/queues/{queue_name}/messages", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and "JSON" in r.json()["error"]
    big = {"key": "k", "payload": "x" * (1 << 20)}
    r = api.post(f"/v1/queues/{queue_name}/messages", json=big)
    assert r.status_code == 413 and "over 1048576 bytes" in r.json()["error"]


def test_a_body_that_is_not_json_says_why_and_where(api: httpx.Client, queue_name: str, q: Queue) -> None:
    url = f"/v1/queues/{queue_name}/messages"
    r = api.post(url, content=b'{"key": "k",\n "payload": }', headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"] == (
        "the body is not valid JSON: Expecting value at line 2 column 13"
    ), r.text
    for headers in ({"content-type": "application/x-www-form-urlencoded"}, {}):
        r = api.post(url, content=b"key=k&payload=1", headers=headers)
        assert r.status_code == 400 and "`content-type: application/json`" in r.json()["error"], r.text
    assert "had content-type: application/x-www-form-urlencoded" in api.post(url, data={"key": "k"}).json()["error"]
    assert q.stats().ready == 0


def test_the_dashboard_counts_one_dead_letter_as_one(api: httpx.Client, queue_name: str, q: Queue) -> None:
    q.offer("k", 1)
    (d,) = q.poll_many(1)
    d.dead_letter("broke")
    page = api.get(f"/dashboard/queues/{queue_name}")
    assert page.status_code == 200 and f"Offer the dead letter of {queue_name} again?" in page.text, page.text


def test_a_poll_dead_letters_what_it_cannot_answer_and_delivers_the_rest(
    api: httpx.Client, server: Server, queue_name: str, q: Queue, database: str
) -> None:
    q.offer("deep", nested(255))  # through Python: no limit; pydantic answers 254 levels at most
    with Queue(queue_name, database, codec=JsonText()) as raw:
        raw.offer("huge", '{"n": 1e5000}')  # 5001 digits: more than Python's int() reads
    q.offer("fine", {"n": 1})
    r = api.post(f"/v1/queues/{queue_name}/poll", json={"max": 10})
    assert r.status_code == 200, r.text
    assert [d["key"] for d in r.json()["deliveries"]] == ["fine"]
    dead = api.get(f"/v1/queues/{queue_name}/dead-letters")
    assert dead.status_code == 200, dead.text
    errors = {d["key"]: d["error"] for d in dead.json()}
    assert "more than 200 levels deep" in errors["deep"] and "4300 digits" in errors["huge"]
    assert {d["key"]: d["payload"][:8] for d in dead.json()} == {"deep": '{"x": {"', "huge": '{"n": 10'}, "as text"
    assert api.post(f"/v1/queues/{queue_name}/poll", json={"max": 10}).json() == {"deliveries": []}
    for page in ("", "/messages", f"/messages/{next(iter(dead.json()))['id']}"):  # the dashboard lists them too
        assert httpx.get(f"{server.url}/queues/{queue_name}{page}").status_code == 200, page
    q.redrive()
    assert api.get(f"/v1/queues/{queue_name}/messages/huge").json()["payload"].startswith('{"n": 1000')
    r = api.get(f"/queues/{queue_name}/messages")
    assert r.status_code == 200 and "10000000000" in r.text, "the dashboard lists it, as text"


def test_a_poll_that_dead_letters_its_whole_batch_delivers_the_next_due(
    api: httpx.Client, queue_name: str, q: Queue, database: str
) -> None:
    """A poll of max 1 without wait whose message is dead-lettered (unanswerable)
    answers the next due message, not an empty list while one is due."""
    q.offer("deep", nested(255))
    with Queue(queue_name, database, codec=JsonText()) as raw:
        raw.offer("huge", '{"n": 1e5000}')
    q.offer("fine", {"n": 1})
    r = api.post(f"/v1/queues/{queue_name}/poll", json={"max": 1, "wait": 0})
    assert r.status_code == 200 and [d["key"] for d in r.json()["deliveries"]] == ["fine"], r.text
    assert sorted(d.key for d in q.dead_letters()) == ["deep", "huge"]


def test_an_offer_too_deep_to_hand_out_is_refused(api: httpx.Client, queue_name: str, q: Queue) -> None:
    url = f"/v1/queues/{queue_name}/messages"
    assert api.post(url, json={"key": "ok", "payload": nested(200)}).status_code == 200
    r = api.post(url, json={"key": "deep", "payload": nested(201)})
    assert r.status_code == 400 and "payload: " in r.json()["error"], r.text
    assert "more than 200 levels deep" in r.json()["error"] and q.get("deep") is None
    (d,) = api.post(f"/v1/queues/{queue_name}/poll", json={}).json()["deliveries"]
    r = api.post(f"/v1/queues/{queue_name}/nack", json={"lock_token": d["lock_token"], "state": nested(201)})
    assert r.status_code == 400 and "state: " in r.json()["error"], r.text


# seconds a long poll may wait: woken, it answers long before (a busy
# machine's wake-up takes seconds, not half of this)
LONG_WAIT = 40


def test_long_poll_wakes_on_an_offer_and_holds_no_connection(
    api: httpx.Client, queue_name: str, q: Queue, database: str
) -> None:
    answer: dict[str, Any] = {}

    def wait() -> None:
        started = time.monotonic()
        answer["r"] = api.post(f"/v1/queues/{queue_name}/poll", json={"wait": LONG_WAIT}, timeout=LONG_WAIT + 30)
        answer["took"] = time.monotonic() - started

    waiting = threading.Thread(target=wait)
    waiting.start()
    wait_for(lambda: waiting_polls(api) == 1, "the poll to wait")
    with psycopg.connect(database, autocommit=True) as c:
        active = c.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND state = 'active' AND pid <> pg_backend_pid()"
        ).fetchone()
    assert active == (0,)  # waiting, the request runs no statement (LISTEN is idle)
    q.offer("wake", {"hello": 1})
    waiting.join(LONG_WAIT + 30)
    assert answer["took"] < LONG_WAIT / 2, f"woken by the offer, not at the end of its wait: {answer}"
    assert [d["key"] for d in answer["r"].json()["deliveries"]] == ["wake"]


def test_long_poll_sleeps_until_the_next_due_time(api: httpx.Client, queue_name: str, q: Queue) -> None:
    from datetime import UTC, datetime, timedelta

    due = datetime.now(UTC) + timedelta(seconds=1.5)
    q.offer("soon", 1, due)  # notifies now, due later
    started = time.monotonic()
    r = api.post(f"/v1/queues/{queue_name}/poll", json={"wait": LONG_WAIT}, timeout=LONG_WAIT + 30)
    took = time.monotonic() - started
    assert [d["key"] for d in r.json()["deliveries"]] == ["soon"]
    assert datetime.now(UTC) >= due, "not before its due time"
    assert took < LONG_WAIT / 2, f"woken at the due time, not at the end of its wait: {took}"


def test_long_poll_ends_empty_after_wait(api: httpx.Client, queue_name: str) -> None:
    started = time.monotonic()
    r = api.post(f"/v1/queues/{queue_name}/poll", json={"wait": 1})
    assert r.json() == {"deliveries": []}
    assert 0.9 < time.monotonic() - started < 5


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A tokens file with a producer of one queue and an admin; the secrets."""
    path = tmp_path_factory.mktemp("tokens") / "tokens.json"
    wanted = {"shop": (["produce"], ["orders"]), "ops": (["admin"], []), "picker": (["consume"], ["picking"])}
    made = make_tokens(path, wanted)
    assert made["shop"] not in path.read_text()  # only digests are kept
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    return {"path": path, **made}


@pytest.fixture(scope="module")
def guarded(database: str, tokens: dict[str, Any]) -> Iterator[Server]:
    s = serve(database, "--tokens", str(tokens["path"]))
    yield s
    s.stop()


def test_tokens_scopes_and_queues(guarded: Server, tokens: dict[str, Any], database: str) -> None:
    offer = {"key": "k", "payload": 1}
    with httpx.Client(base_url=guarded.url) as client:

        def as_(who: str | None) -> dict[str, str]:
            return {"authorization": f"Bearer {tokens[who]}"} if who else {}

        r = client.post("/v1/queues/orders/messages", json=offer)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert (
            client.post("/v1/queues/orders/messages", json=offer, headers={"authorization": "Bearer nope"}).status_code
            == 401
        )
        r = client.post("/v1/queues/mail/messages", json=offer, headers=as_("shop"))
        assert r.status_code == 403 and r.json()["error"] == "token 'shop' has no produce scope on this queue"
        assert client.post("/v1/queues/orders/poll", json={}, headers=as_("shop")).status_code == 403
        assert client.get("/v1/stats", headers=as_("shop")).status_code == 403
        assert client.post("/v1/queues/orders/messages", json=offer, headers=as_("shop")).status_code == 200
        assert client.post("/v1/queues/orders/poll", json={}, headers=as_("ops")).status_code == 200
        every = client.get("/v1/stats", headers=as_("ops"))
        assert every.status_code == 200, every.text
    with psycopg.connect(database, autocommit=True) as c:
        c.execute("SELECT dq_purge('orders')")


def test_a_consume_token_cannot_ack_nack_or_extend_another_queues_lease(
    guarded: Server, tokens: dict[str, Any], database: str
) -> None:
    """Security finding 4: a token for queue picking, given a lock token leased
    from queue billing, gets the stale answer (409, as for an unknown token)
    and billing's message stays leased as it was."""
    headers = {"authorization": f"Bearer {tokens['picker']}"}
    with Queue("billing", database) as billing, Queue("picking", database) as picking:
        billing.purge()
        picking.purge()
        billing.offer("invoice", {"n": 1})
        leased = billing.poll(lease=600)
        assert leased is not None
        picking.offer("pick", {"n": 2})
        own = picking.poll(lease=600)
        assert own is not None
        token = str(leased.lock_token)
        with httpx.Client(base_url=guarded.url, headers=headers) as client:
            base = "/v1/queues/picking"
            answers = [
                client.post(base + "/ack", json={"lock_tokens": [token]}),
                client.post(base + "/nack", json={"lock_token": token, "retry_in": 0, "error": "x"}),
                client.post(base + "/extend", json={"lock_token": token, "lease": 1}),
            ]
            assert [r.status_code for r in answers] == [409, 409, 409], [r.text for r in answers]
            assert all("stale" in r.json()["error"] for r in answers)
            mixed = client.post(base + "/ack", json={"lock_tokens": [token, str(own.lock_token)]})
            assert mixed.status_code == 409 and "stale lock tokens: 1; 1 acked" in mixed.json()["error"]
        info = billing.get("invoice")
        assert info is not None and info.leased and info.attempts == 1 and info.due_at == leased.lease_until
        assert info.state is None and picking.get("pick") is None
        assert billing.ack(leased.lock_token), "the token is still billing's current one"


def test_serve_refuses_other_hosts_without_tokens(database: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pgdq", "serve", "--dsn", database, "--host", "0.0.0.0"],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert "refusing to serve on 0.0.0.0 without --tokens" in done.stderr


def test_database_down_is_503() -> None:
    """pgdq.http:app under plain uvicorn, configured from the environment, its database not there."""
    nowhere = f"host=127.0.0.1 port={free_port()} dbname=x connect_timeout=1"
    s = Server([sys.executable, "-m", "uvicorn", "pgdq.http:app"], env={**os.environ, "PGDQ_DSN": nowhere})
    try:
        r = httpx.post(s.url + "/v1/queues/q/messages", json={"key": "k", "payload": 1}, timeout=30)
        assert r.status_code == 503 and r.headers["retry-after"] == "5", r.text
        assert "unavailable" in r.json()["error"]
    finally:
        s.stop()


def test_metrics(api: httpx.Client, queue_name: str, q: Queue, database: str) -> None:
    later = datetime.now(UTC) + timedelta(hours=1)
    q.offer_many([("a", 1), ("b", 2), ("c", 3), ("d", 4), ("later", 5, later), ("later2", 6, later)])
    assert api.post(f"/v1/queues/{queue_name}/poll", json={"max": 1}).status_code == 200
    for d in q.poll_many(2):
        d.dead_letter("broken")
    only_dead = Queue(queue_name + "_only_dead", database)
    only_dead.offer("x", 1)
    only_dead.poll_many(1)[0].dead_letter("broken")
    r = api.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    samples = {
        (s.name, s.labels.get("queue"), s.labels.get("route"), s.labels.get("status")): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }
    stats = q.stats()
    assert samples[("pgdq_queue_ready", queue_name, None, None)] == stats.ready == 1
    assert samples[("pgdq_queue_dead_letters", queue_name, None, None)] == 2
    assert samples[("pgdq_queue_dead_letters", queue_name + "_only_dead", None, None)] == 1, (
        "a queue of dead letters only"
    )
    assert samples[("pgdq_queue_leased", queue_name, None, None)] == stats.leased == 1
    assert samples[("pgdq_queue_delayed", queue_name, None, None)] == stats.delayed == 2
    assert samples[("pgdq_queue_next_due_timestamp_seconds", queue_name, None, None)] == stats.next_due_at.timestamp()  # type: ignore[union-attr]
    assert samples[("pgdq_queue_oldest_ready_age_seconds", queue_name, None, None)] >= 0
    assert samples[("pgdq_http_requests_total", None, "/v1/queues/{queue}/poll", "200")] >= 1


def metric_samples(text: str, queue: str) -> dict[tuple[str, str | None], float]:
    """The samples of queue in a /metrics text, by name and outcome or bucket bound (le)."""
    return {
        (s.name, s.labels.get("outcome") or s.labels.get("le")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.labels.get("queue") == queue
    }


def finished(api: httpx.Client, queue: str) -> dict[str, float]:
    """pgdq_queue_finished_total of queue in the server's /metrics, by outcome."""
    samples = metric_samples(api.get("/metrics").text, queue)
    return {outcome or "": v for (name, outcome), v in samples.items() if name == "pgdq_queue_finished_total"}


def test_metrics_count_the_finished_messages_of_queues_with_retention(
    api: httpx.Client, queue_name: str, q: Queue, database: str
) -> None:
    other = Queue(queue_name + "_kept_not", database)
    other.offer("x", 1)
    assert other.cancel("x")
    q.retain(3600)
    assert finished(api, queue_name) == {"acked": 0, "dead": 0, "cancelled": 0}, "counting begins"
    q.offer_many([("a", 1), ("b", 2), ("c", 3), ("d", 4)])
    a, b, c = q.poll_many(3)
    a.ack()
    b.dead_letter("broke")
    assert q.cancel("d")
    assert finished(api, queue_name) == {"acked": 1, "dead": 1, "cancelled": 1}
    c.ack()
    assert finished(api, queue_name) == {"acked": 2, "dead": 1, "cancelled": 1}
    assert finished(api, other.name) == {}, "no retention, no counts"
    q.offer("e", 5)
    q.pause()
    samples = metric_samples(api.get("/metrics").text, queue_name)
    assert samples[("pgdq_queue_paused", None)] == 1
    q.resume()
    assert metric_samples(api.get("/metrics").text, queue_name)[("pgdq_queue_paused", None)] == 0


@unsharded("the history metrics list the queues with retention from dq_queues, on the partitions")
async def test_history_metrics_read_every_queue_in_one_call(database: str, queue_name: str) -> None:
    """A scrape reads the history of every queue with retention in one call
    of dq_history_minutes (1.3: a call of dq_history_stats and one of
    dq_history_bins per queue, 8 s of a scrape of 5,000 queues), and writes
    each queue's counts and histograms."""
    names = [f"{queue_name}_{i}" for i in range(12)]
    # the clock pinned within one minute in the past, so that the first scrape's minute holds the acks
    minute = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=5)
    set_clock = "SELECT set_config('dq.now', %s, false)"
    with psycopg.connect(database, autocommit=True) as writer:
        writer.execute(set_clock, ((minute + timedelta(seconds=10)).isoformat(),))
        for name in names:
            with Queue(name, writer) as q:
                q.retain(timedelta(hours=1))
                q.offer("a", 1)
                delivery = q.poll()
                assert delivery is not None
                delivery.ack()
    collector = HistoryMetrics()
    async with await psycopg.AsyncConnection.connect(database) as conn:  # one transaction: its function calls
        await conn.execute("SET LOCAL track_functions = 'pl'")
        await conn.execute(set_clock, ((minute + timedelta(seconds=30)).isoformat(),))
        text = (await collector.text(conn, None)).decode()
        cursor = await conn.execute(
            "SELECT p.proname, s.calls FROM pg_stat_xact_user_functions AS s JOIN pg_proc AS p ON p.oid = s.funcid"
            " WHERE p.proname IN ('dq_history_minutes', 'dq_history_stats', 'dq_history_bins')"
        )
        assert dict(await cursor.fetchall()) == {"dq_history_minutes": 1}
    for name in names:
        samples = metric_samples(text, name)
        assert samples[("pgdq_queue_finished_total", "acked")] == 1
        assert samples[("pgdq_queue_lateness_seconds_count", None)] == 1
        assert samples[("pgdq_queue_run_seconds_count", None)] == 1


@unsharded("the history metrics list the queues with retention from dq_queues, on the partitions")
async def test_history_metrics_never_go_down_and_give_lateness_and_run_time_histograms(
    database: str, queue_name: str
) -> None:
    """HistoryMetrics on the database's clock (dq.now): counts by outcome, and
    histograms of lateness and run time, since the first scrape's minute,
    that stay as the records age out."""
    # in the past throughout: history's clock is never ahead of the server's (1.3)
    start = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=30)

    set_clock = "SELECT set_config('dq.now', %s, false)"

    def at(seconds: float) -> tuple[str]:
        """The clock's setting seconds after start."""
        return ((start + timedelta(seconds=seconds)).isoformat(),)

    with psycopg.connect(database, autocommit=True) as writer, Queue(queue_name, writer) as q:
        q.retain(timedelta(minutes=15))
        writer.execute(set_clock, at(10))
        q.offer_many([("a", 1), ("b", 2)])
        writer.execute(set_clock, at(12))
        a, b = q.poll_many(2)
        writer.execute(set_clock, at(15))
        a.ack()
        b.dead_letter("broke")
        collector = HistoryMetrics()
        async with (
            await psycopg.AsyncConnection.connect(database, autocommit=True) as reader,
            await psycopg.AsyncConnection.connect(database, autocommit=True) as another,
        ):

            async def scrape(seconds: float, conn: psycopg.AsyncConnection[Any] = reader) -> dict[Any, float]:
                await conn.execute(set_clock, at(seconds))
                return metric_samples((await collector.text(conn, None)).decode(), queue_name)

            def counts(samples: dict[tuple[str, str | None], float]) -> list[float]:
                return [samples[("pgdq_queue_finished_total", o)] for o in ("acked", "dead", "cancelled")]

            def histogram(samples: dict[tuple[str, str | None], float], name: str) -> dict[float, float]:
                """name's cumulative buckets by bound, checked against its _count; +Inf is float("inf")."""
                buckets = {float(le): v for (n, le), v in samples.items() if n == name + "_bucket" and le}
                assert list(buckets) == sorted(buckets) and list(buckets.values()) == sorted(buckets.values())
                assert buckets[math.inf] == samples[(name + "_count", None)]
                return buckets

            def landed(buckets: dict[float, float]) -> dict[float, float]:
                """The buckets that a count first reaches: bound -> records up to it."""
                before = 0.0
                firsts = {}
                for bound, count in buckets.items():
                    if count > before:
                        firsts[bound] = count
                    before = count
                return firsts

            first = await scrape(30)  # a and b: late 2 s (a bin to 2.048 s), run 3 s (a bin to 3.3 s)
            assert counts(first) == [1, 1, 0]
            assert landed(histogram(first, "pgdq_queue_lateness_seconds")) == {2.5: 2}
            assert landed(histogram(first, "pgdq_queue_run_seconds")) == {5: 2}
            assert first[("pgdq_queue_lateness_seconds_sum", None)] == pytest.approx(4, rel=0.05)
            assert first[("pgdq_queue_run_seconds_sum", None)] == pytest.approx(6, rel=0.05)
            second = await scrape(70)
            assert counts(second) == [1, 1, 0]
            assert histogram(second, "pgdq_queue_run_seconds") == histogram(first, "pgdq_queue_run_seconds")
            writer.execute(set_clock, at(75))
            q.offer("c", 3)
            assert q.cancel("c")
            # two Prometheus servers at once: both read the first minute, the first answer closes it
            third, twin = await asyncio.gather(scrape(150), scrape(150, another))
            assert counts(third) == counts(twin) == [1, 1, 1], "the minute one closed is not counted twice"
            assert third[("pgdq_queue_run_seconds_count", None)] == twin[("pgdq_queue_run_seconds_count", None)] == 2
            aged = await scrape(20 * 60)  # every record past the queue's 15 minutes
            assert counts(aged) == [1, 1, 1], "counters never go down"
            assert landed(histogram(aged, "pgdq_queue_run_seconds")) == {5: 2}, "nor do histograms"
            left = await (await reader.execute("SELECT count(*) FROM dq_history(%s)", (queue_name,))).fetchone()
            assert left == (0,), "the records aged out"
            for seconds, key in ((20 * 60 + 5, "d"), (20 * 60 + 40, "e")):
                writer.execute(set_clock, at(seconds))
                q.offer(key, 4)
                assert q.cancel(key)
            writer.execute(set_clock, at(20 * 60 + 44))
            q.offer("f", 6)
            writer.execute(set_clock, at(20 * 60 + 45))
            f = q.poll()
            assert f is not None
            writer.execute(set_clock, at(20 * 60 + 45.2))
            f.ack()  # late 1 s (a bin to 1.05 s), run 0.2 s (a bin to 0.207 s)
            later = await scrape(20 * 60 + 50)
            assert counts(later) == [2, 1, 3]
            assert landed(histogram(later, "pgdq_queue_lateness_seconds")) == {2.5: 3}
            assert landed(histogram(later, "pgdq_queue_run_seconds")) == {0.25: 1, 5: 3}
            q.retain(timedelta(seconds=30))
            last = await scrape(20 * 60 + 70)
            assert counts(last) == [2, 1, 3], "d aged out of a minute still open"
            assert landed(histogram(last, "pgdq_queue_run_seconds")) == {0.25: 1, 5: 3}
