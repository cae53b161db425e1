"""Bearer tokens for the HTTP service: each has scopes (produce, consume,
admin) and the queues it may touch. The tokens file keeps only their SHA-256
digests; a presented token is compared with every digest in constant time."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from pathlib import Path

SCOPES = frozenset({"produce", "consume", "admin"})


@dataclass(frozen=True)
class Token:
    """One entry of the tokens file. queues: names, or "*" for every queue."""

    name: str
    sha256: str
    scopes: frozenset[str]
    queues: frozenset[str]

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
            Token(str(e["name"]), str(e["sha256"]).lower(), frozenset(e["scopes"]), frozenset(e["queues"]))
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


def new_token(name: str, scopes: list[str], queues: list[str]) -> tuple[str, dict[str, object]]:
    """A new secret and its entry for the tokens file (which never holds the secret)."""
    if not scopes or not set(scopes) <= SCOPES:
        raise ValueError(f"scopes must be some of {sorted(SCOPES)}")
    secret = "pgdq_" + secrets.token_urlsafe(32)
    return secret, {"name": name, "sha256": _digest(secret), "scopes": sorted(scopes), "queues": queues or ["*"]}


def find_token(tokens: list[Token], secret: str) -> Token | None:
    """The token whose digest matches secret, comparing with each in constant time."""
    presented = _digest(secret)
    found = None
    for t in tokens:
        if hmac.compare_digest(presented, t.sha256):
            found = t
    return found
