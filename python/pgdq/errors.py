"""Typed exceptions. Each carries the SQLSTATE of the server error behind it."""

from __future__ import annotations

import re

import psycopg

from ._version import VERSION


class PgdqError(Exception):
    """Base class of pgdq's exceptions."""

    sqlstate: str | None = None

    def __init__(self, message: str, sqlstate: str | None = None) -> None:
        super().__init__(message)
        if sqlstate is not None:
            self.sqlstate = sqlstate


class InvalidArgument(PgdqError, ValueError):
    """An argument broke a rule of the API (SQLSTATE 22023); nothing was written."""

    sqlstate = "22023"


class NullArgument(InvalidArgument):
    """A required argument was NULL/None (SQLSTATE 22004); nothing was written."""

    sqlstate = "22004"


class StaleToken(PgdqError):
    """The delivery is no longer current: its message was acked, nacked, updated,
    cancelled or leased again, so its lock token cannot ack, nack or extend.
    It comes from a false/NULL answer, not a server error, so sqlstate is None."""


class PayloadDecodeError(PgdqError):
    """The queue's codec could not decode a message's payload (into its
    payload_type); the codec's exception is the __cause__. Client-side, so
    sqlstate is None. Raised when reading such a delivery's payload."""


class AlreadyInstalled(PgdqError):
    """pgdq is already installed in the target schema (SQLSTATE 42710)."""

    sqlstate = "42710"


class SqlMissing(PgdqError):
    """A pgdq function this client calls is not in the schema (SQLSTATE 42883):
    pgdq is not installed there, or its SQL is older than the client (a 1.2
    Queue's lock-token calls need 1.2.0 SQL; docs/upgrading.md). Nothing was
    written; the server's error is the __cause__."""

    sqlstate = "42883"


_BY_SQLSTATE: dict[str, type[PgdqError]] = {
    "22023": InvalidArgument,
    "22004": NullArgument,
    "42710": AlreadyInstalled,
}


# The server's words for a missing pgdq function: "function dq_ack(uuid, text) does not exist"
_MISSING = re.compile(r"^function (?:.+\.)?dq_\w*\(.*\) does not exist$", re.DOTALL)

# What PL/Proxy puts before a partition's error (pgdq.shard): "public.dq_offer(7): [db] REMOTE ERROR: "
_REMOTE = re.compile(r"^[\w.]+\(\d+\): \[[^\]]*\] REMOTE ERROR: ")


def translate(error: psycopg.Error) -> Exception:
    """The pgdq exception for a server error, or the error itself if none
    fits; through a pgdq.shard router, with the partition's own message."""
    primary = _REMOTE.sub("", error.diag.message_primary or str(error), count=1)
    if error.sqlstate == SqlMissing.sqlstate and _MISSING.match(primary):
        return SqlMissing(f"{primary}: {_needs_current_sql()}")
    cls = _BY_SQLSTATE.get(error.sqlstate or "")
    if cls is None:
        return error
    return cls(primary, error.sqlstate)


def _needs_current_sql() -> str:
    """What to do when a pgdq function is missing."""
    return (
        f"this pgdq client ({VERSION}) needs pgdq's SQL {VERSION} in the schema it calls;"
        " check SELECT dq_version() there and run `pgdq upgrade` (docs/upgrading.md)"
    )
