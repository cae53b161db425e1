"""Words for people: counts whose nouns agree with them."""

from __future__ import annotations


def count(n: int, noun: str, plural: str | None = None) -> str:
    """n and the noun agreeing with it: 1 channel, 2 channels (plural: when not noun + s)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
