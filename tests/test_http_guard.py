"""What a browser can do to `pgdq serve` (docs/security.md, "The HTTP
service and browsers"), against real servers: a cross-site form POST to the
dashboard's actions (CSRF) with and without tokens, a Host that is not the
served address (DNS rebinding), the headers keeping pages out of frames,
tokens that expire, and the logout. What was done is checked in SQL."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from conftest import owner
from http_server import Server, make_tokens, serve, sign_in
from pgdq import Queue

EVIL = {"origin": "http://evil.example"}
CROSS_SITE = {"sec-fetch-site": "cross-site"}
SAME_SITE = {"sec-fetch-site": "same-site", "origin": "http://127.0.0.1:1"}  # another port of the same host
FORM = {"content-type": "application/x-www-form-urlencoded"}


def dead_keys(database: str, queue: str) -> list[str]:
    """The keys of queue's dead letters, read in SQL."""
    with psycopg.connect(owner(database, queue), autocommit=True) as c:
        rows = c.execute("SELECT key FROM dq_dead_letters WHERE queue = %s ORDER BY key", (queue,)).fetchall()
    return [r[0] for r in rows]


def make_dead(q: Queue, *keys: str) -> None:
    """One dead letter per key."""
    q.offer_many([(k, 1) for k in keys])
    for d in q.poll_many(len(keys)):
        d.dead_letter("boom")


def pgdq(*args: str) -> subprocess.CompletedProcess[str]:
    """`pgdq args`, its output captured (the caller checks its exit status)."""
    return subprocess.run(
        [sys.executable, "-m", "pgdq", *args], check=False, capture_output=True, text=True, timeout=60
    )


def same_origin(server: Server) -> dict[str, str]:
    """What a browser sends with a form of the dashboard's own page."""
    return {"origin": server.url, "sec-fetch-site": "same-origin"}


CSRF = "c" * 43  # a page's CSRF token: the X-CSRF-Token header must equal the pgdq_csrf cookie


def page_headers(server: Server, token: str | None = None) -> dict[str, str]:
    """What the dashboard's own page sends with an action: same origin, its
    CSRF cookie and header, and the sign-in cookie when given a token."""
    cookie = f"pgdq_csrf={CSRF}" + (f"; pgdq_token={sign_in(server.url, token)}" if token else "")
    return {**same_origin(server), "x-csrf-token": CSRF, "cookie": cookie}


@pytest.fixture(scope="module")
def secured(database: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, dict[str, str]]]:
    """A server with tokens (admin, reader), and its secrets by name."""
    path = tmp_path_factory.mktemp("tokens") / "tokens.json"
    secrets = make_tokens(path, {"admin": (["admin"], []), "reader": (["consume"], [])})
    s = serve(database, "--tokens", str(path))
    yield s, secrets
    s.stop()


# CSRF


@pytest.mark.parametrize("headers", [EVIL, CROSS_SITE, SAME_SITE, {"origin": "null"}], ids=str)
def test_cross_site_form_posts_refused_without_tokens(
    server: Server, q: Queue, database: str, headers: dict[str, str]
) -> None:
    make_dead(q, "a", "b")
    base = f"{server.url}/dashboard/queues/{q.name}/dead-letters"
    for action in ("purge?all=true", "redrive", "purge?key=a"):
        r = httpx.post(f"{base}/{action}", headers={**FORM, **headers}, content=b"")
        assert r.status_code == 403, (action, r.text)
        assert "another site or origin" in r.json()["error"]
    assert dead_keys(database, q.name) == ["a", "b"], "nothing purged, nothing redriven"
    r = httpx.post(f"{server.url}/v1/queues/{q.name}/messages", headers=headers, json={"key": "k", "payload": 1})
    assert r.status_code == 403 and q.get("k") is None, "the JSON API too"


def test_same_origin_and_scripts_still_work_without_tokens(server: Server, q: Queue, database: str) -> None:
    make_dead(q, "a", "b")
    base = f"{server.url}/dashboard/queues/{q.name}/dead-letters"
    r = httpx.post(f"{base}/purge?key=a", headers={**FORM, **same_origin(server)})
    assert r.status_code == 403 and "CSRF" in r.text, "the page's CSRF token is missing"
    assert httpx.post(f"{base}/purge?key=a", headers={**FORM, **page_headers(server)}).status_code == 200
    assert dead_keys(database, q.name) == ["b"]
    assert httpx.post(f"{base}/purge?all=true").status_code == 403, "curl without the CSRF token either"
    assert httpx.post(f"{base}/purge?all=true", headers=page_headers(server)).status_code == 200
    assert dead_keys(database, q.name) == []


def test_purge_needs_all_or_a_key(server: Server, q: Queue, database: str) -> None:
    make_dead(q, "a")
    r = httpx.post(f"{server.url}/dashboard/queues/{q.name}/dead-letters/purge", headers=page_headers(server))
    assert r.status_code == 400 and "all=true" in r.json()["error"]
    assert dead_keys(database, q.name) == ["a"]


def test_cookie_needs_same_origin_with_tokens(secured: tuple[Server, dict[str, str]], q: Queue, database: str) -> None:
    s, secrets = secured
    make_dead(q, "a", "b")
    cookie = {"cookie": f"pgdq_token={sign_in(s.url, secrets['admin'])}"}
    purge_all = f"{s.url}/dashboard/queues/{q.name}/dead-letters/purge?all=true"
    for headers in (EVIL, CROSS_SITE, SAME_SITE, {}):  # {}: the cookie without Origin or Sec-Fetch-Site
        r = httpx.post(purge_all, headers={**FORM, **cookie, **headers})
        assert r.status_code == 403, (headers, r.text)
    assert dead_keys(database, q.name) == ["a", "b"]
    r = httpx.post(f"{s.url}/v1/queues/{q.name}/messages", headers={**cookie, **EVIL}, json={"key": "k", "payload": 1})
    assert r.status_code == 403 and q.get("k") is None, "refused (and the API takes no session anyway)"

    bearer = {"authorization": f"Bearer {secrets['admin']}"}
    r = httpx.post(f"{s.url}/dashboard/queues/{q.name}/dead-letters/purge?key=a", headers={**bearer, **EVIL})
    assert r.status_code == 200, "a bearer header cannot come from another origin's page"
    assert dead_keys(database, q.name) == ["b"]
    assert httpx.post(purge_all, headers={**cookie, **same_origin(s)}).status_code == 403, "no CSRF token"
    assert httpx.post(purge_all, headers=page_headers(s, secrets["admin"])).status_code == 200
    assert dead_keys(database, q.name) == []


def test_login_and_logout_are_csrf_checked(secured: tuple[Server, dict[str, str]]) -> None:
    s, secrets = secured
    r = httpx.post(f"{s.url}/login", headers={**FORM, **EVIL}, content=f"token={secrets['reader']}")
    assert r.status_code == 403 and "set-cookie" not in r.headers, "no login forced from another site"
    r = httpx.post(f"{s.url}/logout", headers={**EVIL, "cookie": f"pgdq_token={secrets['reader']}"})
    assert r.status_code == 403 and "set-cookie" not in r.headers


# tokens: expiry and logout


def test_the_sign_in_cookie_is_a_session_the_api_refuses(secured: tuple[Server, dict[str, str]], q: Queue) -> None:
    """Browsers send a host's cookies to every port of it: what another app there
    receives must not be the token, work as one, or be changed into another."""
    s, secrets = secured
    session = sign_in(s.url, secrets["reader"])
    assert secrets["reader"] not in session and not session.startswith("pgdq_"), "not the token"
    assert httpx.get(f"{s.url}/dashboard/queues", cookies={"pgdq_token": session}).status_code == 200
    assert httpx.get(f"{s.url}/metrics", cookies={"pgdq_token": session}).status_code == 403, "signed in, not admin"
    for api in ({"authorization": f"Bearer {session}"}, {"cookie": f"pgdq_token={session}"}):
        r = httpx.get(f"{s.url}/v1/queues/{q.name}/stats", headers=api)
        assert r.status_code == 401, (api, r.text)
        r = httpx.post(f"{s.url}/command", headers={**api, **same_origin(s)}, json={"command": "pop", "topic": q.name})
        assert r.status_code == 401, (api, r.text)
    name, until, mac = session.split(".")
    admin = base64.urlsafe_b64encode(b"admin").decode().rstrip("=")
    forged = [
        f"{name}.{until}.{mac[:-1]}{'0' if mac[-1] != '0' else '1'}",  # one digit of the MAC changed
        f"{admin}.{until}.{mac}",  # another token's name
        f"{name}.{int(until) + 86400}.{mac}",  # a later end
        f"{name}.{until}",
        secrets["reader"],  # the token itself is no session either
    ]
    for value in forged:
        assert httpx.get(f"{s.url}/dashboard/queues", cookies={"pgdq_token": value}).status_code == 401, value


def test_logout_clears_the_cookie(secured: tuple[Server, dict[str, str]]) -> None:
    s, secrets = secured
    with httpx.Client(base_url=s.url, headers=same_origin(s)) as browser:
        r = browser.post("/login", headers=FORM, content=f"token={secrets['reader']}")
        assert r.status_code == 303 and browser.cookies.get("pgdq_token") not in (None, secrets["reader"])
        assert browser.get("/dashboard/queues").status_code == 200
        assert 'action="/logout"' in browser.get("/").text, "the page offers a logout"
        r = browser.post("/logout")
        assert r.status_code == 303 and r.headers["location"] == "/login"
        assert "max-age=0" in r.headers["set-cookie"].lower()
        assert browser.cookies.get("pgdq_token") is None
        assert browser.get("/dashboard/queues").status_code == 401


def test_expired_token_is_refused(database: str, q: Queue, tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    secrets = make_tokens(path, {"old": (["admin"], []), "fresh": (["admin"], [])})
    data = json.loads(path.read_text())
    data["tokens"][0]["expires"] = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
    data["tokens"][1]["expires"] = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    path.write_text(json.dumps(data))
    s = serve(database, "--tokens", str(path))
    try:
        old, fresh = ({"authorization": f"Bearer {secrets[n]}"} for n in ("old", "fresh"))
        offer = {"key": "k", "payload": 1}
        r = httpx.post(f"{s.url}/v1/queues/{q.name}/messages", headers=old, json=offer)
        assert r.status_code == 401 and q.get("k") is None
        assert httpx.get(f"{s.url}/dashboard/queues/{q.name}", headers=old).status_code == 401
        r = httpx.get(f"{s.url}/queues/{q.name}", cookies={"pgdq_token": secrets["old"]})
        assert r.status_code == 303 and r.headers["location"] == "/login", "an expired cookie: sign in again"
        r = httpx.post(f"{s.url}/login", headers={**FORM, **same_origin(s)}, content=f"token={secrets['old']}")
        assert r.status_code == 401 and "set-cookie" not in r.headers
        assert httpx.post(f"{s.url}/v1/queues/{q.name}/messages", headers=fresh, json=offer).status_code == 200
        r = httpx.post(f"{s.url}/login", headers={**FORM, **same_origin(s)}, content=f"token={secrets['fresh']}")
        assert 3600 >= int(r.headers["set-cookie"].split("Max-Age=")[1].split(";")[0]) > 3000, "not past expiry"
    finally:
        s.stop()


def test_token_new_expires(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"

    def token_new(name: str, expires: str) -> subprocess.CompletedProcess[str]:
        return pgdq("token", "new", str(path), "--name", name, "--scope=admin", "--expires", expires)

    before = datetime.now(UTC)
    assert token_new("month", "30d").returncode == 0
    assert token_new("until", "2999-01-01T00:00:00+00:00").returncode == 0
    for bad, says in (("3x", "ISO 8601"), ("2020-01-01", "not in the future"), ("0d", "not in the future")):
        r = token_new(f"bad-{bad}", bad)
        assert r.returncode != 0 and says in r.stderr and "--expires" in r.stderr, r.stderr
    entries: list[dict[str, Any]] = json.loads(path.read_text())["tokens"]
    assert [e["name"] for e in entries] == ["month", "until"], "a bad --expires writes nothing"
    month = datetime.fromisoformat(entries[0]["expires"])
    assert timedelta(days=30) - timedelta(seconds=5) < month - before < timedelta(days=30, seconds=60)
    assert entries[1]["expires"] == "2999-01-01T00:00:00+00:00"
    path.write_text(json.dumps({"tokens": [{**entries[0], "expires": "next week"}]}))
    r = pgdq("serve", "--tokens", str(path))
    assert r.returncode != 0 and "'month' expires must be an ISO 8601 time" in r.stderr, r.stderr


# DNS rebinding


def test_host_must_be_the_served_address_without_tokens(server: Server, q: Queue) -> None:
    port = server.url.rsplit(":", 1)[1]
    offer = {"key": "k", "payload": 1}
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.1:1", f"10.0.0.1:{port}"):
        r = httpx.post(f"{server.url}/v1/queues/{q.name}/messages", headers={"host": host}, json=offer)
        assert r.status_code == 421 and "--allowed-host" in r.json()["error"], (host, r.text)
        assert httpx.get(f"{server.url}/", headers={"host": host}).status_code == 421
    assert q.get("k") is None, "nothing done"
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", f"LOCALHOST:{port}"):
        assert httpx.get(f"{server.url}/v1/queues/{q.name}/stats", headers={"host": host}).status_code == 200, host


def test_allowed_host(database: str, q: Queue, tmp_path: Path) -> None:
    s = serve(database, "--allowed-host", "pgdq.example.com", "--allowed-host", "other.example:8443")
    try:
        stats = f"{s.url}/v1/queues/{q.name}/stats"
        for host in ("pgdq.example.com", "pgdq.example.com:443", "other.example:8443", s.url.split("//")[1]):
            assert httpx.get(stats, headers={"host": host}).status_code == 200, host
        for host in ("evil.example", "other.example", "other.example:443"):
            assert httpx.get(stats, headers={"host": host}).status_code == 421, host
        # behind a proxy that keeps the public Host: the dashboard's own page is same-origin
        headers = {"host": "pgdq.example.com", "origin": "https://pgdq.example.com", "sec-fetch-site": "same-origin"}
        r = httpx.post(f"{s.url}/v1/queues/{q.name}/messages", headers=headers, json={"key": "k", "payload": 1})
        assert r.status_code == 200 and q.get("k") is not None
    finally:
        s.stop()
    r = pgdq("serve", "--allowed-host", "http://x.example/")
    assert r.returncode != 0 and "--allowed-host 'http://x.example/'" in r.stderr, r.stderr


# frames and scripts


def assert_guarded(r: httpx.Response) -> None:
    """The headers every answer carries."""
    assert r.headers["x-frame-options"] == "DENY", r.url
    assert "frame-ancestors 'none'" in r.headers["content-security-policy"], r.url
    assert r.headers["x-content-type-options"] == "nosniff", r.url


def test_headers_on_every_answer(server: Server, secured: tuple[Server, dict[str, str]], q: Queue) -> None:
    q.offer("k", 1)  # the queue's page: a queue with nothing is no queue (404)
    for url in ("/", "/login", f"/queues/{q.name}", f"/dashboard/queues/{q.name}", "/static/dashboard.js"):
        r = httpx.get(server.url + url)
        assert r.status_code == 200 and "script-src 'self';" in r.headers["content-security-policy"]
        assert_guarded(r)
    for url in (f"/v1/queues/{q.name}/stats", "/openapi.json", "/metrics", "/nowhere"):
        assert_guarded(httpx.get(server.url + url))
    assert_guarded(httpx.post(server.url + "/v1/queues/x/messages", headers=EVIL, json={}))  # a refusal too
    s, _ = secured
    assert_guarded(httpx.get(s.url + "/v1/queues/x/stats"))  # 401
    assert httpx.get(server.url + "/docs").status_code == 404, "Swagger UI only with --docs"
    assert httpx.get(server.url + "/openapi.json").json()["info"]["title"] == "pgdq"


def test_docs_behind_a_flag(database: str) -> None:
    s = serve(database, "--docs")
    try:
        r = httpx.get(s.url + "/docs")
        assert r.status_code == 200 and "swagger-ui" in r.text
        assert_guarded(r)
        policy = r.headers["content-security-policy"]
        assert "https://cdn.jsdelivr.net" in policy and "'unsafe-inline'" not in policy.split("style-src")[0]
        assert_guarded(httpx.get(s.url + "/docs/oauth2-redirect"))
        assert '<a href="/docs">API</a>' in httpx.get(s.url + "/").text
    finally:
        s.stop()


def test_any_asgi_server_from_the_environment(database: str, q: Queue) -> None:
    env = {
        **os.environ,
        "PGDQ_DSN": database,
        "PGDQ_ALLOWED_HOSTS": "pgdq.example.com, other.example",
        "PGDQ_DOCS": "1",
    }
    s = Server([sys.executable, "-m", "uvicorn", "pgdq.http:app", "--host", "127.0.0.1"], env=env)
    try:
        stats = f"{s.url}/v1/queues/{q.name}/stats"
        assert httpx.get(stats, headers={"host": "pgdq.example.com"}).status_code == 200
        assert httpx.get(stats, headers={"host": "evil.example"}).status_code == 421
        assert_guarded(httpx.get(s.url + "/docs"))
    finally:
        s.stop()
