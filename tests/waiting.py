"""Waiting on state instead of sleeping: the one poll loop every test uses."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

# How long a test waits for state before it fails: long enough for a slow,
# loaded machine (make test runs 3 jobs of 3 pytest workers on 2 cores); a
# test that passes never waits it out.
PATIENCE = 60.0


def wait_for(condition: Callable[[], Any], what: str, timeout: float = PATIENCE) -> Any:
    """Poll condition until it is truthy and return its value; fail naming what after timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def outstanding(queue: Any, *states: str) -> int:
    """The messages of queue in the given states, from one stats() snapshot
    (separate calls can each miss a message that moves between them)."""
    stats = queue.stats()
    return sum(getattr(stats, state) for state in states)


MARKER = "pgdq_test_marker"


def notified(listener: psycopg.Connection[Any], channel: str = "dq_wakeup") -> list[str]:
    """The payloads of the notifications on channel that listener (an
    autocommit connection) got from every transaction committed so far.
    PostgreSQL delivers notifications in commit order: listener notifies
    itself a marker, and what came before the marker is all there is (no
    window of time that a busy machine can miss)."""
    listener.execute(f"LISTEN {MARKER}")
    listener.execute(f"NOTIFY {MARKER}")
    payloads = []
    for n in listener.notifies(timeout=PATIENCE):
        if n.channel == MARKER and n.pid == listener.info.backend_pid:
            return payloads
        if n.channel == channel:
            payloads.append(n.payload)
    pytest.fail(f"timed out waiting for the notifications on {channel}")
