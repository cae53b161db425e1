"""A real `pgdq serve` for the HTTP tests: the Server process, serve() on the
test database, tokens made with `pgdq token new`; conftest.py's `server` and
`api` fixtures use them."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """An HTTP server of pgdq in a child process (command, then --port), up once /openapi.json answers."""

    def __init__(self, command: list[str], env: dict[str, str] | None = None) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen([*command, "--port", str(port)], env=env, stderr=subprocess.PIPE, text=True)
        # a guard against a hang, not a speed to meet: on 2 loaded cores (make
        # test's jobs at once, other runs) a start took over 30 s
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.process.stderr.read() if self.process.stderr else ""
            try:
                if httpx.get(self.url + "/openapi.json", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.1)
        raise AssertionError(f"{command} did not start")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def serve(database: str, *args: str) -> Server:
    """`pgdq serve` on the test database."""
    return Server([sys.executable, "-m", "pgdq", "serve", "--dsn", database, *args])


def make_tokens(path: Path, wanted: dict[str, tuple[list[str], list[str]]]) -> dict[str, str]:
    """`pgdq token new` into path for each name: (scopes, queues); the secrets by name."""
    made = {}
    for name, (scopes, queues) in wanted.items():
        args = [sys.executable, "-m", "pgdq", "token", "new", str(path), "--name", name]
        args += [f"--scope={s}" for s in scopes] + [f"--queue={q}" for q in queues]
        made[name] = subprocess.run(args, check=True, capture_output=True, text=True).stdout.strip()
    return made


def sign_in(url: str, secret: str) -> str:
    """The session cookie the dashboard's login form gives for the token secret, as a browser keeps it."""
    form = {"content-type": "application/x-www-form-urlencoded", "origin": url, "sec-fetch-site": "same-origin"}
    r = httpx.post(url + "/login", content=f"token={secret}", headers=form)
    assert r.status_code == 303, r.text
    return r.cookies["pgdq_token"]


def waiting_polls(api: httpx.Client) -> float:
    """The server's long polls waiting now (its /metrics)."""
    metrics = api.get("/metrics").text
    return float(next(line.split()[1] for line in metrics.splitlines() if line.startswith("pgdq_http_waiting_polls")))
