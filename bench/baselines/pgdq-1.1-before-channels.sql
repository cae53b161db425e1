-- pgdq 1.1.0 as it was before channels and priority (commit 470c886): bench/systems.py's
-- "pgdq before channels" row installs it, so that make bench measures what channels cost plain queues.
-- pgdq: a delayed-message queue inside PostgreSQL.
-- The files of sql/src are concatenated in name order into one install script.
-- @extschema@ stands for the schema pgdq lives in: CREATE EXTENSION fills it in,
-- and so do `make sql` and `pgdq install` for a plain install.

-- Refuse a second install into the same schema before anything is created, so
-- that a repeated install is one clear error and never a half-installed state.
DO $guard$
BEGIN
    -- The installer puts the target schema first on search_path.
    IF EXISTS (
        SELECT 1
        FROM pg_catalog.pg_class AS c
        INNER JOIN pg_catalog.pg_namespace AS n ON c.relnamespace OPERATOR(pg_catalog.=) n.oid
        WHERE n.nspname OPERATOR(pg_catalog.=) pg_catalog.current_schema()
            AND c.relname OPERATOR(pg_catalog.=) 'dq_messages'
    ) THEN
        RAISE EXCEPTION USING
            ERRCODE = '42710',
            MESSAGE = pg_catalog.format('pgdq is already installed in schema %I', pg_catalog.current_schema()),
            HINT = 'Drop it first (pgdq uninstall, or DROP EXTENSION pgdq) or install into another schema.';
    END IF;
END
$guard$;

-- Storage: one row per (queue, key), the clock, the version.

-- One row per live message. A message is in exactly one of three conditions:
--   delayed   lock_token IS NULL      and due_at >  now
--   ready     due_at <= now           (an expired lease counts as ready)
--   leased    lock_token IS NOT NULL  and due_at >  now
-- due_at is the single "next time this row matters" column: the offered
-- scheduled_at, a nack's retry_at, or while leased the lease end. That lets
-- one index, (queue, due_at, id), serve every poll and dq_next_due.
CREATE TABLE dq_messages (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- C collation: names are identifiers compared byte for byte, and cron
    -- prefix scans become plain index ranges.
    queue text COLLATE "C" NOT NULL,
    key text COLLATE "C" NOT NULL,
    payload jsonb NOT NULL,
    state jsonb,
    scheduled_at timestamptz NOT NULL,
    due_at timestamptz NOT NULL,
    created_at timestamptz NOT NULL,
    attempts integer NOT NULL DEFAULT 0,
    -- The current delivery's token; NULL when not leased. Its first 8 bytes
    -- are the row id (see dq__token), so acks find the row by primary key
    -- and the table needs no index on tokens.
    lock_token uuid,
    -- The error the last nack gave (dq_nack's error, its last 4,000
    -- characters); NULL when it gave none. An offer that resets attempts
    -- clears it too. Since 1.1 (last: ALTER TABLE adds it there).
    last_error text,
    CONSTRAINT dq_messages_queue_key UNIQUE (queue, key)
) WITH (
    -- Every lease, nack and extend moves due_at, an indexed column, so those
    -- updates are never HOT and each one leaves a dead tuple behind. Free
    -- space on each page keeps the new version next to the old one, and
    -- vacuuming after 1% churn (instead of the default 20%) with no cost
    -- delay keeps dead entries from piling up at the head of the poll index
    -- however large the table grows.
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);

-- The hot functions (offer, poll, ack, nack, extend, next_due) run with
-- plan_cache_mode = force_generic_plan: their statements are index lookups
-- whose best plan does not depend on the arguments, and letting plpgsql plan
-- them anew on every call (custom plans) cost more than running them: a
-- one-message poll took 0.25 ms of server time instead of 0.12 ms.
-- pgtap/10_plans.sql checks that these plans stay on the indexes.

-- The poll path: due messages of one queue, earliest first, ties by id.
-- Polls and dq_next_due read only the head of one queue's range, so their
-- cost does not grow with the number of delayed messages or other queues.
-- Its entries are unique (id is in them), so deduplication never merges
-- any: turned off, a full page splits at once instead of first trying.
CREATE INDEX dq_messages_due ON dq_messages (queue, due_at, id) WITH (deduplicate_items = off);

COMMENT ON TABLE dq_messages IS
'pgdq messages. Use the dq_* functions; the layout is internal and may change.';

-- What a poll hands to a consumer (docs/sql-reference.md).
CREATE TYPE dq_delivery AS (
    id bigint,
    queue text,
    key text,
    payload jsonb,
    state jsonb,
    scheduled_at timestamptz,
    created_at timestamptz,
    attempts integer,
    redelivery boolean,
    lock_token uuid,
    lease_until timestamptz
);

-- The time dq.now pins the clock to (STRICT: never called when it is unset);
-- 22023 unless it is a finite timestamp.
CREATE FUNCTION dq__pinned_now(setting text) RETURNS timestamptz
LANGUAGE plpgsql STABLE STRICT
AS $$
DECLARE
    v_at timestamptz;
BEGIN
    BEGIN
        v_at := setting::pg_catalog.timestamptz;
    EXCEPTION WHEN data_exception THEN  -- unparsable or out of range
        v_at := NULL;
    END;
    IF v_at IS NULL OR NOT pg_catalog.isfinite(v_at) THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = pg_catalog.format('pgdq: dq.now must be a finite timestamp, got %L', setting);
    END IF;
    RETURN v_at;
END
$$;

-- The one clock: dq.now when set and non-empty (tests), else the wall clock.
-- Schema-qualified rather than pinned, so that it inlines into its callers.
CREATE FUNCTION dq_now() RETURNS timestamptz
LANGUAGE sql VOLATILE
AS $$
    SELECT coalesce(
        @extschema@.dq__pinned_now(nullif(pg_catalog.current_setting('dq.now', true), '')),
        pg_catalog.clock_timestamp()
    )
$$;

-- The installed package version.
CREATE FUNCTION dq_version() RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT '1.1.0'::text $$;

-- Per-queue settings; a queue without a row has the defaults.
CREATE TABLE dq_queues (
    queue text COLLATE "C" PRIMARY KEY,
    -- The most deliveries a message of this queue gets: a due message that
    -- has had this many is moved to the dead letters by the next poll instead
    -- of being delivered again (its consumers kept dying). NULL: no limit.
    max_attempts integer CONSTRAINT dq_queues_max_attempts CHECK (max_attempts > 0)
);

COMMENT ON TABLE dq_queues IS
'pgdq per-queue settings. Use dq_configure; the layout is internal and may change.';

-- Messages given up on: moved here by dq_dead_letter (the consumer's
-- verdict) or by a poll that found their attempts used up. One row per
-- (queue, key): a key that fails again replaces its earlier dead letter.
CREATE TABLE dq_dead_letters (
    queue text COLLATE "C" NOT NULL,
    key text COLLATE "C" NOT NULL,
    id bigint NOT NULL,  -- the message's id when it failed
    payload jsonb NOT NULL,
    state jsonb,
    scheduled_at timestamptz NOT NULL,
    created_at timestamptz NOT NULL,
    attempts integer NOT NULL,
    error text,
    failed_at timestamptz NOT NULL,
    CONSTRAINT dq_dead_letters_pkey PRIMARY KEY (queue, key)
);

-- Listing a queue's dead letters, oldest failure first.
CREATE INDEX dq_dead_letters_failed ON dq_dead_letters (queue, failed_at, key);

-- Snapshot reads of every queue's dead letters by id range (dq_read_*).
-- Not unique: a 1.0.0 database restored from a dump reused ids.
CREATE INDEX dq_dead_letters_id ON dq_dead_letters (id);

COMMENT ON TABLE dq_dead_letters IS
'pgdq dead letters. Use the dq_dead_* functions; the layout is internal and may change.';

-- Recurring schedules kept by the database (dq_schedule_set): the polls of a
-- queue turn its due occurrences into ordinary messages, so no scheduler
-- process has to run. next_at is the next occurrence not yet turned into a
-- message, or while the schedule fails the time of its next attempt.
CREATE TABLE dq_schedules (
    queue text COLLATE "C" NOT NULL,
    name text COLLATE "C" NOT NULL,  -- the key prefix of its occurrences
    expression text NOT NULL,
    timezone text NOT NULL,
    payload jsonb NOT NULL,
    config_hash text NOT NULL,       -- of expression, timezone and payload
    max_missed integer NOT NULL,     -- occurrences delivered when several are due at once
    next_at timestamptz NOT NULL,
    -- Since 1.1: a poll that fails to materialise the schedule keeps the
    -- error and retries later (64_schedules.sql); a success clears them.
    last_error text,                 -- '<message> (SQLSTATE <code>)'
    last_error_at timestamptz,
    failures integer NOT NULL DEFAULT 0,  -- in a row
    missed_from timestamptz,         -- while failing: the first occurrence not yet delivered
    CONSTRAINT dq_schedules_pkey PRIMARY KEY (queue, name)
);

-- Polls look for their queue's due schedules: one probe of this index.
CREATE INDEX dq_schedules_next ON dq_schedules (queue, next_at);

COMMENT ON TABLE dq_schedules IS
'pgdq schedules. Use the dq_schedule* functions; the layout is internal and may change.';

-- Argument checks and lock tokens, shared by every public function.
-- Internal helpers are named dq__* (two underscores) and are not part of the SQL API.
-- Each argument rule has one checker here (dq__check_*: raises 22004/22023
-- naming the argument) and, where a hot path needs it, one inlinable test
-- (dq__valid_*: true or false); every limit is written once.
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
LANGUAGE plpgsql IMMUTABLE
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
LANGUAGE plpgsql IMMUTABLE
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
LANGUAGE sql IMMUTABLE
AS $$ SELECT @extschema@.dq__check_name(queue, 'queue', @extschema@.dq__queue_max_length()) $$;

-- True when key follows the key rule (inlines, for hot paths).
CREATE FUNCTION dq__valid_key(key text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT @extschema@.dq__valid_name(key, @extschema@.dq__key_max_length()) $$;

-- Raise 22004/22023 naming arg_name unless key follows the key rule.
CREATE FUNCTION dq__check_key(key text, arg_name text) RETURNS void
LANGUAGE sql IMMUTABLE
AS $$ SELECT @extschema@.dq__check_name(key, arg_name, @extschema@.dq__key_max_length()) $$;

-- The most characters of a consumer's error a message keeps (dq_nack keeps
-- the last ones: a traceback ends with the exception).
CREATE FUNCTION dq__error_max_length() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT 4000::pg_catalog.int4 $$;

-- Raise 22004/22023 naming arg_name unless value is non-NULL and low..high.
CREATE FUNCTION dq__check_between(
    value integer, arg_name text, low integer, high integer
) RETURNS void
LANGUAGE plpgsql IMMUTABLE
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
LANGUAGE plpgsql IMMUTABLE
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

-- Raise 22004 naming the argument when the array is NULL (is_null) or has a
-- NULL element (first_null, its position: pg_catalog.array_position(arr, NULL)).
CREATE FUNCTION dq__check_elements(first_null integer, is_null boolean, arg_name text) RETURNS void
LANGUAGE plpgsql IMMUTABLE
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

-- True when a lease taken at now_at ends after now_at, within the timestamp
-- range (docs/sql-reference.md). Hot paths test this (it inlines) and call
-- dq__check_lease only when it fails; CASE keeps the sum from overflowing.
-- STABLE, like timestamptz + interval: an IMMUTABLE one would not inline.
CREATE FUNCTION dq__valid_lease(lease interval, now_at timestamptz) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT CASE
        WHEN lease OPERATOR(pg_catalog.>) '0'::pg_catalog.interval
            AND lease OPERATOR(pg_catalog.<) '1000 years'::pg_catalog.interval
            AND now_at OPERATOR(pg_catalog.<) '100000-01-01'::pg_catalog.timestamptz
            THEN (now_at OPERATOR(pg_catalog.+) lease) OPERATOR(pg_catalog.>) now_at
        ELSE FALSE
    END
$$;

-- Raise 22004/22023 unless a lease taken at now_at ends after now_at and
-- within the timestamp range.
CREATE FUNCTION dq__check_lease(lease interval, now_at timestamptz) RETURNS void
LANGUAGE plpgsql STABLE
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
            MESSAGE = pg_catalog.format('pgdq: lease %s ends beyond the timestamp range', lease);
    END;
    IF v_until OPERATOR(pg_catalog.<=) now_at THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = pg_catalog.format(
                'pgdq: lease must end after now, but %s from %s ends at %s', lease, now_at, v_until
            );
    END IF;
END
$$;

-- Raise 22023 naming the argument when at is infinite (NULL passes).
CREATE FUNCTION dq__check_finite(at timestamptz, arg_name text) RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF NOT pg_catalog.isfinite(at) THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = pg_catalog.format('pgdq: %s must be a finite time, got %s', arg_name, at);
    END IF;
END
$$;

-- Raise 22023 naming the first infinite element of ats (NULL ones pass).
CREATE FUNCTION dq__check_finite_elements(ats timestamptz[], arg_name text) RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    v_bad bigint;
BEGIN
    -- the usual batch has none: two scans in C before any unnest
    IF 'infinity'::pg_catalog.timestamptz OPERATOR(pg_catalog.=) ANY(ats)
        OR '-infinity'::pg_catalog.timestamptz OPERATOR(pg_catalog.=) ANY(ats) THEN
        SELECT a.ord INTO v_bad
        FROM pg_catalog.unnest(ats) WITH ORDINALITY AS a (at, ord)
        WHERE NOT pg_catalog.isfinite(a.at)
        ORDER BY a.ord
        LIMIT 1;
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = pg_catalog.format(
                'pgdq: %s[%s] must be a finite time, got %s', arg_name, v_bad, ats[v_bad]
            );
    END IF;
END
$$;

-- A fresh lock token for message id: the id in the first 8 bytes (so the
-- row is found by primary key) and the random half of a v4 UUID (62 random
-- bits) as the proof.
-- Token helpers are schema-qualified instead of pinning search_path, so the
-- planner can inline them into the statements that use them.
CREATE FUNCTION dq__token(id bigint) RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$
    -- bytes, not hex text: a third less time per lease
    SELECT CAST(
        pg_catalog.encode(
            pg_catalog.int8send(id) OPERATOR(pg_catalog.||) pg_catalog.substr(
                pg_catalog.uuid_send(pg_catalog.gen_random_uuid()), 9
            ),
            'hex'
        ) AS pg_catalog.uuid
    )
$$;

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

-- Producing: dq_offer and dq_offer_many.

-- True when an offer of (new_payload, new_at) matches the stored version, so
-- that it changes nothing: same payload, and a NULL time matches any time.
-- Operators are schema-qualified so the planner can inline this function.
CREATE FUNCTION dq__same_offer(
    stored_payload jsonb,
    stored_at timestamptz,
    new_payload jsonb,
    new_at timestamptz
) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT stored_payload OPERATOR(pg_catalog.=) new_payload
        AND (new_at IS NULL OR new_at OPERATOR(pg_catalog.=) stored_at)
$$;

-- Wake idle consumers of queue; sent at commit, one per queue per transaction.
CREATE FUNCTION dq__wake(queue text) RETURNS void
LANGUAGE sql VOLATILE
AS $$ SELECT pg_catalog.pg_notify('dq_wakeup', queue) $$;

-- Wake idle consumers of queue (dq__wake) when a message this statement
-- wrote, due at written_at, is due no later than every other message of the
-- queue it can see: only then could a consumer sleeping until dq_next_due
-- oversleep. Writes behind the head stay silent, so busy producers do not
-- serialise on the server's notification lock (docs/sql-reference.md, Wake-ups).
CREATE FUNCTION dq__wake_if_head(queue text, written_at timestamptz) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    -- plpgsql, not sql: its plan is cached per session instead of planned per call
    IF written_at OPERATOR(pg_catalog.<=) (
        SELECT m.due_at FROM @extschema@.dq_messages AS m
        WHERE m.queue OPERATOR(pg_catalog.=) dq__wake_if_head.queue
        ORDER BY m.due_at
        LIMIT 1
    ) THEN
        PERFORM @extschema@.dq__wake(queue);
    END IF;
END
$$;

-- Offer one message: 'created', 'updated' or 'ignored' (docs/sql-reference.md).
CREATE FUNCTION dq_offer(
    queue text,
    key text,
    payload jsonb,
    scheduled_at timestamptz DEFAULT NULL,
    can_update boolean DEFAULT TRUE
) RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := @extschema@.dq_now();
    v_at timestamptz := coalesce(dq_offer.scheduled_at, v_now);
    v_inserted boolean;
BEGIN
    -- one cheap test on the hot path; the checks say what is wrong
    IF NOT @extschema@.dq__valid_queue(dq_offer.queue)
        OR NOT @extschema@.dq__valid_key(dq_offer.key)
        OR dq_offer.payload IS NULL
        OR dq_offer.can_update IS NULL
        OR NOT coalesce(isfinite(dq_offer.scheduled_at), TRUE) THEN
        PERFORM @extschema@.dq__check_queue(dq_offer.queue);
        PERFORM @extschema@.dq__check_key(dq_offer.key, 'key');
        PERFORM @extschema@.dq__null_check(dq_offer.payload IS NULL, 'payload');
        PERFORM @extschema@.dq__null_check(dq_offer.can_update IS NULL, 'can_update');
        PERFORM @extschema@.dq__check_finite(dq_offer.scheduled_at, 'scheduled_at');
    END IF;

    -- ON CONFLICT makes concurrent offers of one key wait for each other
    -- instead of failing: one creates, the others update or ignore.
    INSERT INTO @extschema@.dq_messages AS m (
        queue, key, payload, scheduled_at, due_at, created_at
    )
    VALUES (dq_offer.queue, dq_offer.key, dq_offer.payload, v_at, v_at, v_now)
    ON CONFLICT ON CONSTRAINT dq_messages_queue_key DO UPDATE
        SET payload = excluded.payload,
            scheduled_at = excluded.scheduled_at,
            due_at = excluded.due_at,
            created_at = excluded.created_at,
            attempts = 0,
            state = NULL,
            last_error = NULL,
            lock_token = NULL
        WHERE dq_offer.can_update
            AND NOT @extschema@.dq__same_offer(
                m.payload, m.scheduled_at,
                excluded.payload, dq_offer.scheduled_at
            )
    RETURNING m.xmax = 0 INTO v_inserted;  -- xmax is 0 on a fresh insert

    IF NOT FOUND THEN
        RETURN 'ignored';
    END IF;
    PERFORM @extschema@.dq__wake_if_head(dq_offer.queue, v_at);
    RETURN CASE WHEN v_inserted THEN 'created' ELSE 'updated' END;
END
$$;

-- Replay a batch of offers key by key, in array order, as dq_offer would:
-- one row per element (elem_ord >= 1) with its outcome and the state it
-- leaves, plus whether it is its key's last element and whether the key ends
-- up written. stored_* give the current version of keys that already exist.
CREATE FUNCTION dq__offer_chain(
    keys text[],
    payloads jsonb[],
    scheduled_ats timestamptz[],
    can_update boolean,
    now_at timestamptz,
    stored_keys text[],
    stored_payloads jsonb[],
    stored_ats timestamptz[]
) RETURNS TABLE (
    elem_ord bigint,
    elem_key text,
    outcome text,
    final_payload jsonb,
    final_at timestamptz,
    is_last boolean,
    had_stored boolean,
    key_written boolean
)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH elems AS (
        SELECT e.ord, e.k COLLATE "C" AS k, e.p, e.s, false AS is_stored
        FROM unnest(keys, payloads, scheduled_ats)
            WITH ORDINALITY AS e (k, p, s, ord)
        UNION ALL
        SELECT 0, s.k COLLATE "C", s.p, s.s, true
        FROM unnest(stored_keys, stored_payloads, stored_ats) AS s (k, p, s)
    ),

    -- sets_at: the scheduled_at an element leaves behind when it sets one;
    -- NULL when it keeps the previous one (no time given, same payload).
    stepped AS (
        SELECT
            elems.*,
            row_number() OVER w = 1 AS is_first,
            lag(elems.p) OVER w AS prev_p,
            CASE
                WHEN elems.is_stored OR elems.s IS NOT NULL THEN elems.s
                WHEN row_number() OVER w = 1 THEN now_at
                WHEN elems.p <> lag(elems.p) OVER w THEN now_at
            END AS sets_at
        FROM elems
        WINDOW w AS (PARTITION BY elems.k ORDER BY elems.ord)
    ),

    -- at: the scheduled_at in force after each element (last one set).
    resolved AS (
        SELECT
            grouped.*,
            max(grouped.sets_at) OVER (
                PARTITION BY grouped.k, grouped.grp
            ) AS at
        FROM (
            SELECT
                stepped.*,
                count(stepped.sets_at) OVER (
                    PARTITION BY stepped.k ORDER BY stepped.ord
                ) AS grp
            FROM stepped
        ) AS grouped
    ),

    judged AS (
        SELECT
            resolved.*,
            CASE
                WHEN resolved.is_first THEN 'created'
                WHEN NOT can_update THEN 'ignored'
                WHEN @extschema@.dq__same_offer(
                    resolved.prev_p, lag(resolved.at) OVER w,
                    resolved.p, resolved.s
                ) THEN 'ignored'
                ELSE 'updated'
            END AS outcome
        FROM resolved
        WINDOW w AS (PARTITION BY resolved.k ORDER BY resolved.ord)
    )

    SELECT
        judged.ord,
        judged.k,
        judged.outcome,
        -- without can_update the first version stays
        CASE WHEN can_update THEN judged.p ELSE first_value(judged.p) OVER w END,
        CASE WHEN can_update THEN judged.at ELSE first_value(judged.at) OVER w END,
        judged.ord = max(judged.ord) OVER k,
        bool_or(judged.is_stored) OVER k,
        bool_or(NOT judged.is_stored AND judged.outcome <> 'ignored') OVER k
    FROM judged
    WINDOW
        w AS (PARTITION BY judged.k ORDER BY judged.ord),
        k AS (PARTITION BY judged.k)
$$;

-- Raise 22004/22023 unless the offer_many arrays are usable (docs/sql-reference.md).
CREATE FUNCTION dq__check_offer_arrays(
    keys text[], payloads jsonb[], scheduled_ats timestamptz[]
) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_bad bigint;
BEGIN
    PERFORM @extschema@.dq__null_check(keys IS NULL, 'keys');
    PERFORM @extschema@.dq__null_check(payloads IS NULL, 'payloads');
    IF coalesce(array_ndims(keys), 1) > 1
        OR coalesce(array_ndims(payloads), 1) > 1
        OR coalesce(array_ndims(scheduled_ats), 1) > 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = 'pgdq: keys, payloads and scheduled_ats must be one-dimensional arrays';
    END IF;
    IF cardinality(payloads) <> cardinality(keys)
        OR cardinality(scheduled_ats) <> cardinality(keys) THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = format(
                'pgdq: keys, payloads and scheduled_ats must have equal lengths, got %s, %s and %s',
                cardinality(keys), cardinality(payloads),
                coalesce(cardinality(scheduled_ats)::text, 'NULL')
            );
    END IF;
    PERFORM @extschema@.dq__check_elements(pg_catalog.array_position(keys, NULL), keys IS NULL, 'keys');
    PERFORM @extschema@.dq__check_elements(pg_catalog.array_position(payloads, NULL), payloads IS NULL, 'payloads');
    PERFORM @extschema@.dq__check_finite_elements(scheduled_ats, 'scheduled_ats');
    SELECT k.ord INTO v_bad
    FROM unnest(keys) WITH ORDINALITY AS k (k, ord)
    WHERE NOT @extschema@.dq__valid_key(k.k)
    ORDER BY k.ord
    LIMIT 1;
    IF v_bad IS NOT NULL THEN
        PERFORM @extschema@.dq__check_key(keys[v_bad], format('keys[%s]', v_bad));
    END IF;
END
$$;

-- The usual batch, all of whose keys are new: insert it in key order with a
-- plain INSERT, which checks each key once as it adds the index entry,
-- where ON CONFLICT first probes the key index and then inserts
-- speculatively. True when written; false, with nothing written, when a key
-- exists or repeats (the caller then replays the batch key by key). Key
-- order, as everywhere: two batches inserting the same new keys wait for
-- each other instead of deadlocking.
CREATE FUNCTION dq__offer_new(
    queue text,
    keys text[],
    payloads jsonb[],
    scheduled_ats timestamptz[],
    now_at timestamptz
) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
AS $$
BEGIN
    INSERT INTO @extschema@.dq_messages (
        queue, key, payload, scheduled_at, due_at, created_at
    )
    SELECT
        dq__offer_new.queue, e.k, e.p,
        coalesce(e.s, now_at), coalesce(e.s, now_at), now_at
    FROM unnest(keys, payloads, scheduled_ats) AS e (k, p, s)
    ORDER BY e.k COLLATE "C";
    RETURN TRUE;
EXCEPTION WHEN unique_violation THEN  -- a key exists or repeats: undone
    RETURN FALSE;
END
$$;

-- Offer a batch: one (key, outcome) row per element, in input order, exactly
-- as if dq_offer ran for each element in turn (docs/sql-reference.md).
CREATE FUNCTION dq_offer_many(
    queue text,
    keys text[],
    payloads jsonb[],
    scheduled_ats timestamptz[] DEFAULT NULL,
    can_update boolean DEFAULT TRUE
) RETURNS TABLE (key text, outcome text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := @extschema@.dq_now();
    v_queue text := dq_offer_many.queue;
    v_keys text[];           -- the distinct keys
    v_distinct boolean;      -- no key repeats in the batch
    v_new text[];
    v_created integer := 0;
    v_updated integer := 0;
    v_first_at timestamptz;  -- the earliest due time written
    v_stored_keys text[] := '{}';
    v_stored_payloads jsonb[];
    v_stored_ats timestamptz[];
BEGIN
    PERFORM @extschema@.dq__check_queue(v_queue);
    PERFORM @extschema@.dq__null_check(can_update IS NULL, 'can_update');
    PERFORM @extschema@.dq__check_offer_arrays(keys, payloads, scheduled_ats);

    -- The fast path runs in a subtransaction (its EXCEPTION block), so only
    -- a transaction's first write takes it: a transaction never holds more
    -- than one of pgdq's, far below the 64 a backend caches (past them every
    -- other session's snapshots slow down until the transaction ends).
    IF pg_current_xact_id_if_assigned() IS NULL
        AND @extschema@.dq__offer_new(v_queue, keys, payloads, scheduled_ats, v_now) THEN
        IF cardinality(keys) > 0 THEN
            v_first_at := CASE
                WHEN scheduled_ats IS NULL THEN v_now
                ELSE (SELECT min(coalesce(s.s, v_now)) FROM unnest(scheduled_ats) AS s (s))
            END;
            PERFORM @extschema@.dq__wake_if_head(v_queue, v_first_at);
        END IF;
        RETURN QUERY SELECT k.k, 'created'::text FROM unnest(keys) AS k (k);
        RETURN;
    END IF;

    -- Some key exists or repeats: replay the batch key by key.
    v_keys := ARRAY(SELECT DISTINCT k.k FROM unnest(keys) AS k (k));
    v_distinct := cardinality(v_keys) = cardinality(keys);

    -- One pass over the distinct keys in key order: a missing key is created
    -- with its final state, an existing one is locked (DO UPDATE ... WHERE
    -- false locks the row and changes nothing). Every batch takes its locks
    -- in the same order, so concurrent batches never deadlock, and a row being
    -- deleted concurrently is waited for and then either created or locked.
    WITH candidates AS (
        -- distinct keys (the usual batch) need no replay
        SELECT e.k, e.p, coalesce(e.s, v_now) AS at
        FROM unnest(keys, payloads, scheduled_ats) AS e (k, p, s)
        WHERE v_distinct
        UNION ALL
        SELECT c.elem_key, c.final_payload, c.final_at
        FROM @extschema@.dq__offer_chain(
            keys, payloads, scheduled_ats, can_update, v_now, NULL::text[], NULL::jsonb[], NULL::timestamptz[]
        ) AS c
        WHERE NOT v_distinct AND c.is_last
    ),

    inserted AS (
        INSERT INTO @extschema@.dq_messages AS m (
            queue, key, payload, scheduled_at, due_at, created_at
        )
        SELECT v_queue, c.k, c.p, c.at, c.at, v_now
        FROM candidates AS c
        ORDER BY c.k COLLATE "C"
        ON CONFLICT ON CONSTRAINT dq_messages_queue_key DO UPDATE
            SET payload = m.payload
            WHERE FALSE
        RETURNING m.key, m.due_at
    )

    SELECT coalesce(array_agg(inserted.key), '{}'), min(inserted.due_at)
    INTO v_new, v_first_at
    FROM inserted;
    v_created := cardinality(v_new);

    IF v_created < cardinality(v_keys) THEN
        -- the other keys existed and are locked by now: read their versions
        SELECT
            coalesce(array_agg(m.key), '{}'),
            array_agg(m.payload),
            array_agg(m.scheduled_at)
        INTO v_stored_keys, v_stored_payloads, v_stored_ats
        FROM @extschema@.dq_messages AS m
        INNER JOIN unnest(v_keys) AS p (k) ON m.key = p.k
        WHERE m.queue = v_queue
            AND NOT EXISTS (SELECT FROM unnest(v_new) AS n (k) WHERE n.k = m.key);
    END IF;

    IF cardinality(v_stored_keys) > 0 THEN
        WITH updated AS (
            UPDATE @extschema@.dq_messages AS m
            SET payload = c.final_payload,
                scheduled_at = c.final_at,
                due_at = c.final_at,
                created_at = v_now,
                attempts = 0,
                state = NULL,
                last_error = NULL,
                lock_token = NULL
            FROM @extschema@.dq__offer_chain(
                keys, payloads, scheduled_ats, can_update, v_now,
                v_stored_keys, v_stored_payloads, v_stored_ats
            ) AS c
            WHERE c.is_last AND c.had_stored AND c.key_written
                AND m.queue = v_queue AND m.key = c.elem_key
            RETURNING m.due_at
        )

        SELECT count(*), least(v_first_at, min(updated.due_at))
        INTO v_updated, v_first_at
        FROM updated;
    END IF;

    IF v_created + v_updated > 0 THEN
        PERFORM @extschema@.dq__wake_if_head(v_queue, v_first_at);
    END IF;

    IF v_distinct AND cardinality(v_stored_keys) = 0 THEN
        RETURN QUERY SELECT k.k, 'created'::text FROM unnest(keys) AS k (k);
        RETURN;
    END IF;
    RETURN QUERY
    SELECT c.elem_key::text, c.outcome
    FROM @extschema@.dq__offer_chain(
        keys, payloads, scheduled_ats, can_update, v_now,
        v_stored_keys, v_stored_payloads, v_stored_ats
    ) AS c
    WHERE c.elem_ord > 0
    ORDER BY c.elem_ord;
END
$$;

-- Consuming: poll, ack, nack, extend.

-- Lease up to max_count due messages of queue, earliest due first (ties by id).
CREATE FUNCTION dq_poll_many(
    queue text,
    max_count integer,
    lease interval DEFAULT '5 minutes'
) RETURNS SETOF dq_delivery
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := @extschema@.dq_now();
    v_queue text := dq_poll_many.queue;
    v_rows tid[];            -- the picked rows to lease, locked by this poll
    v_max_attempts integer;  -- dq_configure; NULL: no limit
    v_spent bigint[];        -- picked, but already delivered max_attempts times
BEGIN
    IF NOT @extschema@.dq__valid_queue(v_queue)
        OR max_count IS NULL
        OR NOT @extschema@.dq__valid_lease(lease, v_now) THEN
        PERFORM @extschema@.dq__check_queue(v_queue);
        PERFORM @extschema@.dq__null_check(max_count IS NULL, 'max_count');
        PERFORM @extschema@.dq__check_lease(lease, v_now);
    END IF;
    IF max_count <= 0 THEN
        RETURN;
    END IF;

    -- the queue's due schedule occurrences become messages first (64_schedules.sql)
    IF EXISTS (SELECT FROM @extschema@.dq_schedules AS s WHERE s.queue = v_queue AND s.next_at <= v_now) THEN
        PERFORM @extschema@.dq__materialise(v_queue, v_now);
    END IF;
    v_max_attempts := (SELECT q.max_attempts FROM @extschema@.dq_queues AS q WHERE q.queue = v_queue);

    -- Pick and lock in one index range scan of (queue, due_at, id); rows a
    -- concurrent poller holds are skipped, never waited for. The arrays keep
    -- every statement's plan on an index, generic or custom.
    SELECT
        coalesce(array_agg(p.row_at) FILTER (WHERE NOT p.spent), '{}'),
        coalesce(array_agg(p.id) FILTER (WHERE p.spent), '{}')
    INTO v_rows, v_spent
    FROM (
        SELECT m.ctid AS row_at, m.id, coalesce(m.attempts >= v_max_attempts, FALSE) AS spent
        FROM @extschema@.dq_messages AS m
        WHERE m.queue = v_queue AND m.due_at <= v_now
        ORDER BY m.due_at, m.id
        LIMIT max_count
        FOR UPDATE SKIP LOCKED
    ) AS p;

    -- A due message that already had max_attempts deliveries gets no more:
    -- bury it, saying whether its last lease expired without an ack or nack
    -- (its consumers keep dying) or its last delivery was nacked, and with
    -- which error (dq__gave_up_error).
    IF cardinality(v_spent) > 0 THEN
        PERFORM @extschema@.dq__bury(v_spent, NULL::text, v_now, v_max_attempts);
    END IF;
    IF cardinality(v_rows) = 0 THEN
        RETURN;
    END IF;

    -- The rows stay locked by this transaction, so their addresses (ctid)
    -- still find them: one heap fetch each instead of a primary key lookup.
    RETURN QUERY
    WITH leased AS (
        UPDATE @extschema@.dq_messages AS m
        SET attempts = m.attempts + 1,
            lock_token = @extschema@.dq__token(m.id),
            due_at = v_now + lease
        FROM unnest(v_rows) WITH ORDINALITY AS picked (row_at, pos)
        WHERE m.ctid = picked.row_at
        RETURNING
            picked.pos,
            m.id, m.queue, m.key, m.payload, m.state, m.scheduled_at,
            m.created_at, m.attempts, m.lock_token, m.due_at
    )
    SELECT
        l.id, l.queue::text, l.key::text, l.payload, l.state, l.scheduled_at,
        l.created_at, l.attempts, l.attempts > 1, l.lock_token, l.due_at
    FROM leased AS l
    ORDER BY l.pos;
END
$$;

-- Lease the earliest due message of queue, if any.
CREATE FUNCTION dq_poll(
    queue text,
    lease interval DEFAULT '5 minutes'
) RETURNS SETOF dq_delivery
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- plpgsql, not sql: a SQL function that cannot be inlined (its SET
    -- clause) is planned anew on every call, a fifth of an empty poll's time
    RETURN QUERY SELECT * FROM @extschema@.dq_poll_many(dq_poll.queue, 1, dq_poll.lease);
END
$$;

-- Delete the message whose current delivery is lock_token; false when stale.
CREATE FUNCTION dq_ack(lock_token uuid) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
AS $$
#variable_conflict use_column
DECLARE
    v_clock timestamptz := @extschema@.dq_now();  -- unused: an invalid dq.now fails every call
BEGIN
    DELETE FROM @extschema@.dq_messages AS m
    WHERE m.id = @extschema@.dq__token_id(dq_ack.lock_token)
        AND m.lock_token = dq_ack.lock_token;
    RETURN FOUND;
END
$$;

-- Ack a batch of tokens: the number of messages deleted; stale ones are skipped.
CREATE FUNCTION dq_ack_many(lock_tokens uuid[]) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
AS $$
DECLARE
    v_clock timestamptz := @extschema@.dq_now();  -- unused: an invalid dq.now fails every call
    v_rows tid[];
    v_deleted integer;
BEGIN
    -- Rows are locked in (queue, key) order, the order dq_offer_many locks
    -- in, so a batch ack and a batch offer never deadlock.
    v_rows := ARRAY(
        SELECT m.ctid
        FROM @extschema@.dq_messages AS m
        INNER JOIN unnest(lock_tokens) AS t (token)
            ON m.id = @extschema@.dq__token_id(t.token) AND m.lock_token = t.token
        ORDER BY m.queue, m.key
        FOR UPDATE OF m
    );
    -- Locked by this transaction, the rows are still at those addresses
    -- (ctid): one heap fetch each instead of a second primary key lookup.
    -- (A separate statement: its snapshot sees the versions just locked.)
    DELETE FROM @extschema@.dq_messages AS m
    WHERE m.ctid = ANY (v_rows);
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    RETURN v_deleted;
END
$$;

-- Ack lock_tokens (as dq_ack_many), then poll (as dq_poll_many), in one
-- statement: a batch consumer hands back its previous batch with its next
-- poll, one round trip per batch. An addition to version 1 of the SQL API.
CREATE FUNCTION dq_ack_poll(
    lock_tokens uuid[],
    queue text,
    max_count integer,
    lease interval DEFAULT '5 minutes'
) RETURNS SETOF dq_delivery
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@.dq_ack_many(lock_tokens);
    -- a bad queue, max_count or lease raises here and undoes the acks
    RETURN QUERY SELECT * FROM @extschema@.dq_poll_many(queue, max_count, lease);
END
$$;

-- Give a leased message back, due at retry_at (NULL: now), with the
-- consumer's error (its last dq__error_max_length() characters; NULL: none)
-- as the message's last_error; false when stale.
CREATE FUNCTION dq_nack(
    lock_token uuid,
    retry_at timestamptz DEFAULT NULL,
    state jsonb DEFAULT NULL,
    error text DEFAULT NULL
) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := @extschema@.dq_now();
    v_queue text;
    v_due_at timestamptz;
BEGIN
    -- an infinite retry time would park the message for ever (or, -infinity,
    -- make dq_next_due and dq_stats report -infinity): refuse it
    IF NOT coalesce(isfinite(dq_nack.retry_at), TRUE) THEN
        PERFORM @extschema@.dq__check_finite(dq_nack.retry_at, 'retry_at');
    END IF;
    UPDATE @extschema@.dq_messages AS m
    SET lock_token = NULL,
        due_at = coalesce(dq_nack.retry_at, v_now),
        state = coalesce(dq_nack.state, m.state),
        last_error = right(dq_nack.error, @extschema@.dq__error_max_length())
    WHERE m.id = @extschema@.dq__token_id(dq_nack.lock_token)
        AND m.lock_token = dq_nack.lock_token
    RETURNING m.queue, m.due_at INTO v_queue, v_due_at;
    IF NOT FOUND THEN
        RETURN FALSE;
    END IF;
    -- a message handed back before the queue's head wakes idle consumers
    PERFORM @extschema@.dq__wake_if_head(v_queue, v_due_at);
    RETURN TRUE;
END
$$;

-- Heartbeat: lease until now + lease; the new lease_until, NULL when stale.
CREATE FUNCTION dq_extend(
    lock_token uuid,
    lease interval
) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := @extschema@.dq_now();
    v_until timestamptz;
BEGIN
    IF NOT @extschema@.dq__valid_lease(lease, v_now) THEN
        PERFORM @extschema@.dq__check_lease(lease, v_now);
    END IF;
    UPDATE @extschema@.dq_messages AS m
    SET due_at = v_now + lease
    WHERE m.id = @extschema@.dq__token_id(dq_extend.lock_token)
        AND m.lock_token = dq_extend.lock_token
    RETURNING m.due_at INTO v_until;
    RETURN v_until;
END
$$;

-- Dead letters and per-queue settings (additions to version 1 of the SQL API): give up on a
-- message, list, redrive and purge what was given up on, and cap the
-- deliveries a message may get.

-- Set queue's max_attempts (NULL: no limit); polls enforce it from then on.
CREATE FUNCTION dq_configure(queue text, max_attempts integer) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_clock timestamptz := @extschema@.dq_now();  -- unused: an invalid dq.now fails every call
BEGIN
    PERFORM @extschema@.dq__check_queue(dq_configure.queue);
    IF max_attempts <= 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = format('pgdq: max_attempts must be positive or NULL, got %s', max_attempts);
    END IF;
    INSERT INTO @extschema@.dq_queues AS q (queue, max_attempts)
    VALUES (dq_configure.queue, dq_configure.max_attempts)
    ON CONFLICT (queue) DO UPDATE SET max_attempts = excluded.max_attempts;
END
$$;

-- Why a poll gave up on a message after max_attempts deliveries: how its
-- last delivery ended (nacked, or its lease expired), and the error of the
-- last nack when it gave one (last_error).
CREATE FUNCTION dq__gave_up_error(max_attempts integer, nacked boolean, last_error text) RETURNS text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT format('pgdq: gave up after %s deliveries (max_attempts %s): ', max_attempts, max_attempts)
        || CASE
            WHEN nacked THEN 'the last delivery was nacked' || coalesce(': ' || last_error, '')
            ELSE 'the last lease expired without an ack or nack'
                || coalesce('; an earlier delivery was nacked: ' || last_error, '')
        END
$$;

-- Move the (locked, current) messages ids to the dead letters, failed at
-- failed_at, with error; or, when max_attempts is given (a poll enforcing
-- it), each with why the poll gave up on it (dq__gave_up_error). The number
-- moved. The one place that buries messages.
CREATE FUNCTION dq__bury(
    ids bigint[], error text, failed_at timestamptz, max_attempts integer
) RETURNS integer
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    WITH moved AS (
        DELETE FROM @extschema@.dq_messages AS m
        WHERE m.id = ANY(dq__bury.ids)
        RETURNING m.queue, m.key, m.id, m.payload, m.state, m.scheduled_at, m.created_at, m.attempts,
            m.lock_token IS NULL AS nacked, m.last_error
    ),

    buried AS (
        INSERT INTO @extschema@.dq_dead_letters AS d (
            queue, key, id, payload, state, scheduled_at, created_at, attempts, error, failed_at
        )
        SELECT mv.queue, mv.key, mv.id, mv.payload, mv.state, mv.scheduled_at, mv.created_at, mv.attempts,
            CASE
                WHEN dq__bury.max_attempts IS NULL THEN dq__bury.error
                ELSE @extschema@.dq__gave_up_error(dq__bury.max_attempts, mv.nacked, mv.last_error)
            END,
            dq__bury.failed_at
        FROM moved AS mv
        ORDER BY mv.queue, mv.key
        ON CONFLICT ON CONSTRAINT dq_dead_letters_pkey DO UPDATE
            SET id = excluded.id,
                payload = excluded.payload,
                state = excluded.state,
                scheduled_at = excluded.scheduled_at,
                created_at = excluded.created_at,
                attempts = excluded.attempts,
                error = excluded.error,
                failed_at = excluded.failed_at
        RETURNING 1
    )

    SELECT count(*)::integer FROM buried
$$;

-- Give up on a leased message: move it to the dead letters with error (the
-- consumer's verdict, as given); false (nothing changed) for a stale token.
CREATE FUNCTION dq_dead_letter(lock_token uuid, error text DEFAULT NULL) RETURNS boolean
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT @extschema@.dq__bury(
        ARRAY(
            SELECT m.id FROM @extschema@.dq_messages AS m
            WHERE m.id = @extschema@.dq__token_id(dq_dead_letter.lock_token)
                AND m.lock_token = dq_dead_letter.lock_token
            FOR UPDATE
        ),
        dq_dead_letter.error,
        @extschema@.dq_now(),
        NULL::integer
    ) = 1
$$;

-- Up to max_count of queue's dead letters, oldest failure first.
CREATE FUNCTION dq_dead_list(queue text, max_count integer DEFAULT 100) RETURNS TABLE (
    queue text,
    key text,
    payload jsonb,
    state jsonb,
    scheduled_at timestamptz,
    created_at timestamptz,
    attempts integer,
    error text,
    failed_at timestamptz
)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- the checks are statements of their own: each runs, row or no row
    SELECT @extschema@.dq_now();  -- unused: an invalid dq.now fails every call
    SELECT @extschema@.dq__check_queue(dq_dead_list.queue);
    SELECT @extschema@.dq__null_check(dq_dead_list.max_count IS NULL, 'max_count');
    SELECT d.queue::text, d.key::text, d.payload, d.state, d.scheduled_at, d.created_at, d.attempts, d.error, d.failed_at
    FROM @extschema@.dq_dead_letters AS d
    WHERE d.queue = dq_dead_list.queue
    ORDER BY d.failed_at, d.key
    LIMIT greatest(dq_dead_list.max_count, 0);
$$;

-- Offer queue's dead letters again (only key's when given), due at
-- scheduled_at (NULL: now), fresh: attempts 0, no state. A dead letter whose
-- key has a live message again is left where it is. The number re-offered.
CREATE FUNCTION dq_dead_redrive(
    queue text,
    key text DEFAULT NULL,
    scheduled_at timestamptz DEFAULT NULL
) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := @extschema@.dq_now();
    v_queue text := dq_dead_redrive.queue;
    v_key text := dq_dead_redrive.key;
    v_at timestamptz := coalesce(dq_dead_redrive.scheduled_at, v_now);
    v_offered text[];
    v_count integer;
BEGIN
    PERFORM @extschema@.dq__check_queue(v_queue);
    IF v_key IS NOT NULL THEN
        PERFORM @extschema@.dq__check_key(v_key, 'key');
    END IF;
    PERFORM @extschema@.dq__check_finite(dq_dead_redrive.scheduled_at, 'scheduled_at');
    -- Lock order (docs/sql-reference.md, Concurrency): messages in key
    -- order, then dead letters in key order, the order a bury takes them in
    -- (it holds the message when it writes the dead letter). So first the
    -- messages. ON CONFLICT DO NOTHING skips every key that has a live
    -- message, however recently offered; NOT EXISTS only spares most of them
    -- an insert. Both go by this statement's snapshot, which is stale after
    -- an insert waited (for an offer, ack or bury of that key): meanwhile a
    -- later key may have been offered, leased and buried again, its dead
    -- letter replaced (or purged). The next statement sets that right.
    WITH offered AS (
        INSERT INTO @extschema@.dq_messages AS m (queue, key, payload, scheduled_at, due_at, created_at)
        SELECT v_queue, d.key, d.payload, v_at, v_at, v_now
        FROM @extschema@.dq_dead_letters AS d
        WHERE d.queue = v_queue AND (v_key IS NULL OR d.key = v_key)
            AND NOT EXISTS (
                SELECT FROM @extschema@.dq_messages AS live
                WHERE live.queue = v_queue AND live.key = d.key
            )
        ORDER BY d.key
        ON CONFLICT ON CONSTRAINT dq_messages_queue_key DO NOTHING
        RETURNING m.key
    )

    SELECT coalesce(array_agg(offered.key), '{}') INTO v_offered FROM offered;

    -- Then their dead letters, locked afresh in key order and removed. Each
    -- new message takes the payload of the dead letter removed (a newer one
    -- when its key was buried again while the insert waited), and one whose
    -- dead letter is gone is withdrawn: what is re-offered is exactly what
    -- is removed. Those messages are this call's own rows: nothing waits.
    WITH doomed AS (
        SELECT d.key FROM @extschema@.dq_dead_letters AS d
        WHERE d.queue = v_queue AND d.key = ANY(v_offered)
        ORDER BY d.key
        FOR UPDATE
    ),

    removed AS (
        DELETE FROM @extschema@.dq_dead_letters AS d
        USING doomed
        WHERE d.queue = v_queue AND d.key = doomed.key
        RETURNING d.key, d.payload
    ),

    refreshed AS (
        UPDATE @extschema@.dq_messages AS m
        SET payload = r.payload
        FROM removed AS r
        WHERE m.queue = v_queue AND m.key = r.key AND m.payload <> r.payload
    ),

    withdrawn AS (
        DELETE FROM @extschema@.dq_messages AS m
        WHERE m.queue = v_queue AND m.key = ANY(v_offered)
            AND NOT EXISTS (SELECT FROM removed AS r WHERE r.key = m.key)
    )

    SELECT count(*)::integer INTO v_count FROM removed;
    IF v_count > 0 THEN
        PERFORM @extschema@.dq__wake_if_head(v_queue, v_at);
    END IF;
    RETURN v_count;
END
$$;

-- Delete queue's dead letters (only key's when given); the count deleted.
CREATE FUNCTION dq_dead_purge(queue text, key text DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_clock timestamptz := @extschema@.dq_now();  -- unused: an invalid dq.now fails every call
    v_deleted bigint;
BEGIN
    PERFORM @extschema@.dq__check_queue(dq_dead_purge.queue);
    IF dq_dead_purge.key IS NOT NULL THEN
        PERFORM @extschema@.dq__check_key(dq_dead_purge.key, 'key');
    END IF;
    -- Locks in key order, like every multi-row writer (a poll burying
    -- messages upserts their dead letters in key order), so none deadlock.
    WITH doomed AS (
        SELECT d.key FROM @extschema@.dq_dead_letters AS d
        WHERE d.queue = dq_dead_purge.queue
            AND (dq_dead_purge.key IS NULL OR d.key = dq_dead_purge.key)
        ORDER BY d.key
        FOR UPDATE
    )

    DELETE FROM @extschema@.dq_dead_letters AS d
    USING doomed
    WHERE d.queue = dq_dead_purge.queue AND d.key = doomed.key;
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    RETURN v_deleted;
END
$$;

-- Managing: cancel, get, peek, purge, stats, next_due.
-- The reading functions are LANGUAGE sql: their argument checks are
-- statements of their own, so each runs whether or not a row is read, and
-- their result columns may repeat their arguments' names.

-- Delete one message, leased or not; true if one was deleted.
CREATE FUNCTION dq_cancel(queue text, key text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_clock timestamptz := @extschema@.dq_now();  -- unused: an invalid dq.now fails every call
BEGIN
    PERFORM @extschema@.dq__check_queue(dq_cancel.queue);
    PERFORM @extschema@.dq__check_key(dq_cancel.key, 'key');
    DELETE FROM @extschema@.dq_messages AS m
    WHERE m.queue = dq_cancel.queue AND m.key = dq_cancel.key;
    RETURN FOUND;
END
$$;

-- Read one message without locking or changing it (zero or one row).
CREATE FUNCTION dq_get(queue text, key text) RETURNS TABLE (
    queue text,
    key text,
    payload jsonb,
    state jsonb,
    scheduled_at timestamptz,
    due_at timestamptz,
    attempts integer,
    leased boolean,
    created_at timestamptz
)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT @extschema@.dq_now();  -- unused: an invalid dq.now fails every call
    SELECT @extschema@.dq__check_queue(dq_get.queue);
    SELECT @extschema@.dq__check_key(dq_get.key, 'key');
    SELECT
        m.queue::text, m.key::text, m.payload, m.state, m.scheduled_at,
        m.due_at, m.attempts,
        @extschema@.dq__is_leased(m.lock_token, m.due_at, n.now_at),
        m.created_at
    FROM @extschema@.dq_messages AS m
    CROSS JOIN @extschema@.dq_now() AS n (now_at)
    WHERE m.queue = dq_get.queue AND m.key = dq_get.key;
$$;

-- Browse queue without locking or changing anything: up to max_count
-- messages (1..1000) in one condition (which: 'due', 'delayed', 'leased';
-- NULL: all), by due time then key; never a lock token.
CREATE FUNCTION dq_peek(
    queue text,
    which text DEFAULT NULL,
    max_count integer DEFAULT 100
) RETURNS TABLE (
    key text,
    payload jsonb,
    state jsonb,
    scheduled_at timestamptz,
    due_at timestamptz,
    attempts integer,
    leased boolean,
    lease_until timestamptz,
    last_error text
)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT @extschema@.dq_now();  -- unused: an invalid dq.now fails every call
    SELECT @extschema@.dq__check_queue(dq_peek.queue);
    SELECT @extschema@.dq__check_one_of(dq_peek.which, 'which', ARRAY['due', 'delayed', 'leased']);
    SELECT @extschema@.dq__check_between(dq_peek.max_count, 'max_count', 1, 1000);
    SELECT
        m.key::text, m.payload, m.state, m.scheduled_at, m.due_at, m.attempts,
        l.leased,
        CASE WHEN l.leased THEN m.due_at END,
        m.last_error
    FROM @extschema@.dq_messages AS m
    CROSS JOIN @extschema@.dq_now() AS n (now_at)
    CROSS JOIN LATERAL (SELECT @extschema@.dq__is_leased(m.lock_token, m.due_at, n.now_at)) AS l (leased)
    WHERE m.queue = dq_peek.queue
        AND CASE dq_peek.which
            WHEN 'due' THEN m.due_at <= n.now_at
            WHEN 'delayed' THEN m.due_at > n.now_at AND NOT l.leased
            WHEN 'leased' THEN l.leased
            ELSE TRUE
        END
    ORDER BY m.due_at, m.key
    LIMIT dq_peek.max_count;
$$;

-- Delete every message of queue; the count deleted.
CREATE FUNCTION dq_purge(queue text) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_clock timestamptz := @extschema@.dq_now();  -- unused: an invalid dq.now fails every call
    v_deleted bigint;
BEGIN
    PERFORM @extschema@.dq__check_queue(dq_purge.queue);
    -- Locks in key order, like dq_offer_many, so the two never deadlock.
    WITH doomed AS (
        SELECT m.id FROM @extschema@.dq_messages AS m
        WHERE m.queue = dq_purge.queue
        ORDER BY m.key
        FOR UPDATE
    )
    DELETE FROM @extschema@.dq_messages AS m
    USING doomed AS d
    WHERE m.id = d.id;
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    RETURN v_deleted;
END
$$;

-- One row per queue with messages, or exactly one row for the named queue.
CREATE FUNCTION dq_stats(queue text DEFAULT NULL) RETURNS TABLE (
    queue text,
    ready bigint,
    delayed bigint,
    leased bigint,
    oldest_ready_at timestamptz,
    next_due_at timestamptz
)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT @extschema@.dq_now();  -- unused: an invalid dq.now fails every call
    SELECT @extschema@.dq__check_queue(dq_stats.queue) WHERE dq_stats.queue IS NOT NULL;
    WITH counted AS (
        SELECT
            m.queue,
            count(*) FILTER (WHERE m.due_at <= n.now_at) AS ready,
            count(*) FILTER (
                WHERE m.due_at > n.now_at AND m.lock_token IS NULL
            ) AS delayed,
            count(*) FILTER (
                WHERE @extschema@.dq__is_leased(m.lock_token, m.due_at, n.now_at)
            ) AS leased,
            min(m.due_at) FILTER (WHERE m.due_at <= n.now_at) AS oldest_ready_at,
            min(m.due_at) FILTER (
                WHERE m.due_at > n.now_at AND m.lock_token IS NULL
            ) AS next_due_at
        FROM @extschema@.dq_messages AS m
        CROSS JOIN @extschema@.dq_now() AS n (now_at)
        WHERE dq_stats.queue IS NULL OR m.queue = dq_stats.queue
        GROUP BY m.queue
    )

    SELECT
        coalesce(c.queue, named.queue)::text,
        coalesce(c.ready, 0),
        coalesce(c.delayed, 0),
        coalesce(c.leased, 0),
        c.oldest_ready_at,
        c.next_due_at
    FROM counted AS c
    -- a named queue always gets its row, zeros when empty
    FULL JOIN (SELECT dq_stats.queue AS queue WHERE dq_stats.queue IS NOT NULL) AS named
        ON c.queue = named.queue
    ORDER BY 1;
$$;

-- The earliest due time in queue (leases by their end); NULL when empty.
CREATE FUNCTION dq_next_due(queue text) RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
AS $$
#variable_conflict use_column
DECLARE
    v_clock timestamptz := @extschema@.dq_now();  -- unused: an invalid dq.now fails every call
BEGIN
    PERFORM @extschema@.dq__check_queue(dq_next_due.queue);
    -- the first entry of the queue's range in (queue, due_at, id), or the
    -- next occurrence of one of its schedules if that comes first
    RETURN least(
        (
            SELECT m.due_at FROM @extschema@.dq_messages AS m
            WHERE m.queue = dq_next_due.queue
            ORDER BY m.due_at
            LIMIT 1
        ),
        (
            SELECT s.next_at FROM @extschema@.dq_schedules AS s
            WHERE s.queue = dq_next_due.queue AND s.next_at < 'infinity'
            ORDER BY s.next_at
            LIMIT 1
        )
    );
END
$$;

-- Snapshot reads (additions to version 1 of the SQL API): the messages or
-- dead letters of a queue, or of every queue, in id ranges, so that several
-- readers can split a table between them and read it in one snapshot
-- (pg_export_snapshot; python/pgdq/spark.py). They lock and change nothing
-- and never return lock tokens. Bounds: from_id <= id < to_id, NULL
-- unbounded; written `id <= coalesce(to_id, max) AND id IS DISTINCT FROM
-- to_id` so that a generic plan still ranges over an index on id.

-- The messages of queue (NULL: every queue) with from_id <= id < to_id, by id.
CREATE FUNCTION dq_read_messages(queue text, from_id bigint, to_id bigint) RETURNS TABLE (
    id bigint,
    queue text,
    key text,
    payload jsonb,
    state jsonb,
    scheduled_at timestamptz,
    due_at timestamptz,
    created_at timestamptz,
    attempts integer,
    leased boolean
)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT @extschema@.dq_now();  -- unused: an invalid dq.now fails every call
    SELECT @extschema@.dq__check_queue(dq_read_messages.queue) WHERE dq_read_messages.queue IS NOT NULL;
    SELECT
        m.id, m.queue::text, m.key::text, m.payload, m.state, m.scheduled_at, m.due_at, m.created_at,
        m.attempts, @extschema@.dq__is_leased(m.lock_token, m.due_at, n.now_at)
    FROM @extschema@.dq_messages AS m
    CROSS JOIN @extschema@.dq_now() AS n (now_at)
    WHERE (dq_read_messages.queue IS NULL OR m.queue = dq_read_messages.queue)
        AND m.id >= coalesce(dq_read_messages.from_id, -9223372036854775808)
        AND m.id <= coalesce(dq_read_messages.to_id, 9223372036854775807)
        AND m.id IS DISTINCT FROM dq_read_messages.to_id
    ORDER BY m.id;
$$;

-- The dead letters of queue (NULL: every queue) with from_id <= id < to_id
-- (id: the message's id when it failed), by id.
CREATE FUNCTION dq_read_dead_letters(queue text, from_id bigint, to_id bigint) RETURNS TABLE (
    id bigint,
    queue text,
    key text,
    payload jsonb,
    state jsonb,
    scheduled_at timestamptz,
    created_at timestamptz,
    attempts integer,
    error text,
    failed_at timestamptz
)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT @extschema@.dq_now();  -- unused: an invalid dq.now fails every call
    SELECT @extschema@.dq__check_queue(dq_read_dead_letters.queue) WHERE dq_read_dead_letters.queue IS NOT NULL;
    SELECT
        d.id, d.queue::text, d.key::text, d.payload, d.state, d.scheduled_at, d.created_at,
        d.attempts, d.error, d.failed_at
    FROM @extschema@.dq_dead_letters AS d
    WHERE (dq_read_dead_letters.queue IS NULL OR d.queue = dq_read_dead_letters.queue)
        AND d.id >= coalesce(dq_read_dead_letters.from_id, -9223372036854775808)
        AND d.id <= coalesce(dq_read_dead_letters.to_id, 9223372036854775807)
        AND d.id IS DISTINCT FROM dq_read_dead_letters.to_id
    ORDER BY d.id;
$$;

-- The lowest and highest id (NULL, NULL when there are none) of source,
-- 'messages' or 'dead_letters', in queue (NULL: every queue). For every
-- queue it reads the two ends of an index on id; for one, that queue's rows.
CREATE FUNCTION dq_read_bounds(source text, queue text) RETURNS TABLE (low bigint, high bigint)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_clock timestamptz := @extschema@.dq_now();  -- unused: an invalid dq.now fails every call
BEGIN
    PERFORM @extschema@.dq__null_check(dq_read_bounds.source IS NULL, 'source');
    PERFORM @extschema@.dq__check_one_of(dq_read_bounds.source, 'source', ARRAY['messages', 'dead_letters']);
    IF dq_read_bounds.queue IS NOT NULL THEN
        PERFORM @extschema@.dq__check_queue(dq_read_bounds.queue);
    END IF;
    -- one statement per case, so each keeps its own plan
    IF dq_read_bounds.source = 'messages' AND dq_read_bounds.queue IS NULL THEN
        RETURN QUERY SELECT min(m.id), max(m.id) FROM @extschema@.dq_messages AS m;
    ELSIF dq_read_bounds.source = 'messages' THEN
        RETURN QUERY SELECT min(m.id), max(m.id) FROM @extschema@.dq_messages AS m
        WHERE m.queue = dq_read_bounds.queue;
    ELSIF dq_read_bounds.queue IS NULL THEN
        RETURN QUERY SELECT min(d.id), max(d.id) FROM @extschema@.dq_dead_letters AS d;
    ELSE
        RETURN QUERY SELECT min(d.id), max(d.id) FROM @extschema@.dq_dead_letters AS d
        WHERE d.queue = dq_read_bounds.queue;
    END IF;
END
$$;

-- Recurring messages: occurrences are ordinary messages whose keys are
-- {key_prefix}/{config_hash}/{YYYYMMDD}T{HHMMSS}.{microseconds}Z.

-- Raise 22004/22023 unless part is 1..max_length characters without '/'.
CREATE FUNCTION dq__check_key_part(
    part text, arg_name text, max_length integer
) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@.dq__check_name(part, arg_name, max_length);
    IF strpos(part, '/') > 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = format('pgdq: %s must not contain "/"', arg_name);
    END IF;
END
$$;

-- The occurrence key of one scheduled time (the time in UTC).
CREATE FUNCTION dq__occurrence_key(
    key_prefix text, config_hash text, at timestamptz
) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT key_prefix OPERATOR(pg_catalog.||) '/'
        OPERATOR(pg_catalog.||) config_hash OPERATOR(pg_catalog.||) '/'
        OPERATOR(pg_catalog.||) pg_catalog.to_char(
            at AT TIME ZONE 'UTC', 'YYYYMMDD"T"HH24MISS.US"Z"'
        )
$$;

-- Raise 22004/22023 unless key_prefix (a cron key prefix, or a schedule's
-- name: arg_name) is 1..100 characters without '/'.
CREATE FUNCTION dq__check_key_prefix(key_prefix text, arg_name text) RETURNS void
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT @extschema@.dq__check_key_part(key_prefix, arg_name, 100) $$;

-- Raise 22004/22023 unless config_hash is 1..64 characters without '/'.
CREATE FUNCTION dq__check_config_hash(config_hash text) RETURNS void
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT @extschema@.dq__check_key_part(config_hash, 'config_hash', 64) $$;

-- Delete the not-leased occurrences under key_prefix/ whose keys are in
-- [from_key, below_key) (NULL: unbounded), all of them or only those whose
-- config hash is (keep_hash = false) or is not (keep_hash = true)
-- config_hash; the count deleted. Rows are locked in key order, like every
-- multi-row writer.
CREATE FUNCTION dq__cron_delete(
    queue text, key_prefix text, config_hash text, keep_hash boolean,
    from_key text DEFAULT NULL, below_key text DEFAULT NULL
) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := @extschema@.dq_now();
    v_deleted integer;
BEGIN
    -- Keys are in C collation, so "starts with prefix/" is the index range
    -- [prefix/, prefix0): '0' is the byte after '/'. No LIKE pattern, so a
    -- prefix with % or _ in it means only itself.
    WITH doomed AS (
        SELECT m.id
        FROM @extschema@.dq_messages AS m
        WHERE m.queue = dq__cron_delete.queue
            AND m.key >= greatest(dq__cron_delete.key_prefix || '/', dq__cron_delete.from_key)
            AND m.key < least(dq__cron_delete.key_prefix || '0', dq__cron_delete.below_key)
            AND NOT @extschema@.dq__is_leased(m.lock_token, m.due_at, v_now)
            AND (
                dq__cron_delete.config_hash IS NULL
                OR (
                    split_part(substr(m.key, length(dq__cron_delete.key_prefix) + 2), '/', 1)
                    = dq__cron_delete.config_hash
                ) <> dq__cron_delete.keep_hash
            )
        ORDER BY m.key
        FOR UPDATE
    )

    DELETE FROM @extschema@.dq_messages AS m
    USING doomed AS d
    WHERE m.id = d.id;
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    RETURN v_deleted;
END
$$;

-- Replace key_prefix's pending occurrences of other configurations and offer
-- the future ones given; the number of occurrences created (docs/sql-reference.md).
CREATE FUNCTION dq_cron_install(
    queue text,
    key_prefix text,
    config_hash text,
    scheduled_ats timestamptz[],
    payloads jsonb[],
    can_update boolean DEFAULT FALSE
) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := @extschema@.dq_now();
    v_keys text[];
    v_payloads jsonb[];
    v_ats timestamptz[];
    v_created integer;
    v_range_start text;
    v_range_end text;
BEGIN
    PERFORM @extschema@.dq__check_queue(queue);
    PERFORM @extschema@.dq__check_key_prefix(key_prefix, 'key_prefix');
    PERFORM @extschema@.dq__check_config_hash(config_hash);
    PERFORM @extschema@.dq__null_check(scheduled_ats IS NULL, 'scheduled_ats');
    PERFORM @extschema@.dq__null_check(payloads IS NULL, 'payloads');
    PERFORM @extschema@.dq__null_check(can_update IS NULL, 'can_update');
    IF cardinality(scheduled_ats) <> cardinality(payloads)
        OR coalesce(array_ndims(scheduled_ats), 1) > 1
        OR coalesce(array_ndims(payloads), 1) > 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = format(
                'pgdq: scheduled_ats and payloads must be one-dimensional arrays of equal length, got %s and %s',
                cardinality(scheduled_ats), cardinality(payloads)
            );
    END IF;
    PERFORM @extschema@.dq__check_elements(pg_catalog.array_position(scheduled_ats, NULL), scheduled_ats IS NULL, 'scheduled_ats');
    PERFORM @extschema@.dq__check_elements(pg_catalog.array_position(payloads, NULL), payloads IS NULL, 'payloads');
    PERFORM @extschema@.dq__check_finite_elements(scheduled_ats, 'scheduled_ats');

    -- Installers of one prefix take turns, so the last one to run sees (and
    -- replaces) everything the one before it wrote.
    PERFORM pg_advisory_xact_lock(hashtextextended(queue || '/' || key_prefix, 0));
    -- This configuration's keys are the range [prefix/hash/, prefix/hash0).
    -- Other configurations' occurrences below it are deleted first, this
    -- one's are offered, then those above it are deleted: one ascending key
    -- order, the order every multi-row writer locks in, so none deadlock.
    v_range_start := key_prefix || '/' || config_hash || '/';
    v_range_end := key_prefix || '/' || config_hash || '0';
    PERFORM @extschema@.dq__cron_delete(queue, key_prefix, config_hash, true, NULL, v_range_start);

    -- Occurrences at or before now are skipped: already due means already
    -- (being) processed, and must never be installed again.
    SELECT
        coalesce(array_agg(@extschema@.dq__occurrence_key(key_prefix, config_hash, o.at) ORDER BY o.ord), '{}'),
        coalesce(array_agg(o.payload ORDER BY o.ord), '{}'),
        coalesce(array_agg(o.at ORDER BY o.ord), '{}')
    INTO v_keys, v_payloads, v_ats
    FROM unnest(scheduled_ats, payloads) WITH ORDINALITY AS o (at, payload, ord)
    WHERE o.at > v_now;

    SELECT count(*) FILTER (WHERE r.outcome = 'created') INTO v_created
    FROM @extschema@.dq_offer_many(queue, v_keys, v_payloads, v_ats, can_update) AS r;
    PERFORM @extschema@.dq__cron_delete(queue, key_prefix, config_hash, true, v_range_end, NULL);
    RETURN v_created;
END
$$;

-- Delete the not-leased occurrences under key_prefix/ (only config_hash's
-- when given); the count deleted.
CREATE FUNCTION dq_cron_uninstall(
    queue text,
    key_prefix text,
    config_hash text DEFAULT NULL
) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@.dq__check_queue(queue);
    PERFORM @extschema@.dq__check_key_prefix(key_prefix, 'key_prefix');
    IF config_hash IS NOT NULL THEN
        PERFORM @extschema@.dq__check_config_hash(config_hash);
    END IF;
    RETURN @extschema@.dq__cron_delete(queue, key_prefix, config_hash, false);
END
$$;

-- dq_cron_next: the next time a cron expression names, in a time zone (an
-- addition to version 1 of the SQL API). Standard 5 fields (minute hour day-of-month month
-- day-of-week) or 6 with a leading seconds field; lists, ranges, steps,
-- month and day names. It agrees with croniter, DST edges included:
--   * a matching wall time that a spring-forward gap skips fires once, at the
--     end of the gap (02:30 on the night New York jumps 02:00 -> 03:00 fires
--     at 03:00 EDT);
--   * a matching wall time that falls back happens twice, and fires twice
--     (01:30 EDT, then 01:30 EST).
-- When both day-of-month and day-of-week are restricted, a day matches either
-- of them (the usual OR rule); like croniter, a field that lists every value
-- counts as unrestricted when the other day field contains a "*".

-- One name or number of a cron field as its number: 10000 (out of every
-- range) for a number of more than 4 digits, NULL for an unknown name.
CREATE FUNCTION dq__cron_value(token text, field text) RETURNS integer
LANGUAGE sql IMMUTABLE
AS $$
    SELECT CASE
        WHEN token OPERATOR(pg_catalog.~) '^[0-9]+$' THEN CASE
            WHEN pg_catalog.length(token) OPERATOR(pg_catalog.<=) 4 THEN token::pg_catalog.int4
            ELSE 10000
        END
        WHEN field OPERATOR(pg_catalog.=) 'month' THEN pg_catalog.array_position(
            ARRAY['jan', 'feb', 'mar', 'apr', 'may', 'jun', 'jul', 'aug', 'sep', 'oct', 'nov', 'dec'], token
        )
        WHEN field OPERATOR(pg_catalog.=) 'day of week' THEN pg_catalog.array_position(
            ARRAY['sun', 'mon', 'tue', 'wed', 'thu', 'fri', 'sat'], token
        ) OPERATOR(pg_catalog.-) 1
    END
$$;

-- The sorted values one cron field allows, or 22023 naming the field. At
-- most 60 list items (no field has more values); linear in the field's
-- length: each item is read once and the values are made in one query.
CREATE FUNCTION dq__cron_field(spec text, field text, lo integer, hi integer) RETURNS integer[]
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_parts text[] := string_to_array(lower(spec), ',');
    v_part text;
    v_match text[];
    v_from integer;
    v_to integer;
    v_step integer;
    v_froms integer[] := '{}';
    v_tos integer[] := '{}';
    v_steps integer[] := '{}';
BEGIN
    IF cardinality(v_parts) > 60 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pgdq: %s field has %s list items, at most 60', field, cardinality(v_parts));
    END IF;
    FOREACH v_part IN ARRAY v_parts LOOP
        v_match := regexp_match(v_part, '^(\*|\?|([a-z0-9]+)(-([a-z0-9]+))?)(/([0-9]{1,4}))?$');
        v_step := coalesce(v_match[6]::integer, 1);
        IF v_match IS NULL OR v_step = 0 THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('pgdq: invalid %s field %L in cron expression', field, spec);
        END IF;
        -- an open range (* or a/n) of weekdays ends at 6: 7 is only an alias of Sunday
        IF v_match[1] IN ('*', '?') THEN
            v_from := lo;
            v_to := CASE WHEN field = 'day of week' THEN 6 ELSE hi END;
        ELSE
            v_from := @extschema@.dq__cron_value(v_match[2], field);
            v_to := CASE
                WHEN v_match[4] IS NOT NULL THEN @extschema@.dq__cron_value(v_match[4], field)
                WHEN v_match[6] IS NOT NULL THEN CASE WHEN field = 'day of week' THEN 6 ELSE hi END
                ELSE v_from
            END;
            IF v_from IS NULL OR v_to IS NULL THEN
                RAISE EXCEPTION USING ERRCODE = '22023',
                    MESSAGE = format(
                        'pgdq: unknown name %L in %s field %L',
                        CASE WHEN v_from IS NULL THEN v_match[2] ELSE v_match[4] END, field, spec
                    );
            END IF;
        END IF;
        IF v_from < lo OR v_to > hi OR v_from > v_to THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = format('pgdq: %s field %L is out of range %s-%s or reversed', field, spec, lo, hi);
        END IF;
        -- the usual field, one value or one range: a slice of 0..59
        IF cardinality(v_parts) = 1 AND v_step = 1 AND NOT (field = 'day of week' AND v_to = 7) THEN
            RETURN ('[0:59]={0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,'
                '30,31,32,33,34,35,36,37,38,39,40,41,42,43,44,45,46,47,48,49,50,51,52,53,54,55,56,57,58,59}'::integer[])[v_from:v_to];
        END IF;
        v_froms := v_froms || v_from;
        v_tos := v_tos || v_to;
        v_steps := v_steps || v_step;
    END LOOP;
    RETURN ARRAY(
        SELECT DISTINCT CASE WHEN field = 'day of week' AND g.v = 7 THEN 0 ELSE g.v END  -- 7 is Sunday too
        FROM unnest(v_froms, v_tos, v_steps) AS r (f, t, s)
        CROSS JOIN LATERAL generate_series(r.f, r.t, r.s) AS g (v)
        ORDER BY 1
    );
END
$$;

-- expression's fields as sorted values (seconds 0 when it has 5 fields);
-- either_day: both day fields are restricted, so a day matching either
-- counts. 22023 for an expression over 1,000 characters or a bad field.
CREATE FUNCTION dq__cron_parse(
    expression text,
    OUT seconds integer[],
    OUT minutes integer[],
    OUT hours integer[],
    OUT days integer[],
    OUT months integer[],
    OUT weekdays integer[],
    OUT either_day boolean
)
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_fields text[];
BEGIN
    IF length(expression) > 1000 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pgdq: expression must be at most 1000 characters, got %s', length(expression));
    END IF;
    v_fields := regexp_split_to_array(btrim(expression), '\s+');
    IF cardinality(v_fields) = 5 THEN
        v_fields := '0'::text || v_fields;
    ELSIF cardinality(v_fields) <> 6 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pgdq: a cron expression has 5 fields (or 6 with seconds first), got %L', expression);
    END IF;
    seconds := @extschema@.dq__cron_field(v_fields[1], 'second', 0, 59);
    minutes := @extschema@.dq__cron_field(v_fields[2], 'minute', 0, 59);
    hours := @extschema@.dq__cron_field(v_fields[3], 'hour', 0, 23);
    days := @extschema@.dq__cron_field(v_fields[4], 'day of month', 1, 31);
    months := @extschema@.dq__cron_field(v_fields[5], 'month', 1, 12);
    weekdays := @extschema@.dq__cron_field(v_fields[6], 'day of week', 0, 7);
    -- croniter's reading of "restricted": not a bare *, and not every value
    -- when the other day field has a * in it
    either_day := NOT (
        v_fields[4] IN ('*', '?') OR (cardinality(days) = 31 AND strpos(v_fields[6], '*') > 0)
    ) AND NOT (
        v_fields[6] IN ('*', '?') OR (cardinality(weekdays) = 7 AND strpos(v_fields[4], '*') > 0)
    );
END
$$;

-- The UTC offset of zone at instant.
CREATE FUNCTION dq__zone_offset(instant timestamptz, zone text) RETURNS interval
LANGUAGE sql STABLE
AS $$ SELECT (instant AT TIME ZONE zone) OPERATOR(pg_catalog.-) (instant AT TIME ZONE 'UTC') $$;

-- The first whole second after lo at which zone's UTC offset is the one it
-- has at hi: the instant its clocks change, when they change once between.
CREATE FUNCTION dq__zone_shift(lo timestamptz, hi timestamptz, zone text) RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_target interval := @extschema@.dq__zone_offset(hi, zone);
    v_lo timestamptz := date_trunc('second', lo);
    v_hi timestamptz := date_trunc('second', hi);
    v_mid timestamptz;
BEGIN
    WHILE v_hi - v_lo > interval '1 second' LOOP
        v_mid := v_lo + date_trunc('second', (v_hi - v_lo) / 2);
        IF @extschema@.dq__zone_offset(v_mid, zone) = v_target THEN
            v_hi := v_mid;
        ELSE
            v_lo := v_mid;
        END IF;
    END LOOP;
    RETURN v_hi;
END
$$;

-- The instants at which zone's clocks read wall: one, two in a fall-back
-- fold, or, for a time a spring-forward gap skips, the end of the gap.
CREATE FUNCTION dq__wall_instants(wall timestamp, zone text) RETURNS SETOF timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_guess timestamptz := wall AT TIME ZONE zone;
    v_before interval := @extschema@.dq__zone_offset(v_guess - interval '3 hours', zone);
    v_after interval := @extschema@.dq__zone_offset(v_guess + interval '3 hours', zone);
    v_found bigint;
BEGIN
    RETURN QUERY
    SELECT DISTINCT c.at
    FROM (VALUES ((wall - v_before) AT TIME ZONE 'UTC'), ((wall - v_after) AT TIME ZONE 'UTC')) AS c (at)
    WHERE (c.at AT TIME ZONE zone) = wall
    ORDER BY c.at;
    GET DIAGNOSTICS v_found = ROW_COUNT;
    IF v_found = 0 THEN
        -- in a gap: the first instant on the new offset
        RETURN NEXT @extschema@.dq__zone_shift(v_guess - interval '3 hours', v_guess + interval '3 hours', zone);
    END IF;
END
$$;

-- The first wall-clock time at or after start that the parsed fields name
-- (see dq__cron_parse); NULL if none before the fifth year from start's day.
CREATE FUNCTION dq__cron_next_wall(
    start timestamp,
    seconds integer[],
    minutes integer[],
    hours integer[],
    days integer[],
    months integer[],
    weekdays integer[],
    either_day boolean
) RETURNS timestamp
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_day date := start::date;
    v_end date := start::date + 366 * 5;
    v_wall timestamp;
    v_hour integer;
    v_minute integer;
    v_second integer;
BEGIN
    WHILE v_day < v_end LOOP
        IF NOT extract(MONTH FROM v_day)::integer = ANY(months) THEN
            v_day := date_trunc('month', v_day) + interval '1 month';
            CONTINUE;
        END IF;
        IF (either_day AND (extract(DAY FROM v_day)::integer = ANY(days)
                OR extract(DOW FROM v_day)::integer = ANY(weekdays)))
            OR (NOT either_day AND extract(DAY FROM v_day)::integer = ANY(days)
                AND extract(DOW FROM v_day)::integer = ANY(weekdays)) THEN
            FOREACH v_hour IN ARRAY hours LOOP
                CONTINUE WHEN v_day + make_interval(hours => v_hour + 1) <= start;
                FOREACH v_minute IN ARRAY minutes LOOP
                    CONTINUE WHEN v_day + make_interval(hours => v_hour, mins => v_minute + 1) <= start;
                    FOREACH v_second IN ARRAY seconds LOOP
                        v_wall := v_day + make_interval(hours => v_hour, mins => v_minute, secs => v_second);
                        IF v_wall >= start THEN
                            RETURN v_wall;
                        END IF;
                    END LOOP;
                END LOOP;
            END LOOP;
        END IF;
        v_day := v_day + 1;
    END LOOP;
    RETURN NULL;
END
$$;

-- The first time after `after` that the parsed fields name in zone (NULL
-- if none within 5 years), with dq_cron_next's DST rules. A few offset
-- probes and calendar steps, near a DST change too: with the clocks
-- reading w(t) at instant t, the wall times after `after` are walked in
-- order and the first that names a time is mapped to its instants, which
-- is right unless the clocks fall back soon (within 3 hours; changes are
-- assumed at least 6 hours apart): then the rest of the first pass comes
-- first, and then the times from the fold on.
CREATE FUNCTION dq__cron_next_at(
    after timestamptz,
    zone text,
    seconds integer[],
    minutes integer[],
    hours integer[],
    days integer[],
    months integer[],
    weekdays integer[],
    either_day boolean
) RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_offset interval := @extschema@.dq__zone_offset(after, zone);
    v_later interval := @extschema@.dq__zone_offset(after + interval '3 hours', zone);
    v_from timestamp := date_trunc('second', after AT TIME ZONE zone) + interval '1 second';
    v_floor timestamptz := after;  -- the answer is later than this
    v_fold timestamptz;
    v_wall timestamp;
    v_at timestamptz;
BEGIN
    IF v_later < v_offset THEN
        -- the clocks fall back within 3 hours, at v_fold: first the rest of
        -- the first pass, then from the fold on, where they repeat times
        v_fold := @extschema@.dq__zone_shift(after, after + interval '3 hours', zone);
        v_wall := @extschema@.dq__cron_next_wall(v_from, seconds, minutes, hours, days, months, weekdays, either_day);
        IF v_wall < (v_fold AT TIME ZONE 'UTC') + v_offset THEN
            RETURN (v_wall - v_offset) AT TIME ZONE 'UTC';
        END IF;
        v_from := v_fold AT TIME ZONE zone;
        v_floor := v_fold - interval '1 microsecond';
    END IF;
    FOR i IN 1..10 LOOP
        v_wall := @extschema@.dq__cron_next_wall(v_from, seconds, minutes, hours, days, months, weekdays, either_day);
        IF v_wall IS NULL THEN
            RETURN NULL;
        END IF;
        v_at := (v_wall - v_offset) AT TIME ZONE 'UTC';
        -- no change of the clocks within 3 hours, and the time is within them
        IF v_later = v_offset AND v_at <= after + interval '3 hours' THEN
            RETURN v_at;
        END IF;
        SELECT min(w.at) INTO v_at FROM @extschema@.dq__wall_instants(v_wall, zone) AS w (at) WHERE w.at > v_floor;
        IF v_at IS NOT NULL THEN
            RETURN v_at;
        END IF;
        v_from := v_wall + interval '1 second';
    END LOOP;
    RETURN NULL;
END
$$;

-- The first time after `after` that expression names in zone (NULL if none
-- within 5 years); 22023 for an invalid expression or zone, or an `after`
-- outside 4713-01-01 BC to 294270-01-01 (the search must stay in the
-- timestamp range). STABLE, not IMMUTABLE: the answer depends on the
-- server's time zone data.
CREATE FUNCTION dq_cron_next(expression text, after timestamptz, timezone text) RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_cron record;
BEGIN
    PERFORM @extschema@.dq__null_check(expression IS NULL, 'expression');
    PERFORM @extschema@.dq__null_check(after IS NULL, 'after');
    PERFORM @extschema@.dq__null_check(timezone IS NULL, 'timezone');
    PERFORM @extschema@.dq__check_finite(after, 'after');
    IF after < '4713-01-01 00:00:00+00 BC' OR after >= '294270-01-01 00:00:00+00' THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pgdq: after must be from 4713-01-01 BC to 294270-01-01 UTC, got %s', after);
    END IF;
    v_cron := @extschema@.dq__cron_parse(expression);
    RETURN @extschema@.dq__cron_next_at(
        after, timezone, v_cron.seconds, v_cron.minutes, v_cron.hours,
        v_cron.days, v_cron.months, v_cron.weekdays, v_cron.either_day
    );
END
$$;

-- Schedules kept by the database (additions to version 1 of the SQL API): a named cron
-- schedule per queue whose occurrences the queue's own polls turn into
-- messages with occurrence keys, exactly once however many consumers poll,
-- with no scheduler process. dq_next_due counts the next occurrence, so an
-- idle worker wakes for it.

-- The config hash of a schedule: its occurrences' keys carry it.
CREATE FUNCTION dq__schedule_hash(expression text, timezone text, payload jsonb) RETURNS text
LANGUAGE sql IMMUTABLE
AS $$
    SELECT pg_catalog.left(pg_catalog.md5(
        pg_catalog.jsonb_build_array(expression, timezone, payload)::pg_catalog.text
    ), 16)
$$;

-- Create or replace queue's schedule `name` (the key prefix of its
-- occurrences); its next occurrence after now. A changed expression, zone or
-- payload replaces the old configuration's pending (not leased) occurrences;
-- setting the same one again keeps its place (an occurrence already due is
-- still delivered by the next poll) and ends a failing schedule's back-off.
-- max_missed: how many of the most recent occurrences one poll delivers when
-- several came due while nobody polled (1: the latest only, never a flood).
CREATE FUNCTION dq_schedule_set(
    queue text,
    name text,
    expression text,
    timezone text DEFAULT 'UTC',
    payload jsonb DEFAULT '{}',
    max_missed integer DEFAULT 1
) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := @extschema@.dq_now();
    v_hash text;
    v_next timestamptz;
BEGIN
    PERFORM @extschema@.dq__check_queue(queue);
    PERFORM @extschema@.dq__check_key_prefix(name, 'name');
    PERFORM @extschema@.dq__null_check(payload IS NULL, 'payload');
    PERFORM @extschema@.dq__check_between(max_missed, 'max_missed', 1, 100);
    v_next := @extschema@.dq_cron_next(expression, v_now, timezone);  -- checks both
    IF v_next IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('pgdq: %L names no time in the next 5 years', expression);
    END IF;
    v_hash := @extschema@.dq__schedule_hash(expression, timezone, payload);

    INSERT INTO @extschema@.dq_schedules AS s (queue, name, expression, timezone, payload, config_hash, max_missed, next_at)
    VALUES (dq_schedule_set.queue, dq_schedule_set.name, expression, timezone, payload, v_hash, max_missed, v_next)
    ON CONFLICT ON CONSTRAINT dq_schedules_pkey DO UPDATE
        SET expression = excluded.expression,
            timezone = excluded.timezone,
            payload = excluded.payload,
            config_hash = excluded.config_hash,
            max_missed = excluded.max_missed,
            -- the same configuration keeps its place (a failing one's is
            -- missed_from: it is tried again at the next poll)
            next_at = CASE
                WHEN s.config_hash = excluded.config_hash THEN coalesce(s.missed_from, s.next_at)
                ELSE excluded.next_at
            END,
            missed_from = NULL,
            failures = 0,
            last_error = NULL,
            last_error_at = NULL;
    PERFORM @extschema@.dq__cron_delete(dq_schedule_set.queue, dq_schedule_set.name, v_hash, TRUE);
    PERFORM @extschema@.dq__wake(dq_schedule_set.queue);  -- idle workers re-read dq_next_due
    RETURN v_next;
END
$$;

-- Remove queue's schedule `name` and its pending occurrences; true if it existed.
CREATE FUNCTION dq_schedule_remove(queue text, name text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_clock timestamptz := @extschema@.dq_now();  -- unused: an invalid dq.now fails every call
BEGIN
    PERFORM @extschema@.dq__check_queue(queue);
    PERFORM @extschema@.dq__check_key_prefix(name, 'name');
    DELETE FROM @extschema@.dq_schedules AS s
    WHERE s.queue = dq_schedule_remove.queue AND s.name = dq_schedule_remove.name;
    IF NOT FOUND THEN
        RETURN FALSE;
    END IF;
    PERFORM @extschema@.dq__cron_delete(dq_schedule_remove.queue, dq_schedule_remove.name, NULL, FALSE);
    RETURN TRUE;
END
$$;

-- The schedules (of queue, when given) with their next occurrence (while
-- failing: the next attempt) and their last error. Does not read the clock.
CREATE FUNCTION dq_schedules(queue text DEFAULT NULL) RETURNS TABLE (
    queue text,
    name text,
    expression text,
    timezone text,
    payload jsonb,
    max_missed integer,
    next_at timestamptz,
    last_error text,
    last_error_at timestamptz,
    failures integer
)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- the check is a statement of its own: it runs, row or no row
    SELECT @extschema@.dq__check_queue(dq_schedules.queue) WHERE dq_schedules.queue IS NOT NULL;
    SELECT s.queue::text, s.name::text, s.expression, s.timezone, s.payload, s.max_missed, s.next_at,
        s.last_error, s.last_error_at, s.failures
    FROM @extschema@.dq_schedules AS s
    WHERE dq_schedules.queue IS NULL OR s.queue = dq_schedules.queue
    ORDER BY s.queue, s.name;
$$;

-- The occurrences of a schedule from next_at to until, oldest first: the
-- `keep` most recent. Bounded work however long nobody polled: the
-- expression is parsed once, and it looks back from until through doubling
-- windows (then halves the last one when a burst of occurrences made it hold
-- more than 2 * keep + 10), each look giving up after that many, and all of
-- them together after 2,000 occurrences (only bursts of thousands get there;
-- it then returns the most recent it has, fewer than keep).
CREATE FUNCTION dq__due_occurrences(
    expression text, timezone text, next_at timestamptz, until timestamptz, keep integer
) RETURNS timestamptz[]
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_cron record;
    v_limit integer := 2 * keep + 10;  -- a look gives up beyond this many
    v_budget integer := 2000;          -- occurrences still to be computed
    v_window interval := interval '1 second';
    v_good timestamptz := until;       -- from here: fewer than keep...
    v_best timestamptz[] := '{}';      -- ...namely these
    v_bad timestamptz;                 -- from here: more than v_limit
    v_from timestamptz;
    v_at timestamptz;
    v_due timestamptz[];
    v_count integer;
    v_complete boolean;
BEGIN
    v_cron := @extschema@.dq__cron_parse(expression);
    LOOP
        v_from := CASE
            WHEN v_bad IS NOT NULL THEN v_bad + (v_good - v_bad) / 2
            WHEN until - next_at <= v_window THEN next_at
            ELSE until - v_window
        END;
        -- the occurrences from v_from to until: their count and the last keep
        v_due := '{}';
        v_count := 0;
        v_complete := FALSE;
        v_at := v_from - interval '1 microsecond';
        WHILE v_count <= v_limit AND v_budget > 0 LOOP
            v_at := @extschema@.dq__cron_next_at(
                v_at, timezone, v_cron.seconds, v_cron.minutes, v_cron.hours,
                v_cron.days, v_cron.months, v_cron.weekdays, v_cron.either_day
            );
            v_budget := v_budget - 1;
            v_complete := v_at IS NULL OR v_at > until;
            EXIT WHEN v_complete;
            v_due := (v_due || v_at)[greatest(1, cardinality(v_due) + 2 - keep):];
            v_count := v_count + 1;
        END LOOP;
        IF v_complete THEN
            IF v_count >= keep OR v_from <= next_at THEN
                RETURN v_due;
            END IF;
            v_good := v_from;
            v_best := v_due;
            v_window := v_window * 2;
        ELSIF v_count <= v_limit THEN
            RETURN v_best;  -- out of budget
        ELSE
            v_bad := v_from;
        END IF;
    END LOOP;
END
$$;

-- Turn queue's due schedule occurrences into messages and move each
-- schedule's next_at past now. Each schedule is done in a subtransaction:
-- when it fails (any error, or a statement timeout that fires meanwhile) its
-- error goes into last_error, it is tried again 1 minute later, then after
-- 2, 4 ... at most 60 (next_at; missed_from keeps the first occurrence still
-- to deliver), and the poll goes on. Bounded: no schedule is started after
-- 50 ms (the rest wait for the next poll), nor after a statement timeout.
-- Schedules another poll is materialising are skipped (it does them), and
-- occurrence keys make a repeat harmless.
CREATE FUNCTION dq__materialise(queue text, now_at timestamptz) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_started timestamptz := clock_timestamp();
    v_schedule record;
    v_due timestamptz[];
    v_next timestamptz;
    v_state text;
    v_message text;
    v_timed_out boolean := FALSE;
BEGIN
    FOR v_schedule IN
        SELECT s.* FROM @extschema@.dq_schedules AS s
        WHERE s.queue = dq__materialise.queue AND s.next_at <= dq__materialise.now_at
        ORDER BY s.name
        FOR UPDATE SKIP LOCKED
    LOOP
        EXIT WHEN clock_timestamp() - v_started > interval '50 milliseconds';
        v_state := NULL;
        BEGIN
            -- first, as it names an `after` out of range
            v_next := coalesce(@extschema@.dq_cron_next(v_schedule.expression, dq__materialise.now_at, v_schedule.timezone), 'infinity');
            v_due := @extschema@.dq__due_occurrences(
                v_schedule.expression, v_schedule.timezone, coalesce(v_schedule.missed_from, v_schedule.next_at),
                dq__materialise.now_at, v_schedule.max_missed
            );
            INSERT INTO @extschema@.dq_messages (queue, key, payload, scheduled_at, due_at, created_at)
            SELECT dq__materialise.queue, @extschema@.dq__occurrence_key(v_schedule.name, v_schedule.config_hash, d.at),
                v_schedule.payload, d.at, d.at, dq__materialise.now_at
            FROM unnest(v_due) AS d (at)
            ORDER BY 2
            ON CONFLICT ON CONSTRAINT dq_messages_queue_key DO NOTHING;
            UPDATE @extschema@.dq_schedules AS s
            SET next_at = v_next,
                missed_from = NULL,
                failures = 0,
                last_error = NULL,
                last_error_at = NULL
            WHERE s.queue = dq__materialise.queue AND s.name = v_schedule.name;
        EXCEPTION
            WHEN query_canceled THEN
                -- a statement timeout is this schedule's error; a cancel
                -- request cancels the poll
                IF current_setting('statement_timeout')::interval = interval '0'
                    OR clock_timestamp() - statement_timestamp() < current_setting('statement_timeout')::interval THEN
                    RAISE;
                END IF;
                GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT;
                v_timed_out := TRUE;
            WHEN OTHERS THEN
                GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_message = MESSAGE_TEXT;
        END;
        IF v_state IS NOT NULL THEN
            UPDATE @extschema@.dq_schedules AS s
            SET missed_from = coalesce(s.missed_from, s.next_at),
                next_at = CASE
                    WHEN dq__materialise.now_at < '294276-01-01 00:00:00+00' THEN dq__materialise.now_at + least(
                        interval '1 hour', interval '1 minute' * power(2, least(s.failures, 6))
                    )
                    ELSE 'infinity'  -- the end of the timestamp range
                END,
                failures = s.failures + 1,
                last_error = format('%s (SQLSTATE %s)', left(v_message, 1000), v_state),
                last_error_at = dq__materialise.now_at
            WHERE s.queue = dq__materialise.queue AND s.name = v_schedule.name;
        END IF;
        EXIT WHEN v_timed_out;
    END LOOP;
END
$$;

-- Install and upgrade warn when every role may create objects in pgdq's schema.

-- Raise a WARNING when PUBLIC may create objects in schema. pgdq's functions
-- never call what others create there (docs/security.md), but the roles that
-- use pgdq search that schema too: anyone could plant functions they call.
CREATE FUNCTION dq__warn_if_open_schema(schema text) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF has_schema_privilege('public', schema, 'CREATE') THEN
        RAISE WARNING USING
            MESSAGE = format('pgdq: every role may create objects in schema %I', schema),
            DETAIL = 'pgdq''s functions never call objects created there, but the roles that use '
            'pgdq search that schema too: anyone may plant functions they call by mistake.',
            HINT = format(
                'REVOKE CREATE ON SCHEMA %I FROM PUBLIC, or install pgdq into a schema of its own.', schema
            );
    END IF;
END
$$;

SELECT @extschema@.dq__warn_if_open_schema(pg_catalog.current_schema());

