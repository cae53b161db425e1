"""Bearer tokens for the HTTP service: each has scopes (produce, consume,
admin) and the queues it may touch. The tokens file keeps only their SHA-256
digests; a presented token is compared with every digest in constant time.

The dashboard's sign-in keeps a session, not the token: NAME.UNTIL.MAC, the
token's name (base64url), when the session ends (Unix seconds) and an
HMAC-SHA256, under the server's session key, of both and the token's digest
(so it ends with the token too). It is no bearer token, the tokens file alone
cannot make one, and a changed byte is refused (hmac.compare_digest)."""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import json
import os
import secrets
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from string import hexdigits

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
    """The tokens of a file {"tokens": [{"name", "sha256", "scopes", "queues"}]} that no one but its
    owner (you or root) may write; ValueError naming the file (and the token and field) otherwise."""
    _check_private(Path(path))
    try:
        entries = json.loads(Path(path).read_text())["tokens"]
        if not isinstance(entries, list):
            raise ValueError('"tokens" must be a list')
        return [_token(e) for e in entries]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"tokens file {path}: {e}") from e


def _check_private(path: Path) -> None:
    """ValueError unless only path's owner may write it and that owner is you or root (as ssh asks)."""
    try:
        st = path.stat()
    except OSError as e:
        raise ValueError(f"tokens file {path}: {e}") from e
    if os.name != "posix":
        return
    if st.st_mode & 0o022:
        who = "others" if st.st_mode & 0o002 else "its group"
        raise ValueError(f"tokens file {path} is writable by {who} (mode {st.st_mode & 0o777:o}): chmod go-w {path}")
    if st.st_uid not in (os.getuid(), 0):
        raise ValueError(f"tokens file {path} is owned by user {st.st_uid}, not by you or root: chown it")


def _token(entry: object) -> Token:
    """One entry of the tokens file; ValueError naming the token and the field."""
    if not isinstance(entry, dict):
        raise ValueError(f"each token must be an object, not {entry!r}")
    name = entry["name"]
    if not isinstance(name, str):
        raise ValueError(f"token {name!r}: name must be a string")
    who = f"token {name!r}"
    sha256, scopes, queues = entry["sha256"], _strings(entry, "scopes", who), _strings(entry, "queues", who)
    if not isinstance(sha256, str) or len(sha256) != 64 or any(c not in hexdigits for c in sha256):
        raise ValueError(f"{who}: sha256 must be 64 hex digits")
    if not scopes or not scopes <= SCOPES:
        raise ValueError(f"{who}: scopes must be some of {sorted(SCOPES)}")
    return Token(name, sha256.lower(), scopes, queues, parse_expiry(entry.get("expires"), f"{who} expires"))


def _strings(entry: dict[str, object], field: str, who: str) -> frozenset[str]:
    """entry[field], which must be a list of strings ("orders" alone would be its letters)."""
    value = entry[field]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{who}: {field} must be a list of strings, not {value!r}")
    return frozenset(value)


def save_tokens(path: str | Path, data: dict[str, object]) -> None:
    """Write the tokens file whole: a new file readable and writable by its owner only
    (mode 0600, whatever the umask or the old file's mode), moved over the old one."""
    target = Path(path)
    fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)  # mkstemp: mode 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(data, indent=2) + "\n")
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


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


SESSION_KEY_BYTES = 32  # the least a session key given in PGDQ_SESSION_KEY may hold


def session_key(text: str | None) -> bytes:
    """The key sessions are signed with: text's bytes (at least SESSION_KEY_BYTES; ValueError
    otherwise), or without text a random key of this process (a restart signs everyone out)."""
    if not text:
        return secrets.token_bytes(SESSION_KEY_BYTES)
    if len(text.encode()) < SESSION_KEY_BYTES:
        raise ValueError(f"PGDQ_SESSION_KEY must hold at least {SESSION_KEY_BYTES} bytes (e.g. openssl rand -hex 32)")
    return text.encode()


def _session_mac(key: bytes, name: str, until: str, token: Token) -> str:
    return hmac.new(key, f"{name}.{until}.{token.sha256}".encode(), hashlib.sha256).hexdigest()


def new_session(key: bytes, token: Token, until: datetime) -> str:
    """A sign-in session of token until then, signed with key (see the module's comment)."""
    name = base64.urlsafe_b64encode(token.name.encode()).decode().rstrip("=")
    when = str(int(until.timestamp()))
    return f"{name}.{when}.{_session_mac(key, name, when, token)}"


def find_session(tokens: list[Token], key: bytes, session: str) -> Token | None:
    """The unexpired token of a session new_session made with key and that has not ended; None
    for any other value (a token, a changed byte, an ended session, a token since removed)."""
    name, _, rest = session.partition(".")
    when, _, mac = rest.partition(".")
    if not when.isdigit() or int(when) <= datetime.now(UTC).timestamp():
        return None
    try:
        who = base64.urlsafe_b64decode(name + "=" * (-len(name) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    found = None
    for t in tokens:
        if t.name == who and hmac.compare_digest(mac.encode(), _session_mac(key, name, when, t).encode()):
            found = t
    return found if found is not None and not found.expired(datetime.now(UTC)) else None
