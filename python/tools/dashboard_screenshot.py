"""Write the dashboard's screenshots in docs/: the overview, a queue, its
messages and one message, of `make serve-demo`'s queues (examples/serve_demo.py
seeds them) in Debian's Chromium, driven by Playwright. Before the demo
starts, its orders and webhooks queues get a day of history (retention on,
messages finished at past times by pinning the database's clock, dq.now), so
that the charts have something to show; after, one order with headers and an
earlier delivery of its key, and the reports queue in trouble (running too long,
retrying, failing, a schedule overdue).

    DATABASE_URL=... .venv/bin/python python/tools/dashboard_screenshot.py [OUT_DIR]
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
from pgdq import Queue, install
from playwright.sync_api import Page, sync_playwright

ROOT = Path(__file__).resolve().parents[2]
ORDERS, WEBHOOKS, REPORTS = "pgdq_demo_orders", "pgdq_demo_webhooks", "pgdq_demo_reports"
SHOWN_KEY = "refund-audit-4711"  # the message page's message
TRACEBACK = (  # what a Python handler's failure looks like in last_error
    "Traceback (most recent call last):\n"
    '  File "/srv/reports/pgdq/worker.py", line 412, in _run\n'
    "    await handler(delivery)\n"
    '  File "/srv/reports/handlers.py", line 31, in render_report\n'
    '    raise TimeoutError(f"warehouse query {query!r} timed out after 30 s")\n'
    "TimeoutError: warehouse query 'sales_by_region' timed out after 30 s"
)


def _free_port() -> int:
    """A port of 127.0.0.1 free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _finish(
    conn: psycopg.Connection[Any],
    queue: str,
    at: datetime,
    count: int,
    dead: int,
    rng: random.Random,
    error: str = "the partner answered 502",
) -> None:
    """count messages of queue finished at at (dead of them dead-lettered with error), each delivered a
    random lateness after it fell due and finished a random run time later, on the clock pinned at each step."""
    q = Queue(queue, conn)

    def clock(when: datetime) -> None:
        """Pin the database's clock of conn at when."""
        conn.execute("SELECT set_config('dq.now', %s, false)", (when.isoformat(),))

    for n in range(count):
        late, run = timedelta(seconds=rng.expovariate(1 / 0.8)), timedelta(seconds=rng.uniform(0.05, 1.5))
        clock(at - late - run)
        q.offer(f"seed-{at.timestamp():.0f}-{n}", {"seeded": n})
        clock(at - run)
        (delivery,) = q.poll_many(1)
        clock(at)
        delivery.dead_letter(error) if n < dead else delivery.ack()


def seed_history(dsn: str) -> None:
    """A day of history for the orders and webhooks queues (busier in the last hour), and an earlier,
    retried delivery of SHOWN_KEY."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        install(conn, if_not_exists=True)
        for queue in (ORDERS, WEBHOOKS):  # emptied first: the seeding's polls must lease its own messages
            Queue(queue, conn).purge()
            Queue(queue, conn).purge_dead_letters()
            Queue(queue, conn).retain(timedelta(days=7))
        rng, now = random.Random(11), datetime.now(UTC)
        for minutes in range(1, 60):
            at = now - timedelta(minutes=minutes, seconds=rng.uniform(0, 50))
            _finish(conn, ORDERS, at, rng.randint(3, 9), 1 if rng.random() < 0.15 else 0, rng)
            _finish(conn, WEBHOOKS, at, rng.randint(1, 5), 1 if rng.random() < 0.3 else 0, rng)
        for hours in range(1, 24):
            at = now - timedelta(hours=hours, minutes=rng.uniform(0, 50))
            _finish(conn, ORDERS, at, rng.randint(10, 40), rng.randint(0, 2), rng)
        conn.execute("SELECT set_config('dq.now', '', false)")
        earlier = Queue(ORDERS, conn)
        earlier.offer(SHOWN_KEY, {"refund": 4711, "amount": "49.90", "currency": "EUR"}, headers={"tenant": "acme"})
        (first,) = earlier.poll_many(1)
        first.nack(error="the payment provider timed out (504)")
        (second,) = earlier.poll_many(1)
        second.ack()


def seed_trouble(dsn: str) -> None:
    """The reports queue (no history) in trouble, after the demo seeded it: two reports running for
    long, three retrying with a traceback, dead letters over the last day, a schedule overdue."""
    rng, now = random.Random(5), datetime.now(UTC)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for hours in (1, 2, 5, 9, 14):
            _finish(conn, REPORTS, now - timedelta(hours=hours, minutes=rng.uniform(0, 50)), 2, 2, rng, TRACEBACK)
        conn.execute("SELECT set_config('dq.now', %s, false)", ((now - timedelta(minutes=17)).isoformat(),))
        reports = Queue(REPORTS, conn)
        reports.offer_many([(f"report-{region}", {"region": region}) for region in ("emea", "apac")])
        reports.poll_many(2, lease=3600)  # running for 17 minutes, their consumer hung
        conn.execute("SELECT set_config('dq.now', '', false)")
        reports.offer_many([(f"report-retry-{n}", {"n": n}) for n in range(3)])
        for n, delivery in enumerate(reports.poll_many(3)):
            delivery.nack(datetime.now(UTC) + timedelta(minutes=4 + 3 * n), error=TRACEBACK)
        reports.offer("report-failed", {"region": "amer"})
        (failed,) = reports.poll_many(1)
        failed.dead_letter(TRACEBACK)
        conn.execute("SELECT set_config('dq.now', %s, false)", ((now - timedelta(hours=2)).isoformat(),))
        reports.schedule("refresh", "*/30 * * * *", payload={"report": "refresh"})  # due since; nothing polls
        conn.execute("SELECT set_config('dq.now', '', false)")


def _shoot(page: Page, url: str, ready: str, out: Path) -> None:
    """Open url, wait for the selector ready, save the whole page to out."""
    page.goto(url)
    page.locator(ready).first.wait_for()
    page.screenshot(path=str(out), full_page=True)
    print(f"wrote {out}")


def main() -> int:
    """Seed history, serve the demo on a free port, save the four pages and a queue in trouble."""
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs"
    dsn = os.environ.get("DATABASE_URL", "")
    seed_history(dsn)
    port = _free_port()
    # the demo keeps the dead letters seeded with the history: the failures charted and the
    # dead-lettered of the history then agree, as they do where nobody purges them
    demo = subprocess.Popen(
        [sys.executable, str(ROOT / "examples/serve_demo.py"), "--port", str(port), "--keep-dead-letters"],
        env=os.environ,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                httpx.get(url + "/openapi.json", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        with Queue(ORDERS, dsn) as orders:
            due = datetime.now(UTC) + timedelta(hours=2)
            headers = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tenant": "acme"}
            orders.offer(SHOWN_KEY, {"refund": 4711, "amount": "49.90", "currency": "EUR"}, due, headers=headers)
            shown = next(m.id for m in orders.browse(key_prefix=SHOWN_KEY) if m.key == SHOWN_KEY)
        seed_trouble(dsn)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium")
            page = browser.new_page(viewport={"width": 1100, "height": 900}, device_scale_factor=1)
            _shoot(page, url + "/", "#throughput-chart", out / "dashboard-overview.png")
            _shoot(page, f"{url}/queues/{ORDERS}", "#minute-chart", out / "dashboard.png")
            _shoot(
                page,
                f"{url}/queues/{ORDERS}/messages?state=delayed&limit=15",
                "#messages",
                out / "dashboard-messages.png",
            )
            _shoot(page, f"{url}/queues/{ORDERS}/messages/{shown}", "#payload", out / "dashboard-message.png")
            page.goto(f"{url}/queues/{REPORTS}")
            page.locator("#retrying details summary").first.click()  # one traceback opened
            page.locator("#summary").screenshot(path=str(out / "dashboard-trouble.png"))
            print(f"wrote {out / 'dashboard-trouble.png'}")
            browser.close()
    finally:
        demo.terminate()
        demo.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
