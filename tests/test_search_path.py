"""Nothing a role plants in pgdq's schema is ever called by pgdq.

PostgreSQL prefers an exact-type overload in any schema on search_path to a
polymorphic built-in in pg_catalog, and any overload of pgdq's own functions in
pgdq's schema competes with them. 1.0.0 pinned `pg_catalog, <pgdq schema>,
pg_temp`, so a role allowed to CREATE in that schema (the `public` schema of
clusters created before PostgreSQL 15) planted `public.cardinality(text[])`
and became superuser on a superuser's next dq_offer_many. Here an attacker
plants, in pgdq's schema, an exact-type twin of every polymorphic built-in
pgdq uses, neighbours of every built-in and every pgdq function (the same
signature with one argument of a close type: varchar for text, bigint for
integer, …), operators on the types pgdq combines, and an array_agg; then a
superuser runs every pgdq function, and no planted object may run.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from conftest import DB, dsn, install_extension, recreate_database
from psycopg import sql

ATTACKER = "pgdq_planter"
PLANTED_DB = f"{DB}_planted"
# Concrete types put in place of polymorphic arguments: what pgdq passes around.
CONCRETE = ("text", "bigint", "integer", "uuid", "jsonb", "timestamptz", "interval", "boolean")
# Close types that an argument of each type might be confused with.
NEIGHBOURS = {
    "text": ("varchar", "name", "unknown_text"),
    "integer": ("bigint", "smallint", "numeric"),
    "bigint": ("integer", "numeric"),
    "timestamp with time zone": ("timestamp", "date"),
    "interval": ("text",),
    "jsonb": ("json", "text"),
    "uuid": ("text",),
    "boolean": ("integer",),
    "text[]": ("varchar[]", "name[]"),
    "jsonb[]": ("json[]", "text[]"),
    "timestamp with time zone[]": ("timestamp[]",),
    "uuid[]": ("text[]",),
}
# Operators pgdq's bodies use, on the pairs of types they combine.
OPERATOR_PAIRS = {
    "||": [
        ("text[]", "text[]"),
        ("text[]", "text"),
        ("text", "text[]"),
        ("jsonb[]", "jsonb[]"),
        ("bigint[]", "bigint[]"),
        ("bigint[]", "bigint"),
        ("integer[]", "integer"),
        ("integer[]", "integer[]"),
        ("text", "text"),
        ("uuid[]", "uuid[]"),
        ("timestamptz[]", "timestamptz[]"),
        ("text", "integer"),
        ("text", "bigint"),
    ],
    "=": [
        ("text", "text"),
        ("bigint", "bigint"),
        ("uuid", "uuid"),
        ("timestamptz", "timestamptz"),
        ("jsonb", "jsonb"),
        ("integer", "integer"),
        ("bigint", "integer"),
        ("text[]", "text[]"),
        ("name", "text"),
    ],
    "<": [
        ("timestamptz", "timestamptz"),
        ("integer", "integer"),
        ("bigint", "bigint"),
        ("text", "text"),
        ("interval", "interval"),
    ],
    "<=": [("timestamptz", "timestamptz"), ("integer", "integer"), ("interval", "interval")],
    ">": [("timestamptz", "timestamptz"), ("integer", "integer"), ("bigint", "bigint"), ("interval", "interval")],
    ">=": [("timestamptz", "timestamptz"), ("integer", "integer")],
    "+": [("timestamptz", "interval"), ("integer", "integer"), ("bigint", "bigint"), ("timestamp", "interval")],
    "-": [("timestamptz", "interval"), ("timestamptz", "timestamptz"), ("integer", "integer")],
    "<>": [("text", "text"), ("integer", "integer"), ("jsonb", "jsonb")],
    "@>": [("text[]", "text[]"), ("jsonb", "jsonb")],
}

Conn = psycopg.Connection[Any]


@pytest.fixture
def victim(database: str) -> Iterator[Conn]:
    """A database of its own with pgdq in public, where ATTACKER may CREATE;
    a superuser connection to it."""
    recreate_database(PLANTED_DB)
    with psycopg.connect(dsn(PLANTED_DB), autocommit=True) as su:
        install_extension(su)
        su.execute(f"DROP ROLE IF EXISTS {ATTACKER}")
        su.execute(f"CREATE ROLE {ATTACKER} NOLOGIN")
        su.execute(f"GRANT CREATE, USAGE ON SCHEMA public TO {ATTACKER}")
        su.execute("CREATE TABLE public.planted_calls (what text NOT NULL)")
        su.execute("GRANT INSERT ON public.planted_calls TO PUBLIC")
        yield su
    recreate_database(PLANTED_DB)
    with psycopg.connect(dsn("postgres"), autocommit=True) as admin:
        admin.execute(f"DROP ROLE IF EXISTS {ATTACKER}")


@pytest.fixture
def planted(victim: Conn) -> Conn:
    """victim, once ATTACKER has planted everything plant() lists."""
    victim.execute(f"SET ROLE {ATTACKER}")
    with victim.transaction():
        plant(victim)
    victim.execute("RESET ROLE")
    return victim


def plant_escalation(conn: Conn) -> None:
    """The review's finding: public.cardinality(text[]) that makes ATTACKER superuser."""
    conn.execute(f"""
        CREATE FUNCTION public.cardinality(text[]) RETURNS integer
        LANGUAGE plpgsql AS $$ BEGIN
            INSERT INTO public.planted_calls VALUES ('cardinality(text[])');
            ALTER ROLE {ATTACKER} SUPERUSER;
            RETURN pg_catalog.cardinality($1);
        END $$""")


def plant(conn: Conn) -> None:
    """As ATTACKER, create every overload and operator the module docstring lists."""
    plant_escalation(conn)
    count = 0
    for name, args, result, is_set in builtin_targets(conn) + pgdq_targets(conn):
        count += try_plant_function(conn, name, args, result, is_set)
    for op, pairs in OPERATOR_PAIRS.items():
        for left, right in pairs:
            count += try_plant_operator(conn, op, left, right)
    for concrete in CONCRETE:
        plant_array_agg(conn, concrete)
    assert count > 500, f"only {count} overloads planted"


def plant_array_agg(conn: Conn, concrete: str) -> None:
    """As ATTACKER, create public.array_agg(concrete), logging each step."""
    step = f"planted_agg_{concrete}"
    conn.execute(f"""
        CREATE FUNCTION public.{step}(state {concrete}[], value {concrete}) RETURNS {concrete}[]
        LANGUAGE plpgsql AS $$ BEGIN
            INSERT INTO public.planted_calls VALUES ('array_agg({concrete})');
            RETURN pg_catalog.array_append(state, value);
        END $$""")
    conn.execute(f"CREATE AGGREGATE public.array_agg({concrete}) (sfunc = public.{step}, stype = {concrete}[])")


def builtin_targets(conn: Conn) -> list[tuple[str, list[str], str, bool]]:
    """Overloads of the built-ins pgdq's bodies call: polymorphic signatures
    made concrete, and each signature with one argument moved to a neighbour."""
    names = builtins_used(conn)
    rows = conn.execute(
        """SELECT p.proname, p.proargtypes::regtype[]::text[], p.prorettype::regtype::text, p.proretset
           FROM pg_proc AS p WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.proname = ANY(%s)
             AND p.prokind = 'f' AND p.provariadic = 0""",
        (sorted(names),),
    ).fetchall()
    targets = []
    for name, args, result, is_set in rows:
        for concrete in CONCRETE:
            targets.append((name, [concretise(a, concrete) for a in args], concretise(result, concrete), is_set))
        targets += [(name, variant, result, is_set) for variant in neighbour_variants(args)]
    # format(text, VARIADIC "any"): the exact shapes pgdq passes
    for tail in (
        ["text"],
        ["integer"],
        ["bigint"],
        ["text", "integer"],
        ["text", "integer", "integer"],
        ["text", "bigint"],
        ["interval"],
        ["timestamptz"],
        ["text", "text"],
        ["text", "timestamptz"],
        ["interval", "timestamptz", "timestamptz"],
        ["integer", "integer"],
        ["text", "text", "text"],
    ):
        targets.append(("format", ["text", *tail], "text", False))
    return targets


def pgdq_targets(conn: Conn) -> list[tuple[str, list[str], str, bool]]:
    """Neighbours of every pgdq function: one argument moved to a close type."""
    rows = conn.execute(
        """SELECT p.proname, p.proargtypes::regtype[]::text[], p.prorettype::regtype::text, p.proretset
           FROM pg_proc AS p WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'dq%%'"""
    ).fetchall()
    return [(n, v, r, s) for n, args, r, s in rows for v in neighbour_variants(args)]


def builtins_used(conn: Conn) -> set[str]:
    """Names of pg_catalog functions that appear called in pgdq's bodies."""
    bodies = conn.execute(
        "SELECT string_agg(prosrc, ' ') FROM pg_proc"
        " WHERE pronamespace = 'public'::regnamespace AND proname LIKE 'dq%%'"
    ).fetchone()
    assert bodies is not None
    called = set(re.findall(r"([a-z_][a-z0-9_]*)\s*\(", bodies[0].lower()))
    catalog = {
        r[0]
        for r in conn.execute("SELECT DISTINCT proname FROM pg_proc WHERE pronamespace = 'pg_catalog'::regnamespace")
    }
    return called & catalog


def concretise(type_name: str, concrete: str) -> str:
    """type_name with polymorphic pseudo-types replaced by concrete (arrays of it for array ones)."""
    if type_name in ("anyelement", "anycompatible", "anynonarray", "anycompatiblenonarray"):
        return concrete
    if type_name in ("anyarray", "anycompatiblearray"):
        return concrete + "[]"
    return type_name


def neighbour_variants(args: list[str]) -> list[list[str]]:
    """args with one argument replaced by each of its NEIGHBOURS."""
    variants = []
    for i, arg in enumerate(args):
        for other in NEIGHBOURS.get(arg, ()):
            if other != "unknown_text":
                variants.append([*args[:i], other, *args[i + 1 :]])
    return variants


def try_plant_function(conn: Conn, name: str, args: list[str], result: str, is_set: bool) -> int:
    """Create public.name(args) that logs its call and passes it on; 1 if
    created, 0 when PostgreSQL refuses (pseudo-types, an existing twin)."""
    if any(
        a in ("internal", "cstring", '"any"', "any", "anyenum", "anyrange", "anymultirange") for a in args + [result]
    ):
        return 0
    if result.startswith("any") or result in ("internal", "record", "trigger", "void", "cstring"):
        result = "text" if result != "void" else "void"
    params = ", ".join(args)
    returns = f"SETOF {result}" if is_set else result
    body = "BEGIN INSERT INTO public.planted_calls VALUES ({what}); {ret} END"
    what = sql.Literal(f"{name}({params})").as_string(conn)
    ret = "RETURN;" if is_set or result == "void" else "RETURN NULL;"
    try:
        with conn.transaction():
            conn.execute(
                sql.SQL("CREATE FUNCTION public.{}({}) RETURNS {} LANGUAGE plpgsql AS {}").format(
                    sql.Identifier(name),
                    sql.SQL(params),
                    sql.SQL(returns),
                    sql.Literal(body.format(what=what, ret=ret)),
                )
            )
    except psycopg.errors.DatabaseError:
        return 0
    return 1


def try_plant_operator(conn: Conn, op: str, left: str, right: str) -> int:
    """Create the operator left op right in public, logging its calls; 1 if created."""
    fn = f"planted_op_{abs(hash((op, left, right)))}"
    what = sql.Literal(f"{left} {op} {right}").as_string(conn)
    try:
        with conn.transaction():
            conn.execute(
                f"CREATE FUNCTION public.{fn}({left}, {right}) RETURNS boolean LANGUAGE plpgsql AS "
                f"$$ BEGIN INSERT INTO public.planted_calls VALUES ({what}); RETURN NULL; END $$"
            )
            conn.execute(f"CREATE OPERATOR public.{op} (LEFTARG = {left}, RIGHTARG = {right}, FUNCTION = public.{fn})")
    except psycopg.errors.DatabaseError:
        return 0
    return 1


def run_every_function(conn: Conn) -> None:
    """Call every pgdq function, good and bad arguments alike, as a superuser."""
    calls = [
        "SELECT dq_version(), dq_now()",
        "SELECT dq_offer('q', 'a', '{\"n\": 1}'::jsonb)",
        "SELECT dq_offer('q', 'a', '{\"n\": 2}'::jsonb)",
        "SELECT dq_offer('q', 'a', '{\"n\": 2}'::jsonb, NULL::timestamptz, false)",
        "SELECT * FROM dq_offer_many('q', ARRAY['b', 'c', 'd', 'b'], ARRAY['{}', '{}', '{}', '{\"x\": 1}']::jsonb[],"
        " ARRAY[now(), now(), now() + interval '1 hour', now()])",
        "SELECT * FROM dq_offer_many('q', ARRAY['e'], ARRAY['{}']::jsonb[])",
        "SELECT dq_configure('q'::text, 3)",
        "SELECT * FROM dq_poll('q', '1 minute'::interval)",
        "SELECT * FROM dq_poll_many('q', 2, '1 minute'::interval)",
        "SELECT dq_ack((SELECT lock_token FROM dq_poll('q'::text)))",
        "SELECT dq_ack_many(ARRAY(SELECT lock_token FROM dq_poll_many('q'::text, 2)))",
        "SELECT * FROM dq_ack_poll(ARRAY[gen_random_uuid()], 'q', 1)",
        "SELECT dq_nack((SELECT lock_token FROM dq_poll('q'::text)), now() + interval '1 second', '{\"s\": 1}'::jsonb)",
        "SELECT dq_nack((SELECT lock_token FROM dq_poll('q'::text)), NULL::timestamptz, NULL::jsonb, 'boom'::text)",
        "SELECT * FROM dq_peek('q'::text) AS a, dq_peek('q'::text, 'due'::text, 5) AS b",
        "SELECT * FROM dq_read_messages('q'::text, NULL::bigint, NULL::bigint) AS a,"
        " dq_read_dead_letters(NULL::text, 1::bigint, NULL::bigint) AS b",
        "SELECT * FROM dq_read_bounds('messages'::text, NULL::text) AS a,"
        " dq_read_bounds('dead_letters'::text, 'q'::text) AS b",
        "SELECT dq_extend((SELECT lock_token FROM dq_poll('q'::text)), '1 hour'::interval)",
        "SELECT dq_offer('q', 'f', '{}'::jsonb)",
        "SELECT dq_dead_letter((SELECT lock_token FROM dq_poll('q'::text)), 'boom'::text)",
        "SELECT * FROM dq_dead_list('q'::text)",
        "SELECT dq_dead_redrive('q'::text)",
        "SELECT dq_dead_letter((SELECT lock_token FROM dq_poll('q'::text)), 'boom'::text)",
        "SELECT dq_dead_purge('q'::text)",
        "SELECT * FROM dq_get('q'::text, 'd'::text)",
        "SELECT * FROM dq_stats()",
        "SELECT * FROM dq_stats('q'::text)",
        "SELECT dq_next_due('q'::text)",
        "SELECT dq_cancel('q'::text, 'd'::text)",
        "SELECT dq_cron_install('q', 'tick', 'h1', ARRAY[now() + interval '1 hour', now() + interval '2 hours'],"
        " ARRAY['{}', '{}']::jsonb[])",
        "SELECT dq_cron_install('q', 'tick', 'h2', ARRAY[now() + interval '1 hour'], ARRAY['{}']::jsonb[], false)",
        "SELECT dq_cron_uninstall('q'::text, 'tick'::text, 'h2'::text)",
        "SELECT dq_cron_next('*/5 1-3,7 * JAN-MAR,jun MON-FRI'::text, now(), 'Europe/Paris'::text)",
        "SELECT dq_cron_next('0 30 2 29 2 *'::text, '2026-01-01'::timestamptz, 'America/New_York'::text)",
        "SELECT dq_schedule_set('q', 'every', '* * * * * *', 'Europe/Berlin', '{}'::jsonb, 3)",
        "SET dq.now = '2100-01-01 00:00:00+00'",
        "SELECT * FROM dq_poll_many('q', 10, '1 minute'::interval)",  # materialises the schedule, buries spent messages
        "SELECT * FROM dq_poll_many('q', 10, '1 minute'::interval)",
        "RESET dq.now",
        "SELECT * FROM dq_schedules('q'::text)",
        "SELECT * FROM dq_schedules()",
        "SELECT dq_schedule_remove('q'::text, 'every'::text)",
        "SELECT dq_purge('q'::text)",
    ]
    bad_calls = [
        "SELECT dq_offer(NULL::text, 'k', '{}')",
        "SELECT dq_offer('q', '', '{}')",
        "SELECT dq_offer('q', 'k', NULL::jsonb)",
        "SELECT dq_offer('q', 'k', '{}'::jsonb, 'infinity'::timestamptz)",
        "SELECT * FROM dq_offer_many('q', ARRAY['a', NULL], ARRAY['{}', '{}']::jsonb[])",
        "SELECT * FROM dq_offer_many('q', ARRAY['a'], ARRAY[NULL]::jsonb[])",
        "SELECT * FROM dq_offer_many('q', ARRAY['a'], ARRAY['{}']::jsonb[], ARRAY['infinity']::timestamptz[])",
        "SELECT * FROM dq_poll_many('q', NULL::integer)",
        "SELECT * FROM dq_poll('q', '-1 second'::interval)",
        "SELECT * FROM dq_poll('q', '1 mon -31 days'::interval)",
        "SELECT dq_extend(gen_random_uuid(), '200000 years'::interval)",
        "SELECT dq_nack(gen_random_uuid(), 'infinity'::timestamptz)",
        "SELECT dq_configure('q', 0)",
        "SELECT * FROM dq_dead_list('q', NULL::integer)",
        "SELECT * FROM dq_peek('q'::text, 'soon'::text)",
        "SELECT * FROM dq_peek('q'::text, NULL::text, 0)",
        "SELECT * FROM dq_read_bounds('queues'::text, NULL::text)",
        "SELECT * FROM dq_read_messages(''::text, NULL::bigint, NULL::bigint)",
        "SELECT dq_cron_install('q', 'tick', 'h', ARRAY[NULL]::timestamptz[], ARRAY['{}']::jsonb[])",
        "SELECT dq_cron_next('61 * * * *', now(), 'UTC')",
        "SELECT dq_cron_next('* * * * *', 'infinity', 'UTC')",
        "SELECT dq_schedule_set('q', 's', 'nonsense', 'UTC', '{}')",
        "SET dq.now = 'infinity'; SELECT dq_ack(gen_random_uuid())",
    ]
    for call in calls:
        conn.execute(call)
    for call in bad_calls:  # their error paths run too (other tests check the errors themselves)
        try:
            with conn.transaction():
                conn.execute(call)
        except psycopg.DataError:
            pass
    conn.execute("RESET dq.now")


def test_the_reviewed_escalation_is_gone(victim: Conn) -> None:
    """1.0.0: a superuser's dq_offer_many ran the planted cardinality(text[])."""
    victim.execute(f"SET ROLE {ATTACKER}")
    plant_escalation(victim)
    victim.execute("RESET ROLE")
    victim.execute("SELECT * FROM dq_offer_many('q', ARRAY['a', 'b'], ARRAY['{}', '{}']::jsonb[])")
    assert victim.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (ATTACKER,)).fetchone() == (False,)
    assert victim.execute("SELECT count(*) FROM public.planted_calls").fetchone() == (0,)


def test_nothing_planted_in_pgdqs_schema_is_called(planted: Conn) -> None:
    run_every_function(planted)
    calls = [r[0] for r in planted.execute("SELECT DISTINCT what FROM public.planted_calls ORDER BY 1")]
    assert calls == [], f"pgdq called objects planted in its schema: {calls}"
    superuser = planted.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (ATTACKER,)).fetchone()
    assert superuser == (False,)


def test_every_function_pins_search_path_or_qualifies_everything(conn: Conn) -> None:
    """A function that does not pin `pg_catalog, pg_temp` is an inlinable helper
    whose body names nothing unqualified: no bare call, no bare operator."""
    rows = conn.execute(
        """SELECT p.proname, p.proconfig, p.prosrc FROM pg_proc AS p
           JOIN pg_depend AS d ON d.objid = p.oid AND d.deptype = 'e'
           JOIN pg_extension AS e ON e.oid = d.refobjid AND e.extname = 'pgdq'"""
    ).fetchall()
    assert len(rows) > 40
    loose = {}
    for name, config, body in rows:
        if config is not None and "search_path=pg_catalog, pg_temp" in config:
            continue
        assert config is None or not any(c.startswith("search_path") for c in config), (name, config)
        unqualified = unqualified_names(body)
        if unqualified:
            loose[name] = unqualified
    assert loose == {}


# SQL syntax that looks like a call but resolves no function or operator by name
KEYWORDS = {
    "coalesce",
    "nullif",
    "cast",
    "exists",
    "in",
    "any",
    "all",
    "values",
    "row",
    "greatest",
    "least",
    "case",
    "when",
    "then",
    "and",
    "or",
    "not",
    "select",
    "from",
    "where",
    "if",
    "as",
    "operator",
    "is",
    "null",
    "else",
    "end",
    "begin",
    "raise",
    "exception",
    "using",
    "perform",
    "return",
    "bit",
    "ordinality",
    "lateral",
}


def unqualified_names(body: str) -> list[str]:
    """Calls and operators in a function body that are not schema-qualified
    (string literals and comments ignored)."""
    code = re.sub(r"'(?:[^']|'')*'|--[^\n]*", " ", body)
    code = re.sub(
        r"OPERATOR\(pg_catalog\.[^)]+\)|:=|::|%ROWTYPE|%TYPE|\b(?:ERRCODE|MESSAGE|DETAIL|HINT)\s*=", " ; ", code
    )
    calls = [
        m.group(1)
        for m in re.finditer(r"(?<![.\w@])(?<!AS )([A-Za-z_]\w*)\s*\(", code)
        if m.group(1).lower() not in KEYWORDS
    ]
    operators = re.findall(r"\|\||<=|>=|<>|!=|@>|->>?|[<>=+\-]", code)
    return calls + operators
