"""Waiting on state instead of sleeping: the one poll loop every test uses."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
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
