"""Property tests: dq_offer and dq_offer_many against a tiny in-memory model
of the api-v1 outcome rules, on random sequences of offers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from conftest import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pgdq import OfferOutcome, Queue

NOW = datetime(2024, 1, 1, 10, 0, tzinfo=UTC)
TIMES = [None, NOW, NOW + timedelta(minutes=1), NOW - timedelta(minutes=1)]

Offer = tuple[str, int, datetime | None]


class Model:
    """api-v1's offer rules over a dict key -> (payload, scheduled_at)."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[int, datetime]] = {}

    def offer(self, key: str, payload: int, at: datetime | None, can_update: bool) -> OfferOutcome:
        stored = self.rows.get(key)
        if stored is None:
            self.rows[key] = (payload, at or NOW)
            return OfferOutcome.CREATED
        if not can_update:
            return OfferOutcome.IGNORED
        if stored[0] == payload and (at is None or at == stored[1]):
            return OfferOutcome.IGNORED
        self.rows[key] = (payload, at or NOW)
        return OfferOutcome.UPDATED


offers = st.lists(
    st.tuples(st.sampled_from("abc"), st.integers(0, 2), st.sampled_from(TIMES)),
    min_size=1,
    max_size=8,
)
steps = st.lists(st.tuples(st.booleans(), st.booleans(), offers), min_size=1, max_size=5)


@pytest.fixture(scope="module")
def pinned(database: str) -> Any:
    """A connection whose clock is pinned to NOW."""
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("SELECT set_config('dq.now', %s, false)", (NOW.isoformat(),))
        yield conn


@settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(steps=steps)
def test_offers_follow_the_model(pinned: psycopg.Connection[Any], steps: list[tuple[bool, bool, list[Offer]]]) -> None:
    batch_q = Queue("prop_batch", pinned)
    single_q = Queue("prop_single", pinned)
    batch_q.purge()
    single_q.purge()
    model = Model()
    for as_batch, can_update, batch in steps:
        expected = [model.offer(k, p, at, can_update) for k, p, at in batch]
        if as_batch:
            got = [r.outcome for r in batch_q.offer_many(batch, can_update=can_update)]
        else:
            got = [batch_q.offer(k, p, at, can_update=can_update) for k, p, at in batch]
        singles = [single_q.offer(k, p, at, can_update=can_update) for k, p, at in batch]
        assert got == expected, batch
        assert singles == expected, batch
    for q in (batch_q, single_q):
        stored = {}
        for key in "abc":
            info = q.get(key)
            if info is not None:
                stored[key] = (info.payload, info.scheduled_at)
        assert stored == model.rows
