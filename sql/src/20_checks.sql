-- Argument checks and lock tokens, shared by every public function.
-- Internal helpers are named dq__* (two underscores) and are not part of the SQL API.
-- Each argument rule has one checker here (dq__check_*: raises 22004/22023
-- naming the argument) and, where a hot path needs it, one inlinable test
-- (dq__valid_*: true or false); every limit is written once.
--
-- Volatility: every function that can raise for bad input, directly or by
-- calling one that can, is VOLATILE, and so is a LANGUAGE sql wrapper of one
-- (it inlines into the call it wraps). The planner runs an IMMUTABLE call
-- with constant arguments ahead of time, and a STABLE one while estimating,
-- even one that a CASE or WHERE would never reach, and would raise for it;
-- PostgreSQL 18 plans a LANGUAGE sql function's statements with its
-- arguments as constants, so `SELECT dq__check_queue(queue) WHERE queue IS
-- NOT NULL` raised for a NULL queue (issue 27). A VOLATILE call is never run
-- early. The tests that never raise (dq__valid_*) stay IMMUTABLE or STABLE
-- and inline; public functions keep the volatility their users see
-- (pgtap/22_volatility.sql checks all of this).
--
-- Naming, in every function of sql/src: parameters carry their API names,
-- with no prefix (queue, key, max_count, now_at), internal helpers' too;
-- where one could be read as a column, the function name qualifies it
-- (dq_offer.key), under `#variable_conflict use_column` in plpgsql. Locals
-- are v_*. Result columns are the API's names; a function whose result
-- column would repeat an argument's name is LANGUAGE sql (plpgsql refuses it).
-- These helpers sit on every hot path, so instead of pinning search_path
-- (a SET clause costs microseconds per call and blocks inlining) they
-- schema-qualify every function and operator they use; the other functions
-- pin search_path to pg_catalog, pg_temp and qualify pgdq's own objects, so
-- nothing a role creates in pgdq's schema is ever called (docs/security.md).

-- Raise 22004 naming the argument when is_null. (Callers pass `x IS NULL`:
-- a polymorphic helper could be outbid by an exact-type overload that a role
-- allowed to CREATE in pgdq's schema plants there; see docs/security.md.)
CREATE FUNCTION dq__null_check(is_null boolean, arg_name text) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF is_null THEN
        RAISE EXCEPTION USING
            ERRCODE = '22004',
            MESSAGE = pg_catalog.format('pgdq: %s must not be NULL', arg_name);
    END IF;
END
$$;

-- Raise 22004/22023 unless name is non-NULL text of 1..max_length characters.
CREATE FUNCTION dq__check_name(
    name text, arg_name text, max_length integer
) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_length integer := pg_catalog.length(name);
BEGIN
    PERFORM @extschema@.dq__null_check(name IS NULL, arg_name);
    IF v_length OPERATOR(pg_catalog.<) 1
        OR v_length OPERATOR(pg_catalog.>) max_length THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = pg_catalog.format(
                'pgdq: %s must be 1 to %s characters long, got %s',
                arg_name, max_length, v_length
            );
    END IF;
END
$$;

-- True when name is non-NULL text of 1..max_length characters. Hot paths
-- test this (it inlines) and call the raising checks only when it fails.
CREATE FUNCTION dq__valid_name(name text, max_length integer) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT coalesce(
        pg_catalog.length(name) OPERATOR(pg_catalog.>=) 1
        AND pg_catalog.length(name) OPERATOR(pg_catalog.<=) max_length,
        FALSE
    )
$$;

-- The longest queue name, in characters (docs/sql-reference.md, Names).
CREATE FUNCTION dq__queue_max_length() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 100::pg_catalog.int4 $$;

-- The longest message key, in characters (docs/sql-reference.md, Names).
CREATE FUNCTION dq__key_max_length() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 200::pg_catalog.int4 $$;

-- True when queue follows the queue name rule (inlines, for hot paths).
CREATE FUNCTION dq__valid_queue(queue text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT @extschema@.dq__valid_name(queue, @extschema@.dq__queue_max_length()) $$;

-- Raise 22004/22023 unless queue follows the queue name rule.
CREATE FUNCTION dq__check_queue(queue text) RETURNS void
LANGUAGE sql VOLATILE
AS $$ SELECT @extschema@.dq__check_name(queue, 'queue', @extschema@.dq__queue_max_length()) $$;

-- True when key follows the key rule (inlines, for hot paths).
CREATE FUNCTION dq__valid_key(key text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT @extschema@.dq__valid_name(key, @extschema@.dq__key_max_length()) $$;

-- Raise 22004/22023 naming arg_name unless key follows the key rule.
CREATE FUNCTION dq__check_key(key text, arg_name text) RETURNS void
LANGUAGE sql VOLATILE
AS $$ SELECT @extschema@.dq__check_name(key, arg_name, @extschema@.dq__key_max_length()) $$;

-- The longest channel name, in characters (docs/sql-reference.md, Names).
CREATE FUNCTION dq__channel_max_length() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 100::pg_catalog.int4 $$;

-- True when channel is NULL (none) or follows the channel name rule (inlines).
CREATE FUNCTION dq__valid_channel(channel text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT channel IS NULL
        OR @extschema@.dq__valid_name(channel, @extschema@.dq__channel_max_length())
$$;

-- Raise 22023 naming arg_name unless channel is NULL or follows the rule.
CREATE FUNCTION dq__check_channel(channel text, arg_name text) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF channel IS NOT NULL THEN
        PERFORM @extschema@.dq__check_name(channel, arg_name, @extschema@.dq__channel_max_length());
    END IF;
END
$$;

-- The most characters of a consumer's error a message keeps (dq_nack keeps
-- the last ones: a traceback ends with the exception).
CREATE FUNCTION dq__error_max_length() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 4000::pg_catalog.int4 $$;

-- Raise 22004/22023 naming arg_name unless value is non-NULL and low..high.
CREATE FUNCTION dq__check_between(
    value integer, arg_name text, low integer, high integer
) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    PERFORM @extschema@.dq__null_check(value IS NULL, arg_name);
    IF value OPERATOR(pg_catalog.<) low OR value OPERATOR(pg_catalog.>) high THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = pg_catalog.format('pgdq: %s must be %s to %s, got %s', arg_name, low, high, value);
    END IF;
END
$$;

-- Raise 22023 naming arg_name unless value is one of allowed (NULL passes).
CREATE FUNCTION dq__check_one_of(value text, arg_name text, allowed text[]) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF NOT value OPERATOR(pg_catalog.=) ANY(allowed) THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = pg_catalog.format(
                'pgdq: %s must be one of ''%s'', got %L',
                arg_name, pg_catalog.array_to_string(allowed, ''', '''), value
            );
    END IF;
END
$$;

-- True when a message with this lock_token and due_at is leased at now_at:
-- a lease that ended makes the message ready again (10_storage.sql).
CREATE FUNCTION dq__is_leased(
    lock_token uuid, due_at timestamptz, now_at timestamptz
) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT lock_token IS NOT NULL AND due_at OPERATOR(pg_catalog.>) now_at $$;

-- True for every message: the predicates of the two poll indexes
-- (10_storage.sql), which between them hold every message, OR'd. A query
-- of one queue's messages that adds it reads the queue's ranges of both
-- indexes (a BitmapOr) instead of the whole table: no index holds every
-- message since keyless ones left the key index (1.2). Inlines.
CREATE FUNCTION dq__in_poll_indexes(channel text, priority integer) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT (channel OPERATOR(pg_catalog.=) '' AND priority OPERATOR(pg_catalog.=) 0)
        OR channel OPERATOR(pg_catalog.<>) '' OR priority OPERATOR(pg_catalog.<>) 0
$$;

-- Raise 22004 naming the argument when the array is NULL (is_null) or has a
-- NULL element (first_null, its position: pg_catalog.array_position(arr, NULL)).
CREATE FUNCTION dq__check_elements(first_null integer, is_null boolean, arg_name text) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    PERFORM @extschema@.dq__null_check(is_null, arg_name);
    IF first_null IS NOT NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = '22004',
            MESSAGE = pg_catalog.format('pgdq: %s[%s] must not be NULL', arg_name, first_null);
    END IF;
END
$$;

-- The readable range of times: from the start of year 1 to the end of year
-- 9999 UTC, what every common client library can read (Python's datetime,
-- Java's Instant in most drivers, JavaScript's Date). Every time a function
-- accepts, stores or returns lies in it (docs/sql-reference.md, Times).
-- The first time in the range.
CREATE FUNCTION dq__time_min() RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '0001-01-01 00:00:00+00'::pg_catalog.timestamptz $$;

-- The first time after the range.
CREATE FUNCTION dq__time_end() RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT '10000-01-01 00:00:00+00'::pg_catalog.timestamptz $$;

-- True when at is NULL or in the readable range (inlines, for hot paths).
CREATE FUNCTION dq__valid_time(at timestamptz) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT at IS NULL
        OR (
            at OPERATOR(pg_catalog.>=) @extschema@.dq__time_min()
            AND at OPERATOR(pg_catalog.<) @extschema@.dq__time_end()
        )
$$;

-- The time in the readable range nearest to at (NULL stays NULL): what the
-- 1.2 step makes of times stored before the range was enforced.
CREATE FUNCTION dq__clamp_time(at timestamptz) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN at OPERATOR(pg_catalog.<) @extschema@.dq__time_min() THEN @extschema@.dq__time_min()
        WHEN at OPERATOR(pg_catalog.>=) @extschema@.dq__time_end()
            THEN '9999-12-31 23:59:59.999999+00'::pg_catalog.timestamptz
        ELSE at
    END
$$;

-- Raise 22023 naming arg_name unless at is NULL or in the readable range
-- (VOLATILE, as every raising check is: see Volatility above).
CREATE FUNCTION dq__check_time(at timestamptz, arg_name text) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    IF NOT @extschema@.dq__valid_time(at) THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = pg_catalog.format(
                'pgdq: %s must be a time in years 1 to 9999 UTC, got %s', arg_name, at
            );
    END IF;
END
$$;

-- Raise 22023 naming the first element of ats outside the readable range
-- (NULL ones pass).
CREATE FUNCTION dq__check_time_elements(ats timestamptz[], arg_name text) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_bad record;
BEGIN
    -- the usual batch has none: two scans in C before any unnest
    IF @extschema@.dq__time_min() OPERATOR(pg_catalog.>) ANY(ats)
        OR @extschema@.dq__time_end() OPERATOR(pg_catalog.<=) ANY(ats) THEN
        -- the element itself, named by its position (whatever the array's
        -- lower bound: a subscript would read another element)
        SELECT a.at, a.ord INTO v_bad
        FROM pg_catalog.unnest(ats) WITH ORDINALITY AS a (at, ord)
        WHERE NOT @extschema@.dq__valid_time(a.at)
        ORDER BY a.ord
        LIMIT 1;
        PERFORM @extschema@.dq__check_time(v_bad.at, pg_catalog.format('%s[%s]', arg_name, v_bad.ord));
    END IF;
END
$$;

-- True when a lease taken at now_at ends after now_at, within the readable
-- range (dq__valid_time). Hot paths test this (it inlines) and call
-- dq__check_lease only when it fails; CASE keeps the sum from overflowing.
-- STABLE, like timestamptz + interval: an IMMUTABLE one would not inline.
CREATE FUNCTION dq__valid_lease(lease interval, now_at timestamptz) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN lease OPERATOR(pg_catalog.>) '0'::pg_catalog.interval
            AND lease OPERATOR(pg_catalog.<) '1000 years'::pg_catalog.interval
            AND now_at OPERATOR(pg_catalog.<) @extschema@.dq__time_end()
            THEN (now_at OPERATOR(pg_catalog.+) lease) OPERATOR(pg_catalog.>) now_at
                AND (now_at OPERATOR(pg_catalog.+) lease) OPERATOR(pg_catalog.<) @extschema@.dq__time_end()
        ELSE FALSE
    END
$$;

-- Raise 22004/22023 unless a lease taken at now_at ends after now_at and
-- within the readable range (VOLATILE: see dq__check_time).
CREATE FUNCTION dq__check_lease(lease interval, now_at timestamptz) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_until timestamptz;
BEGIN
    PERFORM @extschema@.dq__null_check(lease IS NULL, 'lease');
    IF lease OPERATOR(pg_catalog.<=) '0'::pg_catalog.interval THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = pg_catalog.format('pgdq: lease must be positive, got %s', lease);
    END IF;
    BEGIN
        v_until := now_at OPERATOR(pg_catalog.+) lease;
    EXCEPTION WHEN datetime_field_overflow THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = pg_catalog.format('pgdq: lease %s ends after year 9999 UTC', lease);
    END;
    IF v_until OPERATOR(pg_catalog.>=) @extschema@.dq__time_end() THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = pg_catalog.format('pgdq: lease %s from %s ends after year 9999 UTC', lease, now_at);
    END IF;
    IF v_until OPERATOR(pg_catalog.<=) now_at THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = pg_catalog.format(
                'pgdq: lease must end after now, but %s from %s ends at %s', lease, now_at, v_until
            );
    END IF;
END
$$;

-- The proof of a poll's lock tokens: the random half of a v4 UUID (62
-- random bits), drawn once per poll, as an InitPlan of its UPDATE. Drawing
-- it per row cost 2.4 us a lease (gen_random_uuid() reads the system's
-- strong random source), a fifth of a batch poll's time. One proof per
-- poll keeps what tokens promise: a token of another poll (an earlier lease
-- of the same message, or another consumer's) never matches, and the only
-- holder of a poll's tokens is the consumer it answered.
CREATE FUNCTION dq__token_proof() RETURNS bytea
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$ SELECT pg_catalog.substr(pg_catalog.uuid_send(pg_catalog.gen_random_uuid()), 9) $$;

-- The lock token of message id in a poll with proof (dq__token_proof): the
-- id in the first 8 bytes (so the row is found by primary key), the proof
-- in the last 8. Token helpers are schema-qualified instead of pinning
-- search_path, so the planner can inline them into the statements that use
-- them.
CREATE FUNCTION dq__token(id bigint, proof bytea) RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    -- bytes, not hex text: a third less time per lease
    SELECT CAST(
        pg_catalog.encode(pg_catalog.int8send(id) OPERATOR(pg_catalog.||) proof, 'hex') AS pg_catalog.uuid
    )
$$;

-- A lock token for message id with a proof of its own: what 1.1's polls
-- drew per row. 1.2 calls dq__token(id, proof); this one stays for the calls
-- of 1.1's functions still running when the upgrade commits.
CREATE FUNCTION dq__token(id bigint) RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$ SELECT @extschema@.dq__token(id, @extschema@.dq__token_proof()) $$;

-- The message id a lock token was issued for (see dq__token).
CREATE FUNCTION dq__token_id(token uuid) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
    SELECT CAST(
        CAST(
            'x' OPERATOR(pg_catalog.||) pg_catalog.encode(
                pg_catalog.substr(pg_catalog.uuid_send(token), 1, 8), 'hex'
            ) AS pg_catalog.bit(64)
        ) AS pg_catalog.int8
    )
$$;
