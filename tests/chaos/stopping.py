"""What the test agents share: stopping at SIGTERM."""

from __future__ import annotations

import signal
from collections.abc import Callable


def until_sigterm() -> Callable[[], bool]:
    """Catch SIGTERM from now on; a function that says whether it has arrived."""
    arrived = False

    def on_term(*_: object) -> None:
        nonlocal arrived
        arrived = True

    signal.signal(signal.SIGTERM, on_term)
    return lambda: arrived
