-- pgdq 1.0.0 -> 1.1.0, for ALTER EXTENSION pgdq UPDATE and `pgdq upgrade`.
-- Released as is: never edit it once 1.1.0 ships. What it changes is in
-- CHANGELOG.md; tests/test_upgrade.py checks that 1.0.0 plus this script
-- equals a fresh 1.1.0 install, object for object.
\echo Use "ALTER EXTENSION pgdq UPDATE TO '1.1.0'" to load this file. \quit

-- The clock: dq.now must be a finite timestamp.
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
CREATE OR REPLACE FUNCTION dq_now() RETURNS timestamptz
LANGUAGE sql VOLATILE
AS $$
    SELECT coalesce(
        @extschema@.dq__pinned_now(nullif(pg_catalog.current_setting('dq.now', true), '')),
        pg_catalog.clock_timestamp()
    )
$$;

-- The installed package version.
CREATE OR REPLACE FUNCTION dq_version() RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT '1.1.0'::text $$;

-- Leases must end after now, within the timestamp range; times must be finite.
DROP FUNCTION dq__check_lease(interval);

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
    PERFORM @extschema@.dq__not_null(lease, 'lease');
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

-- Wake-ups only when a written message is the queue's head.
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
CREATE OR REPLACE FUNCTION dq_offer(
    queue text,
    key text,
    payload jsonb,
    scheduled_at timestamptz DEFAULT NULL,
    can_update boolean DEFAULT TRUE
) RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @extschema@, pg_temp
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := dq_now();
    v_at timestamptz := coalesce(dq_offer.scheduled_at, v_now);
    v_inserted boolean;
BEGIN
    -- one cheap test on the hot path; the checks say what is wrong
    IF NOT dq__valid_name(dq_offer.queue, 100)
        OR NOT dq__valid_name(dq_offer.key, 200)
        OR dq_offer.payload IS NULL
        OR dq_offer.can_update IS NULL
        OR NOT coalesce(isfinite(dq_offer.scheduled_at), TRUE) THEN
        PERFORM dq__check_queue(dq_offer.queue);
        PERFORM dq__check_name(dq_offer.key, 'key', 200);
        PERFORM dq__not_null(dq_offer.payload, 'payload');
        PERFORM dq__not_null(dq_offer.can_update, 'can_update');
        PERFORM dq__check_finite(dq_offer.scheduled_at, 'scheduled_at');
    END IF;

    -- ON CONFLICT makes concurrent offers of one key wait for each other
    -- instead of failing: one creates, the others update or ignore.
    INSERT INTO dq_messages AS m (
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
            lock_token = NULL
        WHERE dq_offer.can_update
            AND NOT dq__same_offer(
                m.payload, m.scheduled_at,
                excluded.payload, dq_offer.scheduled_at
            )
    RETURNING m.xmax = 0 INTO v_inserted;  -- xmax is 0 on a fresh insert

    IF NOT FOUND THEN
        RETURN 'ignored';
    END IF;
    PERFORM dq__wake_if_head(dq_offer.queue, v_at);
    RETURN CASE WHEN v_inserted THEN 'created' ELSE 'updated' END;
END
$$;

-- Raise 22004/22023 unless the offer_many arrays are usable (docs/sql-reference.md).
CREATE OR REPLACE FUNCTION dq__check_offer_arrays(
    keys text[], payloads jsonb[], scheduled_ats timestamptz[]
) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, @extschema@, pg_temp
AS $$
DECLARE
    v_bad bigint;
BEGIN
    PERFORM dq__not_null(keys, 'keys');
    PERFORM dq__not_null(payloads, 'payloads');
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
    PERFORM dq__check_elements(keys, 'keys');
    PERFORM dq__check_elements(payloads, 'payloads');
    PERFORM dq__check_finite_elements(scheduled_ats, 'scheduled_ats');
    SELECT k.ord INTO v_bad
    FROM unnest(keys) WITH ORDINALITY AS k (k, ord)
    WHERE length(k.k) NOT BETWEEN 1 AND 200
    ORDER BY k.ord
    LIMIT 1;
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = format(
                'pgdq: keys[%s] must be 1 to 200 characters long, got %s',
                v_bad, length(keys[v_bad])
            );
    END IF;
END
$$;

-- Offer a batch: one (key, outcome) row per element, in input order, exactly
-- as if dq_offer ran for each element in turn (docs/sql-reference.md).
CREATE OR REPLACE FUNCTION dq_offer_many(
    queue text,
    keys text[],
    payloads jsonb[],
    scheduled_ats timestamptz[] DEFAULT NULL,
    can_update boolean DEFAULT TRUE
) RETURNS TABLE (key text, outcome text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @extschema@, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := dq_now();
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
    PERFORM dq__check_queue(v_queue);
    PERFORM dq__not_null(can_update, 'can_update');
    PERFORM dq__check_offer_arrays(keys, payloads, scheduled_ats);

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
        FROM dq__offer_chain(
            keys, payloads, scheduled_ats, can_update, v_now, NULL, NULL, NULL
        ) AS c
        WHERE NOT v_distinct AND c.is_last
    ),

    inserted AS (
        INSERT INTO dq_messages AS m (
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
        FROM dq_messages AS m
        INNER JOIN unnest(v_keys) AS p (k) ON m.key = p.k
        WHERE m.queue = v_queue
            AND NOT EXISTS (SELECT FROM unnest(v_new) AS n (k) WHERE n.k = m.key);
    END IF;

    IF cardinality(v_stored_keys) > 0 THEN
        WITH updated AS (
            UPDATE dq_messages AS m
            SET payload = c.final_payload,
                scheduled_at = c.final_at,
                due_at = c.final_at,
                created_at = v_now,
                attempts = 0,
                state = NULL,
                lock_token = NULL
            FROM dq__offer_chain(
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
        PERFORM dq__wake_if_head(v_queue, v_first_at);
    END IF;

    IF v_distinct AND cardinality(v_stored_keys) = 0 THEN
        RETURN QUERY SELECT k.k, 'created'::text FROM unnest(keys) AS k (k);
        RETURN;
    END IF;
    RETURN QUERY
    SELECT c.elem_key::text, c.outcome
    FROM dq__offer_chain(
        keys, payloads, scheduled_ats, can_update, v_now,
        v_stored_keys, v_stored_payloads, v_stored_ats
    ) AS c
    WHERE c.elem_ord > 0
    ORDER BY c.elem_ord;
END
$$;

-- Lease up to max_count due messages of queue, earliest due first (ties by id).
CREATE OR REPLACE FUNCTION dq_poll_many(
    queue text,
    max_count integer,
    lease interval DEFAULT '5 minutes'
) RETURNS SETOF dq_delivery
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @extschema@, pg_temp
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := dq_now();
    v_queue text := dq_poll_many.queue;
    v_ids bigint[];
    v_max_attempts integer;  -- dq_configure; NULL: no limit
    v_spent bigint[];        -- picked, but already delivered max_attempts times
BEGIN
    IF NOT dq__valid_name(v_queue, 100)
        OR max_count IS NULL
        OR NOT dq__valid_lease(lease, v_now) THEN
        PERFORM dq__check_queue(v_queue);
        PERFORM dq__not_null(max_count, 'max_count');
        PERFORM dq__check_lease(lease, v_now);
    END IF;
    IF max_count <= 0 THEN
        RETURN;
    END IF;

    -- the queue's due schedule occurrences become messages first (64_schedules.sql)
    IF EXISTS (SELECT FROM dq_schedules AS s WHERE s.queue = v_queue AND s.next_at <= v_now) THEN
        PERFORM dq__materialise(v_queue, v_now);
    END IF;
    v_max_attempts := (SELECT q.max_attempts FROM dq_queues AS q WHERE q.queue = v_queue);

    -- Pick and lock in one index range scan of (queue, due_at, id); rows a
    -- concurrent poller holds are skipped, never waited for. The arrays keep
    -- every statement's plan on an index, generic or custom.
    SELECT
        coalesce(array_agg(p.id), '{}'),
        coalesce(array_agg(p.id) FILTER (WHERE p.attempts >= v_max_attempts), '{}')
    INTO v_ids, v_spent
    FROM (
        SELECT m.id, m.attempts
        FROM dq_messages AS m
        WHERE m.queue = v_queue AND m.due_at <= v_now
        ORDER BY m.due_at, m.id
        LIMIT max_count
        FOR UPDATE SKIP LOCKED
    ) AS p;

    -- A due message that already had max_attempts deliveries lost its last
    -- lease without an ack or nack (its consumers keep dying): bury it.
    IF cardinality(v_spent) > 0 THEN
        PERFORM dq__bury(
            v_spent,
            format(
                'pgdq: gave up after %s deliveries (max_attempts %s): the last lease expired without an ack or nack',
                v_max_attempts, v_max_attempts
            ),
            v_now
        );
        v_ids := ARRAY(
            SELECT i.id FROM unnest(v_ids) WITH ORDINALITY AS i (id, pos)
            WHERE i.id <> ALL (v_spent)
            ORDER BY i.pos
        );
    END IF;
    IF cardinality(v_ids) = 0 THEN
        RETURN;
    END IF;

    RETURN QUERY
    WITH leased AS (
        UPDATE dq_messages AS m
        SET attempts = m.attempts + 1,
            lock_token = dq__token(m.id),
            due_at = v_now + lease
        FROM unnest(v_ids) WITH ORDINALITY AS picked (id, pos)
        WHERE m.id = picked.id
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

-- Give a leased message back, due at retry_at (NULL: now); false when stale.
CREATE OR REPLACE FUNCTION dq_nack(
    lock_token uuid,
    retry_at timestamptz DEFAULT NULL,
    state jsonb DEFAULT NULL
) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @extschema@, pg_temp
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := dq_now();
    v_queue text;
    v_due_at timestamptz;
BEGIN
    -- an infinite retry time would park the message for ever (or, -infinity,
    -- make dq_next_due and dq_stats report -infinity): refuse it
    IF NOT coalesce(isfinite(dq_nack.retry_at), TRUE) THEN
        PERFORM dq__check_finite(dq_nack.retry_at, 'retry_at');
    END IF;
    UPDATE dq_messages AS m
    SET lock_token = NULL,
        due_at = coalesce(dq_nack.retry_at, v_now),
        state = coalesce(dq_nack.state, m.state)
    WHERE m.id = dq__token_id(dq_nack.lock_token)
        AND m.lock_token = dq_nack.lock_token
    RETURNING m.queue, m.due_at INTO v_queue, v_due_at;
    IF NOT FOUND THEN
        RETURN FALSE;
    END IF;
    -- a message handed back before the queue's head wakes idle consumers
    PERFORM dq__wake_if_head(v_queue, v_due_at);
    RETURN TRUE;
END
$$;

-- Heartbeat: lease until now + lease; the new lease_until, NULL when stale.
CREATE OR REPLACE FUNCTION dq_extend(
    lock_token uuid,
    lease interval
) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @extschema@, pg_temp
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := dq_now();
    v_until timestamptz;
BEGIN
    IF NOT dq__valid_lease(lease, v_now) THEN
        PERFORM dq__check_lease(lease, v_now);
    END IF;
    UPDATE dq_messages AS m
    SET due_at = v_now + lease
    WHERE m.id = dq__token_id(dq_extend.lock_token)
        AND m.lock_token = dq_extend.lock_token
    RETURNING m.due_at INTO v_until;
    RETURN v_until;
END
$$;

-- Offer queue's dead letters again (only key's when given), due at
-- scheduled_at (NULL: now), fresh: attempts 0, no state. A dead letter whose
-- key has a live message again is left where it is. The number re-offered.
CREATE OR REPLACE FUNCTION dq_dead_redrive(
    queue text,
    key text DEFAULT NULL,
    scheduled_at timestamptz DEFAULT NULL
) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @extschema@, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := dq_now();
    v_queue text := dq_dead_redrive.queue;
    v_key text := dq_dead_redrive.key;
    v_at timestamptz := coalesce(dq_dead_redrive.scheduled_at, v_now);
    v_offered text[];
    v_count integer;
BEGIN
    PERFORM dq__check_queue(v_queue);
    IF v_key IS NOT NULL THEN
        PERFORM dq__check_name(v_key, 'key', 200);
    END IF;
    PERFORM dq__check_finite(dq_dead_redrive.scheduled_at, 'scheduled_at');
    -- Messages first, then their dead letters: the order a bury takes them
    -- in (it holds the message when it writes the dead letter), so the two
    -- never deadlock; keys in key order, like every multi-row writer. Keys
    -- with a live message are left alone, filtered out before anything
    -- waits: a poll may be burying such a key right now.
    WITH offered AS (
        INSERT INTO dq_messages AS m (queue, key, payload, scheduled_at, due_at, created_at)
        SELECT v_queue, d.key, d.payload, v_at, v_at, v_now
        FROM dq_dead_letters AS d
        WHERE d.queue = v_queue AND (v_key IS NULL OR d.key = v_key)
            AND NOT EXISTS (
                SELECT FROM dq_messages AS live
                WHERE live.queue = v_queue AND live.key = d.key
            )
        ORDER BY d.key
        ON CONFLICT ON CONSTRAINT dq_messages_queue_key DO NOTHING
        RETURNING m.key
    )

    SELECT coalesce(array_agg(offered.key), '{}') INTO v_offered FROM offered;
    v_count := cardinality(v_offered);

    WITH doomed AS (
        SELECT d.key FROM dq_dead_letters AS d
        WHERE d.queue = v_queue AND d.key = ANY(v_offered)
        ORDER BY d.key
        FOR UPDATE
    )

    DELETE FROM dq_dead_letters AS d
    USING doomed
    WHERE d.queue = v_queue AND d.key = doomed.key;
    IF v_count > 0 THEN
        PERFORM dq__wake_if_head(v_queue, v_at);
    END IF;
    RETURN v_count;
END
$$;

-- Delete queue's dead letters (only key's when given); the count deleted.
CREATE OR REPLACE FUNCTION dq_dead_purge(queue text, key text DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @extschema@, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_clock timestamptz := dq_now();  -- unused: an invalid dq.now fails every call
    v_deleted bigint;
BEGIN
    PERFORM dq__check_queue(dq_dead_purge.queue);
    IF dq_dead_purge.key IS NOT NULL THEN
        PERFORM dq__check_name(dq_dead_purge.key, 'key', 200);
    END IF;
    -- Locks in key order, like every multi-row writer (a poll burying
    -- messages upserts their dead letters in key order), so none deadlock.
    WITH doomed AS (
        SELECT d.key FROM dq_dead_letters AS d
        WHERE d.queue = dq_dead_purge.queue
            AND (dq_dead_purge.key IS NULL OR d.key = dq_dead_purge.key)
        ORDER BY d.key
        FOR UPDATE
    )

    DELETE FROM dq_dead_letters AS d
    USING doomed
    WHERE d.queue = dq_dead_purge.queue AND d.key = doomed.key;
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    RETURN v_deleted;
END
$$;

-- An invalid dq.now fails every call, those that do not need the time included.
-- Delete the message whose current delivery is lock_token; false when stale.
CREATE OR REPLACE FUNCTION dq_ack(lock_token uuid) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @extschema@, pg_temp
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
AS $$
#variable_conflict use_column
DECLARE
    v_clock timestamptz := dq_now();  -- unused: an invalid dq.now fails every call
BEGIN
    DELETE FROM dq_messages AS m
    WHERE m.id = dq__token_id(dq_ack.lock_token)
        AND m.lock_token = dq_ack.lock_token;
    RETURN FOUND;
END
$$;

-- Ack a batch of tokens: the number of messages deleted; stale ones are skipped.
CREATE OR REPLACE FUNCTION dq_ack_many(lock_tokens uuid[]) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @extschema@, pg_temp
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
AS $$
DECLARE
    v_clock timestamptz := dq_now();  -- unused: an invalid dq.now fails every call
    v_deleted integer;
BEGIN
    -- Rows are locked in (queue, key) order, the order dq_offer_many locks
    -- in, so a batch ack and a batch offer never deadlock.
    WITH current_rows AS (
        SELECT m.id
        FROM dq_messages AS m
        INNER JOIN unnest(lock_tokens) AS t (token)
            ON m.id = dq__token_id(t.token) AND m.lock_token = t.token
        ORDER BY m.queue, m.key
        FOR UPDATE OF m
    )
    DELETE FROM dq_messages AS m
    USING current_rows AS c
    WHERE m.id = c.id;
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    RETURN v_deleted;
END
$$;

-- Delete one message, leased or not; true if one was deleted.
CREATE OR REPLACE FUNCTION dq_cancel(queue text, key text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @extschema@, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_clock timestamptz := dq_now();  -- unused: an invalid dq.now fails every call
BEGIN
    PERFORM dq__check_queue(dq_cancel.queue);
    PERFORM dq__check_name(dq_cancel.key, 'key', 200);
    DELETE FROM dq_messages AS m
    WHERE m.queue = dq_cancel.queue AND m.key = dq_cancel.key;
    RETURN FOUND;
END
$$;

-- Delete every message of queue; the count deleted.
CREATE OR REPLACE FUNCTION dq_purge(queue text) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @extschema@, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_clock timestamptz := dq_now();  -- unused: an invalid dq.now fails every call
    v_deleted bigint;
BEGIN
    PERFORM dq__check_queue(dq_purge.queue);
    -- Locks in key order, like dq_offer_many, so the two never deadlock.
    WITH doomed AS (
        SELECT m.id FROM dq_messages AS m
        WHERE m.queue = dq_purge.queue
        ORDER BY m.key
        FOR UPDATE
    )
    DELETE FROM dq_messages AS m
    USING doomed AS d
    WHERE m.id = d.id;
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    RETURN v_deleted;
END
$$;

-- The earliest due time in queue (leases by their end); NULL when empty.
CREATE OR REPLACE FUNCTION dq_next_due(queue text) RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, @extschema@, pg_temp
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
AS $$
#variable_conflict use_column
DECLARE
    v_clock timestamptz := dq_now();  -- unused: an invalid dq.now fails every call
BEGIN
    PERFORM dq__check_queue(dq_next_due.queue);
    -- the first entry of the queue's range in (queue, due_at, id), or the
    -- next occurrence of one of its schedules if that comes first
    RETURN least(
        (
            SELECT m.due_at FROM dq_messages AS m
            WHERE m.queue = dq_next_due.queue
            ORDER BY m.due_at
            LIMIT 1
        ),
        (
            SELECT s.next_at FROM dq_schedules AS s
            WHERE s.queue = dq_next_due.queue AND s.next_at < 'infinity'
            ORDER BY s.next_at
            LIMIT 1
        )
    );
END
$$;

-- Set queue's max_attempts (NULL: no limit); polls enforce it from then on.
CREATE OR REPLACE FUNCTION dq_configure(queue text, max_attempts integer) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @extschema@, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_clock timestamptz := dq_now();  -- unused: an invalid dq.now fails every call
BEGIN
    PERFORM dq__check_queue(dq_configure.queue);
    IF max_attempts <= 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = format('pgdq: max_attempts must be positive or NULL, got %s', max_attempts);
    END IF;
    INSERT INTO dq_queues AS q (queue, max_attempts)
    VALUES (dq_configure.queue, dq_configure.max_attempts)
    ON CONFLICT (queue) DO UPDATE SET max_attempts = excluded.max_attempts;
END
$$;

-- Checked arguments, then queue's dead letters, oldest failure first.
CREATE OR REPLACE FUNCTION dq__dead_list(p_queue text, p_max_count integer) RETURNS SETOF dq_dead_letters
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, @extschema@, pg_temp
AS $$
DECLARE
    v_clock timestamptz := dq_now();  -- unused: an invalid dq.now fails every call
BEGIN
    PERFORM dq__check_queue(p_queue);
    PERFORM dq__not_null(p_max_count, 'max_count');
    RETURN QUERY
    SELECT d.* FROM dq_dead_letters AS d
    WHERE d.queue = p_queue
    ORDER BY d.failed_at, d.key
    LIMIT greatest(p_max_count, 0);
END
$$;

-- Remove queue's schedule `name` and its pending occurrences; true if it existed.
CREATE OR REPLACE FUNCTION dq_schedule_remove(queue text, name text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @extschema@, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_clock timestamptz := dq_now();  -- unused: an invalid dq.now fails every call
BEGIN
    PERFORM dq__check_queue(queue);
    PERFORM dq__check_key_part(name, 'name', 100);
    DELETE FROM dq_schedules AS s
    WHERE s.queue = dq_schedule_remove.queue AND s.name = dq_schedule_remove.name;
    IF NOT FOUND THEN
        RETURN FALSE;
    END IF;
    PERFORM dq__cron_delete(dq_schedule_remove.queue, dq_schedule_remove.name, NULL, FALSE);
    RETURN TRUE;
END
$$;

-- No deadlocks: cron installs of one prefix take turns and lock in key order.
DROP FUNCTION dq__cron_delete(text, text, text, boolean);

-- Delete the not-leased occurrences under key_prefix/ whose keys are in
-- [p_from, p_below) (NULL: unbounded), all of them or only those whose config
-- hash is (keep = false) or is not (keep = true) the given one; the count
-- deleted. Rows are locked in key order, like every multi-row writer.
CREATE FUNCTION dq__cron_delete(
    p_queue text, p_prefix text, p_hash text, p_keep_hash boolean,
    p_from text DEFAULT NULL, p_below text DEFAULT NULL
) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @extschema@, pg_temp
AS $$
DECLARE
    v_now timestamptz := dq_now();
    v_deleted integer;
BEGIN
    -- Keys are in C collation, so "starts with prefix/" is the index range
    -- [prefix/, prefix0): '0' is the byte after '/'. No LIKE pattern, so a
    -- prefix with % or _ in it means only itself.
    WITH doomed AS (
        SELECT m.id
        FROM dq_messages AS m
        WHERE m.queue = p_queue
            AND m.key >= greatest(p_prefix || '/', p_from)
            AND m.key < least(p_prefix || '0', p_below)
            AND NOT (m.lock_token IS NOT NULL AND m.due_at > v_now)
            AND (
                p_hash IS NULL
                OR (split_part(substr(m.key, length(p_prefix) + 2), '/', 1) = p_hash)
                <> p_keep_hash
            )
        ORDER BY m.key
        FOR UPDATE
    )

    DELETE FROM dq_messages AS m
    USING doomed AS d
    WHERE m.id = d.id;
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    RETURN v_deleted;
END
$$;

-- Replace key_prefix's pending occurrences of other configurations and offer
-- the future ones given; the number of occurrences created (docs/sql-reference.md).
CREATE OR REPLACE FUNCTION dq_cron_install(
    queue text,
    key_prefix text,
    config_hash text,
    scheduled_ats timestamptz[],
    payloads jsonb[],
    can_update boolean DEFAULT FALSE
) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, @extschema@, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := dq_now();
    v_keys text[];
    v_payloads jsonb[];
    v_ats timestamptz[];
    v_created integer;
    v_range_start text;
    v_range_end text;
BEGIN
    PERFORM dq__check_queue(queue);
    PERFORM dq__check_key_part(key_prefix, 'key_prefix', 100);
    PERFORM dq__check_key_part(config_hash, 'config_hash', 64);
    PERFORM dq__not_null(scheduled_ats, 'scheduled_ats');
    PERFORM dq__not_null(payloads, 'payloads');
    PERFORM dq__not_null(can_update, 'can_update');
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
    PERFORM dq__check_elements(scheduled_ats, 'scheduled_ats');
    PERFORM dq__check_elements(payloads, 'payloads');
    PERFORM dq__check_finite_elements(scheduled_ats, 'scheduled_ats');

    -- Installers of one prefix take turns, so the last one to run sees (and
    -- replaces) everything the one before it wrote.
    PERFORM pg_advisory_xact_lock(hashtextextended(queue || '/' || key_prefix, 0));
    -- This configuration's keys are the range [prefix/hash/, prefix/hash0).
    -- Other configurations' occurrences below it are deleted first, this
    -- one's are offered, then those above it are deleted: one ascending key
    -- order, the order every multi-row writer locks in, so none deadlock.
    v_range_start := key_prefix || '/' || config_hash || '/';
    v_range_end := key_prefix || '/' || config_hash || '0';
    PERFORM dq__cron_delete(queue, key_prefix, config_hash, true, NULL, v_range_start);

    -- Occurrences at or before now are skipped: already due means already
    -- (being) processed, and must never be installed again.
    SELECT
        coalesce(array_agg(dq__occurrence_key(key_prefix, config_hash, o.at) ORDER BY o.ord), '{}'),
        coalesce(array_agg(o.payload ORDER BY o.ord), '{}'),
        coalesce(array_agg(o.at ORDER BY o.ord), '{}')
    INTO v_keys, v_payloads, v_ats
    FROM unnest(scheduled_ats, payloads) WITH ORDINALITY AS o (at, payload, ord)
    WHERE o.at > v_now;

    SELECT count(*) FILTER (WHERE r.outcome = 'created') INTO v_created
    FROM dq_offer_many(queue, v_keys, v_payloads, v_ats, can_update) AS r;
    PERFORM dq__cron_delete(queue, key_prefix, config_hash, true, v_range_end, NULL);
    RETURN v_created;
END
$$;

-- Cron expressions are at most 1,000 characters; `after` must be finite.
-- The first time after `after` that expression names in zone (NULL if none
-- within 5 years); 22023 for an invalid expression or zone. STABLE, not
-- IMMUTABLE: the answer depends on the server's time zone data.
CREATE OR REPLACE FUNCTION dq_cron_next(expression text, after timestamptz, timezone text) RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, @extschema@, pg_temp
AS $$
DECLARE
    v_fields text[];
    v_seconds integer[];
    v_minutes integer[];
    v_hours integer[];
    v_days integer[];
    v_months integer[];
    v_weekdays integer[];
    v_either_day boolean;    -- both day fields restricted: OR
    v_near_shift boolean;    -- a DST change within 3 hours of after
    v_start timestamp;       -- the first wall time worth looking at
    v_day date;
    v_wall timestamp;
    v_at timestamptz;
    v_best timestamptz;
    v_hour integer;
    v_minute integer;
    v_second integer;
BEGIN
    PERFORM dq__not_null(expression, 'expression');
    PERFORM dq__not_null(after, 'after');
    PERFORM dq__not_null(timezone, 'timezone');
    PERFORM dq__check_finite(after, 'after');
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
    v_seconds := dq__cron_field(v_fields[1], 'second', 0, 59);
    v_minutes := dq__cron_field(v_fields[2], 'minute', 0, 59);
    v_hours := dq__cron_field(v_fields[3], 'hour', 0, 23);
    v_days := dq__cron_field(v_fields[4], 'day of month', 1, 31);
    v_months := dq__cron_field(v_fields[5], 'month', 1, 12);
    v_weekdays := dq__cron_field(v_fields[6], 'day of week', 0, 7);
    -- croniter's reading of "restricted": not a bare *, and not every value
    -- when the other day field has a * in it
    v_either_day := NOT (
        v_fields[4] IN ('*', '?') OR (cardinality(v_days) = 31 AND strpos(v_fields[6], '*') > 0)
    ) AND NOT (
        v_fields[6] IN ('*', '?') OR (cardinality(v_weekdays) = 7 AND strpos(v_fields[4], '*') > 0)
    );

    -- Around a DST change a later wall time can be an earlier instant, so
    -- look from 3 hours of wall time back and keep the earliest instant.
    v_near_shift := dq__zone_offset(after - interval '3 hours', timezone)
        <> dq__zone_offset(after + interval '3 hours', timezone);
    v_start := date_trunc('second', after AT TIME ZONE timezone)
        - CASE WHEN v_near_shift THEN interval '3 hours' ELSE interval '0' END;
    v_day := v_start::date;
    WHILE v_day < v_start::date + 366 * 5 LOOP
        IF NOT extract(MONTH FROM v_day)::integer = ANY(v_months) THEN
            v_day := date_trunc('month', v_day) + interval '1 month';
            CONTINUE;
        END IF;
        IF (v_either_day AND (extract(DAY FROM v_day)::integer = ANY(v_days)
                OR extract(DOW FROM v_day)::integer = ANY(v_weekdays)))
            OR (NOT v_either_day AND extract(DAY FROM v_day)::integer = ANY(v_days)
                AND extract(DOW FROM v_day)::integer = ANY(v_weekdays)) THEN
            FOREACH v_hour IN ARRAY v_hours LOOP
                CONTINUE WHEN v_day + make_interval(hours => v_hour + 1) <= v_start;
                FOREACH v_minute IN ARRAY v_minutes LOOP
                    CONTINUE WHEN v_day + make_interval(hours => v_hour, mins => v_minute + 1) <= v_start;
                    FOREACH v_second IN ARRAY v_seconds LOOP
                        v_wall := v_day + make_interval(hours => v_hour, mins => v_minute, secs => v_second);
                        CONTINUE WHEN v_wall < v_start;
                        IF v_best IS NOT NULL AND v_wall > (v_best AT TIME ZONE timezone) + interval '3 hours' THEN
                            RETURN v_best;
                        END IF;
                        FOR v_at IN SELECT w.at FROM dq__wall_instants(v_wall, timezone) AS w (at) LOOP
                            IF v_at > after AND (v_best IS NULL OR v_at < v_best) THEN
                                v_best := v_at;
                            END IF;
                        END LOOP;
                        -- far from any DST change the first instant found is the answer
                        IF v_best IS NOT NULL AND dq__zone_offset(v_best - interval '3 hours', timezone)
                            = dq__zone_offset(v_best + interval '3 hours', timezone) THEN
                            RETURN v_best;
                        END IF;
                    END LOOP;
                END LOOP;
            END LOOP;
        END IF;
        v_day := v_day + 1;
    END LOOP;
    RETURN v_best;
END
$$;

-- A 1.0.0 extension install restored from a dump restarted its ids at 1 (the
-- sequence was not dumped) and then failed every offer with a duplicate id:
-- move the sequence past the ids in use.
SELECT pg_catalog.setval('@extschema@.dq_messages_id_seq', m.max_id)
FROM (SELECT max(d.id) AS max_id FROM @extschema@.dq_messages AS d) AS m
WHERE m.max_id > (SELECT s.last_value FROM @extschema@.dq_messages_id_seq AS s);

-- Extension installs: pg_dump keeps the id sequence's position too, so ids
-- handed out before a dump and restore are never handed out again.
DO $extension_only$
BEGIN
    IF EXISTS (
        SELECT FROM pg_catalog.pg_extension AS e
        WHERE e.extname = 'pgdq' AND e.extnamespace = '@extschema@'::regnamespace
    ) THEN
        PERFORM pg_catalog.pg_extension_config_dump('@extschema@.dq_messages_id_seq', '');
    END IF;
END
$extension_only$;
