-- What operators look for (1.3, the dashboard's): the messages running now
-- and those waiting to be retried (dq_deliveries), one message's delivery, a stuck lease
-- released without its token, and failures over time for every queue.

-- A live message as dq_deliveries and dq_delivery_of describe it, the
-- columns of both in one place: channel NULL for none, leased_at when its
-- current or last delivery began (NULL: before 1.2, or never delivered),
-- due_at its due time (a running lease's end), last_error whole.
CREATE TYPE dq_delivery_info AS (
    id bigint,
    key text,
    channel text,
    priority integer,
    attempts integer,
    leased_at timestamptz,
    due_at timestamptz,
    last_error text
);

-- Queue's messages in a condition (which: 'running', a lease that still
-- runs, oldest delivery first; 'retrying', tried before (attempts > 0: a
-- nack, or a lease that ended unacked) and not leased now, earliest retry
-- first), up to max_count (1..1000), as dq_delivery_info describes them.
-- What consumers hold now and for how long; what keeps failing. Reads the
-- queue's ranges of both poll indexes (every message of the queue, as
-- dq_stats(queue) does).
CREATE FUNCTION dq_deliveries(
    queue text, which text, max_count integer DEFAULT 100
) RETURNS SETOF dq_delivery_info
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT @extschema@.dq_now();  -- unused: an invalid dq.now fails every call
    SELECT @extschema@.dq__check_queue(dq_deliveries.queue);
    SELECT @extschema@.dq__null_check(dq_deliveries.which IS NULL, 'which');
    SELECT @extschema@.dq__check_one_of(dq_deliveries.which, 'which', ARRAY['running', 'retrying']);
    SELECT @extschema@.dq__check_between(dq_deliveries.max_count, 'max_count', 1, 1000);
    SELECT m.id, m.key::text, nullif(m.channel, '')::text, m.priority, m.attempts, m.leased_at, m.due_at, m.last_error
    FROM @extschema@.dq_messages AS m
    CROSS JOIN @extschema@.dq_now() AS n (now_at)
    WHERE m.queue = dq_deliveries.queue
        AND @extschema@.dq__in_poll_indexes(m.channel, m.priority)
        AND CASE dq_deliveries.which
            WHEN 'running' THEN @extschema@.dq__is_leased(m.lock_token, m.due_at, n.now_at)
            ELSE m.attempts > 0 AND NOT @extschema@.dq__is_leased(m.lock_token, m.due_at, n.now_at)
        END
    ORDER BY
        CASE WHEN dq_deliveries.which = 'running' THEN m.leased_at END NULLS FIRST,
        m.due_at, m.id
    LIMIT dq_deliveries.max_count;
$$;

-- Queue's live message id as dq_deliveries shows one (any condition): its
-- attempts, last delivery and last error; no row when there is none.
CREATE FUNCTION dq_delivery_of(queue text, id bigint) RETURNS SETOF dq_delivery_info
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT @extschema@.dq_now();  -- unused: an invalid dq.now fails every call
    SELECT @extschema@.dq__check_queue(dq_delivery_of.queue);
    SELECT @extschema@.dq__null_check(dq_delivery_of.id IS NULL, 'id');
    SELECT m.id, m.key::text, nullif(m.channel, '')::text, m.priority, m.attempts, m.leased_at, m.due_at, m.last_error
    FROM @extschema@.dq_messages AS m
    WHERE m.id = dq_delivery_of.id AND m.queue = dq_delivery_of.queue;
$$;

-- End the running lease of queue's message id now, without its token (a
-- consumer that hangs): the message is due now, its attempts, state and
-- last error kept, as a nack of its holder would leave it; that holder's
-- ack, nack or extend then fails. True when it was leased; false (nothing
-- changed) when it is not, or is no message of queue.
CREATE FUNCTION dq_release(queue text, id bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_token uuid;
    v_error text;
BEGIN
    PERFORM @extschema@.dq__check_queue(dq_release.queue);
    PERFORM @extschema@.dq__null_check(dq_release.id IS NULL, 'id');
    SELECT m.lock_token, m.last_error INTO v_token, v_error
    FROM @extschema@.dq_messages AS m
    WHERE m.id = dq_release.id AND m.queue = dq_release.queue
        AND @extschema@.dq__is_leased(m.lock_token, m.due_at, @extschema@.dq_now())
    FOR UPDATE;
    IF v_token IS NULL THEN
        RETURN FALSE;
    END IF;
    -- one way to hand a message back: dq_nack's (wakes, channel slots)
    RETURN @extschema@.dq_nack(v_token, NULL, NULL, v_error, dq_release.queue);
END
$$;

-- Raise 22004/22023 unless since is a readable time and bucket is 1 minute
-- to 1 day, at most 10000 of them from since up to now (dq_dead_counts').
CREATE FUNCTION dq__check_dead_bucket(since timestamptz, bucket interval) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now timestamptz := @extschema@.dq_now();
BEGIN
    PERFORM @extschema@.dq__null_check(since IS NULL, 'since');
    PERFORM @extschema@.dq__null_check(bucket IS NULL, 'bucket');
    PERFORM @extschema@.dq__check_time(since, 'since');
    IF bucket < interval '1 minute' OR bucket > interval '1 day'
        OR pg_catalog.date_part('month', bucket) <> 0 OR pg_catalog.date_part('year', bucket) <> 0
        OR (v_now - since) / 10000 > bucket THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = pg_catalog.format(
                'pgdq: bucket must be from 1 minute to 1 day, at most 10000 of them since since, got %s', bucket
            );
    END IF;
END
$$;

-- The dead letters kept that failed from since on, per bucket (1 minute to
-- 1 day, at most 10000 buckets up to now) by their failed_at, per queue
-- (queue NULL: every queue), only buckets with some: failures over time
-- for every queue, history kept or not. A dead letter redriven or purged
-- is no longer counted. Reads the failed_at index from since on.
CREATE FUNCTION dq_dead_counts(queue text, since timestamptz, bucket interval) RETURNS TABLE (
    queue text,
    bucket_at timestamptz,
    dead bigint
)
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT @extschema@.dq__check_queue(dq_dead_counts.queue) WHERE dq_dead_counts.queue IS NOT NULL;
    SELECT @extschema@.dq__check_dead_bucket(dq_dead_counts.since, dq_dead_counts.bucket);
    SELECT d.queue::text, pg_catalog.date_bin(dq_dead_counts.bucket, d.failed_at, 'epoch'), count(*)
    FROM @extschema@.dq_dead_letters AS d
    WHERE (dq_dead_counts.queue IS NULL OR d.queue = dq_dead_counts.queue)
        AND d.failed_at >= pg_catalog.date_bin(dq_dead_counts.bucket, dq_dead_counts.since, 'epoch')
    GROUP BY 1, 2
    ORDER BY 1, 2;
$$;
