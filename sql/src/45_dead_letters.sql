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
SET "dq.outcome" = 'dead'  -- what the history records (57_history.sql)
AS $$
    WITH moved AS (
        DELETE FROM @extschema@.dq_messages AS m
        WHERE m.id = ANY(dq__bury.ids)
        RETURNING m.queue, m.key, m.id, m.payload, m.state, m.scheduled_at, m.created_at, m.attempts,
            m.lock_token IS NULL AS nacked, m.last_error, m.channel, m.priority, m.headers
    ),

    buried AS (
        INSERT INTO @extschema@.dq_dead_letters AS d (
            queue, key, id, payload, state, scheduled_at, created_at, attempts, error, failed_at,
            channel, priority, headers
        )
        SELECT mv.queue, mv.key, mv.id, mv.payload, mv.state, mv.scheduled_at, mv.created_at, mv.attempts,
            CASE
                WHEN dq__bury.max_attempts IS NULL THEN dq__bury.error
                ELSE @extschema@.dq__gave_up_error(dq__bury.max_attempts, mv.nacked, mv.last_error)
            END,
            dq__bury.failed_at,
            mv.channel, mv.priority, mv.headers
        FROM moved AS mv
        ORDER BY mv.queue, mv.key, mv.id
        -- a keyed message replaces its key's dead letter; a keyless one adds its own
        ON CONFLICT (queue, key) WHERE key IS NOT NULL DO UPDATE
            SET id = excluded.id,
                payload = excluded.payload,
                state = excluded.state,
                scheduled_at = excluded.scheduled_at,
                created_at = excluded.created_at,
                attempts = excluded.attempts,
                error = excluded.error,
                failed_at = excluded.failed_at,
                channel = excluded.channel,
                priority = excluded.priority,
                headers = excluded.headers
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
    -- lock it, with the verdict as its last error: what its history
    -- record says (1.3), as its dead letter does
    UPDATE @extschema@.dq_messages AS m
    SET last_error = dq_dead_letter.error
    WHERE m.id = @extschema@.dq__token_id(dq_dead_letter.lock_token)
        AND m.lock_token = dq_dead_letter.lock_token
        AND (dq_dead_letter.queue IS NULL OR m.queue = dq_dead_letter.queue)
    RETURNING m.id, m.queue, m.channel, m.due_at INTO v_message;
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

-- How many dead letters queue has, and its latest failure: its range of
-- dq_dead_letters_failed, whatever the statistics say (as dq__queue_stats).
CREATE FUNCTION dq__dead_queue_stats(queue text) RETURNS TABLE (dead bigint, last_failed_at timestamptz)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off  -- see 10_storage.sql
AS $$
    SELECT count(*), max(d.failed_at)
    FROM @extschema@.dq_dead_letters AS d
    WHERE d.queue = dq__dead_queue_stats.queue;
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
    WHERE dq_dead_stats.queue IS NULL
    GROUP BY d.queue
    UNION ALL
    -- a named queue: its dead letters only (1.2: it read every queue's)
    SELECT dq_dead_stats.queue, s.dead, s.last_failed_at
    FROM @extschema@.dq__dead_queue_stats(dq_dead_stats.queue) AS s
    WHERE dq_dead_stats.queue IS NOT NULL AND s.dead > 0
    ORDER BY 1;
$$;

-- Up to max_count of queue's dead letters, oldest failure first (then by
-- key, keyless ones last, by id).
CREATE FUNCTION dq_dead_list(queue text, max_count integer DEFAULT 100) RETURNS TABLE (
    queue text,
    key text,
    payload jsonb,
    state jsonb,
    scheduled_at timestamptz,
    created_at timestamptz,
    attempts integer,
    error text,
    failed_at timestamptz,
    id bigint  -- since 1.2: the message's id when it failed
)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    -- the checks are statements of their own: each runs, row or no row
    SELECT @extschema@.dq_now();  -- unused: an invalid dq.now fails every call
    SELECT @extschema@.dq__check_queue(dq_dead_list.queue);
    SELECT @extschema@.dq__null_check(dq_dead_list.max_count IS NULL, 'max_count');
    SELECT d.queue::text, d.key::text, d.payload, d.state, d.scheduled_at, d.created_at, d.attempts, d.error, d.failed_at,
        d.id
    FROM @extschema@.dq_dead_letters AS d
    WHERE d.queue = dq_dead_list.queue
    ORDER BY d.failed_at, d.key, d.id
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
    v_count integer := 0;
BEGIN
    PERFORM @extschema@.dq__check_queue(v_queue);
    IF v_key IS NOT NULL THEN
        PERFORM @extschema@.dq__check_key(v_key, 'key');
    END IF;
    PERFORM @extschema@.dq__check_time(dq_dead_redrive.scheduled_at, 'scheduled_at');
    v_count := @extschema@.dq__redrive_keyed(v_queue, v_key, NULL::bigint, v_at, v_now);
    -- keyless dead letters come back as new keyless messages (1.2)
    IF v_key IS NULL THEN
        v_count := v_count + cardinality(@extschema@.dq__redrive_keyless(v_queue, NULL::bigint[], v_at, v_now));
    END IF;
    RETURN v_count;
END
$$;

-- Move queue's keyed dead letters (only key's, and only the one of id, when
-- given) back into the queue due at at, but those whose key has a live
-- message; the number moved.
-- Every statement goes by index probes, arrays and row addresses, whatever
-- the table statistics say (pgtap/99_stale_statistics.sql): with them stale,
-- the check for live keys was planned as a scan of the queue's messages for
-- each dead letter (1.1; minutes for 50,000). enable_seqscan = off keeps a
-- table that looks empty from being scanned instead of probed.
CREATE FUNCTION dq__redrive_keyed(queue text, key text, id bigint, at timestamptz, now_at timestamptz) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off  -- see 10_storage.sql
AS $$
#variable_conflict use_column
DECLARE
    v_offered text[];        -- the keys offered, in key order
    v_offered_rows tid[];    -- their new messages (this transaction's rows)
    v_dead_rows tid[];
    v_keys text[];           -- the keys whose dead letters were removed, in key order
    v_payloads jsonb[];
    v_channels text[];
    v_priorities integer[];
    v_headers jsonb[];
BEGIN
    -- Lock order (docs/sql-reference.md, Concurrency): messages in key
    -- order, then dead letters in key order, the order a bury takes them in
    -- (it holds the message when it writes the dead letter). So first the
    -- messages. ON CONFLICT DO NOTHING skips every key that has a live
    -- message, however recently offered; the probe skips those this
    -- session sees, so that a key a poll is burying is left alone without
    -- waiting for that poll. Both go by this statement's snapshot, which is
    -- stale after an insert waited (for an offer, ack or bury of that key):
    -- meanwhile a later key may have been buried again, its dead letter
    -- replaced (or purged). The statements after it set that right.
    WITH offered AS (
        INSERT INTO @extschema@.dq_messages AS m (
            queue, key, payload, scheduled_at, due_at, created_at, channel, priority, headers
        )
        SELECT dq__redrive_keyed.queue, d.key, d.payload, at, at, now_at, d.channel, d.priority, d.headers
        FROM @extschema@.dq_dead_letters AS d
        WHERE d.queue = dq__redrive_keyed.queue AND d.key IS NOT NULL
            AND (dq__redrive_keyed.key IS NULL OR d.key = dq__redrive_keyed.key)
            AND (dq__redrive_keyed.id IS NULL OR d.id = dq__redrive_keyed.id)
            -- a probe of the key index per dead letter (not NOT EXISTS, which
            -- a join may turn into a scan of the queue per dead letter)
            AND (
                SELECT live.id FROM @extschema@.dq_messages AS live
                WHERE live.queue = dq__redrive_keyed.queue AND live.key = d.key
            ) IS NULL
        ORDER BY d.key
        ON CONFLICT (queue, key) WHERE key IS NOT NULL DO NOTHING
        RETURNING m.key, m.ctid
    )

    SELECT coalesce(array_agg(o.key ORDER BY o.key), '{}'), coalesce(array_agg(o.ctid ORDER BY o.key), '{}')
    INTO v_offered, v_offered_rows
    FROM offered AS o;

    -- Then their dead letters, locked afresh in key order and removed (a
    -- second statement: its snapshot sees the versions just locked). Run
    -- even when nothing was offered, so that a caller who may not remove
    -- dead letters is refused whether there were any or not.
    v_dead_rows := ARRAY(
        SELECT d.ctid FROM @extschema@.dq_dead_letters AS d
        WHERE d.queue = dq__redrive_keyed.queue AND d.key = ANY(v_offered)
            -- a dead letter replaced meanwhile (its key buried again) is
            -- another one: not the one of id asked for
            AND (dq__redrive_keyed.id IS NULL OR d.id = dq__redrive_keyed.id)
        ORDER BY d.key
        FOR UPDATE
    );
    WITH removed AS (
        DELETE FROM @extschema@.dq_dead_letters AS d
        WHERE d.ctid = ANY(v_dead_rows)
        RETURNING d.key, d.payload, d.channel, d.priority, d.headers
    )

    SELECT
        coalesce(array_agg(r.key ORDER BY r.key), '{}'), array_agg(r.payload ORDER BY r.key),
        array_agg(r.channel ORDER BY r.key), array_agg(r.priority ORDER BY r.key),
        array_agg(r.headers ORDER BY r.key)
    INTO v_keys, v_payloads, v_channels, v_priorities, v_headers
    FROM removed AS r;

    -- What is re-offered is exactly what was removed: a message whose dead
    -- letter is gone is withdrawn, and each other one takes the content of
    -- the dead letter removed (a newer one when its key was buried again
    -- meanwhile). Usually there is nothing to set right.
    IF v_keys IS DISTINCT FROM v_offered THEN
        v_offered_rows := @extschema@.dq__withdraw(v_offered, v_offered_rows, v_keys);
    END IF;
    UPDATE @extschema@.dq_messages AS m
    SET payload = r.payload, channel = r.channel, priority = r.priority, headers = r.headers
    FROM unnest(v_offered_rows, v_payloads, v_channels, v_priorities, v_headers) AS r (row_at, payload, channel, priority, headers)
    WHERE m.ctid = r.row_at
        AND (m.payload, m.channel, m.priority, m.headers) IS DISTINCT FROM (r.payload, r.channel, r.priority, r.headers);

    IF cardinality(v_keys) > 0 THEN
        PERFORM @extschema@.dq__offers_written(
            dq__redrive_keyed.queue, v_channels, v_priorities,
            array_fill(at, ARRAY[cardinality(v_keys)]), NULL::boolean[], now_at
        );
    END IF;
    RETURN cardinality(v_keys);
END
$$;

-- Delete the messages of offered (keys in key order, at rows) whose key is
-- not in kept (a subsequence of offered): the rows of the rest, in order.
-- One merge pass over the two sorted arrays.
CREATE FUNCTION dq__withdraw(offered text[], rows tid[], kept text[]) RETURNS tid[]
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_kept_rows tid[] := '{}';
    v_gone tid[] := '{}';
    v_next integer := 1;  -- the next key of kept to meet
BEGIN
    FOR i IN 1 .. coalesce(cardinality(offered), 0) LOOP
        IF v_next <= cardinality(kept) AND offered[i] = kept[v_next] THEN
            v_kept_rows := v_kept_rows || rows[i];
            v_next := v_next + 1;
        ELSE
            v_gone := v_gone || rows[i];
        END IF;
    END LOOP;
    DELETE FROM @extschema@.dq_messages AS m WHERE m.ctid = ANY(v_gone);
    RETURN v_kept_rows;
END
$$;

-- Move queue's keyless dead letters (only those of ids, when not NULL) back
-- into the queue as new keyless messages due at at: their new ids, in the
-- order of their old ones. Locks the dead letters in id order.
CREATE FUNCTION dq__redrive_keyless(queue text, ids bigint[], at timestamptz, now_at timestamptz)
RETURNS bigint[]
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_rows tid[];
    v_new bigint[];
    v_channels text[];
    v_priorities integer[];
BEGIN
    v_rows := ARRAY(
        SELECT d.ctid FROM @extschema@.dq_dead_letters AS d
        WHERE d.queue = dq__redrive_keyless.queue AND d.key IS NULL
            AND (dq__redrive_keyless.ids IS NULL OR d.id = ANY(dq__redrive_keyless.ids))
        ORDER BY d.id
        FOR UPDATE
    );
    IF cardinality(v_rows) = 0 THEN
        RETURN '{}';
    END IF;
    -- keyless dead letters are never updated, only deleted: the addresses
    -- locked are the versions this statement sees (a TID scan, whatever the
    -- statistics say)
    WITH removed AS (
        DELETE FROM @extschema@.dq_dead_letters AS d
        WHERE d.ctid = ANY(v_rows)
        RETURNING d.id, d.payload, d.channel, d.priority, d.headers
    ),

    offered AS (
        INSERT INTO @extschema@.dq_messages AS m (
            queue, payload, scheduled_at, due_at, created_at, channel, priority, headers
        )
        SELECT dq__redrive_keyless.queue, r.payload, at, at, now_at, r.channel, r.priority, r.headers
        FROM removed AS r
        ORDER BY r.id
        RETURNING m.id, m.channel, m.priority
    )

    SELECT array_agg(o.id ORDER BY o.id), array_agg(o.channel), array_agg(o.priority)
    INTO v_new, v_channels, v_priorities
    FROM offered AS o;
    PERFORM @extschema@.dq__offers_written(
        queue, v_channels, v_priorities, array_fill(at, ARRAY[cardinality(v_new)]), NULL::boolean[], now_at
    );
    RETURN v_new;
END
$$;

-- Offer queue's dead letter id again (keyed or keyless), due at
-- scheduled_at (NULL: now), as dq_dead_redrive does: the id of the message
-- it became; NULL when queue has no such dead letter, or when its key has a
-- live message again (the dead letter stays), or when its key was buried
-- again meanwhile (the newer dead letter is another one, and stays).
CREATE FUNCTION dq_dead_redrive_id(
    queue text,
    id bigint,
    scheduled_at timestamptz DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := @extschema@.dq_now();
    v_key text;
BEGIN
    PERFORM @extschema@.dq__check_queue(dq_dead_redrive_id.queue);
    PERFORM @extschema@.dq__null_check(dq_dead_redrive_id.id IS NULL, 'id');
    PERFORM @extschema@.dq__check_time(dq_dead_redrive_id.scheduled_at, 'scheduled_at');
    -- (ids of dead letters restored from a 1.0.0 dump may repeat: the first key)
    SELECT d.key INTO v_key
    FROM @extschema@.dq_dead_letters AS d
    WHERE d.queue = dq_dead_redrive_id.queue AND d.id = dq_dead_redrive_id.id
    ORDER BY d.key NULLS FIRST
    LIMIT 1;
    IF NOT FOUND THEN
        -- a redrive of nothing, so that a caller who may not redrive is
        -- refused whether the dead letter exists or not
        PERFORM @extschema@.dq__redrive_keyed(dq_dead_redrive_id.queue, '', NULL::bigint, v_now, v_now);
        RETURN NULL;
    ELSIF v_key IS NULL THEN
        RETURN (@extschema@.dq__redrive_keyless(
            dq_dead_redrive_id.queue, ARRAY[dq_dead_redrive_id.id],
            coalesce(dq_dead_redrive_id.scheduled_at, v_now), v_now
        ))[1];
    ELSIF @extschema@.dq__redrive_keyed(
        dq_dead_redrive_id.queue, v_key, dq_dead_redrive_id.id,
        coalesce(dq_dead_redrive_id.scheduled_at, v_now), v_now
    ) = 0 THEN
        RETURN NULL;
    END IF;
    RETURN (
        SELECT m.id FROM @extschema@.dq_messages AS m
        WHERE m.queue = dq_dead_redrive_id.queue AND m.key = v_key
    );
END
$$;

-- Delete queue's dead letters (only key's when given); the count deleted.
CREATE FUNCTION dq_dead_purge(queue text, key text DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_clock timestamptz := @extschema@.dq_now();  -- unused: an invalid dq.now fails every call
BEGIN
    PERFORM @extschema@.dq__check_queue(dq_dead_purge.queue);
    IF dq_dead_purge.key IS NOT NULL THEN
        PERFORM @extschema@.dq__check_key(dq_dead_purge.key, 'key');
    END IF;
    RETURN @extschema@.dq__dead_delete(dq_dead_purge.queue, dq_dead_purge.key, NULL::bigint);
END
$$;

-- Delete queue's dead letter id (keyed or keyless, since 1.2); the count
-- deleted (more than one only for ids a 1.0.0 dump restored twice).
CREATE FUNCTION dq_dead_purge_id(queue text, id bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_clock timestamptz := @extschema@.dq_now();  -- unused: an invalid dq.now fails every call
BEGIN
    PERFORM @extschema@.dq__check_queue(dq_dead_purge_id.queue);
    PERFORM @extschema@.dq__null_check(dq_dead_purge_id.id IS NULL, 'id');
    RETURN @extschema@.dq__dead_delete(dq_dead_purge_id.queue, NULL::text, dq_dead_purge_id.id);
END
$$;

-- Delete queue's dead letters, only key's and only id's when given; the
-- count deleted. Locks in key order (keyless ones last, by id), like every
-- multi-row writer (a poll burying messages upserts their dead letters in
-- that order), so none deadlock; deletes by address, a TID scan whatever
-- the statistics say.
CREATE FUNCTION dq__dead_delete(queue text, key text, id bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_rows tid[];
    v_deleted bigint;
BEGIN
    -- a locked row may have been replaced meanwhile (a key buried again):
    -- the second statement's fresh snapshot sees the version locked
    v_rows := ARRAY(
        SELECT d.ctid FROM @extschema@.dq_dead_letters AS d
        WHERE d.queue = dq__dead_delete.queue
            AND (dq__dead_delete.key IS NULL OR d.key = dq__dead_delete.key)
            AND (dq__dead_delete.id IS NULL OR d.id = dq__dead_delete.id)
        ORDER BY d.key, d.id
        FOR UPDATE
    );
    DELETE FROM @extschema@.dq_dead_letters AS d
    WHERE d.ctid = ANY(v_rows);
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    RETURN v_deleted;
END
$$;
