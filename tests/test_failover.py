"""Losing the primary: a primary and a synchronous standby (tests/ha.py);
mid-traffic the primary and all its processes are SIGKILLed and the standby
promoted with pg_ctl, as an operator would. Producers, consumers, a `pgdq
worker` and the command line reach the pair through one multi-host conninfo
with target_session_attrs=read-write and find the new primary by themselves.

Proven: every offer whose call returned before the crash is on the new
primary or was acked; nothing acked before the crash is there again; every
message is eventually handled; every repeated delivery is explained by the
failover (its earlier delivery was never acked, or its offer was retried);
no process hung. The same run with an asynchronous standby held behind
shows that the checks catch what the lag lost, whichever it was: offers
that had returned, or acks (acked messages back), or both, counted against
the primary's own rows read the moment the clients stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import psycopg
from conftest import install_extension, unsharded
from ha import Pair

AGENTS = Path(__file__).with_name("ha_agents.py")
DB = "pgdq_ha"
KEYS = 1200  # per producer, two producers on queue "ha"
WORKER_KEYS = 400  # one producer on queue "ha-worker", handled by `pgdq worker`

pytestmark = unsharded("sets up servers of its own")

HANDLER = """
import json, os, time
def handle(d):
    with open(os.environ["PGDQ_HA_HANDLED"], "a") as f:
        f.write(json.dumps({"key": d.key, "attempt": d.attempts, "at": time.time()}) + "\\n")
"""


def spawn(tmp_path: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, str(AGENTS), *args], cwd=tmp_path)


def events(*logs: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for log in logs if log.exists() for line in log.read_text().splitlines()]


def test_failover_to_the_synchronous_standby_loses_nothing(tmp_path: Path) -> None:
    assert run_failover(tmp_path, Pair(DB)) == []


def test_the_checks_catch_what_an_asynchronous_standby_loses(tmp_path: Path) -> None:
    """The same failover, but the standby is asynchronous and held behind while
    offers and acks return: the lag loses offers that had returned, or acks
    (acked messages come back), or both, depending on what the consumers had
    reached. Each loss, counted from the primary's rows against the new
    primary's, is reported by the checks with its count; a run where the lag
    lost nothing the clients were told is done proves nothing and fails."""
    lost: dict[str, int] = {}
    broken = run_failover(tmp_path, Pair(DB, synchronous=False), lag=True, lost=lost)
    assert any(lost.values()), f"the lag lost nothing the clients had been told was done: {broken}"
    reported = {b.split(": ")[0]: int(b.split(": ")[1]) for b in broken if b.startswith(tuple(lost))}
    assert reported == {kind: count for kind, count in lost.items() if count}, broken


def run_failover(tmp_path: Path, pair: Pair, lag: bool = False, lost: dict[str, int] | None = None) -> list[str]:
    """Traffic, the primary killed, the standby promoted; the rules broken.
    lost, if given, receives what the promotion lost that the clients had
    been told was done (count_lost)."""
    try:
        with psycopg.connect(pair.primary.conninfo(DB), autocommit=True) as conn:
            install_extension(conn)
        return _run_failover(tmp_path, pair, lag, {} if lost is None else lost)
    finally:
        pair.stop()


def _run_failover(tmp_path: Path, pair: Pair, lag: bool, lost: dict[str, int]) -> list[str]:
    dsn = pair.conninfo(DB)
    (tmp_path / "ha_handler.py").write_text(HANDLER)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PGDQ_HA_HANDLED": str(tmp_path / "handled.jsonl")}
    worker_log = (tmp_path / "worker.log").open("w")  # shown when the worker breaks a rule
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pgdq",
            "worker",
            "--dsn",
            dsn,
            "--queue",
            "ha-worker",
            "--handler",
            "ha_handler:handle",
        ],
        env=env,
        stderr=worker_log,
    )
    logs = [tmp_path / f"{name}.jsonl" for name in ("p0", "p1", "pw", "c0", "c1")]
    producers = [
        spawn(tmp_path, "producer", dsn, "ha", "0", str(KEYS), str(logs[0])),
        spawn(tmp_path, "producer", dsn, "ha", str(KEYS), str(KEYS), str(logs[1])),
        spawn(tmp_path, "producer", dsn, "ha-worker", "0", str(WORKER_KEYS), str(logs[2])),
    ]
    consumers = [spawn(tmp_path, "consumer", dsn, "ha", str(log)) for log in logs[3:]]
    everyone = [*producers, *consumers, worker]
    broken: list[str] = []
    try:
        wait_for_traffic(logs, since=0)  # mid-traffic
        if lag:
            pair.signal_receiver(signal.SIGSTOP)
            wait_for_traffic(logs, since=time.time())  # offers and acks the standby has not read
        for p in everyone:  # hold the clients still while the servers change
            p.send_signal(signal.SIGSTOP)
        stopped_at = time.time()
        with psycopg.connect(pair.primary.conninfo(DB), autocommit=True) as conn:  # what the primary holds at the end
            on_old_primary = {r[0] for r in conn.execute("SELECT key FROM dq_messages WHERE queue = 'ha'")}
        pair.primary.kill()
        if lag:
            pair.signal_receiver(signal.SIGKILL)
        pair.standby.pg_ctl("promote")
        with psycopg.connect(dsn) as conn:  # the new primary, found by the conninfo
            assert conn.info.port == pair.standby.port
            on_new_primary = {r[0] for r in conn.execute("SELECT key FROM dq_messages WHERE queue = 'ha'")}
        for p in everyone:
            p.send_signal(signal.SIGCONT)
        for p in producers:
            if p.wait(60) != 0:
                broken.append(f"producer {p.pid} exited with {p.returncode}")
        with psycopg.connect(dsn, autocommit=True) as conn:
            deadline = time.monotonic() + 40
            while conn.execute("SELECT count(*) FROM dq_messages").fetchone() != (0,):
                if time.monotonic() > deadline:
                    broken.append("messages left on the new primary")
                    break
                time.sleep(0.2)
        stats = subprocess.run(
            [sys.executable, "-m", "pgdq", "stats", "--dsn", dsn, "--json"], check=False, capture_output=True
        )
        if stats.returncode != 0:
            broken.append(f"pgdq stats on the new primary: {stats.stderr.decode()}")
    finally:
        for p in everyone:
            p.send_signal(signal.SIGCONT)
            p.terminate()
        for p in everyone:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                broken.append(f"process {p.args} hung")
                p.kill()
    if [p.returncode for p in [*consumers, worker]] != [0, 0, 0]:
        broken.append("consumers and the worker did not stop cleanly after the failover")
    worker_log.close()
    if worker.returncode != 0:
        broken.append(f"the worker ({worker.returncode}) logged: {(tmp_path / 'worker.log').read_text()[-3000:]}")
    lost.update(count_lost(logs, on_old_primary, on_new_primary, stopped_at))
    return broken + check_logs(logs, on_new_primary, stopped_at, tmp_path / "handled.jsonl")


def wait_for_traffic(logs: list[Path], since: float, each: int = 20) -> None:
    """Wait until the producers of queue "ha" have logged each offers and its
    consumers each acks, all after since (a time.time())."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        recent = [e["event"] for e in events(*logs[:2], *logs[3:]) if e["at"] > since]
        if recent.count("offered") >= each and recent.count("acked") >= each:
            return
        time.sleep(0.05)
    raise AssertionError(f"fewer than {each} offers and {each} acks logged in 60 s")


def count_lost(
    logs: list[Path], on_old_primary: set[str], on_new_primary: set[str], stopped_at: float
) -> dict[str, int]:
    """What the promotion lost that a client had been told was done, from
    the rows of queue "ha" on the old primary once the clients stopped and on
    the new one, keyed by check_logs' wording: offers whose call returned and
    that the old primary held unacked (an ack that failed may have committed,
    so "unsure" counts as acked), and acks that returned before the crash of
    messages the old primary had deleted, back on the new one (their offer
    never retried)."""
    produced, consumed = events(*logs[:2]), events(*logs[3:])
    returned = {e["key"] for e in produced if e["event"] == "offered" and e["at"] < stopped_at}
    retried = {e["key"] for e in produced if e["event"] == "retried"}
    acked = {e["key"] for e in consumed if e["event"] in ("acked", "unsure")}
    acked_before = {e["key"] for e in consumed if e["event"] == "acked" and e["at"] < stopped_at}
    return {
        "offers that returned before the crash are gone": len((on_old_primary - on_new_primary) & returned - acked),
        "messages acked before the crash came back": len((on_new_primary - on_old_primary) & acked_before - retried),
    }


def check_logs(logs: list[Path], on_new_primary: set[str], stopped_at: float, handled_log: Path) -> list[str]:
    """The rules, read from the clients' logs (logs: two producers, the worker's producer, two consumers)."""
    broken = []
    produced, consumed = events(*logs[:2]), events(*logs[3:])
    offered = {e["key"] for e in produced if e["event"] == "offered"}
    retried = {e["key"] for e in produced if e["event"] == "retried"}
    acked = {e["key"] for e in consumed if e["event"] in ("acked", "unsure")}
    returned = {e["key"] for e in produced if e["event"] == "offered" and e["at"] < stopped_at}
    acked_before = {e["key"] for e in consumed if e["event"] == "acked" and e["at"] < stopped_at}
    if not returned:
        broken.append("no offer returned before the crash")
    if gone := returned - on_new_primary - acked:
        broken.append(f"offers that returned before the crash are gone: {len(gone)}")
    if back := (acked_before & on_new_primary) - retried:
        broken.append(f"messages acked before the crash came back: {len(back)}")
    if offered != {f"key-{k:05d}" for k in range(2 * KEYS)} or not offered <= acked:
        broken.append(f"{len(offered - acked)} offered messages never handled")
    if unexplained := unexplained_redeliveries(consumed, retried):
        broken.append(f"unexplained redeliveries: {len(unexplained)}")
    handled = {e["key"] for e in events(handled_log)}
    if handled != {f"key-{k:05d}" for k in range(WORKER_KEYS)}:
        broken.append(f"the worker handled {len(handled)} of {WORKER_KEYS}")
    print(
        f"\nfailover: {len(returned)} offers returned before the crash, {len(retried)} retried,"
        f" {sum(e['event'] == 'unsure' for e in consumed)} unsure acks,"
        f" {len(consumed) - len({(e['key'], e['event']) for e in consumed})} repeated events; broken: {broken}"
    )
    return broken


def unexplained_redeliveries(consumed: list[dict[str, Any]], retried: set[str]) -> list[str]:
    """Keys delivered again after a delivery whose ack returned (and whose offer was never retried)."""
    by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in consumed:
        by_key[e["key"]].append(e)
    return [
        key
        for key, history in by_key.items()
        if key not in retried
        and any(
            e["event"] == "delivered" and any(a["event"] == "acked" and a["at"] <= e["at"] for a in history)
            for e in history
        )
    ]
