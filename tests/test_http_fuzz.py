"""Property-based fuzzing of pgdq serve from its own OpenAPI document
(schemathesis, each operation with valid and invalid inputs): whatever a
client sends, no 5xx and no answer outside the document (status, content
type, body schema). The document is the app's, read without a server, so
each operation is a test of its own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from http_server import Server, serve
from hypothesis import HealthCheck, given, settings
from pgdq.http import Settings, create_app
from pgdq.http._models import MAX_WAIT
from schemathesis import GenerationMode
from schemathesis.checks import positive_data_acceptance

SCHEMA = schemathesis.openapi.from_dict(create_app(Settings(dsn="")).openapi())
OPERATIONS = {op.label: op for op in (result.ok() for result in SCHEMA.get_all_operations())}


@pytest.fixture(scope="module")
def fuzzed_server(database: str) -> Iterator[Server]:
    s = serve(database)
    yield s
    s.stop()


# Valid inputs for every operation; invalid ones where there is a body to
# spoil (a path of strings has no invalid value to generate).
RUNS = [(label, GenerationMode.POSITIVE) for label in sorted(OPERATIONS)] + [
    (label, GenerationMode.NEGATIVE) for label in sorted(OPERATIONS) if OPERATIONS[label].body
]


@pytest.mark.parametrize(("label", "mode"), RUNS, ids=[f"{label} {mode.value}" for label, mode in RUNS])
def test_no_server_error_and_every_answer_documented(fuzzed_server: Server, label: str, mode: GenerationMode) -> None:
    @given(OPERATIONS[label].as_strategy(generation_mode=mode))
    @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def fuzz(case: schemathesis.Case) -> None:
        wait = case.body.get("wait") if isinstance(case.body, dict) else None
        if type(wait) in (int, float) and 0.2 < wait <= MAX_WAIT:  # type: ignore[operator]
            case.body["wait"] = 0.2  # a valid wait, shorter: long polls are tested in test_http.py
        if label == "POST /pop" and isinstance(case.body, dict):  # delay-queue's pop waits 60 s by default
            timeout = case.body.setdefault("timeout", 0.2)
            if type(timeout) in (int, float) and 0.2 < timeout <= MAX_WAIT:
                case.body["timeout"] = 0.2
        # Not positive_data_acceptance: a schema-valid request may still break
        # a rule the schema cannot state (a text with a NUL character, which
        # PostgreSQL refuses; a stale lock token, 409), and gets a 4xx for it.
        case.call_and_validate(base_url=fuzzed_server.url, timeout=30, excluded_checks=[positive_data_acceptance])

    fuzz()
