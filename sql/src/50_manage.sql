-- Managing: cancel, get, peek, purge, stats, next_due.
-- The reading functions are LANGUAGE sql: their argument checks are
-- statements of their own, so each runs whether or not a row is read, and
-- their result columns may repeat their arguments' names.

-- Delete queue's message id (NULL: none), leased or not, freeing the slot
-- its lease held; its history record says outcome ('acked' or 'cancelled').
-- True if one was deleted. The one place that cancels and finishes: the
-- public functions below only name the outcome, which is set for this call
-- alone (the SET clause restores the caller's dq.outcome on return), so no
-- caller's setting reaches the record (57_history.sql).
CREATE FUNCTION dq__cancel(queue text, id bigint, outcome text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET "dq.outcome" = ''
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := @extschema@.dq_now();
    v_channel text;
    v_due_at timestamptz;
BEGIN
    IF dq__cancel.outcome IS DISTINCT FROM 'acked' AND dq__cancel.outcome IS DISTINCT FROM 'cancelled' THEN
        RAISE EXCEPTION 'pgdq: outcome must be acked or cancelled' USING ERRCODE = '22023';
    END IF;
    PERFORM set_config('dq.outcome', dq__cancel.outcome, true);
    DELETE FROM @extschema@.dq_messages AS m
    WHERE m.id = dq__cancel.id AND m.queue = dq__cancel.queue
    RETURNING m.channel, CASE WHEN m.lock_token IS NOT NULL THEN m.due_at END INTO v_channel, v_due_at;
    IF NOT FOUND THEN
        RETURN FALSE;
    END IF;
    PERFORM @extschema@.dq__leases_ended(ARRAY[dq__cancel.queue], ARRAY[v_channel], ARRAY[v_due_at], v_now);
    RETURN TRUE;
END
$$;

-- dq__cancel of queue's message of key, the arguments checked (dq_cancel,
-- dq_finish).
CREATE FUNCTION dq__cancel_key(queue text, key text, outcome text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@.dq__check_queue(dq__cancel_key.queue);
    PERFORM @extschema@.dq__check_key(dq__cancel_key.key, 'key');
    RETURN @extschema@.dq__cancel(dq__cancel_key.queue, (
        SELECT m.id FROM @extschema@.dq_messages AS m
        WHERE m.queue = dq__cancel_key.queue AND m.key = dq__cancel_key.key
    ), dq__cancel_key.outcome);
END
$$;

-- dq__cancel of queue's message id (keyed or keyless), the arguments
-- checked (dq_cancel_id, dq_finish_id).
CREATE FUNCTION dq__cancel_id(queue text, id bigint, outcome text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@.dq__check_queue(dq__cancel_id.queue);
    PERFORM @extschema@.dq__null_check(dq__cancel_id.id IS NULL, 'id');
    RETURN @extschema@.dq__cancel(dq__cancel_id.queue, dq__cancel_id.id, dq__cancel_id.outcome);
END
$$;

-- Delete one message, leased or not; true if one was deleted.
CREATE FUNCTION dq_cancel(queue text, key text) RETURNS boolean
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$ SELECT @extschema@.dq__cancel_key(queue, key, 'cancelled') $$;

-- Delete one message as done, leased or not (1.3; its history record says
-- 'acked', as an ack's does); true if one was deleted.
CREATE FUNCTION dq_finish(queue text, key text) RETURNS boolean
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$ SELECT @extschema@.dq__cancel_key(queue, key, 'acked') $$;

-- Delete queue's message id (keyed or keyless, since 1.2), leased or not;
-- true if one was deleted.
CREATE FUNCTION dq_cancel_id(queue text, id bigint) RETURNS boolean
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$ SELECT @extschema@.dq__cancel_id(queue, id, 'cancelled') $$;

-- Delete queue's message id as done (1.3; dq_finish by id: recorded
-- 'acked'); true if one was deleted.
CREATE FUNCTION dq_finish_id(queue text, id bigint) RETURNS boolean
LANGUAGE sql VOLATILE SET search_path = pg_catalog, pg_temp
AS $$ SELECT @extschema@.dq__cancel_id(queue, id, 'acked') $$;

-- queue's message id (NULL: none) as dq_get describes it: the one place
-- that does.
CREATE FUNCTION dq__get(queue text, id bigint) RETURNS TABLE (
    queue text,
    key text,
    payload jsonb,
    state jsonb,
    scheduled_at timestamptz,
    due_at timestamptz,
    attempts integer,
    leased boolean,
    created_at timestamptz,
    channel text,
    priority integer,
    headers jsonb  -- since 1.2
)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT
        m.queue::text, m.key::text, m.payload, m.state, m.scheduled_at,
        m.due_at, m.attempts,
        @extschema@.dq__is_leased(m.lock_token, m.due_at, n.now_at),
        m.created_at, nullif(m.channel, '')::text, m.priority, m.headers
    FROM @extschema@.dq_messages AS m
    CROSS JOIN @extschema@.dq_now() AS n (now_at)
    WHERE m.id = dq__get.id AND m.queue = dq__get.queue;
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
    created_at timestamptz,
    channel text,
    priority integer,
    headers jsonb  -- since 1.2
)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT @extschema@.dq_now();  -- unused: an invalid dq.now fails every call
    SELECT @extschema@.dq__check_queue(dq_get.queue);
    SELECT @extschema@.dq__check_key(dq_get.key, 'key');
    SELECT d.* FROM @extschema@.dq__get(dq_get.queue, (
        SELECT m.id FROM @extschema@.dq_messages AS m
        WHERE m.queue = dq_get.queue AND m.key = dq_get.key
    )) AS d;
$$;

-- Read queue's message id (keyed or keyless, since 1.2) as dq_get does.
CREATE FUNCTION dq_get_id(queue text, id bigint) RETURNS TABLE (
    queue text,
    key text,
    payload jsonb,
    state jsonb,
    scheduled_at timestamptz,
    due_at timestamptz,
    attempts integer,
    leased boolean,
    created_at timestamptz,
    channel text,
    priority integer,
    headers jsonb  -- since 1.2
)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT @extschema@.dq_now();  -- unused: an invalid dq.now fails every call
    SELECT @extschema@.dq__check_queue(dq_get_id.queue);
    SELECT @extschema@.dq__null_check(dq_get_id.id IS NULL, 'id');
    SELECT d.* FROM @extschema@.dq__get(dq_get_id.queue, dq_get_id.id) AS d;
$$;

-- True when a message (lock_token, due_at) is in condition which at now_at
-- ('due', 'delayed', 'leased'; NULL: any). Inlines into dq_peek.
CREATE FUNCTION dq__in_condition(
    which text, lock_token uuid, due_at timestamptz, now_at timestamptz
) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE which
        WHEN 'due' THEN due_at OPERATOR(pg_catalog.<=) now_at
        WHEN 'delayed' THEN due_at OPERATOR(pg_catalog.>) now_at AND lock_token IS NULL
        WHEN 'leased' THEN @extschema@.dq__is_leased(lock_token, due_at, now_at)
        ELSE TRUE
    END
$$;

-- Browse queue without locking or changing anything: up to max_count
-- messages (1..1000) in one condition (which: 'due', 'delayed', 'leased';
-- NULL: all), by due time then key (keyless ones last, by id); never a
-- lock token.
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
    last_error text,
    id bigint,  -- since 1.2
    headers jsonb  -- since 1.2
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
        m.last_error,
        m.id,
        m.headers
    FROM (
        -- the first max_count of each poll index in due order, merged
        (
            SELECT p.key, p.payload, p.state, p.scheduled_at, p.due_at, p.attempts, p.lock_token, p.last_error, p.id, p.headers
            FROM @extschema@.dq_messages AS p
            CROSS JOIN @extschema@.dq_now() AS n (now_at)
            WHERE p.queue = dq_peek.queue AND p.channel = '' AND p.priority = 0
                AND @extschema@.dq__in_condition(dq_peek.which, p.lock_token, p.due_at, n.now_at)
            ORDER BY p.due_at, p.key, p.id
            LIMIT dq_peek.max_count
        )
        UNION ALL
        (
            SELECT g.key, g.payload, g.state, g.scheduled_at, g.due_at, g.attempts, g.lock_token, g.last_error, g.id, g.headers
            FROM @extschema@.dq_messages AS g
            CROSS JOIN @extschema@.dq_now() AS n (now_at)
            WHERE g.queue = dq_peek.queue AND (g.channel <> '' OR g.priority <> 0)
                AND @extschema@.dq__in_condition(dq_peek.which, g.lock_token, g.due_at, n.now_at)
            ORDER BY g.due_at, g.key, g.id
            LIMIT dq_peek.max_count
        )
    ) AS m
    CROSS JOIN @extschema@.dq_now() AS n (now_at)
    CROSS JOIN LATERAL (SELECT @extschema@.dq__is_leased(m.lock_token, m.due_at, n.now_at)) AS l (leased)
    ORDER BY m.due_at, m.key, m.id
    LIMIT dq_peek.max_count;
$$;

-- Browse queue a page at a time (1.2; the dashboard's list): as dq_peek,
-- with only keys starting with key_prefix (NULL: any) and only messages
-- after (after_due_at, after_id) in (due time, id) order, the last row of
-- the page before (NULL: from the start). Without a prefix it reads the
-- head of the queue's ranges of the poll indexes from that point; with one,
-- the prefix's range of the key index (keyless messages have no key: none
-- match a prefix), sorted.
CREATE FUNCTION dq_browse(
    queue text,
    which text DEFAULT NULL,
    key_prefix text DEFAULT NULL,
    after_due_at timestamptz DEFAULT NULL,
    after_id bigint DEFAULT NULL,
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
    last_error text,
    id bigint,
    headers jsonb
)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT @extschema@.dq_now();  -- unused: an invalid dq.now fails every call
    SELECT @extschema@.dq__check_queue(dq_browse.queue);
    SELECT @extschema@.dq__check_one_of(dq_browse.which, 'which', ARRAY['due', 'delayed', 'leased']);
    SELECT @extschema@.dq__check_key(dq_browse.key_prefix, 'key_prefix') WHERE dq_browse.key_prefix IS NOT NULL;
    SELECT @extschema@.dq__check_between(dq_browse.max_count, 'max_count', 1, 1000);
    SELECT
        m.key::text, m.payload, m.state, m.scheduled_at, m.due_at, m.attempts,
        l.leased, CASE WHEN l.leased THEN m.due_at END, m.last_error, m.id, m.headers
    FROM (
        (
            SELECT p.* FROM @extschema@.dq_messages AS p
            WHERE dq_browse.key_prefix IS NULL
                AND p.queue = dq_browse.queue AND p.channel = '' AND p.priority = 0
                AND (dq_browse.after_due_at IS NULL OR (p.due_at, p.id) > (dq_browse.after_due_at, coalesce(dq_browse.after_id, 0)))
                AND @extschema@.dq__in_condition(dq_browse.which, p.lock_token, p.due_at, @extschema@.dq_now())
            ORDER BY p.due_at, p.id
            LIMIT dq_browse.max_count
        )
        UNION ALL
        (
            SELECT g.* FROM @extschema@.dq_messages AS g
            WHERE dq_browse.key_prefix IS NULL
                AND g.queue = dq_browse.queue AND (g.channel <> '' OR g.priority <> 0)
                AND (dq_browse.after_due_at IS NULL OR (g.due_at, g.id) > (dq_browse.after_due_at, coalesce(dq_browse.after_id, 0)))
                AND @extschema@.dq__in_condition(dq_browse.which, g.lock_token, g.due_at, @extschema@.dq_now())
            ORDER BY g.due_at, g.id
            LIMIT dq_browse.max_count
        )
        UNION ALL
        (
            -- the prefix's range of the key index: from the prefix up to the
            -- prefix followed by the last code point, then checked exactly
            SELECT k.* FROM @extschema@.dq_messages AS k
            WHERE dq_browse.key_prefix IS NOT NULL
                AND k.queue = dq_browse.queue
                AND k.key >= dq_browse.key_prefix AND k.key <= dq_browse.key_prefix || chr(1114111)
                AND starts_with(k.key, dq_browse.key_prefix)
                AND (dq_browse.after_due_at IS NULL OR (k.due_at, k.id) > (dq_browse.after_due_at, coalesce(dq_browse.after_id, 0)))
                AND @extschema@.dq__in_condition(dq_browse.which, k.lock_token, k.due_at, @extschema@.dq_now())
            ORDER BY k.due_at, k.id
            LIMIT dq_browse.max_count
        )
    ) AS m
    CROSS JOIN LATERAL (SELECT @extschema@.dq__is_leased(m.lock_token, m.due_at, @extschema@.dq_now())) AS l (leased)
    ORDER BY m.due_at, m.id
    LIMIT dq_browse.max_count;
$$;

-- Make queue's message id due now (1.2; the dashboard's "run now"): true
-- when it was delayed (not leased, due later); a leased or due message is
-- left as it is (false). Its scheduled_at, attempts and state stay.
CREATE FUNCTION dq_run_now(queue text, id bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := @extschema@.dq_now();
    v_channel text;
    v_priority integer;
BEGIN
    PERFORM @extschema@.dq__check_queue(dq_run_now.queue);
    PERFORM @extschema@.dq__null_check(dq_run_now.id IS NULL, 'id');
    UPDATE @extschema@.dq_messages AS m
    SET due_at = v_now
    WHERE m.id = dq_run_now.id AND m.queue = dq_run_now.queue AND m.lock_token IS NULL AND m.due_at > v_now
    RETURNING m.channel, m.priority INTO v_channel, v_priority;
    IF NOT FOUND THEN
        RETURN FALSE;
    END IF;
    IF v_channel = '' AND v_priority = 0 THEN
        PERFORM @extschema@.dq__wake_if_head(dq_run_now.queue, v_now);
        RETURN TRUE;
    END IF;
    -- its group comes due earlier (as an offer due now would make it)
    IF v_channel <> '' THEN
        PERFORM @extschema@.dq__groups_touch(dq_run_now.queue, ARRAY[v_channel], ARRAY[v_now], '{FALSE}', v_now);
    END IF;
    PERFORM @extschema@.dq__wake_if_first(dq_run_now.queue, v_now, v_now);
    RETURN TRUE;
END
$$;

-- Delete every message of queue; the count deleted.
CREATE FUNCTION dq_purge(queue text) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET "dq.outcome" = 'purged'  -- what the history records (57_history.sql)
AS $$
#variable_conflict use_column
DECLARE
    v_clock timestamptz := @extschema@.dq_now();  -- unused: an invalid dq.now fails every call
    v_rows tid[];
    v_deleted bigint;
BEGIN
    PERFORM @extschema@.dq__check_queue(dq_purge.queue);
    -- Locks in key order, like dq_offer_many, so the two never deadlock
    -- (keyless messages last, by id).
    v_rows := ARRAY(
        SELECT m.ctid FROM @extschema@.dq_messages AS m
        WHERE m.queue = dq_purge.queue AND @extschema@.dq__in_poll_indexes(m.channel, m.priority)
        ORDER BY m.key, m.id
        FOR UPDATE OF m
    );
    -- Deleted by address (as dq_ack_many does): a TID scan whatever the
    -- statistics say, where a join back on id planned a nested loop over
    -- every pair of rows when the table was last analyzed empty (minutes
    -- for 100,000 messages).
    DELETE FROM @extschema@.dq_messages AS m
    WHERE m.ctid = ANY(v_rows);
    GET DIAGNOSTICS v_deleted = ROW_COUNT;
    -- slots the leases held are free: every group of the queue looks again
    -- (and is forgotten if it has no message and no limits)
    UPDATE @extschema@.dq_groups AS g
    SET wake_at = NULL
    WHERE g.queue = dq_purge.queue AND g.wake_at IS NOT NULL;
    RETURN v_deleted;
END
$$;

-- dq_stats of one queue (its counts at now; zeros when it has none), read
-- from its ranges of the two poll indexes, which between them hold every
-- message: it costs what the queue holds, whatever the statistics say (with
-- a generic plan, a queue looked as large as any and got a scan of every
-- queue's messages). The counts are those of dq_stats's overview.
CREATE FUNCTION dq__queue_stats(queue text) RETURNS TABLE (
    ready bigint,
    delayed bigint,
    leased bigint,
    oldest_ready_at timestamptz,
    next_due_at timestamptz
)
LANGUAGE sql VOLATILE  -- it reads dq_now, which can raise (20_checks.sql)
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
SET jit = off  -- see 10_storage.sql
AS $$
    SELECT
        count(*) FILTER (WHERE m.due_at <= n.now_at),
        count(*) FILTER (WHERE m.due_at > n.now_at AND m.lock_token IS NULL),
        count(*) FILTER (WHERE @extschema@.dq__is_leased(m.lock_token, m.due_at, n.now_at)),
        min(m.due_at) FILTER (WHERE m.due_at <= n.now_at),
        min(m.due_at) FILTER (WHERE m.due_at > n.now_at AND m.lock_token IS NULL)
    FROM (
        SELECT p.due_at, p.lock_token
        FROM @extschema@.dq_messages AS p
        WHERE p.queue = dq__queue_stats.queue AND p.channel = '' AND p.priority = 0
        UNION ALL
        SELECT g.due_at, g.lock_token
        FROM @extschema@.dq_messages AS g
        WHERE g.queue = dq__queue_stats.queue AND (g.channel <> '' OR g.priority <> 0)
    ) AS m
    CROSS JOIN @extschema@.dq_now() AS n (now_at);
$$;

-- dq_stats' overview from dq_counts (12_counts.sql) at now_at: whole bins
-- summed, the current bin's messages still ahead of now_at counted from the
-- poll indexes. The same rows as dq__scanned_stats, at the cost of the
-- counts and a few probes per queue, whatever the table holds.
--
-- What dq_counts cannot say about a queue (its messages due after now_at
-- and before the end of the current bin, delayed and leased; its oldest
-- ready due time and its next delayed one) is read per queue in the
-- statement itself (h): probes of the plain poll index, and a read of the
-- queue's entries in the grouped one (not in due order across channels;
-- one empty descent for a plain queue), as dq__queue_stats reads it. In
-- 1.2 a function did that per queue (dq__queue_head): its call, with its
-- SET clauses, cost 8 times the probes (2.2 s of 2.5 at 20,000 queues).
CREATE FUNCTION dq__counted_stats(now_at timestamptz) RETURNS TABLE (
    queue text,
    ready bigint,
    delayed bigint,
    leased bigint,
    oldest_ready_at timestamptz,
    next_due_at timestamptz
)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off  -- probes, whatever the statistics say
SET jit = off  -- see 10_storage.sql
AS $$
    WITH queues AS (
        -- one pass over the counts, summed per queue by bin: before or in
        -- the bin holding now_at, or after it (leased or not)
        SELECT
            c.queue,
            coalesce(sum(c.n) FILTER (WHERE c.due_bin <= @extschema@.dq__due_bin(now_at)), 0) AS due_by_bin,
            coalesce(
                sum(c.n) FILTER (WHERE c.due_bin > @extschema@.dq__due_bin(now_at) AND NOT c.leased), 0
            ) AS delayed_later,
            coalesce(sum(c.n) FILTER (WHERE c.due_bin > @extschema@.dq__due_bin(now_at) AND c.leased), 0) AS leased_later,
            -- which probes can find anything (h): none finds what no bin holds
            coalesce(sum(c.n) FILTER (WHERE c.due_bin = @extschema@.dq__due_bin(now_at)), 0) AS in_bin,
            coalesce(
                sum(c.n) FILTER (WHERE c.due_bin >= @extschema@.dq__due_bin(now_at) AND NOT c.leased), 0
            ) AS unleased_ahead
        FROM @extschema@.dq_counts AS c
        GROUP BY c.queue
        HAVING sum(c.n) <> 0
    ),
    bin AS (
        SELECT now_at, @extschema@.dq__due_bin(now_at) + @extschema@.dq__due_bin_width() AS until_at
    )
    SELECT
        q.queue::text,
        q.due_by_bin - h.soon_delayed - h.soon_leased,
        q.delayed_later + h.soon_delayed,
        q.leased_later + h.soon_leased,
        h.oldest_ready_at,
        h.next_due_at
    FROM queues AS q
    CROSS JOIN bin AS t
    CROSS JOIN LATERAL (
        SELECT
            s.delayed + g.delayed AS soon_delayed,
            s.leased + g.leased AS soon_leased,
            least(
                (SELECT min(p.due_at) FROM @extschema@.dq_messages AS p
                 WHERE q.due_by_bin <> 0
                    AND p.queue = q.queue AND p.channel = '' AND p.priority = 0 AND p.due_at <= t.now_at),
                g.oldest_ready_at
            ) AS oldest_ready_at,
            least(
                (SELECT p.due_at FROM @extschema@.dq_messages AS p
                 WHERE q.unleased_ahead <> 0
                    AND p.queue = q.queue AND p.channel = '' AND p.priority = 0
                    AND p.due_at > t.now_at AND p.lock_token IS NULL
                 ORDER BY p.due_at LIMIT 1),
                g.next_due_at
            ) AS next_due_at
        FROM (
            SELECT
                count(*) FILTER (WHERE p.lock_token IS NULL) AS delayed,
                count(*) FILTER (WHERE p.lock_token IS NOT NULL) AS leased
            FROM @extschema@.dq_messages AS p
            WHERE q.in_bin <> 0
                AND p.queue = q.queue AND p.channel = '' AND p.priority = 0
                AND p.due_at > t.now_at AND p.due_at < t.until_at
        ) AS s
        CROSS JOIN (
            SELECT
                count(*) FILTER (
                    WHERE g.due_at > t.now_at AND g.due_at < t.until_at AND g.lock_token IS NULL
                ) AS delayed,
                count(*) FILTER (
                    WHERE g.due_at > t.now_at AND g.due_at < t.until_at AND g.lock_token IS NOT NULL
                ) AS leased,
                min(g.due_at) FILTER (WHERE g.due_at <= t.now_at) AS oldest_ready_at,
                min(g.due_at) FILTER (WHERE g.due_at > t.now_at AND g.lock_token IS NULL) AS next_due_at
            FROM @extschema@.dq_messages AS g
            WHERE g.queue = q.queue AND (g.channel <> '' OR g.priority <> 0)
        ) AS g
    ) AS h
    ORDER BY 1;
$$;

-- dq_stats' overview read from the table itself: one pass over every
-- message. What dq_counts is checked against (tests), and what dq_stats()
-- reads when it cannot read the counts (dq__overview_counted).
CREATE FUNCTION dq__scanned_stats(now_at timestamptz) RETURNS TABLE (
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
    SELECT
        m.queue::text,
        count(*) FILTER (WHERE m.due_at <= now_at),
        count(*) FILTER (WHERE m.due_at > now_at AND m.lock_token IS NULL),
        count(*) FILTER (WHERE @extschema@.dq__is_leased(m.lock_token, m.due_at, now_at)),
        min(m.due_at) FILTER (WHERE m.due_at <= now_at),
        min(m.due_at) FILTER (WHERE m.due_at > now_at AND m.lock_token IS NULL)
    FROM @extschema@.dq_messages AS m
    GROUP BY m.queue
    ORDER BY 1;
$$;

-- Whether dq_stats() at now_at reads the counts (dq__counted_stats): the
-- caller may read them and is not isolated by row-level security (12_counts.sql),
-- and the clock is not pinned more than 6 days back, before bins the counts
-- may have folded into '-infinity'. Otherwise it reads the table, as 1.1 did.
CREATE FUNCTION dq__overview_counted(now_at timestamptz) RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT now_at >= pg_catalog.clock_timestamp() - interval '6 days'
        AND pg_catalog.has_table_privilege('@extschema@.dq_counts', 'SELECT')
        AND NOT pg_catalog.row_security_active('@extschema@.dq_messages');
$$;

-- Whether queue is paused (dq_pause); NULL for a caller that may not read
-- the queues' settings (a role granted only SELECT on dq_messages, whose
-- dq_stats worked in 1.1 and still does).
CREATE FUNCTION dq__paused(queue text) RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT has_table_privilege('@extschema@.dq_queues', 'SELECT') THEN
        RETURN NULL;
    END IF;
    RETURN EXISTS (
        SELECT FROM @extschema@.dq_queues AS q WHERE q.queue = dq__paused.queue AND q.paused_at IS NOT NULL
    );
END
$$;

-- The paused queues (dq_pause); none for a caller that may not read the
-- queues' settings (a role granted only SELECT on dq_messages, whose
-- dq_stats worked in 1.1 and still does: dq_stats says NULL there). Read
-- once per dq_stats call (1.2 probed dq_queues once per queue).
CREATE FUNCTION dq__paused_queues() RETURNS SETOF text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF has_table_privilege('@extschema@.dq_queues', 'SELECT') THEN
        RETURN QUERY SELECT q.queue::text FROM @extschema@.dq_queues AS q WHERE q.paused_at IS NOT NULL;
    END IF;
END
$$;

-- One row per queue with messages, or exactly one row for the named queue.
CREATE FUNCTION dq_stats(queue text DEFAULT NULL) RETURNS TABLE (
    queue text,
    ready bigint,
    delayed bigint,
    leased bigint,
    oldest_ready_at timestamptz,
    next_due_at timestamptz,
    paused boolean  -- since 1.2 (dq_pause)
)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT @extschema@.dq_now();  -- unused: an invalid dq.now fails every call
    SELECT @extschema@.dq__check_queue(dq_stats.queue) WHERE dq_stats.queue IS NOT NULL;
    SELECT
        s.*,
        -- NULL: the caller may not read the queues' settings (dq__paused_queues)
        CASE WHEN r.may_read THEN p.queue IS NOT NULL END
    FROM (
        -- every queue: from the counts (1.2: one pass over the table)
        SELECT c.*
        FROM @extschema@.dq_now() AS n (now_at)
        CROSS JOIN LATERAL @extschema@.dq__counted_stats(n.now_at) AS c
        WHERE dq_stats.queue IS NULL AND @extschema@.dq__overview_counted(n.now_at)
        UNION ALL
        SELECT c.*
        FROM @extschema@.dq_now() AS n (now_at)
        CROSS JOIN LATERAL @extschema@.dq__scanned_stats(n.now_at) AS c
        WHERE dq_stats.queue IS NULL AND NOT @extschema@.dq__overview_counted(n.now_at)
        UNION ALL
        -- a named queue: its messages only, zeros when it has none (1.2: it read every queue)
        SELECT dq_stats.queue, c.*
        FROM @extschema@.dq__queue_stats(dq_stats.queue) AS c
        WHERE dq_stats.queue IS NOT NULL
    ) AS s
    LEFT JOIN @extschema@.dq__paused_queues() AS p (queue) ON p.queue = s.queue
    CROSS JOIN (SELECT has_table_privilege('@extschema@.dq_queues', 'SELECT') AS may_read) AS r
    ORDER BY 1;
$$;


-- Messages falling due in each of the next hours hours (1 to 168) of queue:
-- hour_start is now plus whole hours; a leased message counts at its lease's
-- end, when it would be delivered again. Two index range scans (the poll
-- indexes), so a dashboard's chart costs the messages of those hours only.
CREATE FUNCTION dq_due_hours(queue text, hours integer DEFAULT 24) RETURNS TABLE (
    hour_start timestamptz,
    due bigint
)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT @extschema@.dq_now();  -- unused: an invalid dq.now fails every call
    SELECT @extschema@.dq__check_queue(dq_due_hours.queue);
    SELECT @extschema@.dq__check_between(dq_due_hours.hours, 'hours', 1, 168);
    WITH now_at AS (SELECT @extschema@.dq_now() AS now_at),

    due AS (
        -- the predicates of the two partial poll indexes, spelled as theirs
        SELECT m.due_at
        FROM @extschema@.dq_messages AS m
        CROSS JOIN now_at AS n
        WHERE
            m.queue = dq_due_hours.queue AND m.channel = '' AND m.priority = 0
            AND m.due_at > n.now_at AND m.due_at < n.now_at + make_interval(hours => dq_due_hours.hours)
        UNION ALL
        SELECT m.due_at
        FROM @extschema@.dq_messages AS m
        CROSS JOIN now_at AS n
        WHERE
            m.queue = dq_due_hours.queue AND (m.channel <> '' OR m.priority <> 0)
            AND m.due_at > n.now_at AND m.due_at < n.now_at + make_interval(hours => dq_due_hours.hours)
    ),

    counted AS (
        SELECT date_bin('1 hour', d.due_at, n.now_at) AS hour_start, count(*) AS due
        FROM due AS d
        CROSS JOIN now_at AS n
        GROUP BY 1
    )

    SELECT h.hour_start, coalesce(c.due, 0)
    FROM now_at AS n
    CROSS JOIN LATERAL generate_series(
        n.now_at, n.now_at + make_interval(hours => dq_due_hours.hours - 1), interval '1 hour'
    ) AS h (hour_start)
    LEFT JOIN counted AS c ON h.hour_start = c.hour_start
    ORDER BY h.hour_start;
$$;

-- The queues holding a live message of key, by name: one index probe per
-- queue with messages (a loose scan of (queue, key)), for protocols whose
-- ids name no queue (pgdq serve's POST /command).
CREATE FUNCTION dq_key_queues(key text) RETURNS SETOF text
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT @extschema@.dq_now();  -- unused: an invalid dq.now fails every call
    SELECT @extschema@.dq__check_key(dq_key_queues.key, 'key');
    -- the queues with keyed messages: a loose scan of the key index
    WITH RECURSIVE queues (queue) AS (
        (SELECT m.queue FROM @extschema@.dq_messages AS m WHERE m.key IS NOT NULL ORDER BY m.queue LIMIT 1)
        UNION ALL
        SELECT (
            SELECT m.queue FROM @extschema@.dq_messages AS m
            WHERE m.queue > q.queue AND m.key IS NOT NULL
            ORDER BY m.queue LIMIT 1
        )
        FROM queues AS q
        WHERE q.queue IS NOT NULL
    )

    SELECT q.queue::text
    FROM queues AS q
    WHERE EXISTS (
        SELECT FROM @extschema@.dq_messages AS m
        WHERE m.queue = q.queue AND m.key = dq_key_queues.key
    )
    ORDER BY 1;
$$;

-- The earliest due time in queue (leases by their end); NULL when empty
-- or paused.
-- With channels: the earliest time a message could be eligible.
CREATE FUNCTION dq_next_due(queue text) RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan  -- see 10_storage.sql
SET enable_seqscan = off
SET jit = off  -- see 10_storage.sql
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := @extschema@.dq_now();
    v_first timestamptz;
BEGIN
    PERFORM @extschema@.dq__check_queue(dq_next_due.queue);
    -- a paused queue (dq_pause) has nothing due for its consumers
    -- (as far as the caller may read the queues' settings: dq__paused)
    IF @extschema@.dq__paused(dq_next_due.queue) THEN
        RETURN NULL;
    END IF;
    -- a queue with groups (42_groups.sql), else the first entry of the
    -- queue's range in (queue, due_at, id); one statement either way
    v_first := CASE
        WHEN EXISTS (
            SELECT FROM @extschema@.dq_groups AS g
            WHERE g.queue = dq_next_due.queue AND g.channel = ''
        ) THEN @extschema@.dq__grouped_next_due(dq_next_due.queue, v_now, NULL)
        ELSE (
            SELECT m.due_at FROM @extschema@.dq_messages AS m
            WHERE m.queue = dq_next_due.queue AND m.channel = '' AND m.priority = 0
            ORDER BY m.due_at
            LIMIT 1
        )
    END;
    -- or the next occurrence of one of its schedules if that comes first
    RETURN least(
        v_first,
        (
            SELECT s.next_at FROM @extschema@.dq_schedules AS s
            WHERE s.queue = dq_next_due.queue AND s.next_at < 'infinity'
            ORDER BY s.next_at
            LIMIT 1
        )
    );
END
$$;

-- Pause queue: polls lease nothing from it until dq_resume; true when it
-- was not paused.
CREATE FUNCTION dq_pause(queue text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := @extschema@.dq_now();
BEGIN
    PERFORM @extschema@.dq__check_queue(dq_pause.queue);
    -- a queue already paused keeps its row as it is: no row comes back
    INSERT INTO @extschema@.dq_queues AS q (queue, paused_at)
    VALUES (dq_pause.queue, v_now)
    ON CONFLICT (queue) DO UPDATE SET paused_at = excluded.paused_at
    WHERE q.paused_at IS NULL;
    RETURN FOUND;
END
$$;

-- Resume a paused queue, waking its idle consumers when it holds a
-- message; true when it was paused.
CREATE FUNCTION dq_resume(queue text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_clock timestamptz := @extschema@.dq_now();  -- unused: an invalid dq.now fails every call
BEGIN
    PERFORM @extschema@.dq__check_queue(dq_resume.queue);
    UPDATE @extschema@.dq_queues AS q SET paused_at = NULL
    WHERE q.queue = dq_resume.queue AND q.paused_at IS NOT NULL;
    IF NOT FOUND THEN
        RETURN FALSE;
    END IF;
    -- one probe of each poll index
    IF EXISTS (
        SELECT FROM @extschema@.dq_messages AS m
        WHERE m.queue = dq_resume.queue AND m.channel = '' AND m.priority = 0
    ) OR EXISTS (
        SELECT FROM @extschema@.dq_messages AS m
        WHERE m.queue = dq_resume.queue AND (m.channel <> '' OR m.priority <> 0)
    ) THEN
        PERFORM @extschema@.dq__wake(dq_resume.queue);
    END IF;
    RETURN TRUE;
END
$$;
