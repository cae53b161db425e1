"""pgdq across several PostgreSQL servers with PL/Proxy.

    pgdq shard init --router DSN --partitions DSN,DSN,...

The router database gets the same dq_* functions as a pgdq install, written
in PL/Proxy: each call runs on the partition that owns its queue
(hashtext(queue) over N partitions, N a power of two as PL/Proxy requires).
Calls by lock token go where the token's message lives: init numbers each
partition's messages so that id mod N is the partition's number, and a token
carries its message's id. dq_stats, dq_dead_stats and dq_schedules without a
queue, and dq_key_queues, run on every partition and merge.

The router's functions are generated from partition 0's own signatures, so
they follow pgdq's SQL; ROUTES says how each one is routed and a test checks
that every dq_* function has a route. Each call through the router commits
on its partition by itself: it cannot join the caller's transaction.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from ._script import check_schema
from .errors import InvalidArgument, PgdqError
from .install import extension_schema, installed_version

log = logging.getLogger("pgdq.shard")

SERVER = "pgdq_partitions"  # the router's PL/Proxy cluster (a foreign server)
# What names a partition in its conninfo; the rest (user, password, sslmode, ...) says how to reach it
PLACE = ("host", "hostaddr", "port", "dbname", "service")

# dq_* function -> how the router runs it:
#   queue: on the partition owning the queue argument
#   token: on the partition of the lock_token's message
#   tokens: each lock token on its partition (SPLIT); the counts summed
#   ack_poll: on the queue's partition when every token is there, else acks, then a poll
#   queue_or_all: on the queue's partition, or on every one when queue is NULL (merged in order)
#   all: on every partition (merged in order)
#   any: on any one partition (no queue data)
ROUTES: dict[str, str] = {
    **dict.fromkeys(
        "dq_offer dq_offer_many dq_poll dq_poll_many dq_cancel dq_finish dq_get dq_peek dq_purge dq_next_due"
        " dq_due_hours dq_configure dq_channel_set dq_channel_remove dq_channels dq_cron_install"
        " dq_cron_uninstall dq_dead_list dq_dead_purge dq_dead_redrive dq_schedule_set dq_schedule_remove"
        " dq_send dq_send_many dq_get_id dq_cancel_id dq_finish_id dq_dead_redrive_id dq_dead_purge_id"
        " dq_pause dq_resume dq_retain dq_history dq_history_stats dq_history_bins dq_browse dq_run_now"
        " dq_deliveries dq_delivery_of dq_release".split(),
        "queue",
    ),
    **dict.fromkeys("dq_ack dq_nack dq_extend dq_dead_letter".split(), "token"),
    "dq_ack_many": "tokens",
    "dq_ack_poll": "ack_poll",
    **dict.fromkeys("dq_stats dq_dead_stats dq_schedules dq_dead_counts".split(), "queue_or_all"),
    "dq_key_queues": "all",
    **dict.fromkeys("dq_now dq_version dq_cron_next".split(), "any"),
}
# The composite types routed functions return, created on the router as the partitions have them
RESULT_TYPES = ("dq_delivery", "dq_delivery_info")
# Snapshot reads (pgdq.spark) need one server's snapshot: read each partition directly. So does
# /metrics' read of every kept queue's history (dq_history_minutes: a router has no dq_queues to
# list the queues with retention; dq_history_stats and dq_history_bins are routed by queue).
NOT_ROUTED = frozenset({"dq_read_bounds", "dq_read_messages", "dq_read_dead_letters", "dq_history_minutes"})
# The order of a merged result, as the function itself orders it
MERGED_ORDER = {
    "dq_stats": "1",
    "dq_dead_stats": "1",
    "dq_schedules": "1, 2",
    "dq_key_queues": "1",
    "dq_dead_counts": "1, 2",
}


@dataclass(frozen=True)
class Signature:
    """A pgdq function as partition 0 declares it (types qualified)."""

    name: str
    arguments: str  # with names and defaults
    result: str  # e.g. "boolean", "SETOF public.dq_delivery", "TABLE(queue text, ...)"


def init(router: psycopg.Connection[Any], partitions: Sequence[str], schema: str = "public") -> list[str]:
    """Make router route pgdq's functions in schema over partitions (conninfos,
    pgdq installed in schema on each, the same version): number each
    partition's messages, then (re)create the router's functions in one
    transaction. Running it again with the same partitions is harmless: the
    foreign server, its grants and user mappings are kept (its conninfos
    updated in place). Returns the warnings about partitions (also logged)."""
    schema = _checked(schema)
    _check_count(len(partitions))
    warnings = _warnings(partitions)
    for warning in warnings:
        log.warning("%s", warning)
    existing = _check_router(router, schema, partitions)  # before numbering: a refusal writes nothing
    signatures, types = _partition_setup(partitions, schema)
    with router.transaction():
        grants = _function_grants(router, schema)
        _drop_functions(router, schema)
        for statement in router_script(schema, partitions, signatures, types, server_exists=existing):
            router.execute(statement)
        _grant_again(router, schema, grants)
        _check_reachable(router, schema)
    return warnings


def _warnings(partitions: Sequence[str]) -> list[str]:
    """A warning for each partition whose conninfo names a user: every role then acts there as that user."""
    found = []
    for number, conninfo in enumerate(partitions):
        user = psycopg.conninfo.conninfo_to_dict(conninfo).get("user")
        if user:
            found.append(
                f"partition {number}'s conninfo names user {user}: every role calling through the router acts on"
                f" that partition as {user}, with its rights, whatever the user mappings say; leave user and"
                f" password out of the conninfos (run init again with them taken out) and"
                f" give each role (or PUBLIC) a user mapping instead: CREATE USER MAPPING FOR <role> SERVER"
                f" {SERVER} OPTIONS (user '...', password '...')"
            )
    return found


def _check_reachable(router: psycopg.Connection[Any], schema: str) -> None:
    """One call on every partition from the router's server, which connects
    with its own defaults (a conninfo without host reaches its local socket)."""
    try:
        with router.transaction():  # a savepoint: the error is ours to word
            router.execute(
                sql.SQL("SELECT count(*) FROM {}.dq__all_key_queues('pgdq-shard-init')").format(sql.Identifier(schema))
            )
    except psycopg.Error as e:
        raise PgdqError(
            "the router's server cannot reach every partition (give each conninfo its host and port"
            f" as the router's server sees them): {e}"
        ) from e


def _drop_functions(router: psycopg.Connection[Any], schema: str) -> None:
    """Drop the router's dq_* functions of an earlier init (the router holds no others: _check_router)."""
    rows = router.execute(
        "SELECT p.oid::regprocedure::text FROM pg_proc p WHERE p.pronamespace = %s::regnamespace"
        " AND p.proname ~ '^dq_'",
        (schema,),
    ).fetchall()
    for (signature,) in rows:
        router.execute(sql.SQL("DROP FUNCTION IF EXISTS {} CASCADE").format(sql.SQL(signature)))


# EXECUTE on the router's dq_* functions whose privileges were changed (proacl not NULL): name, grantee, grantable
_GRANTS = """SELECT p.proname, CASE WHEN a.grantee = 0 THEN NULL ELSE a.grantee::regrole::text END, a.is_grantable
    FROM pg_catalog.pg_proc p LEFT JOIN LATERAL pg_catalog.aclexplode(p.proacl) a ON a.privilege_type = 'EXECUTE'
    WHERE p.pronamespace = %s::regnamespace AND p.proname ~ '^dq_' AND p.proacl IS NOT NULL"""


def _function_grants(router: psycopg.Connection[Any], schema: str) -> dict[str, set[tuple[str | None, bool]]]:
    """Who may run each of the router's functions whose EXECUTE privileges were
    changed, by name: (role, None for PUBLIC; with grant option)."""
    grants: dict[str, set[tuple[str | None, bool]]] = {}
    for name, grantee, grantable in router.execute(_GRANTS, (schema,)):
        grants.setdefault(name, set())
        if grantable is not None:
            grants[name].add((grantee, grantable))
    return grants


def _grant_again(router: psycopg.Connection[Any], schema: str, grants: dict[str, set[tuple[str | None, bool]]]) -> None:
    """Give the new functions of each name in grants the EXECUTE privileges their predecessors had."""
    rows = router.execute(
        "SELECT p.oid::regprocedure::text, p.proname FROM pg_proc p"
        " WHERE p.pronamespace = %s::regnamespace AND p.proname = ANY(%s)",
        (schema, list(grants)),
    ).fetchall()
    for signature, name in rows:
        function = sql.SQL(signature)  # from the catalog, qualified and quoted as needed
        router.execute(sql.SQL("REVOKE ALL ON FUNCTION {} FROM PUBLIC").format(function))
        for grantee, grantable in grants[name]:
            router.execute(
                sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}{}").format(
                    function,
                    sql.SQL("PUBLIC") if grantee is None else sql.SQL(grantee),  # regrole text: quoted as needed
                    sql.SQL(" WITH GRANT OPTION" if grantable else ""),
                )
            )


def _checked(schema: str) -> str:
    """schema if the router's functions can name it: PL/Proxy's RUN ON and
    TARGET take no quoted identifiers, so a plain lowercase name."""
    try:
        check_schema(schema)
    except ValueError as e:
        raise InvalidArgument(str(e)) from e
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", schema):
        raise InvalidArgument(f"schema: a router needs a plain lowercase name (PL/Proxy quotes none), got {schema!r}")
    return schema


def _check_count(count: int) -> None:
    """PL/Proxy needs a power of two; token routing reads one byte of the id."""
    if count < 1 or count > 256 or count & (count - 1):
        raise InvalidArgument(f"partitions: PL/Proxy needs 1, 2, 4, ... or 256 of them, got {count}")


def _partition_setup(
    partitions: Sequence[str], schema: str
) -> tuple[list[Signature], dict[str, list[tuple[str, str]]]]:
    """Number each partition's messages; partition 0's signatures and result types' columns."""
    versions = set()
    for number, conninfo in enumerate(partitions):
        with psycopg.connect(conninfo, autocommit=True) as conn:
            version = installed_version(conn, schema)
            if version is None:
                raise PgdqError(f"partition {number} ({_safe(conninfo)}): pgdq is not installed in schema {schema}")
            versions.add(version)
            _number_messages(conn, schema, number, len(partitions))
            if number == 0:
                signatures, types = _signatures(conn, schema), _result_types(conn, schema)
    if len(versions) > 1:
        raise PgdqError(f"partitions run different pgdq versions ({', '.join(sorted(versions))}): upgrade them first")
    return signatures, types


def _number_messages(conn: psycopg.Connection[Any], schema: str, number: int, count: int) -> None:
    """From now on, this partition's new message ids are number mod count."""
    table = sql.Identifier(schema, "dq_messages")
    with conn.transaction():
        conn.execute(sql.SQL("LOCK TABLE {} IN SHARE ROW EXCLUSIVE MODE").format(table))
        row = conn.execute(
            sql.SQL(
                "SELECT greatest((SELECT max(id) FROM {t}),"
                " pg_catalog.pg_sequence_last_value(pg_catalog.pg_get_serial_sequence({name}, 'id')), 0)"
            ).format(t=table, name=sql.Literal(f"{schema}.dq_messages"))
        ).fetchone()
        assert row is not None
        after = int(row[0]) + 1
        start = after + (number - after) % count
        conn.execute(
            sql.SQL("ALTER TABLE {} ALTER COLUMN id SET INCREMENT BY {} RESTART WITH {}").format(
                table, sql.Literal(count), sql.Literal(start)
            )
        )


def _signatures(conn: psycopg.Connection[Any], schema: str) -> list[Signature]:
    """Every dq_* function of schema; PgdqError if one has no route (a pgdq bug)."""
    conn.execute("SET search_path = pg_catalog")  # so types and defaults come qualified
    rows = conn.execute(
        "SELECT p.proname, pg_get_function_arguments(p.oid), pg_get_function_result(p.oid)"
        " FROM pg_proc p WHERE p.pronamespace = %s::regnamespace AND p.proname ~ '^dq_[a-z]' ORDER BY 1",
        (schema,),
    ).fetchall()
    conn.execute("RESET search_path")
    unknown = {name for name, _, _ in rows} - ROUTES.keys() - NOT_ROUTED
    if unknown:
        raise PgdqError(f"pgdq.shard does not know how to route {', '.join(sorted(unknown))}")
    return [Signature(*row) for row in rows if row[0] in ROUTES]


def _result_types(conn: psycopg.Connection[Any], schema: str) -> dict[str, list[tuple[str, str]]]:
    """The columns, as (name, type), of each of RESULT_TYPES that schema has
    (dq_delivery_info: since 1.3), by type name."""
    rows = conn.execute(
        "SELECT t.typname, a.attname, format_type(a.atttypid, a.atttypmod)"
        " FROM pg_type t JOIN pg_attribute a ON a.attrelid = t.typrelid"
        " WHERE t.typnamespace = %s::regnamespace AND t.typname = ANY(%s)"
        " AND a.attnum > 0 AND NOT a.attisdropped ORDER BY t.typname, a.attnum",
        (schema, list(RESULT_TYPES)),
    ).fetchall()
    types: dict[str, list[tuple[str, str]]] = {}
    for type_name, name, type_ in rows:
        types.setdefault(str(type_name), []).append((str(name), str(type_)))
    return types


def _check_router(router: psycopg.Connection[Any], schema: str, partitions: Sequence[str]) -> bool:
    """The router must not hold pgdq itself, nor route to other partitions
    already; whether its foreign server exists (routing to these partitions)."""
    if (
        extension_schema(router) is not None
        or router.execute(
            "SELECT 1 FROM pg_class WHERE relname = 'dq_messages' AND relnamespace = %s::regnamespace", (schema,)
        ).fetchone()
    ):
        raise PgdqError("the router database has pgdq installed itself: give the router a database of its own")
    row = router.execute(
        "SELECT w.fdwname, s.srvoptions FROM pg_foreign_server s JOIN pg_foreign_data_wrapper w ON w.oid = s.srvfdw"
        " WHERE s.srvname = %s",
        (SERVER,),
    ).fetchone()
    if row is None:
        return False
    if row[0] != "plproxy":
        raise PgdqError(f"the router has a foreign server {SERVER} of another wrapper ({row[0]}): drop it first")
    routed = _partition_options(row[1] or [])
    if [_place(c) for c in routed] != [_place(c) for c in partitions]:
        raise PgdqError(
            "the router already routes to other partitions; moving queues between partitions is not supported"
        )
    return True


def _partition_options(options: Sequence[str]) -> list[str]:
    """The partitions' conninfos in a server's options ("p0=...", "p1=...", others ignored), in order."""
    found = {}
    for option in options:
        name, _, value = option.partition("=")
        if re.fullmatch(r"p[0-9]+", name):
            found[int(name[1:])] = value
    return [found[n] for n in sorted(found)]


def _place(conninfo: str) -> dict[str, str]:
    """What names a partition in conninfo (host, port, dbname, ...), not how to reach it (user, password, ...)."""
    params = psycopg.conninfo.conninfo_to_dict(conninfo)
    return {k: str(params[k]) for k in PLACE if params.get(k) is not None}


def _safe(conninfo: str) -> str:
    """conninfo without its password, for messages."""
    params = psycopg.conninfo.conninfo_to_dict(conninfo)
    params.pop("password", None)
    return psycopg.conninfo.make_conninfo(**params)  # type: ignore[arg-type]


def router_script(
    schema: str,
    partitions: Sequence[str],
    signatures: Sequence[Signature],
    types: Mapping[str, Sequence[tuple[str, str]]],
    server_exists: bool = False,
) -> list[sql.SQL | sql.Composed]:
    """The router's statements: PL/Proxy and its cluster, the helpers, the result types
    (dq_delivery, ...) and every routed function."""
    statements: list[sql.SQL | sql.Composed] = [
        sql.SQL("CREATE EXTENSION IF NOT EXISTS plproxy"),
        *_server_script(partitions, server_exists),
    ]
    for type_name, columns in types.items():
        name = sql.Identifier(schema, type_name)
        statements += [
            sql.SQL("DROP TYPE IF EXISTS {} CASCADE").format(name),
            sql.SQL("CREATE TYPE {} AS ({})").format(
                name, sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(n), sql.SQL(t)) for n, t in columns)
            ),
        ]
    statements += [sql.SQL(text.replace("@s@", schema).replace("@n@", str(len(partitions)))) for text in _HELPERS]
    for signature in signatures:
        statements += [sql.SQL(text.replace("@s@", schema)) for text in _functions(signature)]
    return statements


def _server_script(partitions: Sequence[str], exists: bool) -> list[sql.Composed]:
    """The cluster's foreign server: created with a user mapping for PUBLIC, or,
    when it exists, its conninfos set in place (grants and user mappings kept)."""
    server = sql.Identifier(SERVER)
    options = [(sql.Identifier(f"p{n}"), sql.Literal(c)) for n, c in enumerate(partitions)]
    if exists:
        setting = sql.SQL(", ").join(sql.SQL("SET {} {}").format(name, value) for name, value in options)
        return [sql.SQL("ALTER SERVER {} OPTIONS ({})").format(server, setting)]
    creating = sql.SQL(", ").join(sql.SQL("{} {}").format(name, value) for name, value in options)
    return [
        sql.SQL("CREATE SERVER {} FOREIGN DATA WRAPPER plproxy OPTIONS ({})").format(server, creating),
        sql.SQL("CREATE USER MAPPING FOR PUBLIC SERVER {}").format(server),
    ]


# Where a queue, a token and the partitions are; @s@ is the schema.
_HELPERS = [
    # the number of partitions: a constant (init writes it; another set of partitions is refused)
    """CREATE OR REPLACE FUNCTION @s@.dq__partition_count() RETURNS integer LANGUAGE sql IMMUTABLE
    AS $$ SELECT @n@ $$""",
    # what PL/Proxy hashes for a queue (0 for NULL: the partition then refuses it as pgdq does)
    """CREATE OR REPLACE FUNCTION @s@.dq__queue_hash(queue text) RETURNS integer LANGUAGE sql IMMUTABLE
    AS $$ SELECT coalesce(pg_catalog.hashtext(queue), 0) $$""",
    # what PL/Proxy hashes for a lock token: the low byte of its message id
    """CREATE OR REPLACE FUNCTION @s@.dq__token_hash(token uuid) RETURNS integer LANGUAGE sql IMMUTABLE
    AS $$ SELECT coalesce(pg_catalog.get_byte(pg_catalog.uuid_send(token), 7), 0) $$""",
    # the number of the partition that owns queue
    """CREATE OR REPLACE FUNCTION @s@.dq_shard_number(queue text) RETURNS integer LANGUAGE sql IMMUTABLE
    AS $$ SELECT @s@.dq__queue_hash(queue) & (@s@.dq__partition_count() - 1) $$""",
    # the conninfo of the partition that owns queue (a worker LISTENs there)
    f"""CREATE OR REPLACE FUNCTION @s@.dq_shard_partition(queue text) RETURNS text LANGUAGE sql STABLE
    AS $$ SELECT o.option_value FROM pg_catalog.pg_foreign_server s, pg_catalog.pg_options_to_table(s.srvoptions) o
        WHERE s.srvname = '{SERVER}' AND o.option_name = 'p' || @s@.dq_shard_number(queue) $$""",
]


def _proxy(name: str, target: str, arguments: str, result: str, run: str, split: str = "") -> str:
    """A PL/Proxy function name(arguments) running target on the partitions run says."""
    split_clause = f"SPLIT {split}; " if split else ""
    return (
        f"CREATE FUNCTION @s@.{name}({arguments}) RETURNS {result} LANGUAGE plproxy AS $$"
        f" CLUSTER '{SERVER}'; {split_clause}RUN ON {run}; TARGET @s@.{target}; $$"
    )


def _setof(result: str) -> str:
    return result if result.startswith(("SETOF ", "TABLE(")) else f"SETOF {result}"


def _parameters(arguments: str) -> str:
    """$1, $2, ...: one for each argument of arguments (pg_get_function_arguments:
    a comma inside a quoted or bracketed default is not a separator)."""
    count, depth, quoted = 1, 0, False
    for char in arguments:
        if char in "'\"":
            quoted = not quoted
        elif not quoted and char in "([":
            depth += 1
        elif not quoted and char in ")]":
            depth -= 1
        elif not quoted and not depth and char == ",":
            count += 1
    return ", ".join(f"${n}" for n in range(1, count + 1))


def _functions(f: Signature) -> list[str]:
    """The router's statements for one pgdq function."""
    route, args, result = ROUTES[f.name], f.arguments, f.result
    if route == "queue":
        return [_proxy(f.name, f.name, args, result, "@s@.dq__queue_hash(queue)")]
    if route == "token":
        return [_proxy(f.name, f.name, args, result, "@s@.dq__token_hash(lock_token)")]
    if route == "any":
        return [_proxy(f.name, f.name, args, result, "ANY")]
    bare = f.name.removeprefix("dq_")
    if route == "tokens":
        params = _parameters(args)  # every argument, the queue of 1.2 too
        return [
            _proxy(f"dq__split_{bare}", f.name, args, _setof(result), "@s@.dq__token_hash(lock_tokens)", "lock_tokens"),
            _proxy(f"dq__any_{bare}", f.name, args, result, "ANY"),
            f"""CREATE FUNCTION @s@.{f.name}({args}) RETURNS {result} LANGUAGE sql VOLATILE AS $$
            SELECT CASE WHEN $1 IS NULL THEN @s@.dq__any_{bare}({params})
                ELSE (SELECT coalesce(sum(n), 0)::{result} FROM @s@.dq__split_{bare}({params}) AS n) END $$""",
        ]
    if route == "ack_poll":
        return [
            _proxy(f"dq__one_{bare}", f.name, args, result, "@s@.dq__queue_hash(queue)"),
            f"""CREATE FUNCTION @s@.{f.name}({args}) RETURNS {result} LANGUAGE plpgsql VOLATILE AS $$
            BEGIN
                IF $1 IS NULL OR NOT EXISTS (
                    SELECT FROM pg_catalog.unnest($1) AS t (token)
                    WHERE @s@.dq__token_hash(t.token) & (@s@.dq__partition_count() - 1) <> @s@.dq_shard_number($2)
                ) THEN
                    RETURN QUERY SELECT * FROM @s@.dq__one_{bare}($1, $2, $3, $4);
                ELSE  -- tokens of other partitions: ack each where it is, then poll
                    PERFORM @s@.dq_ack_many($1);
                    RETURN QUERY SELECT * FROM @s@.dq_poll_many($2, $3, $4);
                END IF;
            END $$""",
        ]
    order, params = MERGED_ORDER[f.name], _parameters(args)
    merged = [_proxy(f"dq__all_{bare}", f.name, args, _setof(result), "ALL")]
    if route == "all":
        return [
            *merged,
            f"""CREATE FUNCTION @s@.{f.name}({args}) RETURNS {result} LANGUAGE sql STABLE AS $$
            SELECT * FROM @s@.dq__all_{bare}({params}) ORDER BY {order} $$""",
        ]
    assert route == "queue_or_all", route  # the queue is the first argument
    return [
        *merged,
        _proxy(f"dq__one_{bare}", f.name, args, result, "@s@.dq__queue_hash(queue)"),
        f"""CREATE FUNCTION @s@.{f.name}({args}) RETURNS {result} LANGUAGE sql STABLE AS $$
        SELECT * FROM @s@.dq__all_{bare}({params}) WHERE $1 IS NULL
        UNION ALL
        SELECT * FROM @s@.dq__one_{bare}({params}) WHERE $1 IS NOT NULL
        ORDER BY {order} $$""",
    ]


# Is this database a router? (its one parameter: the schema)
IS_ROUTER = "SELECT pg_catalog.to_regproc(pg_catalog.quote_ident(%s) || '.dq_shard_partition') IS NOT NULL"


def owners_statement(schema: str) -> sql.Composed:
    """The conninfos of the partitions owning the queues of its one parameter (text[]), on a router."""
    return sql.SQL("SELECT DISTINCT {}.dq_shard_partition(q) FROM pg_catalog.unnest(%s::text[]) AS q").format(
        sql.Identifier(schema)
    )


def is_router(conn: psycopg.Connection[Any], schema: str = "public") -> bool:
    """Whether conn's database is a pgdq.shard router (for schema)."""
    found = conn.execute(IS_ROUTER, (schema,)).fetchone()
    return bool(found and found[0])


def partitions_of(conn: psycopg.Connection[Any], queues: Sequence[str], schema: str = "public") -> set[str] | None:
    """The conninfos of the partitions owning queues when conn is a router, else None."""
    if not is_router(conn, schema):
        return None
    return {str(row[0]) for row in conn.execute(owners_statement(schema), (list(queues),))}


# Every partition's conninfo on a router, in order (its one parameter: the server's name)
EVERY_PARTITION = """SELECT o.option_value FROM pg_catalog.pg_foreign_server s,
    pg_catalog.pg_options_to_table(s.srvoptions) o
    WHERE s.srvname = %s AND o.option_name ~ '^p[0-9]+$' ORDER BY substr(o.option_name, 2)::integer"""


async def wakeup_sources(dsn: str, schema: str, queues: Sequence[str] | None) -> list[str]:
    """Where the wake-ups (LISTEN dq_wakeup) of queues are raised: [dsn], or when
    dsn is a router, the partitions owning queues (None: every partition), as
    conninfos with dsn's credentials."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        found = await (await conn.execute(IS_ROUTER, (schema,))).fetchone()
        if not (found and found[0]):
            return [dsn]
        if queues is None:
            cursor = await conn.execute(EVERY_PARTITION, (SERVER,))
        else:
            cursor = await conn.execute(owners_statement(schema), (list(queues),))
        rows = await cursor.fetchall()
    return [with_credentials(str(row[0]), dsn) for row in rows]


def with_credentials(partition: str, dsn: str) -> str:
    """A partition's conninfo (as the router reaches it) with dsn's user and
    password where it names none: how a client of the router reaches it."""
    own = psycopg.conninfo.conninfo_to_dict(partition)
    given = psycopg.conninfo.conninfo_to_dict(dsn)
    extra = {k: given[k] for k in ("user", "password") if k in given and k not in own}
    return psycopg.conninfo.make_conninfo(partition, **extra)
