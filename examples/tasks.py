"""An example handler module for `pgdq worker` (the worker image runs it).

    pgdq worker --queue demo --handler tasks:log_delivery             # from examples/
    pgdq worker --queue demo --handler examples/tasks.py:log_delivery # from the checkout

Offer something for it to log:

    SELECT dq_offer('demo', 'hello', '{"greeting": "hi"}');
"""

from __future__ import annotations

import logging

from pgdq import AsyncDelivery

log = logging.getLogger("tasks")


def log_delivery(delivery: AsyncDelivery) -> None:
    """Log the delivery and return: returning acks it, raising would retry it
    (the worker logs each retry at INFO and each dead letter as a WARNING,
    on the logger "pgdq.worker.delivery").

    A plain function runs in a thread of its own; an `async def` handler
    would run on the worker's event loop instead."""
    log.info("queue=%s key=%s attempt=%d payload=%r", delivery.queue, delivery.key, delivery.attempts, delivery.payload)
