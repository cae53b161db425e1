"""Channels and priority through the queue API, on a real server: offers,
deliveries and dq_get carry them; limits are set, listed and removed; bad
input is a typed error with nothing written; a big channel cannot hold back
small ones; an ordered group goes one at a time. (tests/test_channels.py is
generated from this file: each test runs against both APIs.)
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pgdq import AsyncQueue, ChannelInfo, InvalidArgument, Message, NullArgument, OfferOutcome


def ago(seconds: float) -> datetime:
    return datetime.now(UTC) - timedelta(seconds=seconds)


async def test_offers_and_deliveries_carry_channel_and_priority(aq: AsyncQueue) -> None:
    assert await aq.offer("a", 1, channel="tenant-1", priority=2) is OfferOutcome.CREATED
    assert await aq.offer("a", 1, channel="tenant-1", priority=2) is OfferOutcome.IGNORED
    assert await aq.offer("a", 1, channel="tenant-2", priority=2) is OfferOutcome.UPDATED
    assert await aq.offer("a", 1, channel="tenant-2") is OfferOutcome.UPDATED, "priority 0 is another message"
    info = await aq.get("a")
    assert info is not None and (info.channel, info.priority) == ("tenant-2", 0)
    await aq.offer("b", 2)
    got = {d.key: (d.channel, d.priority) for d in await aq.poll_many(10)}
    assert got == {"a": ("tenant-2", 0), "b": (None, 0)}


async def test_offer_many_elements_carry_channel_and_priority(aq: AsyncQueue) -> None:
    results = await aq.offer_many(
        [
            Message("low", 1, ago(30), channel="c", priority=-1),
            Message("high", 2, ago(10), channel="c", priority=5),
            ("plain", 3),
            ("tuple", 4, ago(20), "c", 1),
        ]
    )
    assert [r.outcome for r in results] == [OfferOutcome.CREATED] * 4
    got = [(d.key, d.channel, d.priority) for d in await aq.poll_many(10)]
    # two groups, never leased from: the unchanneled one ("plain", due now)
    # and c, whose next message (high) is due earlier and so goes first
    assert got == [("high", "c", 5), ("plain", None, 0), ("tuple", "c", 1), ("low", "c", -1)]


async def test_channels_are_set_listed_and_removed(aq: AsyncQueue) -> None:
    await aq.set_channel("partner", max_concurrency=2, min_interval=0.5)
    await aq.set_channel("ordered", max_concurrency=1)
    await aq.set_channel("paced", min_interval=timedelta(seconds=2))
    await aq.offer("p1", 1, channel="partner")
    await aq.offer("x1", 1, channel="unlimited", scheduled_at=datetime.now(UTC) + timedelta(hours=1))
    channels = {c.channel: c for c in await aq.channels()}
    assert list(channels) == ["ordered", "paced", "partner", "unlimited"]
    assert channels["partner"] == ChannelInfo("partner", 2, timedelta(seconds=0.5), 1, 0, 0, None)
    assert channels["unlimited"] == ChannelInfo("unlimited", None, None, 0, 1, 0, None)
    (d,) = await aq.poll_many(10)
    partner = {c.channel: c for c in await aq.channels()}["partner"]
    assert (partner.ready, partner.leased, partner.last_leased_at) == (0, 1, d.lease_until - aq.lease)
    assert await aq.remove_channel("paced") is True
    assert await aq.remove_channel("paced") is False
    assert [c.channel for c in await aq.channels()] == ["ordered", "partner", "unlimited"]


@pytest.mark.parametrize(
    ("call", "error"),
    [
        ({"channel": ""}, InvalidArgument),
        ({"channel": "c" * 101}, InvalidArgument),
        ({"priority": True}, InvalidArgument),
        ({"priority": "1"}, InvalidArgument),
        ({"priority": 2**31}, InvalidArgument),
    ],
)
async def test_bad_channel_or_priority_is_a_typed_error(aq: AsyncQueue, call: dict[str, object], error: type) -> None:
    with pytest.raises(error):
        await aq.offer("k", 1, **call)  # type: ignore[arg-type]
    with pytest.raises(error):
        await aq.offer_many([Message("k", 1, **call)])  # type: ignore[arg-type]
    assert await aq.get("k") is None, "nothing written"


async def test_bad_limits_are_typed_errors(aq: AsyncQueue) -> None:
    with pytest.raises(NullArgument):
        await aq.set_channel(None, max_concurrency=1)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        await aq.set_channel("c", max_concurrency=0)
    with pytest.raises(InvalidArgument):
        await aq.set_channel("c", min_interval=-1)
    with pytest.raises(InvalidArgument):
        await aq.set_channel("c", min_interval="1s")  # type: ignore[arg-type]
    assert await aq.channels() == [], "nothing written"


async def test_a_big_channel_cannot_hold_back_small_ones(aq: AsyncQueue) -> None:
    """100,000 due messages in one channel, 5 in each of 20 others: every
    one of the 100 small ones is among the first 21 x 5 deliveries."""
    for start in range(0, 100_000, 20_000):
        await aq.offer_many(Message(f"big-{i}", i, ago(3600), channel="big") for i in range(start, start + 20_000))
    await aq.offer_many(Message(f"s{c}-{i}", i, ago(60), channel=f"small-{c}") for c in range(20) for i in range(5))
    delivered: list[str] = []
    while len(delivered) < 21 * 5:
        delivered += [d.key for d in await aq.poll_many(7)]
    small = [key for key in delivered[: 21 * 5] if key.startswith("s")]
    assert sorted(small) == sorted(f"s{c}-{i}" for c in range(20) for i in range(5))


async def test_an_ordered_group_goes_one_at_a_time_in_order(aq: AsyncQueue) -> None:
    """max_concurrency 1: an SQS-style message group, by priority then due time."""
    await aq.set_channel("order-42", max_concurrency=1)
    await aq.offer_many(
        [
            Message("paid", 1, ago(20), channel="order-42"),
            Message("created", 1, ago(30), channel="order-42"),
            Message("refund", 1, ago(5), channel="order-42", priority=1),
            Message("other-order", 1, ago(1), channel="order-43"),
        ]
    )
    seen = []
    for _ in range(3):
        batch = await aq.poll_many(10)
        seen.append([d.key for d in batch if d.channel == "order-42"])
        for d in batch:
            await d.ack()
    assert seen == [["refund"], ["created"], ["paid"]]
