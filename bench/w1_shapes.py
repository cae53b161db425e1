"""W1's ceiling by table shape: what a batch offer of 1,000 costs in tables
shaped from PGMQ's to pgdq's, to see which part of the gap to PGMQ each
piece of pgdq's design (a unique key, its columns, the count trigger, the
function) explains, and whether a keyed design can reach PGMQ at all.

W1's load, one client: 100 batches of 1,000 messages due now (keys "k0"
... "k99999", W1's), each batch its own transaction, into a target emptied
(and checkpointed) before each sample; the median of --rounds samples, the
targets taking turns, each round starting with the next one. Every target
is driven by one SQL statement a batch, its result rows fetched:

    pgmq                pgmq.send_batch (PGMQ 1.5.1, bench/systems.py's script)
    min keyless         INSERT into (id, queue int, payload, due_at), index (queue, due_at, id)
    min keyed           the same with key text and UNIQUE (queue, key), rows in key order
    min keyed unsorted  the same, rows in array order (batches that share keys could deadlock)
    min keyed hash      UNIQUE (queue, hash of the key) instead: not a design (collisions), a bound
    wide keyless/keyed  INSERT into a copy of dq_messages (its columns and indexes), no trigger
    wide int keyless/keyed  the same with an integer queue id in place of the name (row and indexes)
    dq raw keyless/keyed  INSERT into dq_messages itself (its count trigger)
    pgdq send_many / pgdq offer_many   the functions

    .venv/bin/python bench/w1_shapes.py [--dsn DSN] [--rounds 3] [--targets pgmq,min keyed,...]

It makes (and drops at the end) a database of its own, w1_shapes, on the
server DSN names (default: the PG* environment, e.g. `eval "$(scripts/
pgcluster.sh env bench)"` after `make bench` started that cluster).
"""

from __future__ import annotations

import argparse
import statistics
import time

import psycopg
from psycopg.types.json import Jsonb
from systems import Pgmq

DATABASE = "w1_shapes"
BATCHES, BATCH = 100, 1000
MIN_TABLE = """CREATE TABLE mini (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, queue int NOT NULL, {key}
    payload jsonb NOT NULL, due_at timestamptz NOT NULL);
    CREATE INDEX ON mini (queue, due_at, id)"""
MIN_KEY = 'key text COLLATE "C" NOT NULL,'
WIDE_TABLE = (
    "CREATE TABLE wide (LIKE dq_messages INCLUDING DEFAULTS INCLUDING IDENTITY INCLUDING INDEXES)"
    " WITH (fillfactor = 80)"
)
MIN_INSERT = (
    "INSERT INTO mini (queue, {key} payload, due_at) SELECT 7, {elem} e.p, now()"
    " FROM unnest({arrays}) AS e ({cols}) {order} RETURNING id"
)
# dq_messages with an integer queue id in place of the name, in the row and every index
WIDE_INT_TABLE = [
    "CREATE TABLE wideint (LIKE dq_messages INCLUDING DEFAULTS INCLUDING IDENTITY) WITH (fillfactor = 80)",
    "ALTER TABLE wideint DROP COLUMN queue, ADD COLUMN queue int NOT NULL",
    "ALTER TABLE wideint ADD PRIMARY KEY (id)",
    "CREATE UNIQUE INDEX ON wideint (queue, key) WHERE key IS NOT NULL",
    "CREATE INDEX ON wideint (queue, due_at, id) WITH (deduplicate_items = off) WHERE channel = '' AND priority = 0",
    "CREATE INDEX ON wideint (queue, channel, priority DESC, due_at, id) WITH (deduplicate_items = off)"
    " WHERE channel <> '' OR priority <> 0",
    "CREATE INDEX ON wideint (queue, channel, due_at) WHERE lock_token IS NOT NULL AND channel <> ''",
]
# the same, the name kept in the row beside the id (row-level security policies name it)
WIDE_ID_TABLE = [
    WIDE_INT_TABLE[0].replace("wideint", "wideid"),
    "ALTER TABLE wideid ADD COLUMN queue_id int NOT NULL",
    *(s.replace("wideint", "wideid").replace("(queue,", "(queue_id,") for s in WIDE_INT_TABLE[2:]),
]
DQ_INSERT = (
    "INSERT INTO {name} (queue, {key} payload, scheduled_at, due_at, created_at)"
    " SELECT 'w1', {elem} e.p, now(), now(), now() FROM unnest({arrays}) AS e ({cols}) {order} RETURNING id"
)
KEYED = {"key": "key,", "elem": "e.k,", "arrays": "%(k)s::text[], %(p)s::jsonb[]", "cols": "k, p"}
KEYLESS = {"key": "", "elem": "", "arrays": "%(p)s::jsonb[]", "cols": "p", "order": ""}
MIN_KEYED = ["DROP TABLE IF EXISTS mini", MIN_TABLE.format(key=MIN_KEY)]
BY_KEY = "ORDER BY e.k"

# name: (statements that make the target empty, the statement a batch runs)
TARGETS: dict[str, tuple[list[str], str]] = {
    "pgmq": (
        ["SELECT pgmq.drop_queue('w1') FROM pgmq.list_queues() WHERE queue_name = 'w1'", "SELECT pgmq.create('w1')"],
        "SELECT * FROM pgmq.send_batch('w1', %(p)s::jsonb[])",
    ),
    "min keyless": (["DROP TABLE IF EXISTS mini", MIN_TABLE.format(key="")], MIN_INSERT.format(**KEYLESS)),
    "min keyed": ([*MIN_KEYED, "CREATE UNIQUE INDEX ON mini (queue, key)"], MIN_INSERT.format(order=BY_KEY, **KEYED)),
    "min keyed unsorted": (
        [*MIN_KEYED, "CREATE UNIQUE INDEX ON mini (queue, key)"],
        MIN_INSERT.format(order="", **KEYED),
    ),
    "min keyed hash": (  # unique on a 64-bit hash of the key (collisions would refuse distinct keys)
        [*MIN_KEYED, "CREATE UNIQUE INDEX ON mini (queue, hashtextextended(key, 0))"],
        MIN_INSERT.format(order="ORDER BY hashtextextended(e.k, 0)", **KEYED),
    ),
    "wide keyless": (["DROP TABLE IF EXISTS wide", WIDE_TABLE], DQ_INSERT.format(name="wide", **KEYLESS)),
    "wide keyed": (["DROP TABLE IF EXISTS wide", WIDE_TABLE], DQ_INSERT.format(name="wide", order=BY_KEY, **KEYED)),
    "wide int keyless": (
        ["DROP TABLE IF EXISTS wideint", *WIDE_INT_TABLE],
        DQ_INSERT.format(name="wideint", **KEYLESS).replace("'w1'", "7"),
    ),
    "wide int keyed": (
        ["DROP TABLE IF EXISTS wideint", *WIDE_INT_TABLE],
        DQ_INSERT.format(name="wideint", order=BY_KEY, **KEYED).replace("'w1'", "7"),
    ),
    "wide id keyless": (
        ["DROP TABLE IF EXISTS wideid", *WIDE_ID_TABLE],
        DQ_INSERT.format(name="wideid", **KEYLESS).replace("(queue,", "(queue, queue_id,").replace("'w1',", "'w1', 7,"),
    ),
    "wide id keyed": (
        ["DROP TABLE IF EXISTS wideid", *WIDE_ID_TABLE],
        DQ_INSERT.format(name="wideid", order=BY_KEY, **KEYED)
        .replace("(queue,", "(queue, queue_id,")
        .replace("'w1',", "'w1', 7,"),
    ),
    "dq raw keyless": (["TRUNCATE dq_messages"], DQ_INSERT.format(name="dq_messages", **KEYLESS)),
    "dq raw keyed": (["TRUNCATE dq_messages"], DQ_INSERT.format(name="dq_messages", order=BY_KEY, **KEYED)),
    "pgdq send_many": (["TRUNCATE dq_messages"], "SELECT * FROM dq_send_many('w1', %(p)s)"),
    "pgdq offer_many": (["TRUNCATE dq_messages"], "SELECT * FROM dq_offer_many('w1', %(k)s, %(p)s)"),
}


def sample(conn: psycopg.Connection, target: str) -> float:
    """Messages a second of one W1 pass into target, emptied first."""
    empty, batch = TARGETS[target]
    for statement in empty:
        conn.execute(statement)
    conn.execute("CHECKPOINT")
    began = time.perf_counter()
    for b in range(BATCHES):
        keys = [f"k{k}" for k in range(b * BATCH, (b + 1) * BATCH)]
        conn.execute(batch, {"k": keys, "p": [Jsonb({"n": i}) for i in range(BATCH)]}).fetchall()
    return BATCHES * BATCH / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default="", help="the server (default: the PG* environment)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--targets", default=",".join(TARGETS))
    args = parser.parse_args()
    targets = args.targets.split(",")
    with psycopg.connect(args.dsn, dbname="postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {DATABASE}")
    try:
        with psycopg.connect(args.dsn, dbname=DATABASE, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pgdq")
            Pgmq().setup(conn.info.dsn)  # its install script, with psql
            rates: dict[str, list[float]] = {t: [] for t in targets}
            for turn in range(args.rounds):  # the targets take turns, each round starting one further on
                for t in targets[turn % len(targets) :] + targets[: turn % len(targets)]:
                    rates[t].append(sample(conn, t))
        base = statistics.median(rates["pgmq"]) if "pgmq" in rates else None
        print("| target | msg/s | / pgmq | samples |\n|---|---|---|---|")
        for t, r in rates.items():
            ratio = f"{statistics.median(r) / base:.2f}" if base else ""
            print(f"| {t} | {statistics.median(r):,.0f} | {ratio} | {', '.join(f'{x:,.0f}' for x in r)} |")
    finally:
        with psycopg.connect(args.dsn, dbname="postgres", autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")


if __name__ == "__main__":
    main()
