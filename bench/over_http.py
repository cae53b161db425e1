"""W9: the same jobs over HTTP (`pgdq serve`) and through the SQL functions
directly, 8 clients each; W4's lateness through long-polling HTTP consumers;
what 1,000 idle long polls cost the server."""

from __future__ import annotations

import asyncio
import http.client
import json
import multiprocessing as mp
import socket
import statistics
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from typing import Any

import httpx
import psycopg
from common import fresh_db, n
from pgdq import Queue
from systems import System, lateness_times

CLIENTS = 8


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(conninfo: str) -> tuple[subprocess.Popen[bytes], str]:
    """pgdq serve on conninfo (one uvicorn process, pool of 10); its process and URL."""
    port = _port()
    args = [sys.executable, "-m", "pgdq", "serve", "--dsn", conninfo, "--port", str(port), "--log-level", "WARNING"]
    process = subprocess.Popen(args)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            httpx.get(url + "/openapi.json", timeout=1)
            return process, url
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError("pgdq serve did not start")


def _http_jobs(url: str, queue: str, first: int, count: int, batch: int) -> None:
    """count jobs offered, polled and acked over HTTP, batch at a time (the
    standard library's keep-alive client: lighter than httpx, so the clients
    sharing the two cores with the server take less of them)."""
    conn = http.client.HTTPConnection(url.removeprefix("http://"))

    def post(path: str, body: Any) -> Any:
        conn.request("POST", f"/v1/queues/{queue}/{path}", json.dumps(body), {"content-type": "application/json"})
        response = conn.getresponse()
        answer = json.loads(response.read())
        assert response.status == 200, answer
        return answer

    for start in range(first, first + count, batch):
        keys = [f"k{i}" for i in range(start, min(start + batch, first + count))]
        if batch == 1:
            post("messages", {"key": keys[0], "payload": {"n": 1}})
        else:
            post("messages/batch", {"messages": [{"key": k, "payload": {"n": 1}} for k in keys]})
        tokens = [d["lock_token"] for d in post("poll", {"max": len(keys), "lease": 60})["deliveries"]]
        if tokens:
            post("ack", {"lock_tokens": tokens})
    conn.close()


def _sql_jobs(conninfo: str, queue: str, first: int, count: int, batch: int) -> None:
    """The same jobs through dq_offer(_many), dq_poll_many and dq_ack_many."""
    with psycopg.connect(conninfo, autocommit=True) as c:
        for start in range(first, first + count, batch):
            keys = [f"k{i}" for i in range(start, min(start + batch, first + count))]
            if batch == 1:
                c.execute("SELECT dq_offer(%s, %s, '{\"n\": 1}')", (queue, keys[0]))
            else:
                c.execute(
                    "SELECT count(*) FROM dq_offer_many(%s, %s::text[], array_fill('{\"n\": 1}'::jsonb, ARRAY[%s]))",
                    (queue, keys, len(keys)),
                )
            rows = c.execute("SELECT lock_token FROM dq_poll_many(%s, %s, '60 s')", (queue, len(keys))).fetchall()
            c.execute("SELECT dq_ack_many(%s::uuid[])", ([r[0] for r in rows],))


def _rate(target: Any, where: str, queue: str, total: int, batch: int) -> float:
    """Jobs per second of CLIENTS processes sharing total jobs."""
    each = total // CLIENTS
    procs = [mp.Process(target=target, args=(where, queue, i * each, each, batch)) for i in range(CLIENTS)]
    started = time.perf_counter()
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        assert p.exitcode == 0, f"{target.__name__} failed"
    return each * CLIENTS / (time.perf_counter() - started)


async def _idle_polls(url: str, count: int, conninfo: str, server_pid: int) -> dict[str, float]:
    """Server memory and database connections while count long polls wait."""
    rss_before = _rss_mb(server_pid)
    limits = httpx.Limits(max_connections=count + 10, max_keepalive_connections=count + 10)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as c:
        polls = [asyncio.create_task(c.post("/v1/queues/idle/poll", json={"wait": 30})) for _ in range(count)]
        await asyncio.sleep(5)
        metrics = (await c.get("/metrics")).text
        waiting = next(
            float(line.split()[1]) for line in metrics.splitlines() if line.startswith("pgdq_http_waiting_polls ")
        )
        with psycopg.connect(conninfo) as conn:
            (connections,) = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone()  # type: ignore[misc]
        rss = _rss_mb(server_pid)
        for p in polls:
            p.cancel()
        await asyncio.gather(*polls, return_exceptions=True)
    return {
        "W9 idle long polls waiting": waiting,
        "W9 idle long polls: database connections of the server": connections,
        "W9 idle long polls: server memory MB": rss,
        "W9 idle long polls: server memory before MB": rss_before,
    }


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        kb = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    return kb / 1024


def _http_consumer(url: str, queue: str, late: list[float], stop: threading.Event) -> None:
    """Long-poll queue over HTTP (wait 5 s, up to 10 at once) until stop; each
    delivery's lateness (now - scheduled_at, ms) into late, then ack."""
    conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=60)
    while not stop.is_set():
        body = json.dumps({"max": 10, "lease": 60, "wait": 5})
        conn.request("POST", f"/v1/queues/{queue}/poll", body, {"content-type": "application/json"})
        deliveries = json.loads(conn.getresponse().read())["deliveries"]
        now = datetime.now(UTC)
        late.extend((now - datetime.fromisoformat(d["scheduled_at"])).total_seconds() * 1000 for d in deliveries)
        if deliveries:
            tokens = json.dumps({"lock_tokens": [d["lock_token"] for d in deliveries]})
            conn.request("POST", f"/v1/queues/{queue}/ack", tokens, {"content-type": "application/json"})
            conn.getresponse().read()
    conn.close()


def _http_lateness(url: str, conninfo: str, total: int) -> dict[str, float]:
    """W4 through HTTP: total messages at distinct times over 10 s, CLIENTS long-polling consumers."""
    late: list[float] = []
    stop = threading.Event()
    consumers = [threading.Thread(target=_http_consumer, args=(url, "w9_late", late, stop)) for _ in range(CLIENTS)]
    for c in consumers:
        c.start()
    time.sleep(0.5)  # the consumers wait first
    with psycopg.connect(conninfo, autocommit=True) as conn:
        (now,) = conn.execute("SELECT clock_timestamp()").fetchone()  # type: ignore[misc]
        Queue("w9_late", conn).offer_many([(f"t{i}", i, now + after) for i, after in enumerate(lateness_times(total))])
    deadline = time.monotonic() + 40
    while len(late) < total and time.monotonic() < deadline:
        time.sleep(0.2)
    stop.set()
    for c in consumers:
        c.join()
    ms = sorted(late)
    return {
        "W9 HTTP consumer lateness p50 ms": statistics.median(ms),
        "W9 HTTP consumer lateness p99 ms": ms[int(len(ms) * 0.99) - 1],
        "W9 HTTP consumer lateness max ms": ms[-1],
        "W9 HTTP consumer messages": len(ms),
    }


def w9_http(system: System) -> dict[str, float]:
    """W9 (pgdq): offer + poll + ack over HTTP against the SQL functions, 8 clients (bench/over_http.py)."""
    if system.name != "pgdq":
        return {}
    conninfo = fresh_db(system)
    process, url = _serve(conninfo)
    out: dict[str, float] = {}
    try:
        out.update(_http_lateness(url, conninfo, n(2000)))  # first, as W4: on a database with no history
        for batch, total in ((1, n(4_000)), (100, n(80_000))):
            label = "single jobs" if batch == 1 else f"batches of {batch}"
            http = _rate(_http_jobs, url, f"w9_http_{batch}", total, batch)
            direct = _rate(_sql_jobs, conninfo, f"w9_sql_{batch}", total, batch)
            out[f"W9 HTTP, {label} jobs/s"] = http
            out[f"W9 SQL, {label} jobs/s"] = direct
            out[f"W9 HTTP / SQL, {label} ratio"] = http / direct
        out.update(asyncio.run(_idle_polls(url, n(1000), conninfo, process.pid)))
    finally:
        process.terminate()
        process.wait(30)
    return out
