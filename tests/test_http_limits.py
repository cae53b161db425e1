"""pgdq serve's limits (issue 26): statement timeout and cancelling the query
of a client that left, connection limits, the tokens file's shape and mode,
chunked bodies over the limit, queue names with "/", schedules at infinity,
stale pooled connections after a database restart, a port in use."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import psycopg
import pytest
from conftest import ROOT, install_extension, owner, start_cluster, unsharded
from http_server import Server, free_port, make_tokens, serve, waiting_polls
from pgdq import Queue
from psycopg import sql
from waiting import wait_for


@pytest.fixture
def running() -> Iterator[list[Server]]:
    """Servers a test starts (append them), stopped after it."""
    servers: list[Server] = []
    yield servers
    for s in servers:
        s.stop()


def backends(database: str, where: str) -> int:
    """How many other backends of database match where (a fixed SQL condition)."""
    with psycopg.connect(database, autocommit=True) as c:
        query = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        (n,) = c.execute(query + " AND " + where).fetchone()  # type: ignore[misc]
        return int(n)


def send_raw(url: str, method: str, path: str, body: bytes = b"") -> socket.socket:
    """A connection that sent one request (its answer not read)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    head = f"{method} {path} HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-length: {len(body)}\r\n"
    sock.sendall(head.encode() + b"content-type: application/json\r\n\r\n" + body)
    return sock


def answer_status(sock: socket.socket) -> int:
    """The status of the next answer on sock (its head read, then its body by content-length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(
        int(v) for k, _, v in (h.partition(b":") for h in head.split(b"\r\n")) if k.lower() == b"content-length"
    )
    while len(rest) < length:
        rest += sock.recv(65536)
    return int(head.split()[1])


# 1. statement timeout; a client that leaves has its statement cancelled


@unsharded("locks a row of dq_messages, which lives on the partitions")
def test_a_client_that_leaves_has_its_statement_cancelled(
    database: str, queue_name: str, q: Queue, running: list[Server]
) -> None:
    running.append(s := serve(database, "--pool-size", "3"))
    q.offer("k", 1)
    waiting = "wait_event_type = 'Lock'"
    with psycopg.connect(owner(database, queue_name)) as holder:  # a transaction holding the row
        holder.execute("SELECT 1 FROM dq_messages WHERE queue = %s AND key = 'k' FOR UPDATE", (queue_name,))
        clients = [send_raw(s.url, "DELETE", f"/v1/queues/{queue_name}/messages/k") for _ in range(3)]
        wait_for(lambda: backends(database, waiting) == 3, "3 requests waiting on the lock")
        for c in clients:
            c.close()
        wait_for(lambda: backends(database, waiting) == 0, "the server to cancel the statements of the clients gone")
        wait_for(lambda: backends(database, "state = 'active'") == 0, "the server's connections idle again")
        r = httpx.get(f"{s.url}/v1/queues/{queue_name}/stats", timeout=30)  # the pool serves a fresh request
        assert r.status_code == 200 and r.json()["ready"] == 1, r.text
        holder.rollback()
    assert q.get("k") is not None  # nothing was deleted
    gone = 'pgdq_http_requests_total{method="DELETE",route="/v1/queues/{queue}/messages/{key}",status="499"} 3.0'
    wait_for(lambda: gone in httpx.get(f"{s.url}/metrics", timeout=30).text, "3 requests counted as gone, not as 500")


def timed_out_server(database: str, how: str) -> Server:
    """A server whose statements may run 0.5 s: `pgdq serve`, or pgdq.http:app under plain uvicorn."""
    if how == "pgdq serve":
        return serve(database, "--statement-timeout", "0.5")
    env = {**os.environ, "PGDQ_DSN": database, "PGDQ_STATEMENT_TIMEOUT": "0.5"}
    return Server([sys.executable, "-m", "uvicorn", "pgdq.http:app"], env=env)


@unsharded("locks a row of dq_messages, which lives on the partitions")
@pytest.mark.parametrize("how", ["pgdq serve", "uvicorn"])
def test_a_statement_over_the_timeout_answers_503(
    database: str, queue_name: str, q: Queue, running: list[Server], how: str
) -> None:
    running.append(s := timed_out_server(database, how))
    q.offer("k", 1)
    with psycopg.connect(owner(database, queue_name)) as holder:
        holder.execute("SELECT 1 FROM dq_messages WHERE queue = %s AND key = 'k' FOR UPDATE", (queue_name,))
        r = httpx.delete(f"{s.url}/v1/queues/{queue_name}/messages/k", timeout=30)
        assert r.status_code == 503, r.text
        assert r.json() == {"error": "the statement ran over the statement timeout (0.5 s)", "sqlstate": "57014"}
        holder.rollback()
    started = time.monotonic()  # a long poll waits in Python, not in SQL: the timeout does not end it
    r = httpx.post(f"{s.url}/v1/queues/{queue_name}/poll", json={"wait": 1.5, "max": 5}, timeout=30)
    assert r.status_code == 200 and r.json()["deliveries"][0]["key"] == "k", r.text
    q.offer("later", 2, datetime.now(UTC) + timedelta(seconds=1.2))
    r = httpx.post(f"{s.url}/v1/queues/{queue_name}/poll", json={"wait": 5}, timeout=30)
    assert [d["key"] for d in r.json()["deliveries"]] == ["later"], r.text
    assert time.monotonic() - started > 1.0


def test_statement_timeout_must_be_positive_or_zero(database: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pgdq", "serve", "--dsn", database, "--statement-timeout", "-1"],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2 and "--statement-timeout" in done.stderr
    env = {**os.environ, "PGDQ_DSN": database, "PGDQ_STATEMENT_TIMEOUT": "soon"}
    done = subprocess.run(
        [sys.executable, "-c", "import pgdq.http; pgdq.http.app"],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert "PGDQ_STATEMENT_TIMEOUT must be a number of seconds, 0 or more, not 'soon'" in done.stderr


# 2. connections: capped, idle ones closed


def test_connections_over_the_limit_get_503(database: str, running: list[Server]) -> None:
    running.append(s := serve(database, "--limit-concurrency", "3", "--timeout-keep-alive", "60"))
    opened, statuses = [], []
    for _ in range(4):  # each connection stays open (keep-alive) while the next one asks
        opened.append(send_raw(s.url, "GET", "/openapi.json"))
        statuses.append(answer_status(opened[-1]))
    assert statuses[0] == 200 and 503 in statuses, statuses
    for sock in opened:
        sock.close()
    wait_for(lambda: httpx.get(s.url + "/openapi.json", timeout=30).status_code == 200, "a free connection again")


def test_an_idle_connection_is_closed_after_the_keep_alive_timeout(database: str, running: list[Server]) -> None:
    running.append(s := serve(database, "--timeout-keep-alive", "1"))
    sock = send_raw(s.url, "GET", "/openapi.json")
    assert answer_status(sock) == 200
    started = time.monotonic()
    assert sock.recv(1) == b""  # the server closed it
    assert time.monotonic() - started < 10
    sock.close()


@pytest.mark.parametrize("parser", ["httptools", "h11"])
def test_a_request_head_over_16_kib_is_refused(database: str, running: list[Server], parser: str) -> None:
    running.append(s := serve(database, "--http", parser))
    host = s.url.removeprefix("http://")
    with socket.create_connection(tuple(host.split(":")), timeout=30) as sock:  # type: ignore[arg-type]
        # a head that never ends: refused once 16 KiB of it wait unparsed (not read on for ever)
        sock.sendall(f"GET /openapi.json HTTP/1.1\r\nhost: {host}\r\nx-big: {'a' * 20000}".encode())
        assert sock.recv(100).startswith(b"HTTP/1.1 431 ")
    with socket.create_connection(tuple(host.split(":")), timeout=30) as sock:  # type: ignore[arg-type]
        # the same head in many short pieces (counted across reads), after a request on the connection
        sock.sendall(f"GET /openapi.json HTTP/1.1\r\nhost: {host}\r\n\r\n".encode())
        assert answer_status(sock) == 200
        sock.sendall(f"GET /openapi.json HTTP/1.1\r\nhost: {host}\r\n".encode())
        with contextlib.suppress(OSError):  # the server may close before the last piece
            for i in range(40):
                sock.sendall(f"x-h{i}: {'a' * 1000}\r\n".encode())
        assert sock.recv(100).startswith(b"HTTP/1.1 431 ")
    with socket.create_connection(tuple(host.split(":")), timeout=30) as sock:  # type: ignore[arg-type]
        # a short head, then a body over 16 KiB read with it: the body is not the head's
        body = json.dumps({"key": "big", "payload": "x" * 20000}).encode()
        head = f"POST /v1/queues/heads/messages HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        for _ in range(2):  # the second on the same connection
            sock.sendall(f"{head}content-length: {len(body)}\r\n\r\n".encode() + body)
            assert answer_status(sock) == 200
    with socket.create_connection(tuple(host.split(":")), timeout=30) as sock:  # type: ignore[arg-type]
        sock.sendall(f"GET /openapi.json HTTP/1.1\r\nhost: {host}\r\nx-big: {'a' * 8000}\r\n\r\n".encode())
        assert sock.recv(100).startswith(b"HTTP/1.1 200 ")
    for head in (f"x-big: {'a' * 17000}\r\n", "".join(f"x-h{i}: {'a' * 1000}\r\n" for i in range(20)), "a" * 17000):
        with socket.create_connection(tuple(host.split(":")), timeout=30) as sock:  # type: ignore[arg-type]
            # a whole head over 16 KiB in one piece (a header, many, a long query), as docs/http.md says: 431
            path, headers = ("/openapi.json?" + head, "") if head.startswith("a") else ("/openapi.json", head)
            sock.sendall(f"GET {path} HTTP/1.1\r\nhost: {host}\r\n{headers}\r\n".encode())
            assert sock.recv(100).startswith(b"HTTP/1.1 431 "), head[:20]


def whole_answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """The next answer on sock: status, headers (lower-case names; date left out), body (by content-length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    while len(body) < int(headers["content-length"]):
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection within the body"
        body += chunk
    headers.pop("date", None)
    return int(lines[0].split()[1]), headers, body


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed sock: an end of stream, or a reset (pieces
    of ours that reached it after it closed make its kernel answer RST)."""
    try:
        return sock.recv(100) == b""
    except ConnectionResetError:
        return True


@pytest.mark.parametrize("parser", ["httptools", "h11"])
def test_a_head_over_16_kib_in_pieces_gets_the_json_431_of_a_whole_one(
    database: str, running: list[Server], parser: str
) -> None:
    """A head over 16 KiB answers the same JSON 431 (with the guard's headers, in the API's or a
    protocol's shape) whether it came in one piece (HeadLimit) or in pieces, refused by the parser
    before its end (it answered uvicorn's 400 text/plain), which then closes the connection."""
    running.append(s := serve(database, "--http", parser))
    host = s.url.removeprefix("http://")
    address = tuple(host.split(":"))
    for path in ("/v1/queues/pieces/stats", "/command"):
        head = f"GET {path} HTTP/1.1\r\nhost: {host}\r\n" + "".join(f"x-h{i}: {'a' * 1000}\r\n" for i in range(20))
        with socket.create_connection(address, timeout=30) as sock:  # type: ignore[arg-type]
            sock.sendall(f"{head}\r\n".encode())
            whole = whole_answer(sock)
        with socket.create_connection(address, timeout=30) as sock:  # type: ignore[arg-type]
            sock.sendall(head[:200].encode())
            with contextlib.suppress(OSError):  # the server may close before the last piece
                for at in range(200, len(head), 1000):
                    sock.sendall(head[at : at + 1000].encode())  # never the blank line that ends it
            status, headers, body = whole_answer(sock)
            assert closed_by_server(sock), "the server closed the connection"
        assert (status, headers["content-type"]) == (431, "application/json"), (status, headers, body)
        assert (status, body) == whole[:1] + whole[2:], path
        assert headers.pop("connection") == "close"
        assert headers == whole[1], "the same headers (the guard's too), but connection: close"
        assert json.loads(body)["error"] == "the request head is over 16384 bytes"


# a server of pgdq with two routes of the test's own that fail: one raises, one answers what JSON cannot hold
FAILING_SERVER = """
import sys, uvicorn
from pgdq.http import Settings, create_app
app = create_app(Settings(dsn=sys.argv[1]))
@app.get("/v1/raises")
async def raises() -> None:
    raise RuntimeError("a bug")
@app.get("/v1/unserialisable")
async def unserialisable() -> dict[str, object]:
    return {"n": object()}
uvicorn.run(app, port=int(sys.argv[3]), log_level="warning")
"""


def test_a_failure_no_handler_answers_is_a_json_500(database: str, running: list[Server]) -> None:
    running.append(s := Server([sys.executable, "-c", FAILING_SERVER, database]))
    for path in ("/v1/raises", "/v1/unserialisable"):
        r = httpx.get(s.url + path, timeout=30)
        assert (r.status_code, r.headers["content-type"]) == (500, "application/json"), (path, r.text)
        assert r.json() == {"error": "the server failed to answer this request; see its log"}
        assert r.headers["x-content-type-options"] == "nosniff", "the guard's headers too"
    r = httpx.get(s.url + "/v1/stats", timeout=30)
    assert r.status_code == 200, "the server serves on"


def test_the_h11_parser_on_request(database: str, running: list[Server]) -> None:
    running.append(s := serve(database, "--http", "h11"))  # up once it answers /openapi.json
    assert httpx.get(s.url + "/v1/stats", timeout=30).status_code == 200


# 3. the tokens file


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ({"queues": "orders"}, "token 'shop': queues must be a list of strings"),
        ({"queues": ["orders", 1]}, "token 'shop': queues must be a list of strings"),
        ({"scopes": "produce"}, "token 'shop': scopes must be a list of strings"),
        ({"name": 7}, "token 7: name must be a string"),
        ({"sha256": None}, "token 'shop': sha256 must be 64 hex digits"),
    ],
)
def test_tokens_file_fields_must_have_their_types(tmp_path: Path, entry: dict[str, Any], says: str) -> None:
    from pgdq.http import load_tokens

    path = tmp_path / "tokens.json"
    good = {"name": "shop", "sha256": "a" * 64, "scopes": ["produce"], "queues": ["orders"]}
    path.write_text(json.dumps({"tokens": [{**good, **entry}]}))
    path.chmod(0o600)
    with pytest.raises(ValueError, match="tokens file .*: " + says.replace("(", r"\(")):
        load_tokens(path)


@pytest.mark.parametrize("mode", [0o666, 0o620, 0o602])
def test_a_tokens_file_others_may_write_is_refused(tmp_path: Path, database: str, mode: int) -> None:
    path = tmp_path / "tokens.json"
    make_tokens(path, {"shop": (["produce"], ["orders"])})
    path.chmod(mode)
    done = subprocess.run(
        [sys.executable, "-m", "pgdq", "serve", "--dsn", database, "--tokens", str(path), "--port", str(free_port())],
        check=False,
        capture_output=True,
        text=True,
        timeout=15,
    )
    assert done.returncode == 2, done.stderr
    assert f"tokens file {path} is writable by " in done.stderr and "chmod go-w" in done.stderr


@pytest.mark.skipif(os.getuid() != 0, reason="chown needs root")
def test_a_tokens_file_of_another_user_is_refused(tmp_path: Path) -> None:
    from pgdq.http import load_tokens

    path = tmp_path / "tokens.json"
    make_tokens(path, {"shop": (["produce"], ["orders"])})
    os.chown(path, 4321, -1)
    with pytest.raises(ValueError, match="is owned by user 4321, not by you or root"):
        load_tokens(path)


def test_token_new_keeps_the_tokens_file_private(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    make_tokens(path, {"shop": (["produce"], ["orders"])})
    assert path.stat().st_mode & 0o777 == 0o600
    path.chmod(0o644)  # e.g. copied with a lax umask
    make_tokens(path, {"ops": (["admin"], [])})
    assert path.stat().st_mode & 0o777 == 0o600
    assert [t["name"] for t in json.loads(path.read_text())["tokens"]] == ["shop", "ops"]


# 4. a chunked body over the limit


def test_a_chunked_body_over_the_limit_is_413(database: str, queue_name: str, q: Queue, running: list[Server]) -> None:
    running.append(s := serve(database, "--max-body", "1000"))

    def chunks() -> Iterator[bytes]:
        yield b'{"key": "k", "payload": "'
        for _ in range(4):
            yield b"x" * 400
        yield b'"}'

    r = httpx.post(
        f"{s.url}/v1/queues/{queue_name}/messages",
        content=chunks(),
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert r.status_code == 413, r.text
    assert r.json() == {"error": "the request body is over 1000 bytes"}
    assert q.get("k") is None
    small = httpx.post(
        f"{s.url}/v1/queues/{queue_name}/messages",
        content=iter([b'{"key": "k", ', b'"payload": 1}']),
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert small.status_code == 200, small.text


# 5. queue names with "/"


def purge_everything(database: str, name: str) -> None:
    """Delete queue name's messages and dead letters."""
    with Queue(name, owner(database, name)) as q:
        q.purge()
        q.purge_dead_letters(None)


def test_a_queue_name_with_a_slash(database: str, running: list[Server]) -> None:
    running.append(s := serve(database))
    name = "limits/a"
    base = f"/v1/queues/{quote(name, safe='')}"
    purge_everything(database, name)
    with httpx.Client(base_url=s.url, timeout=30) as api:
        assert api.post(base + "/messages", json={"key": "k", "payload": 1}).json()["outcome"] == "created"
        assert api.get(base + "/messages/k").json()["queue"] == name
        assert api.get(base + "/stats").json()["ready"] == 1
        (d,) = api.post(base + "/poll", json={"max": 5}).json()["deliveries"]
        assert d["queue"] == name
        assert api.post(base + "/ack", json={"lock_tokens": [d["lock_token"]]}).json() == {"acked": 1}
        assert api.get(base + "/stats").json()["ready"] == 0
        assert api.get(base + "/schedules").json() == []
        # a queue "limits" with a key "a/stats" is not the queue "limits/a"
        assert api.post("/v1/queues/limits/messages", json={"key": "a%2Fstats", "payload": 1}).status_code == 200
        assert api.get("/v1/queues/limits/messages/a%252Fstats").json()["key"] == "a%2Fstats"
        assert api.delete("/v1/queues/limits/messages/a%252Fstats").json() == {"done": True}
        assert api.get(base + "/messages/k").status_code == 404
        api.post(base + "/messages", json={"key": "k2", "payload": 1})
        with Queue(name, owner(database, name)) as direct:
            direct.poll_many(1)[0].dead_letter("broken")  # the fragment links its dead letters' actions
        page = api.get("/queues/" + quote(name, safe=""))
        assert page.status_code == 200 and '"/dashboard/queues/limits%2Fa"' in page.text, page.text
        fragment = api.get("/dashboard/queues/" + quote(name, safe=""))
        assert fragment.status_code == 200 and "/dashboard/queues/limits%2Fa/dead-letters" in fragment.text
        rows = api.get("/dashboard/queues", params={"search": name})  # the overview shows 100 queues a page
        assert 'href="/queues/limits%2Fa"' in rows.text
    purge_everything(database, name)


# 6. schedules at infinity


@pytest.fixture
def endless_schedules(database: str, queue_name: str) -> Iterator[None]:
    """Three schedules of this test's queue: at infinity and -infinity (as 1.1
    could store them), and ended (next_at NULL, as 1.2 ends one with no
    occurrence before year 10000); removed after."""
    schedules = (("never", "infinity"), ("past", "-infinity"), ("ended", None))
    with psycopg.connect(owner(database, queue_name), autocommit=True) as c:
        for name, at in schedules:
            c.execute("SELECT dq_schedule_set(%s, %s, '0 0 * * *')", (queue_name, name))
            c.execute("UPDATE dq_schedules SET next_at = %s WHERE queue = %s AND name = %s", (at, queue_name, name))
        yield
        for name, _ in schedules:
            c.execute("SELECT dq_schedule_remove(%s, %s)", (queue_name, name))


@unsharded("writes dq_schedules, which lives on the partitions")
@pytest.mark.usefixtures("endless_schedules")
def test_a_schedule_at_infinity(queue_name: str, api: httpx.Client) -> None:
    r = api.get(f"/v1/queues/{queue_name}/schedules")
    assert r.status_code == 200, r.text
    assert {s["name"]: s["next_at"] for s in r.json()} == {"never": "infinity", "past": "-infinity", "ended": None}
    assert api.get(f"/v1/queues/{queue_name}/stats").status_code == 200
    page = api.get(f"/dashboard/queues/{queue_name}")
    assert page.status_code == 200, page.text
    # (-infinity is overdue too: 1.3 flags it)
    assert "<td>never</td>" in page.text and "<td>long ago " in page.text and "<td>ended</td>" in page.text
    assert api.get(f"/queues/{queue_name}").status_code == 200


# 7. stale pooled connections after a restart


def throwaway_clusters() -> bool:
    """True if the suite runs on the repo's throwaway test cluster (so it may start another)."""
    cluster = subprocess.check_output([str(ROOT / "scripts/pgcluster.sh"), "dir", "test"], text=True).strip()
    return os.environ.get("PGHOST", "").startswith(cluster)


@pytest.fixture
def restartable() -> Iterator[dict[str, str]]:
    """A throwaway cluster of this test's own, stopped after it (restarting the shared
    test cluster would break whatever else runs on it); its PG* variables."""
    yield start_cluster("test-http-restart")
    subprocess.run([str(ROOT / "scripts/pgcluster.sh"), "stop", "test-http-restart"], check=True)


@unsharded("restarts a cluster of its own, not the router's partitions")
@pytest.mark.skipif(not throwaway_clusters(), reason="starts a throwaway cluster: only next to the repo's test cluster")
def test_every_pooled_connection_works_as_soon_as_the_database_is_back(
    restartable: dict[str, str], running: list[Server]
) -> None:
    """A full pool (10 connections) that a restart broke: the first requests once
    the database answers again are served (none waits out a back-off into 503);
    and a long poll waiting across a crash-restart gets its message, not 503."""
    dsn = _restart_database(restartable)
    running.append(s := serve(dsn, "--pool-size", "10"))
    with psycopg.connect(dsn) as holder:  # ten requests at once grow the pool to 10 connections
        holder.execute("SELECT dq_offer('r', 'k', '1')")
        holder.commit()
        holder.execute("SELECT 1 FROM dq_messages WHERE queue = 'r' AND key = 'k' FOR UPDATE")
        clients = [send_raw(s.url, "DELETE", "/v1/queues/r/messages/k") for _ in range(10)]
        wait_for(lambda: backends(dsn, "wait_event_type = 'Lock'") == 10, "10 pooled connections in use")
        holder.rollback()
    assert sorted(answer_status(c) for c in clients) == [200] + [404] * 9
    pgcluster = [str(ROOT / "scripts/pgcluster.sh"), "restart", "test-http-restart"]
    subprocess.run(pgcluster, check=True)
    with httpx.Client(base_url=s.url, timeout=30) as api:
        assert [api.get("/v1/queues/r/stats").status_code for _ in range(12)] == [200] * 12
        poll = send_raw(s.url, "POST", "/v1/queues/r/poll", json.dumps({"wait": 60}).encode())
        wait_for(lambda: waiting_polls(api) == 1, "the long poll to wait")
        subprocess.run([*pgcluster[:-2], "crash-restart", "test-http-restart"], check=True)
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("SELECT dq_offer('r', 'after', '2')")
        assert answer_status(poll) == 200, "the long poll rode out the crash"


@unsharded("makes its own database refuse connections, not the router's partitions")
@pytest.mark.skipif(not throwaway_clusters(), reason="starts a throwaway cluster: only next to the repo's test cluster")
def test_a_long_poll_waits_within_its_wait_for_a_database_it_cannot_reach(
    restartable: dict[str, str], running: list[Server]
) -> None:
    """A long poll that wakes (its message falls due) while the database refuses
    connections for longer than the pool's 5 s timeout keeps waiting, within its
    own wait, and delivers the message once connections are taken again (it
    answered 503 as soon as the pool timed out)."""
    dsn = _restart_database(restartable)
    running.append(s := serve(dsn))
    log = lines_of(s.process.stderr)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SELECT dq_offer('u', 'soon', '1', now() + interval '3 seconds')")
    with httpx.Client(base_url=s.url, timeout=30) as api:
        poll = send_raw(s.url, "POST", "/v1/queues/u/poll", json.dumps({"wait": 60}).encode())
        wait_for(lambda: waiting_polls(api) == 1, "the long poll to wait")
    refuse = sql.SQL("ALTER DATABASE restart ALLOW_CONNECTIONS {}")
    with psycopg.connect(dsn.replace("dbname=restart", "dbname=postgres"), autocommit=True) as admin:
        admin.execute(refuse.format(sql.Literal(False)))
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = 'restart'")
        # the poll wakes at the due time; the server says so once its pool timed out
        wait_for(
            lambda: any("the database is unreachable" in line for line in log) or readable(poll),
            "the long poll to find the database unreachable",
        )
        assert not readable(poll), "the long poll answered while the database refused connections"
        admin.execute(refuse.format(sql.Literal(True)))
    assert answer_status(poll) == 200, "the long poll delivered once the database took connections again"


def lines_of(stream: Any) -> list[str]:
    """The lines of stream so far, read by a thread of their own as they come."""
    lines: list[str] = []

    def read() -> None:
        for line in stream:
            lines.append(line)

    threading.Thread(target=read, daemon=True).start()
    return lines


def readable(sock: socket.socket) -> bool:
    """Whether sock has something to read (an answer, or the peer closed it), without reading it."""
    return bool(select.select([sock], [], [], 0)[0])


def _restart_database(env: dict[str, str]) -> str:
    """A fresh database "restart" with pgdq on the throwaway cluster of env; its DSN."""
    params = {"host": env["PGHOST"], "port": env["PGPORT"], "user": env["PGUSER"]}
    with psycopg.connect(psycopg.conninfo.make_conninfo(dbname="postgres", **params), autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier("restart")))
        admin.execute("CREATE DATABASE restart")
    dsn = psycopg.conninfo.make_conninfo(dbname="restart", **params)
    with psycopg.connect(dsn, autocommit=True) as c:
        install_extension(c)
    return dsn


# 8. a port in use


def test_serve_on_a_port_in_use_exits_1(database: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "pgdq", "serve", "--dsn", database, "--port", str(port)],
            check=False,
            capture_output=True,
            text=True,
            timeout=30,
        )
    assert done.returncode == 1, done.stderr
    assert f"port {port} is in use" in done.stderr


# 9. how `pgdq serve` stops, and what it says without the http extra


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_exits_0_after_a_graceful_stop(database: str, sig: signal.Signals) -> None:
    s = serve(database)
    s.process.send_signal(sig)
    assert s.process.wait(30) == 0, s.process.stderr.read() if s.process.stderr else ""


def test_serve_says_where_it_listens(database: str) -> None:
    """uvicorn names no address when handed a socket: pgdq serve's own line must, or a newcomer
    who ran it has to guess the dashboard's URL."""
    s = serve(database)
    s.process.send_signal(signal.SIGTERM)
    assert s.process.wait(30) == 0
    said = s.process.stderr.read() if s.process.stderr else ""
    assert f"pgdq serve: the dashboard at {s.url}/, the API under {s.url}/v1" in said, said


# `pgdq serve` as if the http extra were not installed: its modules cannot be imported
WITHOUT_HTTP_EXTRA = """
import runpy, sys
for name in ("fastapi", "uvicorn", "jinja2", "prometheus_client"):
    sys.modules[name] = None  # import fails with ModuleNotFoundError, as when not installed
sys.argv = ["pgdq", *sys.argv[1:]]
runpy.run_module("pgdq", run_name="__main__")
"""


def test_serve_without_the_http_extra_says_what_to_install(database: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_HTTP_EXTRA, "serve", "--dsn", database, "--port", str(free_port())],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == [
        "Error: pgdq serve needs the http extra (no module uvicorn): pip install 'pgdq[http]'"
    ]
