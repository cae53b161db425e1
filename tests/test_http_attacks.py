"""`pgdq serve` attacked as it runs: what a client that chooses its own
request line, headers and body may make the service keep or tell
(each test against a real server)."""

from __future__ import annotations

import html
import json
import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest
from http_server import Server, make_tokens, serve, sign_in, waiting_polls
from pgdq import Queue
from waiting import wait_for

METHODS = {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "other"}


def _method_labels(metrics: str) -> set[str]:
    """The method label values of pgdq_http_requests_total in a /metrics text."""
    labels = set()
    for line in metrics.splitlines():
        if line.startswith("pgdq_http_requests_total{"):
            labels.add(line.split('method="', 1)[1].split('"', 1)[0])
    return labels


def test_made_up_methods_add_no_metric_series(database: str, api: httpx.Client) -> None:
    """Any client may send any method to a route (405 from h11; httptools, the
    default parser, refuses a method HTTP does not define with 400 before any
    route): each one it makes up must not become a series of its own, or it
    grows the server's memory and /metrics without bound; they are counted as
    method "other"."""
    invented = [f"PGDQ-ATTACK-{i}" for i in range(5)]
    for method in invented:
        assert api.request(method, "/v1/stats").status_code == 400
    s = serve(database, "--http", "h11")
    try:
        with httpx.Client(base_url=s.url, timeout=30) as h11:
            for method in invented:
                assert h11.request(method, "/v1/stats").status_code == 405
            labels = _method_labels(h11.get("/metrics").text)
    finally:
        s.stop()
    assert labels <= METHODS, labels - METHODS
    assert "other" in labels


# Every route, refused alike whether what it names exists or not


@pytest.fixture(scope="module")
def guarded(database: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, dict[str, str]]]:
    """A server with tokens: admin (every queue), other (every scope on another queue only),
    expired (admin, expired a second ago); the secrets by name."""
    path = tmp_path_factory.mktemp("tokens") / "tokens.json"
    wanted = {"admin": (["admin"], []), "other": (["admin"], ["another-queue"]), "expired": (["admin"], [])}
    secrets = make_tokens(path, wanted)
    data = json.loads(path.read_text())
    data["tokens"][2]["expires"] = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
    path.write_text(json.dumps(data))
    s = serve(database, "--tokens", str(path))
    yield s, secrets
    s.stop()


def _bodies(lock_token: str) -> dict[tuple[str, str], Any]:
    """A valid body of each route of /v1 that takes one (by method and the path's last segments)."""
    return {
        ("POST", "messages"): {"key": "k", "payload": 1},
        ("POST", "messages/batch"): {"messages": [{"key": "k", "payload": 1}]},
        ("POST", "poll"): {"max": 1},
        ("POST", "ack"): {"lock_tokens": [lock_token]},
        ("POST", "nack"): {"lock_token": lock_token},
        ("POST", "extend"): {"lock_token": lock_token, "lease": 10},
        ("POST", "dead-letters/redrive"): {},
        ("POST", "dead-letters/purge"): {"all": True},
        ("PUT", "schedules/{name}"): {"expression": "0 0 1 1 *", "payload": 1},
        ("PUT", "channels/{channel}"): {"max_concurrency": 1},
        ("PUT", "retention"): {"keep": 60},
    }


DASHBOARD = [
    ("GET", "/queues/{queue}"),
    ("GET", "/dashboard/queues/{queue}"),
    ("POST", "/dashboard/queues/{queue}/dead-letters/redrive"),
    ("POST", "/dashboard/queues/{queue}/dead-letters/purge?all=true"),
    ("POST", "/dashboard/queues/{queue}/dead-letters/by-id/1/redrive"),
    ("POST", "/dashboard/queues/{queue}/dead-letters/by-id/1/purge"),
    # 1.2: browsing, a message's page, its actions, pause and resume
    ("GET", "/queues/{queue}/messages"),
    ("GET", "/queues/{queue}/messages/1"),
    ("POST", "/dashboard/queues/{queue}/messages/1/run-now"),
    ("POST", "/dashboard/queues/{queue}/messages/1/cancel"),
    ("POST", "/dashboard/queues/{queue}/messages/1/redrive"),
    ("POST", "/dashboard/queues/{queue}/pause"),
    ("POST", "/dashboard/queues/{queue}/resume"),
]


def _routes(url: str, lock_token: str) -> list[tuple[str, str, Any]]:
    """(method, path template, body) of every route of /openapi.json and of the dashboard's that names a queue."""
    bodies = _bodies(lock_token)
    routes: list[tuple[str, str, Any]] = [(m, p, None) for m, p in DASHBOARD]
    for path, operations in httpx.get(url + "/openapi.json").json()["paths"].items():
        for method, operation in operations.items() if "{queue}" in path else ():
            tail = path.split("/queues/{queue}/", 1)[-1]
            body = bodies.get((method.upper(), tail))
            assert body is not None or "requestBody" not in operation, f"no body for {method} {path}: add one"
            routes.append((method.upper(), path, body))
    return routes


def _state(s: Server, admin: str, queue: str) -> list[Any]:
    """What the admin token reads of queue: its stats (paused too), message k, dead letters, schedules,
    channels, history."""
    h = {"authorization": f"Bearer {admin}"}
    reads = ["stats", "messages/k", "dead-letters", "schedules", "channels", "history"]
    return [httpx.get(f"{s.url}/v1/queues/{queue}/{r}", headers=h).json() for r in reads]


def test_every_route_refuses_alike_whether_its_queue_exists(
    guarded: tuple[Server, dict[str, str]], queue_name: str, q: Queue, conn: psycopg.Connection[Any]
) -> None:
    """Each route of /openapi.json and of the dashboard, for no token, an expired
    token, a token of another queue (bearer, and as the cookie from the
    dashboard's own page): 401 / 403 (303 to the login form for a page), the
    same answer for a queue holding a message, a lease, a dead letter, a
    schedule, a channel and history as for a queue that does not exist, never
    naming the queue, and nothing of the queue changed (its retention too)."""
    s, secrets = guarded
    q.retain(3600)
    q.offer_many([("k", 1), ("leased", 2), ("dead", 3), ("gone", 4)])
    assert q.cancel("gone")
    leased, dead = q.poll_many(2, lease=600)
    dead.dead_letter("boom")
    q.schedule("s", "0 0 1 1 *", "UTC", 1)
    q.set_channel("c", max_concurrency=1)
    before = _state(s, secrets["admin"], queue_name)
    retention = "SELECT retain FROM dq_queues WHERE queue = %s"
    kept = conn.execute(retention, (queue_name,)).fetchall()
    missing = f"missing-{queue_name}"[:100]
    same_page = {"origin": s.url, "sec-fetch-site": "same-origin"}
    callers: dict[str, dict[str, Any]] = {
        "no token": {},
        "expired": {"headers": {"authorization": f"Bearer {secrets['expired']}"}},
        "other queue": {"headers": {"authorization": f"Bearer {secrets['other']}"}},
        "other queue, cookie": {"headers": same_page, "cookies": {"pgdq_token": sign_in(s.url, secrets["other"])}},
    }
    routes = _routes(s.url, str(leased.lock_token))
    assert len(routes) >= 22, routes
    clients = {who: httpx.Client(base_url=s.url, cookies=how.get("cookies")) for who, how in callers.items()}
    for method, template, body in routes:
        for who, how in callers.items():
            answers = []
            for queue in (queue_name, missing):
                path = template.format(queue=queue, key="k", name="s", channel="c")
                r = clients[who].request(method, path, json=body, headers=how.get("headers"))
                answers.append((r.status_code, r.text.replace(missing, queue_name)))
                # a queue page the caller may not read: 404 as a queue that does not exist
                assert r.status_code in (401, 403, 303, 404), (who, method, path, r.status_code, r.text)
            assert answers[0] == answers[1], (who, method, template, answers)
            assert queue_name not in answers[0][1], (who, method, template, answers[0])
    assert _state(s, secrets["admin"], queue_name) == before
    assert conn.execute(retention, (queue_name,)).fetchall() == kept == [(timedelta(hours=1),)]
    for path in ("/v1/stats", "/v1/dead-letters", "/metrics"):
        for who, how in callers.items():
            r = clients[who].get(path, headers=how.get("headers"))
            assert r.status_code in (401, 403) and queue_name not in r.text, (who, path, r.status_code)
    for client in clients.values():
        client.close()


# The dashboard's pages: no such queue, a bad parameter


def _error_page(r: httpx.Response) -> str:
    """The message of an HTML error page (templates/error.html)."""
    assert r.headers["content-type"].startswith("text/html"), r.text
    return html.unescape(r.text.split('id="error-page"', 1)[1].split("<p>", 1)[1].split("</p>", 1)[0])


def test_a_page_of_no_queue_is_404_as_one_the_caller_may_not_read(
    guarded: tuple[Server, dict[str, str]], queue_name: str, q: Queue
) -> None:
    s, secrets = guarded
    page = {"accept": "text/html,application/xhtml+xml"}
    admin, other = ({**page, "authorization": f"Bearer {secrets[who]}"} for who in ("admin", "other"))
    q.offer("k", 1)
    shown = httpx.get(f"{s.url}/queues/{queue_name}", headers=admin)
    assert shown.status_code == 200 and 'id="pause"' in shown.text
    typo = httpx.get(f"{s.url}/queues/{queue_name}-typo", headers=admin)
    assert typo.status_code == 404 and 'id="pause"' not in typo.text
    assert _error_page(typo).startswith("No such queue")
    hidden = httpx.get(f"{s.url}/queues/{queue_name}", headers=other)
    assert (hidden.status_code, _error_page(hidden)) == (404, _error_page(typo)), "existence does not leak"
    assert queue_name not in hidden.text.replace(f"/queues/{queue_name}", "")
    bad = httpx.get(f"{s.url}/queues/{queue_name}/messages?state=stuck", headers=admin)
    assert bad.status_code == 400 and "state" in _error_page(bad) and "'leased'" in _error_page(bad)
    raw = httpx.get(f"{s.url}/queues/{queue_name}/messages?state=stuck", headers={**admin, "accept": "*/*"})
    assert raw.status_code == 400 and "state" in raw.json()["error"], "API clients keep the JSON answer"
    q.purge()


# The server's log


def test_a_path_cannot_forge_lines_of_the_servers_log(database: str) -> None:
    """A request cancelled because its client left is logged with its path; a
    path may hold %0A (a queue name may), which must not start a line of the
    client's choosing in the log (it is logged percent-encoded, as uvicorn's
    access log does)."""
    s = serve(database)
    try:
        path = "/v1/queues/forged%0AERROR%20pgdq.http:%20forged/poll"
        body = b'{"wait": 30}'
        head = f"POST {path} HTTP/1.1\r\nHost: {s.url[7:]}\r\ncontent-type: application/json\r\n"
        host, port = s.url[7:].split(":")
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(f"{head}content-length: {len(body)}\r\n\r\n".encode() + body)
            with httpx.Client(base_url=s.url) as api:
                wait_for(lambda: waiting_polls(api) == 1, "the long poll to wait")
        gone = 'pgdq_http_requests_total{method="POST",route="/v1/queues/{queue}/poll",status="499"} 1.0'
        wait_for(lambda: gone in httpx.get(f"{s.url}/metrics").text, "the poll counted as its client gone")
    finally:
        s.stop()
    log = s.process.stderr.read() if s.process.stderr else ""
    assert "the client went away" in log, log
    assert not any(line.startswith("ERROR pgdq.http: forged") for line in log.splitlines()), log


# What a browser or a proxy keeps


def test_answers_with_queue_data_are_not_stored(guarded: tuple[Server, dict[str, str]], queue_name: str) -> None:
    """A dashboard page read with the login cookie, or the API read with a
    token, must not be kept by the browser (its back button after Sign out
    on a shared computer) or a proxy: Cache-Control: no-store. The
    dashboard's static files may be kept."""
    s, secrets = guarded
    cookie = {"pgdq_token": sign_in(s.url, secrets["admin"])}
    bearer = {"authorization": f"Bearer {secrets['admin']}"}
    answers = [
        httpx.get(f"{s.url}/", cookies=cookie),
        httpx.get(f"{s.url}/dashboard/queues", cookies=cookie),
        httpx.get(f"{s.url}/dashboard/queues/{queue_name}", cookies=cookie),
        httpx.get(f"{s.url}/v1/stats", headers=bearer),
        httpx.get(f"{s.url}/metrics", headers=bearer),
    ]
    for r in answers:
        assert r.status_code == 200 and r.headers.get("cache-control") == "no-store", (r.url, r.headers)
    static = httpx.get(f"{s.url}/static/dashboard.js")
    assert static.status_code == 200 and "no-store" not in static.headers.get("cache-control", "")
