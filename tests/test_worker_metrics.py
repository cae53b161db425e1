"""`pgdq worker --metrics-port`: a real worker process, its outcomes counted
in the Prometheus format and compared with what happened to each message."""

from __future__ import annotations

import signal
import socket
from pathlib import Path

import httpx
from http_server import free_port
from pgdq import Queue
from prometheus_client.parser import text_string_to_metric_families
from test_worker import worker_process
from waiting import PATIENCE, outstanding, wait_for

# ok: acked; retry: asks once for a retry, then acked; boom: fails twice
# (--max-attempts 2: retried after the backoff, then dead-lettered)
HANDLER = """
    import time
    from datetime import timedelta
    from pgdq import Retry
    def handler(d):
        time.sleep(0.05)
        if d.key.startswith("retry") and d.attempts == 1:
            raise Retry(timedelta(0))
        if d.key.startswith("boom"):
            raise RuntimeError("boom")
"""


def scrape(port: int) -> dict[tuple[str, ...], float]:
    """The samples of the worker's /metrics by (name, queue, outcome)."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {
        (s.name, s.labels.get("queue", ""), s.labels.get("outcome", "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_outcomes_and_durations(tmp_path: Path, database: str, queue_name: str) -> None:
    port = free_port()
    args = ("--metrics-port", str(port), "--max-attempts", "2", "--lease", "5")
    proc = worker_process(tmp_path, database, queue_name, HANDLER, *args)
    try:
        wait_for(lambda: _answers(port), "the metrics port")
        zero = scrape(port)
        assert zero[("pgdq_worker_deliveries_total", queue_name, "dead_lettered")] == 0, "every series from the start"
        with Queue(queue_name, database) as q:
            q.offer_many([("ok-1", 1), ("ok-2", 1), ("ok-3", 1), ("retry-1", 1), ("boom-1", 1)])
            wait_for(lambda: outstanding(q, "ready", "leased", "delayed") == 0, "all settled")
            assert [d.key for d in q.dead_letters()] == ["boom-1"]
        done = scrape(port)
        counts = {o: done[("pgdq_worker_deliveries_total", queue_name, o)] for o in ("handled", "retried", "failed")}
        assert counts == {"handled": 4, "retried": 1, "failed": 1}
        assert done[("pgdq_worker_deliveries_total", queue_name, "dead_lettered")] == 1
        assert done[("pgdq_worker_handler_duration_seconds_count", queue_name, "")] == 7, "every handler call timed"
        assert done[("pgdq_worker_handler_duration_seconds_sum", queue_name, "")] >= 7 * 0.05
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(PATIENCE) == 0


def _answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def test_a_port_in_use_is_a_clear_error(tmp_path: Path, database: str, queue_name: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = worker_process(tmp_path, database, queue_name, HANDLER, "--metrics-port", str(port))
        _, err = proc.communicate(timeout=PATIENCE)
    assert proc.returncode == 2 and f"--metrics-port {port}" in err.decode(), err
