"""The Python API's statements (pgdq._statements) against the server's own
description of them: a statement whose rows may carry JSON values is one whose
reads tolerate JSON that Python cannot read (READS_JSON)."""

from __future__ import annotations

import re

import psycopg
import pytest
from pgdq import _statements as st

JSON_TYPES = ("json", "jsonb")


def _result_types(conn: psycopg.Connection, statement: bytes) -> list[str]:
    """The type names of statement's result columns, as the server describes it prepared."""
    numbered = iter(range(1, 100))
    query = re.sub(rb"%s", lambda _: b"$%d" % next(numbered), statement)
    conn.pgconn.prepare(b"", query)
    described = conn.pgconn.describe_prepared(b"")
    if described.status != psycopg.pq.ExecStatus.COMMAND_OK:
        raise AssertionError(f"{statement!r}: {described.error_message.decode()}")
    oids = [described.ftype(i) for i in range(described.nfields)]
    return [conn.adapters.types.get(oid).name if conn.adapters.types.get(oid) else str(oid) for oid in oids]


@pytest.mark.parametrize("method", sorted(st.statements(None)))
def test_json_comes_back_only_from_statements_read_with_tolerance(database: str, method: str) -> None:
    """Every statement the server says returns a json or jsonb column is in READS_JSON."""
    with psycopg.connect(database) as conn:
        types = _result_types(conn, st.statements(None)[method])
    if any(t in JSON_TYPES for t in types):
        assert method in st.READS_JSON, f"{method} returns {types}: its reads must tolerate unreadable JSON"
