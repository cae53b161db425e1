"""pgdq serve demo: fill three queues with a day of work (orders to close
over the next 24 hours, webhooks in rate-limited channels, a nightly report
schedule, a dead letter to redrive), keep a producer and a consumer running
so the dashboard moves, and serve it all over HTTP until Ctrl-C. Uses
DATABASE_URL, or the standard PG* variables; installs pgdq there if missing
and purges the demo's own queues (pgdq_demo_*) first.

    python examples/serve_demo.py [--port 8080]     (make serve-demo runs it on a throwaway cluster)
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
from datetime import UTC, datetime, timedelta

import psycopg
import uvicorn
from pgdq import Message, Queue, install
from pgdq.http import Settings, create_app

ORDERS, WEBHOOKS, REPORTS = "pgdq_demo_orders", "pgdq_demo_webhooks", "pgdq_demo_reports"


def seed(dsn: str, keep_dead_letters: bool = False) -> None:
    """The demo's queues, emptied (their dead letters too, unless kept) and filled: a day of orders,
    webhooks in channels, a schedule, a dead letter."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        install(conn, if_not_exists=True)
    now, rng = datetime.now(UTC), random.Random(7)
    orders, webhooks, reports = (Queue(name, dsn) for name in (ORDERS, WEBHOOKS, REPORTS))
    for q in (orders, webhooks, reports):
        q.purge()
        if not keep_dead_letters:
            q.purge_dead_letters()
    peak = [now + timedelta(hours=rng.triangular(0, 24, 9)) for _ in range(1500)]
    orders.offer_many(Message(f"close-unpaid-order-{n}", {"order": n}, at) for n, at in enumerate(peak))
    orders.offer_many(Message(f"close-unpaid-order-late-{n}", {"order": n}) for n in range(5))
    (failing,) = orders.poll_many(1)
    failing.dead_letter("the payment provider declined the card (402); not retried")
    orders.set_channel("refunds", max_concurrency=1)  # one refund at a time
    refunds = (Message(f"refund-{n}", {"refund": n}, now + timedelta(minutes=5 * n), "refunds") for n in range(12))
    orders.offer_many(refunds)
    orders.schedule("reconcile-payments", "*/15 * * * *", payload={"job": "reconcile"})
    for partner, limit in (("partner-acme", 2), ("partner-globex", 1)):
        webhooks.set_channel(partner, max_concurrency=limit, min_interval=0.5)
        webhooks.offer_many(
            Message(f"{partner}-event-{n}", {"event": n}, now + timedelta(minutes=n), channel=partner)
            for n in range(40)
        )
    reports.schedule("nightly-sales", "0 2 * * *", timezone="Europe/Bucharest", payload={"report": "sales"})


def keep_busy(dsn: str, stop: threading.Event) -> None:
    """Every second offer an order due within the hour and work off what is due (so the counts move)."""
    orders, rng = Queue(ORDERS, dsn), random.Random()
    n = 0
    while not stop.wait(1.0):
        n += 1
        orders.offer(f"close-new-order-{n}", {"order": n}, datetime.now(UTC) + timedelta(seconds=rng.uniform(0, 3600)))
        for delivery in orders.poll_many(3):
            delivery.ack()


def main() -> int:
    dsn = os.environ.get("DATABASE_URL", "")
    parser = argparse.ArgumentParser(description="pgdq serve on busy demo queues")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument(
        "--keep-dead-letters",
        action="store_true",
        help="keep the queues' dead letters (python/tools/dashboard_screenshot.py's day of failures)",
    )
    args = parser.parse_args()
    port = args.port
    seed(dsn, args.keep_dead_letters)
    stop = threading.Event()
    threading.Thread(target=keep_busy, args=(dsn, stop), daemon=True).start()
    print(
        f"\nDashboard: http://127.0.0.1:{port}/   API: http://127.0.0.1:{port}/openapi.json   (Ctrl-C stops)\n",
        flush=True,
    )
    try:
        uvicorn.run(create_app(Settings(dsn=dsn)), host="127.0.0.1", port=port, log_level="warning")
    finally:
        stop.set()
    return 0


if __name__ == "__main__":
    sys.exit(main())
