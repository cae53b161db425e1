"""A multi-tenant webhook sender on one queue (docs/channels.md).

Three tenants share the queue "webhooks"; tenant A has a backlog of 300
webhooks, B and C a handful each. Every webhook to the partner "acme" goes
through the channel "partner-acme", whose API allows 2 calls at once and one
call every 0.25 s. The database does the bookkeeping: the worker just sends.

    python examples/tenant_webhooks.py --dsn postgresql:///app

It prints, per channel, how many webhooks went out and where in the order
the last of them went: B's and C's are all among the first deliveries
although A queued 300 before them, and acme's calls keep their pace.
"""

from __future__ import annotations

import argparse
import asyncio
from collections import defaultdict
from datetime import datetime, timedelta

from pgdq import AsyncDelivery, Message, Queue, Worker

QUEUE = "webhooks"


def enqueue(q: Queue) -> int:
    """The tenants' webhooks, and acme's limits; how many were offered."""
    q.set_channel("partner-acme", max_concurrency=2, min_interval=timedelta(seconds=0.25))
    webhooks = [Message(f"a-{i}", {"url": f"https://a.example/hook/{i}"}, channel="tenant-a") for i in range(300)]
    webhooks += [Message(f"b-{i}", {"url": f"https://b.example/hook/{i}"}, channel="tenant-b") for i in range(5)]
    webhooks += [Message(f"c-{i}", {"url": f"https://c.example/hook/{i}"}, channel="tenant-c") for i in range(5)]
    webhooks += [Message(f"acme-{i}", {"url": "https://acme.example/api"}, channel="partner-acme") for i in range(6)]
    # a password reset overtakes tenant B's routine webhooks
    webhooks.append(Message("b-password-reset", {"url": "https://b.example/reset"}, channel="tenant-b", priority=10))
    q.offer_many(webhooks)
    return len(webhooks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", required=True)
    args = parser.parse_args()
    sent: list[tuple[str, str, datetime]] = []  # (channel, key, end of its lease: its start + the lease)

    async def send(d: AsyncDelivery) -> None:
        await asyncio.sleep(0.01)  # the HTTP call
        sent.append((d.channel or "", d.key, d.lease_until))

    with Queue(QUEUE, args.dsn) as q:
        q.purge()
        total = enqueue(q)
        worker = Worker(QUEUE, send, dsn=args.dsn, concurrency=8)

        async def run_until_sent() -> None:
            task = asyncio.create_task(worker.run_async())
            while len(sent) < total:
                await asyncio.sleep(0.05)
            worker.stop()
            await task

        asyncio.run(run_until_sent())

    last: dict[str, int] = {}
    count: dict[str, int] = defaultdict(int)
    for position, (channel, _, _) in enumerate(sent, 1):
        last[channel] = position
        count[channel] += 1
    for channel in sorted(count):
        print(f"{channel}: {count[channel]} sent, the last as delivery {last[channel]} of {total}")
    acme = [when for channel, _, when in sent if channel == "partner-acme"]
    gaps = [round((b - a).total_seconds(), 3) for a, b in zip(sorted(acme), sorted(acme)[1:], strict=False)]
    print(f"partner-acme: seconds between the starts of its leases {gaps}")
    first_b = next(key for channel, key, _ in sent if channel == "tenant-b")
    print(f"tenant-b's first: {first_b}")


if __name__ == "__main__":
    main()
