"""pgdq.shard: a PL/Proxy router over 2 and 4 partitions, each a cluster of
its own: where each queue's messages live, lock tokens routed to their
message's partition, overviews merged from every partition, `pgdq shard
init` and what it refuses. (The API's own tests run through a router too:
scripts/test.sh runs them with PGDQ_TEST_SHARDS=2 and 4.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import DB, dsn, install_extension, partition_databases, recreate_database, unsharded
from pgdq import Client, Queue, shard
from pgdq.errors import InvalidArgument, StaleToken
from psycopg import sql
from test_upgrade import pgdq_cli

pytestmark = [
    pytest.mark.skipif(
        not Path("/usr/share/postgresql/15/extension/plproxy.control").exists(),
        reason="Debian postgresql-15-plproxy not installed (make deps installs it)",
    ),
    unsharded("sets up routers of its own"),
]


@dataclass
class Sharded:
    router: str  # conninfo of the router database
    partitions: list[str]  # conninfos, in order


@pytest.fixture(scope="module", params=[2, 4], ids=["2 partitions", "4 partitions"])
def sharded(request: pytest.FixtureRequest, database: str) -> Iterator[Sharded]:
    """A router database on the test cluster over `param` partition clusters, set up by `pgdq shard init`."""
    count = request.param
    partitions = partition_databases(count, f"{DB}_part{count}")  # names of our own: others may run this file
    recreate_database(f"{DB}_router{count}")
    router = dsn(f"{DB}_router{count}")
    done = pgdq_cli("shard", "init", "--router", router, "--partitions", ",".join(partitions))
    assert done.returncode == 0, done.stderr
    assert f"on {count} partitions" in done.stdout
    yield Sharded(router, partitions)


def queues_on(partition: str) -> dict[str, int]:
    """The messages of each queue stored on a partition."""
    with psycopg.connect(partition) as conn:
        return dict(conn.execute("SELECT queue, count(*) FROM dq_messages GROUP BY queue").fetchall())


def purge(router: str, names: list[str]) -> None:
    for name in names:
        with Queue(name, router) as q:
            q.purge()


def test_each_queue_lives_on_its_partition_only(sharded: Sharded) -> None:
    names = [f"tenant-{n}" for n in range(40)]
    for name in names:
        with Queue(name, sharded.router) as q:
            q.offer_many([(f"k{i}", i) for i in range(5)])
    with psycopg.connect(sharded.router) as router:
        rows = router.execute("SELECT q, dq_shard_number(q) FROM unnest(%s::text[]) AS q", (names,)).fetchall()
    owner = dict(rows)
    seen: dict[str, int] = {}
    for number, partition in enumerate(sharded.partitions):
        here = queues_on(partition)
        assert here, f"partition {number} holds no queue: the hash does not spread"
        assert all(owner[q] == number for q in here), "a queue's messages on a partition that does not own it"
        seen |= here
    assert seen == dict.fromkeys(names, 5), "every message stored once"
    purge(sharded.router, names)


def test_lock_tokens_find_their_partition(sharded: Sharded) -> None:
    names = [f"tokens-{n}" for n in range(12)]
    firsts, seconds = [], []
    for name in names:
        with Queue(name, sharded.router) as q:
            q.offer_many([("a", 1), ("b", 2)])
            first, second = q.poll_many(2)
            firsts.append(first.lock_token)
            seconds.append(second.lock_token)
    with Client(sharded.router) as client:
        assert client.ack_many(firsts) == len(names), "one batch ack across every partition"
        assert client.extend(seconds[0], 60) is not None, "a lone token finds its partition"
        with Queue(names[0], sharded.router) as q:
            assert q.poll_many(5, ack=seconds[1:]) == [], "acks of other partitions' tokens, then a poll"
        left = [s for s in client.stats() if s.queue in names]
        assert [(s.queue, s.leased) for s in left if s.leased] == [(names[0], 1)], "only one lease is left"
    purge(sharded.router, names)


def test_a_queue_takes_only_its_own_tokens_through_a_router(sharded: Sharded) -> None:
    """Tokens in their queue (1.2) through the router: the queue argument
    travels with each token to its partition."""
    names = [f"own-tokens-{n}" for n in range(8)]
    tokens = {}
    for name in names:
        with Queue(name, sharded.router) as q:
            q.offer("a", 1)
            (tokens[name],) = [d.lock_token for d in q.poll_many(1, 600)]
    with Queue(names[0], sharded.router) as q:
        assert q.ack_many(list(tokens.values())) == 1, "a batch acks only the queue's own token"
        assert q.extend(tokens[names[1]], 60) is None and not q.nack(tokens[names[1]])
        assert not q.ack(tokens[names[1]]) and not q.dead_letter(tokens[names[1]])
    with Client(sharded.router) as client:
        leased = {s.queue: s.leased for s in client.stats() if s.queue in names and s.leased}
        assert leased == dict.fromkeys(names[1:], 1), "the other queues' leases are untouched"
        assert client.ack_many([tokens[name] for name in names[1:]]) == len(names) - 1
    purge(sharded.router, names)


def test_message_ids_say_their_partition(sharded: Sharded) -> None:
    names = [f"ids-{n}" for n in range(8)]
    for name in names:
        with Queue(name, sharded.router) as q:
            q.offer_many([(f"k{i}", i) for i in range(3)])
    count = len(sharded.partitions)
    for number, partition in enumerate(sharded.partitions):
        with psycopg.connect(partition) as conn:
            ids = [row[0] for row in conn.execute("SELECT id FROM dq_messages WHERE queue LIKE 'ids-%'")]
        assert ids and all(i % count == number for i in ids)
    purge(sharded.router, names)


def test_overviews_merge_every_partition(sharded: Sharded) -> None:
    names = [f"merge-{n}" for n in range(8)]
    later = datetime.now(UTC) + timedelta(hours=1)
    for name in names:
        with Queue(name, sharded.router) as q:
            q.offer("shared-key", 1, later)
            q.schedule("nightly", "0 3 * * *")
    with Client(sharded.router) as client:
        stats = [s for s in client.stats() if s.queue in names]
        assert [s.queue for s in stats] == sorted(names) and all(s.delayed == 1 for s in stats)
        assert [s.delayed for s in client.stats(names[3])] == [1]
        assert [s.queue for s in client.schedules() if s.queue in names] == sorted(names)
        assert client.key_queues("shared-key") == sorted(names)
    for name in names:  # a dead letter each (1.3: failures over time, merged over the partitions)
        with Queue(name, sharded.router) as q:
            q.offer("dies", 1)
            (d,) = q.poll_many(1)
            d.dead_letter("gone")
    with Client(sharded.router) as client:
        an_hour_ago = datetime.now(UTC) - timedelta(hours=1)
        dead = [c for c in client.dead_counts(an_hour_ago, timedelta(hours=1)) if c.queue in names]
        assert [c.queue for c in dead] == sorted(names) and sum(c.dead for c in dead) == len(names)
        assert [c.dead for c in client.dead_counts(an_hour_ago, timedelta(hours=1), names[3])] == [1]
    for name in names:
        with Queue(name, sharded.router) as q:
            q.unschedule("nightly")
            q.purge_dead_letters()
    purge(sharded.router, names)


def test_pause_resume_and_history_through_a_router(sharded: Sharded) -> None:
    """dq_pause, dq_resume, dq_retain, dq_history and dq_history_stats (1.2)
    run on the partition owning the queue: each queue's state and records
    are its own, wherever it lives."""
    names = [f"history-{n}" for n in range(8)]
    for name in names:
        with Queue(name, sharded.router) as q:
            q.retain(3600)
            q.offer_many([("a", 1), ("b", 2)])
            assert q.pause() and not q.pause()
            assert q.poll_many(5) == [] and q.stats().paused is True
            assert q.resume() and not q.resume()
            for d in q.poll_many(5):
                d.ack()
            assert q.cancel("a") is False
    with Client(sharded.router) as client:
        assert all(s.paused is False for s in client.stats() if s.queue in names)
    for name in names:
        with Queue(name, sharded.router) as q:
            assert sorted((r.key, r.outcome, r.queue) for r in q.history()) == [
                ("a", "acked", name),
                ("b", "acked", name),
            ]
            (bucket,) = q.history_stats(datetime.now(UTC) - timedelta(hours=1), timedelta(days=1))
            assert (bucket.acked, bucket.dead, bucket.cancelled) == (2, 0, 0)
            q.retain(None)
    purge(sharded.router, names)


def test_what_operators_look_at_through_a_router(sharded: Sharded) -> None:
    """dq_deliveries, dq_delivery_of, dq_release and dq_finish_id (1.3) run on
    the partition owning the queue; dq_dead_counts merges every partition."""
    names = [f"operate-{n}" for n in range(8)]
    for name in names:
        with Queue(name, sharded.router) as q:
            q.retain(3600)
            q.offer("stuck", 1)
            q.send(2)
            stuck, keyless = sorted(q.poll_many(5), key=lambda d: d.key is None)
            (running,) = [d for d in q.deliveries("running") if d.id == stuck.id]
            assert (running.key, running.attempts) == ("stuck", 1)
            assert q.delivery_of(stuck.id) == running
            assert q.release(stuck.id)
            with pytest.raises(StaleToken):  # a released lease's token
                stuck.ack()
            assert q.finish_id(keyless.id) and not q.finish_id(keyless.id)
            assert [r.outcome for r in q.history() if r.key is None] == ["acked"]
            (again,) = q.poll_many(5)
            again.dead_letter("broken")
    with Client(sharded.router) as client:
        since = datetime.now(UTC) - timedelta(hours=1)
        dead = sum(c.dead for c in client.dead_counts(since, timedelta(days=1)) if c.queue in names)
    assert dead == len(names), "the dead letters of every partition are counted"
    for name in names:
        with Queue(name, sharded.router) as q:
            q.retain(None)
            q.purge_dead_letters()
    purge(sharded.router, names)


def test_the_command_line_refuses_an_atomic_import_through_a_router(sharded: Sharded) -> None:
    lines = '{"key": "a", "payload": 1}\n'
    atomic = subprocess.run(
        [sys.executable, "-m", "pgdq", "offer", "q", "--jsonl", "--atomic", "--dsn", sharded.router],
        input=lines,
        capture_output=True,
        text=True,
        check=False,
    )
    assert atomic.returncode == 2 and "import on the partition that owns the queue" in atomic.stderr
    with Queue("q", sharded.router) as q:
        assert q.get("a") is None, "nothing written"


def test_a_null_queue_is_refused_as_without_a_router(sharded: Sharded) -> None:
    with psycopg.connect(sharded.router) as conn, pytest.raises(psycopg.errors.NullValueNotAllowed, match="queue"):
        conn.execute("SELECT dq_offer(NULL, 'k', '1')")


def test_every_pgdq_function_has_a_route(conn: psycopg.Connection[Any]) -> None:
    names = {r[0] for r in conn.execute("SELECT proname FROM pg_proc WHERE proname ~ '^dq_[a-z]'")}
    assert names == shard.ROUTES.keys() | shard.NOT_ROUTED


def test_what_init_refuses(sharded: Sharded, tmp_path: Path) -> None:
    three = pgdq_cli("shard", "init", "--router", sharded.router, "--partitions", "a,b,c")
    assert three.returncode == 2 and "1, 2, 4, ... or 256 of them, got 3" in three.stderr
    other = pgdq_cli("shard", "init", "--router", sharded.router, "--partitions", sharded.partitions[0])
    assert other.returncode == 1 and "moving queues between partitions is not supported" in other.stderr
    with psycopg.connect(sharded.partitions[0]) as conn:
        step = conn.execute("SELECT increment_by FROM pg_sequences WHERE sequencename = 'dq_messages_id_seq'")
        assert step.fetchone() == (len(sharded.partitions),), "the refused init numbered no partition's messages"
    again = pgdq_cli("shard", "init", "--router", sharded.router, "--partitions", ",".join(sharded.partitions))
    assert again.returncode == 0, "init again with the same partitions: " + again.stderr
    recreate_database(f"{DB}_not_a_router")
    with psycopg.connect(dsn(f"{DB}_not_a_router"), autocommit=True) as c:
        install_extension(c)
    mixed = pgdq_cli("shard", "init", "--router", dsn(f"{DB}_not_a_router"), "--partitions", sharded.partitions[0])
    assert mixed.returncode == 1 and "the router database has pgdq installed itself" in mixed.stderr
    recreate_database(f"{DB}_empty")
    bare = pgdq_cli("shard", "init", "--router", dsn(f"{DB}_empty"), "--partitions", dsn(f"{DB}_empty"))
    assert bare.returncode == 1 and "pgdq is not installed" in bare.stderr
    for schema in ("bad$schema", "Mixed"):
        with psycopg.connect(sharded.router) as conn, pytest.raises(InvalidArgument, match="schema"):
            shard.init(conn, sharded.partitions, schema)


@pytest.mark.skipif(os.getuid() != 0, reason="needs a path only we can reach: as root, the servers run as postgres")
def test_init_refuses_partitions_the_router_cannot_reach(database: str) -> None:
    """A partition's conninfo that works from here but not from the router's
    server (here: a socket path in a directory only root may enter)."""
    private = Path(tempfile.mkdtemp(dir="/tmp"))  # mode 700, ours
    socket = Path(os.environ["PGHOST"]) / f".s.PGSQL.{os.environ['PGPORT']}"
    (private / socket.name).symlink_to(socket)
    recreate_database(f"{DB}_hidden")
    hidden = psycopg.conninfo.make_conninfo(host=str(private), port=os.environ["PGPORT"], dbname=f"{DB}_hidden")
    with psycopg.connect(hidden, autocommit=True) as c:
        install_extension(c)
    recreate_database(f"{DB}_lonely_router")
    refused = pgdq_cli("shard", "init", "--router", dsn(f"{DB}_lonely_router"), "--partitions", hidden)
    assert refused.returncode == 1 and "cannot reach every partition" in refused.stderr, refused.stderr
    with psycopg.connect(dsn(f"{DB}_lonely_router")) as router:
        assert not shard.is_router(router), "nothing written"
    shutil.rmtree(private)


@pytest.fixture
def caller(sharded: Sharded) -> Iterator[str]:
    """A login role of the router's cluster (allowed nothing special), dropped afterwards; its name."""
    role = f"{DB}_caller"
    with psycopg.connect(sharded.router, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))  # left by a killed run
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    yield role
    with psycopg.connect(sharded.router, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))  # its grant and user mapping
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_init_again_keeps_who_may_call_through_the_router(sharded: Sharded, caller: str) -> None:
    """Re-running init keeps the foreign server: its grants, its user mappings
    (here the caller's and ours, the one for PUBLIC dropped) and options added
    by hand; and who may run the router's functions (here dq_offer: the caller only)."""
    server, role = sql.Identifier(shard.SERVER), sql.Identifier(caller)
    with psycopg.connect(sharded.router, autocommit=True) as admin:
        admin.execute(sql.SQL("GRANT USAGE ON FOREIGN SERVER {} TO {}").format(server, role))
        admin.execute(sql.SQL("DROP USER MAPPING FOR PUBLIC SERVER {}").format(server))
        admin.execute(sql.SQL("CREATE USER MAPPING FOR {} SERVER {}").format(role, server))
        admin.execute(sql.SQL("CREATE USER MAPPING FOR CURRENT_USER SERVER {}").format(server))  # init calls too
        for (offer,) in admin.execute("SELECT oid::regprocedure::text FROM pg_proc WHERE proname = 'dq_offer'"):
            admin.execute(sql.SQL("REVOKE EXECUTE ON FUNCTION {} FROM PUBLIC").format(sql.SQL(offer)))
            admin.execute(sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(sql.SQL(offer), role))
    as_caller = psycopg.conninfo.make_conninfo(sharded.router, user=caller)
    init = ("shard", "init", "--router", sharded.router, "--partitions", ",".join(sharded.partitions))
    try:
        with Queue("grants", as_caller) as q:
            q.offer("before", 1)
        again = pgdq_cli(*init)
        assert again.returncode == 0, again.stderr
        with Queue("grants", as_caller) as q:
            q.offer("after", 2)
            assert q.get("before") is not None and q.get("after") is not None, "the caller still routes calls"
        with psycopg.connect(sharded.router, autocommit=True) as admin:
            admin.execute(sql.SQL("ALTER SERVER {} OPTIONS (ADD connection_lifetime '1800')").format(server))
        third = pgdq_cli(*init)
        assert third.returncode == 0, third.stderr
        with psycopg.connect(sharded.router) as conn:
            options = conn.execute("SELECT srvoptions FROM pg_foreign_server WHERE srvname = %s", (shard.SERVER,))
            assert "connection_lifetime=1800" in options.fetchone()[0], "an option set by hand is kept"
            mappings = conn.execute("SELECT usename FROM pg_user_mappings WHERE srvname = %s", (shard.SERVER,))
            assert {m for (m,) in mappings} == {caller, conn.info.user}, "no user mapping for PUBLIC made again"
            offer = conn.execute(
                "SELECT a.grantee::regrole::text FROM pg_proc p, aclexplode(p.proacl) a"
                " WHERE p.proname = 'dq_offer' AND a.grantee <> p.proowner"
            )
            assert {g for (g,) in offer} == {caller}, "EXECUTE on dq_offer: still the caller's only"
    finally:
        with psycopg.connect(sharded.router, autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE USER MAPPING IF NOT EXISTS FOR PUBLIC SERVER {}").format(server))
            admin.execute(sql.SQL("DROP USER MAPPING IF EXISTS FOR CURRENT_USER SERVER {}").format(server))
            options = admin.execute("SELECT srvoptions FROM pg_foreign_server WHERE srvname = %s", (shard.SERVER,))
            if "connection_lifetime=1800" in options.fetchone()[0]:
                admin.execute(sql.SQL("ALTER SERVER {} OPTIONS (DROP connection_lifetime)").format(server))
        purge(sharded.router, ["grants"])


def without_user(conninfo: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(conninfo)
    params.pop("user", None)
    return psycopg.conninfo.make_conninfo(**params)  # type: ignore[arg-type]


def test_init_warns_of_a_user_in_a_conninfo_and_takes_it_out_in_place(sharded: Sharded) -> None:
    named = pgdq_cli("shard", "init", "--router", sharded.router, "--partitions", ",".join(sharded.partitions))
    assert named.returncode == 0, named.stderr
    user = psycopg.conninfo.conninfo_to_dict(sharded.partitions[0])["user"]
    assert f"WARNING: partition 0's conninfo names user {user}: every role calling through the router" in named.stderr
    assert "user mapping" in named.stderr
    plain = [without_user(p) for p in sharded.partitions]
    try:
        unnamed = pgdq_cli("shard", "init", "--router", sharded.router, "--partitions", ",".join(plain))
        assert unnamed.returncode == 0 and "WARNING" not in unnamed.stderr, unnamed.stderr
        with psycopg.connect(sharded.router) as router:
            assert shard.partitions_of(router, ["warned"]) <= set(plain), "the same partitions, their user taken out"
        with Queue("warned", sharded.router) as q:
            q.offer("k", 1)
            assert q.get("k") is not None
    finally:
        with psycopg.connect(sharded.router, autocommit=True) as router:
            warnings = shard.init(router, sharded.partitions)  # the user back in, for the other tests
        assert [w.split(":")[0] for w in warnings] == [
            f"partition {n}'s conninfo names user {user}" for n in range(len(sharded.partitions))
        ], "shard.init returns a warning for each"
        purge(sharded.router, ["warned"])
