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
            m.lock_token IS NULL AS nacked, m.last_error, m.channel, m.priority
    ),

    buried AS (
        INSERT INTO @extschema@.dq_dead_letters AS d (
            queue, key, id, payload, state, scheduled_at, created_at, attempts, error, failed_at,
            channel, priority
        )
        SELECT mv.queue, mv.key, mv.id, mv.payload, mv.state, mv.scheduled_at, mv.created_at, mv.attempts,
            CASE
                WHEN dq__bury.max_attempts IS NULL THEN dq__bury.error
                ELSE @extschema@.dq__gave_up_error(dq__bury.max_attempts, mv.nacked, mv.last_error)
            END,
            dq__bury.failed_at,
            mv.channel, mv.priority
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
                failed_at = excluded.failed_at,
                channel = excluded.channel,
                priority = excluded.priority
        RETURNING 1
    )

    SELECT count(*)::integer FROM buried
$$;

-- Give up on a leased message: move it to the dead letters with error (the
-- consumer's verdict, as given); false (nothing changed) for a stale token,
-- and with queue given, for a token of another queue's message (1.2).
CREATE FUNCTION dq_dead_letter(lock_token uuid, error text DEFAULT NULL, queue text DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := @extschema@.dq_now();
    v_message record;
BEGIN
    IF dq_dead_letter.queue IS NOT NULL AND NOT @extschema@.dq__valid_queue(dq_dead_letter.queue) THEN
        PERFORM @extschema@.dq__check_queue(dq_dead_letter.queue);
    END IF;
    SELECT m.id, m.queue, m.channel, m.due_at INTO v_message
    FROM @extschema@.dq_messages AS m
    WHERE m.id = @extschema@.dq__token_id(dq_dead_letter.lock_token)
        AND m.lock_token = dq_dead_letter.lock_token
        AND (dq_dead_letter.queue IS NULL OR m.queue = dq_dead_letter.queue)
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN FALSE;
    END IF;
    PERFORM @extschema@.dq__bury(ARRAY[v_message.id], dq_dead_letter.error, v_now, NULL::integer);
    PERFORM @extschema@.dq__leases_ended(
        ARRAY[v_message.queue::text], ARRAY[v_message.channel::text], ARRAY[v_message.due_at], v_now
    );
    RETURN TRUE;
END
$$;

-- One row per queue with dead letters (or only queue's, if given): how many,
-- and the latest failure.
CREATE FUNCTION dq_dead_stats(queue text DEFAULT NULL) RETURNS TABLE (
    queue text,
    dead bigint,
    last_failed_at timestamptz
)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT @extschema@.dq_now();  -- unused: an invalid dq.now fails every call
    SELECT @extschema@.dq__check_queue(dq_dead_stats.queue) WHERE dq_dead_stats.queue IS NOT NULL;
    SELECT d.queue::text, count(*), max(d.failed_at)
    FROM @extschema@.dq_dead_letters AS d
    WHERE dq_dead_stats.queue IS NULL OR d.queue = dq_dead_stats.queue
    GROUP BY d.queue
    ORDER BY 1;
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
    v_channels text[];
    v_priorities integer[];
BEGIN
    PERFORM @extschema@.dq__check_queue(v_queue);
    IF v_key IS NOT NULL THEN
        PERFORM @extschema@.dq__check_key(v_key, 'key');
    END IF;
    PERFORM @extschema@.dq__check_time(dq_dead_redrive.scheduled_at, 'scheduled_at');
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
        INSERT INTO @extschema@.dq_messages AS m (
            queue, key, payload, scheduled_at, due_at, created_at, channel, priority
        )
        SELECT v_queue, d.key, d.payload, v_at, v_at, v_now, d.channel, d.priority
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
        RETURNING d.key, d.payload, d.channel, d.priority
    ),

    refreshed AS (
        UPDATE @extschema@.dq_messages AS m
        SET payload = r.payload, channel = r.channel, priority = r.priority
        FROM removed AS r
        WHERE m.queue = v_queue AND m.key = r.key
            AND (m.payload <> r.payload OR m.channel <> r.channel OR m.priority <> r.priority)
    ),

    withdrawn AS (
        DELETE FROM @extschema@.dq_messages AS m
        WHERE m.queue = v_queue AND m.key = ANY(v_offered)
            AND NOT EXISTS (SELECT FROM removed AS r WHERE r.key = m.key)
    )

    SELECT count(*)::integer, array_agg(r.channel), array_agg(r.priority)
    INTO v_count, v_channels, v_priorities
    FROM removed AS r;
    IF v_count > 0 THEN
        PERFORM @extschema@.dq__offers_written(
            v_queue, v_channels, v_priorities,
            array_fill(v_at, ARRAY[v_count]), NULL::boolean[], v_now
        );
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
