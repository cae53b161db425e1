-- Consuming: poll, ack, nack, extend.

-- Lease up to max_count due messages of queue, earliest due first (ties by
-- id); in a queue with channels or priorities, by the turn rule (42_groups.sql).
CREATE FUNCTION dq_poll_many(
    queue text,
    max_count integer,
    lease interval DEFAULT '5 minutes'
) RETURNS SETOF dq_delivery
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
SET enable_seqscan = off
SET jit = off  -- see 10_storage.sql
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := @extschema@.dq_now();
    v_queue text := dq_poll_many.queue;
    v_rows tid[];            -- the picked rows to lease, locked by this poll
    v_relet boolean[];       -- for each: whether it was leased before (expired)
    v_max_attempts integer;  -- dq_configure; NULL: no limit
    v_spent bigint[];        -- picked, but already delivered max_attempts times
    v_grouped boolean;       -- the queue has groups (42_groups.sql)
    v_paused boolean;        -- dq_pause
    v_counting boolean := FALSE;  -- dq__counting_inline's: false, the trigger counts
    v_try integer;           -- the pick's: a lock wait ends the first three
    v_caller_lock_timeout text := current_setting('lock_timeout');
    v_set text;              -- set_config's answer, unused
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
    -- one statement: its settings, and whether it has channels or priorities
    SELECT
        q.max_attempts,
        q.paused_at IS NOT NULL,
        EXISTS (SELECT FROM @extschema@.dq_groups AS g WHERE g.queue = v_queue AND g.channel = '')
    INTO v_max_attempts, v_paused, v_grouped
    FROM (SELECT) AS one
    LEFT JOIN @extschema@.dq_queues AS q ON q.queue = v_queue;
    IF v_paused THEN  -- dq_pause (1.2): nothing is leased, nothing buried
        RETURN;
    END IF;
    -- Polls skip the rows concurrent pollers hold (SKIP LOCKED). Yet
    -- PostgreSQL's SKIP LOCKED can wait: for the newer version of a row whose
    -- updater commits as the scan reaches it (heap_lock_updated_tuple),
    -- holding the rows it locked before, and a writer waiting for one of
    -- those would deadlock with it. So a poll waits 1 ms at most for a lock,
    -- in a subtransaction that lets its rows go when it would wait longer,
    -- and picks again; the last try waits as long as the caller's
    -- lock_timeout says (a table locked for long).
    FOR v_try IN 1..4 LOOP
        BEGIN
            v_set := set_config('lock_timeout', CASE WHEN v_try < 4 THEN '1ms' ELSE v_caller_lock_timeout END, TRUE);
            IF v_grouped THEN  -- every statement of the turn rule under the 1 ms
                RETURN QUERY SELECT * FROM @extschema@.dq__poll_grouped(v_queue, max_count, lease, v_now, v_max_attempts);
                v_set := set_config('lock_timeout', v_caller_lock_timeout, TRUE);
                RETURN;
            END IF;
            -- Pick and lock in one index range scan of (queue, due_at, id).
            -- The arrays keep every statement's plan on an index, generic or
            -- custom.
            SELECT
                coalesce(array_agg(p.row_at) FILTER (WHERE NOT p.spent), '{}'),
                coalesce(array_agg(p.relet) FILTER (WHERE NOT p.spent), '{}'),
                coalesce(array_agg(p.id) FILTER (WHERE p.spent), '{}')
            INTO v_rows, v_relet, v_spent
            FROM (
                SELECT
                    m.ctid AS row_at, m.id, m.lock_token IS NOT NULL AS relet,
                    coalesce(m.attempts >= v_max_attempts, FALSE) AS spent
                FROM @extschema@.dq_messages AS m
                WHERE m.queue = v_queue AND m.channel = '' AND m.priority = 0 AND m.due_at <= v_now
                ORDER BY m.due_at, m.id
                LIMIT max_count
                FOR UPDATE SKIP LOCKED
            ) AS p;
            v_set := set_config('lock_timeout', v_caller_lock_timeout, TRUE);

            -- A due message that already had max_attempts deliveries gets
            -- no more: bury it, saying whether its last lease expired without
            -- an ack or nack (its consumers keep dying) or its last delivery
            -- was nacked, and with which error (dq__gave_up_error).
            IF cardinality(v_spent) > 0 THEN
                PERFORM @extschema@.dq__bury(v_spent, NULL::text, v_now, v_max_attempts);
            END IF;
            IF cardinality(v_rows) = 0 THEN
                RETURN;
            END IF;

            -- The rows stay locked by this transaction, so their addresses
            -- (ctid) still find them: one heap fetch each instead of a primary
            -- key lookup. The leases and their counts in one statement
            -- (12_counts.sql): each row leaves its due time's bin
            -- (leased_due_at is its due time before) for the lease end's,
            -- leased. In the subtransaction that locked them: a row locked
            -- by one and updated by another would need a MultiXact.
            v_counting := @extschema@.dq__counting_inline();
            RETURN QUERY
            WITH leased AS (
                UPDATE @extschema@.dq_messages AS m
                SET attempts = m.attempts + 1,
                    lock_token = @extschema@.dq__token(m.id, (SELECT @extschema@.dq__token_proof())),
                    due_at = v_now + lease,
                    leased_at = v_now,
                    leased_due_at = m.due_at
                FROM unnest(v_rows, v_relet) WITH ORDINALITY AS picked (row_at, relet, pos)
                WHERE m.ctid = picked.row_at
                RETURNING
                    picked.pos, picked.relet, m.leased_due_at,
                    m.id, m.queue, m.key, m.payload, m.state, m.scheduled_at,
                    m.created_at, m.attempts, m.lock_token, m.due_at, m.headers
            ),
            counted AS (
                INSERT INTO @extschema@.dq_counts (queue, due_bin, leased, n)
                SELECT v_queue, @extschema@.dq__due_bin(l.leased_due_at), l.relet, -count(*)
                FROM leased AS l
                WHERE v_counting
                GROUP BY 2, 3
                UNION ALL  -- every lease ends in the same bin
                SELECT v_queue, @extschema@.dq__due_bin(v_now + lease), TRUE, count(*)
                FROM leased AS l
                WHERE v_counting
                HAVING count(*) > 0
            )
            SELECT
                l.id, l.queue::text, l.key::text, l.payload, l.state, l.scheduled_at,
                l.created_at, l.attempts, l.attempts > 1, l.lock_token, l.due_at,
                NULL::text, 0,  -- a plain queue's messages have no channel, priority 0
                l.headers
            FROM leased AS l
            ORDER BY l.pos;
            v_counting := @extschema@.dq__counted_inline(v_counting);
            RETURN;
        EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
            IF v_try = 4 THEN
                RAISE;
            END IF;
        END;
    END LOOP;
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
-- With queue given, a token of another queue's message is stale too (1.2).
CREATE FUNCTION dq_ack(lock_token uuid, queue text DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET "dq.outcome" = 'acked'  -- what the history records (57_history.sql)
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
SET enable_seqscan = off
SET jit = off  -- see 10_storage.sql
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := @extschema@.dq_now();
    v_queue text;
    v_channel text;
    v_until timestamptz;
    v_counting boolean := FALSE;  -- dq__counting_inline's: false, the trigger counts (and records)
BEGIN
    IF dq_ack.queue IS NOT NULL AND NOT @extschema@.dq__valid_queue(dq_ack.queue) THEN
        PERFORM @extschema@.dq__check_queue(dq_ack.queue);
    END IF;
    -- (without queue, the token's queue is known only once the row is deleted)
    IF NOT @extschema@.dq__may_keep_history(
        CASE WHEN dq_ack.queue IS NOT NULL THEN ARRAY[dq_ack.queue] END
    ) THEN
        v_counting := @extschema@.dq__counting_inline();
    END IF;
    WITH acked AS (
        DELETE FROM @extschema@.dq_messages AS m
        WHERE m.id = @extschema@.dq__token_id(dq_ack.lock_token)
            AND m.lock_token = dq_ack.lock_token
            AND (dq_ack.queue IS NULL OR m.queue = dq_ack.queue)
        RETURNING m.queue, m.channel, m.due_at
    ),
    counted AS (  -- a leased message leaves its lease end's bin
        INSERT INTO @extschema@.dq_counts (queue, due_bin, leased, n)
        SELECT a.queue, @extschema@.dq__due_bin(a.due_at), TRUE, -1
        FROM acked AS a
        WHERE v_counting
    )
    SELECT a.queue, a.channel, a.due_at INTO v_queue, v_channel, v_until
    FROM acked AS a;
    v_counting := @extschema@.dq__counted_inline(v_counting);
    IF v_queue IS NULL THEN
        RETURN FALSE;
    END IF;
    IF v_channel <> '' AND v_until > v_now THEN  -- a channel's slot may be free
        PERFORM @extschema@.dq__leases_ended(ARRAY[v_queue], ARRAY[v_channel], ARRAY[v_until], v_now);
    END IF;
    RETURN TRUE;
END
$$;

-- The channels of queues whose leases a statement ended (for each message:
-- its queue, channel and due time before, ended: its lease was valid at
-- now_at) are told (dq__groups_touch): their slots are free.
CREATE FUNCTION dq__leases_ended(
    queues text[], channels text[], dues timestamptz[], now_at timestamptz
) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_freed record;
BEGIN
    FOR v_freed IN
        SELECT e.q AS queue, array_agg(e.c) AS channels
        FROM unnest(queues, channels, dues) AS e (q, c, d)
        WHERE e.c <> '' AND e.d > now_at
            -- only a channel with max_concurrency has slots to free
            AND EXISTS (
                SELECT FROM @extschema@.dq_groups AS g
                WHERE g.queue = e.q AND g.channel = e.c AND g.max_concurrency IS NOT NULL
            )
        GROUP BY e.q
        ORDER BY e.q
    LOOP
        PERFORM @extschema@.dq__groups_touch(
            v_freed.queue, v_freed.channels,
            array_fill(NULL::timestamptz, ARRAY[cardinality(v_freed.channels)]),
            array_fill(TRUE, ARRAY[cardinality(v_freed.channels)]),
            now_at
        );
    END LOOP;
END
$$;

-- Ack a batch of tokens: the number of messages deleted; stale ones are
-- skipped (with queue given, another queue's too: 1.2).
CREATE FUNCTION dq_ack_many(lock_tokens uuid[], queue text DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET "dq.outcome" = 'acked'  -- what the history records (57_history.sql)
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
SET enable_seqscan = off
SET enable_bitmapscan = off  -- a token's row by its index: a bitmap scan a row cost a fifth more
SET jit = off  -- see 10_storage.sql
AS $$
DECLARE
    v_now timestamptz := @extschema@.dq_now();
    v_try integer;           -- 1: delete straight away; 2: lock in key order first
    v_history boolean;       -- the rows' queues may keep history: the trigger counts and records
    v_locked_queues text[];  -- the queues of the rows locked (second try)
    v_deleted integer;
    v_deleted_queues text[];
    v_queues text[];
    v_channels text[];
    v_dues timestamptz[];
    v_counting boolean := FALSE;  -- dq__counting_inline's: false, the trigger counts (and records)
    v_caller_lock_timeout text := current_setting('lock_timeout');
    v_set text;              -- set_config's answer, unused
BEGIN
    IF dq_ack_many.queue IS NOT NULL AND NOT @extschema@.dq__valid_queue(dq_ack_many.queue) THEN
        PERFORM @extschema@.dq__check_queue(dq_ack_many.queue);
    END IF;
    -- Multi-row lockers of dq_messages take their rows in (queue, key)
    -- order (dq_offer_many's upsert, dq_purge), so that no two deadlock. An
    -- ack first deletes its rows as the tokens come, waiting 1 ms at most
    -- for a row (a subtransaction, undone when it would wait longer: a
    -- waiter never holds what another waits for for long); only then does
    -- it lock its rows in key order (keyless ones last, by id) and delete
    -- them, waiting as the caller's lock_timeout says.
    FOR v_try IN 1..2 LOOP
        BEGIN
            IF v_try = 1 THEN
                v_set := set_config('lock_timeout', '1ms', TRUE);
                v_history := @extschema@.dq__may_keep_history(
                    CASE WHEN dq_ack_many.queue IS NOT NULL THEN ARRAY[dq_ack_many.queue] END
                );
            ELSE
                SELECT coalesce(array_agg(DISTINCT l.queue), '{}') INTO v_locked_queues
                FROM (
                    SELECT m.queue
                    FROM @extschema@.dq_messages AS m
                    INNER JOIN unnest(lock_tokens) AS t (token)
                        ON m.id = @extschema@.dq__token_id(t.token) AND m.lock_token = t.token
                    WHERE dq_ack_many.queue IS NULL OR m.queue = dq_ack_many.queue
                    ORDER BY m.queue, m.key, m.id
                    FOR UPDATE OF m
                ) AS l;
                -- asked after the locks: a transaction that turned
                -- retention on while holding one of these rows has committed
                v_history := @extschema@.dq__may_keep_history(v_locked_queues);
            END IF;
            -- Leased messages leave their lease ends' bins (12_counts.sql):
            -- here, unless their queues may keep history, whose records the
            -- trigger writes with the counts.
            IF NOT v_history THEN
                v_counting := @extschema@.dq__counting_inline();
            END IF;
            WITH deleted AS (
                DELETE FROM @extschema@.dq_messages AS m
                USING unnest(lock_tokens) AS t (token)
                WHERE m.id = @extschema@.dq__token_id(t.token) AND m.lock_token = t.token
                    AND (dq_ack_many.queue IS NULL OR m.queue = dq_ack_many.queue)
                RETURNING m.queue, m.channel, m.due_at
            ),
            counted AS (
                INSERT INTO @extschema@.dq_counts (queue, due_bin, leased, n)
                SELECT d.queue, @extschema@.dq__due_bin(d.due_at), TRUE, -count(*)
                FROM deleted AS d
                WHERE v_counting
                GROUP BY 1, 2
            )

            SELECT
                count(*),
                coalesce(array_agg(DISTINCT d.queue), '{}'),
                array_agg(d.queue) FILTER (WHERE d.channel <> ''),
                array_agg(d.channel) FILTER (WHERE d.channel <> ''),
                array_agg(d.due_at) FILTER (WHERE d.channel <> '')
            INTO v_deleted, v_deleted_queues, v_queues, v_channels, v_dues
            FROM deleted AS d;
            v_counting := @extschema@.dq__counted_inline(v_counting);
            v_set := set_config('lock_timeout', v_caller_lock_timeout, TRUE);
            -- The first try may have waited (1 ms) for a transaction that
            -- turned retention on for these rows' queues: undone, they are
            -- acked again in key order, and recorded.
            IF v_try = 1 AND NOT v_history AND @extschema@.dq__may_keep_history(v_deleted_queues) THEN
                RAISE EXCEPTION 'history began while acking' USING ERRCODE = 'lock_not_available';
            END IF;
            EXIT;
        EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
            IF v_try = 2 THEN
                RAISE;
            END IF;
            v_counting := FALSE;  -- its mark went with the subtransaction
        END;
    END LOOP;
    IF v_queues IS NOT NULL THEN
        PERFORM @extschema@.dq__leases_ended(v_queues, v_channels, v_dues, v_now);
    END IF;
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
-- as the message's last_error; false when stale (with queue given, also
-- when the token is another queue's: 1.2).
CREATE FUNCTION dq_nack(
    lock_token uuid,
    retry_at timestamptz DEFAULT NULL,
    state jsonb DEFAULT NULL,
    error text DEFAULT NULL,
    queue text DEFAULT NULL
) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
SET enable_seqscan = off
SET jit = off  -- see 10_storage.sql
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := @extschema@.dq_now();
    v_queue text;
    v_due_at timestamptz;
    v_channel text;
    v_priority integer;
BEGIN
    -- a retry time no client could read (infinity parks the message for
    -- ever, -infinity would make dq_next_due report it): refuse it
    IF NOT @extschema@.dq__valid_time(dq_nack.retry_at) THEN
        PERFORM @extschema@.dq__check_time(dq_nack.retry_at, 'retry_at');
    END IF;
    IF dq_nack.queue IS NOT NULL AND NOT @extschema@.dq__valid_queue(dq_nack.queue) THEN
        PERFORM @extschema@.dq__check_queue(dq_nack.queue);
    END IF;
    UPDATE @extschema@.dq_messages AS m
    SET lock_token = NULL,
        due_at = coalesce(dq_nack.retry_at, v_now),
        state = coalesce(dq_nack.state, m.state),
        last_error = right(dq_nack.error, @extschema@.dq__error_max_length())
    WHERE m.id = @extschema@.dq__token_id(dq_nack.lock_token)
        AND m.lock_token = dq_nack.lock_token
        AND (dq_nack.queue IS NULL OR m.queue = dq_nack.queue)
    RETURNING m.queue, m.due_at, m.channel, m.priority INTO v_queue, v_due_at, v_channel, v_priority;
    IF NOT FOUND THEN
        RETURN FALSE;
    END IF;
    IF v_channel = '' AND v_priority = 0 THEN
        -- a message handed back before the queue's head wakes idle consumers
        PERFORM @extschema@.dq__wake_if_head(v_queue, v_due_at);
        RETURN TRUE;
    END IF;
    -- its lease may have been valid: a slot of its channel may be free
    IF v_channel <> '' THEN
        PERFORM @extschema@.dq__groups_touch(v_queue, ARRAY[v_channel], ARRAY[v_due_at], '{TRUE}', v_now);
    END IF;
    PERFORM @extschema@.dq__wake_if_first(v_queue, v_due_at, v_now);
    RETURN TRUE;
END
$$;

-- Heartbeat: lease until now + lease; the new lease_until, NULL when stale
-- (with queue given, also when the token is another queue's: 1.2).
-- A lease that has ended comes back only while its channel has a free slot.
CREATE FUNCTION dq_extend(
    lock_token uuid,
    lease interval,
    queue text DEFAULT NULL
) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
SET enable_seqscan = off
SET jit = off  -- see 10_storage.sql
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := @extschema@.dq_now();
    v_until timestamptz;
    v_message record;
    v_max integer;
BEGIN
    IF NOT @extschema@.dq__valid_lease(lease, v_now) THEN
        PERFORM @extschema@.dq__check_lease(lease, v_now);
    END IF;
    IF dq_extend.queue IS NOT NULL AND NOT @extschema@.dq__valid_queue(dq_extend.queue) THEN
        PERFORM @extschema@.dq__check_queue(dq_extend.queue);
    END IF;
    UPDATE @extschema@.dq_messages AS m
    SET due_at = v_now + lease
    WHERE m.id = @extschema@.dq__token_id(dq_extend.lock_token)
        AND m.lock_token = dq_extend.lock_token
        AND (dq_extend.queue IS NULL OR m.queue = dq_extend.queue)
        AND m.channel = ''
    RETURNING m.due_at INTO v_until;
    IF FOUND THEN
        RETURN v_until;
    END IF;

    -- A channel's message: a poll counting its slots must not see a lease
    -- come back after it counted it as ended. Under the channel's row, which
    -- polls hold while they count, with the clock read afresh.
    SELECT m.queue, m.channel INTO v_message
    FROM @extschema@.dq_messages AS m
    WHERE m.id = @extschema@.dq__token_id(dq_extend.lock_token)
        AND m.lock_token = dq_extend.lock_token
        AND (dq_extend.queue IS NULL OR m.queue = dq_extend.queue);
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    v_max := (
        SELECT g.max_concurrency FROM @extschema@.dq_groups AS g
        WHERE g.queue = v_message.queue AND g.channel = v_message.channel
    );
    IF v_max IS NOT NULL THEN
        SELECT g.max_concurrency INTO v_max
        FROM @extschema@.dq_groups AS g
        WHERE g.queue = v_message.queue AND g.channel = v_message.channel
        FOR NO KEY UPDATE;
        v_now := @extschema@.dq_now();
    END IF;
    UPDATE @extschema@.dq_messages AS m
    SET due_at = v_now + lease
    WHERE m.id = @extschema@.dq__token_id(dq_extend.lock_token)
        AND m.lock_token = dq_extend.lock_token
        AND m.queue = v_message.queue
        AND (
            v_max IS NULL OR m.due_at > v_now
            OR (SELECT h.held FROM @extschema@.dq__leases_held(m.queue, m.channel, v_now, v_max) AS h) < v_max
        )
    RETURNING m.due_at INTO v_until;
    RETURN v_until;
END
$$;
