"""Bearer tokens for the HTTP service: each has scopes (produce, consume,
admin) and the queues it may touch. The tokens file keeps only their SHA-256
digests; a presented token is compared with every digest in constant time."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

SCOPES = frozenset({"produce", "consume", "admin"})


@dataclass(frozen=True)
class Token:
    """One entry of the tokens file. queues: names, or "*" for every queue; expires: None for never."""

    name: str
    sha256: str
    scopes: frozenset[str]
    queues: frozenset[str]
    expires: datetime | None = None

    def expired(self, now: datetime) -> bool:
        """True if this token's expiry is at or before now."""
        return self.expires is not None and self.expires <= now

    def allows(self, scope: str, queue: str | None) -> bool:
        """True if this token may act in scope on queue (None: no one queue)."""
        if scope not in self.scopes and "admin" not in self.scopes:
            return False
        return "*" in self.queues or (queue is not None and queue in self.queues)


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def load_tokens(path: str | Path) -> list[Token]:
    """The tokens of a file {"tokens": [{"name", "sha256", "scopes", "queues"}]}; ValueError if malformed."""
    try:
        entries = json.loads(Path(path).read_text())["tokens"]
        tokens = [
            Token(
                str(e["name"]),
                str(e["sha256"]).lower(),
                frozenset(e["scopes"]),
                frozenset(e["queues"]),
                parse_expiry(e.get("expires"), f"token {e['name']!r} expires"),
            )
            for e in entries
        ]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"tokens file {path}: {e}") from e
    for t in tokens:
        if not t.scopes or not t.scopes <= SCOPES:
            raise ValueError(f"tokens file {path}: token {t.name!r} scopes must be some of {sorted(SCOPES)}")
        if len(t.sha256) != 64 or any(c not in "0123456789abcdef" for c in t.sha256):
            raise ValueError(f"tokens file {path}: token {t.name!r} sha256 must be 64 hex digits")
    return tokens


def new_token(
    name: str, scopes: list[str], queues: list[str], expires: datetime | None = None
) -> tuple[str, dict[str, object]]:
    """A new secret and its entry for the tokens file (which never holds the secret)."""
    if not scopes or not set(scopes) <= SCOPES:
        raise ValueError(f"scopes must be some of {sorted(SCOPES)}")
    secret = "pgdq_" + secrets.token_urlsafe(32)
    entry: dict[str, object] = {"name": name, "sha256": _digest(secret), "scopes": sorted(scopes)}
    entry["queues"] = queues or ["*"]
    if expires is not None:
        entry["expires"] = expires.astimezone(UTC).isoformat(timespec="seconds")
    return secret, entry


def parse_expiry(value: object, what: str) -> datetime | None:
    """An ISO 8601 time (UTC if it names no offset) or None; ValueError naming what otherwise."""
    if value is None:
        return None
    try:
        when = datetime.fromisoformat(str(value))
    except ValueError:
        raise ValueError(f"{what} must be an ISO 8601 time, not {value!r}") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def find_token(tokens: list[Token], secret: str) -> Token | None:
    """The unexpired token whose digest matches secret, comparing with each in constant time."""
    presented = _digest(secret)
    now = datetime.now(UTC)
    found = None
    for t in tokens:
        if hmac.compare_digest(presented, t.sha256):
            found = t
    return found if found is not None and not found.expired(now) else None
