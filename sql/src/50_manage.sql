-- Managing: cancel, get, purge, stats, next_due.

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
    PERFORM @extschema@.dq__check_name(dq_cancel.key, 'key', 200);
    DELETE FROM @extschema@.dq_messages AS m
    WHERE m.queue = dq_cancel.queue AND m.key = dq_cancel.key;
    RETURN FOUND;
END
$$;

-- The stored row of one message, checked arguments; backs dq_get.
CREATE FUNCTION dq__get(p_queue text, p_key text) RETURNS SETOF dq_messages
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@.dq__check_queue(p_queue);
    PERFORM @extschema@.dq__check_name(p_key, 'key', 200);
    RETURN QUERY
    SELECT m.* FROM @extschema@.dq_messages AS m
    WHERE m.queue = p_queue AND m.key = p_key;
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
    SELECT
        m.queue::text, m.key::text, m.payload, m.state, m.scheduled_at,
        m.due_at, m.attempts,
        m.lock_token IS NOT NULL AND m.due_at > n.now_at,
        m.created_at
    FROM @extschema@.dq__get($1, $2) AS m
    CROSS JOIN @extschema@.dq_now() AS n (now_at)
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

-- Per-queue counts, checked argument; backs dq_stats.
CREATE FUNCTION dq__stats(p_queue text) RETURNS TABLE (
    o_queue text,
    o_ready bigint,
    o_delayed bigint,
    o_leased bigint,
    o_oldest_ready_at timestamptz,
    o_next_due_at timestamptz
)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := @extschema@.dq_now();
BEGIN
    IF p_queue IS NOT NULL THEN
        PERFORM @extschema@.dq__check_queue(p_queue);
    END IF;
    RETURN QUERY
    WITH counted AS (
        SELECT
            m.queue,
            count(*) FILTER (WHERE m.due_at <= v_now) AS ready,
            count(*) FILTER (
                WHERE m.due_at > v_now AND m.lock_token IS NULL
            ) AS delayed,
            count(*) FILTER (
                WHERE m.due_at > v_now AND m.lock_token IS NOT NULL
            ) AS leased,
            min(m.due_at) FILTER (WHERE m.due_at <= v_now) AS oldest_ready_at,
            min(m.due_at) FILTER (
                WHERE m.due_at > v_now AND m.lock_token IS NULL
            ) AS next_due_at
        FROM @extschema@.dq_messages AS m
        WHERE p_queue IS NULL OR m.queue = p_queue
        GROUP BY m.queue
    )
    SELECT
        coalesce(c.queue, p_queue)::text,
        coalesce(c.ready, 0),
        coalesce(c.delayed, 0),
        coalesce(c.leased, 0),
        c.oldest_ready_at,
        c.next_due_at
    FROM counted AS c
    -- a named queue always gets its row, zeros when empty
    FULL JOIN (SELECT p_queue AS queue WHERE p_queue IS NOT NULL) AS named
        ON c.queue = named.queue
    ORDER BY 1;
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
AS $$ SELECT * FROM @extschema@.dq__stats($1) $$;

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
