-- Snapshot reads (additions to version 1 of the SQL API): the messages or
-- dead letters of a queue, or of every queue, in id ranges, so that several
-- readers can split a table between them and read it in one snapshot
-- (pg_export_snapshot; python/pgdq/spark.py). They lock and change nothing
-- and never return lock tokens. Bounds: from_id <= id < to_id, NULL
-- unbounded; written `id <= coalesce(to_id, max) AND id IS DISTINCT FROM
-- to_id` so that a generic plan still ranges over an index on id.
-- The two range reads use that generic plan on every server
-- (plan_cache_mode): PostgreSQL 18 would otherwise plan their statements
-- anew for each call's values (15 to 17 plan a SQL function's statements
-- with parameters), reading the index's ends to estimate the range: on
-- 18.6, 17 pages for 100 ids instead of 7.

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
SET plan_cache_mode = force_generic_plan  -- see the head of this file
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
SET plan_cache_mode = force_generic_plan  -- see the head of this file
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
        WHERE m.queue = dq_read_bounds.queue AND @extschema@.dq__in_poll_indexes(m.channel, m.priority);
    ELSIF dq_read_bounds.queue IS NULL THEN
        RETURN QUERY SELECT min(d.id), max(d.id) FROM @extschema@.dq_dead_letters AS d;
    ELSE
        RETURN QUERY SELECT min(d.id), max(d.id) FROM @extschema@.dq_dead_letters AS d
        WHERE d.queue = dq_read_bounds.queue;
    END IF;
END
$$;
