"""dq_wakeup from Python: an idle consumer LISTENs and wakes on offers."""

from __future__ import annotations

from typing import Any

import psycopg
from pgdq import Queue


def drain(listener: psycopg.Connection[Any]) -> list[str]:
    return [n.payload for n in listener.notifies(timeout=0.5) if n.channel == "dq_wakeup"]


def test_one_wakeup_per_statement_and_none_for_ignored(database: str, queue_name: str) -> None:
    with psycopg.connect(database, autocommit=True) as listener:
        listener.execute("LISTEN dq_wakeup")
        q = Queue(queue_name, database)
        q.offer_many([(f"k{i}", i) for i in range(100)])
        assert drain(listener) == [queue_name]
        q.offer_many([(f"k{i}", i) for i in range(100)])
        assert drain(listener) == [], "a batch that only ignores sends nothing"
        q.offer("k1", "changed")
        assert drain(listener) == [queue_name]
