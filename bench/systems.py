"""The queues under test, each driven through its public API the same way.

Every system is async (the peers' Python APIs are): `open(conninfo)` gives a
client handle in a client process; then enqueue a batch, offer one, poll a
batch, ack a batch, poll one, ack one. `setup(conninfo)` installs the
system's schema in its fresh database.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from pgdq import AsyncClient, AsyncQueue, install, shard
from pgdq._script import plain_sql, released_install_script
from psycopg import sql
from psycopg.types.json import Jsonb

QUEUE = "bench"
LEASE = timedelta(seconds=60)
LATENESS_LEAD = timedelta(seconds=2)  # W4: the first message is due this long after the offers start
LATENESS_SPREAD = timedelta(seconds=10)  # W4: messages at distinct times over this span


def lateness_times(total: int) -> list[timedelta]:
    """W4: when each of `total` messages is due, relative to now."""
    return [LATENESS_LEAD + i * LATENESS_SPREAD / total for i in range(total)]


async def collect_lateness(total: int, late: list[float], offer: Callable[[], Awaitable[None]]) -> list[float]:
    """W4 driver for an in-process worker already idling: offer, then wait until
    every message was handled (or 30 s past the last due time)."""
    await asyncio.sleep(0.5)  # consumers idle first
    await offer()
    deadline = time.monotonic() + (LATENESS_LEAD + LATENESS_SPREAD).total_seconds() + 30
    while len(late) < total and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    return late


class System:
    """Base: a psycopg AsyncConnection per client."""

    name = ""
    settings = ""  # the documented fast settings used, for the report

    def setup(self, conninfo: str) -> None:
        raise NotImplementedError

    async def open(self, conninfo: str) -> Any:
        return await psycopg.AsyncConnection.connect(conninfo, autocommit=True)

    async def close(self, handle: Any) -> None:
        await handle.close()

    async def enqueue_batch(self, h: Any, keys: list[str], payloads: list[Any]) -> None:
        raise NotImplementedError

    async def offer_one(self, h: Any, key: str, payload: Any) -> None:
        raise NotImplementedError

    async def poll_batch(self, h: Any, n: int) -> list[Any]:
        raise NotImplementedError

    async def ack_batch(self, h: Any, tokens: list[Any]) -> None:
        raise NotImplementedError

    async def poll_one(self, h: Any) -> Any | None:
        got = await self.poll_batch(h, 1)
        return got[0] if got else None

    async def ack_one(self, h: Any, token: Any) -> None:
        await self.ack_batch(h, [token])


class RawSql(System):
    """The smallest hand-written queue: one table, FOR UPDATE SKIP LOCKED,
    two round trips per drained batch. The practical ceiling of the machine."""

    name = "raw SQL"
    settings = "INSERT … SELECT unnest(keys, payloads jsonb[]); UPDATE … WHERE id IN (… SKIP LOCKED); DELETE by id"
    KEY, KEY_INDEX = "key text NOT NULL", ", UNIQUE (queue, key)"

    def setup(self, conninfo: str) -> None:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(
                f"""CREATE TABLE raw_jobs (
                       id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                       queue text NOT NULL, {self.KEY}, payload jsonb NOT NULL,
                       run_at timestamptz NOT NULL DEFAULT now(){self.KEY_INDEX})"""
            )
            conn.execute("CREATE INDEX ON raw_jobs (queue, run_at, id)")

    async def enqueue_batch(self, h: Any, keys: list[str], payloads: list[Any]) -> None:
        await h.execute(
            "INSERT INTO raw_jobs (queue, key, payload) SELECT %s, k, p"
            " FROM unnest(%s::text[], %s::jsonb[]) AS u (k, p) ON CONFLICT DO NOTHING",
            (QUEUE, keys, [Jsonb(p) for p in payloads]),
        )

    async def offer_one(self, h: Any, key: str, payload: Any) -> None:
        await h.execute(
            "INSERT INTO raw_jobs (queue, key, payload) VALUES (%s, %s, %s::jsonb) ON CONFLICT DO NOTHING",
            (QUEUE, key, json.dumps(payload)),
        )

    async def poll_batch(self, h: Any, n: int) -> list[Any]:
        cur = await h.execute(
            "UPDATE raw_jobs SET run_at = now() + %s WHERE id IN ("
            " SELECT id FROM raw_jobs WHERE queue = %s AND run_at <= now()"
            " ORDER BY run_at, id LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING id, key, payload",
            (LEASE, QUEUE, n),
        )
        return [row[0] for row in await cur.fetchall()]

    async def ack_batch(self, h: Any, tokens: list[Any]) -> None:
        await h.execute("DELETE FROM raw_jobs WHERE id = ANY(%s)", (tokens,))

    async def ack_one(self, h: Any, token: Any) -> None:
        await h.execute("DELETE FROM raw_jobs WHERE id = %s", (token,))


class RawSqlKeyless(RawSql):
    """raw SQL without keys: the same table with key NULL and no unique index
    on it, plain INSERTs. The ceiling for keyless messages (pgdq's dq_send,
    PGMQ), as raw SQL is for keyed ones."""

    name = "raw SQL keyless"
    settings = "INSERT … SELECT unnest(payloads jsonb[]), no key index; the rest as raw SQL"
    KEY, KEY_INDEX = "key text", ""  # always NULL, no index

    async def enqueue_batch(self, h: Any, keys: list[str], payloads: list[Any]) -> None:
        await h.execute(
            "INSERT INTO raw_jobs (queue, payload) SELECT %s, p FROM unnest(%s::jsonb[]) AS u (p)",
            (QUEUE, [Jsonb(p) for p in payloads]),
        )

    async def offer_one(self, h: Any, key: str, payload: Any) -> None:
        await h.execute("INSERT INTO raw_jobs (queue, payload) VALUES (%s, %s::jsonb)", (QUEUE, json.dumps(payload)))


class Pgdq(System):
    """pgdq through its Python wrapper (AsyncQueue)."""

    name = "pgdq"
    settings = "offer_many; poll_many + ack_many; poll + ack"

    def setup(self, conninfo: str) -> None:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            install(conn)

    async def open(self, conninfo: str) -> Any:
        conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
        return AsyncQueue(QUEUE, conn, lease=LEASE)

    async def close(self, h: Any) -> None:
        await h._source.close()

    async def enqueue_batch(self, h: Any, keys: list[str], payloads: list[Any]) -> None:
        await h.offer_many(list(zip(keys, payloads, strict=True)))

    async def offer_one(self, h: Any, key: str, payload: Any) -> None:
        await h.offer(key, payload)

    async def poll_batch(self, h: Any, n: int) -> list[Any]:
        return [d.lock_token for d in await h.poll_many(n)]

    async def ack_batch(self, h: Any, tokens: list[Any]) -> None:
        await h.ack_many(tokens)

    async def poll_one(self, h: Any) -> Any | None:
        d = await h.poll()
        return None if d is None else d.lock_token

    async def ack_poll_batch(self, h: Any, tokens: list[Any], n: int) -> list[Any]:
        """Ack the previous batch and poll the next in one round trip (dq_ack_poll)."""
        return [d.lock_token for d in await h.poll_many(n, ack=tokens)]

    async def ack_one(self, h: Any, token: Any) -> None:
        await h.ack(token)


class PgdqKeyless(Pgdq):
    """pgdq's keyless messages (1.2) through its Python wrapper: send_many and
    send in place of offer_many and offer; consumed as "pgdq" is."""

    name = "pgdq keyless"
    settings = "send_many; poll_many + ack_many; send; poll + ack"

    async def enqueue_batch(self, h: Any, keys: list[str], payloads: list[Any]) -> None:
        await h.send_many(payloads)

    async def offer_one(self, h: Any, key: str, payload: Any) -> None:
        await h.send(payload)


class PgdqHistory(Pgdq):
    """pgdq as "pgdq", on a queue that keeps its history (dq_retain, 1.2):
    every ack writes a record and its tallies (what W2 and W3 cost with it)."""

    name = "pgdq history"
    settings = Pgdq.settings + "; dq_retain(queue, '1 day')"

    def setup(self, conninfo: str) -> None:
        super().setup(conninfo)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute("SELECT dq_retain(%s, '1 day')", (QUEUE,))


class PgdqOlderSql(Pgdq):
    """pgdq's SQL of an earlier version through today's wrapper, acking through
    an AsyncClient: a Queue's lock-token calls pass its queue (1.2), which the
    older SQL has no signature for."""

    async def open(self, conninfo: str) -> Any:
        queue = await super().open(conninfo)
        queue.bench_client = AsyncClient(queue._source)
        return queue

    async def ack_batch(self, h: Any, tokens: list[Any]) -> None:
        await h.bench_client.ack_many(tokens)

    async def ack_one(self, h: Any, token: Any) -> None:
        await h.bench_client.ack(token)


class PgdqReleased(PgdqOlderSql):
    """A released version's SQL (sql/pgdq--VERSION.sql) through today's
    wrapper: what each change since it bought (or cost), in the same run.
    1.1.0 is what issue 39's W5 target compares with."""

    def __init__(self, version: str) -> None:
        self.version = version
        self.name = f"pgdq {version}"

    def setup(self, conninfo: str) -> None:
        with psycopg.connect(conninfo, autocommit=True) as conn, conn.transaction():
            conn.execute(released_install_script(self.version).encode())


BEFORE_CHANNELS = Path(__file__).resolve().parent / "baselines/pgdq-1.1-before-channels.sql"


class PgdqBeforeChannels(PgdqOlderSql):
    """pgdq 1.1 as it was just before channels and priority (a frozen copy of
    its SQL), through today's wrapper: what channels cost a plain queue."""

    name = "pgdq before channels"

    def setup(self, conninfo: str) -> None:
        with psycopg.connect(conninfo, autocommit=True) as conn, conn.transaction():
            conn.execute(plain_sql(BEFORE_CHANNELS.read_text(), "public").encode())


COUNTED_BY_TRIGGERS = Path(__file__).resolve().parent / "baselines/pgdq-1.3-counted-by-triggers.sql"


def install_counted_by_triggers(conninfo: str) -> None:
    """pgdq 1.3 as it was before its hot statements counted their own rows
    (a frozen copy of its SQL, every count by the triggers), into public."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(COUNTED_BY_TRIGGERS.read_text().encode())  # its own BEGIN and COMMIT


class PgdqRouted(Pgdq):
    """pgdq through a pgdq.shard router (PL/Proxy) over `partitions` databases
    of the same cluster, through today's wrapper: the cost of the hop (W10)."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.name = f"pgdq via router ({partitions})"
        self.settings = f"as pgdq, through a PL/Proxy router over {partitions} partition databases on the same server"

    def setup(self, conninfo: str) -> None:
        router = psycopg.conninfo.conninfo_to_dict(conninfo)
        partitions = []
        with psycopg.connect("dbname=postgres", autocommit=True) as admin:
            for number in range(self.partitions):
                name = f"{router['dbname']}_p{number}"
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
                admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
                # the router's server connects with the host and port it is given, not our PG*
                server = {"host": os.environ["PGHOST"], "port": os.environ["PGPORT"]}
                partition = psycopg.conninfo.make_conninfo(conninfo, dbname=name, **server)
                with psycopg.connect(partition, autocommit=True) as conn:
                    install(conn)
                partitions.append(partition)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            shard.init(conn, partitions)


class PgdqSql(System):
    """pgdq through its SQL functions directly, as a psql or JDBC user calls
    them (payloads as a jsonb[] array, every result row fetched): no wrapper."""

    name = "pgdq SQL"
    settings = "dq_offer_many(keys text[], payloads jsonb[]); dq_poll_many + dq_ack_many; dq_offer; dq_poll + dq_ack"

    def setup(self, conninfo: str) -> None:
        Pgdq().setup(conninfo)

    async def enqueue_batch(self, h: Any, keys: list[str], payloads: list[Any]) -> None:
        cur = await h.execute(
            "SELECT * FROM dq_offer_many(%s, %s::text[], %s::jsonb[])", (QUEUE, keys, [Jsonb(p) for p in payloads])
        )
        await cur.fetchall()

    async def offer_one(self, h: Any, key: str, payload: Any) -> None:
        await h.execute("SELECT dq_offer(%s, %s, %s)", (QUEUE, key, Jsonb(payload)))

    async def poll_batch(self, h: Any, n: int) -> list[Any]:
        cur = await h.execute("SELECT * FROM dq_poll_many(%s, %s, %s)", (QUEUE, n, LEASE))
        return [row[9] for row in await cur.fetchall()]  # lock_token

    async def ack_batch(self, h: Any, tokens: list[Any]) -> None:
        await h.execute("SELECT dq_ack_many(%s::uuid[])", (tokens,))

    async def poll_one(self, h: Any) -> Any | None:
        cur = await h.execute("SELECT * FROM dq_poll(%s, %s)", (QUEUE, LEASE))
        row = await cur.fetchone()
        return None if row is None else row[9]

    async def ack_one(self, h: Any, token: Any) -> None:
        await h.execute("SELECT dq_ack(%s)", (token,))


class PgdqSqlHistory(PgdqSql):
    """pgdq through its SQL functions, on a queue that keeps its history (1.2)."""

    name = "pgdq SQL history"
    settings = PgdqSql.settings + "; dq_retain(queue, '1 day')"

    def setup(self, conninfo: str) -> None:
        PgdqHistory().setup(conninfo)


class PgdqSqlKeyless(PgdqSql):
    """pgdq's keyless messages (1.2) through its SQL functions directly:
    dq_send_many and dq_send; consumed as "pgdq SQL" is."""

    name = "pgdq SQL keyless"
    settings = "dq_send_many(payloads jsonb[]); dq_poll_many + dq_ack_many; dq_send; dq_poll + dq_ack"

    async def enqueue_batch(self, h: Any, keys: list[str], payloads: list[Any]) -> None:
        cur = await h.execute("SELECT * FROM dq_send_many(%s, %s::jsonb[])", (QUEUE, [Jsonb(p) for p in payloads]))
        await cur.fetchall()

    async def offer_one(self, h: Any, key: str, payload: Any) -> None:
        await h.execute("SELECT dq_send(%s, %s)", (QUEUE, Jsonb(payload)))


class PgdqSqlByTriggers(PgdqSql):
    """As "pgdq SQL", on 1.3's SQL before its hot statements counted their
    own rows (issue 39): what counting in the statement bought, in the same run."""

    name = "pgdq SQL by triggers"

    def setup(self, conninfo: str) -> None:
        install_counted_by_triggers(conninfo)


class PgdqSqlKeylessByTriggers(PgdqSqlKeyless):
    """As "pgdq SQL keyless", on 1.3's SQL before its hot statements counted
    their own rows."""

    name = "pgdq SQL keyless by triggers"

    def setup(self, conninfo: str) -> None:
        install_counted_by_triggers(conninfo)


# PGMQ's install script (tembo-io/pgmq 1.5.1, pgmq-extension/sql/pgmq.sql): not
# shipped here; PGDQ_PGMQ_SQL names a copy, else the benchmark machines' one.
PGMQ_SQL = Path(
    os.environ.get("PGDQ_PGMQ_SQL") or Path(__file__).resolve().parent.parent.parent / "shared/peers/pgmq-1.5.1.sql"
)


class Pgmq(System):
    """PGMQ 1.5.1 (../shared/peers, installed with psql) through its SQL
    functions: send_batch / send, read + delete. A logged queue
    (pgmq.create): create_unlogged is faster but loses messages in a crash."""

    name = "PGMQ"
    settings = "pgmq.create; send_batch(jsonb[]) / send; read(vt, qty) + delete(bigint[]) / delete(bigint)"
    VT = int(LEASE.total_seconds())

    @staticmethod
    def available() -> str | None:
        """Why PGMQ cannot run here, or None."""
        return None if PGMQ_SQL.exists() else f"PGMQ skipped: no install script at {PGMQ_SQL} (set PGDQ_PGMQ_SQL)"

    def setup(self, conninfo: str) -> None:
        dbname = psycopg.conninfo.conninfo_to_dict(conninfo)["dbname"]
        subprocess.run(
            ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", str(dbname), "-f", str(PGMQ_SQL)],
            check=True,
            capture_output=True,
        )
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute("SELECT pgmq.create(%s)", (QUEUE,))

    async def enqueue_batch(self, h: Any, keys: list[str], payloads: list[Any]) -> None:
        cur = await h.execute("SELECT * FROM pgmq.send_batch(%s, %s::jsonb[])", (QUEUE, [Jsonb(p) for p in payloads]))
        await cur.fetchall()

    async def offer_one(self, h: Any, key: str, payload: Any) -> None:
        await h.execute("SELECT * FROM pgmq.send(%s, %s)", (QUEUE, Jsonb(payload)))

    async def poll_batch(self, h: Any, n: int) -> list[Any]:
        cur = await h.execute("SELECT * FROM pgmq.read(%s, %s, %s)", (QUEUE, self.VT, n))
        return [row[0] for row in await cur.fetchall()]  # msg_id

    async def ack_batch(self, h: Any, tokens: list[Any]) -> None:
        cur = await h.execute("SELECT * FROM pgmq.delete(%s, %s::bigint[])", (QUEUE, tokens))
        await cur.fetchall()

    async def ack_one(self, h: Any, token: Any) -> None:
        await h.execute("SELECT pgmq.delete(%s, %s::bigint)", (QUEUE, token))


class PgQueuer(System):
    """PgQueuer (PyPI) through its Queries API over psycopg: batch enqueue with
    lists, dequeue(batch_size) and log_jobs, as its QueueManager does."""

    name = "pgqueuer"
    settings = "Queries.enqueue(lists); dequeue(batch_size=n) + log_jobs('successful')"

    def setup(self, conninfo: str) -> None:

        from pgqueuer.queries import Queries

        async def go() -> None:
            async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
                await Queries.from_psycopg_connection(conn).install()

        asyncio.run(go())

    async def open(self, conninfo: str) -> Any:
        from pgqueuer.queries import EntrypointExecutionParameter, Queries

        conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
        queries = Queries.from_psycopg_connection(conn)
        entry = {QUEUE: EntrypointExecutionParameter(concurrency_limit=0)}
        return conn, queries, entry, uuid.uuid4()

    async def close(self, h: Any) -> None:
        await h[0].close()

    async def enqueue_batch(self, h: Any, keys: list[str], payloads: list[Any]) -> None:
        size = len(keys)
        await h[1].enqueue([QUEUE] * size, [json.dumps(p).encode() for p in payloads], [0] * size)

    async def offer_one(self, h: Any, key: str, payload: Any) -> None:
        await h[1].enqueue(QUEUE, json.dumps(payload).encode(), 0)

    async def poll_batch(self, h: Any, n: int) -> list[Any]:
        return list(await h[1].dequeue(n, h[2], h[3], None, LEASE))

    async def ack_batch(self, h: Any, tokens: list[Any]) -> None:
        if tokens:
            await h[1].log_jobs([(job, "successful", None) for job in tokens])

    def lateness(self, conninfo: str, total: int) -> list[float]:
        """W4 with pgqueuer's QueueManager (LISTEN, then sleeps until the next
        deferred job's execute_after), batch_size 10."""
        from pgqueuer import PsycopgDriver, QueueManager
        from pgqueuer.queries import Queries

        async def go() -> list[float]:
            late: list[float] = []
            async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
                qm = QueueManager(Queries(PsycopgDriver(conn)))

                @qm.entrypoint(QUEUE)
                async def noop(job: Any) -> None:
                    late.append((datetime.now(UTC) - job.execute_after).total_seconds() * 1000)

                async def offer() -> None:
                    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as producer:
                        after = lateness_times(total)
                        await Queries.from_psycopg_connection(producer).enqueue(
                            [QUEUE] * total, [b"{}"] * total, [0] * total, after
                        )

                runner = asyncio.create_task(qm.run(batch_size=10))
                await collect_lateness(total, late, offer)
                qm.shutdown.set()
                await runner
            return late

        return asyncio.run(go())


class Procrastinate(System):
    """Procrastinate (PyPI): batch_defer_async, defer_async, and the job
    manager's fetch_job / finish_job (one job per fetch, as its worker does)."""

    name = "procrastinate"
    settings = "batch_defer_async; fetch_job + finish_job(delete_job=True)"

    @staticmethod
    def _app(conninfo: str) -> Any:
        import procrastinate

        app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo, min_size=1, max_size=1))

        @app.task(name="noop", queue=QUEUE)
        async def noop(**_: Any) -> None:
            return None

        return app, noop

    def setup(self, conninfo: str) -> None:
        async def go() -> None:
            app, _ = self._app(conninfo)
            async with app.open_async():
                await app.schema_manager.apply_schema_async()

        asyncio.run(go())

    async def open(self, conninfo: str) -> Any:
        app, task = self._app(conninfo)
        await app.open_async()
        worker_id = await app.job_manager.register_worker()
        return app, task, worker_id

    async def close(self, h: Any) -> None:
        await h[0].close_async()

    async def enqueue_batch(self, h: Any, keys: list[str], payloads: list[Any]) -> None:
        await h[1].batch_defer_async(*({"p": p} for p in payloads))

    async def offer_one(self, h: Any, key: str, payload: Any) -> None:
        await h[1].defer_async(p=payload)

    async def poll_batch(self, h: Any, n: int) -> list[Any]:
        job = await h[0].job_manager.fetch_job(queues=[QUEUE], worker_id=h[2])
        return [] if job is None else [job]

    async def ack_batch(self, h: Any, tokens: list[Any]) -> None:
        from procrastinate.jobs import Status

        for job in tokens:
            await h[0].job_manager.finish_job(job, status=Status.SUCCEEDED, delete_job=True)

    def lateness(self, conninfo: str, total: int) -> list[float]:
        """W4 with procrastinate's worker: defaults (listen_notify on,
        fetch_job_polling_interval 5 s), concurrency 10."""
        import procrastinate

        async def go() -> list[float]:
            late: list[float] = []
            app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))

            @app.task(name="noop", queue=QUEUE, pass_context=True)
            async def noop(context: Any, **_: Any) -> None:
                late.append((datetime.now(UTC) - context.job.scheduled_at).total_seconds() * 1000)

            async def offer() -> None:
                now = datetime.now(UTC)
                for i, after in enumerate(lateness_times(total)):
                    await noop.configure(schedule_at=now + after).defer_async(i=i)

            async with app.open_async():
                worker = asyncio.create_task(
                    app.run_worker_async(queues=[QUEUE], concurrency=10, install_signal_handlers=False)
                )
                await collect_lateness(total, late, offer)
                worker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await worker
            return late

        return asyncio.run(go())


SYSTEMS: dict[str, System] = {
    s.name: s
    for s in (
        RawSql(),
        RawSqlKeyless(),
        Pgdq(),
        PgdqSql(),
        PgdqKeyless(),
        PgdqSqlKeyless(),
        PgdqHistory(),
        PgdqSqlHistory(),
        PgdqBeforeChannels(),
        PgdqSqlByTriggers(),
        PgdqSqlKeylessByTriggers(),
        PgdqReleased("1.0.0"),
        PgdqReleased("1.1.0"),
        Pgmq(),
        PgQueuer(),
        Procrastinate(),
    )
}
# W10 (the router's hop): chosen by name, never run by default (--systems names them)
ROUTED = {s.name: s for s in (PgdqRouted(1), PgdqRouted(2), PgdqRouted(4))}


GRAPHILE = Path(__file__).resolve().parent / "graphile"


class GraphileWorker(System):
    """graphile-worker 0.17 (npm), run by bench/graphile/client.js: addJobs
    batches, addJob singles, and its worker with localQueue batching and
    batched completion for W2 (its documented fast path), plain for W3."""

    name = "graphile-worker"
    settings = (
        "addJobs; run() with localQueue.size=500, completeJobBatchDelay=0, concurrency 10 (W2); default run() (W4)"
    )

    @staticmethod
    def _url(conninfo: str) -> str:
        params = psycopg.conninfo.conninfo_to_dict(psycopg.conninfo.make_conninfo(conninfo))
        host = params.get("host") or os.environ.get("PGHOST", "")
        port = params.get("port") or os.environ.get("PGPORT", "5432")
        user = params.get("user") or os.environ.get("PGUSER", "postgres")
        return f"postgres:///{params['dbname']}?host={host}&port={port}&user={user}"

    def _node(self, *args: Any) -> dict[str, Any]:
        out = subprocess.run(
            ["node", str(GRAPHILE / "client.js"), *map(str, args)], check=True, capture_output=True, text=True
        ).stdout
        lines = out.strip().splitlines()
        return json.loads(lines[-1]) if lines else {}

    def setup(self, conninfo: str) -> None:
        if not (GRAPHILE / "node_modules").exists():
            subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--silent"], cwd=GRAPHILE, check=True)
        self._node("setup", self._url(conninfo))

    def native(self, body: str, conninfo: str, args: tuple[Any, ...]) -> tuple[int, float, float]:
        """Run a whole client body in node: (done, start, end) on the monotonic clock."""
        url = self._url(conninfo)
        command = {
            "enqueue_part": lambda total, batch, clients, i: ("enqueue", url, total, batch, clients, i),
            "offer_singles": lambda total, clients, i: ("offer", url, total, clients, i),
            "drain_batches": lambda batch, i: ("drain", url, batch, 10),
            "drain_singles": lambda i: ("drain", url, 1, 1),
        }[body](*args)
        got = self._node(*command)
        return got["done"], got["start"], got["end"]

    def lateness(self, conninfo: str, total: int) -> list[float]:
        """W4 with graphile's own worker (default pollInterval 2 s finds future jobs)."""
        return [float(x) for x in self._node("lateness", self._url(conninfo), total)["lateness_ms"]]


SYSTEMS[GraphileWorker.name] = GraphileWorker()
